// AVX2 + FMA + F16C kernels (8 floats per vector). Built with -mavx2 -mfma -mf16c; only called
// when CPUID says the CPU has them. Each reduces in a fixed lane order, independent of the caller.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "base/cpu.h"
#include "base/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"
#include "kernels/x86/rope_neox.h"
#include "kernels/x86/avx2_int8.h"
#include "kernels/x86/gemm_tiles.h"

namespace gale::kernels {
namespace {


inline __m256 LoadBf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 LoadF16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Dot over elements with a loader for 8 weights at a time; two accumulators, scalar tail.
template <typename Elem, typename Load8, typename Scalar>
inline float DotGeneric(const Elem* a, const float* x, int64_t n, Load8 load8, Scalar scalar) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load8(a + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(load8(a + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load8(a + i), _mm256_loadu_ps(x + i), acc0);
  float sum = HSum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += scalar(a[i]) * x[i];
  return sum;
}

float DotF32(const void* w, const float* x, int64_t n) {
  return DotGeneric(static_cast<const float*>(w), x, n, [](const float* p) { return _mm256_loadu_ps(p); },
                    [](float v) { return v; });
}

float DotF16(const void* w, const float* x, int64_t n) {
  return DotGeneric(static_cast<const uint16_t*>(w), x, n, LoadF16x8, Fp16ToFp32);
}

float DotBF16(const void* w, const float* x, int64_t n) {
  return DotGeneric(static_cast<const uint16_t*>(w), x, n, LoadBf16x8, Bf16ToFp32);
}

inline __m256 I8x8ToF32(const int8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

float DotQ8_0(const void* w, const float* x, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(w);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* xb = x + i * kQK8_0;
    __m256 s = _mm256_mul_ps(I8x8ToF32(b[i].qs), _mm256_loadu_ps(xb));
    s = _mm256_fmadd_ps(I8x8ToF32(b[i].qs + 8), _mm256_loadu_ps(xb + 8), s);
    s = _mm256_fmadd_ps(I8x8ToF32(b[i].qs + 16), _mm256_loadu_ps(xb + 16), s);
    s = _mm256_fmadd_ps(I8x8ToF32(b[i].qs + 24), _mm256_loadu_ps(xb + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(Fp16ToFp32(b[i].d)), s, acc);
  }
  return HSum(acc);
}

float DotQ4_0(const void* w, const float* x, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(w);
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i eight = _mm_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const float* xb = x + i * kQK4_0;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);                      // elems 0..15
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);  // 16..31
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(xb));
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
                        _mm256_loadu_ps(xb + 8), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(xb + 16), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))),
                        _mm256_loadu_ps(xb + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(Fp16ToFp32(b[i].d)), s, acc);
  }
  return HSum(acc);
}

void DequantF32(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kF32, src, dst, n); }

void DequantF16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadF16x8(s + i));
  for (; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
}

void DequantBF16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadBf16x8(s + i));
  for (; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
}

