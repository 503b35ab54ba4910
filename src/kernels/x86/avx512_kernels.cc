// AVX-512 kernels (16 floats per vector; F/BW/VL/DQ, plus VNNI and BF16 available for the int8
// and bf16 paths of the kernels issue). Built with its own flags; only called when CPUID agrees.
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "base/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"
#include "kernels/x86/gemm_tiles.h"

#include <vector>

namespace gale::kernels {
namespace {

inline __m512 LoadF16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 LoadBf16x16(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <typename Elem, typename Load16, typename Scalar>
inline float DotGeneric(const Elem* a, const float* x, int64_t n, Load16 load16, Scalar scalar) {
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(load16(a + i), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(load16(a + i + 16), _mm512_loadu_ps(x + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(load16(a + i), _mm512_loadu_ps(x + i), acc0);
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += scalar(a[i]) * x[i];
  return sum;
}

float DotF32(const void* w, const float* x, int64_t n) {
  return DotGeneric(static_cast<const float*>(w), x, n, [](const float* p) { return _mm512_loadu_ps(p); },
                    [](float v) { return v; });
}
float DotF16(const void* w, const float* x, int64_t n) {
  return DotGeneric(static_cast<const uint16_t*>(w), x, n, LoadF16x16, Fp16ToFp32);
}
float DotBF16(const void* w, const float* x, int64_t n) {
  return DotGeneric(static_cast<const uint16_t*>(w), x, n, LoadBf16x16, Bf16ToFp32);
}

inline __m512 I8x16ToF32(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }

float DotQ8_0(const void* w, const float* x, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(w);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float* xb = x + i * kQK8_0;
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16));
    __m512 s = _mm512_mul_ps(I8x16ToF32(q0), _mm512_loadu_ps(xb));
    s = _mm512_fmadd_ps(I8x16ToF32(q1), _mm512_loadu_ps(xb + 16), s);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(Fp16ToFp32(b[i].d)), s, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

float DotQ4_0(const void* w, const float* x, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(w);
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i eight = _mm_set1_epi8(8);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const float* xb = x + i * kQK4_0;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);
    __m512 s = _mm512_mul_ps(I8x16ToF32(lo), _mm512_loadu_ps(xb));
    s = _mm512_fmadd_ps(I8x16ToF32(hi), _mm512_loadu_ps(xb + 16), s);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(Fp16ToFp32(b[i].d)), s, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

void DequantF32(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kF32, src, dst, n); }
void DequantF16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LoadF16x16(s + i));
  for (; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
}
void DequantBF16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LoadBf16x16(s + i));
  for (; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
}
void DequantQ8_0(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ8_0, src, dst, n); }
void DequantQ4_0(const void* src, float* dst, int64_t n) { DequantizeRowRef(GgmlType::kQ4_0, src, dst, n); }

// K-quant dequantizers: the reference's arithmetic (mul then sub, no FMA) 16 lanes at a time, so
// the results are bit-identical to DequantizeRowRef.
inline __m512 U8x16ToF32(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }

// One Q4_K/Q5_K group: 32 codes in lo (scale d1, min m1), 32 in hi (d2, m2), as d * q - m.
inline void StoreKGroup(float* y, __m256i lo, __m256i hi, const KGroupScales& sc) {
  const __m512 d1 = _mm512_set1_ps(sc.d1), m1 = _mm512_set1_ps(sc.m1);
  const __m512 d2 = _mm512_set1_ps(sc.d2), m2 = _mm512_set1_ps(sc.m2);
  _mm512_storeu_ps(y, _mm512_sub_ps(_mm512_mul_ps(d1, U8x16ToF32(_mm256_castsi256_si128(lo))), m1));
  _mm512_storeu_ps(y + 16, _mm512_sub_ps(_mm512_mul_ps(d1, U8x16ToF32(_mm256_extracti128_si256(lo, 1))), m1));
  _mm512_storeu_ps(y + 32, _mm512_sub_ps(_mm512_mul_ps(d2, U8x16ToF32(_mm256_castsi256_si128(hi))), m2));
  _mm512_storeu_ps(y + 48, _mm512_sub_ps(_mm512_mul_ps(d2, U8x16ToF32(_mm256_extracti128_si256(hi, 1))), m2));
}

// W4 groups: per 16-byte run, low nibbles are elements 0-15, high nibbles 16-31; x = d * q + m
// (symmetric types: m = -8 d). The same two roundings as the scalar d * q + m (fmadd rounds
// once, so use mul then add).
template <int G, bool kZ>
void DequantW4(const void* src, float* dst, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  constexpr int64_t kBytes = sizeof(BlockW4<G, kZ>);
  for (int64_t g = 0; g < n / G; ++g, p += kBytes) {
    const auto* blk = reinterpret_cast<const BlockW4<G, kZ>*>(p);
    const float d = Fp16ToFp32(blk->d);
    float m = -8.0f * d;
    if constexpr (kZ) m = Fp16ToFp32(blk->m);
    const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
    for (int s = 0; s < G / 32; ++s) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs + 16 * s));
      const __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f));
      float* out = dst + g * G + 32 * s;
      _mm512_storeu_ps(out, _mm512_add_ps(_mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo))), mv));
      _mm512_storeu_ps(out + 16, _mm512_add_ps(_mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi))), mv));
    }
  }
}

void DequantQ4_K(const void* src, float* dst, int64_t n) {
  const BlockQ4_K* b = static_cast<const BlockQ4_K*>(src);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    const float dmin = Fp16ToFp32(b[i].dmin);
    float* y = dst + i * kQK_K;
    for (int g = 0; g < 4; ++g) {
      const KGroupScales sc = KQuantGroupScales(d, dmin, b[i].scales, g);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * g));
      const __m256i lo = _mm256_and_si256(q, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      StoreKGroup(y + 64 * g, lo, hi, sc);
    }
  }
}

void DequantQ5_K(const void* src, float* dst, int64_t n) {
  const BlockQ5_K* b = static_cast<const BlockQ5_K*>(src);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    const float dmin = Fp16ToFp32(b[i].dmin);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qh));
    float* y = dst + i * kQK_K;
    for (int g = 0; g < 4; ++g) {
      const KGroupScales sc = KQuantGroupScales(d, dmin, b[i].scales, g);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * g));
      // Fifth bits: bit 2g of qh for the low half, bit 2g+1 for the high half.
      const __m256i bit_lo = _mm256_set1_epi8(static_cast<char>(1 << (2 * g)));
      const __m256i bit_hi = _mm256_set1_epi8(static_cast<char>(1 << (2 * g + 1)));
      const __m256i h_lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_lo), bit_lo), sixteen);
      const __m256i h_hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit_hi), bit_hi), sixteen);
      const __m256i lo = _mm256_add_epi8(_mm256_and_si256(q, low4), h_lo);
      const __m256i hi = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4), h_hi);
      StoreKGroup(y + 64 * g, lo, hi, sc);
    }
  }
}

