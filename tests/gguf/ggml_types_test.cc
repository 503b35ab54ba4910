#include "gguf/ggml_types.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/cpu.h"
#include "base/fp16.h"
#include "base/rng.h"

namespace gale {
namespace {

TEST(Fp16Test, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(Fp32ToFp16(f), h) << "half 0x" << std::hex << h;
  }
}

__attribute__((target("f16c"))) uint16_t HardwareFp16(float f) { return _cvtss_sh(f, 0); }
__attribute__((target("f16c"))) float HardwareFp32(uint16_t h) { return _cvtsh_ss(h); }

TEST(Fp16Test, MatchesF16cOnRandomFloats) {
  if (!GetCpuFeatures().f16c) GTEST_SKIP() << "no F16C on this CPU";
  Rng rng(7);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns cover subnormals, overflow, ties and NaN.
    const float f = F32FromBits(static_cast<uint32_t>(rng.NextU64()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(Fp32ToFp16(f), HardwareFp16(f)) << f;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = Fp16ToFp32(static_cast<uint16_t>(h));
    const float b = HardwareFp32(static_cast<uint16_t>(h));
    if (std::isnan(a)) {
      ASSERT_TRUE(std::isnan(b));
      continue;
    }
    ASSERT_EQ(F32Bits(a), F32Bits(b));
  }
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Fp32ToBf16(F32FromBits(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(Fp32ToBf16(F32FromBits(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(Fp32ToBf16(F32FromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(Bf16ToFp32(0xc000), -2.0f);
}

TEST(GgmlTypesTest, LayoutsMatchLlamaCpp) {
  EXPECT_EQ(RowBytes(GgmlType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_0, 64), 36);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_1, 64), 40);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_0, 64), 44);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_1, 64), 48);
  EXPECT_EQ(TypeName(6), "q5_0");
  EXPECT_EQ(TypeTraits(GgmlType::kQ3_K).block_bytes, 110);
  EXPECT_EQ(TypeName(11), "q3_K");
  EXPECT_EQ(RowBytes(GgmlType::kF16, 10), 20);
  EXPECT_EQ(BlockLayout(12)->block_bytes, 144);  // q4_K
  EXPECT_EQ(BlockLayout(13)->block_bytes, 176);  // q5_K
  EXPECT_EQ(BlockLayout(14)->block_bytes, 210);  // q6_K
  EXPECT_EQ(BlockLayout(10)->block_bytes, 84);   // q2_K
  EXPECT_EQ(BlockLayout(20)->block_bytes, 18);   // iq4_nl
  EXPECT_EQ(BlockLayout(23)->block_bytes, 136);  // iq4_xs
  EXPECT_EQ(BlockLayout(16)->block_bytes, 66);   // iq2_xxs, readable though not computable yet
  EXPECT_FALSE(BlockLayout(4).has_value());      // removed q4_2
  EXPECT_TRUE(GetTypeTraits(12).has_value());
  EXPECT_TRUE(GetTypeTraits(10).has_value());
  EXPECT_TRUE(GetTypeTraits(20).has_value());
  EXPECT_TRUE(GetTypeTraits(23).has_value());
  EXPECT_FALSE(GetTypeTraits(16).has_value());
  EXPECT_EQ(TypeName(14), "q6_K");
}

TEST(GgmlTypesTest, Q8_0KnownBlock) {
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.5f;  // max |x| = 8
  BlockQ8_0 b;
  QuantizeRowRef(GgmlType::kQ8_0, x, &b, 32);
  EXPECT_EQ(b.d, Fp32ToFp16(8.0f / 127.0f));
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[16], 0);
  EXPECT_EQ(b.qs[17], static_cast<int8_t>(std::roundf(0.5f * 127.0f / 8.0f)));
  float y[32];
  DequantizeRowRef(GgmlType::kQ8_0, &b, y, 32);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(y[i], x[i], 8.0f / 127.0f);
}

TEST(GgmlTypesTest, Q4_0KnownBlockAndNibbleOrder) {
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = 0.0f;
  x[0] = -8.0f;  // the largest magnitude, negative: d = -8 / -8 = 1
  x[1] = 7.0f;
  x[16] = 3.0f;  // element 16 is the high nibble of byte 0
  BlockQ4_0 b;
  QuantizeRowRef(GgmlType::kQ4_0, x, &b, 32);
  EXPECT_EQ(Fp16ToFp32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0] & 0x0f, 0);       // -8 + 8
  EXPECT_EQ(b.qs[0] >> 4, 3 + 8);     // element 16
  EXPECT_EQ(b.qs[1] & 0x0f, 15);      // 7 + 8
  float y[32];
  DequantizeRowRef(GgmlType::kQ4_0, &b, y, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

// Q5_0: d = -(the largest magnitude, signed) / 16; q = trunc(x / d + 16.5) capped at 31; element j's
// low 4 bits in byte j % 16 (high nibble from element 16 on) and its fifth bit in bit j of qh.
TEST(GgmlTypesTest, Q5_0KnownBlockAndBitOrder) {
  float x[32] = {};
  x[0] = -16.0f;  // d = 1; q = 0
  x[1] = 15.0f;   // q = 31
  x[16] = 3.0f;   // q = 19 = 0b10011
  x[17] = -5.0f;  // q = 11 = 0b01011
  BlockQ5_0 b;
  QuantizeRowRef(GgmlType::kQ5_0, x, &b, 32);
  EXPECT_EQ(Fp16ToFp32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 0x30);  // element 0 (0) low, element 16 (19 & 15) high
  EXPECT_EQ(b.qs[1], 0xbf);  // element 1 (31 & 15) low, element 17 (11) high
  EXPECT_EQ(b.qs[2], 0x00);  // zeros are q = 16: nibbles 0, fifth bit set
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  EXPECT_EQ(qh, 0xfffdfffeu);  // all set but element 0 (q = 0) and 17 (q = 11)
  float y[32];
  DequantizeRowRef(GgmlType::kQ5_0, &b, y, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

// Q4_1 / Q5_1: d = (max - min) / 15 or 31, m = min, q = trunc((x - min) / d + 0.5).
TEST(GgmlTypesTest, Q4_1AndQ5_1KnownBlocks) {
  float x[32];
  for (float& v : x) v = 0.0f;  // q = 1 in both
  x[0] = -1.0f;
  x[16] = 14.0f;
  BlockQ4_1 b4;
  QuantizeRowRef(GgmlType::kQ4_1, x, &b4, 32);
  EXPECT_EQ(Fp16ToFp32(b4.d), 1.0f);
  EXPECT_EQ(Fp16ToFp32(b4.m), -1.0f);
  EXPECT_EQ(b4.qs[0], 0xf0);  // element 0: 0, element 16: 15
  EXPECT_EQ(b4.qs[1], 0x11);
  float y[32];
  DequantizeRowRef(GgmlType::kQ4_1, &b4, y, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]) << i;

  x[16] = 30.0f;  // q = 31
  x[5] = 15.0f;   // q = 16: nibble 0, fifth bit
  BlockQ5_1 b5;
  QuantizeRowRef(GgmlType::kQ5_1, x, &b5, 32);
  EXPECT_EQ(Fp16ToFp32(b5.d), 1.0f);
  EXPECT_EQ(Fp16ToFp32(b5.m), -1.0f);
  EXPECT_EQ(b5.qs[0], 0xf0);
  EXPECT_EQ(b5.qs[5], 0x10);  // element 5 low nibble 0, element 21 (q = 1) high
  uint32_t qh;
  std::memcpy(&qh, b5.qh, 4);
  EXPECT_EQ(qh, (1u << 5) | (1u << 16));
  DequantizeRowRef(GgmlType::kQ5_1, &b5, y, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]) << i;
}

TEST(GgmlTypesTest, QuantizeDequantizeErrorBounded) {
  Rng rng(3);
  std::vector<float> x(32 * 33);
  for (float& v : x) v = rng.Uniform(-2.0f, 2.0f);
  for (GgmlType t : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                     GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    std::vector<uint8_t> q(RowBytes(t, x.size()));
    std::vector<float> y(x.size());
    QuantizeRowRef(t, x.data(), q.data(), x.size());
    DequantizeRowRef(t, q.data(), y.data(), x.size());
    // Per-block step: f16 ~ 2^-11 relative, bf16 2^-8, q8 amax/127, q4 amax/8, q5 amax/16, q4_1
    // range/15 <= 4/15, q5_1 range/31 (half a step each; the symmetric ones' far side a whole one).
    const float bound = t == GgmlType::kF16    ? 2e-3f
                        : t == GgmlType::kBF16 ? 1.6e-2f
                        : t == GgmlType::kQ8_0 ? 2.0f / 127.0f
                        : t == GgmlType::kQ4_0 ? 2.0f / 8.0f * 1.01f
                        : t == GgmlType::kQ5_0 ? 2.0f / 16.0f * 1.01f
                        : t == GgmlType::kQ4_1 ? 0.5f * 4.0f / 15.0f + 0.01f  // + f16 rounding of d, m
                                               : 0.5f * 4.0f / 31.0f + 0.01f;
    for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(std::fabs(x[i] - y[i]), bound) << TypeTraits(t).name << " " << i;
  }
}

// e4m3 from its definition (OCP FP8 "fn": bias 7, no infinities): every code's value, the
// encoder's nearest-even rounding against a search over all codes, saturation at 448.
TEST(GgmlTypesTest, E4M3CodesAndRounding) {
  EXPECT_EQ(E4M3ToFp32(0x00), 0.0f);
  EXPECT_EQ(E4M3ToFp32(0x01), 0x1p-9f);   // smallest subnormal
  EXPECT_EQ(E4M3ToFp32(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(E4M3ToFp32(0x08), 0x1p-6f);   // smallest normal
  EXPECT_EQ(E4M3ToFp32(0x38), 1.0f);
  EXPECT_EQ(E4M3ToFp32(0x3c), 1.5f);
  EXPECT_EQ(E4M3ToFp32(0x7e), 448.0f);
  EXPECT_EQ(E4M3ToFp32(0xb8), -1.0f);
  EXPECT_EQ(E4M3ToFp32(0x7f), 480.0f);    // the NaN code, as the SIMD decode reads it
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = E4M3ToFp32(static_cast<uint8_t>(c));
    // The f16 route the kernels take: the 7 low bits as an f16's exponent and mantissa, times 2^8.
    const uint16_t h = static_cast<uint16_t>((c & 0x80) << 8 | (c & 0x7f) << 7);
    EXPECT_EQ(Fp16ToFp32(h) * 256.0f, v) << c;
    if (c != 0x80) EXPECT_EQ(Fp32ToE4M3(v), c) << c;
  }
  EXPECT_EQ(Fp32ToE4M3(1000.0f), 0x7e);
  EXPECT_EQ(Fp32ToE4M3(-460.0f), 0xfe);
  EXPECT_EQ(Fp32ToE4M3(1.0625f), 0x38);   // halfway between 1 and 1.125: to the even code
  EXPECT_EQ(Fp32ToE4M3(1.1875f), 0x3a);   // halfway between 1.125 and 1.25: to the even code
  Rng rng(5);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(rng.Uniform(-1.0f, 1.0f), static_cast<int>(rng.NextU64() % 22) - 12);
    int best = 0;
    float err = INFINITY;
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      const float e = std::fabs(E4M3ToFp32(static_cast<uint8_t>(c)) - x);
      if (e < err || (e == err && (c & 1) == 0 && E4M3ToFp32(static_cast<uint8_t>(c)) != 0.0f)) {
        err = e;
        best = c;
      }
    }
    ASSERT_EQ(E4M3ToFp32(Fp32ToE4M3(x)), E4M3ToFp32(static_cast<uint8_t>(best))) << x;
  }
}

// F8E4M3 blocks: the scale is the smallest power of two that puts the block's largest value at
// or under 448, the values the nearest e4m3 of x / scale; a release's bytes read back exactly.
TEST(GgmlTypesTest, F8E4M3BlocksScaleByPowersOfTwo) {
  Rng rng(6);
  std::vector<float> x(32 * 40);
  for (size_t i = 0; i < x.size(); ++i) x[i] = rng.Uniform(-1.0f, 1.0f) * std::ldexp(1.0f, static_cast<int>(i / 32) - 20);
  x[5] = 0.0f;
  std::vector<BlockF8E4M3> q(x.size() / 32);
  std::vector<float> y(x.size());
  QuantizeRowRef(GgmlType::kF8E4M3, x.data(), q.data(), x.size());
  DequantizeRowRef(GgmlType::kF8E4M3, q.data(), y.data(), x.size());
  for (size_t b = 0; b < q.size(); ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[b * 32 + j]));
    const float scale = E8M0ToFp32(q[b].e);
    EXPECT_LE(amax / scale, 448.0f) << b;
    EXPECT_GT(amax / scale, 224.0f) << b;  // and not a power of two larger
    for (int j = 0; j < 32; ++j) {
      const size_t i = b * 32 + j;
      EXPECT_EQ(q[b].qs[j], Fp32ToE4M3(x[i] / scale)) << i;
      // Half an e4m3 step: 2^-4 relative in the normal range, 2^-10 scale below it.
      ASSERT_LE(std::fabs(y[i] - x[i]), std::fmax(std::fabs(x[i]) / 16.0f, scale * 0x1p-10f)) << i;
    }
  }
  // A known block: values 7 and -0.3125.
  float one[32] = {7.0f, -0.3125f};
  BlockF8E4M3 b;
  QuantizeRowRef(GgmlType::kF8E4M3, one, &b, 32);
  EXPECT_EQ(b.e, 127 - 6);  // 7 / 448 = 2^-6: exactly a power of two, so that one
  EXPECT_EQ(b.qs[0], 0x7e);  // 448
  EXPECT_EQ(b.qs[1], 0xda);  // -20 = -(8 + 2) * 2^(11 - 10): sign, exponent field 11, mantissa 2
  EXPECT_EQ(b.qs[2], 0x00);
}

