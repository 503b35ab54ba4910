// Internal to the AVX-512 translation units (avx512_kernels.cc, avx512_packed.cc,
// avx512_attention.cc): vector helpers more than one of them uses. Everything is in an anonymous
// namespace, as in gemm_tiles.h, so no copy leaks to another ISA through the linker.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"

namespace gale::kernels {
namespace {

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

}  // namespace
}  // namespace gale::kernels
