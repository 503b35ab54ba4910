// Sampling arithmetic. Probabilities are computed in double for the truncation sums, so top-p
// boundaries do not move with float rounding.
#include "runner/sampler.h"

#include <algorithm>
#include <cmath>

namespace gale {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || temperature > 100.0f) return InvalidArgument("temperature {} must be in [0, 100]", temperature);
  if (!(top_p > 0.0f && top_p <= 1.0f)) return InvalidArgument("top_p {} must be in (0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return InvalidArgument("min_p {} must be in [0, 1]", min_p);
  if (!(repeat_penalty > 0.0f)) return InvalidArgument("repeat_penalty {} must be positive", repeat_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) return InvalidArgument("presence_penalty {} must be in [-2, 2]", presence_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) return InvalidArgument("frequency_penalty {} must be in [-2, 2]", frequency_penalty);
  if (repeat_last_n < -1) return InvalidArgument("repeat_last_n {} must be >= -1", repeat_last_n);
  return Status::Ok();
}

int32_t ArgMax(std::span<const float> logits) {
  // The first index of the largest value; the running best stays in a register.
  int32_t best = 0;
  float best_value = logits[0];
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > best_value) {
      best_value = logits[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::ApplyPenalties(std::span<float> logits, std::span<const int32_t> history) {
  const bool any = params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                   params_.frequency_penalty != 0.0f;
  if (!any || history.empty()) return;
  size_t first = 0;
  if (params_.repeat_last_n >= 0 && history.size() > static_cast<size_t>(params_.repeat_last_n)) {
    first = history.size() - params_.repeat_last_n;
  }
  counts_.clear();
  for (size_t i = first; i < history.size(); ++i) {
    if (history[i] >= 0 && static_cast<size_t>(history[i]) < logits.size()) ++counts_[history[i]];
  }
  for (const auto& [id, count] : counts_) {
    float& l = logits[id];
    if (params_.repeat_penalty != 1.0f) l = l > 0.0f ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    l -= params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
  }
}

int32_t Sampler::Sample(std::span<float> logits, std::span<const int32_t> history) {
  ApplyPenalties(logits, history);
  candidates_.clear();
  if (params_.temperature == 0.0f) {
    const int32_t id = ArgMax(logits);
    candidates_.push_back({id, 1.0f});
    return id;
  }
  const int32_t vocab = static_cast<int32_t>(logits.size());
  candidates_.reserve(vocab);
  for (int32_t i = 0; i < vocab; ++i) candidates_.push_back({i, logits[i] / params_.temperature});
  auto by_logit = [](const auto& a, const auto& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); };
  // top-k: partial sort keeps it O(V log k).
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = params_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
    candidates_.resize(keep);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax over the survivors (sorted descending).
  const double max = candidates_[0].second;
  std::vector<double> probs(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(static_cast<double>(candidates_[i].second) - max);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  // top-p: smallest prefix whose mass reaches top_p (always at least one token).
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < keep) {
      cum += probs[n++];
      if (cum >= params_.top_p) break;
    }
    keep = n;
  }
  // min-p: drop tokens below min_p times the most likely one.
  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p * probs[0];
    size_t n = 1;
    while (n < keep && probs[n] >= threshold) ++n;
    keep = n;
  }
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += probs[i];
  candidates_.resize(keep);
  for (size_t i = 0; i < keep; ++i) candidates_[i].second = static_cast<float>(probs[i] / total);
  const double r = rng_.UniformDouble() * total;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (r < cum) return candidates_[i].first;
  }
  return candidates_[keep - 1].first;
}

}  // namespace gale
