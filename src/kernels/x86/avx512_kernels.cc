// AVX-512 kernels (16 floats per vector; F/BW/VL/DQ, plus VNNI and BF16 available for the int8
// and bf16 paths of the kernels issue). Built with its own flags; only called when CPUID agrees.
#include <immintrin.h>

#include <cmath>

#include "base/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"

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
  for (int64_t i = 0; i < n; ++i) {
    float v = gate[i];
    v *= 1.0f / (1.0f + std::exp(-v));
    gate[i] = v * up[i];
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

}  // namespace

const KernelTable& Avx512Table() {
  static const KernelTable table = {
      Isa::kAvx512,
      {DotF32, DotF16, DotBF16, DotQ8_0, DotQ4_0},
      {DequantF32, DequantF16, DequantBF16, DequantQ8_0, DequantQ4_0},
      RmsNorm,
      SiluMul,
      Axpy,
  };
  return table;
}

}  // namespace gale::kernels
