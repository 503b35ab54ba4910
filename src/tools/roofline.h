// Probes of this machine's limits, for reporting figures as a fraction of the roofline: memory
// read bandwidth (decode is bound by it) and peak arithmetic (prefill is bound by it).
#pragma once

#include "base/thread_pool.h"

namespace gale {

struct Roofline {
  double read_bandwidth_gbs = 0.0;   // GB/s reading a buffer much larger than the caches
  double f32_fma_gflops = 0.0;       // f32 FMA peak of the active ISA, all threads
  double int8_dot_gops = 0.0;        // int8 multiply-add peak (VNNI where present), all threads
  double bf16_dot_gflops = 0.0;      // bf16 pair dot peak (AVX512-BF16), all threads; else the f32 FMA peak
};

// Bandwidth: best of a few passes over a 512 MiB buffer with every pool thread; ~1 s.
double MeasureReadBandwidth(ThreadPool& pool);
// Arithmetic peaks: tight register-only loops on every pool thread; ~0.2 s.
Roofline MeasureRoofline(ThreadPool& pool);

}  // namespace gale
