// Each SIMD table against the scalar reference on fresh random data with odd sizes, per type;
// and batch invariance of the matmul and attention drivers.
#include "kernels/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "../test_util.h"
#include "base/cpu.h"
#include "base/fp16.h"
#include "kernels/isa_tables.h"

namespace gale::kernels {
namespace {

std::vector<Isa> SimdIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (GetKernelTable(isa) != nullptr) out.push_back(isa);
  }
  return out;
}

const GgmlType kTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0};

const GgmlType kKTypes[] = {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

const GgmlType kW4Types[] = {GgmlType::kW4A16G64, GgmlType::kW4A16G128, GgmlType::kW4A16ZG64,
                             GgmlType::kW4A16ZG128, GgmlType::kW4A8G64, GgmlType::kW4A8G128};

// Random K-quant super-blocks: random bits everywhere, with small finite f16 super-scales.
std::vector<uint8_t> RandomKBlocks(GgmlType t, int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> b(RowBytes(t, n));
  for (auto& v : b) v = static_cast<uint8_t>(rng.NextU64());
  const int64_t bytes = TypeTraits(t).block_bytes;
  for (int64_t i = 0; i < n / TypeTraits(t).block_size; ++i) {
    uint8_t* blk = b.data() + i * bytes;
    const uint16_t d = Fp32ToFp16(rng.Uniform(0.001f, 0.01f));
    const uint16_t dmin = Fp32ToFp16(rng.Uniform(0.001f, 0.01f));
    if (t == GgmlType::kQ6_K) {
      std::memcpy(blk + 208, &d, 2);
    } else if (t == GgmlType::kQ3_K) {
      std::memcpy(blk + 108, &d, 2);
    } else if (t == GgmlType::kQ2_K) {
      std::memcpy(blk + 80, &d, 2);
      std::memcpy(blk + 82, &dmin, 2);
    } else if (t == GgmlType::kIQ4_NL || t == GgmlType::kIQ4_XS) {
      std::memcpy(blk, &d, 2);
    } else {
      std::memcpy(blk, &d, 2);
      std::memcpy(blk + 2, &dmin, 2);
    }
  }
  return b;
}

std::vector<uint8_t> Quantized(GgmlType t, const std::vector<float>& x) {
  if (!CanQuantize(t)) return RandomKBlocks(t, static_cast<int64_t>(x.size()), x.size() + static_cast<uint64_t>(t));
  std::vector<uint8_t> q(RowBytes(t, x.size()));
  QuantizeRowRef(t, x.data(), q.data(), x.size());
  return q;
}

// Tests that compare only the SIMD tables with the scalar one would pass having compared nothing
// on a CPU without AVX2: they report a skip instead.
#define SKIP_WITHOUT_SIMD()                                                                   \
  do {                                                                                        \
    if (SimdIsas().empty()) GTEST_SKIP() << "no SIMD kernels on this CPU: nothing to compare"; \
  } while (0)

// GALE_EXPECT_ISA (e.g. "avx2,avx512"; scripts/test.sh derives it from /proc/cpuinfo, CI may set
// it) names the tables this machine must have, so a dispatch bug or a runner without the
// expected CPU fails here instead of silently testing less.
TEST(KernelsTest, ExpectedIsasRan) {
  for (Isa isa : SimdIsas()) std::printf("testing %s against scalar\n", IsaName(isa));
  const char* expect = std::getenv("GALE_EXPECT_ISA");
  if (expect == nullptr || *expect == '\0') GTEST_SKIP() << "GALE_EXPECT_ISA not set: not checking which ISAs ran";
  std::string list = expect;
  for (size_t start = 0; start <= list.size();) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, comma - start);
    start = comma + 1;
    if (name.empty() || name == "scalar") continue;
    bool found = false;
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      if (name != IsaName(isa)) continue;
      found = true;
      EXPECT_NE(GetKernelTable(isa), nullptr) << "GALE_EXPECT_ISA names " << name << " but it has no kernel table here";
    }
    EXPECT_TRUE(found) << "GALE_EXPECT_ISA: unknown ISA '" << name << "'";
  }
}

TEST(KernelsTest, VecDotMatchesScalar) {
  SKIP_WITHOUT_SIMD();
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  for (Isa isa : SimdIsas()) {
    const KernelTable& simd = *GetKernelTable(isa);
    for (GgmlType t : kTypes) {
      const int64_t block = TypeTraits(t).block_size;
      for (int64_t blocks : {1, 3, 7, 33, 129}) {
        // Odd element counts for the unblocked types exercise every tail path.
        const int64_t n = block == 1 ? blocks * 8 + (blocks % 7) : blocks * block;
        const uint64_t seed = n * 31 + static_cast<uint64_t>(t);
        const auto w = test::RandomFloats(n, seed);
        const auto x = test::RandomFloats(n, seed + 1);
        const auto q = Quantized(t, w);
        const float want = ref.vec_dot[SlotOf(t)](q.data(), x.data(), n);
        const float got = simd.vec_dot[SlotOf(t)](q.data(), x.data(), n);
        std::vector<float> deq(n);
        DequantizeRowRef(t, q.data(), deq.data(), n);
        double exact = 0.0, sum_abs = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          exact += static_cast<double>(deq[i]) * x[i];
          sum_abs += std::fabs(static_cast<double>(deq[i]) * x[i]);
        }
        // Rounding in a reordered f32 sum behaves like a random walk: about sqrt(n) * u * sum|w x|
        // (u = 2^-24). Allow 8 of those, so a wrong element or lane (error ~ |w x| ~ 1) fails.
        const float tol = static_cast<float>(8.0 * std::sqrt(static_cast<double>(n)) * 6e-8 * sum_abs + 1e-6);
        ASSERT_NEAR(got, want, tol) << IsaName(isa) << " " << TypeTraits(t).name << " n=" << n;
        // And against a double-precision dot of the dequantized weights.
        ASSERT_NEAR(got, exact, tol) << IsaName(isa) << " " << TypeTraits(t).name;
      }
    }
  }
}

TEST(KernelsTest, DequantizeRowIsBitExact) {
  SKIP_WITHOUT_SIMD();
  std::vector<GgmlType> all(std::begin(kTypes), std::end(kTypes));
  all.insert(all.end(), std::begin(kKTypes), std::end(kKTypes));
  all.insert(all.end(), std::begin(kW4Types), std::end(kW4Types));
  all.insert(all.end(), {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1});
  for (Isa isa : SimdIsas()) {
    const KernelTable& simd = *GetKernelTable(isa);
    for (GgmlType t : all) {
      const int64_t n = TypeTraits(t).block_size == 1 ? 203 : TypeTraits(t).block_size * 9;
      const auto q = Quantized(t, test::RandomFloats(n, 11));
      std::vector<float> want(n), got(n);
      DequantizeRowRef(t, q.data(), want.data(), n);
      simd.dequantize_row[SlotOf(t)](q.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(F32Bits(got[i]), F32Bits(want[i])) << TypeTraits(t).name << " " << i;
    }
  }
}

TEST(KernelsTest, RmsNormSiluAxpyMatchScalar) {
  SKIP_WITHOUT_SIMD();
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  for (Isa isa : SimdIsas()) {
    const KernelTable& simd = *GetKernelTable(isa);
    for (int64_t n : {1, 7, 17, 64, 333}) {
      const auto x = test::RandomFloats(n, n, -3.0f, 3.0f);
      const auto w = test::RandomFloats(n, n + 5);
      std::vector<float> a(n), b(n);
      ref.rms_norm(x.data(), w.data(), n, 1e-5f, a.data());
      simd.rms_norm(x.data(), w.data(), n, 1e-5f, b.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1.0f + std::fabs(a[i]))) << n;

      std::vector<float> g1 = x, g2 = x;
      ref.silu_mul(g1.data(), w.data(), n);
      simd.silu_mul(g2.data(), w.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(g1[i], g2[i], 1e-6f * (1.0f + std::fabs(g1[i])));

      std::vector<float> y1 = w, y2 = w;
      ref.axpy(0.37f, x.data(), y1.data(), n);
      simd.axpy(0.37f, x.data(), y2.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y1[i], y2[i], 1e-6f * (1.0f + std::fabs(y1[i])));
    }
  }
}

// Gated DeltaNet's recurrence on every ISA is the scalar one's within f32 reordering, over several
// tokens (the state carries each one's rounding into the next) and head sizes with tails; n tokens
// at once are bitwise n calls of one token; and one token from a zero state is the rule itself.
TEST(KernelsTest, DeltaRuleMatchesScalar) {
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  std::vector<Isa> isas = SimdIsas();
  isas.push_back(Isa::kScalar);
  for (Isa isa : isas) {
    const KernelTable& simd = *GetKernelTable(isa);
    for (int64_t s : {1, 13, 32, 40, 128}) {
      const int64_t n = 6, stride = 3 * s + 5;
      const auto rows = test::RandomFloats(n * stride, s, -0.3f, 0.3f);
      const auto decay = test::RandomFloats(n, s + 1, 0.5f, 1.0f), beta = test::RandomFloats(n, s + 2, 0.0f, 1.0f);
      DeltaRuleTokens t;
      t.n = n, t.q = rows.data(), t.k = rows.data() + s, t.v = rows.data() + 2 * s, t.stride = stride;
      t.decay = decay.data(), t.beta = beta.data(), t.scale = 0.125f, t.out_stride = s + 3;
      const std::vector<float> m0 = test::RandomFloats(s * s, s, -0.5f, 0.5f);
      std::vector<float> m1 = m0, m2 = m0, m3 = m0;
      std::vector<float> o1(n * (s + 3)), o2(n * (s + 3)), o3(n * (s + 3));
      t.out = o1.data();
      ref.delta_rule(m1.data(), s, t);
      t.out = o2.data();
      simd.delta_rule(m2.data(), s, t);
      for (int64_t i = 0; i < n; ++i) {  // one token at a time
        DeltaRuleTokens one = t;
        one.n = 1, one.q += i * stride, one.k += i * stride, one.v += i * stride, one.decay += i, one.beta += i;
        one.out = o3.data() + i * t.out_stride;
        simd.delta_rule(m3.data(), s, one);
      }
      EXPECT_EQ(m3, m2) << s;
      EXPECT_EQ(o3, o2) << s;
      for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o2[i], 1e-5f * (1.0f + std::fabs(o1[i]))) << s;
      for (int64_t i = 0; i < s * s; ++i) ASSERT_NEAR(m1[i], m2[i], 1e-5f * (1.0f + std::fabs(m1[i]))) << s;
      // The rule itself, in double: one token from a zero state gives m_j = beta v_j k.
      std::vector<float> z(s * s, 0.0f), o(s);
      DeltaRuleTokens one = t;
      one.n = 1, one.scale = 2.0f, one.out = o.data();
      simd.delta_rule(z.data(), s, one);
      for (int64_t j = 0; j < s; ++j) {
        double want = 0.0;
        for (int64_t e = 0; e < s; ++e) want += static_cast<double>(beta[0]) * one.v[j] * one.k[e] * one.q[e];
        ASSERT_NEAR(o[j], 2.0 * want, 1e-5);
      }
    }
  }
}

// SiluMul on every ISA is bitwise the scalar path (its vector exp rounds like libm's expf), over
// a few million inputs from tiny to overflowing magnitudes.
TEST(KernelsTest, SiluMulIsBitwiseTheScalarPath) {
  SKIP_WITHOUT_SIMD();
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  Rng rng(11);
  const int64_t n = 1 << 16;
  std::vector<float> g(n), up(n, 1.0f);
  for (Isa isa : SimdIsas()) {
    const KernelTable& simd = *GetKernelTable(isa);
    int64_t mismatches = 0;
    for (int round = 0; round < 48; ++round) {
      const float scale = std::ldexp(1.0f, round % 16 - 8);  // 2^-8 .. 2^7, then 16x larger
      for (auto& v : g) v = rng.Uniform(-1.0f, 1.0f) * scale * (round >= 32 ? 16.0f : 1.0f);
      for (auto& u : up) u = rng.Uniform(-2.0f, 2.0f);
      if (round == 0) {  // the edges: NaN, infinities, signed zeros, the underflow and overflow ends
        const float edges[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 88.72f, -88.73f, 103.97f, -103.97f, 1e-30f};
        for (size_t i = 0; i < std::size(edges); ++i) g[i] = edges[i];
      }
      std::vector<float> a = g, b = g;
      ref.silu_mul(a.data(), up.data(), n - round);  // odd lengths: the scalar tail too
      simd.silu_mul(b.data(), up.data(), n - round);
      for (int64_t i = 0; i < n; ++i) mismatches += F32Bits(a[i]) != F32Bits(b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]));
    }
    EXPECT_EQ(mismatches, 0) << IsaName(isa);
  }
}

TEST(KernelsTest, SiluMulIsSiluTimesUp) {
  std::vector<float> g = {-2.0f, 0.0f, 1.5f}, up = {1.0f, 3.0f, -2.0f};
  GetKernelTable(Isa::kScalar)->silu_mul(g.data(), up.data(), 3);
  EXPECT_NEAR(g[0], -2.0f / (1.0f + std::exp(2.0f)), 1e-7f);
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_NEAR(g[2], -2.0f * 1.5f / (1.0f + std::exp(-1.5f)), 1e-6f);
}

