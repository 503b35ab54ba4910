// The per-ISA kernel table: plain function pointers, no standard-library types, so the ISA
// translation units (built with -mavx2/-mavx512 flags) need include nothing that could leak
// ISA-specific inline code into the rest of the binary.
#pragma once

#include <cstdint>

namespace gale {
enum class GgmlType : uint32_t;
}

namespace gale::kernels {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* IsaName(Isa isa);

// Weight types with kernels, as a dense index into the table.
enum TypeSlot { kSlotF32 = 0, kSlotF16, kSlotBF16, kSlotQ8_0, kSlotQ4_0, kNumTypeSlots };
TypeSlot SlotOf(GgmlType type);

using VecDotFn = float (*)(const void* w_row, const float* x, int64_t n);
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);

struct KernelTable {
  Isa isa;
  // dot(w_row dequantized, x) over n elements; n is a multiple of the type's block size.
  VecDotFn vec_dot[kNumTypeSlots];
  DequantizeRowFn dequantize_row[kNumTypeSlots];
  // out[i] = w[i] * x[i] / sqrt(mean(x^2) + eps)
  void (*rms_norm)(const float* x, const float* w, int64_t n, float eps, float* out);
  // gate[i] = silu(gate[i]) * up[i]
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  // y[i] += a * x[i]
  void (*axpy)(float a, const float* x, float* y, int64_t n);
};

}  // namespace gale::kernels
