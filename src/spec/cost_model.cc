// Step-time fit and the guess rule.
#include "spec/cost_model.h"

#include <algorithm>
#include <cmath>

namespace gale {

void SpecCostModel::AddStep(int64_t tokens, double seconds) {
  const double x = static_cast<double>(tokens);
  ++num_steps_;
  w_ = w_ * kForget + 1.0;
  sx_ = sx_ * kForget + x;
  sy_ = sy_ * kForget + seconds;
  sxx_ = sxx_ * kForget + x * x;
  sxy_ = sxy_ * kForget + x * seconds;
}

void SpecCostModel::AddDraft(int64_t guesses, double seconds) {
  draft_seconds_ = draft_seconds_ * kForget + seconds;
  draft_guesses_ = draft_guesses_ * kForget + static_cast<double>(guesses);
}

bool SpecCostModel::ready() const {
  if (w_ < 4.0) return false;
  const double mean = sx_ / w_;
  return sxx_ / w_ - mean * mean > 0.05;  // sizes that differ, recently
}

double SpecCostModel::per_token_seconds() const {
  const double mx = sx_ / w_, my = sy_ / w_;
  const double var = sxx_ / w_ - mx * mx, cov = sxy_ / w_ - mx * my;
  return var > 0 ? std::max(0.0, cov / var) : 0.0;
}

double SpecCostModel::fixed_seconds() const {
  return std::max(0.0, sy_ / w_ - per_token_seconds() * sx_ / w_);
}

int64_t SpecCostModel::Guesses(double alpha, int64_t n, int64_t max_k) const {
  if (max_k <= 0) return 0;
  if (!ready()) return num_steps_ % 2 == 0 ? max_k : 0;
  const double b = per_token_seconds(), step = fixed_seconds() + b * static_cast<double>(n);
  if (step <= 0) return max_k;
  const double threshold = (b + draft_seconds_per_guess()) * static_cast<double>(n) / step;
  alpha = std::clamp(alpha, 0.0, 1.0);
  // E(k) / k falls as k grows: the largest k above the threshold.
  double expected = 0.0, power = 1.0;
  int64_t best = 0;
  for (int64_t k = 1; k <= max_k; ++k) {
    power *= alpha;
    expected += power;
    if (expected / static_cast<double>(k) > threshold) best = k;
  }
  return best;
}

}  // namespace gale
