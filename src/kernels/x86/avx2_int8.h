// Internal to the AVX2 translation units (avx2_kernels.cc, and avx2_vnni.cc for CPUs with
// AVX-VNNI): the int8-activation GEMMs (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, W4A8, IQ4_NL, IQ4_XS, MXFP4 and the
// K-quants). kVnni picks the dot of unsigned by signed bytes into int32 lanes: maddubs + madd, or
// AVX-VNNI's vpdpbusd, which gives the same integers (the operands here never reach maddubs'
// saturation), so both tables give bitwise the same products. Everything is in an anonymous
// namespace (see gemm_tiles.h).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "gguf/ggml_types.h"
#include "kernels/kernel_table.h"
#include "kernels/x86/gemm_tiles.h"

namespace gale::kernels {
namespace {

// acc + the sums of 4 adjacent products of unsigned u and signed s bytes, per int32 lane.
template <bool kVnni>
inline __m256i DotU8S8(__m256i acc, __m256i u, __m256i s) {
  if constexpr (kVnni) {
    return _mm256_dpbusd_avx_epi32(acc, u, s);
  } else {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
}

// Horizontal sum of 8 floats.
inline float HSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

// Largest of 8 floats (vmaxps pairwise: with a NaN lane the result depends on its place).
inline float MaxOf8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

using TileQuantFn = void (*)(int64_t, int64_t, const uint8_t*, int64_t, const QuantizedActs*, int64_t, float*, int64_t);

template <GgmlType kType>
constexpr bool kIQ4 = kType == GgmlType::kIQ4_NL || kType == GgmlType::kIQ4_XS;
// Types whose unpacked weights are signed (Q8_0's bytes, the IQ4 and MXFP4 tables' values): dotted
// as |w| times the activations with w's sign.
template <GgmlType kType>
constexpr bool kSignedWeights = kType == GgmlType::kQ8_0 || kIQ4<kType> || kType == GgmlType::kMXFP4;
// What the tile takes off each unsigned weight (times the token's block sum) after the dot; the
// zero-point types (Q4_1, Q5_1: x = d q + m) add m times that sum instead.
template <GgmlType kType>
constexpr int kWeightOffset = kSignedWeights<kType> || kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1 ? 0
                              : kType == GgmlType::kQ5_0                                                      ? 16
                                                                                                               : 8;
template <GgmlType kType>
constexpr bool kZeroPoint = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;

// Q4_0-ordered nibbles (element j < 16 low in byte j, j + 16 high) in element order.
inline __m256i Nibbles32(const uint8_t* qs) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, mask)),
                                 _mm_and_si128(_mm_srli_epi16(raw, 4), mask), 1);
}

// Q5_0/Q5_1's fifth bits as 0x10 in byte j: byte j takes byte j / 8 of qh (each 128-bit half
// holds all four) and keeps bit j % 8.
inline __m256i FifthBits(const uint8_t* qh) {
  int32_t h;
  std::memcpy(&h, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(h), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                             3, 3, 3, 3, 3, 3, 3));
  const __m256i bits = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Int8 weights of one 32-element block and its scale: Q8_0's signed bytes, the IQ4 types' and