void DequantQ8_0(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ8_0, src, dst, n); }
void DequantQ4_0(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ4_0, src, dst, n); }
void DequantQ4_K(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ4_K, src, dst, n); }
void DequantQ5_K(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ5_K, src, dst, n); }
void DequantQ6_K(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ6_K, src, dst, n); }

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = HSum(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  const __m256 vs = _mm256_set1_ps(ss);
  for (i = 0; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(vs, _mm256_loadu_ps(x + i))));
  }
  for (; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

// expf of 4 floats as glibc computes it (see ExpfLikeLibm in the AVX-512 kernels): 4 doubles,
// the table entry by a gather.
inline __m128 ExpfLikeLibm4(__m128 xf) {
  const __m128 xc = _mm_min_ps(_mm_max_ps(xf, _mm_set1_ps(-104.0f)), _mm_set1_ps(89.0f));
  const __m256d x = _mm256_cvtps_pd(xc);
  const __m256d shift = _mm256_set1_pd(0x1.8p+52);
  const __m256d z = _mm256_mul_pd(_mm256_set1_pd(0x1.71547652b82fep+0 * 32), x);
  __m256d kd = _mm256_add_pd(z, shift);
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  const __m256d r = _mm256_sub_pd(z, kd);
  const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  __m256i t = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(ExpfTable32()), idx, 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
  const __m256d p = _mm256_fmadd_pd(_mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                    _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(p, _mm256_mul_pd(r, r), y);
  y = _mm256_mul_pd(y, _mm256_castsi256_pd(t));
  return _mm_blendv_ps(_mm256_cvtpd_ps(y), xf, _mm_cmpunord_ps(xf, xf));
}

void SiluMul(float* gate, const float* up, int64_t n) {
  // Per element exactly the scalar path's float operations: v * (1 / (1 + exp(-v))) * up.
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(gate + i);
    const __m256 neg = _mm256_xor_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 e = _mm256_set_m128(ExpfLikeLibm4(_mm256_extractf128_ps(neg, 1)), ExpfLikeLibm4(_mm256_castps256_ps128(neg)));
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(v, s), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    float v = gate[i];
    v *= 1.0f / (1.0f + std::exp(-v));
    gate[i] = v * up[i];
  }
}

void GeluMul(float* gate, const float* up, int64_t n) {
  // Per element the scalar path's float operations (GeluMulReference), glibc's expf included.
  const __m256 one = _mm256_set1_ps(1.0f), c1 = _mm256_set1_ps(kGeluC1), c2 = _mm256_set1_ps(kGeluC2);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    const __m256 z = _mm256_mul_ps(x, _mm256_add_ps(c1, _mm256_mul_ps(c2, _mm256_mul_ps(x, x))));
    const __m256 neg = _mm256_xor_ps(z, _mm256_set1_ps(-0.0f));
    const __m256 e = _mm256_set_m128(ExpfLikeLibm4(_mm256_extractf128_ps(neg, 1)), ExpfLikeLibm4(_mm256_castps256_ps128(neg)));
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_loadu_ps(up + i)));
  }
  if (i < n) GeluMulReference(gate + i, up + i, n - i);
}

// The sum of the eight lanes, pairwise: (0+4, 1+5, 2+6, 3+7), then halves again.
inline float Hsum256(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Gated DeltaNet's recurrence on R rows of the state at once for one token: each row is the
// single-row arithmetic (one accumulator per dot, its lanes summed by one reduction), the R rows'
// chains independent so that they overlap.
template <int R>
inline void DeltaRows(float* m, int64_t s, int64_t j, const DeltaRuleTokens& t, int64_t i) {
  const float *k = t.k + i * t.stride, *q = t.q + i * t.stride;
  const float decay = t.decay[i];
  const __m256 vd = _mm256_set1_ps(decay);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t e = 0;
  for (; e + 8 <= s; e += 8) {
    const __m256 ke = _mm256_loadu_ps(k + e);
    for (int r = 0; r < R; ++r) {
      float* mr = m + (j + r) * s + e;
      const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(mr), vd);
      _mm256_storeu_ps(mr, x);
      acc[r] = _mm256_fmadd_ps(x, ke, acc[r]);
    }
  }
  float d[R];
  for (int r = 0; r < R; ++r) {
    float* mr = m + (j + r) * s;
    float sk = Hsum256(acc[r]);
    for (int64_t f = e; f < s; ++f) {
      mr[f] *= decay;
      sk += mr[f] * k[f];
    }
    d[r] = (t.v[i * t.stride + j + r] - sk) * t.beta[i];
    acc[r] = _mm256_setzero_ps();
  }
  for (e = 0; e + 8 <= s; e += 8) {
    const __m256 ke = _mm256_loadu_ps(k + e), qe = _mm256_loadu_ps(q + e);
    for (int r = 0; r < R; ++r) {
      float* mr = m + (j + r) * s + e;
      const __m256 x = _mm256_fmadd_ps(_mm256_set1_ps(d[r]), ke, _mm256_loadu_ps(mr));
      _mm256_storeu_ps(mr, x);
      acc[r] = _mm256_fmadd_ps(x, qe, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* mr = m + (j + r) * s;
    float sq = Hsum256(acc[r]);
    for (int64_t f = e; f < s; ++f) {
      mr[f] += d[r] * k[f];
      sq += mr[f] * q[f];
    }
    t.out[i * t.out_stride + j + r] = sq * t.scale;
  }
}

// 16 tokens at a time (their k and q stay in L1), four rows through the 16 before the next four
// (they stay in L1): the state streams once per 16 tokens, not per token.
void DeltaRule(float* m, int64_t s, const DeltaRuleTokens& t) {
  for (int64_t i0 = 0; i0 < t.n; i0 += 16) {
    const int64_t i1 = std::min<int64_t>(t.n, i0 + 16);
    int64_t j = 0;
    for (; j + 4 <= s; j += 4) {
      for (int64_t i = i0; i < i1; ++i) DeltaRows<4>(m, s, j, t, i);
    }
    for (; j < s; ++j) {
      for (int64_t i = i0; i < i1; ++i) DeltaRows<1>(m, s, j, t, i);
    }
  }
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}


// The scalar ArgMax's answer in two passes (see the AVX-512 one).
int64_t ArgMax(const float* x, int64_t n) {
  if (std::isnan(x[0])) return 0;
  __m256 acc = _mm256_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + i), acc);
  float best = MaxOf8(acc);  // no NaN in acc
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  const __m256 bv = _mm256_set1_ps(best);
  for (i = 0; i + 8 <= n; i += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), bv, _CMP_EQ_OQ));
    if (eq != 0) return i + __builtin_ctz(static_cast<unsigned>(eq));
  }
  for (; x[i] != best; ++i) {
  }
  return i;
}

