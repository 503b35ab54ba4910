// Scalar reference kernels: the definition every SIMD path is tested against. Plain loops in
// element order, no tricks; the rms_norm and silu follow llama2.c's run.c expression for expression.
#include <cmath>

#include "base/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/isa_tables.h"

namespace gale::kernels {
namespace {

float DotF32(const void* w, const float* x, int64_t n) {
  const float* a = static_cast<const float*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * x[i];
  return sum;
}

float DotF16(const void* w, const float* x, int64_t n) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += Fp16ToFp32(a[i]) * x[i];
  return sum;
}

float DotBF16(const void* w, const float* x, int64_t n) {
  const uint16_t* a = static_cast<const uint16_t*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += Bf16ToFp32(a[i]) * x[i];
  return sum;
}

float DotQ8_0(const void* w, const float* x, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    float block = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) block += static_cast<float>(b[i].qs[j]) * x[i * kQK8_0 + j];
    sum += Fp16ToFp32(b[i].d) * block;
  }
  return sum;
}

float DotQ4_0(const void* w, const float* x, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(w);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    float block = 0.0f;
    const float* xb = x + i * kQK4_0;
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      block += static_cast<float>((b[i].qs[j] & 0x0f) - 8) * xb[j];
      block += static_cast<float>((b[i].qs[j] >> 4) - 8) * xb[j + kQK4_0 / 2];
    }
    sum += Fp16ToFp32(b[i].d) * block;
  }
  return sum;
}

template <GgmlType kType>
void Dequantize(const void* src, float* dst, int64_t n) {
  DequantizeRowRef(kType, src, dst, n);
}

void RmsNormRef(const float* x, const float* w, int64_t n, float eps, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(n);
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (ss * x[i]);
}

void SiluMulRef(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = gate[i];
    v *= 1.0f / (1.0f + std::exp(-v));
    gate[i] = v * up[i];
  }
}

void AxpyRef(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

const KernelTable& ScalarTable() {
  static const KernelTable table = {
      Isa::kScalar,
      {DotF32, DotF16, DotBF16, DotQ8_0, DotQ4_0},
      {Dequantize<GgmlType::kF32>, Dequantize<GgmlType::kF16>, Dequantize<GgmlType::kBF16>,
       Dequantize<GgmlType::kQ8_0>, Dequantize<GgmlType::kQ4_0>},
      RmsNormRef,
      SiluMulRef,
      AxpyRef,
  };
  return table;
}

}  // namespace gale::kernels
