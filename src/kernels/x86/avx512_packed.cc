// AVX-512 kernels: packed int8 layouts (Q8_0/Q4_0, W4A8/W4A16 and the K-quants, 16 rows
// interleaved per group). Built with the AVX-512 flags of avx512_kernels.cc, whose table takes
// the packed slots from here; only called when CPUID agrees.
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "base/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"
#include "kernels/x86/avx512_common.h"
#include "kernels/x86/gemm_tiles.h"

namespace gale::kernels {
namespace {

// ---- Packed Q8_0/Q4_0: 16 rows interleaved per block, one output row per lane ----------------
// A group of 16 rows is stored block by block. For block b: the 16 rows' f16 scales (32 bytes),
// then the weights with 4 consecutive elements of each row in one 32-bit lane:
//   Q8_0: 8 slices of 64 bytes, slice j = rows 0-15 x elements 4j..4j+3, as u = w ^ 0x80.
//   Q4_0: 4 slices of 64 bytes, slice j = rows 0-15 x 4 bytes; byte e holds element 4j+e in its
//         low nibble and element 16+4j+e in its high nibble (one AND, or shift and AND, gives
//         the slice of elements 4j.. or 16+4j..).
// vpdpbusd against the token's 4 activation bytes broadcast then sums a whole block for 16 rows
// at once: 8 dpbusd per 512 multiply-adds, and the block's integer dot is exact in each lane.
// Per block and token: lane += (d_w * d_x) * float(isum), in block order, exactly the scalar
// reference's arithmetic, so results are bitwise those of the scalar path.
// The zero-point types (x = d q + m) store their 16 rows' f16 offsets after the scales, and their
// q unsigned as they are; per block and token then also lane += (m_w * d_x) * float(qsum), as
// their scalar reference. Q5_0 takes 16 times qsum off, as Q4_0 takes 8.
// The 5-bit types (Q5_0, Q5_1: q in 0..31) store their low 4 bits as Q4_0's nibble slices and the
// fifth bits in one more 64-byte vector: byte 4r + e holds, in bit 2j, the fifth bit of element
// 4j + e of row r and, in bit 2j + 1, that of element 16 + 4j + e (j < 4); a bit test and a masked
// add of 16 per half-slice put them in place: 352 bytes per block and 16 rows (Q5_1: 384), as
// the file's 22 (24) per row.
// The IQ4 types store their 4-bit table indices as Q4_0's nibble slices; one byte shuffle per
// slice turns them into the table's values + 128 (unsigned, 1..241), and the lanes start from
// -128 times the block's sum of activations. IQ4_NL keeps its f16 scales; IQ4_XS's scales, f16 d
// times a 6-bit integer per run, need up to 17 significant bits, so its header holds the 16 rows'
// f32 scales of the run (64 bytes): 320 bytes per run of 32 and 16 rows, 20 per row against the
// file's 17. MXFP4 is packed as an IQ4 type with its own table (E2M1 doubled) and its E8M0 scales
// (2^(e - 128), beyond f16's range in general) as f32.

template <GgmlType kType>
constexpr bool kIQ4 = kType == GgmlType::kIQ4_NL || kType == GgmlType::kIQ4_XS || kType == GgmlType::kMXFP4;
template <GgmlType kType>
constexpr const int8_t* kCodeTable = kType == GgmlType::kMXFP4 ? kMXFP4Values : kIQ4Values;
template <GgmlType kType>
constexpr bool kF32Scales = kType == GgmlType::kIQ4_XS || kType == GgmlType::kMXFP4;
template <GgmlType kType>
constexpr bool kPackedZ = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;
template <GgmlType kType>
constexpr bool kByteCodes = kType == GgmlType::kQ8_0;
template <GgmlType kType>
constexpr bool kFiveBits = kType == GgmlType::kQ5_0 || kType == GgmlType::kQ5_1;
template <GgmlType kType>
constexpr int64_t kSliceBytes = kByteCodes<kType> ? 512 : kFiveBits<kType> ? 256 + 64 : 256;
template <GgmlType kType>
constexpr int64_t kHeaderBytes = kPackedZ<kType> || kF32Scales<kType> ? 64 : 32;
template <GgmlType kType>
constexpr int64_t kPackedBlockBytes = kHeaderBytes<kType> + kSliceBytes<kType>;

template <GgmlType kType>
int64_t PackedGroupBytes(int64_t k) {
  return k / 32 * kPackedBlockBytes<kType>;
}

// Writes 16 rows' 32 nibble values of a run (codes[r][e], low 4 bits used) as Q4_0's 4 packed
// slices: slice j byte 4r + e = element 4j + e (low nibble) and 16 + 4j + e (high nibble) of row r.
inline void WriteNibbleSlices(const uint8_t* const (&codes)[16], uint8_t* w) {
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 16; ++r)
      for (int e = 0; e < 4; ++e)
        w[(j * 16 + r) * 4 + e] =
            static_cast<uint8_t>((codes[r][4 * j + e] & 0x0f) | ((codes[r][16 + 4 * j + e] & 0x0f) << 4));
}

// The 4 slices at p unpacked: w[j] = elements 4j.. (j < 4) or 16 + 4(j - 4).. (j >= 4) of the
// 16 rows, one nibble value per byte.
inline void UnpackNibbleSlices(const uint8_t* p, __m512i (&w)[8]) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int j = 0; j < 4; ++j) {
    const __m512i raw = _mm512_loadu_si512(p + 64 * j);
    w[j] = _mm512_and_si512(raw, low4);
    w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
  }
}