void DequantQ6_K(const void* src, float* dst, int64_t n) {
  const BlockQ6_K* b = static_cast<const BlockQ6_K*>(src);
  const __m256i low4 = _mm256_set1_epi8(0x0f), three = _mm256_set1_epi8(3), bias = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b[i].ql + 64 * half;
      const uint8_t* qhp = b[i].qh + 32 * half;
      const int8_t* sc = b[i].scales + 8 * half;
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qhp));
      auto high = [&](int shift) {
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), three), 4);
      };
      // q[k] holds elements 32k .. 32k+31 of this half, as signed values q - 32.
      const __m256i q[4] = {
          _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(l0, low4), high(0)), bias),
          _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(l1, low4), high(2)), bias),
          _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), high(4)), bias),
          _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), high(6)), bias)};
      float* y = dst + i * kQK_K + 128 * half;
      for (int k = 0; k < 4; ++k) {
        for (int part = 0; part < 2; ++part) {
          const __m128i bytes = part == 0 ? _mm256_castsi256_si128(q[k]) : _mm256_extracti128_si256(q[k], 1);
          const __m512 scale = _mm512_set1_ps(d * sc[part + 2 * k]);
          _mm512_storeu_ps(y + 32 * k + 16 * part,
                           _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes))));
        }
      }
    }
  }
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  float ss = _mm512_reduce_add_ps(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  const __m512 vs = _mm512_set1_ps(ss);
  for (i = 0; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(vs, _mm512_loadu_ps(x + i))));
  }
  for (; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

// exp(x) for 16 lanes, within about 2 ulp of expf for x in [-87, 88]; exp(-inf) and anything
// below -87.3 give a tiny positive or zero value. Range reduction x = n ln2 + r, |r| <= ln2 / 2,
// a degree-6 Taylor polynomial for e^r (truncation error < 2e-7 relative), then scale by 2^n.
inline __m512 Exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 split in two for accuracy
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// expf of 8 floats the way glibc's expf computes it on x86-64 CPUs with FMA (the ARM
// optimized-routines algorithm: x * 32 / ln 2 = k + r, 2^(k/32) from a 32-entry table of
// 2^(i/32) with k / 32 added to the exponent, a degree-3 polynomial in r, all in double, one
// rounding to float), so SiluMul stays bitwise the scalar path, whose std::exp is that glibc
// function (tested on millions of inputs; Exp16's extra ulp here moved stories260K's logits past
// the 1e-5 reference tolerance). Inputs are clamped to [-104, 89] (where the result is 0 or inf
// anyway); NaN passes through.
// table: ExpfTable32(), fetched by the caller outside its loops (a call there makes the compiler
// spill every live vector register around it).
inline __m256 ExpfLikeLibm(__m256 xf, const uint64_t* table) {
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(xf, _mm256_set1_ps(-104.0f)), _mm256_set1_ps(89.0f));
  const __m512d x = _mm512_cvtps_pd(xc);
  const __m512d shift = _mm512_set1_pd(0x1.8p+52);
  const __m512d z = _mm512_mul_pd(_mm512_set1_pd(0x1.71547652b82fep+0 * 32), x);
  __m512d kd = _mm512_add_pd(z, shift);  // k in the low bits of kd's mantissa
  const __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, shift);
  const __m512d r = _mm512_sub_pd(z, kd);
  const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
  const __m512i lo = _mm512_permutex2var_epi64(_mm512_load_si512(table), idx, _mm512_load_si512(table + 8));
  const __m512i hi = _mm512_permutex2var_epi64(_mm512_load_si512(table + 16), idx, _mm512_load_si512(table + 24));
  __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), lo, hi);
  t = _mm512_add_epi64(t, _mm512_slli_epi64(ki, 47));  // 2^(k/32): k's high bits into the exponent
  const __m512d c0 = _mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32);
  const __m512d c1 = _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32);
  const __m512d c2 = _mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32);
  const __m512d p = _mm512_fmadd_pd(c0, r, c1);
  __m512d y = _mm512_fmadd_pd(c2, r, _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(p, _mm512_mul_pd(r, r), y);
  y = _mm512_mul_pd(y, _mm512_castsi512_pd(t));
  return _mm256_blendv_ps(_mm512_cvtpd_ps(y), xf, _mm256_cmp_ps(xf, xf, _CMP_UNORD_Q));
}

void SiluMul(float* gate, const float* up, int64_t n) {
  // Per element exactly the scalar path's float operations: v * (1 / (1 + exp(-v))) * up.
  const __m512 one = _mm512_set1_ps(1.0f);
  const uint64_t* table = ExpfTable32();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(gate + i);
    const __m512 neg = _mm512_xor_ps(v, _mm512_set1_ps(-0.0f));
    const __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(ExpfLikeLibm(_mm512_castps512_ps256(neg), table)),
                                        ExpfLikeLibm(_mm512_extractf32x8_ps(neg, 1), table), 1);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_mul_ps(v, s), _mm512_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    float v = gate[i];
    v *= 1.0f / (1.0f + std::exp(-v));
    gate[i] = v * up[i];
  }
}

// Pairs rotated 8 at a time: x * (c, c) + swap(x) * (s, s) with the even lanes' second term
// negated (an exact sign flip), so each lane is the scalar path's two rounded products summed.
void RopeApply(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin) {
  const __m512 even_sign = _mm512_castsi512_ps(_mm512_set1_epi64(0x0000000080000000LL));
  const int vec_dims = rope_dims / 16 * 16;
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + h * head_dim;
    for (int i = 0; i < vec_dims; i += 16) {
      const __m512 xv = _mm512_loadu_ps(v + i), cs = _mm512_loadu_ps(cos_sin + i);
      const __m512 t = _mm512_xor_ps(_mm512_mul_ps(_mm512_permute_ps(xv, 0xB1), _mm512_movehdup_ps(cs)), even_sign);
      _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_mul_ps(xv, _mm512_moveldup_ps(cs)), t));
    }
    if (vec_dims < rope_dims) RopeApplyReference(v + vec_dims, 1, head_dim, rope_dims - vec_dims, cos_sin + vec_dims);
  }
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}


// ---- GEMM, float weights: 4 rows x 4 tokens per tile, 16 elements per step --------------------

// W4A16 types in the float GEMM: 16 elements (i a multiple of 16, rows a multiple of the group,
// so never masked) are the low or high nibbles of a 16-byte run, as d * q + m.
template <GgmlType kType>
constexpr int kW4A16Group = kType == GgmlType::kW4A16G64 || kType == GgmlType::kW4A16ZG64 ? 64
                            : kType == GgmlType::kW4A16G128 || kType == GgmlType::kW4A16ZG128 ? 128 : 0;
template <GgmlType kType>
constexpr bool kW4A16Zero = kType == GgmlType::kW4A16ZG64 || kType == GgmlType::kW4A16ZG128;

