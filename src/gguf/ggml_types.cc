// Type table and reference (de)quantization. The quantizers follow llama.cpp's
// quantize_row_q8_0_ref / quantize_row_q4_0_ref exactly so our files match theirs byte for byte.
#include "gguf/ggml_types.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "base/fp16.h"

namespace gale {
namespace {

constexpr GgmlTypeTraits kTraits[] = {
    {GgmlType::kF32, "f32", 1, 4},
    {GgmlType::kF16, "f16", 1, 2},
    {GgmlType::kQ4_0, "q4_0", kQK4_0, sizeof(BlockQ4_0)},
    {GgmlType::kQ4_1, "q4_1", 32, sizeof(BlockQ4_1)},
    {GgmlType::kQ5_0, "q5_0", 32, sizeof(BlockQ5_0)},
    {GgmlType::kQ5_1, "q5_1", 32, sizeof(BlockQ5_1)},
    {GgmlType::kQ8_0, "q8_0", kQK8_0, sizeof(BlockQ8_0)},
    {GgmlType::kQ2_K, "q2_K", kQK_K, sizeof(BlockQ2_K)},
    {GgmlType::kQ3_K, "q3_K", kQK_K, sizeof(BlockQ3_K)},
    {GgmlType::kQ4_K, "q4_K", kQK_K, sizeof(BlockQ4_K)},
    {GgmlType::kQ5_K, "q5_K", kQK_K, sizeof(BlockQ5_K)},
    {GgmlType::kQ6_K, "q6_K", kQK_K, sizeof(BlockQ6_K)},
    {GgmlType::kIQ4_NL, "iq4_nl", 32, sizeof(BlockIQ4_NL)},
    {GgmlType::kIQ4_XS, "iq4_xs", kQK_K, sizeof(BlockIQ4_XS)},
    {GgmlType::kBF16, "bf16", 1, 2},
    {GgmlType::kMXFP4, "mxfp4", 32, sizeof(BlockMXFP4)},
    {GgmlType::kW4A16G64, "w4a16_g64", 64, sizeof(BlockW4<64, false>)},
    {GgmlType::kW4A16G128, "w4a16_g128", 128, sizeof(BlockW4<128, false>)},
    {GgmlType::kW4A16ZG64, "w4a16z_g64", 64, sizeof(BlockW4<64, true>)},
    {GgmlType::kW4A16ZG128, "w4a16z_g128", 128, sizeof(BlockW4<128, true>)},
    {GgmlType::kW4A8G64, "w4a8_g64", 64, sizeof(BlockW4<64, false>)},
    {GgmlType::kW4A8G128, "w4a8_g128", 128, sizeof(BlockW4<128, false>)},
    {GgmlType::kF8E4M3, "f8_e4m3", 32, sizeof(BlockF8E4M3)},
};

// Names of all ggml type ids, for error messages about types gale does not support yet.
constexpr std::string_view kAllNames[] = {
    "f32",  "f16",  "q4_0", "q4_1", "q4_2", "q4_3", "q5_0", "q5_1",    "q8_0",    "q8_1",
    "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s",
    "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m", "bf16",
    "q4_0_4_4", "q4_0_4_8", "q4_0_8_8", "tq1_0", "tq2_0", "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4"};

// Indexed by ggml type id; {0, 0} marks ids that were removed from ggml.
constexpr GgmlBlockLayout kLayouts[] = {
    {1, 4},     {1, 2},     {32, 18},   {32, 20},  {0, 0},    {0, 0},   {32, 22},  {32, 24},
    {32, 34},   {32, 36},   {256, 84},  {256, 110}, {256, 144}, {256, 176}, {256, 210}, {256, 292},
    {256, 66},  {256, 74},  {256, 98},  {256, 50}, {32, 18},  {256, 110}, {256, 82}, {256, 136},
    {1, 1},     {1, 2},     {1, 4},     {1, 8},    {1, 8},    {256, 56}, {1, 2},    {0, 0},
    {0, 0},     {0, 0},     {256, 54},  {256, 66}, {0, 0},    {0, 0},   {0, 0},    {32, 17}};

void QuantizeQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(x[b * kQK8_0 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK8_0; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::roundf(x[b * kQK8_0 + j] * id));
    }
  }
}