// Stores T tokens' outputs of a packed group's 16 rows (the valid ones).
template <int T>
inline void StoreGroupRows(const __m512 (&acc)[T], float* y, int64_t t0, int64_t ldy, int valid_rows) {
  const __mmask16 m = valid_rows >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << valid_rows) - 1);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ldy, m, acc[t]);
}

// Runs a packed GEMM's tiles (tiles[n - 1] takes n <= 8 tokens) over groups of 16 rows, groups
// outer: a group's weights stay in L1 while every token passes. extra... go to every tile.
template <typename TileFn, typename... Extra>
inline void ForEachPackedGroup(const TileFn (&tiles)[8], const uint8_t* w, int64_t group_bytes, int64_t num_rows,
                               const QuantizedActs& x, int64_t num_tokens, float* y, int64_t ldy, Extra... extra) {
  const int64_t groups = (num_rows + 15) / 16;
  for (int64_t g = 0; g < groups; ++g) {
    const int valid = static_cast<int>(num_rows - 16 * g < 16 ? num_rows - 16 * g : 16);
    for (int64_t t = 0; t < num_tokens; t += 8) {
      const int tt = static_cast<int>(num_tokens - t < 8 ? num_tokens - t : 8);
      tiles[tt - 1](w + g * group_bytes, x, extra..., t, y + 16 * g, ldy, valid);
    }
  }
}

template <GgmlType kType>
void Pack(const uint8_t* src, int64_t src_row_bytes, int64_t num_rows, int64_t k, uint8_t* dst) {
  const int64_t nb = k / 32;
  const int64_t groups = (num_rows + 15) / 16;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + g * PackedGroupBytes<kType>(k) + b * kPackedBlockBytes<kType>;
      uint16_t scales[16] = {}, offsets[16] = {};
      float scales32[16] = {};  // IQ4_XS, MXFP4
      uint8_t codes[16][32];  // Q8_0: w ^ 0x80; Q4_0: the nibble; Q4_1/Q5_1: q; padded rows: w = 0
      for (int r = 0; r < 16; ++r) {
        const int64_t row = g * 16 + r;
        for (int e = 0; e < 32; ++e) {
          codes[r][e] = kType == GgmlType::kQ8_0 ? 0x80 : kPackedZ<kType> ? 0 : kType == GgmlType::kQ5_0 ? 16 : 8;
        }
        if (row >= num_rows) continue;
        const uint8_t* rp = src + row * src_row_bytes;
        if constexpr (kType == GgmlType::kQ4_1) {
          const BlockQ4_1& blk = reinterpret_cast<const BlockQ4_1*>(rp)[b];
          for (int e = 0; e < 16; ++e) {
            codes[r][e] = blk.qs[e] & 0x0f;
            codes[r][e + 16] = blk.qs[e] >> 4;
          }
          scales[r] = blk.d;
          offsets[r] = blk.m;
        } else if constexpr (kType == GgmlType::kQ5_1) {
          const BlockQ5_1& blk = reinterpret_cast<const BlockQ5_1*>(rp)[b];
          UnpackQ5(blk.qh, blk.qs, codes[r]);
          scales[r] = blk.d;
          offsets[r] = blk.m;
        } else if constexpr (kType == GgmlType::kQ5_0) {
          const BlockQ5_0& blk = reinterpret_cast<const BlockQ5_0*>(rp)[b];
          UnpackQ5(blk.qh, blk.qs, codes[r]);
          scales[r] = blk.d;
        } else if constexpr (kType == GgmlType::kQ8_0) {
          const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(rp)[b];
          for (int e = 0; e < 32; ++e) codes[r][e] = static_cast<uint8_t>(blk.qs[e]) ^ 0x80;
          scales[r] = blk.d;
        } else {
          // Q4_0 block b, a W4 run b under its group's scale, or an IQ4 run of table indices: the
          // same nibble order.
          const uint8_t* qs;
          if constexpr (kType == GgmlType::kIQ4_NL) {
            const BlockIQ4_NL& blk = reinterpret_cast<const BlockIQ4_NL*>(rp)[b];
            qs = blk.qs;
            scales[r] = blk.d;
          } else if constexpr (kType == GgmlType::kIQ4_XS) {
            const BlockIQ4_XS& blk = reinterpret_cast<const BlockIQ4_XS*>(rp)[b / 8];
            qs = blk.qs + 16 * (b % 8);
            scales32[r] = IQ4XSRunScale(blk, static_cast<int>(b % 8));
          } else if constexpr (kType == GgmlType::kMXFP4) {
            const BlockMXFP4& blk = reinterpret_cast<const BlockMXFP4*>(rp)[b];
            qs = blk.qs;
            scales32[r] = E8M0HalfToFp32(blk.e);
          } else if constexpr (kW4Group<kType> > 0) {
            qs = W4Run<kType>(rp, b);
            std::memcpy(&scales[r], W4Group<kType>(rp, b), 2);
          } else {
            const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(rp)[b];
            qs = blk.qs;
            scales[r] = blk.d;
          }
          for (int e = 0; e < 16; ++e) {
            codes[r][e] = qs[e] & 0x0f;
            codes[r][e + 16] = qs[e] >> 4;
          }
        }
      }
      if constexpr (kF32Scales<kType>) {
        std::memcpy(out, scales32, 64);
      } else {
        std::memcpy(out, scales, 32);
      }
      if constexpr (kPackedZ<kType>) std::memcpy(out + 32, offsets, 32);
      uint8_t* w = out + kHeaderBytes<kType>;
      if constexpr (kByteCodes<kType>) {
        for (int j = 0; j < 8; ++j)
          for (int r = 0; r < 16; ++r)
            for (int e = 0; e < 4; ++e) w[(j * 16 + r) * 4 + e] = codes[r][4 * j + e];
      } else {
        const uint8_t* rows[16];
        for (int r = 0; r < 16; ++r) rows[r] = codes[r];
        WriteNibbleSlices(rows, w);
        if constexpr (kFiveBits<kType>) {
          uint8_t* fifth = w + 256;
          for (int r = 0; r < 16; ++r) {
            for (int e = 0; e < 4; ++e) {
              uint8_t bits = 0;
              for (int j = 0; j < 4; ++j) {
                bits |= static_cast<uint8_t>(((codes[r][4 * j + e] >> 4) & 1) << (2 * j));
                bits |= static_cast<uint8_t>(((codes[r][16 + 4 * j + e] >> 4) & 1) << (2 * j + 1));
              }
              fifth[4 * r + e] = bits;
            }
          }
        }
      }
    }
  }
}