template <GgmlType kType, bool kMasked>
inline __m512 LoadW16(const uint8_t* row, int64_t i, __mmask16 m) {
  if constexpr (kType == GgmlType::kF32) {
    const float* p = reinterpret_cast<const float*>(row) + i;
    return kMasked ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p);
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + i;
    const __m256i h = kMasked ? _mm256_maskz_loadu_epi16(m, p) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (kType == GgmlType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Stores the horizontal sums of a tile's lane accumulators: y[t * ldy + r] = sum of acc[r][t]'s
// lanes, each summed exactly as _mm512_reduce_add_ps does (lane i + lane i+8, then + 4, + 2,
// + 1), so every path gives the same bits. Four rows by four tokens go through one transposed
// tree (15 shuffle pairs and adds for 16 sums, instead of ~8 instructions per sum; on a 4x6 f16
// tile at k = 768 the separate reductions were ~12% of the tile's instructions); the rest one by one.
template <int R, int T>
inline void StoreTileSums(const __m512 (&acc)[R][T], float* y, int64_t ldy) {
  int t0 = 0;
  if constexpr (R == 4) {
    for (; t0 + 4 <= T; t0 += 4) {
      __m512 p[8], q[4], h[2];
      // v[4j + c] = acc[j][t0 + c]: row j of token c.
      for (int m = 0; m < 8; ++m) {
        const __m512 a = acc[(2 * m) / 4][t0 + (2 * m) % 4], b = acc[(2 * m + 1) / 4][t0 + (2 * m + 1) % 4];
        p[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0xEE), _mm512_shuffle_f32x4(a, b, 0x44));  // i + 8
      }
      for (int m = 0; m < 4; ++m) {  // i + 4
        q[m] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * m], p[2 * m + 1], 0xDD),
                             _mm512_shuffle_f32x4(p[2 * m], p[2 * m + 1], 0x88));
      }
      for (int m = 0; m < 2; ++m) {  // i + 2
        h[m] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * m], q[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                             _mm512_shuffle_ps(q[2 * m], q[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)));
      }
      // i + 1: lane 4c + j is the sum of v[4j + c], so 128-bit chunk c holds token c's four rows.
      const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(h[0], h[1], _MM_SHUFFLE(3, 1, 3, 1)),
                                     _mm512_shuffle_ps(h[0], h[1], _MM_SHUFFLE(2, 0, 2, 0)));
      _mm_storeu_ps(y + (t0 + 0) * ldy, _mm512_extractf32x4_ps(f, 0));
      _mm_storeu_ps(y + (t0 + 1) * ldy, _mm512_extractf32x4_ps(f, 1));
      _mm_storeu_ps(y + (t0 + 2) * ldy, _mm512_extractf32x4_ps(f, 2));
      _mm_storeu_ps(y + (t0 + 3) * ldy, _mm512_extractf32x4_ps(f, 3));
    }
  }
  for (int t = t0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

// One 16-element step of a float tile: every output gets one FMA (the tail step is masked).
template <GgmlType kType, int R, int T, bool kMasked>
inline void StepFloat(const uint8_t* rows, int64_t row_bytes, const float* xs, int64_t k, int64_t i, __mmask16 m,
                      __m512 (&acc)[R][T]) {
  __m512 wv[R];
  for (int r = 0; r < R; ++r) wv[r] = LoadW16<kType, kMasked>(rows + r * row_bytes, i, m);
  for (int t = 0; t < T; ++t) {
    const __m512 xv = kMasked ? _mm512_maskz_loadu_ps(m, xs + t * k + i) : _mm512_loadu_ps(xs + t * k + i);
    for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
  }
}

// A float tile over elements [k0, k1) only: its R x T lane accumulators start from part (or zero
// when k0 == 0) and go back there, except after the last range (k1 == k), which reduces them into
// y. Chained over ascending ranges, every lane sees the FMAs of one pass over [0, k) in the same
// order, so the result is bitwise the same.
// kPrefetch: each cache line of this tile's rows comes with a prefetch of the same line of the
// next tile's rows (the rows just below): decode reads every weight once, and the hardware
// prefetcher alone left F16/BF16 decode at ~50% of the bandwidth roofline (~90% with this).
// Prefetches never fault, so the last tile's reach past the matrix is harmless.
template <GgmlType kType, int R, int T, bool kPrefetch>
void TileFloatRange(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, int64_t k0,
                    int64_t k1, __m512* part, float* y, int64_t ldy) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(part + r * T + t);
  const uint8_t* rows = w + r0 * row_bytes;
  const float* xs = x + t0 * k;
  constexpr int64_t kEl = kType == GgmlType::kF32 ? 4 : 2;
  int64_t i = k0;
  for (; i + 16 <= k1; i += 16) {
    if (kPrefetch && (i & (64 / kEl - 1)) == 0) {
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows + (R + r) * row_bytes + i * kEl), _MM_HINT_T0);
      }
    }
    StepFloat<kType, R, T, false>(rows, row_bytes, xs, k, i, 0, acc);
  }
  if (i < k1) StepFloat<kType, R, T, true>(rows, row_bytes, xs, k, i, static_cast<__mmask16>((1u << (k1 - i)) - 1), acc);
  if (k1 < k) {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) _mm512_store_ps(part + r * T + t, acc[r][t]);
    return;
  }
  StoreTileSums(acc, y + t0 * ldy + r0, ldy);
}

// A whole row tile in one pass, prefetching the next tile's rows.
template <GgmlType kType, int R, int T>
void TileFloat(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
               int64_t ldy) {
  TileFloatRange<kType, R, T, true>(r0, t0, w, row_bytes, x, k, 0, k, nullptr, y, ldy);
}

using TileFloatFn = void (*)(int64_t, int64_t, const uint8_t*, int64_t, const float*, int64_t, float*, int64_t);

// W4A16 with bf16 activations (AVX512-BF16): each token's activations are rounded to bf16 once
// per call, with each group's f32 sum (for the zero-point offset); a 32-weight run becomes 32 bf16
// integers by one table lookup (symmetric types: q - 8, so no offset term), and vdpbf16ps sums
// weight x activation pairs in f32. Per group: acc += d * run sums, and the offset's m * sum(x).
// Weights are exact in bf16; activations carry bf16 rounding (the A16 allows bf16).
struct W4Acts {
  const uint16_t* bf16;  // [num_tokens, k]
  const float* group_sums;  // [num_tokens, k / G]
};

template <GgmlType kType, int R, int T>
void TileW4(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const float* xa, int64_t k, float* y,
            int64_t ldy) {
  constexpr int G = kW4A16Group<kType>;
  constexpr bool kZ = kW4A16Zero<kType>;
  const W4Acts& acts = *reinterpret_cast<const W4Acts*>(xa);
  const int64_t ng = k / G;
  __m512 acc[R][T];
  float off[R][T] = {};
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint8_t* rows = w + r0 * row_bytes;
  // bf16 of 0..15 (zero point) or -8..7 (symmetric), indexed by the nibble.
  alignas(64) static const uint16_t kTable[2][32] = {
      {0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0,
       0x40C0, 0x40E0},
      {0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150,
       0x4160, 0x4170}};
  const __m512i table = _mm512_load_si512(kTable[kZ ? 1 : 0]);
  for (int64_t g = 0; g < ng; ++g) {
    const BlockW4<G, kZ>* blk[R];
    __m512 part[R][T];
    for (int r = 0; r < R; ++r) {
      blk[r] = reinterpret_cast<const BlockW4<G, kZ>*>(rows + r * row_bytes) + g;
      for (int t = 0; t < T; ++t) part[r][t] = _mm512_setzero_ps();
    }
    for (int s = 0; s < G / 32; ++s) {
      __m512bh wv[R];
      for (int r = 0; r < R; ++r) {
        const __m256i b16 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[r]->qs + 16 * s)));
        const __m512i nib = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b16, _mm256_set1_epi16(0x0f))),
                                               _mm256_srli_epi16(b16, 4), 1);
        wv[r] = (__m512bh)_mm512_permutexvar_epi16(nib, table);
      }
      const int64_t i = g * G + 32 * s;
      for (int t = 0; t < T; ++t) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(acts.bf16 + (t0 + t) * k + i);
        for (int r = 0; r < R; ++r) part[r][t] = _mm512_dpbf16_ps(part[r][t], wv[r], xv);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 dv = _mm512_set1_ps(_cvtsh_ss(blk[r]->d));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(dv, part[r][t], acc[r][t]);
      if constexpr (kZ) {
        const float m = _cvtsh_ss(blk[r]->m);
        for (int t = 0; t < T; ++t) off[r][t] += m * acts.group_sums[(t0 + t) * ng + g];
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[(t0 + t) * ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][t]) + off[r][t];
}

template <GgmlType kType>
void GemmW4A16(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const float* x, int64_t k, int64_t num_tokens,
               float* y, int64_t ldy) {
  constexpr int G = kW4A16Group<kType>;
  // NOTE: thread_local: each pool thread converts the activations for its own rows (the same
  // values on every thread, so a row's result does not depend on the split).
  thread_local std::vector<uint16_t> bf16;
  thread_local std::vector<float> sums;
  bf16.resize(static_cast<size_t>(num_tokens * k));
  sums.resize(static_cast<size_t>(num_tokens * (k / G)));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* xt = x + t * k;
    for (int64_t i = 0; i < k; i += 32) {
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xt + i + 16), _mm512_loadu_ps(xt + i));
      _mm512_storeu_si512(bf16.data() + t * k + i, (__m512i)v);
    }
    for (int64_t g = 0; g < k / G; ++g) {
      __m512 s = _mm512_setzero_ps();
      for (int64_t i = g * G; i < (g + 1) * G; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(xt + i));
      sums[t * (k / G) + g] = _mm512_reduce_add_ps(s);
    }
  }
  const W4Acts acts{bf16.data(), sums.data()};
  static constexpr TileFloatFn kTiles[4][4] = {
      {TileW4<kType, 1, 1>, TileW4<kType, 1, 2>, TileW4<kType, 1, 3>, TileW4<kType, 1, 4>},
      {TileW4<kType, 2, 1>, TileW4<kType, 2, 2>, TileW4<kType, 2, 3>, TileW4<kType, 2, 4>},
      {TileW4<kType, 3, 1>, TileW4<kType, 3, 2>, TileW4<kType, 3, 3>, TileW4<kType, 3, 4>},
      {TileW4<kType, 4, 1>, TileW4<kType, 4, 2>, TileW4<kType, 4, 3>, TileW4<kType, 4, 4>}};
  ForEachTile(num_rows, num_tokens, kTiles, w, row_bytes, reinterpret_cast<const float*>(&acts), k, y, ldy);
}

