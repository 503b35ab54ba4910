// AVX-512 kernels (16 floats per vector; F/BW/VL/DQ, plus VNNI and BF16 available for the int8
// and bf16 paths of the kernels issue). Built with its own flags; only called when CPUID agrees.
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "base/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"
#include "kernels/x86/rope_neox.h"
#include "kernels/x86/avx512_common.h"
#include "kernels/x86/gemm_tiles.h"

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

void GeluMul(float* gate, const float* up, int64_t n) {
  // Per element the scalar path's float operations (GeluMulReference), glibc's expf included.
  const __m512 one = _mm512_set1_ps(1.0f), c1 = _mm512_set1_ps(kGeluC1), c2 = _mm512_set1_ps(kGeluC2);
  const uint64_t* table = ExpfTable32();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(gate + i);
    const __m512 z = _mm512_mul_ps(x, _mm512_add_ps(c1, _mm512_mul_ps(c2, _mm512_mul_ps(x, x))));
    const __m512 neg = _mm512_xor_ps(z, _mm512_set1_ps(-0.0f));
    const __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(ExpfLikeLibm(_mm512_castps512_ps256(neg), table)),
                                        ExpfLikeLibm(_mm512_extractf32x8_ps(neg, 1), table), 1);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_loadu_ps(up + i)));
  }
  if (i < n) GeluMulReference(gate + i, up + i, n - i);
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

// The scalar ArgMax's answer in two passes: the largest value (vmaxps(x, acc) keeps acc for a
// NaN x, as the scalar x > best does), then its first index.
int64_t ArgMax(const float* x, int64_t n) {
  if (std::isnan(x[0])) return 0;  // nothing compares greater than the scalar's first best
  __m512 acc = _mm512_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc = _mm512_max_ps(_mm512_loadu_ps(x + i), acc);
  float best = _mm512_reduce_max_ps(acc);  // no NaN in acc
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  const __m512 bv = _mm512_set1_ps(best);
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), bv, _CMP_EQ_OQ);
    if (eq != 0) return i + __builtin_ctz(eq);
  }
  for (; x[i] != best; ++i) {
  }
  return i;
}

void ExpShifted(const float* x, float m, float* out, int64_t n) {
  const uint64_t* table = ExpfTable32();
  const __m512 mv = _mm512_set1_ps(m);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_sub_ps(_mm512_loadu_ps(x + i), mv);
    _mm512_storeu_ps(out + i, _mm512_insertf32x8(_mm512_castps256_ps512(ExpfLikeLibm(_mm512_castps512_ps256(v), table)),
                                                 ExpfLikeLibm(_mm512_extractf32x8_ps(v, 1), table), 1));
  }
  for (; i < n; ++i) out[i] = std::exp(x[i] - m);
}

// Activation quantizers, bitwise the scalar QuantizeBlocks (ref_kernels.cc): the block's largest
// |x| as its running max (vmaxps(a, acc) keeps acc when a is NaN, like the scalar a > amax ? a :
// amax), scale and inverse in scalar float as there, x * inv rounded half to even by the
// conversion (the scalar path's 1.5 * 2^23 trick), clamped to [-qmax, qmax]. kWide: 16-bit
// (q = 256 * hi + lo), else int8.
template <bool kWide>
inline void QuantizeActsImpl(const float* x, int64_t k, int64_t k_stride, int8_t* qs, uint8_t* lo, float* d,
                             int32_t* qsum) {
  constexpr int kQmax = kWide ? 32767 : 127;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i hi_q = _mm512_set1_epi32(kQmax), lo_q = _mm512_set1_epi32(-kQmax);
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
    const __m512 m =
        _mm512_max_ps(_mm512_and_ps(x1, abs_mask), _mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_setzero_ps()));
    const float amax = _mm512_reduce_max_ps(m);  // no NaN left: any order
    const float scale = amax / static_cast<float>(kQmax);
    const __m512 inv = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x0, inv)), lo_q), hi_q);
    const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(x1, inv)), lo_q), hi_q);
    if constexpr (kWide) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b), _mm512_cvtepi32_epi8(_mm512_srai_epi32(q0, 8)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b + 16), _mm512_cvtepi32_epi8(_mm512_srai_epi32(q1, 8)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + 32 * b), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
    }
    d[b] = scale;
    qsum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  }
  ZeroActPadding(k, k_stride, qs, lo, d, qsum);
}