// G (1 or 2) consecutive groups of 16 rows x T tokens starting at token t0; the second group
// (group_bytes after the first) has valid_rows rows, the first all 16. Slice by slice, each
// token's 4 activation bytes are broadcast once for both groups (a broadcast costs about as much
// as the dot itself), and every weight slice is used by all T tokens as soon as it is unpacked.
template <GgmlType kType, int T, int G>
inline void PackedGroupTile(const uint8_t* group, int64_t group_bytes, const QuantizedActs& x, int64_t t0, float* y,
                            int64_t ldy, int valid_rows, const uint8_t* prefetch) {
  constexpr int32_t kOffset = kType == GgmlType::kQ8_0 || kIQ4<kType> ? 128
                              : kPackedZ<kType>                        ? 0
                              : kType == GgmlType::kQ5_0               ? 16
                                                                       : 8;
  const int64_t nb = x.k / 32;
  const int64_t nb_stride = x.k_stride / 32;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc[G][T];
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk[G];
    for (int g = 0; g < G; ++g) blk[g] = group + g * group_bytes + b * kPackedBlockBytes<kType>;
    if (prefetch != nullptr) {
      for (int g = 0; g < G; ++g)
        for (int64_t line = 0; line < kPackedBlockBytes<kType>; line += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(prefetch + g * group_bytes + b * kPackedBlockBytes<kType> + line),
                       _MM_HINT_T0);
        }
    }
    const int8_t* q[T];
    // With few tokens, two dpbusd chains per output (odd and even slices; integer sums are exact
    // in any order), so the latency of one chain of 8 does not bound the loop.
    constexpr int kChains = T <= 2 ? 2 : 1;
    __m512i isum[G][T][kChains];
    for (int t = 0; t < T; ++t) {
      q[t] = x.qs + (t0 + t) * x.k_stride + b * 32;
      const __m512i start =
          kOffset != 0 ? _mm512_set1_epi32(-kOffset * x.qsum[(t0 + t) * nb_stride + b]) : _mm512_setzero_si512();
      for (int g = 0; g < G; ++g) {
        isum[g][t][0] = start;
        if constexpr (kChains == 2) isum[g][t][1] = _mm512_setzero_si512();
      }
    }
    // Weight slice j (elements 4j..4j+3 of the 16 rows) against every token's bytes 4j..4j+3.
    auto dot_slice = [&](const __m512i (&wv)[G], int j) {
      for (int t = 0; t < T; ++t) {
        int32_t four;
        std::memcpy(&four, q[t] + 4 * j, 4);
        const __m512i a = _mm512_set1_epi32(four);
        for (int g = 0; g < G; ++g) {
          __m512i& chain = isum[g][t][j % kChains];
          chain = _mm512_dpbusd_epi32(chain, wv[g], a);
        }
      }
    };
    constexpr int64_t kW = kHeaderBytes<kType>;
    if constexpr (kByteCodes<kType>) {
      for (int j = 0; j < 8; ++j) {
        __m512i wv[G];
        for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_si512(blk[g] + kW + 64 * j);
        dot_slice(wv, j);
      }
    } else {
      // Q4_0: slice s holds elements 4s.. (low nibbles) and 16+4s.. (high nibbles); the 5-bit
      // types add 16 where their fifth bit (bit 2s or 2s + 1 of the fifth-bit vector) is set.
      __m512i fifth[G];
      if constexpr (kFiveBits<kType>) {
        for (int g = 0; g < G; ++g) fifth[g] = _mm512_loadu_si512(blk[g] + kW + 256);
      }
      const __m512i sixteen = _mm512_set1_epi8(16);
      // IQ4: index -> table value + 128.
      const __m512i table =
          kIQ4<kType> ? _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kCodeTable<kType>)),
                                                             _mm_set1_epi8(static_cast<char>(0x80))))
                      : _mm512_setzero_si512();
      auto lookup = [&](__m512i (&wv)[G]) {
        if constexpr (kIQ4<kType>) {
          for (int g = 0; g < G; ++g) wv[g] = _mm512_shuffle_epi8(table, wv[g]);
        }
      };
      auto add_fifth = [&](__m512i (&wv)[G], int bit) {
        if constexpr (kFiveBits<kType>) {
          const __m512i sel = _mm512_set1_epi8(static_cast<char>(1 << bit));
          for (int g = 0; g < G; ++g) {
            wv[g] = _mm512_mask_add_epi8(wv[g], _mm512_test_epi8_mask(fifth[g], sel), wv[g], sixteen);
          }
        }
      };
      for (int s = 0; s < 4; ++s) {
        __m512i raw[G], wv[G];
        for (int g = 0; g < G; ++g) {
          raw[g] = _mm512_loadu_si512(blk[g] + kW + 64 * s);
          wv[g] = _mm512_and_si512(raw[g], low4);
        }
        add_fifth(wv, 2 * s);
        lookup(wv);
        dot_slice(wv, s);
        for (int g = 0; g < G; ++g) wv[g] = _mm512_and_si512(_mm512_srli_epi16(raw[g], 4), low4);
        add_fifth(wv, 2 * s + 1);
        lookup(wv);
        dot_slice(wv, s + 4);
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 dw = kF32Scales<kType> ? _mm512_loadu_ps(blk[g])
                                          : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[g])));
      for (int t = 0; t < T; ++t) {
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[(t0 + t) * nb_stride + b]));
        const __m512i sum = kChains == 2 ? _mm512_add_epi32(isum[g][t][0], isum[g][t][kChains - 1]) : isum[g][t][0];
        acc[g][t] = _mm512_add_ps(acc[g][t], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(sum)));
      }
      if constexpr (kPackedZ<kType>) {
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[g] + 32)));
        for (int t = 0; t < T; ++t) {
          const int64_t i = (t0 + t) * nb_stride + b;
          const __m512 mscale = _mm512_mul_ps(mw, _mm512_set1_ps(x.d[i]));
          acc[g][t] = _mm512_add_ps(acc[g][t], _mm512_mul_ps(mscale, _mm512_set1_ps(static_cast<float>(x.qsum[i]))));
        }
      }
    }
  }
  if constexpr (G == 2) StoreGroupRows(acc[0], y, t0, ldy, 16);
  StoreGroupRows(acc[G - 1], y + 16 * (G - 1), t0, ldy, valid_rows);
}