// llama.cpp's quantize_row_q4_1_ref / q5_0 / q5_1, which round half up by truncating x + 0.5.
// Q4_1 / Q5_1's block: d = (max - min) / levels, m = min, q = trunc((x - min) / d + 0.5), which
// lands on levels exactly or just below for the largest x (llama.cpp caps Q4_1's at 15 anyway
// and leaves Q5_1's as it is).
void ZeroPointBlock(const float* xb, int levels, int (&q)[32], uint16_t* d16, uint16_t* m16) {
  float lo = std::numeric_limits<float>::max(), hi = -std::numeric_limits<float>::max();
  for (int j = 0; j < 32; ++j) {
    if (xb[j] < lo) lo = xb[j];
    if (xb[j] > hi) hi = xb[j];
  }
  const float d = (hi - lo) / static_cast<float>(levels);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  *d16 = Fp32ToFp16(d);
  *m16 = Fp32ToFp16(lo);
  for (int j = 0; j < 32; ++j) q[j] = static_cast<int>((xb[j] - lo) * id + 0.5f);
}

void QuantizeQ4_1(const float* x, BlockQ4_1* y, int64_t n) {
  int q[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    ZeroPointBlock(x + b * 32, 15, q, &y[b].d, &y[b].m);
    for (int j = 0; j < 16; ++j) y[b].qs[j] = static_cast<uint8_t>(std::min(15, q[j]) | (std::min(15, q[j + 16]) << 4));
  }
}

// Stores 32 values 0..31 as Q5's nibbles and fifth bits.
void PackQ5(const int (&q)[32], uint8_t* qh, uint8_t* qs) {
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    h |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  for (int i = 0; i < 4; ++i) qh[i] = static_cast<uint8_t>(h >> (8 * i));
}

// The first of x[0, n) with the largest magnitude, its sign kept (0 for all zeros): the symmetric
// types map it to their most negative level, so its sign gets the extra level.
float SignedMax(const float* x, int64_t n) {
  float amax = 0.0f, max = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void QuantizeQ5_0(const float* x, BlockQ5_0* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    const float d = SignedMax(xb, 32) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(xb[j] * id + 16.5f)));
    PackQ5(q, y[b].qh, y[b].qs);
  }
}

void QuantizeQ5_1(const float* x, BlockQ5_1* y, int64_t n) {
  int q[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    ZeroPointBlock(x + b * 32, 31, q, &y[b].d, &y[b].m);
    PackQ5(q, y[b].qh, y[b].qs);
  }
}