void QuantizeActs(const float* x, int64_t k, int64_t k_stride, int8_t* qs, float* d, int32_t* qsum) {
  QuantizeActsImpl<false>(x, k, k_stride, qs, nullptr, d, qsum);
}
void QuantizeActs16(const float* x, int64_t k, int64_t k_stride, int8_t* hi, uint8_t* lo, float* d, int32_t* qsum) {
  QuantizeActsImpl<true>(x, k, k_stride, hi, lo, d, qsum);
}

// Gated DeltaNet's recurrence on R rows of the state at once for one token: each row is the
// single-row arithmetic (one accumulator per dot, its lanes summed by one reduction), the R rows'
// chains independent so that they overlap.
template <int R>
inline void DeltaRows(float* m, int64_t s, int64_t j, const DeltaRuleTokens& t, int64_t i) {
  const float *k = t.k + i * t.stride, *q = t.q + i * t.stride;
  const float decay = t.decay[i];
  const __m512 vd = _mm512_set1_ps(decay);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int64_t e = 0;
  for (; e + 16 <= s; e += 16) {
    const __m512 ke = _mm512_loadu_ps(k + e);
    for (int r = 0; r < R; ++r) {
      float* mr = m + (j + r) * s + e;
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(mr), vd);
      _mm512_storeu_ps(mr, x);
      acc[r] = _mm512_fmadd_ps(x, ke, acc[r]);
    }
  }
  float d[R];
  for (int r = 0; r < R; ++r) {
    float* mr = m + (j + r) * s;
    float sk = _mm512_reduce_add_ps(acc[r]);
    for (int64_t f = e; f < s; ++f) {
      mr[f] *= decay;
      sk += mr[f] * k[f];
    }
    d[r] = (t.v[i * t.stride + j + r] - sk) * t.beta[i];
    acc[r] = _mm512_setzero_ps();
  }
  for (e = 0; e + 16 <= s; e += 16) {
    const __m512 ke = _mm512_loadu_ps(k + e), qe = _mm512_loadu_ps(q + e);
    for (int r = 0; r < R; ++r) {
      float* mr = m + (j + r) * s + e;
      const __m512 x = _mm512_fmadd_ps(_mm512_set1_ps(d[r]), ke, _mm512_loadu_ps(mr));
      _mm512_storeu_ps(mr, x);
      acc[r] = _mm512_fmadd_ps(x, qe, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* mr = m + (j + r) * s;
    float sq = _mm512_reduce_add_ps(acc[r]);
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
  const __m512 va = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}


// ---- GEMM, float weights: 4 rows x 6 tokens per tile, 16 elements per step --------------------

// F8: v (e4m3 patterns converted from f16: each weight times 2^-8) times 2^8 times the block's
// scale 2^(e - 127), the dequantizer's one rounding: one factor while it is a float (scale
// exponents to 2^119), else two.
inline __m512 ScaleF8(__m512 v, uint8_t e) {
  if (e <= 246) [[likely]] return _mm512_mul_ps(v, _mm512_set1_ps(E8M0ToFp32(static_cast<uint8_t>(e + 8))));
  return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(256.0f)), _mm512_set1_ps(E8M0ToFp32(e)));
}

template <GgmlType kType, bool kMasked>
inline __m512 LoadW16(const uint8_t* row, int64_t i, __mmask16 m) {
  if constexpr (kType == GgmlType::kF8E4M3) {
    // 16 e4m3 bytes of block i / 32 (i a multiple of 16), sign-extended to 16 bits and shifted
    // left 7: the sign lands in bit 15 (and 14, cleared), the 7 low bits in an f16's exponent and
    // mantissa, which is the value times 2^-8 (subnormals too: f16's exponent bias is 8 more), so
    // the conversion is exact; then ScaleF8. Rows are whole blocks: no mask.
    const auto* blk = reinterpret_cast<const BlockF8E4M3*>(row) + i / 32;
    const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs + i % 32)));
    const __m512 v = _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16(-0x4001)));
    (void)m;
    return ScaleF8(v, blk->e);
  } else if constexpr (kType == GgmlType::kF32) {
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

// F8 (whole rows, 32 elements = one block per step): each row's 32 bytes widened and shifted as
// one vector and its scale taken once, then the two halves as two 16-element steps would: every
// lane sees the same multiply-adds in the same order as through LoadW16 (bitwise the same sums,
// so the f32 path over decoded rows still matches). At one token the 16-byte steps spent more on
// the widening and the per-half scale than the bytes take to arrive.
template <int R, int T>
inline void StepF8Block(const uint8_t* rows, int64_t row_bytes, const float* xs, int64_t k, int64_t i,
                        __m512 (&acc)[R][T]) {
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    const auto* blk = reinterpret_cast<const BlockF8E4M3*>(rows + r * row_bytes) + i / 32;
    const __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs)));
    const __m512i h = _mm512_and_si512(_mm512_slli_epi16(b, 7), _mm512_set1_epi16(-0x4001));
    lo[r] = ScaleF8(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), blk->e);
    hi[r] = ScaleF8(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), blk->e);
  }
  for (int t = 0; t < T; ++t) {
    const __m512 xv = _mm512_loadu_ps(xs + t * k + i);
    for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(lo[r], xv, acc[r][t]);
  }
  for (int t = 0; t < T; ++t) {
    const __m512 xv = _mm512_loadu_ps(xs + t * k + i + 16);
    for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(hi[r], xv, acc[r][t]);
  }
}

