// The ggml tensor types gale understands, with llama.cpp's numeric type ids and block layouts
// (bit-exact), plus the scalar reference quantize/dequantize for each. Kernels live in kernels/;
// this file is only the format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gale {

// Numeric values are the ggml_type ids stored in GGUF files.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
  kBF16 = 30,
};

inline constexpr int kQK8_0 = 32;  // elements per Q8_0 block
inline constexpr int kQK4_0 = 32;  // elements per Q4_0 block

// Q8_0: 32 int8 weights sharing one f16 scale; x = d * q.
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: 32 4-bit weights sharing one f16 scale; element j < 16 is the low nibble of qs[j],
// element j + 16 the high nibble; x = d * (nibble - 8).
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;
  int64_t block_size;       // elements per block
  int64_t block_bytes;      // bytes per block
};

// Block layout of any ggml type id (supported by gale or not), so a file with types gale cannot
// compute with still parses and gets a clear error only where such a tensor is used.
struct GgmlBlockLayout {
  int64_t block_size;
  int64_t block_bytes;
};
std::optional<GgmlBlockLayout> BlockLayout(uint32_t type_id);

// Traits of a type id read from a file, or nullopt when gale does not support it.
std::optional<GgmlTypeTraits> GetTypeTraits(uint32_t type_id);
const GgmlTypeTraits& TypeTraits(GgmlType type);  // for supported types only
std::string_view TypeName(uint32_t type_id);      // "q4_K" etc. even when unsupported; "?" else
std::optional<GgmlType> ParseTypeName(std::string_view name);  // "f16", "q8_0", ...

// Bytes of a row of num_elements; num_elements must be a multiple of the block size.
int64_t RowBytes(GgmlType type, int64_t num_elements);

// Reference conversions, bit-exact with llama.cpp's *_ref functions. n is a multiple of the
// type's block size.
void QuantizeRowRef(GgmlType type, const float* src, void* dst, int64_t n);
void DequantizeRowRef(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace gale
