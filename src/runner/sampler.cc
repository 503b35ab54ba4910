// Sampling arithmetic. Softmax weights are float (the kernel table's vector expf, at most 1) and
// every sum over them is in double, so top-p boundaries do not move with float rounding; after
// top-k the k survivors' weights are double exps.
#include "runner/sampler.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace gale {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || temperature > 100.0f) return InvalidArgument("temperature {} must be in [0, 100]", temperature);
  if (!(top_p > 0.0f && top_p <= 1.0f)) return InvalidArgument("top_p {} must be in (0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return InvalidArgument("min_p {} must be in [0, 1]", min_p);
  if (!(repeat_penalty > 0.0f)) return InvalidArgument("repeat_penalty {} must be positive", repeat_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) return InvalidArgument("presence_penalty {} must be in [-2, 2]", presence_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) return InvalidArgument("frequency_penalty {} must be in [-2, 2]", frequency_penalty);
  if (repeat_last_n < -1) return InvalidArgument("repeat_last_n {} must be >= -1", repeat_last_n);
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return InvalidArgument("logit_bias token id {} is negative", id);
    if (!(bias >= -100.0f && bias <= 100.0f)) return InvalidArgument("logit_bias {} for token {} must be in [-100, 100]", bias, id);
  }
  return Status::Ok();
}