template <GgmlType kType>
void GemmPacked(const uint8_t* w, int64_t group_bytes, int64_t num_rows, const QuantizedActs& x, int64_t num_tokens,
                float* y, int64_t ldy) {
  using TileFn = void (*)(const uint8_t*, int64_t, const QuantizedActs&, int64_t, float*, int64_t, int, const uint8_t*);
  constexpr int kT = 6;
  static constexpr TileFn kTiles[2][kT] = {
      {PackedGroupTile<kType, 1, 1>, PackedGroupTile<kType, 2, 1>, PackedGroupTile<kType, 3, 1>,
       PackedGroupTile<kType, 4, 1>, PackedGroupTile<kType, 5, 1>, PackedGroupTile<kType, 6, 1>},
      {PackedGroupTile<kType, 1, 2>, PackedGroupTile<kType, 2, 2>, PackedGroupTile<kType, 3, 2>,
       PackedGroupTile<kType, 4, 2>, PackedGroupTile<kType, 5, 2>, PackedGroupTile<kType, 6, 2>}};
  // Groups in pairs (a single one at an odd end), groups outer: their weights stay in L1 while
  // every token passes. One or two tokens (decode) are bound by memory, not the broadcasts, and
  // stream one group at a time: two streams per thread measured ~25% slower there. Rows come
  // out bitwise the same either way (exact integer block sums, the same scaling). With pairs, the
  // first token tile of each pair prefetches the next pair block by block: at batch 8-32 the
  // weights stream from memory once per step, and without it 16-token products ran ~25% below
  // their in-cache rate (kernels_bench BM_MatMulStreaming).
  const int64_t groups = (num_rows + 15) / 16;
  const int64_t stride = num_tokens > 2 ? 2 : 1;
  for (int64_t g = 0; g < groups; g += stride) {
    const int pair = g + 1 < groups && stride == 2 ? 2 : 1;
    const int64_t last = g + pair - 1;
    const int valid = static_cast<int>(num_rows - 16 * last < 16 ? num_rows - 16 * last : 16);
    for (int64_t t = 0; t < num_tokens; t += kT) {
      const int tt = static_cast<int>(num_tokens - t < kT ? num_tokens - t : kT);
      const uint8_t* next = t == 0 && stride == 2 && g + 2 < groups ? w + (g + 2) * group_bytes : nullptr;
      kTiles[pair - 1][tt - 1](w + g * group_bytes, group_bytes, x, t, y + 16 * g, ldy, valid, next);
    }
  }
}

// W4A16 in Q4_0's packed layout with 16-bit activations (QuantizedActs::lo). Symmetric types
// (W4A8's row layout) pack exactly as W4A8; zero-point ones (x = d q + m, q = the nibble) carry
// the 16 rows' offsets after their scales (kPackedBlockBytesZ). Per block and token the exact
// integer dot of the nibbles u with q = 256 hi + lo:
//   sum u q = 256 * sum u * hi + sum u * lo
// (u * hi on vpdpbusd as unsigned weights x signed high bytes, u * lo as unsigned low bytes x the
// weights read as signed 0..15); symmetric: minus 8 * qsum (u = w + 8). |256 sum u hi| < 2^24 and
// the dot's magnitude <= 32 * 15 * 32767 < 2^24, so int32 holds every step and the f32 conversion
// is exact. Then lane += (d_w * d_x) * dot (+ m_w * d_x * qsum for the offset): two dpbusd per 4
// weights instead of the int8 path's one, and no bf16 unpacking.
constexpr int64_t kPackedBlockBytesZ = 64 + kSliceBytes<GgmlType::kQ4_0>;

template <int G>
int64_t PackedGroupBytesW4Z(int64_t k) {
  return k / 32 * kPackedBlockBytesZ;
}