// MXFP4's table values (IQ4_XS: run b % 8 of super-block b / 8, under its float scale), Q4_0's (and a W4A8
// run's) or Q4_1's unsigned nibbles 0..15, or Q5_0/Q5_1's 5-bit values 0..31 (kWeightOffset: 8
// or 16); m: the zero-point types' offset.
template <GgmlType kType>
inline __m256i UnpackBlock(const uint8_t* row, int64_t b, float* d, float* m = nullptr) {
  if constexpr (kIQ4<kType>) {
    const uint8_t* qs;
    if constexpr (kType == GgmlType::kIQ4_NL) {
      const BlockIQ4_NL* blk = reinterpret_cast<const BlockIQ4_NL*>(row) + b;
      *d = _cvtsh_ss(blk->d);
      qs = blk->qs;
    } else {
      const BlockIQ4_XS* blk = reinterpret_cast<const BlockIQ4_XS*>(row) + b / 8;
      *d = _cvtsh_ss(blk->d) * static_cast<float>(IQ4XSRunFactor(*blk, static_cast<int>(b % 8)));
      qs = blk->qs + 16 * (b % 8);
    }
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
    return _mm256_shuffle_epi8(table, Nibbles32(qs));
  } else if constexpr (kType == GgmlType::kMXFP4) {
    const BlockMXFP4* blk = reinterpret_cast<const BlockMXFP4*>(row) + b;
    *d = E8M0HalfToFp32(blk->e);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMXFP4Values)));
    return _mm256_shuffle_epi8(table, Nibbles32(blk->qs));
  } else if constexpr (kType == GgmlType::kQ5_0) {
    const BlockQ5_0* blk = reinterpret_cast<const BlockQ5_0*>(row) + b;
    *d = _cvtsh_ss(blk->d);
    return _mm256_or_si256(Nibbles32(blk->qs), FifthBits(blk->qh));
  } else if constexpr (kType == GgmlType::kQ5_1) {
    const BlockQ5_1* blk = reinterpret_cast<const BlockQ5_1*>(row) + b;
    *d = _cvtsh_ss(blk->d);
    *m = _cvtsh_ss(blk->m);
    return _mm256_or_si256(Nibbles32(blk->qs), FifthBits(blk->qh));
  } else if constexpr (kType == GgmlType::kQ4_1) {
    const BlockQ4_1* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
    *d = _cvtsh_ss(blk->d);
    *m = _cvtsh_ss(blk->m);
    return Nibbles32(blk->qs);
  } else if constexpr (kType == GgmlType::kQ8_0) {
    const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    *d = _cvtsh_ss(blk->d);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs));
  } else {
    // Q4_0, or a W4A8 run (Q4_0's nibble order under its group's scale).
    const uint8_t* qs;
    if constexpr (kType == GgmlType::kQ4_0) {
      const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      *d = _cvtsh_ss(blk->d);
      qs = blk->qs;
    } else {
      uint16_t h;
      std::memcpy(&h, W4Group<kType>(row, b), 2);
      *d = _cvtsh_ss(h);
      qs = W4Run<kType>(row, b);
    }
    return Nibbles32(qs);
  }
}