void QuantizeQ4_0(const float* x, BlockQ4_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    const float* xb = x + b * kQK4_0;
    const float d = SignedMax(xb, kQK4_0) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[j + kQK4_0 / 2] * id;
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Nibbles of one group in runs of 32 (Q4_0's order within each).
template <int G, typename Q>
void W4Pack(const float* xb, const Q& q, uint8_t* qs) {
  for (int s = 0; s < G / 32; ++s) {
    for (int j = 0; j < 16; ++j) qs[s * 16 + j] = static_cast<uint8_t>(q(xb[s * 32 + j]) | (q(xb[s * 32 + j + 16]) << 4));
  }
}

template <int G, bool kZ>
void QuantizeW4(const float* x, BlockW4<G, kZ>* y, int64_t n, float clip) {
  for (int64_t b = 0; b < n / G; ++b) {
    const float* xb = x + b * G;
    if constexpr (kZ) {
      float lo = xb[0], hi = xb[0];
      for (int j = 1; j < G; ++j) {
        lo = std::fmin(lo, xb[j]);
        hi = std::fmax(hi, xb[j]);
      }
      lo *= clip;
      hi *= clip;
      const uint16_t d16 = Fp32ToFp16((hi - lo) / 15.0f), m16 = Fp32ToFp16(lo);
      y[b].d = d16;
      y[b].m = m16;
      // Round against the stored (f16) scale and offset, so what is dequantized is what was meant.
      const float d = Fp16ToFp32(d16), m = Fp16ToFp32(m16);
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      auto q = [&](float v) { return std::clamp(static_cast<int>(std::nearbyint((v - m) * id)), 0, 15); };
      W4Pack<G>(xb, q, y[b].qs);
    } else {
      // As Q4_0: the value of largest magnitude maps to -8, so its sign gets the extra level.
      const uint16_t d16 = Fp32ToFp16(SignedMax(xb, G) * clip / -8.0f);
      y[b].d = d16;
      const float d = Fp16ToFp32(d16);
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      auto q = [&](float v) { return std::clamp(static_cast<int>(std::nearbyint(v * id)) + 8, 0, 15); };
      W4Pack<G>(xb, q, y[b].qs);
    }
  }
}

template <int G, bool kZ>
void DequantizeW4(const BlockW4<G, kZ>* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / G; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    float m = -8.0f * d;
    if constexpr (kZ) m = Fp16ToFp32(b[i].m);
    for (int s = 0; s < G / 32; ++s) {
      for (int j = 0; j < 16; ++j) {
        y[i * G + s * 32 + j] = d * static_cast<float>(b[i].qs[s * 16 + j] & 0x0f) + m;
        y[i * G + s * 32 + j + 16] = d * static_cast<float>(b[i].qs[s * 16 + j] >> 4) + m;
      }
    }
  }
}

// ---- IQ4_NL / IQ4_XS: llama.cpp's search (its quantize_row_iq4_nl_ref / _xs_ref without an
// importance matrix; the same float steps, so the same bytes) ----

// The table index nearest v; between two entries the upper one unless v is strictly closer to
// the lower.
int IQ4NearestIndex(float v) {
  if (v <= kIQ4Values[0]) return 0;
  if (v >= kIQ4Values[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (v < kIQ4Values[mid] ? hi : lo) = mid;
  }
  return v - kIQ4Values[hi - 1] < kIQ4Values[hi] - v ? hi - 1 : hi;
}

// The weighted least-squares fit of a run's 32 values to the table entries that inverse scale
// inv_scale picks: sum w q x and sum w q^2, weights x^2.
void IQ4Fit(const float* x, float inv_scale, float* sum_qx, float* sum_q2) {
  float qx = 0.0f, q2 = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float w = x[j] * x[j];
    const float q = kIQ4Values[IQ4NearestIndex(inv_scale * x[j])];
    qx += w * q * x[j];
    q2 += w * q * q;
  }
  *sum_qx = qx;
  *sum_q2 = q2;
}

// A run's scale: start from the extreme at the table's end (-127), fit, then try the 15
// reciprocal scales (t - 127) / max, t = -7..7, keeping the fit with the least weighted error.
// 0 for a run whose largest magnitude is below 1e-15.
float IQ4RunScale(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax < 1e-15f) return 0.0f;
  constexpr int kTries = 7;
  float qx, q2;
  IQ4Fit(x, 1.0f / (-max / static_cast<float>(kIQ4Values[0])), &qx, &q2);
  float d = qx / q2, best = d * qx;
  for (int t = -kTries; t <= kTries; ++t) {
    IQ4Fit(x, static_cast<float>(t + kIQ4Values[0]) / max, &qx, &q2);
    if (q2 > 0.0f && qx * qx > best * q2) {
      d = qx / q2;
      best = d * qx;
    }
  }
  return d;
}

// 32 values' indices under inverse scale id, in Q4_0's nibble order.
void IQ4PackRun(const float* x, float id, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>(IQ4NearestIndex(id * x[j]) | IQ4NearestIndex(id * x[j + 16]) << 4);
  }
}

void QuantizeIQ4_NL(const float* x, BlockIQ4_NL* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = IQ4RunScale(x + 32 * b);
    y[b].d = Fp32ToFp16(d);
    IQ4PackRun(x + 32 * b, d != 0.0f ? 1.0f / d : 0.0f, y[b].qs);
  }
}

// Each run's scale as above, then the super-block's d = -(the scale of largest magnitude) / 32,
// each run's scale rounded to an integer multiple of d in [-32, 31] and its indices chosen again
// under that scale.
void QuantizeIQ4_XS(const float* x, BlockIQ4_XS* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* xs = x + i * kQK_K;
    float scales[8], max_scale = 0.0f, amax_scale = 0.0f;
    for (int r = 0; r < 8; ++r) {
      scales[r] = IQ4RunScale(xs + 32 * r);
      if (std::fabs(scales[r]) > amax_scale) {
        amax_scale = std::fabs(scales[r]);
        max_scale = scales[r];
      }
    }
    const float d = -max_scale / 32.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockIQ4_XS& blk = y[i];
    blk.d = Fp32ToFp16(d);
    blk.scales_h = 0;
    std::memset(blk.scales_l, 0, sizeof(blk.scales_l));
    for (int r = 0; r < 8; ++r) {
      const int l = std::clamp(static_cast<int>(std::nearbyint(id * scales[r])), -32, 31);
      const float dl = d * static_cast<float>(l);
      IQ4PackRun(xs + 32 * r, dl != 0.0f ? 1.0f / dl : 0.0f, blk.qs + 16 * r);
      const int ls = l + 32;
      blk.scales_l[r / 2] |= static_cast<uint8_t>((ls & 0x0f) << (4 * (r % 2)));
      blk.scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * r));
    }
  }
}