void ExpShifted(const float* x, float m, float* out, int64_t n) {
  const __m256 mv = _mm256_set1_ps(m);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
    _mm256_storeu_ps(out + i, _mm256_set_m128(ExpfLikeLibm4(_mm256_extractf128_ps(v, 1)),
                                              ExpfLikeLibm4(_mm256_castps256_ps128(v))));
  }
  for (; i < n; ++i) out[i] = std::exp(x[i] - m);
}

// Activation quantizers, bitwise the scalar QuantizeBlocks (see avx512_kernels.cc's): running
// max of |x| (vmaxps(a, acc) keeps acc for a NaN, as the scalar a > amax ? a : amax), scalar
// scale and inverse, x * inv rounded half to even by the conversion, clamped to [-qmax, qmax].
// Bytes go through two saturating packs (no-ops after the clamp) and one lane permutation.
inline __m256i PackBytes(const __m256i (&q)[4], bool is_unsigned) {
  const __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
  // 32-bit unit u: 4 values of q[u % 4], elements 0-3 (u < 4) or 4-7.
  const __m256i b = is_unsigned ? _mm256_packus_epi16(p01, p23) : _mm256_packs_epi16(p01, p23);
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <bool kWide>
inline void QuantizeActsImpl(const float* x, int64_t k, int64_t k_stride, int8_t* qs, uint8_t* lo, float* d,
                             int32_t* qsum) {
  constexpr int kQmax = kWide ? 32767 : 127;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i hi_q = _mm256_set1_epi32(kQmax), lo_q = _mm256_set1_epi32(-kQmax);
  for (int64_t b = 0; b < k / 32; ++b) {
    __m256 xv[4];
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      xv[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
      m = _mm256_max_ps(_mm256_and_ps(xv[j], abs_mask), m);
    }
    const float scale = MaxOf8(m) / static_cast<float>(kQmax);  // no NaN left in m
    const __m256 inv = _mm256_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    __m256i q[4];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      q[j] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(xv[j], inv)), lo_q), hi_q);
      sum = _mm256_add_epi32(sum, q[j]);
    }
    if constexpr (kWide) {
      const __m256i byte = _mm256_set1_epi32(0xff);
      const __m256i hi[4] = {_mm256_srai_epi32(q[0], 8), _mm256_srai_epi32(q[1], 8), _mm256_srai_epi32(q[2], 8),
                             _mm256_srai_epi32(q[3], 8)};
      const __m256i low[4] = {_mm256_and_si256(q[0], byte), _mm256_and_si256(q[1], byte),
                              _mm256_and_si256(q[2], byte), _mm256_and_si256(q[3], byte)};
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * b), PackBytes(hi, false));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + 32 * b), PackBytes(low, true));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * b), PackBytes(q, false));
    }
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    d[b] = scale;
    qsum[b] = _mm_cvtsi128_si32(t);
  }
  ZeroActPadding(k, k_stride, qs, lo, d, qsum);
}