// Every ISA's GEMM against the scalar GEMM, for every type, on tile-edge shapes (rows and tokens
// not multiples of the tiles, an odd number of blocks). Float types reorder an f32 sum; the int8
// paths compute exact integer block dots and reorder only the f32 sum of scaled blocks.
TEST(KernelsTest, GemmMatchesScalarOnEdgeShapes) {
  SKIP_WITHOUT_SIMD();
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  for (Isa isa : SimdIsas()) {
    const KernelTable& simd = *GetKernelTable(isa);
    for (GgmlType t : kTypes) {
      const TypeSlot slot = SlotOf(t);
      for (int64_t k : {32, 96, 160, 800}) {
        for (int64_t rows : {1, 3, 5, 9, 16, 17, 33}) {
          for (int64_t tokens : {1, 2, 5, 7, 9, 17}) {
            const int64_t kk = TypeTraits(t).block_size == 1 ? k + 3 : k;  // odd k for float types
            const auto wf = test::RandomFloats(kk * rows, k * 7 + rows);
            std::vector<uint8_t> w(RowBytes(t, kk) * rows);
            for (int64_t r = 0; r < rows; ++r) QuantizeRowRef(t, wf.data() + r * kk, w.data() + r * RowBytes(t, kk), kk);
            const auto x = test::RandomFloats(kk * tokens, k + tokens);
            std::vector<float> want(rows * tokens), got(rows * tokens);
            const int64_t rb = RowBytes(t, kk);
            double scale = 0.0;  // sum |w x| bound per output: kk * max|w| * max|x| <= kk
            if (ref.gemm_quant[slot] != nullptr) {
              const int64_t ks = (kk + kActPad - 1) / kActPad * kActPad;
              std::vector<int8_t> qs(ks * tokens);
              std::vector<float> d(ks / 32 * tokens);
              std::vector<int32_t> qsum(ks / 32 * tokens);
              for (int64_t i = 0; i < tokens; ++i) {
                QuantizeActivations(x.data() + i * kk, kk, ks, qs.data() + i * ks, d.data() + i * ks / 32,
                                    qsum.data() + i * ks / 32);
              }
              const QuantizedActs qa{qs.data(), d.data(), qsum.data(), kk, ks};
              ref.gemm_quant[slot](w.data(), rb, rows, qa, tokens, want.data(), rows);
              simd.gemm_quant[slot](w.data(), rb, rows, qa, tokens, got.data(), rows);
              if (simd.pack[slot] != nullptr) {
                // The packed layout reproduces the scalar reference's arithmetic: bitwise equal.
                const int64_t gb = simd.packed_group_bytes[slot](kk);
                std::vector<uint8_t> packed(gb * ((rows + kPackedRowGroup - 1) / kPackedRowGroup));
                simd.pack[slot](w.data(), rb, rows, kk, packed.data());
                std::vector<float> got_packed(rows * tokens);
                simd.gemm_packed[slot](packed.data(), gb, rows, qa, tokens, got_packed.data(), rows);
                for (int64_t i = 0; i < rows * tokens; ++i) {
                  ASSERT_EQ(F32Bits(got_packed[i]), F32Bits(want[i]))
                      << "packed " << IsaName(isa) << " " << TypeTraits(t).name << " k=" << kk << " rows=" << rows
                      << " tokens=" << tokens << " i=" << i;
                }
              }
            } else if (simd.gemm_bf16[slot] != nullptr) {
              // bf16 activations: the scalar product of the weights and the bf16-rounded x.
              const int64_t ks = (kk + kBf16ActPad - 1) / kBf16ActPad * kBf16ActPad;
              std::vector<uint16_t> xb(ks * tokens, 0);
              std::vector<float> xr(kk * tokens);
              for (int64_t i = 0; i < tokens; ++i) {
                for (int64_t j = 0; j < kk; ++j) {
                  xb[i * ks + j] = Fp32ToBf16(x[i * kk + j]);
                  xr[i * kk + j] = Bf16ToFp32(xb[i * ks + j]);
                }
              }
              ref.gemm_float[slot](w.data(), rb, rows, xr.data(), kk, tokens, want.data(), rows);
              simd.gemm_bf16[slot](w.data(), rb, rows, xb.data(), kk, tokens, got.data(), rows);
            } else {
              ref.gemm_float[slot](w.data(), rb, rows, x.data(), kk, tokens, want.data(), rows);
              simd.gemm_float[slot](w.data(), rb, rows, x.data(), kk, tokens, got.data(), rows);
            }
            scale = static_cast<double>(kk);
            // Random-walk rounding bound as in VecDotMatchesScalar, with sum|w x| <= kk.
            const double tol = 8.0 * std::sqrt(static_cast<double>(kk)) * 6e-8 * scale + 1e-6;
            for (int64_t i = 0; i < rows * tokens; ++i) {
              ASSERT_NEAR(got[i], want[i], tol) << IsaName(isa) << " " << TypeTraits(t).name << " k=" << kk
                                                << " rows=" << rows << " tokens=" << tokens << " i=" << i;
            }
          }
        }
      }
    }
  }
}

// BF16 weights with bf16 activations: the activations really are rounded (the product differs
// from the f32-activation one by about bf16's rounding, not more), and a row whose length is not
// a multiple of 32 never reads the next row's elements (an Inf there must not leak in as Inf * 0).
TEST(KernelsTest, Bf16ActivationGemmRoundsXAndMasksTheRowTail) {
  const KernelTable& kt = Active();
  if (kt.gemm_bf16[kSlotBF16] == nullptr) GTEST_SKIP() << "no bf16 dot product on this CPU";
  const int64_t k = 45, rows = 6, ks = 64;
  const auto wf = test::RandomFloats(k * rows, 3);
  std::vector<uint16_t> w(k * rows + 32);
  for (int64_t i = 0; i < k * rows; ++i) w[i] = Fp32ToBf16(wf[i]);
  for (int64_t i = k * rows; i < static_cast<int64_t>(w.size()); ++i) w[i] = 0x7f80;  // +Inf past the last row
  for (int64_t r = 1; r < rows; ++r) w[r * k] = 0x7f80;                                // and opening each later row
  const auto x = test::RandomFloats(k, 4);
  std::vector<uint16_t> xb(ks, 0);
  for (int64_t j = 0; j < k; ++j) xb[j] = Fp32ToBf16(x[j]);
  std::vector<float> y(rows);
  kt.gemm_bf16[kSlotBF16](reinterpret_cast<const uint8_t*>(w.data()), k * 2, 1, xb.data(), k, 1, y.data(), 1);
  double exact_rounded = 0.0, exact_f32 = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    exact_rounded += static_cast<double>(Bf16ToFp32(w[j])) * Bf16ToFp32(xb[j]);
    exact_f32 += static_cast<double>(Bf16ToFp32(w[j])) * x[j];
  }
  ASSERT_TRUE(std::isfinite(y[0]));
  EXPECT_NEAR(y[0], exact_rounded, 1e-5);
  EXPECT_NE(y[0], static_cast<float>(exact_f32));  // the activations were rounded
  // The last row, with only +Inf beyond it.
  kt.gemm_bf16[kSlotBF16](reinterpret_cast<const uint8_t*>(w.data()) + (rows - 1) * k * 2, k * 2, 1, xb.data(), k, 1,
                          y.data(), 1);
  EXPECT_TRUE(std::isinf(y[0]));  // its own first element is +Inf
  w[(rows - 1) * k] = Fp32ToBf16(wf[(rows - 1) * k]);
  kt.gemm_bf16[kSlotBF16](reinterpret_cast<const uint8_t*>(w.data()) + (rows - 1) * k * 2, k * 2, 1, xb.data(), k, 1,
                          y.data(), 1);
  EXPECT_TRUE(std::isfinite(y[0]));
}

// The int8 path is a real product: close to the double-precision product of the dequantized
// weights and the unquantized activations, within the activation quantization error.
TEST(KernelsTest, QuantGemmApproximatesTheExactProduct) {
  const int64_t k = 256, rows = 6, tokens = 3;
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kW4A8G64, GgmlType::kW4A8G128}) {
    const auto wf = test::RandomFloats(k * rows, 1);
    std::vector<uint8_t> w(RowBytes(t, k) * rows);
    for (int64_t r = 0; r < rows; ++r) QuantizeRowRef(t, wf.data() + r * k, w.data() + r * RowBytes(t, k), k);
    const auto x = test::RandomFloats(k * tokens, 2);
    TensorView v;
    v.type = t;
    v.shape = {k, rows};
    v.data = w.data();
    v.num_bytes = w.size();
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (GetKernelTable(isa) == nullptr) continue;
      SetActiveIsa(isa);
      ThreadPool pool(2);
      std::vector<float> y(rows * tokens);
      MatMul(v, x.data(), tokens, y.data(), pool);
      for (int64_t tok = 0; tok < tokens; ++tok) {
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> deq(k);
          DequantizeRowRef(t, w.data() + r * RowBytes(t, k), deq.data(), k);
          double exact = 0.0;
          for (int64_t i = 0; i < k; ++i) exact += static_cast<double>(deq[i]) * x[tok * k + i];
          // Each activation moves by at most half a step, max|x| / 254 <= 1/254; |w| <= 1.
          ASSERT_NEAR(y[tok * rows + r], exact, k / 254.0 * 0.5) << IsaName(isa);
        }
      }
    }
    SetActiveIsa(BestIsa());
  }
}

// A view of rows x cols weights of type t held in storage.
TensorView ViewOf(GgmlType t, int64_t cols, int64_t rows, const std::vector<uint8_t>& storage) {
  TensorView v;
  v.type = t;
  v.shape = {cols, rows};
  v.data = storage.data();
  v.num_bytes = storage.size();
  return v;
}

TensorView MakeWeights(GgmlType t, int64_t cols, int64_t rows, std::vector<uint8_t>* storage, uint64_t seed) {
  *storage = Quantized(t, test::RandomFloats(cols * rows, seed));
  return ViewOf(t, cols, rows, *storage);
}

// Random matrices of the given types (matrix i: first_rows + i * row_step rows, seed seed + i),
// each with its packed copy for the active ISA (or none).
struct PackedSet {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  std::vector<std::unique_ptr<PackedWeights>> packed;
  PackedSet(std::span<const GgmlType> types, int64_t cols, int64_t first_rows, int64_t row_step, uint64_t seed)
      : storage(types.size()) {
    for (size_t i = 0; i < types.size(); ++i) {
      const int64_t rows = first_rows + row_step * static_cast<int64_t>(i);
      views.push_back(MakeWeights(types[i], cols, rows, &storage[i], seed + i));
      packed.push_back(PackForActiveIsa(views.back()));
    }
  }
};

// A K-quant matrix of random blocks (RandomKBlocks), row r from seed first_seed + r.
TensorView RandomKMatrix(GgmlType t, int64_t cols, int64_t rows, uint64_t first_seed, std::vector<uint8_t>* storage) {
  storage->clear();
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = RandomKBlocks(t, cols, first_seed + static_cast<uint64_t>(r));
    storage->insert(storage->end(), row.begin(), row.end());
  }
  return ViewOf(t, cols, rows, *storage);
}

