// Internal to the ISA translation units: the tiling driver shared by every ISA's GEMM. It walks
// the output in token blocks of kTokenBlock (so a block's activations stay in L1/L2 while the
// thread's weight rows stream past), rows in tiles of kR and tokens in tiles of kT, and calls a
// tile function chosen by the actual tile size. Tile functions compute every output with the
// same operation sequence whatever the tile size, so results do not depend on batch shape.
// NOTE: everything here is in an anonymous namespace: each ISA file gets its own copy compiled
// with its own flags, and no copy can leak to another ISA through the linker. For the same reason
// ISA files avoid std:: templates with external linkage (std::min, std::max, containers): an
// out-of-line copy built with -mavx512f could be the one the linker keeps for everyone.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "gguf/ggml_types.h"

namespace gale::kernels {
namespace {

template <int kR, int kT, typename TileFn, typename... Args>
inline void ForEachTile(int64_t num_rows, int64_t num_tokens, const TileFn (&tiles)[kR][kT], Args&&... args) {
  constexpr int64_t kTokenBlock = 64;
  for (int64_t t0 = 0; t0 < num_tokens; t0 += kTokenBlock) {
    const int64_t t1 = t0 + kTokenBlock < num_tokens ? t0 + kTokenBlock : num_tokens;
    for (int64_t r = 0; r < num_rows; r += kR) {
      const int rr = static_cast<int>(num_rows - r < kR ? num_rows - r : kR);
      for (int64_t t = t0; t < t1; t += kT) {
        const int tt = static_cast<int>(t1 - t < kT ? t1 - t : kT);
        tiles[rr - 1][tt - 1](r, t, args...);
      }
    }
  }
}

// W4A8 types: 32-element run b of a row is run b % (G / 32) of group b / (G / 32), laid out as a
// Q4_0 block's nibbles under the group's f16 scale.
template <GgmlType kType>
constexpr int kW4Group = kType == GgmlType::kW4A8G64 ? 64 : kType == GgmlType::kW4A8G128 ? 128 : 0;
template <GgmlType kType>
inline const uint8_t* W4Group(const uint8_t* row, int64_t b) {
  return row + (b / (kW4Group<kType> / 32)) * (2 + kW4Group<kType> / 2);
}
template <GgmlType kType>
inline const uint8_t* W4Run(const uint8_t* row, int64_t b) {
  return W4Group<kType>(row, b) + 2 + (b % (kW4Group<kType> / 32)) * 16;
}

// W4A16 types: group size (0 for other types) and whether they carry a zero point.
template <GgmlType kType>
constexpr int kW4A16Group = kType == GgmlType::kW4A16G64 || kType == GgmlType::kW4A16ZG64 ? 64
                            : kType == GgmlType::kW4A16G128 || kType == GgmlType::kW4A16ZG128 ? 128 : 0;
template <GgmlType kType>
constexpr bool kW4A16Zero = kType == GgmlType::kW4A16ZG64 || kType == GgmlType::kW4A16ZG128;

// The activation quantizers' padding (QuantizedActs): bytes k..k_stride zero (and their 16-bit low
// bytes when lo is set), blocks k / 32.. with scale and sum 0.
inline void ZeroActPadding(int64_t k, int64_t k_stride, int8_t* qs, uint8_t* lo, float* d, int32_t* qsum) {
  std::memset(qs + k, 0, static_cast<size_t>(k_stride - k));
  if (lo != nullptr) std::memset(lo + k, 0, static_cast<size_t>(k_stride - k));
  for (int64_t b = k / 32; b < k_stride / 32; ++b) {
    d[b] = 0.0f;
    qsum[b] = 0;
  }
}

// Per-thread 64-byte aligned scratch of at least n floats (C allocation: no std:: template is
// instantiated in the ISA translation units). One per translation unit, thread and kSlot; callers
// must not hold it across a call that may use the same slot (a caller that calls another GEMM
// while holding its scratch takes slot 1).
template <int kSlot = 0>
inline float* TileScratch(int64_t n) {
  struct Scratch {
    float* p = nullptr;
    int64_t n = 0;
    ~Scratch() { std::free(p); }
  };
  static thread_local Scratch s;
  if (s.n < n) {
    std::free(s.p);
    s.p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((n * 4 + 63) / 64 * 64)));
    s.n = n;
  }
  return s.p;
}

}  // namespace
}  // namespace gale::kernels