void QuantizeActs(const float* x, int64_t k, int64_t k_stride, int8_t* qs, float* d, int32_t* qsum) {
  QuantizeActsImpl<false>(x, k, k_stride, qs, nullptr, d, qsum);
}
void QuantizeActs16(const float* x, int64_t k, int64_t k_stride, int8_t* hi, uint8_t* lo, float* d, int32_t* qsum) {
  QuantizeActsImpl<true>(x, k, k_stride, hi, lo, d, qsum);
}

// Pairs rotated 4 at a time: x * (c, c) + swap(x) * (s, s) with the even lanes' second term
// negated (an exact sign flip), so each lane is the scalar path's two rounded products summed.
void RopeApply(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin) {
  const __m256 even_sign = _mm256_castsi256_ps(_mm256_set1_epi64x(0x0000000080000000LL));
  const int vec_dims = rope_dims / 8 * 8;
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + h * head_dim;
    for (int i = 0; i < vec_dims; i += 8) {
      const __m256 xv = _mm256_loadu_ps(v + i), cs = _mm256_loadu_ps(cos_sin + i);
      const __m256 t = _mm256_xor_ps(_mm256_mul_ps(_mm256_permute_ps(xv, 0xB1), _mm256_movehdup_ps(cs)), even_sign);
      _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_mul_ps(xv, _mm256_moveldup_ps(cs)), t));
    }
    if (vec_dims < rope_dims) RopeApplyReference(v + vec_dims, 1, head_dim, rope_dims - vec_dims, cos_sin + vec_dims);
  }
}

// ---- GEMM: 2 rows x 2 tokens per tile (16 ymm registers bound the tile) -------------------------

// W4A16 rows: element i of group i / G is d * q + m (symmetric types: m = -8 d), q the low
// (elements 0-15 of a 32-element run) or high (16-31) nibble of the run's 16 bytes: the same two
// roundings as the dequantizers (mul, then add), so a product equals dequantize-then-f32 bitwise.
template <GgmlType kType>
inline __m256 LoadW4A16x8(const uint8_t* row, int64_t i) {
  constexpr int G = kW4A16Group<kType>;
  constexpr bool kZ = kW4A16Zero<kType>;
  const auto* blk = reinterpret_cast<const BlockW4<G, kZ>*>(row) + i / G;
  const float d = _cvtsh_ss(blk->d);
  float m = -8.0f * d;
  if constexpr (kZ) m = _cvtsh_ss(blk->m);
  const int64_t j = i % 32;  // within the run; i is a multiple of 8
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk->qs + 16 * ((i % G) / 32) + (j & 15)));
  if (j >= 16) b = _mm_srli_epi16(b, 4);
  const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(0x0f))));
  return _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(d), q), _mm256_set1_ps(m));
}

// F8E4M3 rows: 8 e4m3 bytes at i (a multiple of 8) of block i / 32, sign-extended to 16 bits and
// shifted left 7: the sign lands in bit 15 (and 14, cleared), the 7 low bits in an f16's exponent
// and mantissa, which is the value times 2^-8 (subnormals too: f16's exponent bias is 8 more), so
// F16C converts it exactly; times 2^8 times the block's scale (one factor while it is a float:
// scale exponents to 2^119), the dequantizer's one rounding.
inline __m256 LoadF8x8(const uint8_t* row, int64_t i) {
  const auto* blk = reinterpret_cast<const BlockF8E4M3*>(row) + i / 32;
  const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk->qs + i % 32)));
  const __m256 v = _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16(-0x4001)));
  if (blk->e <= 246) [[likely]] return _mm256_mul_ps(v, _mm256_set1_ps(E8M0ToFp32(static_cast<uint8_t>(blk->e + 8))));
  return _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(256.0f)), _mm256_set1_ps(E8M0ToFp32(blk->e)));
}

// Types whose rows a float product decodes (rather than reads as floats): whole blocks, no tail.
template <GgmlType kType>
constexpr bool kDecodedFloat = kW4A16Group<kType> > 0 || kType == GgmlType::kF8E4M3;