// llama.cpp's quantize_row_mxfp4_ref: e from the block's largest magnitude (floor(log2 amax) - 2,
// so amax lands in the top binade of E2M1's range), then each value's nearest table entry, the
// first on ties.
void QuantizeMXFP4(const float* x, BlockMXFP4* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const uint8_t e = amax > 0.0f ? static_cast<uint8_t>(std::floor(std::log2(amax)) - 2 + 127) : 0;
    const float d = E8M0HalfToFp32(e);
    auto nearest = [d](float v) {
      int best = 0;
      float best_err = std::fabs(kMXFP4Values[0] * d - v);
      for (int i = 1; i < 16; ++i) {
        const float err = std::fabs(kMXFP4Values[i] * d - v);
        if (err < best_err) {
          best = i;
          best_err = err;
        }
      }
      return best;
    };
    y[b].e = e;
    for (int j = 0; j < 16; ++j) y[b].qs[j] = static_cast<uint8_t>(nearest(xb[j]) | nearest(xb[j + 16]) << 4);
  }
}

// K-quant writers: llama.cpp's block layouts (read back by the bit-exact dequantizers below), with
// plain round-to-nearest scales rather than llama.cpp's iterative scale search, so the bytes differ
// from llama-quantize's and the error is somewhat larger.
//
// Q4_K: per sub-block of 32, the range [min(0, lo), hi] in 15 steps; the sub-block scales and
// (negated) mins as 6-bit multiples of the super-block's d and dmin.
void QuantizeQ4_K(const float* x, BlockQ4_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float scale[8], mins[8];
    for (int j = 0; j < 8; ++j) {
      float lo = 0.0f, hi = x[32 * j];
      for (int l = 0; l < 32; ++l) {
        lo = std::min(lo, x[32 * j + l]);
        hi = std::max(hi, x[32 * j + l]);
      }
      scale[j] = std::max(0.0f, hi - lo) / 15.0f;
      mins[j] = -lo;
    }
    const float max_scale = *std::max_element(scale, scale + 8), max_min = *std::max_element(mins, mins + 8);
    y[i].d = Fp32ToFp16(max_scale / 63.0f);
    y[i].dmin = Fp32ToFp16(max_min / 63.0f);
    const float d = Fp16ToFp32(y[i].d), dmin = Fp16ToFp32(y[i].dmin);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = d > 0.0f ? static_cast<uint8_t>(std::clamp(static_cast<int>(std::nearbyint(scale[j] / d)), 0, 63)) : 0;
      m[j] = dmin > 0.0f ? static_cast<uint8_t>(std::clamp(static_cast<int>(std::nearbyint(mins[j] / dmin)), 0, 63)) : 0;
    }
    for (int j = 0; j < 4; ++j) {
      y[i].scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      y[i].scales[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
      y[i].scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
    // Elements against the stored scales: w = (d sc) q - (dmin m).
    uint8_t q[kQK_K];
    for (int j = 0; j < 8; ++j) {
      const float step = d * sc[j], off = dmin * m[j];
      for (int l = 0; l < 32; ++l) {
        q[32 * j + l] = step > 0.0f
            ? static_cast<uint8_t>(std::clamp(static_cast<int>(std::nearbyint((x[32 * j + l] + off) / step)), 0, 15))
            : 0;
      }
    }
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) y[i].qs[32 * g + l] = static_cast<uint8_t>(q[64 * g + l] | (q[64 * g + 32 + l] << 4));
    }
  }
}