int32_t ArgMax(std::span<const float> logits) {
  return static_cast<int32_t>(kernels::Active().argmax(logits.data(), static_cast<int64_t>(logits.size())));
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

int32_t Sampler::Sample(std::span<float> logits, std::span<const int32_t> history, grammar::GrammarMatcher* constraint) {
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] += bias;
  }
  ApplyPenalties(logits, history);
  candidates_.clear();
  if (constraint != nullptr) {
    if (params_.temperature == 0.0f) {
      const int32_t id = ArgMax(logits);
      if (constraint->Allows(id)) {
        candidates_.push_back({id, 1.0f});
        return id;
      }
    }
    if (!constraint->MaskLogits(logits)) return -1;
  }
  if (params_.temperature == 0.0f) {
    const int32_t id = ArgMax(logits);
    candidates_.push_back({id, 1.0f});
    return id;
  }
  const int32_t vocab = static_cast<int32_t>(logits.size());
  // A broken row (NaN, or no finite largest logit) must not break the sorts and sums below: NaN
  // counts as -inf, and a row whose largest logit is not finite gets its argmax.
  float max = -INFINITY;
  for (float& l : logits) {
    if (std::isnan(l)) l = -INFINITY;
    max = l > max ? l : max;
  }
  if (!std::isfinite(max)) {
    const int32_t id = ArgMax(logits);
    candidates_.push_back({id, 1.0f});
    return id;
  }
  auto by_logit = [](const auto& a, const auto& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); };
  if (params_.top_k > 0 && params_.top_k < vocab) {
    // top-k: partial sort keeps it O(V log k); the softmax is over the k survivors.
    const size_t keep = static_cast<size_t>(params_.top_k);
    candidates_.reserve(vocab);
    for (int32_t i = 0; i < vocab; ++i) candidates_.push_back({i, logits[i] / params_.temperature});
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
    candidates_.resize(keep);
    const double max = candidates_[0].second;
    probs_.resize(keep);
    double sum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      probs_[i] = std::exp(static_cast<double>(candidates_[i].second) - max);
      sum += probs_[i];
    }
    for (double& p : probs_) p /= sum;
    return DrawSorted();
  }
  // No top-k: the softmax over the whole vocabulary, in index order, without sorting it (a sort
  // of 32,000 candidates took ~2.7 ms per token, more than a small model's decode step).
  if (params_.temperature != 1.0f) {
    for (float& l : logits) l /= params_.temperature;
    max /= params_.temperature;  // the same division of the same value: still the largest
  }
  // Weights exp(l - max) in float (the vector expf of the kernel table; at most 1, the largest),
  // summed in double over four chains.
  weights_.resize(vocab);
  kernels::Active().exp_shifted(logits.data(), max, weights_.data(), vocab);
  double zs[4] = {};
  int32_t i4 = 0;
  for (; i4 + 4 <= vocab; i4 += 4) {
    for (int j = 0; j < 4; ++j) zs[j] += weights_[i4 + j];
  }
  for (; i4 < vocab; ++i4) zs[0] += weights_[i4];
  const double z = (zs[0] + zs[1]) + (zs[2] + zs[3]);
  if (params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    // Nothing truncated: draw straight from the weights (candidates_ stays empty: every token).
    const double r = rng_.UniformDouble() * z;
    double cum = 0.0;
    for (int32_t i = 0; i < vocab; ++i) {
      cum += weights_[i];
      if (r < cum) return i;
    }
    for (int32_t i = vocab - 1; i > 0; --i) {  // r at the very top (rounding): the last token with weight
      if (weights_[i] > 0.0f) return i;
    }
    return 0;
  }
  // top-p / min-p keep a prefix of the tokens sorted by probability (largest first, ties by id),
  // found without sorting the vocabulary: tokens go into buckets by how far their logit is below
  // the largest (kBucketsPerNat per nat, the last bucket takes everything further down), the
  // buckets' masses are summed from the top until they reach top_p, and only the bucket where that
  // happens is sorted to find the exact end. (A sort of 32,000 candidates took ~1.4-2.7 ms.)
  constexpr int kBuckets = 1024;
  constexpr float kBucketsPerNat = 32.0f;
  bucket_.resize(vocab);
  double mass[kBuckets] = {};
  for (int32_t i = 0; i < vocab; ++i) {
    const float below = (max - logits[i]) * kBucketsPerNat;  // >= 0
    const int b = below < static_cast<float>(kBuckets - 1) ? static_cast<int>(below) : kBuckets - 1;
    bucket_[i] = static_cast<uint16_t>(b);
    mass[b] += weights_[i];
  }
  const double target = params_.top_p < 1.0f ? static_cast<double>(params_.top_p) * z : INFINITY;
  int last = kBuckets - 1;  // the bucket where the nucleus ends
  double before = 0.0;      // mass of the buckets above it
  for (int b = 0; b < kBuckets; ++b) {
    if (before + mass[b] >= target) {
      last = b;
      break;
    }
    before += mass[b];
  }
  // min-p: tokens below min_p times the largest weight (1) are out whatever the nucleus.
  const double min_w = params_.min_p > 0.0f ? static_cast<double>(params_.min_p) : 0.0;
  size_t num_above = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (bucket_[i] > last || weights_[i] < min_w) continue;
    candidates_.push_back({i, logits[i]});
    if (bucket_[i] < last) std::swap(candidates_[num_above++], candidates_.back());
  }
  // candidates_: [0, num_above) all in; [num_above, end) the last bucket's, in until the mass
  // reaches top_p in sorted order.
  std::sort(candidates_.begin() + num_above, candidates_.end(), by_logit);
  size_t keep = candidates_.size();
  for (size_t i = num_above; i < candidates_.size(); ++i) {
    before += weights_[candidates_[i].first];
    if (before >= target) {
      keep = i + 1;
      break;
    }
  }
  candidates_.resize(keep);
  double total = 0.0;
  for (const auto& c : candidates_) total += weights_[c.first];
  for (auto& c : candidates_) c.second = static_cast<float>(weights_[c.first] / total);
  const double r = rng_.UniformDouble() * total;
  double cum = 0.0;
  for (const auto& c : candidates_) {
    cum += weights_[c.first];
    if (r < cum) return c.first;
  }
  return candidates_.back().first;
}

int32_t Sampler::DrawSorted() {
  size_t keep = candidates_.size();
  // top-p: smallest prefix whose mass reaches top_p (always at least one token).
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < keep) {
      cum += probs_[n++];
      if (cum >= params_.top_p) break;
    }
    keep = n;
  }
  // min-p: drop tokens below min_p times the most likely one.
  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p * probs_[0];
    size_t n = 1;
    while (n < keep && probs_[n] >= threshold) ++n;
    keep = n;
  }
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += probs_[i];
  candidates_.resize(keep);
  for (size_t i = 0; i < keep; ++i) candidates_[i].second = static_cast<float>(probs_[i] / total);
  const double r = rng_.UniformDouble() * total;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += probs_[i];
    if (r < cum) return candidates_[i].first;
  }
  return candidates_[keep - 1].first;
}

}  // namespace gale
