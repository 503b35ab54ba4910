// Prompt lookup (n-gram) proposals for speculative decoding: when the last n tokens of a sequence
// occurred earlier in it (prompt or generated text), guess that what followed then follows now.
// No model, no state: a scan of the sequence, O(length * n) per call.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace gale {

struct NgramParams {
  int ngram_min = 1;  // shortest suffix that may match
  int ngram_max = 4;  // longest suffix tried first
};

// k tokens guessed from the latest earlier occurrence of the longest suffix of tokens (between
// ngram_min and ngram_max tokens long) that occurred before: what followed it, repeated as a loop
// when that runs to the end; empty when no such suffix occurred before.
std::vector<int32_t> ProposeNgram(std::span<const int32_t> tokens, int64_t k, const NgramParams& params);

}  // namespace gale