// Q6_K: per sub-block of 16, the value of largest magnitude maps to -32; the sub-block scales as
// int8 multiples of the super-block's d.
void QuantizeQ6_K(const float* x, BlockQ6_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float scale[16];
    float max_abs_scale = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float amax = 0.0f, max = 0.0f;
      for (int l = 0; l < 16; ++l) {
        if (std::fabs(x[16 * j + l]) > amax) {
          amax = std::fabs(x[16 * j + l]);
          max = x[16 * j + l];
        }
      }
      scale[j] = max / -32.0f;
      max_abs_scale = std::max(max_abs_scale, std::fabs(scale[j]));
    }
    y[i].d = Fp32ToFp16(max_abs_scale / 127.0f);
    const float d = Fp16ToFp32(y[i].d);
    uint8_t q[kQK_K];
    for (int j = 0; j < 16; ++j) {
      const int s = d > 0.0f ? std::clamp(static_cast<int>(std::nearbyint(scale[j] / d)), -128, 127) : 0;
      y[i].scales[j] = static_cast<int8_t>(s);
      const float step = d * static_cast<float>(s);
      for (int l = 0; l < 16; ++l) {
        q[16 * j + l] = step != 0.0f
            ? static_cast<uint8_t>(std::clamp(static_cast<int>(std::nearbyint(x[16 * j + l] / step)) + 32, 0, 63))
            : 32;
      }
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = y[i].ql + 64 * h;
      uint8_t* qh = y[i].qh + 32 * h;
      const uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((qq[l] & 0x0f) | ((qq[l + 64] & 0x0f) << 4));
        ql[l + 32] = static_cast<uint8_t>((qq[l + 32] & 0x0f) | ((qq[l + 96] & 0x0f) << 4));
        qh[l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                     ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

void DequantizeQ4_K(const BlockQ4_K* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    const float dmin = Fp16ToFp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int g = 0; g < 4; ++g) {
      const auto [d1, m1, d2, m2] = KQuantGroupScales(d, dmin, b[i].scales, g);
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void DequantizeQ5_K(const BlockQ5_K* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    const float dmin = Fp16ToFp32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int g = 0; g < 4; ++g) {
      const auto [d1, m1, d2, m2] = KQuantGroupScales(d, dmin, b[i].scales, g);
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void DequantizeQ6_K(const BlockQ6_K* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// Per block: the smallest power-of-two scale 2^s with max|x| / 2^s <= 448 (e4m3's largest value),
// as DeepSeek's FP8 weights are scaled (UE8M0), then each value rounded to the nearest e4m3.
void QuantizeF8E4M3(const float* x, BlockF8E4M3* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    int s = -127;
    if (amax > 0.0f && std::isfinite(amax)) {
      int ex = 0;
      const float m = std::frexp(amax / 448.0f, &ex);  // amax / 448 = m 2^ex, m in [0.5, 1)
      s = m == 0.5f ? ex - 1 : ex;
      s = std::clamp(s, -127, 127);
    }
    y[b].e = static_cast<uint8_t>(s + 127);
    const float inv = 1.0f / E8M0ToFp32(y[b].e);  // 2^-s, exact
    for (int j = 0; j < 32; ++j) y[b].qs[j] = Fp32ToE4M3(xb[j] * inv);
  }
}

}  // namespace

float IQ4XSRunScale(const BlockIQ4_XS& b, int j) {
  return Fp16ToFp32(b.d) * static_cast<float>(IQ4XSRunFactor(b, j));
}

uint8_t Fp32ToE4M3(float v) {
  if (std::isnan(v)) return 0;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const float a = std::fabs(v);
  uint8_t code;
  if (a < 0x1p-6f) {  // subnormal range: steps of 2^-9; 8 steps is the smallest normal, code 0x08
    code = static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  } else if (a >= 448.0f) {
    code = 0x7e;
  } else {
    int ex = 0;
    std::frexp(a, &ex);  // a = m 2^ex, m in [0.5, 1): the binade 2^(ex - 1), steps of 2^(ex - 4)
    int q = static_cast<int>(std::nearbyint(std::ldexp(a, 4 - ex)));  // 8..16
    int e = ex - 1;
    if (q == 16) {
      q = 8;
      ++e;
    }
    code = static_cast<uint8_t>(std::min((e + 7) << 3 | (q - 8), 0x7e));
  }
  return static_cast<uint8_t>(sign | code);
}

bool CanQuantize(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 || type == GgmlType::kQ8_0 ||
         type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1 ||
         type == GgmlType::kQ4_K || type == GgmlType::kQ6_K || type == GgmlType::kIQ4_NL ||
         type == GgmlType::kIQ4_XS || type == GgmlType::kMXFP4 || type == GgmlType::kF8E4M3 ||
         W4FormatOf(type).group > 0;
}

uint32_t LlamaFileType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 0;
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    case GgmlType::kQ4_1: return 3;
    case GgmlType::kQ8_0: return 7;
    case GgmlType::kQ5_0: return 8;
    case GgmlType::kQ5_1: return 9;
    case GgmlType::kQ2_K: return 10;
    case GgmlType::kQ3_K: return 11;  // Q3_K_S
    case GgmlType::kQ4_K: return 14;  // Q4_K_S
    case GgmlType::kQ5_K: return 16;  // Q5_K_S
    case GgmlType::kQ6_K: return 18;
    case GgmlType::kIQ4_NL: return 25;
    case GgmlType::kIQ4_XS: return 30;
    case GgmlType::kBF16: return 32;
    case GgmlType::kMXFP4: return 38;  // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    default: return 1024;
  }
}

W4Format W4FormatOf(GgmlType type) {
  switch (type) {
    case GgmlType::kW4A16G64:
    case GgmlType::kW4A8G64: return {64, false};
    case GgmlType::kW4A16G128:
    case GgmlType::kW4A8G128: return {128, false};
    case GgmlType::kW4A16ZG64: return {64, true};
    case GgmlType::kW4A16ZG128: return {128, true};
    default: return {};
  }
}

void QuantizeW4Row(GgmlType type, const float* src, void* dst, int64_t n, float clip) {
  const W4Format f = W4FormatOf(type);
  CHECK(f.group > 0 && n % f.group == 0 && clip > 0.0f && clip <= 1.0f);
  if (f.group == 64 && !f.zero_point) return QuantizeW4(src, static_cast<BlockW4<64, false>*>(dst), n, clip);
  if (f.group == 128 && !f.zero_point) return QuantizeW4(src, static_cast<BlockW4<128, false>*>(dst), n, clip);
  if (f.group == 64) return QuantizeW4(src, static_cast<BlockW4<64, true>*>(dst), n, clip);
  return QuantizeW4(src, static_cast<BlockW4<128, true>*>(dst), n, clip);
}

std::optional<GgmlBlockLayout> BlockLayout(uint32_t type_id) {
  if (const auto t = GetTypeTraits(type_id)) return GgmlBlockLayout{t->block_size, t->block_bytes};
  if (type_id >= std::size(kLayouts) || kLayouts[type_id].block_size == 0) return std::nullopt;
  return kLayouts[type_id];
}

std::optional<GgmlTypeTraits> GetTypeTraits(uint32_t type_id) {
  for (const auto& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == type_id) return t;
  }
  return std::nullopt;
}

