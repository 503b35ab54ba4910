// NumPy's default generator, bit for bit, for the few constants a checkpoint's reference code
// draws from it (DeepSeek-V4.1's Engram hash multipliers: np.random.default_rng(seed).integers).
// Written from NumPy's published algorithms: SeedSequence (the entropy pool hashed and mixed into
// four 32-bit words, then expanded into the generator's state), PCG64 (128-bit LCG with the XSL-RR
// output) and Lemire's bounded integers as Generator.integers draws them for int64 ranges wider
// than 32 bits. Checked against NumPy's own outputs in numpy_rng_test.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace gale {

class NumpyPcg64 {
 public:
  // np.random.default_rng(seed) for a non-negative integer seed below 2^64.
  explicit NumpyPcg64(uint64_t seed);
  // bit_generator.random_raw(): the next 64 bits.
  uint64_t Next64();
  // integers(low=0, high=high, size=n, dtype=np.int64) for high - 1 >= 2^32 (the 64-bit Lemire
  // path; narrower ranges take a buffered 32-bit path not written here: an error).
  StatusOr<std::vector<int64_t>> Integers(int64_t high, int64_t n);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
};

// SeedSequence(seed).generate_state(n_words, np.uint64).
std::vector<uint64_t> NumpySeedState(uint64_t seed, int n_words);

}  // namespace gale