// Per block, into 8 int32 lanes of 4 elements each: Q8_0 and the IQ4 types |w| times
// sign-adjusted q (maddubs cannot overflow: 2 * 127 * 127 < 32768); Q4_0 the unsigned nibbles
// times q, minus 8 times the lane's sum of q (computed once per token and block for all rows: two
// instructions fewer per row and token than the sign trick, and the same integers). Then to f32, times d_w * d_x, accumulated.
template <GgmlType kType, int R, int T, bool kVnni>
void TileQuant(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const QuantizedActs* xa, int64_t,
               float* y, int64_t ldy) {
  const QuantizedActs& x = *xa;
  const int64_t nb = x.k / 32;
  const int64_t nb_stride = x.k_stride / 32;
  __m256 acc[R][T];
  float zp[R][T] = {};  // zero-point types: the sum over blocks of (m_w d_x) qsum
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const uint8_t* rows = w + r0 * row_bytes;
  // The rows four tiles below are prefetched as this tile walks its own, about a line at a time:
  // rows are short, and the hardware prefetcher alone left Q8_0 decode streaming from memory at
  // a fifth of the in-cache rate (kernels_bench BM_MatMulStreaming: 8 -> 17 GB/s one tile ahead,
  // ~22 four ahead, on one thread). Q8_0 blocks are 34 bytes, Q4_0's and W4A8 runs 16-18: every
  // block, or every third.
  constexpr int64_t kPrefetchEvery = kType == GgmlType::kQ8_0 ? 1 : 3;
  for (int64_t b = 0; b < nb; ++b) {
    if (b % kPrefetchEvery == 0) {
      for (int r = 0; r < R; ++r) {
        const uint8_t* next = rows + (4 * R + r) * row_bytes;
        const uint8_t* at;
        if constexpr (kW4Group<kType> > 0) {
          at = W4Group<kType>(next, b);
        } else {
          at = next + b * (row_bytes / nb);
        }
        _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
      }
    }
    __m256i wv[R];
    float dw[R], mw[R];
    for (int r = 0; r < R; ++r) wv[r] = UnpackBlock<kType>(rows + r * row_bytes, b, &dw[r], &mw[r]);
    for (int t = 0; t < T; ++t) {
      const int64_t tok = t0 + t;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + tok * x.k_stride + b * 32));
      const float dx = x.d[tok * nb_stride + b];
      constexpr bool kNibbles = !kSignedWeights<kType>;
      __m256i offset = _mm256_setzero_si256();
      // Q4_0: the lanes start from -8 times their sum of q (Q5_0: -16).
      if constexpr (kWeightOffset<kType> != 0) {
        offset = _mm256_sub_epi32(_mm256_setzero_si256(),
                                  DotU8S8<kVnni>(_mm256_setzero_si256(), _mm256_set1_epi8(kWeightOffset<kType>), q));
      }
      for (int r = 0; r < R; ++r) {
        __m256i lanes;
        if constexpr (kNibbles) {
          lanes = DotU8S8<kVnni>(offset, wv[r], q);
        } else {
          lanes = DotU8S8<kVnni>(_mm256_setzero_si256(), _mm256_sign_epi8(wv[r], wv[r]), _mm256_sign_epi8(q, wv[r]));
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(dw[r] * dx), acc[r][t]);
        if constexpr (kZeroPoint<kType>) zp[r][t] += (mw[r] * dx) * static_cast<float>(x.qsum[tok * nb_stride + b]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[(t0 + t) * ldy + r0 + r] = HSum(acc[r][t]) + zp[r][t];
}


template <GgmlType kType, bool kVnni>
void GemmQuant(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x, int64_t num_tokens,
               float* y, int64_t ldy) {
  static constexpr TileQuantFn kTiles[3][3] = {
      {TileQuant<kType, 1, 1, kVnni>, TileQuant<kType, 1, 2, kVnni>, TileQuant<kType, 1, 3, kVnni>},
      {TileQuant<kType, 2, 1, kVnni>, TileQuant<kType, 2, 2, kVnni>, TileQuant<kType, 2, 3, kVnni>},
      {TileQuant<kType, 3, 1, kVnni>, TileQuant<kType, 3, 2, kVnni>, TileQuant<kType, 3, 3, kVnni>}};
  ForEachTile(num_rows, num_tokens, kTiles, w, row_bytes, &x, x.k, y, ldy);
}

// ---- K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) x int8 activations -------------------------------
// (Q3_K and Q2_K as the AVX-512 packed kernel runs them, see avx512_packed.cc.)
// Straight from the GGUF super-blocks, no repacking. Per row and super-block: the 8 runs of 32
// weights as unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63; run r multiplies activation
// block r of the super-block), each run's integer dot with the token's int8 activations by
// maddubs (cannot saturate: 2 * 63 * 127 < 32768) and madd, the 8 dots summed by one hadd tree,
// then per run the float steps of the AVX-512 packed kernel in the same order, so the results
// are bitwise those of that path (and so of every batch and thread split):
//   Q4_K/Q5_K: acc += d_x * ((d sc) * dot - (dmin m) * qsum)        (w = d sc q - dmin m)
//   Q6_K:      acc += (d d_x) * (sc_a (dot_a - 32 s_a) + sc_b (dot_b - 32 s_b))   (w = d sc (q - 32))
// with s_a, s_b the activation sums of the run's two 16-element halves (QuantizedActs::half_sums).
// Before this path, AVX2 dequantized every row to f32 for every product (Q6_K decode ran at a
// twentieth of Q4_0's speed).
// The symmetric K-quants (per-16 int8 scales, w = d sc (q - offset)): Q6_K (offset 32), Q3_K (4).
template <GgmlType kType>
constexpr bool kSymK = kType == GgmlType::kQ6_K || kType == GgmlType::kQ3_K;
template <GgmlType kType>
constexpr int kSymKShift = kType == GgmlType::kQ6_K ? 5 : 2;  // log2 of the offset
// Scales per 16-weight half: the symmetric ones and Q2_K (w = d sc q - dmin m per half).
template <GgmlType kType>
constexpr bool kHalfScales = kSymK<kType> || kType == GgmlType::kQ2_K;

template <GgmlType kType>
struct KSuperRow {
  __m256i w[8];     // the runs, unsigned bytes
  __m256i sc[8];    // Q6_K: per run, int32 lanes 0-3 the first half's scale, 4-7 the second's
  __m256 dsc, mmin;  // Q4_K/Q5_K: d * sc and dmin * m per run
  __m256i sc16[2];  // Q6_K: the 16 half scales as int32 (runs 0-3, 4-7), for the qsum terms
  __m256i m16[2];   // Q2_K: the 16 half mins as int32, the same way
  float d, dmin;    // Q6_K, Q3_K, Q2_K
};

template <GgmlType kType>
inline void UnpackKSuperRow(const uint8_t* src, KSuperRow<kType>& s) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  if constexpr (kType == GgmlType::kQ2_K) {
    // Run r = 4 h + j: bits 2j of qs[32 h + l]; half scales sc & 15, mins sc >> 4.
    const auto& b = *reinterpret_cast<const BlockQ2_K*>(src);
    s.d = _cvtsh_ss(b.d);
    s.dmin = _cvtsh_ss(b.dmin);
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
      for (int j = 0; j < 4; ++j) s.w[4 * h + j] = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), three);
    }
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i m = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f));
    s.m16[0] = _mm256_cvtepu8_epi32(m);
    s.m16[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(m, 8));
    for (int r = 0; r < 8; ++r) {
      const int a = b.scales[2 * r] & 15, c = b.scales[2 * r + 1] & 15;
      s.sc[r] = _mm256_setr_epi32(a, a, a, a, c, c, c, c);
    }
  } else if constexpr (kType == GgmlType::kQ3_K) {
    // Run r = 4 h + s: bits 2s of qs[32 h + l] and bit r of hmask[l], as q = low2 + 4 high.
    const auto& b = *reinterpret_cast<const BlockQ3_K*>(src);
    s.d = _cvtsh_ss(b.d);
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
      for (int j = 0; j < 4; ++j) {
        const int r = 4 * h + j;
        const __m256i low2 = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), three);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hm, r), one);
        s.w[r] = _mm256_or_si256(low2, _mm256_slli_epi16(high, 2));
      }
    }
    alignas(16) int8_t sc[16];
    Q3KScales(b.scales, sc);
    const __m128i scv = _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
    s.sc16[0] = _mm256_cvtepi8_epi32(scv);
    s.sc16[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(scv, 8));
    for (int r = 0; r < 8; ++r) {
      s.sc[r] = _mm256_setr_epi32(sc[2 * r], sc[2 * r], sc[2 * r], sc[2 * r], sc[2 * r + 1], sc[2 * r + 1],
                                  sc[2 * r + 1], sc[2 * r + 1]);
    }
  } else if constexpr (kType == GgmlType::kQ6_K) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(src);
    s.d = _cvtsh_ss(b.d);
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
      // Two high bits at bit 4: (qh >> shift) & 3, then << 4 (16-bit shifts; the masks keep
      // each byte's own bits).
      auto high = [&](int shift) {
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, shift), three), 4);
      };
      s.w[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), high(0));
      s.w[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), high(2));
      s.w[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), high(4));
      s.w[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), high(6));
    }
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    s.sc16[0] = _mm256_cvtepi8_epi32(sc);
    s.sc16[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8));
    for (int r = 0; r < 8; ++r) {
      s.sc[r] = _mm256_setr_epi32(b.scales[2 * r], b.scales[2 * r], b.scales[2 * r], b.scales[2 * r],
                                  b.scales[2 * r + 1], b.scales[2 * r + 1], b.scales[2 * r + 1], b.scales[2 * r + 1]);
    }
  } else {
    const uint8_t* scales;
    const uint8_t* qs;
    float d, dmin;
    if constexpr (kType == GgmlType::kQ4_K) {
      const auto& b = *reinterpret_cast<const BlockQ4_K*>(src);
      d = _cvtsh_ss(b.d);
      dmin = _cvtsh_ss(b.dmin);
      scales = b.scales;
      qs = b.qs;
    } else {
      const auto& b = *reinterpret_cast<const BlockQ5_K*>(src);
      d = _cvtsh_ss(b.d);
      dmin = _cvtsh_ss(b.dmin);
      scales = b.scales;
      qs = b.qs;
    }
    for (int g = 0; g < 4; ++g) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * g));
      s.w[2 * g] = _mm256_and_si256(raw, low4);
      s.w[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    }
    if constexpr (kType == GgmlType::kQ5_K) {
      const auto& b = *reinterpret_cast<const BlockQ5_K*>(src);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
      const __m256i one = _mm256_set1_epi8(1);
      for (int r = 0; r < 8; ++r) {
        // Bit r of qh[l] is the fifth bit of run r's element l.
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, r), one);
        s.w[r] = _mm256_or_si256(s.w[r], _mm256_slli_epi16(bit, 4));
      }
    }
    alignas(32) float sc[8], m[8];
    for (int r = 0; r < 8; ++r) {
      uint8_t sc8, m8;
      KQuantScaleMin(r, scales, &sc8, &m8);
      sc[r] = sc8;
      m[r] = m8;
    }
    s.dsc = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_load_ps(sc));
    s.mmin = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_load_ps(m));
  }
}

