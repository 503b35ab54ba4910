// The ggml tensor types gale understands, with llama.cpp's numeric type ids and block layouts
// (bit-exact), plus the scalar reference quantize/dequantize for each. Kernels live in kernels/;
// this file is only the format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gale {

// Numeric values are the ggml_type ids stored in GGUF files.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
  kMXFP4 = 39,
  // gale's own 4-bit weight types (ids far above ggml's, which other tools will not know): int4
  // weights in groups of 64 or 128 with an f16 scale, symmetric (x = d * (q - 8)) or with an f16
  // offset as zero point (Z: x = d * q + m, q in [0, 15]). W4A16 types multiply with f32
  // activations (each row dequantized), W4A8 ones with int8 activations quantized per 32.
  kW4A16G64 = 1024,
  kW4A16G128 = 1025,
  kW4A16ZG64 = 1026,
  kW4A16ZG128 = 1027,
  kW4A8G64 = 1028,
  kW4A8G128 = 1029,
  // gale's FP8 weight type, the format DeepSeek-V4 / V4.1 release their dense weights in: blocks
  // of 32 OCP e4m3 values sharing a UE8M0 scale (BlockF8E4M3). `gale convert` stores the release's
  // bytes as they are (its 32x32 or 128x128 tiles give each row block its tile's scale).
  kF8E4M3 = 1030,
};

inline constexpr int kQK8_0 = 32;  // elements per Q8_0 block
inline constexpr int kQK4_0 = 32;  // elements per Q4_0 block

// Q8_0: 32 int8 weights sharing one f16 scale; x = d * q.
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: 32 4-bit weights sharing one f16 scale; element j < 16 is the low nibble of qs[j],
// element j + 16 the high nibble; x = d * (nibble - 8).
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// Q4_1: Q4_0's nibble order with an f16 offset; x = d * nibble + m.
struct BlockQ4_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 offset (the block's minimum)
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0 / Q5_1: Q4_0's nibbles plus a fifth bit per element in qh (a little-endian 32-bit word:
// bit j for element j); q = nibble | bit << 4 in [0, 31]. Q5_0: x = d * (q - 16); Q5_1:
// x = d * q + m.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// The 32 5-bit values of a Q5_0/Q5_1 block, in element order.
static inline void UnpackQ5(const uint8_t* qh, const uint8_t* qs, uint8_t* q) {
  const uint32_t h = static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
                     static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0x0f) | ((h >> j) & 1) << 4);
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
  }
}

// A group of the W4 types: G/32 runs of 16 bytes, each holding 32 elements in Q4_0's order
// (element j < 16 of run s is the low nibble of qs[16 s + j], element j + 16 its high nibble),
// so int8-activation kernels read a run as they read a Q4_0 block.
template <int G, bool kZeroPoint>
struct BlockW4 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 offset (zero-point types only; unused bytes otherwise are not stored)
  uint8_t qs[G / 2];
};
template <int G>
struct BlockW4<G, false> {
  uint16_t d;
  uint8_t qs[G / 2];
};
static_assert(sizeof(BlockW4<64, false>) == 34 && sizeof(BlockW4<128, false>) == 66);
static_assert(sizeof(BlockW4<64, true>) == 36 && sizeof(BlockW4<128, true>) == 68);

// Group size and zero point of a W4 type; group 0 for other types.
struct W4Format {
  int group = 0;
  bool zero_point = false;
};
W4Format W4FormatOf(GgmlType type);

// llama.cpp's llama_ftype ("general.file_type") of a file mostly of this type; 1024 ("guessed")
// for types no llama_ftype names (gale's own).
uint32_t LlamaFileType(GgmlType type);

// K-quants: super-blocks of 256 weights in 8 sub-blocks of 32 (Q6_K: 16 of 16).
inline constexpr int kQK_K = 256;