// Per-thread 64-byte aligned scratch of at least n floats (C allocation: no std:: template is
// instantiated in this translation unit).
float* TileScratch(int64_t n) {
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

// Tile tables R x T of a tile template, built at compile time: TileTable<Tile, kR, kT>::kFns.f[r-1][t-1]
// is Tile::template Fn<r, t>.
template <typename Tile, int kR, int kT>
struct TileTable {
  using Fn = decltype(&Tile::template Fn<1, 1>);
  struct Fns {
    Fn f[kR][kT];
  };
  template <int R, int... Ts>
  static constexpr void FillRow(Fn (&row)[kT], std::integer_sequence<int, Ts...>) {
    ((row[Ts] = &Tile::template Fn<R, Ts + 1>), ...);
  }
  template <int... Rs>
  static constexpr Fns Make(std::integer_sequence<int, Rs...>) {
    Fns t{};
    (FillRow<Rs + 1>(t.f[Rs], std::make_integer_sequence<int, kT>()), ...);
    return t;
  }
  static constexpr Fns kFns = Make(std::make_integer_sequence<int, kR>());
};

template <GgmlType kType>
struct FloatTiles {
  template <int R, int T>
  static void Fn(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, float* y,
                 int64_t ldy) {
    TileFloat<kType, R, T>(r0, t0, w, row_bytes, x, k, y, ldy);
  }
};
template <GgmlType kType>
struct FloatRangeTiles {
  template <int R, int T>
  static void Fn(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, int64_t k0,
                 int64_t k1, __m512* part, float* y, int64_t ldy) {
    TileFloatRange<kType, R, T, false>(r0, t0, w, row_bytes, x, k, k0, k1, part, y, ldy);
  }
};

template <GgmlType kType>
void GemmFloat(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const float* x, int64_t k, int64_t num_tokens,
               float* y, int64_t ldy) {
  constexpr int kR = 4, kT = 6;
  // Up to kKc elements, a single token tile (decode): one pass per tile, the next tile's rows
  // prefetched.
  constexpr int64_t kKc = 1024;
  if (num_tokens <= kT || k <= kKc) {
    ForEachTile(num_rows, num_tokens, TileTable<FloatTiles<kType>, kR, kT>::kFns.f, w, row_bytes, x, k, y, ldy);
    return;
  }
  // Several token tiles over long rows: a 4x4 tile's rows and activations no longer fit L1
  // together (single-thread F16 fell from ~180 GFLOP/s at k = 768 to ~110 at k = 5632). Blocked
  // as GEMMs are: per token block, row block of kMc rows and range of kKc elements, each token
  // tile's activations stay in L1 while the block's row tiles stream from L2, and the lane
  // accumulators wait in scratch between ranges (~147 GFLOP/s at k = 5632; kKc 256 or 512 and
  // row tiles outer measured slower).
  const auto& kRange = TileTable<FloatRangeTiles<kType>, kR, kT>::kFns.f;
  constexpr int64_t kTokenBlock = 64, kMc = 64;
  constexpr int64_t kTokenTiles = (kTokenBlock + kT - 1) / kT, kRowTiles = (kMc + kR - 1) / kR;
  // [row tile][token tile][R*T]
  __m512* parts = reinterpret_cast<__m512*>(TileScratch(kRowTiles * kTokenTiles * kR * kT * 16));
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
            __m512* part = parts + (((r - m0) / kR) * kTokenTiles + (t - t0) / kT) * (kR * kT);
            kRange[rr - 1][tt - 1](r, t, w, row_bytes, x, k, k0, k1, part, y, ldy);
          }
        }
      }
    }
  }
}

// ---- BF16 weights x bf16 activations (AVX512-BF16) -------------------------------------------
// vdpbf16ps multiplies 32 bf16 pairs into 16 f32 lanes per instruction, twice an f32 FMA's work.
// A tile of R rows x T tokens keeps R x T such accumulators; every output is reduced the same
// way whatever the tile, and rows prefetch the next tile's lines as the float tile does.

template <int R, int T, bool kMasked>
inline void StepBf16(const uint8_t* rows, int64_t row_bytes, const uint16_t* xs, int64_t k_stride, int64_t i,
                     __mmask32 m, __m512 (&acc)[R][T]) {
  __m512bh wv[R];
  for (int r = 0; r < R; ++r) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(rows + r * row_bytes) + i;
    wv[r] = (__m512bh)(kMasked ? _mm512_maskz_loadu_epi16(m, p) : _mm512_loadu_si512(p));
  }
  for (int t = 0; t < T; ++t) {
    // Activations are zero-padded to k_stride: no mask needed.
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(xs + t * k_stride + i);
    for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
  }
}

template <int R, int T>
void TileBf16(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const uint16_t* x, int64_t k, float* y,
              int64_t ldy) {
  const int64_t k_stride = (k + kBf16ActPad - 1) / kBf16ActPad * kBf16ActPad;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint8_t* rows = w + r0 * row_bytes;
  const uint16_t* xs = x + t0 * k_stride;
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(rows + (R + r) * row_bytes + i * 2), _MM_HINT_T0);
    StepBf16<R, T, false>(rows, row_bytes, xs, k_stride, i, 0, acc);
  }
  if (i < k) StepBf16<R, T, true>(rows, row_bytes, xs, k_stride, i, static_cast<__mmask32>((1ull << (k - i)) - 1), acc);
  StoreTileSums(acc, y + t0 * ldy + r0, ldy);
}

void GemmBf16(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const uint16_t* x, int64_t k, int64_t num_tokens,
              float* y, int64_t ldy) {
  using TileFn = void (*)(int64_t, int64_t, const uint8_t*, int64_t, const uint16_t*, int64_t, float*, int64_t);
  static constexpr TileFn kTiles[4][6] = {
      {TileBf16<1, 1>, TileBf16<1, 2>, TileBf16<1, 3>, TileBf16<1, 4>, TileBf16<1, 5>, TileBf16<1, 6>},
      {TileBf16<2, 1>, TileBf16<2, 2>, TileBf16<2, 3>, TileBf16<2, 4>, TileBf16<2, 5>, TileBf16<2, 6>},
      {TileBf16<3, 1>, TileBf16<3, 2>, TileBf16<3, 3>, TileBf16<3, 4>, TileBf16<3, 5>, TileBf16<3, 6>},
      {TileBf16<4, 1>, TileBf16<4, 2>, TileBf16<4, 3>, TileBf16<4, 4>, TileBf16<4, 5>, TileBf16<4, 6>}};
  ForEachTile(num_rows, num_tokens, kTiles, w, row_bytes, x, k, y, ldy);
}

// ---- GEMM, Q8_0/Q4_0 weights x int8 activations (VNNI) ------------------------------------------
// Two 32-element blocks per 512-bit step. Weights become unsigned u = w + offset (Q8_0: w ^ 0x80,
// offset 128; Q4_0: the raw nibble, offset 8), vpdpbusd sums u * q into 16 int32 lanes (8 per
// block), starting from -offset * sum(q) placed in lane 0 of each block's half, so the lanes of a
// half add up to the exact integer dot of the block. Then lanes -> f32, times d_w * d_x, accumulate.

// Lanes 0-7 from element 0 of v, lanes 8-15 from element 1 (one value per block of a pair).
inline __m512 HalvesPs(__m128 v) {
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}
inline __m512 LoadPairPs(const float* p, bool two) {
  return HalvesPs(two ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p))) : _mm_load_ss(p));
}
// The two f16 scales at byte offsets 0 and stride of p, as halves.
inline __m512 LoadPairF16(const uint8_t* p, int64_t stride, bool two) {
  uint16_t a, b = 0;
  std::memcpy(&a, p, 2);
  if (two) std::memcpy(&b, p + stride, 2);
  return HalvesPs(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(a | (static_cast<uint32_t>(b) << 16)))));
}
// -offset * qsum of each block in lane 0 of its half, zeros elsewhere.
inline __m512i Correction(const int32_t* qsum, bool two, int32_t offset) {
  const __m128i v = two ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qsum)) : _mm_cvtsi32_si128(qsum[0]);
  const __m512i idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i spread = _mm512_maskz_permutexvar_epi32(0x0101, idx, _mm512_castsi128_si512(v));
  return _mm512_mullo_epi32(spread, _mm512_set1_epi32(-offset));
}