template <int G>
void PackW4Z(const uint8_t* src, int64_t src_row_bytes, int64_t num_rows, int64_t k, uint8_t* dst) {
  const int64_t nb = k / 32;
  const int64_t groups = (num_rows + 15) / 16;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + g * PackedGroupBytesW4Z<G>(k) + b * kPackedBlockBytesZ;
      uint16_t scales[16] = {}, offsets[16] = {};
      uint8_t codes[16][32] = {};  // padded rows: d = m = 0
      for (int r = 0; r < 16; ++r) {
        const int64_t row = g * 16 + r;
        if (row >= num_rows) continue;
        const auto& blk = reinterpret_cast<const BlockW4<G, true>*>(src + row * src_row_bytes)[b / (G / 32)];
        scales[r] = blk.d;
        offsets[r] = blk.m;
        const uint8_t* qs = blk.qs + (b % (G / 32)) * 16;
        for (int e = 0; e < 16; ++e) {
          codes[r][e] = qs[e] & 0x0f;
          codes[r][e + 16] = qs[e] >> 4;
        }
      }
      std::memcpy(out, scales, 32);
      std::memcpy(out + 32, offsets, 32);
      const uint8_t* rows[16];
      for (int r = 0; r < 16; ++r) rows[r] = codes[r];
      WriteNibbleSlices(rows, out + 64);
    }
  }
}

template <bool kZ, int T>
inline void PackedGroupTileA16(const uint8_t* group, const QuantizedActs& x, int64_t t0, float* y, int64_t ldy,
                               int valid_rows) {
  constexpr int64_t kBlockBytes = kZ ? kPackedBlockBytesZ : kPackedBlockBytes<GgmlType::kQ4_0>;
  constexpr int64_t kHeader = kZ ? 64 : 32;
  const int64_t nb = x.k / 32;
  const int64_t nb_stride = x.k_stride / 32;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kBlockBytes;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (kZ) mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    __m512i w[8];
    UnpackNibbleSlices(blk + kHeader, w);
    for (int t = 0; t < T; ++t) {
      const int64_t tok = t0 + t;
      const int8_t* hi = x.qs + tok * x.k_stride + b * 32;
      const uint8_t* lo = x.lo + tok * x.k_stride + b * 32;
      const int32_t qsum = x.qsum[tok * nb_stride + b];
      __m512i sh = _mm512_setzero_si512(), sh2 = _mm512_setzero_si512();
      __m512i sl = _mm512_set1_epi32(kZ ? 0 : -8 * qsum), sl2 = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        int32_t h0, h1, l0, l1;
        std::memcpy(&h0, hi + 4 * j, 4);
        std::memcpy(&h1, hi + 4 * j + 4, 4);
        std::memcpy(&l0, lo + 4 * j, 4);
        std::memcpy(&l1, lo + 4 * j + 4, 4);
        sh = _mm512_dpbusd_epi32(sh, w[j], _mm512_set1_epi32(h0));
        sh2 = _mm512_dpbusd_epi32(sh2, w[j + 1], _mm512_set1_epi32(h1));
        sl = _mm512_dpbusd_epi32(sl, _mm512_set1_epi32(l0), w[j]);
        sl2 = _mm512_dpbusd_epi32(sl2, _mm512_set1_epi32(l1), w[j + 1]);
      }
      const __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(sh, sh2), 8), _mm512_add_epi32(sl, sl2));
      const float dx = x.d[tok * nb_stride + b];
      __m512 part = _mm512_mul_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(isum));
      if constexpr (kZ) part = _mm512_add_ps(part, _mm512_mul_ps(mw, _mm512_set1_ps(dx * static_cast<float>(qsum))));
      acc[t] = _mm512_add_ps(acc[t], part);
    }
  }
  StoreGroupRows(acc, y, t0, ldy, valid_rows);
}

template <bool kZ>
void GemmPackedA16(const uint8_t* w, int64_t group_bytes, int64_t num_rows, const QuantizedActs& x, int64_t num_tokens,
                   float* y, int64_t ldy) {
  using TileFn = void (*)(const uint8_t*, const QuantizedActs&, int64_t, float*, int64_t, int);
  static constexpr TileFn kTiles[8] = {PackedGroupTileA16<kZ, 1>, PackedGroupTileA16<kZ, 2>, PackedGroupTileA16<kZ, 3>,
                                       PackedGroupTileA16<kZ, 4>, PackedGroupTileA16<kZ, 5>, PackedGroupTileA16<kZ, 6>,
                                       PackedGroupTileA16<kZ, 7>, PackedGroupTileA16<kZ, 8>};
  ForEachPackedGroup(kTiles, w, group_bytes, num_rows, x, num_tokens, y, ldy);
}

// ---- Packed K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) x int8 activations (VNNI) ------------------
// (Q3_K as Q6_K with values 0..7 and 4 for 32; Q2_K with per-half scale and min bytes:
//  lane += d_x * (d * (sc_a dot_a + sc_b dot_b) - dmin * (m_a s_a + m_b s_b)).)
// A super-block of 256 weights is 8 runs of 32 (each run one activation block). For a group of
// 16 rows, per super-block: a header (Q4_K/Q5_K: the rows' d then dmin, f16; Q6_K: d), then per
// run: its scales (Q4_K/Q5_K: the 6-bit sub-block scale and min, u8 x 16 each; Q6_K: the int8
// scales of its two 16-weight halves, x 16 each), its low 4 bits in Q4_0's 4 slices, and the higher
// bits as byte masks over those slices' unpacked vectors (Q5_K: bit 4; Q6_K: bits 4 and 5; one
// 64-bit mask per 64-byte vector), added with one masked byte add each. The weights are then
// unsigned (0..15, 0..31, 0..63) for vpdpbusd against the token's activation bytes:
//   Q4_K/Q5_K: lane += d_x * (d sc * dot - dmin m * qsum)         (w = d sc q - dmin m)
//   Q6_K:      lane += d d_x * (sc_a (dot_a - 32 s_a) + sc_b (dot_b - 32 s_b))   (w = d sc (q - 32))
// with s_a, s_b the activation sums of the run's two halves (QuantizedActs::half_sums). Integer dots are exact; the float
// steps are fixed per lane, so results do not depend on the batch or the thread split.
// Q3_K runs as Q6_K does, with q in 0..7 (no high bits) and an offset of 4 for 32.
template <GgmlType kType>
constexpr bool kSymK = kType == GgmlType::kQ6_K || kType == GgmlType::kQ3_K;
template <GgmlType kType>
constexpr int32_t kSymKOffset = kType == GgmlType::kQ6_K ? 32 : 4;
template <GgmlType kType>
constexpr int kKHighBits = kType == GgmlType::kQ5_K ? 1 : kType == GgmlType::kQ6_K ? 2 : 0;
template <GgmlType kType>
constexpr int64_t kKRunBytes = 32 + 256 + 64 * kKHighBits<kType>;
template <GgmlType kType>
constexpr int64_t kKHeaderBytes = kSymK<kType> ? 32 : 64;
template <GgmlType kType>
constexpr int64_t kKSuperBytes = kKHeaderBytes<kType> + 8 * kKRunBytes<kType>;

