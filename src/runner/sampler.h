// Sampler: turns one row of logits into a token id. Greedy when temperature is 0; otherwise
// penalties -> temperature -> top-k -> top-p -> min-p -> draw from a seeded RNG. The order is
// vLLM's (temperature before the truncations), so top_p/min_p act on the distribution actually
// sampled from, as OpenAI-API users expect.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/rng.h"
#include "base/status.h"
#include "grammar/matcher.h"

namespace gale {

struct SamplingParams {
  float temperature = 0.8f;   // 0 = greedy
  int32_t top_k = 40;         // <= 0: off
  float top_p = 0.95f;        // 1: off
  float min_p = 0.05f;        // 0: off; keep tokens with p >= min_p * p_max
  float repeat_penalty = 1.0f;     // llama.cpp style: logit / penalty if > 0, * penalty if < 0
  int32_t repeat_last_n = 64;      // window the penalties look at; -1 = whole history
  float presence_penalty = 0.0f;   // OpenAI style: minus this once if the token occurred
  float frequency_penalty = 0.0f;  // OpenAI style: minus this per occurrence
  uint64_t seed = 0;
  // Added to the logits of these tokens before anything else (OpenAI's logit_bias; -100 bans).
  std::vector<std::pair<int32_t, float>> logit_bias;

  Status Validate() const;  // clear errors for out-of-range values
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // history: the tokens the penalties look at (prompt + generated). logits is modified.
  // constraint: only tokens it allows are drawn (their probabilities renormalized, as if the
  // others had logit -inf); -1 when it allows none. Greedy draws check the unconstrained argmax
  // first and compute the mask only when it is refused (the same token either way).
  int32_t Sample(std::span<float> logits, std::span<const int32_t> history,
                 grammar::GrammarMatcher* constraint = nullptr);

  // The candidates (token, probability) the last Sample drew from, after all truncations (in no
  // particular order); empty when nothing was truncated (every token of the vocabulary).
  const std::vector<std::pair<int32_t, float>>& last_candidates() const { return candidates_; }

 private:
  void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history);
  // After top-k: applies top-p and min-p to candidates_ (sorted, most likely first) whose
  // probabilities are in probs_, and draws one of the survivors.
  int32_t DrawSorted();

  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<int32_t, float>> candidates_;  // scratch: [vocab] (id, logit or prob)
  std::vector<double> probs_;                          // scratch: candidates_' probabilities
  std::vector<float> weights_;                         // scratch: [vocab] exp(logit - max)
  std::vector<uint16_t> bucket_;                       // scratch: [vocab] top-p bucket
  std::unordered_map<int32_t, int32_t> counts_;        // scratch: token -> occurrences
};

int32_t ArgMax(std::span<const float> logits);

}  // namespace gale
