// Prompt lookup: a backwards scan for the latest earlier occurrence of the sequence's suffix.
#include "spec/ngram.h"

#include <algorithm>

namespace gale {

std::vector<int32_t> ProposeNgram(std::span<const int32_t> tokens, int64_t k, const NgramParams& params) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k <= 0) return {};
  for (int64_t n = std::min<int64_t>(params.ngram_max, len - 1); n >= std::max(1, params.ngram_min); --n) {
    const std::span<const int32_t> suffix = tokens.subspan(len - n);
    // The latest earlier occurrence (s + n < len) is the most likely to continue the same way.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + s)) continue;
      // Guess that the text since then repeats: past the end, the guess continues itself (a loop
      // of period len - from), so a short loop still yields k tokens.
      const int64_t from = s + n;
      std::vector<int32_t> out;
      out.reserve(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) out.push_back(from + i < len ? tokens[from + i] : out[from + i - len]);
      return out;
    }
  }
  return {};
}

}  // namespace gale