// gale's K-quant writers produce blocks that llama.cpp's layout reads back (through the bit-exact
// dequantizers) with errors in the expected order: Q4_K (asymmetric 32-element sub-blocks, 6-bit
// scales) below Q4_0, Q6_K well below that, Q8_0 below Q6_K. Also the constant and zero cases.
TEST(GgmlTypesTest, KQuantWritersRoundTrip) {
  Rng rng(9);
  std::vector<float> x(256 * 12);
  for (float& v : x) v = rng.Uniform(-1.0f, 1.0f) * rng.Uniform(0.1f, 2.0f) + 0.3f;  // offset, uneven spread
  for (int i = 0; i < 256; ++i) x[256 * 3 + i] = 0.0f;   // an all-zero super-block
  for (int i = 0; i < 256; ++i) x[256 * 5 + i] = -0.7f;  // a constant one
  auto rmse = [&](GgmlType t) {
    std::vector<uint8_t> q(RowBytes(t, x.size()));
    std::vector<float> y(x.size());
    QuantizeRowRef(t, x.data(), q.data(), x.size());
    DequantizeRowRef(t, q.data(), y.data(), x.size());
    double e = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_TRUE(std::isfinite(y[i])) << TypeTraits(t).name;
      e += (x[i] - y[i]) * (x[i] - y[i]);
    }
    for (int i = 0; i < 256; ++i) EXPECT_EQ(y[256 * 3 + i], 0.0f) << TypeTraits(t).name;
    for (int i = 0; i < 256; ++i) EXPECT_NEAR(y[256 * 5 + i], -0.7f, 0.02f) << TypeTraits(t).name;
    return std::sqrt(e / static_cast<double>(x.size()));
  };
  const double q4_0 = rmse(GgmlType::kQ4_0), q4_k = rmse(GgmlType::kQ4_K), q6_k = rmse(GgmlType::kQ6_K),
               q8_0 = rmse(GgmlType::kQ8_0);
  std::printf("RMSE q4_0 %.5f q4_K %.5f q6_K %.5f q8_0 %.5f\n", q4_0, q4_k, q6_k, q8_0);
  EXPECT_LT(q4_k, q4_0);
  EXPECT_LT(q6_k, q4_k / 3.0);
  EXPECT_LT(q8_0, q6_k);
  EXPECT_TRUE(CanQuantize(GgmlType::kQ4_K) && CanQuantize(GgmlType::kQ6_K));
  EXPECT_FALSE(CanQuantize(GgmlType::kQ5_K));
}

}  // namespace
}  // namespace gale
