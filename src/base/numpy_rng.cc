#include "base/numpy_rng.h"

namespace gale {
namespace {

constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;

uint32_t HashMix(uint32_t value, uint32_t* hash_const) {
  value ^= *hash_const;
  *hash_const *= kMultA;
  value *= *hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t Mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// The pool of SeedSequence(seed): the seed as little-endian 32-bit words (one word for 0).
std::vector<uint32_t> Pool(uint64_t seed) {
  std::vector<uint32_t> entropy = {static_cast<uint32_t>(seed)};
  if (seed >> 32 != 0) entropy.push_back(static_cast<uint32_t>(seed >> 32));
  std::vector<uint32_t> pool(kPoolSize);
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i) {
    pool[i] = HashMix(i < static_cast<int>(entropy.size()) ? entropy[i] : 0, &hash_const);
  }
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = Mix(pool[dst], HashMix(pool[src], &hash_const));
    }
  }
  for (size_t src = kPoolSize; src < entropy.size(); ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = Mix(pool[dst], HashMix(entropy[src], &hash_const));
  }
  return pool;
}

constexpr unsigned __int128 kMultiplier =
    (static_cast<unsigned __int128>(0x2360ED051FC65DA4ull) << 64) | 0x4385DF649FCCF645ull;

}  // namespace

std::vector<uint64_t> NumpySeedState(uint64_t seed, int n_words) {
  const std::vector<uint32_t> pool = Pool(seed);
  uint32_t hash_const = kInitB;
  std::vector<uint32_t> words(2 * static_cast<size_t>(n_words));
  for (size_t i = 0; i < words.size(); ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    words[i] = v;
  }
  std::vector<uint64_t> out(static_cast<size_t>(n_words));
  for (int i = 0; i < n_words; ++i) out[i] = words[2 * i] | static_cast<uint64_t>(words[2 * i + 1]) << 32;
  return out;
}

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  const std::vector<uint64_t> s = NumpySeedState(seed, 4);
  const unsigned __int128 init_state = static_cast<unsigned __int128>(s[0]) << 64 | s[1];
  const unsigned __int128 init_seq = static_cast<unsigned __int128>(s[2]) << 64 | s[3];
  state_ = 0;
  inc_ = init_seq << 1 | 1;
  state_ = state_ * kMultiplier + inc_;
  state_ += init_state;
  state_ = state_ * kMultiplier + inc_;
}

uint64_t NumpyPcg64::Next64() {
  state_ = state_ * kMultiplier + inc_;
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

StatusOr<std::vector<int64_t>> NumpyPcg64::Integers(int64_t high, int64_t n) {
  if (high < 1) return InvalidArgument("integers: high {} must be positive", high);
  const uint64_t rng = static_cast<uint64_t>(high) - 1;  // the closed range [0, rng]
  if (rng <= 0xFFFFFFFFull) return Unimplemented("integers: ranges below 2^32 take NumPy's 32-bit path");
  std::vector<int64_t> out;
  const uint64_t excl = rng + 1;
  for (int64_t i = 0; i < n; ++i) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next64()) * excl;
    uint64_t leftover = static_cast<uint64_t>(m);
    if (leftover < excl) {
      const uint64_t threshold = (UINT64_MAX - rng) % excl;
      while (leftover < threshold) {
        m = static_cast<unsigned __int128>(Next64()) * excl;
        leftover = static_cast<uint64_t>(m);
      }
    }
    out.push_back(static_cast<int64_t>(m >> 64));
  }
  return out;
}

}  // namespace gale
