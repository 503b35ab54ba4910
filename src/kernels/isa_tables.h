// Internal: each ISA translation unit defines one of these. Only kernels.cc includes this file.
#pragma once

#include "kernels/kernel_table.h"

namespace gale::kernels {
const KernelTable& ScalarTable();
const KernelTable& Avx2Table();
const KernelTable& Avx512Table();
}  // namespace gale::kernels
