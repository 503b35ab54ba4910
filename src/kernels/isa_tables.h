// Internal: each ISA translation unit defines one of these. Only kernels.cc includes this file.
#pragma once

#include "kernels/kernel_table.h"

namespace gale::kernels {
const KernelTable& ScalarTable();
const KernelTable& Avx2Table();
const KernelTable& Avx512Table();
// The scalar attention, for ISAs whose own kernel does not cover a head size.
void AttendManyReference(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                         int head_dim, float* const* outs, float* const* scores);
void SoftmaxReference(float* x, int64_t n);
// Scalar conversions, for ISAs without their own.
void ToF16Reference(const float* x, uint16_t* dst, int64_t n);
void ToBf16Reference(const float* x, uint16_t* dst, int64_t n);
}  // namespace gale::kernels