template <GgmlType kType>
int64_t PackedGroupBytesK(int64_t k) {
  return k / kQK_K * kKSuperBytes<kType>;
}

// One row's super-block as integers: q[256] (unsigned, before Q6_K's -32), and per run r:
// Q4_K/Q5_K s0[r] = scale, s1[r] = min; Q6_K s0[r], s1[r] = the halves' int8 scales; d, dmin f16.
template <GgmlType kType>
void UnpackKSuper(const uint8_t* src, uint8_t* q, int16_t* s0, int16_t* s1, uint16_t* d, uint16_t* dmin) {
  if constexpr (kType == GgmlType::kQ2_K) {
    const auto& b = *reinterpret_cast<const BlockQ2_K*>(src);
    *d = b.d;
    *dmin = b.dmin;
    for (int e = 0; e < 256; ++e) q[e] = KLow2(b.qs, e);
    for (int r = 0; r < 8; ++r) {
      s0[r] = b.scales[2 * r];  // the halves' bytes: scale in the low nibble, min in the high
      s1[r] = b.scales[2 * r + 1];
    }
  } else if constexpr (kType == GgmlType::kQ3_K) {
    const auto& b = *reinterpret_cast<const BlockQ3_K*>(src);
    *d = b.d;
    *dmin = 0;
    Q3KValues(b, q);
    int8_t sc[16];
    Q3KScales(b.scales, sc);
    for (int r = 0; r < 8; ++r) {
      s0[r] = sc[2 * r];
      s1[r] = sc[2 * r + 1];
    }
  } else if constexpr (kType == GgmlType::kQ6_K) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(src);
    *d = b.d;
    *dmin = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b.ql + 64 * h;
      const uint8_t* qh = b.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        q[128 * h + l] = static_cast<uint8_t>((ql[l] & 0x0f) | ((qh[l] & 3) << 4));
        q[128 * h + l + 32] = static_cast<uint8_t>((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4));
        q[128 * h + l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        q[128 * h + l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    for (int r = 0; r < 8; ++r) {
      s0[r] = b.scales[2 * r];
      s1[r] = b.scales[2 * r + 1];
    }
  } else {
    const uint8_t* scales;
    const uint8_t* qs;
    const uint8_t* qh = nullptr;
    if constexpr (kType == GgmlType::kQ4_K) {
      const auto& b = *reinterpret_cast<const BlockQ4_K*>(src);
      *d = b.d;
      *dmin = b.dmin;
      scales = b.scales;
      qs = b.qs;
    } else {
      const auto& b = *reinterpret_cast<const BlockQ5_K*>(src);
      *d = b.d;
      *dmin = b.dmin;
      scales = b.scales;
      qs = b.qs;
      qh = b.qh;
    }
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        q[64 * g + l] = qs[32 * g + l] & 0x0f;
        q[64 * g + 32 + l] = qs[32 * g + l] >> 4;
        if (qh != nullptr) {
          q[64 * g + l] = static_cast<uint8_t>(q[64 * g + l] | (((qh[l] >> (2 * g)) & 1) << 4));
          q[64 * g + 32 + l] = static_cast<uint8_t>(q[64 * g + 32 + l] | (((qh[l] >> (2 * g + 1)) & 1) << 4));
        }
      }
    }
    for (int r = 0; r < 8; ++r) {
      uint8_t sc, m;
      KQuantScaleMin(r, scales, &sc, &m);
      s0[r] = sc;
      s1[r] = m;
    }
  }
}

