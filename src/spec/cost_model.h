// When guessing pays: speculative decoding trades a longer step for more tokens per step. The
// engine times its steps and fits step time = fixed + per_token * tokens (least squares with
// exponential forgetting, so it follows the machine and the context length), plus the draft
// model's time per guess. Adding k guesses to a step of n tokens is worth it when the tokens they
// are expected to add, E(k) = alpha + alpha^2 + ... + alpha^k for a request whose guesses are
// accepted with probability alpha each, raise tokens per second:
//   E(k) / k > (per_token + draft_per_guess) * n / (fixed + per_token * n).
// The right side is near 0 when steps are bound by reading weights (small batch, big model) and
// near 1 when they are bound by arithmetic (large batch, or a model so small it lives in cache),
// so speculation switches itself off where it would slow decoding down.
#pragma once

#include <cstdint>

namespace gale {

class SpecCostModel {
 public:
  // A forward pass of `tokens` tokens took `seconds`.
  void AddStep(int64_t tokens, double seconds);
  // The draft model spent `seconds` proposing `guesses` tokens.
  void AddDraft(int64_t guesses, double seconds);

  // True once steps of different sizes have been seen recently. Until then Guesses explores:
  // max_k on every other step and none on the others, so the steps differ in size.
  bool ready() const;
  double fixed_seconds() const;
  double per_token_seconds() const;
  double draft_seconds_per_guess() const { return draft_guesses_ > 0 ? draft_seconds_ / draft_guesses_ : 0.0; }

  // Guesses (0..max_k) worth asking of a request whose guesses are accepted with probability
  // alpha, in a step that already holds n tokens.
  int64_t Guesses(double alpha, int64_t n, int64_t max_k) const;

 private:
  static constexpr double kForget = 0.98;  // weight of a step 35 steps ago: 0.5
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  int64_t num_steps_ = 0;
  double draft_seconds_ = 0, draft_guesses_ = 0;
};

}  // namespace gale