// Q2_K: w = d * (sc_j & 15) * q - dmin * (sc_j >> 4) for the 16-weight sub-block j, q in [0, 3]
// (element 128 h + 32 s + l at bits 2s of qs[32 h + l], as Q3_K's low bits).
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// The 2-bit fields of Q2_K / Q3_K in element order.
static inline uint8_t KLow2(const uint8_t* qs, int e) {
  return static_cast<uint8_t>((qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
}

// Q3_K: w = d * (sc_j - 32) * (q - 4) for the 16-weight sub-block j, q in [0, 7]: its low 2 bits
// in qs (element 128 h + 32 s + l at bits 2s of qs[32 h + l]), its third in hmask (bit 4 h + s of
// hmask[l]), and the sixteen 6-bit scales packed in 12 bytes (Q3KScales).
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// The 16 sub-block scales of a Q3_K super-block, minus 32: scale i has its low 4 bits in byte i
// (i < 8) or the high nibble of byte i - 8, and its top 2 bits at bits 2 (i / 4) of byte 8 + i % 4.
static inline void Q3KScales(const uint8_t* s, int8_t* out) {
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? s[i] & 0x0f : s[i - 8] >> 4;
    const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    out[i] = static_cast<int8_t>((low | high << 4) - 32);
  }
}

// The 256 values q (0..7) of a Q3_K super-block, in element order.
static inline void Q3KValues(const BlockQ3_K& b, uint8_t* q) {
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    q[e] = static_cast<uint8_t>(KLow2(b.qs, e) | ((b.hmask[l] >> (4 * h + s)) & 1) << 2);
  }
}