template <GgmlType kType>
constexpr int32_t kOffset = kType == GgmlType::kQ8_0 ? 128 : 8;

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

// Unsigned weights of blocks b and b+1 (b+1 only when two) and their scales.
template <GgmlType kType>
inline void UnpackPair(const uint8_t* row, int64_t b, bool two, __m512i* u, __m512* dw) {
  if constexpr (kType == GgmlType::kQ8_0) {
    const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[0].qs));
    const __m256i hi = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[1].qs)) : _mm256_setzero_si256();
    *u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(static_cast<char>(0x80)));
    *dw = LoadPairF16(reinterpret_cast<const uint8_t*>(blk), sizeof(BlockQ8_0), two);
  } else {
    // Q4_0 blocks b and b + 1, or W4 runs b and b + 1, which share a group (b is even and a group
    // holds 2 or 4 runs): one scale for both.
    const uint8_t* q0;
    const uint8_t* q1;
    if constexpr (kW4Group<kType> > 0) {
      q0 = W4Run<kType>(row, b);
      q1 = W4Run<kType>(row, b + 1);
      *dw = LoadPairF16(W4Group<kType>(row, b), 0, two);
    } else {
      const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      q0 = blk[0].qs;
      q1 = blk[1].qs;
      *dw = LoadPairF16(reinterpret_cast<const uint8_t*>(blk), sizeof(BlockQ4_0), two);
    }
    const __m128i mask = _mm_set1_epi8(0x0f);
    auto nibbles = [&](const uint8_t* qs) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
      return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, mask)),
                                     _mm_and_si128(_mm_srli_epi16(raw, 4), mask), 1);
    };
    const __m256i lo = nibbles(q0);
    const __m256i hi = two ? nibbles(q1) : _mm256_setzero_si256();
    *u = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
}

template <GgmlType kType, int R, int T>
void TileQuant(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const QuantizedActs* xa, int64_t,
               float* y, int64_t ldy) {
  const QuantizedActs& x = *xa;
  const int64_t k = x.k_stride;
  const int64_t nb = x.k / 32;
  const int64_t nb_stride = k / 32;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint8_t* rows = w + r0 * row_bytes;
  for (int64_t b = 0; b < nb; b += 2) {
    const bool two = b + 1 < nb;
    __m512i u[R];
    __m512 dw[R];
    for (int r = 0; r < R; ++r) UnpackPair<kType>(rows + r * row_bytes, b, two, &u[r], &dw[r]);
    for (int t = 0; t < T; ++t) {
      const int64_t tok = t0 + t;
      const int8_t* q = x.qs + tok * k + b * 32;
      // NOTE: masked loads are slow on AMD Zen; only the odd last block uses one.
      const __m512i qv = two ? _mm512_loadu_si512(q) : _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
      const __m512 dx = LoadPairPs(x.d + tok * nb_stride + b, two);
      const __m512i corr = Correction(x.qsum + tok * nb_stride + b, two, kOffset<kType>);
      for (int r = 0; r < R; ++r) {
        const __m512i p = _mm512_dpbusd_epi32(corr, u[r], qv);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx), acc[r][t]);
      }
    }
  }
  StoreTileSums(acc, y + t0 * ldy + r0, ldy);
}

using TileQuantFn = void (*)(int64_t, int64_t, const uint8_t*, int64_t, const QuantizedActs*, int64_t, float*, int64_t);

template <GgmlType kType>
void GemmQuant(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x, int64_t num_tokens,
               float* y, int64_t ldy) {
  static constexpr TileQuantFn kTiles[4][4] = {
      {TileQuant<kType, 1, 1>, TileQuant<kType, 1, 2>, TileQuant<kType, 1, 3>, TileQuant<kType, 1, 4>},
      {TileQuant<kType, 2, 1>, TileQuant<kType, 2, 2>, TileQuant<kType, 2, 3>, TileQuant<kType, 2, 4>},
      {TileQuant<kType, 3, 1>, TileQuant<kType, 3, 2>, TileQuant<kType, 3, 3>, TileQuant<kType, 3, 4>},
      {TileQuant<kType, 4, 1>, TileQuant<kType, 4, 2>, TileQuant<kType, 4, 3>, TileQuant<kType, 4, 4>}};
  ForEachTile(num_rows, num_tokens, kTiles, w, row_bytes, &x, x.k, y, ldy);
}


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

template <GgmlType kType>
constexpr int64_t kSliceBytes = kType == GgmlType::kQ8_0 ? 512 : 256;
template <GgmlType kType>
constexpr int64_t kPackedBlockBytes = 32 + kSliceBytes<kType>;

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
      uint16_t scales[16] = {};
      uint8_t codes[16][32];  // Q8_0: w ^ 0x80; Q4_0: the nibble; padded rows: w = 0
      for (int r = 0; r < 16; ++r) {
        const int64_t row = g * 16 + r;
        for (int e = 0; e < 32; ++e) codes[r][e] = kType == GgmlType::kQ8_0 ? 0x80 : 8;
        if (row >= num_rows) continue;
        const uint8_t* rp = src + row * src_row_bytes;
        if constexpr (kType == GgmlType::kQ8_0) {
          const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(rp)[b];
          for (int e = 0; e < 32; ++e) codes[r][e] = static_cast<uint8_t>(blk.qs[e]) ^ 0x80;
          scales[r] = blk.d;
        } else {
          // Q4_0 block b, or W4 run b under its group's scale: the same nibble order.
          const uint8_t* qs;
          if constexpr (kW4Group<kType> > 0) {
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
      std::memcpy(out, scales, 32);
      uint8_t* w = out + 32;
      if constexpr (kType == GgmlType::kQ8_0) {
        for (int j = 0; j < 8; ++j)
          for (int r = 0; r < 16; ++r)
            for (int e = 0; e < 4; ++e) w[(j * 16 + r) * 4 + e] = codes[r][4 * j + e];
      } else {
        const uint8_t* rows[16];
        for (int r = 0; r < 16; ++r) rows[r] = codes[r];
        WriteNibbleSlices(rows, w);
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
                            int64_t ldy, int valid_rows) {
  constexpr int32_t kOffset = kType == GgmlType::kQ8_0 ? 128 : 8;
  const int64_t nb = x.k / 32;
  const int64_t nb_stride = x.k_stride / 32;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc[G][T];
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk[G];
    for (int g = 0; g < G; ++g) blk[g] = group + g * group_bytes + b * kPackedBlockBytes<kType>;
    const int8_t* q[T];
    // With few tokens, two dpbusd chains per output (odd and even slices; integer sums are exact
    // in any order), so the latency of one chain of 8 does not bound the loop.
    constexpr int kChains = T <= 2 ? 2 : 1;
    __m512i isum[G][T][kChains];
    for (int t = 0; t < T; ++t) {
      q[t] = x.qs + (t0 + t) * x.k_stride + b * 32;
      const __m512i start = _mm512_set1_epi32(-kOffset * x.qsum[(t0 + t) * nb_stride + b]);
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
    if constexpr (kType == GgmlType::kQ8_0) {
      for (int j = 0; j < 8; ++j) {
        __m512i wv[G];
        for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_si512(blk[g] + 32 + 64 * j);
        dot_slice(wv, j);
      }
    } else {
      // Q4_0: slice s holds elements 4s.. (low nibbles) and 16+4s.. (high nibbles).
      for (int s = 0; s < 4; ++s) {
        __m512i raw[G], wv[G];
        for (int g = 0; g < G; ++g) {
          raw[g] = _mm512_loadu_si512(blk[g] + 32 + 64 * s);
          wv[g] = _mm512_and_si512(raw[g], low4);
        }
        dot_slice(wv, s);
        for (int g = 0; g < G; ++g) wv[g] = _mm512_and_si512(_mm512_srli_epi16(raw[g], 4), low4);
        dot_slice(wv, s + 4);
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[g])));
      for (int t = 0; t < T; ++t) {
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[(t0 + t) * nb_stride + b]));
        const __m512i sum = kChains == 2 ? _mm512_add_epi32(isum[g][t][0], isum[g][t][kChains - 1]) : isum[g][t][0];
        acc[g][t] = _mm512_add_ps(acc[g][t], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(sum)));
      }
    }
  }
  if constexpr (G == 2) StoreGroupRows(acc[0], y, t0, ldy, 16);
  StoreGroupRows(acc[G - 1], y + 16 * (G - 1), t0, ldy, valid_rows);
}