const GgmlTypeTraits& TypeTraits(GgmlType type) {
  for (const auto& t : kTraits) {
    if (t.type == type) return t;
  }
  CHECK(false && "unsupported GgmlType");
  return kTraits[0];
}

std::string_view TypeName(uint32_t type_id) {
  if (type_id < std::size(kAllNames)) return kAllNames[type_id];
  if (const auto t = GetTypeTraits(type_id)) return t->name;
  return "?";
}

std::optional<GgmlType> ParseTypeName(std::string_view name) {
  for (const auto& t : kTraits) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

int64_t RowBytes(GgmlType type, int64_t num_elements) {
  const auto& t = TypeTraits(type);
  return num_elements / t.block_size * t.block_bytes;
}

void QuantizeRowRef(GgmlType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToFp16(src[i]);
      return;
    }
    case GgmlType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(src[i]);
      return;
    }
    case GgmlType::kQ8_0:
      CHECK(n % kQK8_0 == 0);
      QuantizeQ8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    case GgmlType::kQ4_0:
      CHECK(n % kQK4_0 == 0);
      QuantizeQ4_0(src, static_cast<BlockQ4_0*>(dst), n);
      return;
    case GgmlType::kQ4_1:
      CHECK(n % 32 == 0);
      QuantizeQ4_1(src, static_cast<BlockQ4_1*>(dst), n);
      return;
    case GgmlType::kQ5_0:
      CHECK(n % 32 == 0);
      QuantizeQ5_0(src, static_cast<BlockQ5_0*>(dst), n);
      return;
    case GgmlType::kQ5_1:
      CHECK(n % 32 == 0);
      QuantizeQ5_1(src, static_cast<BlockQ5_1*>(dst), n);
      return;
    case GgmlType::kQ4_K:
      CHECK(n % kQK_K == 0);
      QuantizeQ4_K(src, static_cast<BlockQ4_K*>(dst), n);
      return;
    case GgmlType::kQ6_K:
      CHECK(n % kQK_K == 0);
      QuantizeQ6_K(src, static_cast<BlockQ6_K*>(dst), n);
      return;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ5_K:
      break;
    case GgmlType::kIQ4_NL:
      CHECK(n % 32 == 0);
      QuantizeIQ4_NL(src, static_cast<BlockIQ4_NL*>(dst), n);
      return;
    case GgmlType::kIQ4_XS:
      CHECK(n % kQK_K == 0);
      QuantizeIQ4_XS(src, static_cast<BlockIQ4_XS*>(dst), n);
      return;
    case GgmlType::kMXFP4:
      CHECK(n % 32 == 0);
      QuantizeMXFP4(src, static_cast<BlockMXFP4*>(dst), n);
      return;
    case GgmlType::kF8E4M3:
      CHECK(n % 32 == 0);
      QuantizeF8E4M3(src, static_cast<BlockF8E4M3*>(dst), n);
      return;
    case GgmlType::kW4A16G64:
    case GgmlType::kW4A16G128:
    case GgmlType::kW4A16ZG64:
    case GgmlType::kW4A16ZG128:
    case GgmlType::kW4A8G64:
    case GgmlType::kW4A8G128:
      QuantizeW4Row(type, src, dst, n, 1.0f);
      return;
  }
  CHECK(false && "QuantizeRowRef: unsupported type");
}