template <GgmlType kType>
inline __m256 LoadW8(const uint8_t* row, int64_t i) {
  if constexpr (kW4A16Group<kType> > 0) {
    return LoadW4A16x8<kType>(row, i);
  } else if constexpr (kType == GgmlType::kF8E4M3) {
    return LoadF8x8(row, i);
  } else if constexpr (kType == GgmlType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (kType == GgmlType::kF16) {
    return LoadF16x8(reinterpret_cast<const uint16_t*>(row) + i);
  } else {
    return LoadBf16x8(reinterpret_cast<const uint16_t*>(row) + i);
  }
}

template <GgmlType kType>
inline float ScalarW(const uint8_t* row, int64_t i) {
  static_assert(!kDecodedFloat<kType>, "W4 and F8 rows are whole blocks: no tail");
  if constexpr (kType == GgmlType::kF32) return reinterpret_cast<const float*>(row)[i];
  else if constexpr (kType == GgmlType::kF16) return Fp16ToFp32(reinterpret_cast<const uint16_t*>(row)[i]);
  else return Bf16ToFp32(reinterpret_cast<const uint16_t*>(row)[i]);
}

// A float tile over elements [k0, k1) only: its R x T lane accumulators start from part (or zero
// when k0 == 0) and go back there, except after the last range (k1 == k), which reduces them and
// adds the scalar tail into y. Ranges end at multiples of 8 but the last, so chained over
// ascending ranges every output sees the operations of one pass over [0, k) in the same order:
// bitwise the same result. kWhole: that one pass, prefetching the next tile's rows.
template <GgmlType kType, int R, int T, bool kWhole>
void TileFloatRange(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const float* x, int64_t k,
                    int64_t k0, int64_t k1, __m256* part, float* y, int64_t ldy) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      acc[r][t] = kWhole || k0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(reinterpret_cast<float*>(part + r * T + t));
  const uint8_t* rows = w + r0 * row_bytes;
  const float* xs = x + t0 * k;
  int64_t i = k0;
  // Elements per 64-byte line (W4A16: about two per byte, F8: about one) and a line's byte offset
  // in a row.
  constexpr int64_t kPerLine = kType == GgmlType::kF32 ? 16 : kW4A16Group<kType> > 0 ? 128
                                                         : kType == GgmlType::kF8E4M3 ? 64 : 32;
  for (; i + 8 <= k1; i += 8) {
    if (kWhole && (i & (kPerLine - 1)) == 0) {  // the next tile's rows, a line at a time (see the AVX-512 tile)
      const int64_t at = kType == GgmlType::kF8E4M3 ? i / 32 * 33 : i / kPerLine * 64;
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows + (R + r) * row_bytes + at), _MM_HINT_T0);
      }
    }
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadW8<kType>(rows + r * row_bytes, i);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(xs + t * k + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (!kWhole && k1 < k) {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) _mm256_store_ps(reinterpret_cast<float*>(part + r * T + t), acc[r][t]);
    return;
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      float sum = HSum(acc[r][t]);
      if constexpr (!kDecodedFloat<kType>) {
        for (int64_t j = i; j < k; ++j) sum += ScalarW<kType>(rows + r * row_bytes, j) * xs[t * k + j];
      }
      y[(t0 + t) * ldy + r0 + r] = sum;
    }
  }
}

template <GgmlType kType, int R, int T>
void TileFloat(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
               int64_t ldy) {
  TileFloatRange<kType, R, T, true>(r0, t0, w, row_bytes, x, k, 0, k, nullptr, y, ldy);
}

using TileFloatRangeFn = void (*)(int64_t, int64_t, const uint8_t*, int64_t, const float*, int64_t, int64_t, int64_t,
                                  __m256*, float*, int64_t);

using TileFloatFn = void (*)(int64_t, int64_t, const uint8_t*, int64_t, const float*, int64_t, float*, int64_t);

constexpr int64_t kKc = 1024;  // elements per range of a blocked float product

