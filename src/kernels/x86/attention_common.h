// Internal to the SIMD attention translation units (avx2_attention.cc, avx512_attention.cc): plain
// C++ both use. Everything is in an anonymous namespace, as in gemm_tiles.h, so each ISA's unit
// keeps its own copy and none leaks to another ISA through the linker.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/kernel_table.h"

namespace gale::kernels {
namespace {

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
