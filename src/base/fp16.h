// Scalar conversions between f32 and the 16-bit float formats (IEEE half, bfloat16), bit-exact
// with llama.cpp's reference conversions (round to nearest even). SIMD paths use F16C/AVX-512
// instructions, which round the same way.
// NOTE: these are `static inline` on purpose: the ISA kernel files include this header under
// -mavx2/-mavx512 flags, and a shared (COMDAT) static inline copy built there could be the one the
// linker keeps for the scalar code, which would then fault on older CPUs.
#pragma once

#include <cstdint>
#include <cstring>

namespace gale {

static inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static inline float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline float Fp16ToFp32(uint16_t h) {
  // Exact: every half is representable as a float. Handles subnormals, inf and NaN.
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return F32FromBits(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return F32FromBits(sign);
    // Subnormal half: value = mant * 2^-24.
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return F32FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline uint16_t Fp32ToFp16(float f) {
  // Round to nearest even, like F16C's _cvtss_sh(f, 0) and ggml's reference.
  const uint32_t x = F32Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Result is a half subnormal (or zero): value / 2^-24 rounded to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

static inline float Bf16ToFp32(uint16_t b) { return F32FromBits(static_cast<uint32_t>(b) << 16); }

static inline uint16_t Fp32ToBf16(float f) {
  uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

}  // namespace gale