// A float tile over elements [k0, k1) only: its R x T lane accumulators start from part (or zero
// when k0 == 0) and go back there, except after the last range (k1 == k), which reduces them into
// y. Chained over ascending ranges, every lane sees the FMAs of one pass over [0, k) in the same
// order, so the result is bitwise the same.
// kWhole: one pass over [0, k) (part unused), and each cache line of this tile's rows comes with a
// prefetch of the same line of the next tile's rows (the rows just below): decode reads every
// weight once, and the hardware prefetcher alone left F16/BF16 decode at ~50% of the bandwidth
// roofline (~90% with this). Prefetches never fault, so the last tile's reach past the matrix is
// harmless.
template <GgmlType kType, int R, int T, bool kWhole>
void TileFloatRange(int64_t r0, int64_t t0, const uint8_t* w, int64_t row_bytes, const float* x, int64_t k, int64_t k0,
                    int64_t k1, __m512* part, float* y, int64_t ldy) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = kWhole || k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(part + r * T + t);
  const uint8_t* rows = w + r0 * row_bytes;
  const float* xs = x + t0 * k;
  constexpr int64_t kEl = kType == GgmlType::kF32 ? 4 : kType == GgmlType::kF8E4M3 ? 1 : 2;
  int64_t i = k0;
  if constexpr (kType == GgmlType::kF8E4M3 && kWhole) {  // whole blocks (rows are whole blocks)
    for (; i + 32 <= k1; i += 32) {
      if ((i & 63) == 0) {
        for (int r = 0; r < R; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(rows + (R + r) * row_bytes + i / 32 * 33), _MM_HINT_T0);
        }
      }
      StepF8Block<R, T>(rows, row_bytes, xs, k, i, acc);
    }
  }
  for (; i + 16 <= k1; i += 16) {
    if (kWhole && (i & (64 / kEl - 1)) == 0) {
      // F8: 33 bytes per 32 elements.
      const int64_t at = kType == GgmlType::kF8E4M3 ? i / 32 * 33 : i * kEl;
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows + (R + r) * row_bytes + at), _MM_HINT_T0);
      }
    }
    StepFloat<kType, R, T, false>(rows, row_bytes, xs, k, i, 0, acc);
  }
  if (i < k1) StepFloat<kType, R, T, true>(rows, row_bytes, xs, k, i, static_cast<__mmask16>((1u << (k1 - i)) - 1), acc);
  if (!kWhole && k1 < k) {
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
  // Each pool thread converts the activations for its own rows into its own scratch (the same
  // values on every thread, so a row's result does not depend on the split): group sums, then
  // the bf16 rows (k is a multiple of G, so of 64: the bf16 take k / 2 floats per token).
  float* sums = TileScratch(num_tokens * (k / G) + num_tokens * k / 2);
  uint16_t* bf16 = reinterpret_cast<uint16_t*>(sums + num_tokens * (k / G));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* xt = x + t * k;
    for (int64_t i = 0; i < k; i += 32) {
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xt + i + 16), _mm512_loadu_ps(xt + i));
      _mm512_storeu_si512(bf16 + t * k + i, (__m512i)v);
    }
    for (int64_t g = 0; g < k / G; ++g) {
      __m512 s = _mm512_setzero_ps();
      for (int64_t i = g * G; i < (g + 1) * G; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(xt + i));
      sums[t * (k / G) + g] = _mm512_reduce_add_ps(s);
    }
  }
  const W4Acts acts{bf16, sums};
  static constexpr TileFloatFn kTiles[4][4] = {
      {TileW4<kType, 1, 1>, TileW4<kType, 1, 2>, TileW4<kType, 1, 3>, TileW4<kType, 1, 4>},
      {TileW4<kType, 2, 1>, TileW4<kType, 2, 2>, TileW4<kType, 2, 3>, TileW4<kType, 2, 4>},
      {TileW4<kType, 3, 1>, TileW4<kType, 3, 2>, TileW4<kType, 3, 3>, TileW4<kType, 3, 4>},
      {TileW4<kType, 4, 1>, TileW4<kType, 4, 2>, TileW4<kType, 4, 3>, TileW4<kType, 4, 4>}};
  ForEachTile(num_rows, num_tokens, kTiles, w, row_bytes, reinterpret_cast<const float*>(&acts), k, y, ldy);
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
  if constexpr (kType == GgmlType::kF8E4M3) {
    // More than one token tile: each row would be decoded once per tile, so decode blocks of rows
    // to f32 once (the values the F8 tiles compute with) and run the f32 product over them: the
    // same multiply-adds in the same order, bitwise the same sums.
    if (num_tokens > kT) {
      constexpr int64_t kRowBlock = 64;
      float* rows = TileScratch<1>(kRowBlock * k);  // the f32 product below takes slot 0
      for (int64_t r0 = 0; r0 < num_rows; r0 += kRowBlock) {
        const int64_t n = num_rows - r0 < kRowBlock ? num_rows - r0 : kRowBlock;
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t i = 0; i < k; i += 16) {
            _mm512_storeu_ps(rows + r * k + i, LoadW16<kType, false>(w + (r0 + r) * row_bytes, i, 0));
          }
        }
        GemmFloat<GgmlType::kF32>(reinterpret_cast<const uint8_t*>(rows), k * 4, n, x, k, num_tokens, y + r0, ldy);
      }
      return;
    }
  }
  // Up to kKc elements, a single token tile (decode): one pass per tile, the next tile's rows
  // prefetched.
  constexpr int64_t kKc = 1024;
  if (num_tokens <= kT || k <= kKc) {
    ForEachTile(num_rows, num_tokens, TileTable<FloatTiles<kType>, kR, kT>::kFns.f, w, row_bytes, x, k, y, ldy);
    return;
  }
  // Several token tiles over long rows: a tile's rows and activations no longer fit L1 together
  // (single-thread F16 with 4x4 tiles fell from ~180 GFLOP/s at k = 768 to ~110 at k = 5632). Blocked
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
// The qsum of each block in lane 0 of its half, zeros elsewhere.
inline __m512i SpreadPair(const int32_t* qsum, bool two) {
  const __m128i v = two ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qsum)) : _mm_cvtsi32_si128(qsum[0]);
  const __m512i idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_maskz_permutexvar_epi32(0x0101, idx, _mm512_castsi128_si512(v));
}
// -offset * qsum of each block in lane 0 of its half, zeros elsewhere.
inline __m512i Correction(const int32_t* qsum, bool two, int32_t offset) {
  return _mm512_mullo_epi32(SpreadPair(qsum, two), _mm512_set1_epi32(-offset));
}

