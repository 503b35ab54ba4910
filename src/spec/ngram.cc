// Prompt lookup: a backwards scan for the latest earlier occurrence of the sequence's suffix.
#include "spec/ngram.h"

#include <algorithm>

namespace gale {

std::vector<int32_t> ProposeNgram(std::span<const int32_t> tokens, int64_t k, const NgramParams& params) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k <= 0) return {};
  for (int64_t n = std::min<int64_t>(params.ngram_max, len - 1); n >= std::max(1, params.ngram_min); --n) {
    const std::span<const int32_t> suffix = tokens.subspan(len - n);
    // Occurrences start at s with s + n < len (an earlier one, followed by at least one token);
    // the latest one is the most likely to continue the same way.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + s)) continue;
      const int64_t from = s + n;
      const int64_t count = std::min(k, len - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

}  // namespace gale
