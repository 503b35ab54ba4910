// Type table and reference (de)quantization. The quantizers follow llama.cpp's
// quantize_row_q8_0_ref / quantize_row_q4_0_ref exactly so our files match theirs byte for byte.
#include "gguf/ggml_types.h"

#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"

namespace gale {
namespace {

constexpr GgmlTypeTraits kTraits[] = {
    {GgmlType::kF32, "f32", 1, 4},
    {GgmlType::kF16, "f16", 1, 2},
    {GgmlType::kQ4_0, "q4_0", kQK4_0, sizeof(BlockQ4_0)},
    {GgmlType::kQ8_0, "q8_0", kQK8_0, sizeof(BlockQ8_0)},
    {GgmlType::kQ4_K, "q4_K", kQK_K, sizeof(BlockQ4_K)},
    {GgmlType::kQ5_K, "q5_K", kQK_K, sizeof(BlockQ5_K)},
    {GgmlType::kQ6_K, "q6_K", kQK_K, sizeof(BlockQ6_K)},
    {GgmlType::kBF16, "bf16", 1, 2},
};

// Names of all ggml type ids, for error messages about types gale does not support yet.
constexpr std::string_view kAllNames[] = {
    "f32",  "f16",  "q4_0", "q4_1", "q4_2", "q4_3", "q5_0", "q5_1",    "q8_0",    "q8_1",
    "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s",
    "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "i8", "i16", "i32", "i64", "f64", "iq1_m", "bf16"};

// Indexed by ggml type id; {0, 0} marks ids that were removed from ggml.
constexpr GgmlBlockLayout kLayouts[] = {
    {1, 4},     {1, 2},     {32, 18},   {32, 20},  {0, 0},    {0, 0},   {32, 22},  {32, 24},
    {32, 34},   {32, 36},   {256, 84},  {256, 110}, {256, 144}, {256, 176}, {256, 210}, {256, 292},
    {256, 66},  {256, 74},  {256, 98},  {256, 50}, {32, 18},  {256, 110}, {256, 82}, {256, 136},
    {1, 1},     {1, 2},     {1, 4},     {1, 8},    {1, 8},    {256, 56}, {1, 2}};

void QuantizeQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(x[b * kQK8_0 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK8_0; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::roundf(x[b * kQK8_0 + j] * id));
    }
  }
}

void QuantizeQ4_0(const float* x, BlockQ4_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK4_0; ++b) {
    const float* xb = x + b * kQK4_0;
    float amax = 0.0f;  // largest magnitude
    float max = 0.0f;   // the value with that magnitude, sign kept
    for (int j = 0; j < kQK4_0; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[j + kQK4_0 / 2] * id;
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void DequantizeQ4_K(const BlockQ4_K* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    const float dmin = Fp16ToFp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int g = 0; g < 4; ++g) {
      const auto [d1, m1, d2, m2] = KQuantGroupScales(d, dmin, b[i].scales, g);
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void DequantizeQ5_K(const BlockQ5_K* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    const float dmin = Fp16ToFp32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int g = 0; g < 4; ++g) {
      const auto [d1, m1, d2, m2] = KQuantGroupScales(d, dmin, b[i].scales, g);
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void DequantizeQ6_K(const BlockQ6_K* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = Fp16ToFp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

bool CanQuantize(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 || type == GgmlType::kQ8_0 ||
         type == GgmlType::kQ4_0;
}

std::optional<GgmlBlockLayout> BlockLayout(uint32_t type_id) {
  if (type_id >= std::size(kLayouts) || kLayouts[type_id].block_size == 0) return std::nullopt;
  return kLayouts[type_id];
}

std::optional<GgmlTypeTraits> GetTypeTraits(uint32_t type_id) {
  for (const auto& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == type_id) return t;
  }
  return std::nullopt;
}

const GgmlTypeTraits& TypeTraits(GgmlType type) {
  for (const auto& t : kTraits) {
    if (t.type == type) return t;
  }
  CHECK(false && "unsupported GgmlType");
  return kTraits[0];
}

std::string_view TypeName(uint32_t type_id) {
  if (type_id < std::size(kAllNames)) return kAllNames[type_id];
  return "?";
}

std::optional<GgmlType> ParseTypeName(std::string_view name) {
  for (const auto& t : kTraits) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

int64_t RowBytes(GgmlType type, int64_t num_elements) {
  const auto& t = TypeTraits(type);
  return num_elements / t.block_size * t.block_bytes;
}

void QuantizeRowRef(GgmlType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToFp16(src[i]);
      return;
    }
    case GgmlType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(src[i]);
      return;
    }
    case GgmlType::kQ8_0:
      CHECK(n % kQK8_0 == 0);
      QuantizeQ8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    case GgmlType::kQ4_0:
      CHECK(n % kQK4_0 == 0);
      QuantizeQ4_0(src, static_cast<BlockQ4_0*>(dst), n);
      return;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      break;
  }
  CHECK(false && "QuantizeRowRef: unsupported type");
}

void DequantizeRowRef(GgmlType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case GgmlType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
      return;
    }
    case GgmlType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
      return;
    }
    case GgmlType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / kQK8_0; ++i) {
        const float d = Fp16ToFp32(b[i].d);
        for (int j = 0; j < kQK8_0; ++j) dst[i * kQK8_0 + j] = d * b[i].qs[j];
      }
      return;
    }
    case GgmlType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / kQK4_0; ++i) {
        const float d = Fp16ToFp32(b[i].d);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
          dst[i * kQK4_0 + j] = d * ((b[i].qs[j] & 0x0f) - 8);
          dst[i * kQK4_0 + j + kQK4_0 / 2] = d * ((b[i].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case GgmlType::kQ4_K:
      DequantizeQ4_K(static_cast<const BlockQ4_K*>(src), dst, n);
      return;
    case GgmlType::kQ5_K:
      DequantizeQ5_K(static_cast<const BlockQ5_K*>(src), dst, n);
      return;
    case GgmlType::kQ6_K:
      DequantizeQ6_K(static_cast<const BlockQ6_K*>(src), dst, n);
      return;
  }
  CHECK(false && "DequantizeRowRef: unsupported type");
}

}  // namespace gale