// Q4_K: w = d * sc_j * q - dmin * m_j for sub-block j, q in [0, 15]; the eight 6-bit (sc, m)
// pairs are packed in scales[12]; qs holds 4 groups of 64 weights, 32 bytes each, low nibbles
// first (elements 0-31 of the group), then high nibbles (32-63).
struct BlockQ4_K {
  uint16_t d;     // f16 scale of the sub-block scales
  uint16_t dmin;  // f16 scale of the sub-block mins
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K: as Q4_K with a fifth bit per weight in qh (bit 2g of qh[l] for element l of group g's
// low half, bit 2g+1 for its high half).
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K: w = d * scales[i] * (q - 32), q in [0, 63] from 4 low bits in ql and 2 high bits in qh,
// one int8 scale per 16 weights.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// The 6-bit scale and min of sub-block j (0-7) of a Q4_K/Q5_K super-block.
static inline void KQuantScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Float scales and mins of group g (sub-blocks 2g and 2g+1, 64 weights) of a Q4_K/Q5_K
// super-block: w = d1 * q - m1 for the group's first 32 weights, d2 * q - m2 for the next 32.
struct KGroupScales {
  float d1, m1, d2, m2;
};
static inline KGroupScales KQuantGroupScales(float d, float dmin, const uint8_t* scales, int g) {
  uint8_t sc1, m1, sc2, m2;
  KQuantScaleMin(2 * g, scales, &sc1, &m1);
  KQuantScaleMin(2 * g + 1, scales, &sc2, &m2);
  return {d * sc1, dmin * m1, d * sc2, dmin * m2};
}

// IQ4_NL / IQ4_XS: 4-bit indices into a fixed non-uniform table of int8 values (llama.cpp's
// kvalues_iq4nl), w = scale * kIQ4Values[index]; the indices of a run of 32 in Q4_0's nibble order.
inline constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The table values of a run of 32 indices (Q4_0's nibble order: element j < 16 in the low nibble
// of qs[j], j + 16 in its high nibble).
static inline void IQ4RunValues(const uint8_t* qs, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    out[j] = kIQ4Values[qs[j] & 0x0f];
    out[j + 16] = kIQ4Values[qs[j] >> 4];
  }
}

// IQ4_NL: a block of 32 with an f16 scale.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockIQ4_NL) == 18);

// IQ4_XS: a super-block of 256 with an f16 scale d and a 6-bit scale per run of 32: run j scales
// by d * (ls_j - 32), ls_j = its low 4 bits (nibble j % 2 of scales_l[j / 2]) | its high 2 bits
// (bits 2j of scales_h) << 4; run j's indices in qs[16 j .. 16 j + 15].
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// The integer factor ls_j - 32 (-32..31) of run j (0-7) of an IQ4_XS super-block; its float scale
// is float(d) * float(ls_j - 32), as llama.cpp computes it (IQ4XSRunScale).
static inline int IQ4XSRunFactor(const BlockIQ4_XS& b, int j) {
  return (((b.scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32;
}
float IQ4XSRunScale(const BlockIQ4_XS& b, int j);

// MXFP4 (OCP microscaling FP4, gpt-oss's expert type): 32 E2M1 floats sharing an E8M0 scale.
// ggml stores each E2M1 value doubled, as the int8 kMXFP4Values, and halves the scale to match:
// w = kMXFP4Values[index] * 2^(e - 128); indices in Q4_0's nibble order.
inline constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
struct BlockMXFP4 {
  uint8_t e;  // E8M0 exponent
  uint8_t qs[16];
};
static_assert(sizeof(BlockMXFP4) == 17);
// 2^(e - 128) exactly (ggml's GGML_E8M0_TO_FP32_HALF, subnormal for e < 2).
inline float E8M0HalfToFp32(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}
// The table values of a run of 32 MXFP4 indices (Q4_0's nibble order).
static inline void MXFP4RunValues(const uint8_t* qs, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    out[j] = kMXFP4Values[qs[j] & 0x0f];
    out[j + 16] = kMXFP4Values[qs[j] >> 4];
  }
}

// F8E4M3: w = E4M3ToFp32(qs[j]) * E8M0ToFp32(e).
struct BlockF8E4M3 {
  uint8_t e;       // UE8M0 scale exponent: 2^(e - 127)
  uint8_t qs[32];  // e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities
};
static_assert(sizeof(BlockF8E4M3) == 33);
// 2^(e - 127) exactly (subnormal 2^-127 for e = 0; e = 255, UE8M0's NaN, reads as infinity).
inline float E8M0ToFp32(uint8_t e) {
  const uint32_t bits = e == 0 ? 0x00400000u : static_cast<uint32_t>(e) << 23;
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}
// An e4m3 value exactly. The NaN codes 0x7f / 0xff read as +-480, what the SIMD kernels' decode
// (the 7 low bits shifted into an f16's exponent and mantissa, times 2^8) gives; no writer here
// produces them.
inline float E4M3ToFp32(uint8_t q) {
  const int exp = (q >> 3) & 15, mant = q & 7;
  // Subnormal: mant * 2^-9; normal: (8 + mant) * 2^(exp - 10). Both exact in f32.
  const float mag = exp == 0 ? static_cast<float>(mant) * 0x1p-9f
                             : static_cast<float>(8 + mant) * E8M0ToFp32(static_cast<uint8_t>(exp + 117));
  return (q & 0x80) != 0 ? -mag : mag;
}
// The nearest e4m3 code to v (ties to the even code), saturating at +-448; NaN gives 0.
uint8_t Fp32ToE4M3(float v);

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;
  int64_t block_size;       // elements per block
  int64_t block_bytes;      // bytes per block
};

// Block layout of any ggml type id (supported by gale or not), so a file with types gale cannot
// compute with still parses and gets a clear error only where such a tensor is used.
struct GgmlBlockLayout {
  int64_t block_size;
  int64_t block_bytes;
};
std::optional<GgmlBlockLayout> BlockLayout(uint32_t type_id);

// Traits of a type id read from a file, or nullopt when gale does not support it.
std::optional<GgmlTypeTraits> GetTypeTraits(uint32_t type_id);
const GgmlTypeTraits& TypeTraits(GgmlType type);  // for supported types only
std::string_view TypeName(uint32_t type_id);      // "q4_K" etc. even when unsupported; "?" else
std::optional<GgmlType> ParseTypeName(std::string_view name);  // "f16", "q8_0", ...

// Bytes of a row of num_elements; num_elements must be a multiple of the block size.
int64_t RowBytes(GgmlType type, int64_t num_elements);

// Reference conversions, bit-exact with llama.cpp's *_ref functions for F16, BF16, Q8_0, Q4_0 and
// MXFP4.
// n is a multiple of the type's block size. Q4_K and Q6_K are written in llama.cpp's layouts with
// round-to-nearest scales (not its search: valid blocks, different bytes); Q5_K is read only
// (CanQuantize says which).
bool CanQuantize(GgmlType type);
void QuantizeRowRef(GgmlType type, const float* src, void* dst, int64_t n);
void DequantizeRowRef(GgmlType type, const void* src, float* dst, int64_t n);
// W4 types with clipping: each group's range is shrunk to clip (0, 1] of its extremes before
// rounding (an AWQ-style search picks clip per group or per matrix). clip 1 is QuantizeRowRef.
void QuantizeW4Row(GgmlType type, const float* src, void* dst, int64_t n, float clip);

}  // namespace gale