// W4 round trip: every element within half a quantization step of its group (zero point), or a
// whole step for the symmetric types, whose extreme maps to -8 and whose other sign reaches only
// +7 steps (as Q4_0); a clip below 1 saturates the extremes instead.
TEST(KernelsTest, W4QuantizeRoundTrips) {
  for (GgmlType t : kW4Types) {
    const W4Format f = W4FormatOf(t);
    const int64_t n = f.group * 5;
    auto x = test::RandomFloats(n, 21);
    x[3] = 0.0f;
    for (int64_t i = f.group; i < 2 * f.group; ++i) x[i] = 0.25f;  // a constant group
    const auto q = Quantized(t, x);
    std::vector<float> y(n);
    DequantizeRowRef(t, q.data(), y.data(), n);
    for (int64_t g = 0; g < n / f.group; ++g) {
      float lo = x[g * f.group], hi = lo;
      for (int64_t i = g * f.group; i < (g + 1) * f.group; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      const float step = f.zero_point ? (hi - lo) / 15.0f : std::max(std::fabs(lo), std::fabs(hi)) / 8.0f;
      for (int64_t i = g * f.group; i < (g + 1) * f.group; ++i) {
        ASSERT_NEAR(y[i], x[i], step * (f.zero_point ? 0.5f : 1.0f) + 2e-3f * std::fabs(x[i]) + 1e-6f)
            << TypeTraits(t).name << " " << i;
      }
    }
    // Clipping shrinks the range: the largest element saturates at clip * its value (about).
    std::vector<uint8_t> c(RowBytes(t, n));
    QuantizeW4Row(t, x.data(), c.data(), n, 0.8f);
    DequantizeRowRef(t, c.data(), y.data(), n);
    float xmax = 0.0f, ymax = 0.0f;
    for (int64_t i = 0; i < f.group; ++i) {
      xmax = std::max(xmax, std::fabs(x[i]));
      ymax = std::max(ymax, std::fabs(y[i]));
    }
    EXPECT_LT(ymax, 0.85f * xmax) << TypeTraits(t).name;
  }
}

// W4A8 products on every ISA against the scalar one (the packed layout bitwise), W4A16 ones
// against the dequantized f32 product (within the bf16 rounding of activations on AVX-512's
// unpacked path, the 16-bit rounding on its packed one), and all batch invariant.
TEST(KernelsTest, W4MatMulsMatchTheirReferences) {
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  for (GgmlType t : kW4Types) {
    const TypeSlot slot = SlotOf(t);
    const bool a8 = ref.gemm_quant[slot] != nullptr;
    EXPECT_EQ(a8, t == GgmlType::kW4A8G64 || t == GgmlType::kW4A8G128);
    for (int64_t k : {128, 384}) {
      for (int64_t rows : {1, 5, 16, 33}) {
        for (int64_t tokens : {1, 4, 9}) {
          std::vector<uint8_t> w;
          const TensorView v = MakeWeights(t, k, rows, &w, static_cast<uint64_t>(k + rows));
          const auto x = test::RandomFloats(k * tokens, static_cast<uint64_t>(k * tokens));
          const int64_t rb = RowBytes(t, k);
          std::vector<float> want(rows * tokens);
          double max_abs = 0.0;  // largest sum |w x| of an output (bounds the bf16 activation rounding)
          if (a8) {
            const int64_t ks = (k + kActPad - 1) / kActPad * kActPad;
            std::vector<int8_t> qs(ks * tokens);
            std::vector<float> d(ks / 32 * tokens);
            std::vector<int32_t> qsum(ks / 32 * tokens);
            for (int64_t i = 0; i < tokens; ++i) {
              QuantizeActivations(x.data() + i * k, k, ks, qs.data() + i * ks, d.data() + i * ks / 32, qsum.data() + i * ks / 32);
            }
            const QuantizedActs qa{qs.data(), d.data(), qsum.data(), k, ks};
            ref.gemm_quant[slot](w.data(), rb, rows, qa, tokens, want.data(), rows);
            for (Isa isa : SimdIsas()) {
              const KernelTable& simd = *GetKernelTable(isa);
              std::vector<float> got(rows * tokens);
              simd.gemm_quant[slot](w.data(), rb, rows, qa, tokens, got.data(), rows);
              for (int64_t i = 0; i < rows * tokens; ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * k) << IsaName(isa);
              if (simd.pack[slot] == nullptr) continue;
              const int64_t gb = simd.packed_group_bytes[slot](k);
              std::vector<uint8_t> packed(gb * ((rows + kPackedRowGroup - 1) / kPackedRowGroup));
              simd.pack[slot](w.data(), rb, rows, k, packed.data());
              simd.gemm_packed[slot](packed.data(), gb, rows, qa, tokens, got.data(), rows);
              for (int64_t i = 0; i < rows * tokens; ++i) {
                ASSERT_EQ(F32Bits(got[i]), F32Bits(want[i])) << "packed " << IsaName(isa) << " " << TypeTraits(t).name;
              }
            }
          } else {
            for (int64_t tok = 0; tok < tokens; ++tok) {
              for (int64_t r = 0; r < rows; ++r) {
                std::vector<float> deq(k);
                DequantizeRowRef(t, w.data() + r * rb, deq.data(), k);
                double sum = 0.0, abs = 0.0;
                for (int64_t i = 0; i < k; ++i) {
                  sum += static_cast<double>(deq[i]) * x[tok * k + i];
                  abs += std::fabs(static_cast<double>(deq[i]) * x[tok * k + i]);
                }
                want[tok * rows + r] = static_cast<float>(sum);
                max_abs = std::max(max_abs, abs);
              }
            }
          }
          for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
            if (GetKernelTable(isa) == nullptr) continue;
            SetActiveIsa(isa);
            ThreadPool two(2), one(1);
            std::vector<float> got(rows * tokens), single(rows);
            MatMul(v, x.data(), tokens, got.data(), two);
            for (int64_t i = 0; i < rows * tokens; ++i) {
              // AVX-512 W4A16 rounds activations to bf16 (relative 2^-9 each).
              ASSERT_NEAR(got[i], want[i], a8 ? 1e-4 * k : 1e-5 * k + 2.5e-3 * max_abs)
                  << IsaName(isa) << " " << TypeTraits(t).name;
            }
            MatMul(v, x.data() + (tokens - 1) * k, 1, single.data(), one);
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(F32Bits(single[r]), F32Bits(got[(tokens - 1) * rows + r])) << IsaName(isa) << " batch invariance";
            }
            // Symmetric W4A16 packed for AVX-512 runs with 16-bit activations: within their
            // rounding (2^-16 of each block's largest value), and batch invariant.
            if (a8 || GetKernelTable(isa)->gemm_packed_a16[slot] == nullptr) continue;
            const auto packed = PackForActiveIsa(v);
            ASSERT_NE(packed, nullptr);
            MatMul(v, packed.get(), x.data(), tokens, got.data(), two);
            for (int64_t i = 0; i < rows * tokens; ++i) {
              ASSERT_NEAR(got[i], want[i], 1e-5 * k + 5e-5 * max_abs) << "packed a16 " << TypeTraits(t).name;
            }
            MatMul(v, packed.get(), x.data() + (tokens - 1) * k, 1, single.data(), one);
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(F32Bits(single[r]), F32Bits(got[(tokens - 1) * rows + r])) << "packed a16 batch invariance";
            }
          }
          SetActiveIsa(BestIsa());
        }
      }
    }
  }
}

// Products sharing an input (quantized once per kind) are bitwise each product alone, for a mix
// of types and activation kinds (int8, 16-bit, float), packed or not.
TEST(KernelsTest, MatMulSameInputEqualsSeparateProducts) {
  const int64_t cols = 256, tokens = 5;
  // Q6_K last: the int8 activations, quantized for Q4_K before it, must carry its half sums.
  const GgmlType types[] = {GgmlType::kQ4_K,       GgmlType::kW4A16G64, GgmlType::kF16,
                            GgmlType::kQ8_0,       GgmlType::kW4A16ZG128, GgmlType::kQ6_K};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (GetKernelTable(isa) == nullptr) continue;
    SetActiveIsa(isa);
    const PackedSet set(types, cols, 16, 3, 40);
    const auto& views = set.views;
    const auto& packed = set.packed;
    const auto x = test::RandomFloats(cols * tokens, 41);
    ThreadPool one(1);
    // The products run as one parallel pass whose chunks straddle product boundaries; 2 and 3
    // threads place those boundaries differently.
    for (int threads : {2, 3}) {
      ThreadPool pool(threads);
      std::vector<std::vector<float>> together(views.size()), alone(views.size());
      std::vector<MatMulOutput> outs;
      for (size_t i = 0; i < views.size(); ++i) {
        together[i].resize(views[i].NumRows() * tokens);
        alone[i].resize(views[i].NumRows() * tokens);
        outs.push_back({&views[i], packed[i].get(), together[i].data()});
      }
      MatMulSameInput(outs, x.data(), tokens, pool);
      for (size_t i = 0; i < views.size(); ++i) {
        MatMul(views[i], packed[i].get(), x.data(), tokens, alone[i].data(), one);
        for (size_t j = 0; j < alone[i].size(); ++j) {
          ASSERT_EQ(F32Bits(together[i][j]), F32Bits(alone[i][j]))
              << IsaName(isa) << " " << TypeTraits(types[i]).name << " threads " << threads;
        }
      }
    }
  }
  SetActiveIsa(BestIsa());
}

// RmsNorm fused into the activations' quantization gives bitwise the norm written out, then the
// products; it applies only where every product reads quantized activations.
TEST(KernelsTest, RmsNormFusedIntoQuantizationEqualsNormThenProducts) {
  const int64_t cols = 256, tokens = 7;
  const GgmlType types[] = {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ8_0, GgmlType::kW4A16G64};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (GetKernelTable(isa) == nullptr) continue;
    SetActiveIsa(isa);
    const PackedSet set(types, cols, 20, 1, 60);
    const auto& views = set.views;
    const auto& packed = set.packed;
    auto x = test::RandomFloats(cols * tokens, 61);
    for (int64_t i = 0; i < cols; ++i) x[i] *= 30.0f;  // one token far from unit scale
    const auto norm_w = test::RandomFloats(cols, 62);
    ThreadPool pool(2);
    // Products of one kind alone and of mixed int8 / 16-bit kinds.
    for (size_t first : {size_t{0}, size_t{2}}) {
      std::vector<std::vector<float>> fused(views.size()), plain(views.size());
      std::vector<MatMulOutput> fused_outs, plain_outs;
      for (size_t i = first; i < views.size(); ++i) {
        fused[i].resize(views[i].NumRows() * tokens);
        plain[i].resize(views[i].NumRows() * tokens);
        fused_outs.push_back({&views[i], packed[i].get(), fused[i].data()});
        plain_outs.push_back({&views[i], packed[i].get(), plain[i].data()});
      }
      // Where some of these have no int8 kernel (scalar: K-quants; AVX2: W4A16) they read f32 rows.
      const bool quantized = ReadQuantizedActivations(fused_outs);
      if (isa == Isa::kAvx512) {
        ASSERT_TRUE(quantized);
      }
      if (!quantized) continue;
      MatMulSameInputNormed(fused_outs, {x.data(), norm_w.data(), 1e-5f}, tokens, pool);
      std::vector<float> normed(cols * tokens);
      for (int64_t t = 0; t < tokens; ++t) RmsNorm(x.data() + t * cols, norm_w.data(), cols, 1e-5f, normed.data() + t * cols);
      MatMulSameInput(plain_outs, normed.data(), tokens, pool);
      for (size_t i = first; i < views.size(); ++i) {
        for (size_t j = 0; j < plain[i].size(); ++j) {
          ASSERT_EQ(F32Bits(fused[i][j]), F32Bits(plain[i][j])) << IsaName(isa) << " " << TypeTraits(types[i]).name;
        }
      }
    }
    // A float product among them: no fusion.
    std::vector<uint8_t> f16_storage;
    const TensorView f16 = MakeWeights(GgmlType::kF16, cols, 8, &f16_storage, 63);
    std::vector<float> y(8 * tokens);
    const MatMulOutput mixed[] = {{&views[0], packed[0].get(), nullptr}, {&f16, nullptr, y.data()}};
    EXPECT_FALSE(ReadQuantizedActivations(mixed)) << IsaName(isa);
  }
  SetActiveIsa(BestIsa());
}

// Long float rows take the k-blocked tile path with several token tiles (accumulators kept
// between ranges of elements): bitwise the single-token path, close to the scalar product.
TEST(KernelsTest, KBlockedFloatGemmIsBatchInvariant) {
  SKIP_WITHOUT_SIMD();
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  const int64_t k = 2100, rows = 9, tokens = 13;  // ranges 1024, 1024, 52 (a masked tail)
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16}) {
    const TypeSlot slot = SlotOf(t);
    const auto wf = test::RandomFloats(k * rows, 71);
    std::vector<uint8_t> w(RowBytes(t, k) * rows);
    for (int64_t r = 0; r < rows; ++r) QuantizeRowRef(t, wf.data() + r * k, w.data() + r * RowBytes(t, k), k);
    const auto x = test::RandomFloats(k * tokens, 72);
    for (Isa isa : SimdIsas()) {
      const KernelTable& kt = *GetKernelTable(isa);
      std::vector<float> all(rows * tokens), one(rows), want(rows * tokens);
      kt.gemm_float[slot](w.data(), RowBytes(t, k), rows, x.data(), k, tokens, all.data(), rows);
      ref.gemm_float[slot](w.data(), RowBytes(t, k), rows, x.data(), k, tokens, want.data(), rows);
      for (int64_t tok = 0; tok < tokens; ++tok) {
        kt.gemm_float[slot](w.data(), RowBytes(t, k), rows, x.data() + tok * k, k, 1, one.data(), rows);
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(F32Bits(one[r]), F32Bits(all[tok * rows + r])) << IsaName(isa) << " " << TypeTraits(t).name;
          ASSERT_NEAR(all[tok * rows + r], want[tok * rows + r], 1e-3) << IsaName(isa) << " " << TypeTraits(t).name;
        }
      }
    }
  }
}

// Each output row of MatMul is bitwise the same for any batch size and thread count.
// Float types also with a row length that is no multiple of 8 (the tiles' scalar tail; AVX2
// converts F16/BF16 rows to f32 first when a product has more than one token tile).
TEST(KernelsTest, MatMulIsBatchInvariant) {
  const int64_t rows = 37, num_tokens = 9;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
  if (GetKernelTable(isa) == nullptr) continue;
  SetActiveIsa(isa);
  for (GgmlType t : kTypes) {
  for (int64_t cols : {96, 99}) {
    if (cols % TypeTraits(t).block_size != 0) continue;
    std::vector<uint8_t> storage;
    const TensorView w = MakeWeights(t, cols, rows, &storage, 5);
    const auto x = test::RandomFloats(cols * num_tokens, 6);
    ThreadPool one(1), two(2), three(3);
    std::vector<float> batched(rows * num_tokens);
    MatMul(w, x.data(), num_tokens, batched.data(), three);
    for (int64_t tok = 0; tok < num_tokens; ++tok) {
      std::vector<float> single(rows);
      MatMul(w, x.data() + tok * cols, 1, single.data(), tok % 2 ? one : two);
      for (int64_t r = 0; r < rows; ++r) {
        ASSERT_EQ(F32Bits(single[r]), F32Bits(batched[tok * rows + r])) << IsaName(isa) << " " << TypeTraits(t).name
                                                                            << " k=" << cols;
      }
    }
  }
  }
  }
  SetActiveIsa(BestIsa());
}

// A contiguous f32 cache of rows kv_stride floats apart, as one block.
KvBlockView Contiguous(const float* k, const float* v, int64_t kv_stride, const int32_t* zero) {
  const int64_t row_bytes = kv_stride * static_cast<int64_t>(sizeof(float));
  return {reinterpret_cast<const uint8_t*>(k), reinterpret_cast<const uint8_t*>(v), zero, int64_t{1} << 40,
          row_bytes, row_bytes, KvType::kF32, KvType::kF32};
}