template <GgmlType kType>
void GemmPacked(const uint8_t* w, int64_t group_bytes, int64_t num_rows, const QuantizedActs& x, int64_t num_tokens,
                float* y, int64_t ldy) {
  using TileFn = void (*)(const uint8_t*, int64_t, const QuantizedActs&, int64_t, float*, int64_t, int);
  constexpr int kT = 6;
  static constexpr TileFn kTiles[2][kT] = {
      {PackedGroupTile<kType, 1, 1>, PackedGroupTile<kType, 2, 1>, PackedGroupTile<kType, 3, 1>,
       PackedGroupTile<kType, 4, 1>, PackedGroupTile<kType, 5, 1>, PackedGroupTile<kType, 6, 1>},
      {PackedGroupTile<kType, 1, 2>, PackedGroupTile<kType, 2, 2>, PackedGroupTile<kType, 3, 2>,
       PackedGroupTile<kType, 4, 2>, PackedGroupTile<kType, 5, 2>, PackedGroupTile<kType, 6, 2>}};
  // Groups in pairs (a single one at an odd end), groups outer: their weights stay in L1 while
  // every token passes. One or two tokens (decode) are bound by memory, not the broadcasts, and
  // stream one group at a time: two streams per thread measured ~25% slower there. Rows come
  // out bitwise the same either way (exact integer block sums, the same scaling).
  const int64_t groups = (num_rows + 15) / 16;
  const int64_t stride = num_tokens > 2 ? 2 : 1;
  for (int64_t g = 0; g < groups; g += stride) {
    const int pair = g + 1 < groups && stride == 2 ? 2 : 1;
    const int64_t last = g + pair - 1;
    const int valid = static_cast<int>(num_rows - 16 * last < 16 ? num_rows - 16 * last : 16);
    for (int64_t t = 0; t < num_tokens; t += kT) {
      const int tt = static_cast<int>(num_tokens - t < kT ? num_tokens - t : kT);
      kTiles[pair - 1][tt - 1](w + g * group_bytes, group_bytes, x, t, y + 16 * g, ldy, valid);
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

// ---- Packed K-quants (Q4_K, Q5_K, Q6_K) x int8 activations (VNNI) ------------------------------
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
template <GgmlType kType>
constexpr int kKHighBits = kType == GgmlType::kQ4_K ? 0 : kType == GgmlType::kQ5_K ? 1 : 2;
template <GgmlType kType>
constexpr int64_t kKRunBytes = 32 + 256 + 64 * kKHighBits<kType>;
template <GgmlType kType>
constexpr int64_t kKHeaderBytes = kType == GgmlType::kQ6_K ? 32 : 64;
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
  if constexpr (kType == GgmlType::kQ6_K) {
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
      if constexpr (kType != GgmlType::kQ6_K) std::memcpy(out + 32, dmin, 32);
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
    if constexpr (kType != GgmlType::kQ6_K) {
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
      if constexpr (kType == GgmlType::kQ6_K) {
        const __m512i sca = _mm512_cvtepi8_epi32(s0), scb = _mm512_cvtepi8_epi32(s1);
        for (int t = 0; t < T; ++t) {
          const int64_t tok = t0 + t;
          const int8_t* qx = x.qs + tok * x.k_stride + b * 32;
          const int32_t* hs = x.half_sums + (tok * nb_stride + b) * 2;
          __m512i ia = _mm512_set1_epi32(-32 * hs[0]), ib = _mm512_set1_epi32(-32 * hs[1]);
          for (int j = 0; j < 4; ++j) {
            int32_t fa, fb;
            std::memcpy(&fa, qx + 4 * j, 4);
            std::memcpy(&fb, qx + 16 + 4 * j, 4);
            ia = _mm512_dpbusd_epi32(ia, w[j], _mm512_set1_epi32(fa));
            ib = _mm512_dpbusd_epi32(ib, w[j + 4], _mm512_set1_epi32(fb));
          }
          const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(sca, ia), _mm512_mullo_epi32(scb, ib));
          const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(x.d[tok * nb_stride + b]));
          acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(isum)));
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

// Online softmax over blocks of 16 positions (no score matrix): per block, the scores, the new
// running max, rescale of the running sum and output, then the block's weighted V rows. q and the
// output stay in registers (head_dim / 16 vectors). The order depends only on len.
// Horizontal sums of 16 vectors at once: lane j of the result is the sum of v[j]'s 16 lanes.
// A transpose-and-add tree (45 instructions instead of 16 separate reductions); the order in
// which each v[j] is summed is the same for every j.
inline __m512 SumEach16(const __m512 (&v)[16]) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i) {
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // c[i], 128-bit lane L: the partial sums (over lane group L) of v[4i .. 4i+3].
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xdd));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xdd));
}

// Running state of one query's online softmax.
template <int kVecs>
struct QueryState {
  __m512 q[kVecs];    // the query, pre-scaled by 1 / sqrt(head_dim)
  __m512 acc[kVecs];  // sum of weights * V rows so far (relative to max)
  float max;
  float sum;
};

// kHalf: head_dim 8 (kVecs 1): the upper 8 lanes of the query, K and V are zero.
template <int kVecs, bool kHalf = false>
inline void InitQuery(QueryState<kVecs>& st, const float* q, int head_dim) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int i = 0; i < kVecs; ++i) {
    const __m512 x = kHalf ? _mm512_maskz_loadu_ps(0xFF, q) : _mm512_loadu_ps(q + 16 * i);
    st.q[i] = _mm512_mul_ps(x, _mm512_set1_ps(scale));
    st.acc[i] = _mm512_setzero_ps();
  }
  st.max = -INFINITY;
  st.sum = 0.0f;
}