namespace {

// Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 (ggml's first block types).
void DequantizeLegacy(GgmlType type, const void* src, float* dst, int64_t n) {
  if (type == GgmlType::kQ8_0) {
    const auto* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / kQK8_0; ++i) {
      const float d = Fp16ToFp32(b[i].d);
      for (int j = 0; j < kQK8_0; ++j) dst[i * kQK8_0 + j] = d * b[i].qs[j];
    }
    return;
  }
  if (type == GgmlType::kQ4_0) {
    const auto* b = static_cast<const BlockQ4_0*>(src);
    for (int64_t i = 0; i < n / kQK4_0; ++i) {
      const float d = Fp16ToFp32(b[i].d);
      for (int j = 0; j < kQK4_0 / 2; ++j) {
        dst[i * kQK4_0 + j] = d * ((b[i].qs[j] & 0x0f) - 8);
        dst[i * kQK4_0 + j + kQK4_0 / 2] = d * ((b[i].qs[j] >> 4) - 8);
      }
    }
    return;
  }
  if (type == GgmlType::kQ4_1) {
    const auto* b = static_cast<const BlockQ4_1*>(src);
    for (int64_t i = 0; i < n / 32; ++i) {
      const float d = Fp16ToFp32(b[i].d), m = Fp16ToFp32(b[i].m);
      for (int j = 0; j < 16; ++j) {
        dst[i * 32 + j] = d * static_cast<float>(b[i].qs[j] & 0x0f) + m;
        dst[i * 32 + j + 16] = d * static_cast<float>(b[i].qs[j] >> 4) + m;
      }
    }
    return;
  }
  if (type == GgmlType::kQ5_0) {
    const auto* b = static_cast<const BlockQ5_0*>(src);
    uint8_t q[32];
    for (int64_t i = 0; i < n / 32; ++i) {
      const float d = Fp16ToFp32(b[i].d);
      UnpackQ5(b[i].qh, b[i].qs, q);
      for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(q[j] - 16);
    }
    return;
  }
  if (type == GgmlType::kQ5_1) {
    const auto* b = static_cast<const BlockQ5_1*>(src);
    uint8_t q[32];
    for (int64_t i = 0; i < n / 32; ++i) {
      const float d = Fp16ToFp32(b[i].d), m = Fp16ToFp32(b[i].m);
      UnpackQ5(b[i].qh, b[i].qs, q);
      for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(q[j]) + m;
    }
    return;
  }
}