TEST(KernelsTest, AttentionIsBatchInvariantAndCausal) {
  const int heads = 4, kv_heads = 2, head_dim = 64, len = 37, block_size = 16;
  const int64_t row = kv_heads * head_dim;
  const auto q = test::RandomFloats(len * heads * head_dim, 1);
  const auto k = test::RandomFloats(len * row, 2);
  const auto v = test::RandomFloats(len * row, 3);
  // Positions scattered over blocks in a shuffled order: logical block i -> physical table[i].
  const std::vector<int32_t> table = {2, 0, 3};
  std::vector<float> kc(4 * block_size * row), vc(4 * block_size * row);
  for (int p = 0; p < len; ++p) {
    const int64_t at = (table[p / block_size] * block_size + p % block_size) * row;
    std::copy(k.begin() + p * row, k.begin() + (p + 1) * row, kc.begin() + at);
    std::copy(v.begin() + p * row, v.begin() + (p + 1) * row, vc.begin() + at);
  }
  const KvLayer layer{reinterpret_cast<const uint8_t*>(kc.data()), reinterpret_cast<const uint8_t*>(vc.data()),
                      block_size, KvType::kF32, KvType::kF32};
  std::vector<int32_t> pos(len);
  for (int i = 0; i < len; ++i) pos[i] = i;
  ThreadPool pool(2), one(1);
  std::vector<float> all(len * heads * head_dim);
  const std::vector<const int32_t*> tables(len, table.data());
  Attention(q.data(), len, pos.data(), tables.data(), layer, heads, kv_heads, head_dim, all.data(), pool);
  const int32_t zero = 0;
  for (int t = 0; t < len; ++t) {
    std::vector<float> single(heads * head_dim);
    Attention(q.data() + t * heads * head_dim, 1, &pos[t], tables.data(), layer, heads, kv_heads, head_dim,
              single.data(), one);
    for (int i = 0; i < heads * head_dim; ++i) ASSERT_EQ(F32Bits(single[i]), F32Bits(all[t * heads * head_dim + i]));
    // The paged cache gives bitwise what the same rows give contiguous.
    for (int h = 0; h < heads; ++h) {
      const float* qp = q.data() + (t * heads + h) * head_dim;
      const int64_t n = t + 1;
      float out[64];
      float* op = out;
      const KvBlockView view = Contiguous(k.data() + (h / 2) * head_dim, v.data() + (h / 2) * head_dim, row, &zero);
      Active().attend_many(&qp, &n, 1, view, head_dim, &op, nullptr, nullptr, 0.0f);
      for (int d = 0; d < head_dim; ++d) ASSERT_EQ(F32Bits(out[d]), F32Bits(all[(t * heads + h) * head_dim + d]));
    }
  }
  // Token 0 attends only to itself: its output is V row 0 of its KV head.
  for (int h = 0; h < heads; ++h) {
    for (int d = 0; d < head_dim; ++d) ASSERT_FLOAT_EQ(all[h * head_dim + d], v[(h / 2) * head_dim + d]);
  }
}

// K and V head sizes that differ (V wider and narrower than K): every ISA gives a double-precision
// softmax's output over V's rows, batched bitwise as alone, f32 and f16 caches, a window and sinks.
TEST(KernelsTest, AttentionWithOtherValueHeadSizeMatchesAnExactSoftmax) {
  const int heads = 4, kv_heads = 2, head_dim = 32, len = 29, block_size = 8;
  for (int v_head : {16, 48}) {
    for (KvType type : {KvType::kF32, KvType::kF16}) {
      const int64_t kseg = KvHeadBytes(type, head_dim), vseg = KvHeadBytes(type, v_head);
      const auto q = test::RandomFloats(len * heads * head_dim, 41);
      const auto kf = test::RandomFloats(len * kv_heads * head_dim, 42);
      const auto vf = test::RandomFloats(len * kv_heads * v_head, 43);
      const std::vector<int32_t> table = {3, 1, 0, 2};
      std::vector<uint8_t> kc(4 * block_size * kv_heads * kseg), vc(4 * block_size * kv_heads * vseg);
      for (int p = 0; p < len; ++p) {
        const int64_t slot = table[p / block_size] * block_size + p % block_size;
        for (int h = 0; h < kv_heads; ++h) {
          StoreKvHead(kf.data() + (p * kv_heads + h) * head_dim, head_dim, type, kc.data() + (slot * kv_heads + h) * kseg);
          StoreKvHead(vf.data() + (p * kv_heads + h) * v_head, v_head, type, vc.data() + (slot * kv_heads + h) * vseg);
        }
      }
      const KvLayer layer{kc.data(), vc.data(), block_size, type, type};
      std::vector<int32_t> pos(len);
      for (int i = 0; i < len; ++i) pos[i] = i;
      const std::vector<const int32_t*> tables(len, table.data());
      const float sinks[heads] = {-1.0f, 0.5f, -INFINITY, 2.0f};
      for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
        if (GetKernelTable(isa) == nullptr) continue;
        SetActiveIsa(isa);
        for (const auto& [window, sink] : {std::pair{int64_t{0}, false}, std::pair{int64_t{5}, true}}) {
          SCOPED_TRACE(testing::Message() << IsaName(isa) << " " << KvTypeName(type) << " v_head " << v_head
                                          << " window " << window);
          ThreadPool pool(2), one(1);
          std::vector<float> all(len * heads * v_head);
          Attention(q.data(), len, pos.data(), tables.data(), layer, heads, kv_heads, head_dim, all.data(), pool,
                    nullptr, window, sink ? sinks : nullptr, 0.0f, v_head);
          std::vector<float> row(std::max(head_dim, v_head));
          for (int t = 0; t < len; ++t) {
            std::vector<float> single(heads * v_head);
            Attention(q.data() + t * heads * head_dim, 1, &pos[t], tables.data(), layer, heads, kv_heads, head_dim,
                      single.data(), one, nullptr, window, sink ? sinks : nullptr, 0.0f, v_head);
            for (int i = 0; i < heads * v_head; ++i) ASSERT_EQ(F32Bits(single[i]), F32Bits(all[t * heads * v_head + i]));
            const int begin = window > 0 ? std::max<int>(0, t + 1 - static_cast<int>(window)) : 0;
            for (int h = 0; h < heads; ++h) {
              const int kvh = h / (heads / kv_heads);
              std::vector<double> sc;
              double max = sink ? sinks[h] : -INFINITY;
              for (int p = begin; p <= t; ++p) {
                const int64_t slot = table[p / block_size] * block_size + p % block_size;
                LoadKvHead(kc.data() + (slot * kv_heads + kvh) * kseg, head_dim, type, row.data());
                double d = 0.0;
                for (int e = 0; e < head_dim; ++e) d += static_cast<double>(row[e]) * q[(t * heads + h) * head_dim + e];
                sc.push_back(d / std::sqrt(static_cast<double>(head_dim)));
                max = std::max(max, sc.back());
              }
              double sum = sink && sinks[h] != -INFINITY ? std::exp(sinks[h] - max) : 0.0;
              for (double x : sc) sum += std::exp(x - max);
              std::vector<double> want(v_head, 0.0);
              for (int p = begin; p <= t; ++p) {
                const int64_t slot = table[p / block_size] * block_size + p % block_size;
                LoadKvHead(vc.data() + (slot * kv_heads + kvh) * vseg, v_head, type, row.data());
                for (int e = 0; e < v_head; ++e) want[e] += std::exp(sc[p - begin] - max) / sum * row[e];
              }
              for (int e = 0; e < v_head; ++e) {
                ASSERT_NEAR(all[(t * heads + h) * v_head + e], want[e], 2e-5) << "token " << t << " head " << h;
              }
            }
          }
        }
      }
      SetActiveIsa(BestIsa());
    }
  }
}

// A sliding window: each token attends to the `window` slots ending at its own, bitwise as the
// same rows given contiguous from the window's start, on every ISA, batched or alone; tokens
// whose window starts at slot 0 are unchanged.
TEST(KernelsTest, SlidingWindowAttendsToTheWindowOnly) {
  const int heads = 4, kv_heads = 2, head_dim = 64, len = 45, block_size = 16, window = 7;
  const int64_t row = kv_heads * head_dim;
  const auto q = test::RandomFloats(len * heads * head_dim, 4);
  const auto k = test::RandomFloats(len * row, 5);
  const auto v = test::RandomFloats(len * row, 6);
  const std::vector<int32_t> table = {1, 3, 0};
  std::vector<float> kc(4 * block_size * row), vc(4 * block_size * row);
  for (int p = 0; p < len; ++p) {
    const int64_t at = (table[p / block_size] * block_size + p % block_size) * row;
    std::copy(k.begin() + p * row, k.begin() + (p + 1) * row, kc.begin() + at);
    std::copy(v.begin() + p * row, v.begin() + (p + 1) * row, vc.begin() + at);
  }
  const KvLayer layer{reinterpret_cast<const uint8_t*>(kc.data()), reinterpret_cast<const uint8_t*>(vc.data()),
                      block_size, KvType::kF32, KvType::kF32};
  std::vector<int32_t> pos(len);
  for (int i = 0; i < len; ++i) pos[i] = i;
  const std::vector<const int32_t*> tables(len, table.data());
  const int32_t zero = 0;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (GetKernelTable(isa) == nullptr) continue;
    SetActiveIsa(isa);
    ThreadPool pool(2), one(1);
    std::vector<float> all(len * heads * head_dim), plain(len * heads * head_dim);
    Attention(q.data(), len, pos.data(), tables.data(), layer, heads, kv_heads, head_dim, all.data(), pool, nullptr,
              window);
    Attention(q.data(), len, pos.data(), tables.data(), layer, heads, kv_heads, head_dim, plain.data(), pool);
    for (int t = 0; t < len; ++t) {
      std::vector<float> single(heads * head_dim);
      Attention(q.data() + t * heads * head_dim, 1, &pos[t], tables.data(), layer, heads, kv_heads, head_dim,
                single.data(), one, nullptr, window);
      const int begin = std::max(0, t + 1 - window);
      for (int h = 0; h < heads; ++h) {
        const float* qp = q.data() + (t * heads + h) * head_dim;
        const int64_t n = t + 1 - begin;
        float out[64];
        float* op = out;
        const KvBlockView view = Contiguous(k.data() + begin * row + (h / 2) * head_dim,
                                            v.data() + begin * row + (h / 2) * head_dim, row, &zero);
        Active().attend_many(&qp, &n, 1, view, head_dim, &op, nullptr, nullptr, 0.0f);
        for (int d = 0; d < head_dim; ++d) {
          const int i = (t * heads + h) * head_dim + d;
          ASSERT_EQ(F32Bits(out[d]), F32Bits(all[i])) << IsaName(isa) << " token " << t;
          ASSERT_EQ(F32Bits(single[h * head_dim + d]), F32Bits(all[i])) << IsaName(isa) << " token " << t;
          if (begin == 0) {
            ASSERT_EQ(F32Bits(plain[i]), F32Bits(all[i]));
          }
        }
      }
    }
  }
  SetActiveIsa(BestIsa());
}

// Each ISA's attention (online softmax where it has one) against the scalar exact softmax, for
// every cache type, through a block table with an odd block size.
TEST(KernelsTest, AttendMatchesScalar) {
  SKIP_WITHOUT_SIMD();
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  for (Isa isa : SimdIsas()) {
    const KernelTable& simd = *GetKernelTable(isa);
    const std::vector<KvType> types = {KvType::kF32, KvType::kF16, KvType::kBF16, KvType::kInt8, KvType::kInt4};
    for (size_t pair = 0; pair < types.size() * types.size(); ++pair) {
      const KvType ktype = types[pair / types.size()], vtype = types[pair % types.size()];
      for (int head_dim : {8, 16, 32, 64, 80, 96, 128, 256, 576}) {  // 576: latent attention rows
        const int64_t kseg = KvHeadBytes(ktype, head_dim), vseg = KvHeadBytes(vtype, head_dim);
        for (int64_t len : {1, 2, 6, 10, 15, 16, 17, 100}) {
          const int64_t kv_stride = head_dim * 3;  // three KV heads interleaved, we read the middle one
          const int64_t block_size = 7, num_blocks = (len + block_size - 1) / block_size;
          std::vector<int32_t> table(num_blocks);
          for (int64_t i = 0; i < num_blocks; ++i) table[i] = static_cast<int32_t>((i * 5 + 3) % num_blocks);
          const auto q = test::RandomFloats(head_dim, head_dim + len, -2.0f, 2.0f);
          const auto kf = test::RandomFloats(num_blocks * block_size * kv_stride, len, -2.0f, 2.0f);
          const auto vf = test::RandomFloats(num_blocks * block_size * kv_stride, len + 1);
          // Rows of three head segments, each stored as the KV cache stores it.
          const int64_t rows = num_blocks * block_size;
          std::vector<uint8_t> k(rows * 3 * kseg), v(rows * 3 * vseg);
          for (int64_t r = 0; r < rows * 3; ++r) {
            StoreKvHead(kf.data() + r * head_dim, head_dim, ktype, k.data() + r * kseg);
            StoreKvHead(vf.data() + r * head_dim, head_dim, vtype, v.data() + r * vseg);
          }
          const KvBlockView view{k.data() + kseg, v.data() + vseg, table.data(), block_size, 3 * kseg, 3 * vseg,
                                 ktype, vtype};
          std::vector<float> want(head_dim), got(head_dim);
          const float* qp = q.data();
          float* wp = want.data();
          float* gp = got.data();
          ref.attend_many(&qp, &len, 1, view, head_dim, &wp, nullptr, nullptr, 0.0f);
          simd.attend_many(&qp, &len, 1, view, head_dim, &gp, nullptr, nullptr, 0.0f);
          // Outputs are convex combinations of values in [-1, 1]; the two softmax formulations
          // differ by a few ulps of the weights.
          for (int d = 0; d < head_dim; ++d) {
            ASSERT_NEAR(got[d], want[d], 3e-6f) << IsaName(isa) << " K " << KvTypeName(ktype) << " V "
                                                << KvTypeName(vtype) << " hd " << head_dim << " len " << len;
          }
        }
      }
    }
  }
}