// Several token tiles over long f32 rows (or rows converted to f32): a tile's rows and activations
// no longer fit L1 and a 64-token block of activations overflows L2 (TinyLlama's 5,632-long rows:
// 1.4 MB). Blocked as the AVX-512 product is: per token block, block of kMc rows and range of kKc
// elements, the lane accumulators waiting in scratch between ranges.
void GemmFloatBlocked(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const float* x, int64_t k,
                      int64_t num_tokens, float* y, int64_t ldy) {
  constexpr GgmlType kType = GgmlType::kF32;
  static constexpr TileFloatRangeFn kRange[3][4] = {
      {TileFloatRange<kType, 1, 1, false>, TileFloatRange<kType, 1, 2, false>, TileFloatRange<kType, 1, 3, false>,
       TileFloatRange<kType, 1, 4, false>},
      {TileFloatRange<kType, 2, 1, false>, TileFloatRange<kType, 2, 2, false>, TileFloatRange<kType, 2, 3, false>,
       TileFloatRange<kType, 2, 4, false>},
      {TileFloatRange<kType, 3, 1, false>, TileFloatRange<kType, 3, 2, false>, TileFloatRange<kType, 3, 3, false>,
       TileFloatRange<kType, 3, 4, false>}};
  constexpr int64_t kR = 3, kT = 4, kTokenBlock = 64, kMc = 48;
  constexpr int64_t kTokenTiles = kTokenBlock / kT, kRowTiles = kMc / kR;
  // [row tile][token tile][R*T]
  __m256* parts = reinterpret_cast<__m256*>(TileScratch(kRowTiles * kTokenTiles * kR * kT * 8));
  for (int64_t t0 = 0; t0 < num_tokens; t0 += kTokenBlock) {
    const int64_t t1 = t0 + kTokenBlock < num_tokens ? t0 + kTokenBlock : num_tokens;
    for (int64_t m0 = 0; m0 < num_rows; m0 += kMc) {
      const int64_t m1 = m0 + kMc < num_rows ? m0 + kMc : num_rows;
      for (int64_t k0 = 0; k0 < k; k0 += kKc) {
        const int64_t k1 = k0 + kKc < k ? k0 + kKc : k;
        for (int64_t t = t0; t < t1; t += kT) {
          const int tt = static_cast<int>(t1 - t < kT ? t1 - t : kT);
          for (int64_t r = m0; r < m1; r += kR) {
            const int rr = static_cast<int>(m1 - r < kR ? m1 - r : kR);
            __m256* part = parts + (((r - m0) / kR) * kTokenTiles + (t - t0) / kT) * (kR * kT);
            kRange[rr - 1][tt - 1](r, t, w, row_bytes, x, k, k0, k1, part, y, ldy);
          }
        }
      }
    }
  }
}

template <GgmlType kType>
void GemmFloat(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const float* x, int64_t k, int64_t num_tokens,
               float* y, int64_t ldy) {
  // Up to 3 rows x 4 tokens: 12 accumulators, 3 weight registers and 1 activation register of
  // AVX2's 16, so 7 loads feed 12 FMAs.
  static constexpr TileFloatFn kTiles[3][4] = {
      {TileFloat<kType, 1, 1>, TileFloat<kType, 1, 2>, TileFloat<kType, 1, 3>, TileFloat<kType, 1, 4>},
      {TileFloat<kType, 2, 1>, TileFloat<kType, 2, 2>, TileFloat<kType, 2, 3>, TileFloat<kType, 2, 4>},
      {TileFloat<kType, 3, 1>, TileFloat<kType, 3, 2>, TileFloat<kType, 3, 3>, TileFloat<kType, 3, 4>}};
  if constexpr (kType != GgmlType::kF32) {
    // More than one token tile: each row would be converted once per tile, so convert blocks of
    // rows to f32 once (the same values: conversion to f32 is exact) and run the f32 tiles over
    // them; bitwise the same sums, tail included (ScalarW converts, then multiplies).
    if (num_tokens > 4) {
      constexpr int64_t kRowBlock = 24;
      float* rows = TileScratch<1>(kRowBlock * k);  // slot 0: the f32 product's accumulators
      for (int64_t r0 = 0; r0 < num_rows; r0 += kRowBlock) {
        const int64_t n = num_rows - r0 < kRowBlock ? num_rows - r0 : kRowBlock;
        for (int64_t r = 0; r < n; ++r) {
          const uint8_t* src = w + (r0 + r) * row_bytes;
          int64_t i = 0;
          for (; i + 8 <= k; i += 8) _mm256_storeu_ps(rows + r * k + i, LoadW8<kType>(src, i));
          if constexpr (!kDecodedFloat<kType>) {
            for (; i < k; ++i) rows[r * k + i] = ScalarW<kType>(src, i);
          }
        }
        GemmFloat<GgmlType::kF32>(reinterpret_cast<const uint8_t*>(rows), k * 4, n, x, k, num_tokens, y + r0, ldy);
      }
      return;
    }
  }
  if (kType != GgmlType::kF32 || num_tokens <= 4 || k <= kKc) {
    ForEachTile(num_rows, num_tokens, kTiles, w, row_bytes, x, k, y, ldy);
    return;
  }
  if constexpr (kType == GgmlType::kF32) GemmFloatBlocked(w, row_bytes, num_rows, x, k, num_tokens, y, ldy);
}