// The 8 lanes' sums of each of 8 vectors, in one vector (lane r: v[r]'s sum); exact integers.
inline __m256i SumEach8(const __m256i (&v)[8]) {
  const __m256i a01 = _mm256_hadd_epi32(v[0], v[1]), a23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i a45 = _mm256_hadd_epi32(v[4], v[5]), a67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i b0 = _mm256_hadd_epi32(a01, a23), b1 = _mm256_hadd_epi32(a45, a67);
  // b0: 128-bit half 0 holds lanes 0-3's partial sums of v[0..3], half 1 lanes 4-7's.
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}

// Per run r of a super-block, c_a s_a + c_b s_b: the 16 per-half integers c (runs 0-3 in c[0],
// 4-7 in c[1], two per run) times the token's half sums s, exact.
inline __m256i HalfSumTerms(const __m256i (&c)[2], const int32_t* hs) {
  const __m256i p0 = _mm256_mullo_epi32(c[0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs)));
  const __m256i p1 = _mm256_mullo_epi32(c[1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hs + 8)));
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(p0, p1), 0xD8);
}

// One row's super-block into one token's accumulator.
template <GgmlType kType, bool kVnni>
inline void KSuperDot(const KSuperRow<kType>& s, const QuantizedActs& x, int64_t tok, int64_t sb, float& acc) {
  const int64_t nb_stride = x.k_stride / 32;
  const int8_t* qx = x.qs + tok * x.k_stride + sb * 256;
  __m256i dots[8];
  for (int r = 0; r < 8; ++r) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + 32 * r));
    dots[r] = DotU8S8<kVnni>(_mm256_setzero_si256(), s.w[r], q);
    if constexpr (kHalfScales<kType>) dots[r] = _mm256_mullo_epi32(dots[r], s.sc[r]);
  }
  const __m256i isum = SumEach8(dots);
  const __m256 dx = _mm256_loadu_ps(x.d + tok * nb_stride + sb * 8);
  __m256 v;
  if constexpr (kType == GgmlType::kQ2_K) {
    // m_a s_a + m_b s_b per run.
    const __m256i msum = HalfSumTerms(s.m16, x.half_sums + (tok * nb_stride + sb * 8) * 2);
    const __m256 part = _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(s.d), _mm256_cvtepi32_ps(isum)),
                                      _mm256_mul_ps(_mm256_set1_ps(s.dmin), _mm256_cvtepi32_ps(msum)));
    v = _mm256_mul_ps(dx, part);
  } else if constexpr (kSymK<kType>) {
    // sc_a s_a + sc_b s_b per run.
    const __m256i corr = HalfSumTerms(s.sc16, x.half_sums + (tok * nb_stride + sb * 8) * 2);
    const __m256i total = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, kSymKShift<kType>));
    v = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(s.d), dx), _mm256_cvtepi32_ps(total));
  } else {
    const __m256 qsum = _mm256_cvtepi32_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qsum + tok * nb_stride + sb * 8)));
    const __m256 part = _mm256_sub_ps(_mm256_mul_ps(s.dsc, _mm256_cvtepi32_ps(isum)), _mm256_mul_ps(s.mmin, qsum));
    v = _mm256_mul_ps(dx, part);
  }
  alignas(32) float runs[8];
  _mm256_store_ps(runs, v);
  for (int r = 0; r < 8; ++r) acc += runs[r];  // run by run, as the packed kernel accumulates
}