// int8/int4 row segments: the f16 scale is amax / 127 (or / 7) and every element comes back within
// half a step of it; zero rows stay zero; int4 packs element pairs into bytes.
TEST(KernelsTest, QuantizedKvSegmentsRoundTrip) {
  for (KvType type : {KvType::kInt8, KvType::kInt4}) {
    const int qmax = type == KvType::kInt8 ? 127 : 7;
    for (int head_dim : {8, 64, 128}) {
      ASSERT_EQ(KvHeadBytes(type, head_dim), 2 + (type == KvType::kInt8 ? head_dim : head_dim / 2));
      for (uint64_t seed = 1; seed <= 20; ++seed) {
        const auto x = test::RandomFloats(head_dim, seed, -3.0f, 3.0f);
        std::vector<uint8_t> seg(KvHeadBytes(type, head_dim));
        StoreKvHead(x.data(), head_dim, type, seg.data());
        std::vector<float> y(head_dim);
        LoadKvHead(seg.data(), head_dim, type, y.data());
        float amax = 0.0f;
        for (float f : x) amax = std::max(amax, std::fabs(f));
        uint16_t s16;
        std::memcpy(&s16, seg.data(), 2);
        const float scale = Fp16ToFp32(s16);
        ASSERT_NEAR(scale, amax / qmax, amax / qmax * 1e-3f);
        for (int d = 0; d < head_dim; ++d) ASSERT_LE(std::fabs(y[d] - x[d]), 0.5f * scale * 1.01f + 1e-6f) << d;
      }
      std::vector<float> zeros(head_dim, 0.0f), y(head_dim, 1.0f);
      std::vector<uint8_t> seg(KvHeadBytes(type, head_dim));
      StoreKvHead(zeros.data(), head_dim, type, seg.data());
      LoadKvHead(seg.data(), head_dim, type, y.data());
      for (float f : y) ASSERT_EQ(f, 0.0f);
    }
  }
  // Element 2i in the low nibble, 2i+1 in the high one, stored + 8.
  const float x[4] = {7.0f, -7.0f, 0.0f, 3.0f};
  uint8_t seg[4];
  StoreKvHead(x, 4, KvType::kInt4, seg);
  EXPECT_EQ(seg[2], (7 + 8) | ((-7 + 8) << 4));
  EXPECT_EQ(seg[3], (0 + 8) | ((3 + 8) << 4));
}

// Queries attended together get bitwise what each gets alone, whatever their lengths and however
// the kernel groups them (11 queries: groups of four, then two, then one), for each cache type
// and for head_dim 8 (its own transposed path) and 64.
TEST(KernelsTest, AttendManyEqualsOneAtATime) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* kt = GetKernelTable(isa);
    if (kt == nullptr) continue;
    for (KvType type : {KvType::kF32, KvType::kF16, KvType::kBF16, KvType::kInt8, KvType::kInt4}) {
      for (int head_dim : {8, 64}) {
        const int nq = 11, positions = 70;
        const int64_t seg = KvHeadBytes(type, head_dim), kv_stride = 2 * seg;
        const auto kf = test::RandomFloats(positions * 2 * head_dim, 1);
        const auto vf = test::RandomFloats(positions * 2 * head_dim, 2);
        std::vector<uint8_t> k(positions * kv_stride), v(positions * kv_stride);
        for (int64_t r = 0; r < positions * 2; ++r) {
          StoreKvHead(kf.data() + r * head_dim, head_dim, type, k.data() + r * seg);
          StoreKvHead(vf.data() + r * head_dim, head_dim, type, v.data() + r * seg);
        }
        const auto q = test::RandomFloats(nq * head_dim, 3);
        const int32_t zero = 0;
        const KvBlockView view{k.data(), v.data(), &zero, int64_t{1} << 40, kv_stride, kv_stride, type, type};
        std::vector<const float*> qs;
        std::vector<int64_t> lens;
        std::vector<float> together(nq * head_dim), alone(nq * head_dim);
        std::vector<float*> outs;
        for (int i = 0; i < nq; ++i) {
          qs.push_back(q.data() + i * head_dim);
          lens.push_back(1 + (i * 7) % positions);
          outs.push_back(together.data() + i * head_dim);
        }
        kt->attend_many(qs.data(), lens.data(), nq, view, head_dim, outs.data(), nullptr, nullptr, 0.0f);
        for (int i = 0; i < nq; ++i) {
          float* o = alone.data() + i * head_dim;
          kt->attend_many(&qs[i], &lens[i], 1, view, head_dim, &o, nullptr, nullptr, 0.0f);
        }
        for (int i = 0; i < nq * head_dim; ++i) {
          ASSERT_EQ(F32Bits(together[i]), F32Bits(alone[i])) << IsaName(isa) << " " << KvTypeName(type) << " hd "
                                                               << head_dim << " at " << i;
        }
      }
    }
  }
}

// Attention sinks (gpt-oss): each query's sink logit joins its softmax's denominator only; and
// Gemma 2's soft-capping of the scores (cap tanh(s / cap)). Every ISA against a double-precision
// softmax over [scores..., sink], for sinks below, among and above the scores, with and without a
// cap that binds, through one call of several queries (and of several KV heads, kv.query_heads);
// a query's result is bitwise what it gets alone; a sink of -inf is no sink, bitwise.
TEST(KernelsTest, AttendManyWithSinksAndSoftCapMatchesAnExactSoftmax) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* kt = GetKernelTable(isa);
    if (kt == nullptr) continue;
    for (KvType type : {KvType::kF32, KvType::kF16}) {
      for (int head_dim : {8, 64, 128}) {
        const int nq = 6, positions = 37, kv_heads = 2;
        const int32_t heads[nq] = {0, 1, 1, 0, 1, 0};
        const int64_t seg = KvHeadBytes(type, head_dim), row = kv_heads * seg;
        const auto kf = test::RandomFloats(positions * kv_heads * head_dim, 31);
        const auto vf = test::RandomFloats(positions * kv_heads * head_dim, 32);
        std::vector<uint8_t> k(positions * row), v(positions * row);
        for (int64_t r = 0; r < positions * kv_heads; ++r) {
          StoreKvHead(kf.data() + r * head_dim, head_dim, type, k.data() + r * seg);
          StoreKvHead(vf.data() + r * head_dim, head_dim, type, v.data() + r * seg);
        }
        const int32_t zero = 0;
        for (const auto& [across_heads, softcap] : {std::pair{false, 0.0f}, std::pair{true, 0.0f},
                                                    std::pair{false, 1.5f}, std::pair{true, 1.5f}}) {
          const KvBlockView view{k.data(), v.data(), &zero, int64_t{1} << 40, row, row, type, type,
                                 across_heads ? heads : nullptr, seg, seg};
          const auto q = test::RandomFloats(nq * head_dim, 33);
          const float sinks[nq] = {-3.0f, 0.0f, 0.5f, 2.0f, 8.0f, -INFINITY};
          std::vector<const float*> qs;
          std::vector<int64_t> lens;
          std::vector<float> together(nq * head_dim), alone(nq * head_dim), plain(nq * head_dim);
          std::vector<float*> outs, plain_outs;
          for (int i = 0; i < nq; ++i) {
            qs.push_back(q.data() + i * head_dim);
            lens.push_back(1 + (i * 11) % positions);
            outs.push_back(together.data() + i * head_dim);
            plain_outs.push_back(plain.data() + i * head_dim);
          }
          kt->attend_many(qs.data(), lens.data(), nq, view, head_dim, outs.data(), nullptr, sinks, softcap);
          kt->attend_many(qs.data(), lens.data(), nq, view, head_dim, plain_outs.data(), nullptr, nullptr, softcap);
          std::vector<float> row_f(head_dim);
          for (int i = 0; i < nq; ++i) {
            SCOPED_TRACE(testing::Message() << IsaName(isa) << " " << KvTypeName(type) << " hd " << head_dim
                                            << " query " << i << (across_heads ? " across heads" : "")
                                            << " softcap " << softcap);
            float* o = alone.data() + i * head_dim;
            kt->attend_many(&qs[i], &lens[i], 1, view.ForQuery(i), head_dim, &o, nullptr, &sinks[i], softcap);
            const KvBlockView one = view.ForQuery(i);
            std::vector<double> s(lens[i]), want(head_dim, 0.0);
            double max = sinks[i];
            for (int64_t p = 0; p < lens[i]; ++p) {
              LoadKvHead(one.k + p * one.k_row_bytes, head_dim, type, row_f.data());
              double d = 0.0;
              for (int e = 0; e < head_dim; ++e) d += static_cast<double>(row_f[e]) * q[i * head_dim + e];
              s[p] = d / std::sqrt(static_cast<double>(head_dim));
              if (softcap > 0.0f) s[p] = softcap * std::tanh(s[p] / softcap);
              max = std::max(max, s[p]);
            }
            double sum = std::exp(static_cast<double>(sinks[i]) - max);
            for (int64_t p = 0; p < lens[i]; ++p) sum += std::exp(s[p] - max);
            for (int64_t p = 0; p < lens[i]; ++p) {
              LoadKvHead(one.v + p * one.v_row_bytes, head_dim, type, row_f.data());
              for (int e = 0; e < head_dim; ++e) want[e] += std::exp(s[p] - max) / sum * row_f[e];
            }
            for (int e = 0; e < head_dim; ++e) {
              ASSERT_NEAR(together[i * head_dim + e], want[e], 2e-5) << "element " << e;
              ASSERT_EQ(F32Bits(together[i * head_dim + e]), F32Bits(alone[i * head_dim + e])) << "element " << e;
            }
            if (sinks[i] == -INFINITY) {
              for (int e = 0; e < head_dim; ++e) ASSERT_EQ(F32Bits(together[i * head_dim + e]), F32Bits(plain[i * head_dim + e]));
            }
          }
        }
      }
    }
  }
}

// Queries of different KV heads in one call (kv.query_heads, decode without grouped-query heads)
// get bitwise what each gets alone from its own head's view, scores included, on every ISA, for
// each cache type and for head_dim 8 and 64.
TEST(KernelsTest, AttendManyAcrossHeadsEqualsEachHead) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* kt = GetKernelTable(isa);
    if (kt == nullptr) continue;
    for (KvType type : {KvType::kF32, KvType::kF16, KvType::kBF16, KvType::kInt8, KvType::kInt4}) {
      for (int head_dim : {8, 64}) {
        const int nq = 7, positions = 45, slots = 48, kv_heads = 3;  // 45 positions in three blocks of 16
        const int32_t heads[nq] = {0, 2, 1, 1, 0, 2, 2};
        const int64_t seg = KvHeadBytes(type, head_dim), row = kv_heads * seg;
        const auto kf = test::RandomFloats(slots * kv_heads * head_dim, 21);
        const auto vf = test::RandomFloats(slots * kv_heads * head_dim, 22);
        std::vector<uint8_t> k(slots * row), v(slots * row);
        for (int64_t r = 0; r < slots * kv_heads; ++r) {
          StoreKvHead(kf.data() + r * head_dim, head_dim, type, k.data() + r * seg);
          StoreKvHead(vf.data() + r * head_dim, head_dim, type, v.data() + r * seg);
        }
        const int32_t table[3] = {2, 0, 1};  // out of order
        const KvBlockView view{k.data(), v.data(), table, 16, row, row, type, type, heads, seg, seg};
        const auto q = test::RandomFloats(nq * head_dim, 23);
        std::vector<const float*> qs;
        std::vector<int64_t> lens;
        std::vector<float> together(nq * head_dim), alone(nq * head_dim);
        std::vector<float> st(nq * positions, -1.0f), sa(nq * positions, -1.0f);
        std::vector<float*> outs, scores;
        for (int i = 0; i < nq; ++i) {
          qs.push_back(q.data() + i * head_dim);
          lens.push_back(1 + (i * 13) % positions);
          outs.push_back(together.data() + i * head_dim);
          scores.push_back(st.data() + i * positions);
        }
        kt->attend_many(qs.data(), lens.data(), nq, view, head_dim, outs.data(), scores.data(), nullptr, 0.0f);
        for (int i = 0; i < nq; ++i) {
          float* o = alone.data() + i * head_dim;
          float* sc = sa.data() + i * positions;
          kt->attend_many(&qs[i], &lens[i], 1, view.ForQuery(i), head_dim, &o, &sc, nullptr, 0.0f);
        }
        for (int i = 0; i < nq * head_dim; ++i) {
          ASSERT_EQ(F32Bits(together[i]), F32Bits(alone[i])) << IsaName(isa) << " " << KvTypeName(type) << " hd "
                                                               << head_dim << " at " << i;
        }
        for (int i = 0; i < nq * positions; ++i) ASSERT_EQ(F32Bits(st[i]), F32Bits(sa[i])) << IsaName(isa) << " score " << i;
      }
    }
  }
}