// What the tile takes off each unsigned weight (times the block's qsum) after the dot; the
// zero-point types (Q4_1, Q5_1: x = d q + m) add m * d_x * qsum instead.
template <GgmlType kType>
constexpr int32_t kOffset = kType == GgmlType::kQ8_0                                 ? 128
                            : kType == GgmlType::kQ5_0                               ? 16
                            : kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1 ? 0
                                                                                     : 8;
template <GgmlType kType>
constexpr bool kZeroPoint = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;

// The 32 nibble values of a Q4_0-ordered block in element order, plus 16 for each bit of qh set
// (Q5_0/Q5_1's fifth bits; qh null: none).
inline __m256i Unsigned32(const uint8_t* qs, const uint8_t* qh) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i low = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, mask)),
                                              _mm_and_si128(_mm_srli_epi16(raw, 4), mask), 1);
  if (qh == nullptr) return low;
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return _mm256_or_si256(low, _mm256_and_si256(_mm256_movm_epi8(h), _mm256_set1_epi8(0x10)));
}


// Unsigned weights of blocks b and b+1 (b+1 only when two) and their scales (and offsets, mw,
// for the zero-point types).
template <GgmlType kType>
inline void UnpackPair(const uint8_t* row, int64_t b, bool two, __m512i* u, __m512* dw, __m512* mw) {
  if constexpr (kType == GgmlType::kQ5_0 || kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1) {
    using Block = std::conditional_t<kType == GgmlType::kQ5_0, BlockQ5_0,
                                     std::conditional_t<kType == GgmlType::kQ4_1, BlockQ4_1, BlockQ5_1>>;
    const Block* blk = reinterpret_cast<const Block*>(row) + b;
    auto values = [](const Block& x) {
      if constexpr (kType == GgmlType::kQ4_1) {
        return Unsigned32(x.qs, nullptr);
      } else {
        return Unsigned32(x.qs, x.qh);
      }
    };
    const __m256i lo = values(blk[0]);
    const __m256i hi = two ? values(blk[1]) : _mm256_setzero_si256();
    *u = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    *dw = LoadPairF16(reinterpret_cast<const uint8_t*>(blk), sizeof(Block), two);
    if constexpr (kZeroPoint<kType>) *mw = LoadPairF16(reinterpret_cast<const uint8_t*>(blk) + 2, sizeof(Block), two);
  } else if constexpr (kType == GgmlType::kQ8_0) {
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
    const __m256i lo = Unsigned32(q0, nullptr);
    const __m256i hi = two ? Unsigned32(q1, nullptr) : _mm256_setzero_si256();
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
    __m512 dw[R], mw[R];
    for (int r = 0; r < R; ++r) UnpackPair<kType>(rows + r * row_bytes, b, two, &u[r], &dw[r], &mw[r]);
    for (int t = 0; t < T; ++t) {
      const int64_t tok = t0 + t;
      const int8_t* q = x.qs + tok * k + b * 32;
      // NOTE: masked loads are slow on AMD Zen; only the odd last block uses one.
      const __m512i qv = two ? _mm512_loadu_si512(q) : _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
      const __m512 dx = LoadPairPs(x.d + tok * nb_stride + b, two);
      const __m512i corr = kOffset<kType> != 0 ? Correction(x.qsum + tok * nb_stride + b, two, kOffset<kType>)
                                                : _mm512_setzero_si512();
      __m512 qsum = _mm512_setzero_ps();  // zero-point types: each block's qsum in lane 0 of its half
      if constexpr (kZeroPoint<kType>) qsum = _mm512_cvtepi32_ps(SpreadPair(x.qsum + tok * nb_stride + b, two));
      for (int r = 0; r < R; ++r) {
        const __m512i p = _mm512_dpbusd_epi32(corr, u[r], qv);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx), acc[r][t]);
        if constexpr (kZeroPoint<kType>) acc[r][t] = _mm512_fmadd_ps(qsum, _mm512_mul_ps(mw[r], dx), acc[r][t]);
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
  static const KernelTable table = [] {
    KernelTable t = {
      Isa::kAvx512,
      {DotF32, DotF16, DotBF16, DotQ8_0, DotQ4_0},
      {DequantF32, DequantF16, DequantBF16, DequantQ8_0, DequantQ4_0, DequantQ4_K, DequantQ5_K, DequantQ6_K,
       DequantW4<64, false>, DequantW4<128, false>, DequantW4<64, true>, DequantW4<128, true>, DequantW4<64, false>,
       DequantW4<128, false>, GALE_LATER_DEQUANT_REFERENCE},
      // BF16: gemm_bf16 below.
      {GemmFloat<GgmlType::kF32>, GemmFloat<GgmlType::kF16>, nullptr, nullptr, nullptr, nullptr,
       nullptr, nullptr, GemmW4A16<GgmlType::kW4A16G64>, GemmW4A16<GgmlType::kW4A16G128>,
       GemmW4A16<GgmlType::kW4A16ZG64>, GemmW4A16<GgmlType::kW4A16ZG128>, nullptr, nullptr, nullptr, nullptr,
       nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, GemmFloat<GgmlType::kF8E4M3>},
      // Q5_0 matrices are packed (avx512_packed.cc); this one is for views without a packed copy.
      {nullptr, nullptr, nullptr, GemmQuant<GgmlType::kQ8_0>, GemmQuant<GgmlType::kQ4_0>, nullptr, nullptr, nullptr,
       nullptr, nullptr, nullptr, nullptr, GemmQuant<GgmlType::kW4A8G64>, GemmQuant<GgmlType::kW4A8G128>,
       GemmQuant<GgmlType::kQ4_1>, GemmQuant<GgmlType::kQ5_0>, GemmQuant<GgmlType::kQ5_1>},
      // Packed slots: Avx512FillPacked (avx512_packed.cc).
      {}, {}, {}, {},
      {nullptr, nullptr, GemmBf16},
      RmsNorm,
      SiluMul,
      Axpy,
      ToF16,
      ToBf16,
      Avx512AttendMany,
      Softmax,
      RopeApply,
      GeluMul,
      RopeApplyNeoxAvx2,
      ArgMax,
      ExpShifted,
      QuantizeActs,
      QuantizeActs16,
      DeltaRule,
    };
    Avx512FillPacked(t);
    return t;
  }();
  return table;
}

}  // namespace gale::kernels