template <GgmlType kType, int R, int T, bool kVnni>
void TileQuantK(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const QuantizedActs* xa, int64_t,
                float* y, int64_t ldy) {
  static_assert(R == 1);
  const QuantizedActs& x = *xa;
  constexpr int64_t kSuperBytes = static_cast<int64_t>(kType == GgmlType::kQ4_K   ? sizeof(BlockQ4_K)
                                                       : kType == GgmlType::kQ5_K ? sizeof(BlockQ5_K)
                                                       : kType == GgmlType::kQ3_K ? sizeof(BlockQ3_K)
                                                       : kType == GgmlType::kQ2_K ? sizeof(BlockQ2_K)
                                                                                  : sizeof(BlockQ6_K));
  float acc[T] = {};
  const uint8_t* row = w + r0 * row_bytes;
  KSuperRow<kType> s;
  for (int64_t sb = 0; sb < x.k / 256; ++sb) {
    UnpackKSuperRow<kType>(row + sb * kSuperBytes, s);
    for (int t = 0; t < T; ++t) KSuperDot<kType, kVnni>(s, x, t0 + t, sb, acc[t]);
  }
  for (int t = 0; t < T; ++t) y[(t0 + t) * ldy + r0] = acc[t];
}

template <GgmlType kType, bool kVnni>
void GemmQuantK(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x, int64_t num_tokens,
                float* y, int64_t ldy) {
  static constexpr TileQuantFn kTiles[1][4] = {{TileQuantK<kType, 1, 1, kVnni>, TileQuantK<kType, 1, 2, kVnni>,
                                                TileQuantK<kType, 1, 3, kVnni>, TileQuantK<kType, 1, 4, kVnni>}};
  ForEachTile(num_rows, num_tokens, kTiles, w, row_bytes, &x, x.k, y, ldy);
}

}  // namespace
}  // namespace gale::kernels