// Asking for the scores (KV retention's tracking) changes no output bit, and every ISA's scores
// are q . k / sqrt(head_dim) as the scalar kernel computes them, for each KV type.
TEST(KernelsTest, AttendManyReportsScores) {
  const KernelTable* ref = GetKernelTable(Isa::kScalar);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* kt = GetKernelTable(isa);
    if (kt == nullptr) continue;
    for (KvType type : {KvType::kF32, KvType::kF16, KvType::kInt8}) {
      for (int head_dim : {8, 64}) {
        const int nq = 5, len = 37;
        const int64_t head_bytes = KvHeadBytes(type, head_dim);
        const auto kf = test::RandomFloats(len * head_dim, 11);
        const auto vf = test::RandomFloats(len * head_dim, 12);
        std::vector<uint8_t> k(len * head_bytes), v(len * head_bytes);
        for (int p = 0; p < len; ++p) {
          StoreKvHead(kf.data() + p * head_dim, head_dim, type, k.data() + p * head_bytes);
          StoreKvHead(vf.data() + p * head_dim, head_dim, type, v.data() + p * head_bytes);
        }
        const int32_t zero = 0;
        const KvBlockView view{k.data(), v.data(), &zero, len, head_bytes, head_bytes, type, type};
        const auto q = test::RandomFloats(nq * head_dim, 13);
        std::vector<const float*> qs;
        std::vector<int64_t> lens;
        std::vector<float> plain(nq * head_dim), tracked(nq * head_dim), want_out(nq * head_dim);
        std::vector<float> got(nq * len, -1.0f), want(nq * len, -1.0f);
        std::vector<float*> po, to, wo, gs, ws;
        for (int i = 0; i < nq; ++i) {
          qs.push_back(q.data() + i * head_dim);
          lens.push_back(len - 7 * i);
          po.push_back(plain.data() + i * head_dim);
          to.push_back(tracked.data() + i * head_dim);
          wo.push_back(want_out.data() + i * head_dim);
          gs.push_back(i == 2 ? nullptr : got.data() + i * len);  // a query may opt out
          ws.push_back(want.data() + i * len);
        }
        kt->attend_many(qs.data(), lens.data(), nq, view, head_dim, po.data(), nullptr, nullptr, 0.0f);
        kt->attend_many(qs.data(), lens.data(), nq, view, head_dim, to.data(), gs.data(), nullptr, 0.0f);
        ref->attend_many(qs.data(), lens.data(), nq, view, head_dim, wo.data(), ws.data(), nullptr, 0.0f);
        for (int i = 0; i < nq * head_dim; ++i) ASSERT_EQ(F32Bits(plain[i]), F32Bits(tracked[i])) << IsaName(isa);
        for (int i = 0; i < nq; ++i) {
          for (int p = 0; p < len; ++p) {
            if (i == 2 || p >= lens[i]) {
              ASSERT_EQ(got[i * len + p], -1.0f) << "written outside the query's scores";
            } else {
              ASSERT_NEAR(got[i * len + p], want[i * len + p], 1e-4f * (1.0f + std::fabs(want[i * len + p])))
                  << IsaName(isa) << " " << KvTypeName(type) << " head_dim " << head_dim;
            }
          }
        }
      }
    }
  }
}

// Each ISA's in-place softmax against the scalar one, across tail lengths.
TEST(KernelsTest, SoftmaxMatchesReference) {
  const KernelTable* ref = GetKernelTable(Isa::kScalar);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* kt = GetKernelTable(isa);
    if (kt == nullptr) continue;
    for (int64_t n : {1, 7, 16, 17, 100, 513}) {
      auto x = test::RandomFloats(n, static_cast<uint64_t>(n));
      for (float& v : x) v *= 8.0f;
      auto want = x;
      ref->softmax(want.data(), n);
      kt->softmax(x.data(), n);
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(x[i], want[i], 2e-6f + 1e-5f * want[i]) << IsaName(isa) << " n " << n << " i " << i;
        sum += x[i];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

TEST(KernelsTest, ActivationQuantizationRoundsHalfToEvenAndPads) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // scale 1
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = -126.6f;
  std::vector<int8_t> qs(128, 99);
  std::vector<float> d(4, 9.0f);
  std::vector<int32_t> qsum(4, 9);
  QuantizeActivations(x.data(), 32, 128, qs.data(), d.data(), qsum.data());
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(qs[0], 127);
  EXPECT_EQ(qs[1], 2);
  EXPECT_EQ(qs[2], 4);
  EXPECT_EQ(qs[3], -2);
  EXPECT_EQ(qs[4], -127);
  EXPECT_EQ(qsum[0], 127 + 2 + 4 - 2 - 127);
  for (int i = 32; i < 128; ++i) ASSERT_EQ(qs[i], 0);
  for (int b = 1; b < 4; ++b) EXPECT_TRUE(d[b] == 0.0f && qsum[b] == 0);
}

// 16-bit activations: q = 256 * hi + lo with hi signed and lo unsigned, halves to even, the sum,
// and zeroed padding.
TEST(KernelsTest, Activation16QuantizationSplitsIntoBytes) {
  std::vector<float> x(32, 0.0f);
  x[0] = 32767.0f;  // scale 1
  x[1] = 2.5f;
  x[2] = -300.5f;
  x[3] = -1.0f;
  x[4] = 1000.25f;
  std::vector<int8_t> hi(128, 99);
  std::vector<uint8_t> lo(128, 99);
  std::vector<float> d(4, 9.0f);
  std::vector<int32_t> qsum(4, 9);
  QuantizeActivations16(x.data(), 32, 128, hi.data(), lo.data(), d.data(), qsum.data());
  EXPECT_EQ(d[0], 1.0f);
  const int want[5] = {32767, 2, -300, -1, 1000};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(256 * hi[i] + lo[i], want[i]) << i;
  EXPECT_EQ(hi[3], -1);
  EXPECT_EQ(lo[3], 255);
  EXPECT_EQ(qsum[0], 32767 + 2 - 300 - 1 + 1000);
  for (int i = 32; i < 128; ++i) ASSERT_TRUE(hi[i] == 0 && lo[i] == 0);
  for (int b = 1; b < 4; ++b) EXPECT_TRUE(d[b] == 0.0f && qsum[b] == 0);
}

// Every ISA's activation quantizers give the scalar ones' bytes, scales and sums: random rows of
// several magnitudes, exact ties (x.5 at scale 1), blocks of zeros, values at qmax, a row length
// short of k_stride (padding), and non-finite values (a NaN never wins the block's max).
TEST(KernelsTest, ActivationQuantizersMatchScalar) {
  SKIP_WITHOUT_SIMD();
  Rng rng(11);
  for (const int64_t k : {32, 96, 768, 2080}) {
    const int64_t ks = (k + kActPad - 1) / kActPad * kActPad;
    std::vector<float> x(k);
    for (int64_t i = 0; i < k; ++i) x[i] = rng.Uniform(-1, 1) * (i % 96 < 32 ? 1e-3f : i % 96 < 64 ? 3.0f : 4e4f);
    if (k >= 96) {
      for (int i = 0; i < 32; ++i) x[32 + i] = 0.0f;                     // block 1: all zero
      x[64] = 127.0f;                                                    // block 2: scale 1 (int8),
      for (int i = 1; i < 32; ++i) x[64 + i] = static_cast<float>(i) - 16.5f;  // ties to even
    }
    if (k >= 768) {
      x[200] = NAN;  // first and second half of a block (the AVX-512 max takes halves apart)
      x[250] = NAN;
      x[300] = -INFINITY;
      x[301] = 5.0f;
    }
    std::vector<int8_t> want_q(ks, 77), got_q(ks, 66);
    std::vector<uint8_t> want_lo(ks, 77), got_lo(ks, 66);
    std::vector<float> want_d(ks / 32, 7.0f), got_d(ks / 32, 6.0f);
    std::vector<int32_t> want_s(ks / 32, 7), got_s(ks / 32, 6);
    for (Isa isa : SimdIsas()) {
      const KernelTable& kt = *GetKernelTable(isa);
      QuantizeActivations(x.data(), k, ks, want_q.data(), want_d.data(), want_s.data());
      kt.quantize_acts(x.data(), k, ks, got_q.data(), got_d.data(), got_s.data());
      for (int64_t i = 0; i < ks; ++i) ASSERT_EQ(got_q[i], want_q[i]) << IsaName(isa) << " k " << k << " i " << i;
      for (int64_t b = 0; b < ks / 32; ++b) {
        ASSERT_EQ(F32Bits(got_d[b]), F32Bits(want_d[b])) << IsaName(isa) << " k " << k << " block " << b;
        ASSERT_EQ(got_s[b], want_s[b]) << IsaName(isa) << " k " << k << " block " << b;
      }
      QuantizeActivations16(x.data(), k, ks, want_q.data(), want_lo.data(), want_d.data(), want_s.data());
      kt.quantize_acts16(x.data(), k, ks, got_q.data(), got_lo.data(), got_d.data(), got_s.data());
      for (int64_t i = 0; i < ks; ++i) {
        ASSERT_TRUE(got_q[i] == want_q[i] && got_lo[i] == want_lo[i]) << IsaName(isa) << " 16-bit k " << k << " i " << i;
      }
      for (int64_t b = 0; b < ks / 32; ++b) {
        ASSERT_EQ(F32Bits(got_d[b]), F32Bits(want_d[b])) << IsaName(isa) << " 16-bit k " << k << " block " << b;
        ASSERT_EQ(got_s[b], want_s[b]) << IsaName(isa) << " 16-bit k " << k << " block " << b;
      }
    }
  }
}

// The K-quant layouts, element by element from the format's definition (not from our decoder).
TEST(KernelsTest, KQuantLayoutsFromTheirDefinition) {
  {
    BlockQ4_K b{};
    b.d = Fp32ToFp16(1.0f);
    b.dmin = Fp32ToFp16(0.5f);
    b.scales[0] = 3;     // sub-block 0: scale 3 (low 6 bits)
    b.scales[4] = 2;     //              min 2
    b.scales[1] = 0x40;  // sub-block 1: scale 0, min 0; bits 6-7 are bits 4-5 of sub-block 5's scale
    b.scales[9] = 0x21;  // sub-block 5: scale low 4 bits 1, min low 4 bits 2
    b.qs[0] = 0x5a;      // element 0 (low nibble 10), element 32 (high nibble 5)
    b.qs[64] = 0x70;     // group 2: element 128 (low nibble 0), element 160 (high nibble 7)
    float y[256];
    DequantizeRowRef(GgmlType::kQ4_K, &b, y, 256);
    EXPECT_EQ(y[0], 1.0f * 3 * 10 - 0.5f * 2);
    EXPECT_EQ(y[32], 0.0f);                       // sub-block 1: scale 0, min 0
    EXPECT_EQ(y[160], 1.0f * (16 + 1) * 7 - 0.5f * 2);
  }
  {
    BlockQ5_K b{};
    b.d = Fp32ToFp16(1.0f);
    b.dmin = Fp32ToFp16(0.0f);
    b.scales[0] = 1;     // sub-block 0 scale 1
    b.scales[1] = 1;     // sub-block 1 scale 1
    b.scales[2] = 2;     // sub-block 2 scale 2
    b.qs[0] = 0x23;      // element 0 low nibble 3, element 32 high nibble 2
    b.qh[0] = 0x01 | 0x02 | 0x04;  // fifth bit for element 0 (bit 0), element 32 (bit 1), element 64 (bit 2)
    float y[256];
    DequantizeRowRef(GgmlType::kQ5_K, &b, y, 256);
    EXPECT_EQ(y[0], 3.0f + 16.0f);
    EXPECT_EQ(y[32], 2.0f + 16.0f);
    EXPECT_EQ(y[64], 2.0f * 16.0f);  // sub-block 2, low nibble 0 of qs[32], fifth bit set
  }
  {
    BlockQ6_K b{};
    b.d = Fp32ToFp16(0.5f);
    for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<int8_t>(i + 1);
    b.ql[0] = 0x21;      // element 0 low 4 bits 1, element 64 low 4 bits 2
    b.ql[32] = 0x03;     // element 32 low 4 bits 3
    b.qh[0] = 0x01 | (0x2 << 2) | (0x3 << 4);  // high bits: element 0: 1, element 32: 2, element 64: 3
    b.ql[64] = 0x05;     // second half: element 128 low 4 bits 5
    float y[256];
    DequantizeRowRef(GgmlType::kQ6_K, &b, y, 256);
    EXPECT_EQ(y[0], 0.5f * 1 * ((1 | 1 << 4) - 32));   // scales[0]
    EXPECT_EQ(y[32], 0.5f * 3 * ((3 | 2 << 4) - 32));  // scales[2]
    EXPECT_EQ(y[64], 0.5f * 5 * ((2 | 3 << 4) - 32));  // scales[4]
    EXPECT_EQ(y[16], 0.5f * 2 * (0 - 32));             // scales[1], q = 0
    EXPECT_EQ(y[128], 0.5f * 9 * (5 - 32));            // second half: scales[8]
  }
  {
    // As ggml's dequantize_row_q3_K walks it: 16 values at a time, each with the next scale;
    // the 2-bit fields of qs[l] serve elements l, l + 32, l + 64, l + 96 of a 128-half (shift 0,
    // 2, 4, 6), hmask bit 4 h + s their third bit, and a clear third bit means minus 4.
    BlockQ3_K b{};
    b.d = Fp32ToFp16(0.5f);
    b.scales[0] = 0x31;  // scale 0 low 4 bits 1, scale 8 low 4 bits 3
    b.scales[8] = 0x22;  // scale 0 bits 4-5: 2 (33 - 32 = 1); scale 8 bits 4-5: 2 (35 - 32 = 3)
    b.qs[0] = 0x03 | (0x1 << 2);  // element 0: 3; element 32: 1
    b.hmask[0] = 0x01 | 0x10;     // element 0 and element 128 have their third bit
    b.qs[32] = 0x02;              // element 128: 2
    float y[256];
    DequantizeRowRef(GgmlType::kQ3_K, &b, y, 256);
    EXPECT_EQ(y[0], 0.5f * 1 * 3);        // q = 7, scale 0
    EXPECT_EQ(y[16], 0.5f * -32 * -4);   // scale 1 = 0 - 32, q = 0
    EXPECT_EQ(y[32], 0.5f * -32 * -3);   // scale 2, q = 1
    EXPECT_EQ(y[128], 0.5f * 3 * 2);     // scale 8, q = 6
    EXPECT_EQ(y[255], 0.5f * -32 * -4);  // scale 15
  }
  {
    // As ggml's dequantize_row_q2_K: scales[i] holds sub-block i's scale (low nibble) and min
    // (high nibble); the 2-bit fields as Q3_K's.
    BlockQ2_K b{};
    b.d = Fp32ToFp16(0.5f);
    b.dmin = Fp32ToFp16(0.25f);
    b.scales[0] = 0x23;  // sub-block 0: scale 3, min 2
    b.scales[2] = 0x10;  // sub-block 2 (elements 32-47): scale 0, min 1
    b.scales[8] = 0x05;  // sub-block 8 (elements 128-143): scale 5, min 0
    b.qs[0] = 0x02 | (0x3 << 2);  // element 0: 2; element 32: 3
    b.qs[32] = 0x01;              // element 128: 1
    float y[256];
    DequantizeRowRef(GgmlType::kQ2_K, &b, y, 256);
    EXPECT_EQ(y[0], 0.5f * 3 * 2 - 0.25f * 2);
    EXPECT_EQ(y[32], 0.5f * 0 * 3 - 0.25f * 1);
    EXPECT_EQ(y[128], 0.5f * 5 * 1);
    EXPECT_EQ(y[16], 0.0f);  // sub-block 1: scale 0, min 0
  }
}

// The double-precision product of a dequantized row and one token's activations, with the bounds
// its f32 sum (sum of |w x|) and its int8 activations (half a step of each block's scale per
// value, summed over |w|) may be off by.
struct ExactProduct {
  double exact = 0.0, sum_abs = 0.0, act_bound = 0.0;
};
ExactProduct ExactRowProduct(const std::vector<float>& deq, const float* x, int64_t k) {
  ExactProduct p;
  for (int64_t b = 0; b < k / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    for (int i = 0; i < 32; ++i) {
      const int64_t e = b * 32 + i;
      p.exact += static_cast<double>(deq[e]) * x[e];
      p.sum_abs += std::fabs(static_cast<double>(deq[e]) * x[e]);
      p.act_bound += std::fabs(static_cast<double>(deq[e])) * (0.5 * amax / 127.0);
    }
  }
  return p;
}

// K-quant matmuls on every ISA without packing (scalar: dequantize, then f32 products; AVX2:
// int8 activations per 32 straight from the super-blocks): close to the exact product of the
// reference dequantization (within f32 rounding, or within the activations' rounding, half a step
// of each block's scale per value, where the ISA quantizes them), and batch invariant.
TEST(KernelsTest, KQuantMatMulMatchesReferenceAndIsBatchInvariant) {
  const int64_t k = 512, rows = 7, tokens = 5;
  for (GgmlType t : kKTypes) {
    std::vector<uint8_t> w;
    const TensorView v = RandomKMatrix(t, k, rows, 100, &w);
    const auto x = test::RandomFloats(k * tokens, 3);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (GetKernelTable(isa) == nullptr) continue;
      SetActiveIsa(isa);
      const bool int8_acts = Active().gemm_quant[SlotOf(t)] != nullptr;
      ThreadPool pool(2), one(1);
      std::vector<float> y(rows * tokens), y1(rows);
      MatMul(v, x.data(), tokens, y.data(), pool);
      for (int64_t tok = 0; tok < tokens; ++tok) {
        MatMul(v, x.data() + tok * k, 1, y1.data(), one);
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(F32Bits(y1[r]), F32Bits(y[tok * rows + r])) << IsaName(isa);
          std::vector<float> deq(k);
          DequantizeRowRef(t, w.data() + r * RowBytes(t, k), deq.data(), k);
          const ExactProduct p = ExactRowProduct(deq, x.data() + tok * k, k);
          const double bound = int8_acts ? 1.01 * p.act_bound + 1e-4
                                         : 8.0 * std::sqrt(static_cast<double>(k)) * 6e-8 * p.sum_abs + 1e-6;
          ASSERT_NEAR(y[tok * rows + r], p.exact, bound) << IsaName(isa) << " " << TypeTraits(t).name;
        }
      }
    }
    SetActiveIsa(BestIsa());
  }
}

