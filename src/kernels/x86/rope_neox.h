// RoPE in NEOX mode with AVX2 (8 pairs at a time), included by each x86 ISA's translation unit.
// `static`: every including unit (built with its own flags) keeps its own copy, so no linker
// can pick an AVX-512-compiled body for an AVX2-only machine.
#pragma once

#include <immintrin.h>

namespace gale::kernels {

// Pairs (v[i], v[i + rope_dims / 2]) rotated by cos_sin[2i], cos_sin[2i + 1]: each lane the
// scalar path's two rounded products summed (no fused multiply-add).
static void RopeApplyNeoxAvx2(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin) {
  const int half = rope_dims / 2;
  const int vec = half / 8 * 8;
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + h * head_dim;
    for (int i = 0; i < vec; i += 8) {
      const __m256 cs0 = _mm256_loadu_ps(cos_sin + 2 * i), cs1 = _mm256_loadu_ps(cos_sin + 2 * i + 8);
      // In-lane shuffles give (0 1 4 5 | 2 3 6 7); the 64-bit permute puts them in order.
      const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(cs0, cs1, 0x88)), 0xD8));
      const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(cs0, cs1, 0xDD)), 0xD8));
      const __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + half);
      _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
      _mm256_storeu_ps(v + i + half, _mm256_add_ps(_mm256_mul_ps(a, s), _mm256_mul_ps(b, c)));
    }
    for (int i = vec; i < half; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float v0 = v[i], v1 = v[i + half];
      v[i] = v0 * c - v1 * s;
      v[i + half] = v0 * s + v1 * c;
    }
  }
}

}  // namespace gale::kernels