// 16 K or V elements of the cache type as f32.
template <KvType kType>
inline __m512 LoadKv16(const uint8_t* p) {
  if constexpr (kType == KvType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (kType == KvType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}
// Bytes of 16 elements of the type, and where a row segment's elements start (after the f16
// scale of the quantized types).
template <KvType kType>
inline constexpr int kKvGroupBytes = kType == KvType::kF32 ? 64 : kType == KvType::kInt8 ? 16 : kType == KvType::kInt4 ? 8 : 32;
template <KvType kType>
inline constexpr bool kKvQuantized = kType == KvType::kInt8 || kType == KvType::kInt4;
template <KvType kType>
inline constexpr int kKvDataOffset = kKvQuantized<kType> ? 2 : 0;

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

// 16 int8 or int4 (nibble pairs) integers as f32, unscaled.
template <KvType kType>
inline __m512 LoadKvInt16(const uint8_t* p) {
  if constexpr (kType == KvType::kInt8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else {
    const __m128i x = SplitNibblePairs(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(x), _mm512_set1_epi32(8)));
  }
}
template <KvType kType>
inline __m512 LoadKvInt8Lanes(const uint8_t* p) {
  if constexpr (kType == KvType::kInt8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else {
    int32_t w;
    std::memcpy(&w, p, 4);
    const __m128i x = SplitNibblePairs(_mm_cvtepu8_epi16(_mm_cvtsi32_si128(w)));
    return _mm512_cvtepi32_ps(_mm512_maskz_sub_epi32(0xFF, _mm512_cvtepu8_epi32(x), _mm512_set1_epi32(8)));
  }
}

// 8 K or V elements as f32 in the low lanes, zeros above.
template <KvType kType>
inline __m512 LoadKv8(const uint8_t* p) {
  if constexpr (kType == KvType::kF32) {
    return _mm512_maskz_loadu_ps(0xFF, p);
  } else if constexpr (kType == KvType::kF16) {
    return _mm512_cvtph_ps(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

template <KvType kType, bool kHalf>
inline __m512 LoadKv(const uint8_t* p) {
  if constexpr (kKvQuantized<kType>) {
    if constexpr (kHalf) {
      return LoadKvInt8Lanes<kType>(p);
    } else {
      return LoadKvInt16<kType>(p);
    }
  } else if constexpr (kHalf) {
    return LoadKv8<kType>(p);
  } else {
    return LoadKv16<kType>(p);
  }
}

// Keys of one block of up to 16 positions into the states of kQ queries (query q sees the first
// n[q]): scores, new running max, rescale of the sum and output, then the weighted V rows.
// offs[j] is the byte offset of the j-th position's row in K and in V. Each K and V row is loaded
// once for the kQ queries, and their FMA chains interleave (one query alone waits on the latency
// of its V accumulation chains); every query sees the same operations in the same order whatever
// other queries share the block, so a query's result does not depend on how queries are grouped.
template <int kQ, int kVecs, KvType kType, KvType vType, bool kHalf = false>
inline void QueryBlock(QueryState<kVecs>* const* st, const uint8_t* k, const uint8_t* v, const int64_t* koffs,
                       const int64_t* voffs, const int* n, float* const* raw_scores, const uint64_t* exp_table) {
  // The states in locals: through the pointers, every update went to memory and back.
  QueryState<kVecs> cur[kQ];
  for (int q = 0; q < kQ; ++q) cur[q] = *st[q];
  int n_max = 0;
  for (int q = 0; q < kQ; ++q) n_max = n[q] > n_max ? n[q] : n_max;
  alignas(64) float s[kQ][16];
  {
    __m512 part[kQ][16];  // per query and key, lane-wise partial products; keys past n[q] stay zero
    for (int j = 0; j < 16; ++j) {
      if (j >= n_max) {
        for (int q = 0; q < kQ; ++q) part[q][j] = _mm512_setzero_ps();
        continue;
      }
      const uint8_t* kr = k + koffs[j] + kKvDataOffset<kType>;
      __m512 kv[kVecs];
      kv[0] = LoadKv<kType, kHalf>(kr);
      for (int i = 1; i < kVecs; ++i) kv[i] = LoadKv<kType, false>(kr + kKvGroupBytes<kType> * i);
      for (int q = 0; q < kQ; ++q) {
        __m512 d = _mm512_mul_ps(cur[q].q[0], kv[0]);
        for (int i = 1; i < kVecs; ++i) d = _mm512_fmadd_ps(cur[q].q[i], kv[i], d);
        if constexpr (kKvQuantized<kType>) d = _mm512_mul_ps(d, _mm512_set1_ps(KvScale(k + koffs[j])));
        part[q][j] = j < n[q] ? d : _mm512_setzero_ps();
      }
    }
    for (int q = 0; q < kQ; ++q) _mm512_store_ps(s[q], SumEach16(part[q]));
  }
  alignas(64) float wts[kQ][16];  // lanes past n[q] are never used
  for (int q = 0; q < kQ; ++q) {
    if (raw_scores[q] != nullptr) std::memcpy(raw_scores[q], s[q], static_cast<size_t>(n[q]) * sizeof(float));
    // The block's max: the exact maximum, whatever the order.
    const __mmask16 valid = static_cast<__mmask16>((1u << n[q]) - 1);
    const float block_max = _mm512_mask_reduce_max_ps(valid, _mm512_load_ps(s[q]));
    const float new_max = block_max > cur[q].max ? block_max : cur[q].max;
    // exp(-inf) = 0 on the first block. ExpfLikeLibm is bitwise std::exp, inline: a call to libm
    // here made the compiler spill every live vector register around it, once per query and block.
    const float correction = _mm256_cvtss_f32(ExpfLikeLibm(_mm256_set1_ps(cur[q].max - new_max), exp_table));
    cur[q].sum *= correction;
    const __m512 cv = _mm512_set1_ps(correction);
    for (int i = 0; i < kVecs; ++i) cur[q].acc[i] = _mm512_mul_ps(cur[q].acc[i], cv);
    _mm512_store_ps(wts[q], Exp16(_mm512_sub_ps(_mm512_load_ps(s[q]), _mm512_set1_ps(new_max))));
    cur[q].max = new_max;
  }
  for (int j = 0; j < n_max; ++j) {
    const uint8_t* vr = v + voffs[j] + kKvDataOffset<vType>;
    __m512 vv[kVecs];
    vv[0] = LoadKv<vType, kHalf>(vr);
    for (int i = 1; i < kVecs; ++i) vv[i] = LoadKv<vType, false>(vr + kKvGroupBytes<vType> * i);
    for (int q = 0; q < kQ; ++q) {
      if (j >= n[q]) continue;
      cur[q].sum += wts[q][j];
      const float w = kKvQuantized<vType> ? wts[q][j] * KvScale(v + voffs[j]) : wts[q][j];
      const __m512 wv = _mm512_set1_ps(w);
      for (int i = 0; i < kVecs; ++i) cur[q].acc[i] = _mm512_fmadd_ps(wv, vv[i], cur[q].acc[i]);
    }
  }
  for (int q = 0; q < kQ; ++q) *st[q] = cur[q];
}

template <int kVecs, bool kHalf = false>
inline void FinishQuery(const QueryState<kVecs>& st, float* out) {
  const __m512 inv = _mm512_set1_ps(1.0f / st.sum);
  for (int i = 0; i < kVecs; ++i) {
    if constexpr (kHalf) {
      _mm512_mask_storeu_ps(out, 0xFF, _mm512_mul_ps(st.acc[i], inv));
    } else {
      _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(st.acc[i], inv));
    }
  }
}

// The block of positions [p0, p0 + 16) into every query that reaches it, kGroup at a time (then
// two, then one).
template <int kVecs, KvType kType, KvType vType, bool kHalf>
inline void AttendBlock(QueryState<kVecs>* st, const int64_t* lens, int num_queries, int64_t p0, const uint8_t* k,
                        const uint8_t* v, const int64_t* koffs, const int64_t* voffs, float* const* scores,
                        const uint64_t* exp_table) {
  // Four: one query's block is a chain (scores -> max -> weights -> V accumulation) that leaves
  // the FMA units idle; four interleaved ran the 110m prefill attention at ~1.4x (f32 cache) to
  // ~1.7x (f16) the one-at-a-time speed, two at ~1.2x.
  constexpr int kGroup = 4;
  QueryState<kVecs>* pending[kGroup];
  int n[kGroup];
  float* raw[kGroup];
  int np = 0;
  for (int i = 0; i < num_queries; ++i) {
    if (lens[i] <= p0) continue;
    pending[np] = &st[i];
    n[np] = lens[i] - p0 < 16 ? static_cast<int>(lens[i] - p0) : 16;
    raw[np] = scores != nullptr && scores[i] != nullptr ? scores[i] + p0 : nullptr;
    if (++np == kGroup) {
      QueryBlock<kGroup, kVecs, kType, vType, kHalf>(pending, k, v, koffs, voffs, n, raw, exp_table);
      np = 0;
    }
  }
  if constexpr (kGroup > 2) {
    if (np >= 2) {
      QueryBlock<2, kVecs, kType, vType, kHalf>(pending, k, v, koffs, voffs, n, raw, exp_table);
      np -= 2;
      pending[0] = pending[2];
      n[0] = n[2];
      raw[0] = raw[2];
    }
  }
  if (np == 1) QueryBlock<1, kVecs, kType, vType, kHalf>(pending, k, v, koffs, voffs, n, raw, exp_table);
}

// Several queries over the same K/V (one KV head of one sequence), 16 positions at a time, so
// those K and V rows are read from memory once and from L1 for the other queries. Positions are
// grouped in 16s from 0 whatever the cache's block size: the row offsets are looked up per
// position, so a paged cache gives bitwise what a contiguous one does.
template <int kVecs, KvType kType, KvType vType, bool kHalf = false>
void AttendManyOnline(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                      int head_dim, float* const* outs, float* const* scores) {
  static_assert(!kHalf || kVecs == 1);
  QueryState<kVecs> st[kMaxAttendQueries];
  const uint64_t* exp_table = ExpfTable32();
  int64_t max_len = 0;
  for (int i = 0; i < num_queries; ++i) {
    InitQuery<kVecs, kHalf>(st[i], qs[i], head_dim);
    max_len = lens[i] > max_len ? lens[i] : max_len;
  }
  int64_t koffs[16], voffs[16];
  int64_t blk = 0, in_blk = 0;  // the next position is in_blk of logical block blk (no divisions)
  for (int64_t p0 = 0; p0 < max_len; p0 += 16) {
    const int64_t n_max = max_len - p0 < 16 ? max_len - p0 : 16;
    for (int64_t j = 0; j < n_max; ++j) {
      const int64_t slot = kv.block_table[blk] * kv.block_size + in_blk;
      koffs[j] = slot * kv.k_row_bytes;
      voffs[j] = slot * kv.v_row_bytes;
      if (++in_blk == kv.block_size) {
        in_blk = 0;
        ++blk;
      }
    }
    AttendBlock<kVecs, kType, vType, kHalf>(st, lens, num_queries, p0, kv.k, kv.v, koffs, voffs, scores, exp_table);
  }
  for (int i = 0; i < num_queries; ++i) FinishQuery<kVecs, kHalf>(st[i], outs[i]);
}

template <KvType kType, KvType vType>
void AttendManyOfTypes(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                       int head_dim, float* const* outs, float* const* scores) {
  switch (head_dim) {
    case 8: return AttendManyOnline<1, kType, vType, true>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 16: return AttendManyOnline<1, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 32: return AttendManyOnline<2, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 64: return AttendManyOnline<4, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 80: return AttendManyOnline<5, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 96: return AttendManyOnline<6, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case 128: return AttendManyOnline<8, kType, vType>(qs, lens, num_queries, kv, head_dim, outs, scores);
    default: return AttendManyReference(qs, lens, num_queries, kv, head_dim, outs, scores);
  }
}

// K and V of one type, or K at higher precision than V (the useful mixes: V tolerates fewer bits
// than K); other pairs take the scalar path.
void AttendMany(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv, int head_dim,
                float* const* outs, float* const* scores) {
  using enum KvType;
  constexpr auto pair = [](KvType k, KvType v) { return static_cast<int>(k) * 8 + static_cast<int>(v); };
  switch (pair(kv.k_type, kv.v_type)) {
    case pair(kF32, kF32): return AttendManyOfTypes<kF32, kF32>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kF16, kF16): return AttendManyOfTypes<kF16, kF16>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kBF16, kBF16): return AttendManyOfTypes<kBF16, kBF16>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kInt8, kInt8): return AttendManyOfTypes<kInt8, kInt8>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kInt4, kInt4): return AttendManyOfTypes<kInt4, kInt4>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kF16, kInt8): return AttendManyOfTypes<kF16, kInt8>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kF16, kInt4): return AttendManyOfTypes<kF16, kInt4>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kBF16, kInt8): return AttendManyOfTypes<kBF16, kInt8>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kBF16, kInt4): return AttendManyOfTypes<kBF16, kInt4>(qs, lens, num_queries, kv, head_dim, outs, scores);
    case pair(kInt8, kInt4): return AttendManyOfTypes<kInt8, kInt4>(qs, lens, num_queries, kv, head_dim, outs, scores);
    default: return AttendManyReference(qs, lens, num_queries, kv, head_dim, outs, scores);
  }
}