// Q5_0 blocks as Q8_0 ones, exactly: the same scale, q - 16 in a byte.
void Q5_0ToQ8_0(const BlockQ5_0* src, BlockQ8_0* dst, int64_t num_blocks) {
  uint8_t q[32];
  for (int64_t b = 0; b < num_blocks; ++b) {
    UnpackQ5(src[b].qh, src[b].qs, q);
    dst[b].d = src[b].d;
    for (int j = 0; j < 32; ++j) dst[b].qs[j] = static_cast<int8_t>(q[j] - 16);
  }
}

// llama.cpp's legacy 32-element types (its Q4_K_M / Q5_K_M mixes fall back to Q5_0 / Q5_1 for
// matrices whose rows are not a multiple of 256), all on int8 activations. Products are bitwise
// the scalar reference's wherever the arithmetic is the reference's (AVX-512's packed layouts),
// and Q5_0's on every ISA bitwise those of the same weights converted to Q8_0 (the conversion is
// exact). All batch and thread-count invariant and within the activations' rounding of the exact
// product.
TEST(KernelsTest, LegacyTypesMatchTheirReferencesAndAreBatchInvariant) {
  const int64_t rows = 37, tokens = 9;
  const auto x = test::RandomFloats(800 * tokens, 22);
  // The IQ4 types and MXFP4 (table values under a block scale) run on the same int8 machinery.
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
                     GgmlType::kMXFP4}) {
    const int64_t k = t == GgmlType::kIQ4_XS ? 768 : 800;
    std::vector<uint8_t> storage;
    const TensorView v = MakeWeights(t, k, rows, &storage, 21);
    std::vector<uint8_t> as_q8;  // Q5_0 only: the same weights as Q8_0 blocks
    TensorView v8;
    if (t == GgmlType::kQ5_0) {
      as_q8.resize(RowBytes(GgmlType::kQ8_0, k) * rows);
      Q5_0ToQ8_0(reinterpret_cast<const BlockQ5_0*>(storage.data()), reinterpret_cast<BlockQ8_0*>(as_q8.data()),
                 k / 32 * rows);
      v8 = ViewOf(GgmlType::kQ8_0, k, rows, as_q8);
    }
    std::vector<float> scalar(rows * tokens);
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (GetKernelTable(isa) == nullptr) continue;
      SetActiveIsa(isa);
      const std::unique_ptr<PackedWeights> packed = PackForActiveIsa(v);
      const std::unique_ptr<PackedWeights> packed8 = t == GgmlType::kQ5_0 ? PackForActiveIsa(v8) : nullptr;
      ThreadPool pool(3), one(1);
      std::vector<float> y(rows * tokens), y1(rows), y8(rows * tokens);
      MatMul(v, packed.get(), x.data(), tokens, y.data(), pool);
      if (isa == Isa::kScalar) scalar = y;
      const bool reference_arithmetic = isa == Isa::kScalar || packed != nullptr;
      if (t == GgmlType::kQ5_0) {
        MatMul(v8, packed8.get(), x.data(), tokens, y8.data(), pool);
        EXPECT_EQ(packed != nullptr, packed8 != nullptr) << IsaName(isa);
      }
      for (int64_t tok = 0; tok < tokens; ++tok) {
        MatMul(v, packed.get(), x.data() + tok * k, 1, y1.data(), one);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = tok * rows + r;
          ASSERT_EQ(F32Bits(y1[r]), F32Bits(y[i])) << IsaName(isa) << " " << TypeTraits(t).name;
          if (t == GgmlType::kQ5_0) {
            ASSERT_EQ(F32Bits(y8[i]), F32Bits(y[i])) << IsaName(isa) << " as Q8_0";
          }
          if (reference_arithmetic) {
            ASSERT_EQ(F32Bits(scalar[i]), F32Bits(y[i])) << IsaName(isa) << " " << TypeTraits(t).name;
          }
          std::vector<float> deq(k);
          DequantizeRowRef(t, storage.data() + r * RowBytes(t, k), deq.data(), k);
          const ExactProduct p = ExactRowProduct(deq, x.data() + tok * k, k);
          ASSERT_NEAR(y[i], p.exact, 1.01 * p.act_bound + 1e-4) << IsaName(isa) << " " << TypeTraits(t).name;
        }
      }
    }
    SetActiveIsa(BestIsa());
  }
}

// F8E4M3 (DeepSeek's FP8) decodes to exactly its dequantized values on every ISA, so its products
// are bitwise those of the dequantized f32 matrix through the same ISA's f32 kernels, one token
// or many (the decoded-rows path), and every ISA agrees with the exact product.
TEST(KernelsTest, F8E4M3ProductsEqualTheDequantizedF32Ones) {
  const int64_t k = 1088, rows = 19;
  std::vector<uint8_t> w;
  const TensorView v = MakeWeights(GgmlType::kF8E4M3, k, rows, &w, 31);
  std::vector<float> deq(k * rows);
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRowRef(GgmlType::kF8E4M3, w.data() + r * RowBytes(GgmlType::kF8E4M3, k), deq.data() + r * k, k);
  }
  std::vector<uint8_t> f32(deq.size() * 4);
  std::memcpy(f32.data(), deq.data(), f32.size());
  const TensorView vf = ViewOf(GgmlType::kF32, k, rows, f32);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (GetKernelTable(isa) == nullptr) continue;
    SetActiveIsa(isa);
    for (int64_t tokens : {1, 2, 7, 13}) {
      const auto x = test::RandomFloats(k * tokens, 40 + tokens);
      ThreadPool two(2);
      std::vector<float> got(rows * tokens), want(rows * tokens);
      MatMul(v, x.data(), tokens, got.data(), two);
      MatMul(vf, x.data(), tokens, want.data(), two);
      for (int64_t i = 0; i < rows * tokens; ++i) {
        ASSERT_EQ(F32Bits(got[i]), F32Bits(want[i])) << IsaName(isa) << " tokens " << tokens << " at " << i;
        const ExactProduct p = ExactRowProduct(std::vector<float>(deq.begin() + (i % rows) * k,
                                                                  deq.begin() + (i % rows + 1) * k),
                                               x.data() + (i / rows) * k, k);
        ASSERT_NEAR(got[i], p.exact, 1e-4 * p.sum_abs + 1e-6) << IsaName(isa);
      }
    }
  }
  SetActiveIsa(BestIsa());
}

// With AVX-VNNI, AVX2's int8-activation products (vpdpbusd) are bitwise those without it
// (maddubs + madd): the same integers, the same float steps.
TEST(KernelsTest, AvxVnniProductsEqualTheMaddubsOnes) {
#if !GALE_KERNELS_AVX2
  GTEST_SKIP() << "this build has no AVX2 kernels (GALE_KERNEL_ISAS)";
#else
  if (!GetCpuFeatures().HasAvxVnni()) GTEST_SKIP() << "no AVX-VNNI here";
  const KernelTable& vnni = Avx2Table();
  const KernelTable& plain = Avx2TableWithoutVnni();
  const int64_t k = 512, rows = 11, tokens = 6;
  const int64_t ks = (k + kActPad - 1) / kActPad * kActPad;
  const auto x = test::RandomFloats(k * tokens, 31, -4.0f, 4.0f);
  std::vector<int8_t> qs(ks * tokens);
  std::vector<float> d(ks / 32 * tokens);
  std::vector<int32_t> qsum(ks / 32 * tokens), half(ks / 16 * tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    QuantizeActivations(x.data() + t * k, k, ks, qs.data() + t * ks, d.data() + t * ks / 32, qsum.data() + t * ks / 32);
    for (int64_t h = 0; h < ks / 16; ++h) {  // the halves' sums (Q6_K)
      int32_t sum = 0;
      for (int i = 0; i < 16; ++i) sum += qs[t * ks + h * 16 + i];
      half[t * ks / 16 + h] = sum;
    }
  }
  QuantizedActs qa{qs.data(), d.data(), qsum.data(), k, ks};
  qa.half_sums = half.data();
  std::vector<GgmlType> types = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                                 GgmlType::kQ5_1, GgmlType::kW4A8G64, GgmlType::kW4A8G128};
  types.insert(types.end(), std::begin(kKTypes), std::end(kKTypes));
  types.push_back(GgmlType::kIQ4_NL);
  types.push_back(GgmlType::kIQ4_XS);
  types.push_back(GgmlType::kMXFP4);
  SetActiveIsa(Isa::kAvx2);
  EXPECT_EQ(ActiveKernelsName(), "avx2 (avx-vnni)");
  SetActiveIsa(BestIsa());
  EXPECT_EQ(plain.variant, nullptr);
  for (GgmlType t : types) {
    const TypeSlot slot = SlotOf(t);
    ASSERT_NE(vnni.gemm_quant[slot], plain.gemm_quant[slot]) << TypeTraits(t).name << ": not the VNNI kernel";
    std::vector<uint8_t> w;
    if (W4FormatOf(t).group > 0 || (CanQuantize(t) && TypeTraits(t).block_size == 32)) {
      MakeWeights(t, k, rows, &w, 41);
    } else {
      RandomKMatrix(t, k, rows, 43, &w);
    }
    std::vector<float> a(rows * tokens), b(rows * tokens);
    vnni.gemm_quant[slot](w.data(), RowBytes(t, k), rows, qa, tokens, a.data(), rows);
    plain.gemm_quant[slot](w.data(), RowBytes(t, k), rows, qa, tokens, b.data(), rows);
    for (int64_t i = 0; i < rows * tokens; ++i) ASSERT_EQ(F32Bits(a[i]), F32Bits(b[i])) << TypeTraits(t).name;
  }
#endif
}

