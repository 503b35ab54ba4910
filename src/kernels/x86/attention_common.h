// Internal to the SIMD attention translation units (avx2_attention.cc, avx512_attention.cc): what
// both use (plain C++, and SSE/F16C, which both units' flags include). Everything is in an
// anonymous namespace, as in gemm_tiles.h, so each ISA's unit keeps its own copy and none leaks to
// another ISA through the linker.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/kernel_table.h"

namespace gale::kernels {
namespace {

template <KvType kType>
inline constexpr bool kKvQuantized = kType == KvType::kInt8 || kType == KvType::kInt4;
// Where a row segment's elements start (after the f16 scale of the quantized types), and the bytes
// of kElems of its elements.
template <KvType kType>
inline constexpr int kKvDataOffset = kKvQuantized<kType> ? 2 : 0;
template <KvType kType, int kElems>
inline constexpr int kKvBytes = kType == KvType::kF32    ? 4 * kElems
                                : kType == KvType::kInt8 ? kElems
                                : kType == KvType::kInt4 ? kElems / 2
                                                         : 2 * kElems;

// The f16 scale of a quantized row segment.
inline float KvScale(const uint8_t* seg) {
  uint16_t h;
  std::memcpy(&h, seg, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

// Bytes of nibble pairs (zero-extended to 16 bits each) to one byte per nibble, low nibble
// first: element order 0, 1, 2, ...
inline __m128i SplitNibblePairs(__m128i b16) {
  return _mm_or_si128(_mm_and_si128(b16, _mm_set1_epi16(0x0F)), _mm_slli_epi16(_mm_srli_epi16(b16, 4), 8));
}

// Positions 0, 1, 2, ... of a paged cache as slots, in order and without divisions.
class SlotCursor {
 public:
  explicit SlotCursor(const KvBlockView& kv) : kv_(kv) {}
  int64_t Next() {
    const int64_t slot = kv_.block_table[blk_] * kv_.block_size + in_blk_;
    if (++in_blk_ == kv_.block_size) {
      in_blk_ = 0;
      ++blk_;
    }
    return slot;
  }

 private:
  const KvBlockView& kv_;
  int64_t blk_ = 0, in_blk_ = 0;  // the next position is in_blk_ of logical block blk_
};

// Calls fn(K type, V type) as std::integral_constants for the cache type pairs the SIMD kernels
// take (one type, or K at higher precision than V: the useful mixes, V tolerating fewer bits than
// K); false for the others, which take the scalar path.
template <typename Fn>
bool ForKvTypePair(KvType k, KvType v, Fn&& fn) {
  using enum KvType;
  constexpr auto pair = [](KvType a, KvType b) { return static_cast<int>(a) * 8 + static_cast<int>(b); };
  auto call = [&]<KvType kK, KvType kV>() {
    fn(std::integral_constant<KvType, kK>{}, std::integral_constant<KvType, kV>{});
    return true;
  };
  switch (pair(k, v)) {
    case pair(kF32, kF32): return call.template operator()<kF32, kF32>();
    case pair(kF16, kF16): return call.template operator()<kF16, kF16>();
    case pair(kBF16, kBF16): return call.template operator()<kBF16, kBF16>();
    case pair(kInt8, kInt8): return call.template operator()<kInt8, kInt8>();
    case pair(kInt4, kInt4): return call.template operator()<kInt4, kInt4>();
    case pair(kF16, kInt8): return call.template operator()<kF16, kInt8>();
    case pair(kF16, kInt4): return call.template operator()<kF16, kInt4>();
    case pair(kBF16, kInt8): return call.template operator()<kBF16, kInt8>();
    case pair(kBF16, kInt4): return call.template operator()<kBF16, kInt4>();
    case pair(kInt8, kInt4): return call.template operator()<kInt8, kInt4>();
    default: return false;
  }
}

}  // namespace
}  // namespace gale::kernels