template <GgmlType kType>
void PackK(const uint8_t* src, int64_t src_row_bytes, int64_t num_rows, int64_t k, uint8_t* dst) {
  const int64_t nsb = k / kQK_K;
  const int64_t groups = (num_rows + 15) / 16;
  const int64_t block_bytes = TypeTraits(kType).block_bytes;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      uint8_t* out = dst + g * PackedGroupBytesK<kType>(k) + sb * kKSuperBytes<kType>;
      uint8_t q[16][256] = {};  // padded rows: all zero (d = 0)
      int16_t s0[16][8] = {}, s1[16][8] = {};
      uint16_t d[16] = {}, dmin[16] = {};
      for (int r = 0; r < 16; ++r) {
        const int64_t row = g * 16 + r;
        if (row < num_rows) {
          UnpackKSuper<kType>(src + row * src_row_bytes + sb * block_bytes, q[r], s0[r], s1[r], &d[r], &dmin[r]);
        }
      }
      std::memcpy(out, d, 32);
      if constexpr (!kSymK<kType>) std::memcpy(out + 32, dmin, 32);
      for (int run = 0; run < 8; ++run) {
        uint8_t* o = out + kKHeaderBytes<kType> + run * kKRunBytes<kType>;
        for (int r = 0; r < 16; ++r) {
          o[r] = static_cast<uint8_t>(s0[r][run]);  // u8 scale, or the int8 scale's bits
          o[16 + r] = static_cast<uint8_t>(s1[r][run]);
        }
        const uint8_t* base[16];
        for (int r = 0; r < 16; ++r) base[r] = q[r] + 32 * run;
        WriteNibbleSlices(base, o + 32);
        // Masks: vector j (0-7) holds element 4j + e (j < 4) or 16 + 4(j - 4) + e of row r in
        // byte 4r + e; bit (4r + e) of mask j is the weight's bit 4 (and, Q6_K, bit 5).
        for (int bit = 0; bit < kKHighBits<kType>; ++bit) {
          for (int j = 0; j < 8; ++j) {
            uint64_t mask = 0;
            for (int r = 0; r < 16; ++r)
              for (int e = 0; e < 4; ++e) {
                const int elem = j < 4 ? 4 * j + e : 16 + 4 * (j - 4) + e;
                if ((base[r][elem] >> (4 + bit)) & 1) mask |= uint64_t{1} << (4 * r + e);
              }
            std::memcpy(o + 288 + 64 * bit + 8 * j, &mask, 8);
          }
        }
      }
    }
  }
}

template <GgmlType kType, int T>
inline void PackedGroupTileK(const uint8_t* group, const QuantizedActs& x, int64_t t0,
                             float* y, int64_t ldy, int valid_rows) {
  const int64_t nsb = x.k / kQK_K;
  const int64_t nb_stride = x.k_stride / 32;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* super = group + sb * kKSuperBytes<kType>;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super)));
    __m512 dmin = _mm512_setzero_ps();
    if constexpr (!kSymK<kType>) {
      dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 32)));
    }
    for (int run = 0; run < 8; ++run) {
      const uint8_t* o = super + kKHeaderBytes<kType> + run * kKRunBytes<kType>;
      const int64_t b = sb * 8 + run;  // activation block
      const __m128i s0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(o));
      const __m128i s1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(o + 16));
      __m512i w[8];
      UnpackNibbleSlices(o + 32, w);
      for (int bit = 0; bit < kKHighBits<kType>; ++bit) {
        const __m512i add = _mm512_set1_epi8(static_cast<char>(16 << bit));
        for (int j = 0; j < 8; ++j) {
          uint64_t mbits;
          std::memcpy(&mbits, o + 288 + 64 * bit + 8 * j, 8);
          w[j] = _mm512_mask_add_epi8(w[j], _cvtu64_mask64(mbits), w[j], add);
        }
      }
      if constexpr (kSymK<kType> || kType == GgmlType::kQ2_K) {
        // Per 16-weight half: Q6_K/Q3_K an int8 scale, Q2_K a byte of scale (low) and min (high).
        __m512i sca, scb, ma, mb;
        if constexpr (kType == GgmlType::kQ2_K) {
          const __m512i r0 = _mm512_cvtepu8_epi32(s0), r1 = _mm512_cvtepu8_epi32(s1);
          const __m512i fifteen = _mm512_set1_epi32(15);
          sca = _mm512_and_si512(r0, fifteen);
          scb = _mm512_and_si512(r1, fifteen);
          ma = _mm512_srli_epi32(r0, 4);
          mb = _mm512_srli_epi32(r1, 4);
        } else {
          sca = _mm512_cvtepi8_epi32(s0);
          scb = _mm512_cvtepi8_epi32(s1);
        }
        constexpr int32_t kOffset = kSymK<kType> ? kSymKOffset<kType> : 0;
        for (int t = 0; t < T; ++t) {
          const int64_t tok = t0 + t;
          const int8_t* qx = x.qs + tok * x.k_stride + b * 32;
          const int32_t* hs = x.half_sums + (tok * nb_stride + b) * 2;
          __m512i ia = _mm512_set1_epi32(-kOffset * hs[0]);
          __m512i ib = _mm512_set1_epi32(-kOffset * hs[1]);
          for (int j = 0; j < 4; ++j) {
            int32_t fa, fb;
            std::memcpy(&fa, qx + 4 * j, 4);
            std::memcpy(&fb, qx + 16 + 4 * j, 4);
            ia = _mm512_dpbusd_epi32(ia, w[j], _mm512_set1_epi32(fa));
            ib = _mm512_dpbusd_epi32(ib, w[j + 4], _mm512_set1_epi32(fb));
          }
          const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(sca, ia), _mm512_mullo_epi32(scb, ib));
          const __m512 dx = _mm512_set1_ps(x.d[tok * nb_stride + b]);
          if constexpr (kType == GgmlType::kQ2_K) {
            const __m512i msum = _mm512_add_epi32(_mm512_mullo_epi32(ma, _mm512_set1_epi32(hs[0])),
                                                  _mm512_mullo_epi32(mb, _mm512_set1_epi32(hs[1])));
            const __m512 part = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)),
                                              _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(msum)));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(dx, part));
          } else {
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(isum)));
          }
        }
      } else {
        const __m512 dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(s0)));
        const __m512 mmin = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(s1)));
        for (int t = 0; t < T; ++t) {
          const int64_t tok = t0 + t;
          const int8_t* qx = x.qs + tok * x.k_stride + b * 32;
          __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
          for (int j = 0; j < 8; j += 2) {
            int32_t f0, f1;
            std::memcpy(&f0, qx + 4 * j, 4);
            std::memcpy(&f1, qx + 4 * j + 4, 4);
            i0 = _mm512_dpbusd_epi32(i0, w[j], _mm512_set1_epi32(f0));
            i1 = _mm512_dpbusd_epi32(i1, w[j + 1], _mm512_set1_epi32(f1));
          }
          // Vector j holds elements 4j.. (j < 4) or 16 + 4(j - 4).. of the run: the order of the
          // broadcasts above follows w's, since w[j] for j >= 4 takes bytes 16 + 4(j - 4).
          const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1));
          const __m512 part = _mm512_sub_ps(_mm512_mul_ps(dsc, dot),
                                            _mm512_mul_ps(mmin, _mm512_set1_ps(static_cast<float>(x.qsum[tok * nb_stride + b]))));
          acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_set1_ps(x.d[tok * nb_stride + b]), part));
        }
      }
    }
  }
  StoreGroupRows(acc, y, t0, ldy, valid_rows);
}

