// Roofline probes. The bandwidth probe reads with plain AVX2 loads (every x86-64 gale supports
// AVX2 or is using the scalar path, where the figure is still what memory gives). The compute
// probes run the same instruction mix as the kernels' inner loops.
#include "tools/roofline.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "base/cpu.h"
#include "kernels/kernels.h"

namespace gale {
namespace {

using Clock = std::chrono::steady_clock;

__attribute__((target("avx2"))) int64_t SumRange(const uint8_t* p, int64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  int64_t out[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), a0);
  return out[0] + out[1] + out[2] + out[3];
}

int64_t SumRangeScalar(const uint8_t* p, int64_t n) {
  int64_t s = 0;
  for (int64_t i = 0; i < n; i += 64) s += p[i];
  return s;
}

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iters) {
  __m256 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < 8; ++i) s = _mm256_add_ps(s, a[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) int32_t DpbusdLoop(int64_t iters) {
  __m512i a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], u, s);
  }
  __m512i t = a[0];
  for (int i = 1; i < 12; ++i) t = _mm512_add_epi32(t, a[i]);
  return _mm512_reduce_add_epi32(t);
}

__attribute__((target("avx512f,avx512bf16"))) float Dpbf16Loop(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh u = (__m512bh)_mm512_set1_epi16(0x3f80), s = (__m512bh)_mm512_set1_epi16(0x3a80);  // 1, 2^-10
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], u, s);
  }
  __m512 t = a[0];
  for (int i = 1; i < 12; ++i) t = _mm512_add_ps(t, a[i]);
  return _mm512_reduce_add_ps(t);
}

__attribute__((target("avx2"))) int32_t MaddubsLoop(int64_t iters) {
  __m256i a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_set1_epi32(i);
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 8; ++i) a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
  }
  __m256i t = a[0];
  for (int i = 1; i < 8; ++i) t = _mm256_add_epi32(t, a[i]);
  int32_t out[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), t);
  return out[0];
}

// Runs fn(iters) on every thread, doubling iters until a run takes 50 ms; returns ops per second
// given ops_per_iter per thread.
template <typename Fn>
double Peak(ThreadPool& pool, double ops_per_iter, Fn fn) {
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    pool.ParallelFor(pool.num_threads(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        volatile auto sink = fn(iters);
        (void)sink;
      }
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0.05) return ops_per_iter * static_cast<double>(iters) * pool.num_threads() / s;
    iters *= 2;
  }
}

}  // namespace

double MeasureReadBandwidth(ThreadPool& pool) {
  const int64_t bytes = 512ll << 20;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0.0;
  auto* p = static_cast<uint8_t*>(mem);
  pool.ParallelFor(bytes / 4096, [&](int64_t b, int64_t e) { std::memset(p + b * 4096, 1, (e - b) * 4096); });
  const bool avx2 = GetCpuFeatures().HasAvx2();
  double best = 0.0;
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<int64_t> sums(pool.num_threads());
    const auto t0 = Clock::now();
    pool.ParallelFor(pool.num_threads(), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t chunk = bytes / pool.num_threads();
        sums[t] = avx2 ? SumRange(p + t * chunk, chunk) : SumRangeScalar(p + t * chunk, chunk);
      }
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  munmap(mem, bytes);
  return best;
}

Roofline MeasureRoofline(ThreadPool& pool) {
  Roofline r;
  r.read_bandwidth_gbs = MeasureReadBandwidth(pool);
  const kernels::Isa isa = kernels::Active().isa;
  if (isa == kernels::Isa::kAvx512) {
    r.f32_fma_gflops = Peak(pool, 12 * 16 * 2, FmaLoopAvx512) / 1e9;
    r.int8_dot_gops = Peak(pool, 12 * 64 * 2, DpbusdLoop) / 1e9;
    r.bf16_dot_gflops = Peak(pool, 12 * 32 * 2, Dpbf16Loop) / 1e9;
  } else if (isa == kernels::Isa::kAvx2) {
    r.f32_fma_gflops = Peak(pool, 8 * 8 * 2, FmaLoopAvx2) / 1e9;
    r.int8_dot_gops = Peak(pool, 8 * 32 * 2, MaddubsLoop) / 1e9;
  } else {
    r.f32_fma_gflops = Peak(pool, 2, [](int64_t iters) {
      float a = 1.0f;
      for (int64_t i = 0; i < iters; ++i) a = a * 0.999f + 0.001f;
      return a;
    }) / 1e9;
    r.int8_dot_gops = r.f32_fma_gflops;
  }
  if (r.bf16_dot_gflops == 0.0) r.bf16_dot_gflops = r.f32_fma_gflops;
  return r;
}

}  // namespace gale