void Softmax(float* x, int64_t n) {
  __m512 mv = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
  mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, x + i));
  const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 sv = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), max));
    _mm512_storeu_ps(x + i, e);
    sv = _mm512_add_ps(sv, e);
  }
  if (tail != 0) {
    const __m512 e = _mm512_maskz_mov_ps(tail, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + i), max)));
    _mm512_mask_storeu_ps(x + i, tail, e);
    sv = _mm512_add_ps(sv, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
  for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (tail != 0) _mm512_mask_storeu_ps(x + i, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), inv));
}

void ToF16(const float* x, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = Fp32ToFp16(x[i]);
}

// Integer round-to-nearest-even on the bit pattern, NaNs quieted: exactly Fp32ToBf16 (the
// AVX512-BF16 instruction would flush denormals).
void ToBf16(const float* x, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(64));
    const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, nan)));
  }
  for (; i < n; ++i) dst[i] = Fp32ToBf16(x[i]);
}

}  // namespace

const KernelTable& Avx512Table() {
  static const KernelTable table = {
      Isa::kAvx512,
      {DotF32, DotF16, DotBF16, DotQ8_0, DotQ4_0},
      {DequantF32, DequantF16, DequantBF16, DequantQ8_0, DequantQ4_0, DequantQ4_K, DequantQ5_K, DequantQ6_K,
       DequantW4<64, false>, DequantW4<128, false>, DequantW4<64, true>, DequantW4<128, true>, DequantW4<64, false>,
       DequantW4<128, false>},
      // BF16: gemm_bf16 below.
      {GemmFloat<GgmlType::kF32>, GemmFloat<GgmlType::kF16>, nullptr, nullptr, nullptr, nullptr,
       nullptr, nullptr, GemmW4A16<GgmlType::kW4A16G64>, GemmW4A16<GgmlType::kW4A16G128>,
       GemmW4A16<GgmlType::kW4A16ZG64>, GemmW4A16<GgmlType::kW4A16ZG128>},
      {nullptr, nullptr, nullptr, GemmQuant<GgmlType::kQ8_0>, GemmQuant<GgmlType::kQ4_0>, nullptr, nullptr, nullptr,
       nullptr, nullptr, nullptr, nullptr, GemmQuant<GgmlType::kW4A8G64>, GemmQuant<GgmlType::kW4A8G128>},
      // W4A8 matrices pack into Q4_0's packed layout (each run with its group's scale) and run
      // through its kernel; W4A16 ones pack the same way (symmetric: W4A8's row layout; zero
      // point: with the offsets) and run with 16-bit activations. The bf16 tile above is for
      // W4A16 matrices that are not packed.
      {nullptr, nullptr, nullptr, PackedGroupBytes<GgmlType::kQ8_0>, PackedGroupBytes<GgmlType::kQ4_0>,
       PackedGroupBytesK<GgmlType::kQ4_K>, PackedGroupBytesK<GgmlType::kQ5_K>, PackedGroupBytesK<GgmlType::kQ6_K>,
       PackedGroupBytes<GgmlType::kQ4_0>, PackedGroupBytes<GgmlType::kQ4_0>, PackedGroupBytesW4Z<64>,
       PackedGroupBytesW4Z<128>, PackedGroupBytes<GgmlType::kQ4_0>, PackedGroupBytes<GgmlType::kQ4_0>},
      {nullptr, nullptr, nullptr, Pack<GgmlType::kQ8_0>, Pack<GgmlType::kQ4_0>, PackK<GgmlType::kQ4_K>,
       PackK<GgmlType::kQ5_K>, PackK<GgmlType::kQ6_K>, Pack<GgmlType::kW4A8G64>, Pack<GgmlType::kW4A8G128>, PackW4Z<64>, PackW4Z<128>, Pack<GgmlType::kW4A8G64>,
       Pack<GgmlType::kW4A8G128>},
      {nullptr, nullptr, nullptr, GemmPacked<GgmlType::kQ8_0>, GemmPacked<GgmlType::kQ4_0>, GemmPackedK<GgmlType::kQ4_K>,
       GemmPackedK<GgmlType::kQ5_K>, GemmPackedK<GgmlType::kQ6_K>, nullptr, nullptr, nullptr, nullptr,
       GemmPacked<GgmlType::kQ4_0>, GemmPacked<GgmlType::kQ4_0>},
      {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, GemmPackedA16<false>,
       GemmPackedA16<false>, GemmPackedA16<true>, GemmPackedA16<true>},
      {nullptr, nullptr, GemmBf16},
      RmsNorm,
      SiluMul,
      Axpy,
      ToF16,
      ToBf16,
      AttendMany,
      Softmax,
      RopeApply,
  };
  return table;
}

}  // namespace gale::kernels