template <GgmlType kType>
void GemmPackedK(const uint8_t* w, int64_t group_bytes, int64_t num_rows, const QuantizedActs& x, int64_t num_tokens,
                 float* y, int64_t ldy) {
  using TileFn = void (*)(const uint8_t*, const QuantizedActs&, int64_t, float*, int64_t, int);
  static constexpr TileFn kTiles[8] = {PackedGroupTileK<kType, 1>, PackedGroupTileK<kType, 2>,
                                       PackedGroupTileK<kType, 3>, PackedGroupTileK<kType, 4>,
                                       PackedGroupTileK<kType, 5>, PackedGroupTileK<kType, 6>,
                                       PackedGroupTileK<kType, 7>, PackedGroupTileK<kType, 8>};
  ForEachPackedGroup(kTiles, w, group_bytes, num_rows, x, num_tokens, y, ldy);
}

}  // namespace

void Avx512FillPacked(KernelTable& t) {
  using enum GgmlType;
  // W4A8 matrices pack into Q4_0's packed layout (each run with its group's scale) and run
  // through its kernel; W4A16 ones pack the same way (symmetric: W4A8's row layout; zero
  // point: with the offsets) and run with 16-bit activations. The bf16 tile in
  // avx512_kernels.cc is for W4A16 matrices that are not packed.
  const struct {
    GgmlType type;
    PackedGroupBytesFn group_bytes;
    PackFn pack;
    GemmQuantFn gemm;  // int8 activations
    GemmQuantFn gemm_a16;  // 16-bit activations
  } kSlots[] = {
      {kQ8_0, PackedGroupBytes<kQ8_0>, Pack<kQ8_0>, GemmPacked<kQ8_0>, nullptr},
      {kQ4_0, PackedGroupBytes<kQ4_0>, Pack<kQ4_0>, GemmPacked<kQ4_0>, nullptr},
      {kQ5_0, PackedGroupBytes<kQ5_0>, Pack<kQ5_0>, GemmPacked<kQ5_0>, nullptr},
      {kQ4_1, PackedGroupBytes<kQ4_1>, Pack<kQ4_1>, GemmPacked<kQ4_1>, nullptr},
      {kQ5_1, PackedGroupBytes<kQ5_1>, Pack<kQ5_1>, GemmPacked<kQ5_1>, nullptr},
      {kQ4_K, PackedGroupBytesK<kQ4_K>, PackK<kQ4_K>, GemmPackedK<kQ4_K>, nullptr},
      {kQ5_K, PackedGroupBytesK<kQ5_K>, PackK<kQ5_K>, GemmPackedK<kQ5_K>, nullptr},
      {kQ6_K, PackedGroupBytesK<kQ6_K>, PackK<kQ6_K>, GemmPackedK<kQ6_K>, nullptr},
      {kQ3_K, PackedGroupBytesK<kQ3_K>, PackK<kQ3_K>, GemmPackedK<kQ3_K>, nullptr},
      {kQ2_K, PackedGroupBytesK<kQ2_K>, PackK<kQ2_K>, GemmPackedK<kQ2_K>, nullptr},
      {kIQ4_NL, PackedGroupBytes<kIQ4_NL>, Pack<kIQ4_NL>, GemmPacked<kIQ4_NL>, nullptr},
      {kIQ4_XS, PackedGroupBytes<kIQ4_XS>, Pack<kIQ4_XS>, GemmPacked<kIQ4_XS>, nullptr},
      {kMXFP4, PackedGroupBytes<kMXFP4>, Pack<kMXFP4>, GemmPacked<kMXFP4>, nullptr},
      {kW4A16G64, PackedGroupBytes<kQ4_0>, Pack<kW4A8G64>, nullptr, GemmPackedA16<false>},
      {kW4A16G128, PackedGroupBytes<kQ4_0>, Pack<kW4A8G128>, nullptr, GemmPackedA16<false>},
      {kW4A16ZG64, PackedGroupBytesW4Z<64>, PackW4Z<64>, nullptr, GemmPackedA16<true>},
      {kW4A16ZG128, PackedGroupBytesW4Z<128>, PackW4Z<128>, nullptr, GemmPackedA16<true>},
      {kW4A8G64, PackedGroupBytes<kQ4_0>, Pack<kW4A8G64>, GemmPacked<kQ4_0>, nullptr},
      {kW4A8G128, PackedGroupBytes<kQ4_0>, Pack<kW4A8G128>, GemmPacked<kQ4_0>, nullptr},
  };
  for (const auto& s : kSlots) {
    const int slot = SlotOf(s.type);
    t.packed_group_bytes[slot] = s.group_bytes;
    t.pack[slot] = s.pack;
    t.gemm_packed[slot] = s.gemm;
    t.gemm_packed_a16[slot] = s.gemm_a16;
  }
}

}  // namespace gale::kernels