// Q2_K and Q3_K.
void DequantizeLowK(GgmlType type, const void* src, float* dst, int64_t n) {
  if (type == GgmlType::kQ2_K) {
    const auto* b = static_cast<const BlockQ2_K*>(src);
    for (int64_t i = 0; i < n / kQK_K; ++i) {
      const float d = Fp16ToFp32(b[i].d), dmin = Fp16ToFp32(b[i].dmin);
      for (int e = 0; e < 256; ++e) {
        const uint8_t sc = b[i].scales[e / 16];
        dst[i * 256 + e] = (d * static_cast<float>(sc & 15)) * static_cast<float>(KLow2(b[i].qs, e)) -
                           dmin * static_cast<float>(sc >> 4);
      }
    }
    return;
  }
  if (type == GgmlType::kQ3_K) {
    const auto* b = static_cast<const BlockQ3_K*>(src);
    int8_t sc[16];
    uint8_t q[256];
    for (int64_t i = 0; i < n / kQK_K; ++i) {
      const float d = Fp16ToFp32(b[i].d);
      Q3KScales(b[i].scales, sc);
      Q3KValues(b[i], q);
      for (int e = 0; e < 256; ++e) dst[i * 256 + e] = (d * static_cast<float>(sc[e / 16])) * static_cast<float>(q[e] - 4);
    }
    return;
  }
}

// IQ4_NL / IQ4_XS (a non-linear grid), MXFP4 and f8_e4m3 (values under a power-of-two scale).
void DequantizeTables(GgmlType type, const void* src, float* dst, int64_t n) {
  if (type == GgmlType::kIQ4_NL || type == GgmlType::kIQ4_XS) {
    int8_t v[32];
    for (int64_t r = 0; r < n / 32; ++r) {  // run r: block r of IQ4_NL, run r % 8 of IQ4_XS's r / 8
      float d;
      if (type == GgmlType::kIQ4_NL) {
        const auto& b = static_cast<const BlockIQ4_NL*>(src)[r];
        IQ4RunValues(b.qs, v);
        d = Fp16ToFp32(b.d);
      } else {
        const auto& b = static_cast<const BlockIQ4_XS*>(src)[r / 8];
        IQ4RunValues(b.qs + 16 * (r % 8), v);
        d = IQ4XSRunScale(b, static_cast<int>(r % 8));
      }
      for (int j = 0; j < 32; ++j) dst[r * 32 + j] = d * static_cast<float>(v[j]);
    }
    return;
  }
  if (type == GgmlType::kMXFP4) {
    int8_t v[32];
    for (int64_t r = 0; r < n / 32; ++r) {
      const auto& b = static_cast<const BlockMXFP4*>(src)[r];
      MXFP4RunValues(b.qs, v);
      const float d = E8M0HalfToFp32(b.e);
      for (int j = 0; j < 32; ++j) dst[r * 32 + j] = static_cast<float>(v[j]) * d;
    }
    return;
  }
  if (type == GgmlType::kF8E4M3) {
    for (int64_t r = 0; r < n / 32; ++r) {
      const auto& b = static_cast<const BlockF8E4M3*>(src)[r];
      const float d = E8M0ToFp32(b.e);
      for (int j = 0; j < 32; ++j) dst[r * 32 + j] = E4M3ToFp32(b.qs[j]) * d;
    }
    return;
  }
}

}  // namespace

void DequantizeRowRef(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
      return;
    }
    case GgmlType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
      return;
    }
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
      return DequantizeLegacy(type, src, dst, n);
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
      return DequantizeLowK(type, src, dst, n);
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS:
    case GgmlType::kMXFP4:
    case GgmlType::kF8E4M3:
      return DequantizeTables(type, src, dst, n);
    case GgmlType::kQ4_K:
      DequantizeQ4_K(static_cast<const BlockQ4_K*>(src), dst, n);
      return;
    case GgmlType::kQ5_K:
      DequantizeQ5_K(static_cast<const BlockQ5_K*>(src), dst, n);
      return;
    case GgmlType::kQ6_K:
      DequantizeQ6_K(static_cast<const BlockQ6_K*>(src), dst, n);
      return;
    case GgmlType::kW4A16G64:
    case GgmlType::kW4A8G64:
      DequantizeW4(static_cast<const BlockW4<64, false>*>(src), dst, n);
      return;
    case GgmlType::kW4A16G128:
    case GgmlType::kW4A8G128:
      DequantizeW4(static_cast<const BlockW4<128, false>*>(src), dst, n);
      return;
    case GgmlType::kW4A16ZG64:
      DequantizeW4(static_cast<const BlockW4<64, true>*>(src), dst, n);
      return;
    case GgmlType::kW4A16ZG128:
      DequantizeW4(static_cast<const BlockW4<128, true>*>(src), dst, n);
      return;
  }
  CHECK(false && "DequantizeRowRef: unsupported type");
}

}  // namespace gale