// AVX2's W4A16 products (each weight d * q + m as the dequantizer rounds it, inside the f32 tile)
// are bitwise the f32 products of the dequantized rows.
TEST(KernelsTest, Avx2W4A16EqualsDequantizedF32) {
  if (GetKernelTable(Isa::kAvx2) == nullptr) GTEST_SKIP() << "no AVX2 here";
  SetActiveIsa(Isa::kAvx2);
  const int64_t k = 384, rows = 9, tokens = 5;
  std::vector<GgmlType> types(std::begin(kW4Types), std::end(kW4Types));
  types.push_back(GgmlType::kF8E4M3);
  for (GgmlType t : types) {
    if ((W4FormatOf(t).group == 0 && t != GgmlType::kF8E4M3) || Active().gemm_float[SlotOf(t)] == nullptr) continue;
    std::vector<uint8_t> w;
    const TensorView v = MakeWeights(t, k, rows, &w, 77);
    std::vector<float> deq(k * rows);
    for (int64_t r = 0; r < rows; ++r) DequantizeRowRef(t, w.data() + r * RowBytes(t, k), deq.data() + r * k, k);
    std::vector<uint8_t> f32(deq.size() * 4);
    std::memcpy(f32.data(), deq.data(), f32.size());
    const TensorView vf = ViewOf(GgmlType::kF32, k, rows, f32);
    const auto x = test::RandomFloats(k * tokens, 8);
    ThreadPool two(2);
    std::vector<float> got(rows * tokens), want(rows * tokens);
    MatMul(v, x.data(), tokens, got.data(), two);
    MatMul(vf, x.data(), tokens, want.data(), two);
    for (int64_t i = 0; i < rows * tokens; ++i) ASSERT_EQ(F32Bits(got[i]), F32Bits(want[i])) << TypeTraits(t).name;
  }
  SetActiveIsa(BestIsa());
}

// AVX2's K-quant products (int8 activations, straight from the super-blocks) are bitwise the
// AVX-512 packed kernel's: the same integer dots and the same float steps per run, in order.
TEST(KernelsTest, Avx2KQuantsEqualTheAvx512PackedKernel) {
  if (GetKernelTable(Isa::kAvx512) == nullptr || GetKernelTable(Isa::kAvx2) == nullptr) {
    GTEST_SKIP() << "needs AVX-512 and AVX2";
  }
  const int64_t k = 768, rows = 19, tokens = 7;
  for (GgmlType t : kKTypes) {
    std::vector<uint8_t> w;
    const TensorView v = RandomKMatrix(t, k, rows, 500 + static_cast<uint64_t>(t), &w);
    const auto x = test::RandomFloats(k * tokens, 23, -3.0f, 3.0f);
    ThreadPool two(2);
    SetActiveIsa(Isa::kAvx512);
    const auto packed = PackForActiveIsa(v);
    ASSERT_NE(packed, nullptr);
    std::vector<float> want(rows * tokens), got(rows * tokens);
    MatMul(v, packed.get(), x.data(), tokens, want.data(), two);
    SetActiveIsa(Isa::kAvx2);
    ASSERT_NE(Active().gemm_quant[SlotOf(t)], nullptr) << TypeTraits(t).name;
    MatMul(v, x.data(), tokens, got.data(), two);
    for (int64_t i = 0; i < rows * tokens; ++i) {
      ASSERT_EQ(F32Bits(got[i]), F32Bits(want[i])) << TypeTraits(t).name << " at " << i;
    }
  }
  SetActiveIsa(BestIsa());
}

// The packed K-quant GEMMs (AVX-512 VNNI, int8 activations per 32): close to the exact product of
// the dequantized weights and the unquantized activations (within the activations' rounding,
// half a step of each block's scale per value), rows not a multiple of 16, and batch invariant
// for any token count (tiles of 1-8 tokens) and thread split.
TEST(KernelsTest, PackedKQuantsMatchTheExactProduct) {
  const KernelTable* avx512 = GetKernelTable(Isa::kAvx512);
  if (avx512 == nullptr) GTEST_SKIP() << "no AVX-512 here";
  SetActiveIsa(Isa::kAvx512);
  const int64_t k = 768, tokens = 11;
  for (GgmlType t : kKTypes) {
    for (int64_t rows : {1, 16, 37}) {
      std::vector<uint8_t> w;
      const TensorView v = RandomKMatrix(t, k, rows, 300 + static_cast<uint64_t>(t), &w);
      const auto packed = PackForActiveIsa(v);
      ASSERT_NE(packed, nullptr) << TypeTraits(t).name;
      const auto x = test::RandomFloats(k * tokens, 17 + rows);
      ThreadPool three(3), one(1);
      std::vector<float> y(rows * tokens), y1(rows);
      MatMul(v, packed.get(), x.data(), tokens, y.data(), three);
      for (int64_t tok = 0; tok < tokens; ++tok) {
        MatMul(v, packed.get(), x.data() + tok * k, 1, y1.data(), one);
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_EQ(F32Bits(y1[r]), F32Bits(y[tok * rows + r])) << TypeTraits(t).name << " batch invariance";
          std::vector<float> deq(k);
          DequantizeRowRef(t, w.data() + r * RowBytes(t, k), deq.data(), k);
          const ExactProduct p = ExactRowProduct(deq, x.data() + tok * k, k);
          ASSERT_NEAR(y[tok * rows + r], p.exact, 1.01 * p.act_bound + 1e-4) << TypeTraits(t).name << " row " << r;
        }
      }
    }
  }
  SetActiveIsa(BestIsa());
}

TEST(KernelsTest, RopeRotatesAdjacentPairs) {
  std::vector<float> x = {1.0f, 0.0f, 0.0f, 1.0f};  // one head of 4: pairs (0,1), (2,3)
  float cos_sin[4];
  RopeAngles(4, 3, 10000.0f, 1.0f, cos_sin);
  RopeApply(x.data(), 1, 4, 4, cos_sin);
  EXPECT_NEAR(x[0], std::cos(3.0f), 1e-6f);
  EXPECT_NEAR(x[1], std::sin(3.0f), 1e-6f);
  const float theta = 3.0f / 100.0f;  // 10000^(-2/4)
  EXPECT_NEAR(x[2], -std::sin(theta), 1e-6f);
  EXPECT_NEAR(x[3], std::cos(theta), 1e-6f);
}

// GELU (tanh approximation) times up: every ISA bitwise the scalar path, on random data with a
// vector tail and with large values (exp overflow and underflow), and the scalar path within a few
// ulps of the tanh formula.
TEST(KernelsTest, GeluMulIsBitwiseTheScalarPathAndTheTanhFormula) {
  const int64_t n = 1037;
  auto x = test::RandomFloats(n, 11, -6.0f, 6.0f);
  x[3] = 80.0f;
  x[4] = -80.0f;
  x[5] = 0.0f;
  const auto up = test::RandomFloats(n, 12);
  std::vector<float> ref = x;
  GetKernelTable(Isa::kScalar)->gelu_mul(ref.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double want = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))) * up[i];
    ASSERT_NEAR(ref[i], want, 2e-6 * (std::fabs(want) + 1e-3)) << "x " << x[i];
  }
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (GetKernelTable(isa) == nullptr) continue;
    std::vector<float> got = x;
    GetKernelTable(isa)->gelu_mul(got.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(F32Bits(got[i]), F32Bits(ref[i])) << IsaName(isa) << " i " << i;
  }
}

TEST(KernelsTest, RopeNeoxRotatesHalves) {
  std::vector<float> x = {1.0f, 0.0f, 0.0f, 1.0f, 7.0f};  // one head of 5, rope 4: pairs (0,2), (1,3)
  float cos_sin[4];
  RopeAngles(4, 3, 10000.0f, 1.0f, cos_sin);
  RopeApplyNeox(x.data(), 1, 5, 4, cos_sin);
  EXPECT_NEAR(x[0], std::cos(3.0f), 1e-6f);
  EXPECT_NEAR(x[2], std::sin(3.0f), 1e-6f);
  const float theta = 3.0f / 100.0f;  // 10000^(-2/4)
  EXPECT_NEAR(x[1], -std::sin(theta), 1e-6f);
  EXPECT_NEAR(x[3], std::cos(theta), 1e-6f);
  EXPECT_EQ(x[4], 7.0f);  // past rope_dims: untouched
}

// Every ISA's rotation (normal and NEOX) is bitwise the scalar one, for head sizes with and
// without a vector tail and partial rotary dims.
TEST(KernelsTest, RopeApplyIsBitwiseTheScalarPath) {
  SKIP_WITHOUT_SIMD();
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  for (Isa isa : SimdIsas()) {
    const KernelTable& kt = *GetKernelTable(isa);
    for (int head_dim : {8, 20, 48, 64, 128}) {
      for (int rope_dims : {head_dim, head_dim / 2 / 2 * 2}) {
        const int heads = 3;
        std::vector<float> cos_sin(rope_dims);
        RopeAngles(rope_dims, 1234, 10000.0f, 1.0f, cos_sin.data());
        auto a = test::RandomFloats(heads * head_dim, static_cast<uint64_t>(head_dim + rope_dims));
        auto b = a;
        auto c = a, d = a;
        ref.rope_apply(a.data(), heads, head_dim, rope_dims, cos_sin.data());
        kt.rope_apply(b.data(), heads, head_dim, rope_dims, cos_sin.data());
        ref.rope_apply_neox(c.data(), heads, head_dim, rope_dims, cos_sin.data());
        kt.rope_apply_neox(d.data(), heads, head_dim, rope_dims, cos_sin.data());
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_EQ(F32Bits(a[i]), F32Bits(b[i])) << IsaName(isa) << " head_dim " << head_dim << " rope " << rope_dims
                                                  << " i " << i;
          ASSERT_EQ(F32Bits(c[i]), F32Bits(d[i])) << IsaName(isa) << " NEOX, head_dim " << head_dim << " rope "
                                                  << rope_dims << " i " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gale::kernels

namespace gale::kernels {
namespace {

// KV-cache conversions: every ISA bitwise equal to the scalar rounding, on random values across
// all exponents plus the special cases (ties, subnormals, overflow, infinities, NaNs).
// The sampler's softmax weights: every ISA's exp(x - m) is bitwise glibc's expf of the float
// difference, over the whole range a logit row can take (and the tails of odd lengths).
TEST(KernelsTest, ExpShiftedMatchesScalar) {
  SKIP_WITHOUT_SIMD();
  Rng rng(12);
  std::vector<float> x(4099);
  for (size_t i = 0; i < x.size(); ++i) x[i] = rng.Uniform(-120.0f, 30.0f);
  x[0] = 30.0f;  // the row's max: exp(0) = 1
  x[1] = -INFINITY;
  x[2] = NAN;
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  std::vector<float> want(x.size()), got(x.size());
  for (Isa isa : SimdIsas()) {
    for (const int64_t n : {int64_t{4099}, int64_t{7}, int64_t{16}}) {
      ref.exp_shifted(x.data(), 30.0f, want.data(), n);
      GetKernelTable(isa)->exp_shifted(x.data(), 30.0f, got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(F32Bits(got[i]), F32Bits(want[i])) << IsaName(isa) << " x " << x[i] << " n " << n;
      }
    }
    EXPECT_EQ(want[0], 1.0f);
  }
}

// Greedy sampling's argmax: every ISA returns the scalar loop's index (first of equal maxima, NaNs
// ignored unless first, +0 and -0 equal) for rows with the maximum in the vector body and in the
// tail, repeated, and with NaNs and infinities about.
TEST(KernelsTest, ArgMaxMatchesScalar) {
  SKIP_WITHOUT_SIMD();
  Rng rng(13);
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  auto check = [&](const std::vector<float>& x, const char* what) {
    const int64_t want = ref.argmax(x.data(), static_cast<int64_t>(x.size()));
    for (Isa isa : SimdIsas()) {
      ASSERT_EQ(GetKernelTable(isa)->argmax(x.data(), static_cast<int64_t>(x.size())), want) << IsaName(isa) << " " << what;
    }
  };
  for (const int n : {1, 7, 16, 17, 100, 32000}) {
    std::vector<float> x(n);
    for (float& v : x) v = rng.Uniform(-5.0f, 5.0f);
    check(x, "random");
    x[n - 1] = 9.0f;  // in the tail
    check(x, "max last");
    x[n / 2] = 9.0f;  // an earlier equal maximum
    check(x, "two maxima");
    x[0] = NAN;
    check(x, "NaN first");
    x[0] = 1.0f;
    x[n / 3] = NAN;
    check(x, "NaN inside");
    x[n / 4] = INFINITY;
    check(x, "inf");
  }
  check({-1.0f, -0.0f, 0.0f}, "signed zeros");
  check({-INFINITY, -INFINITY}, "all -inf");
}

TEST(KernelsTest, F16AndBf16ConversionsMatchScalar) {
  Rng rng(9);
  std::vector<float> x;
  for (int i = 0; i < 5000; ++i) x.push_back(F32FromBits(static_cast<uint32_t>(rng.NextU64())));
  for (float f : {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e-8f, 6e-8f, 3e-5f, INFINITY, -INFINITY, NAN}) x.push_back(f);
  for (uint32_t bits : {0x3f801000u, 0x3f803000u, 0x3f808000u, 0x3f818000u, 0x33000000u, 0x33000001u, 0x387fe000u,
                        0x7fc00001u, 0xff800001u}) {
    x.push_back(F32FromBits(bits));
  }
  const KernelTable& ref = *GetKernelTable(Isa::kScalar);
  std::vector<uint16_t> want(x.size()), got(x.size());
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* kt = GetKernelTable(isa);
    if (kt == nullptr) continue;
    ref.to_f16(x.data(), want.data(), static_cast<int64_t>(x.size()));
    kt->to_f16(x.data(), got.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], want[i]) << IsaName(isa) << " f16 of bits " << F32Bits(x[i]);
    ref.to_bf16(x.data(), want.data(), static_cast<int64_t>(x.size()));
    kt->to_bf16(x.data(), got.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], want[i]) << IsaName(isa) << " bf16 of bits " << F32Bits(x[i]);
  }
}

}  // namespace
}  // namespace gale::kernels