// F16C conversion: round to nearest even, NaNs quieted with their top payload bits, as
// Fp32ToFp16 does.
void ToF16(const float* x, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = Fp32ToFp16(x[i]);
}

// Integer round-to-nearest-even on the bit pattern, NaNs quieted: exactly Fp32ToBf16 (bf16 KV
// writes).
void ToBf16(const float* x, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    // |u| < 2^31, so the signed compare is the unsigned one.
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);  // every lane < 2^16
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  for (; i < n; ++i) dst[i] = Fp32ToBf16(x[i]);
}

}  // namespace

const KernelTable& Avx2TableWithoutVnni() {
  static const KernelTable table = {
      Isa::kAvx2,
      {DotF32, DotF16, DotBF16, DotQ8_0, DotQ4_0},
      {DequantF32, DequantF16, DequantBF16, DequantQ8_0, DequantQ4_0, DequantQ4_K, DequantQ5_K, DequantQ6_K,
       GALE_W4_DEQUANT_REFERENCE, GALE_LATER_DEQUANT_REFERENCE},
      {GemmFloat<GgmlType::kF32>, GemmFloat<GgmlType::kF16>, GemmFloat<GgmlType::kBF16>, nullptr, nullptr, nullptr,
       nullptr, nullptr, GemmFloat<GgmlType::kW4A16G64>, GemmFloat<GgmlType::kW4A16G128>,
       GemmFloat<GgmlType::kW4A16ZG64>, GemmFloat<GgmlType::kW4A16ZG128>, nullptr, nullptr, nullptr, nullptr,
       nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, GemmFloat<GgmlType::kF8E4M3>},
      {nullptr, nullptr, nullptr, GemmQuant<GgmlType::kQ8_0, false>, GemmQuant<GgmlType::kQ4_0, false>, GemmQuantK<GgmlType::kQ4_K, false>,
       GemmQuantK<GgmlType::kQ5_K, false>, GemmQuantK<GgmlType::kQ6_K, false>, nullptr, nullptr, nullptr, nullptr,
       GemmQuant<GgmlType::kW4A8G64, false>, GemmQuant<GgmlType::kW4A8G128, false>,
       GemmQuant<GgmlType::kQ4_1, false>, GemmQuant<GgmlType::kQ5_0, false>, GemmQuant<GgmlType::kQ5_1, false>,
       GemmQuantK<GgmlType::kQ3_K, false>, GemmQuantK<GgmlType::kQ2_K, false>, GemmQuant<GgmlType::kIQ4_NL, false>,
       GemmQuant<GgmlType::kIQ4_XS, false>, GemmQuant<GgmlType::kMXFP4, false>},
      {}, {}, {}, {}, {},
      RmsNorm,
      SiluMul,
      Axpy,
      ToF16,
      ToBf16,
      Avx2AttendMany,
      SoftmaxReference,
      RopeApply,
      GeluMul,
      RopeApplyNeoxAvx2,
      ArgMax,
      ExpShifted,
      QuantizeActs,
      QuantizeActs16,
      DeltaRule,
  };
  return table;
}

const KernelTable& Avx2Table() {
  static const KernelTable table = [] {
    KernelTable t = Avx2TableWithoutVnni();
    if (GetCpuFeatures().HasAvxVnni()) Avx2FillVnni(t);
    return t;
  }();
  return table;
}

}  // namespace gale::kernels
