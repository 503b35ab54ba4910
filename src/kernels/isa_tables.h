// Internal: each ISA translation unit defines one of these; kernels.cc and those units include this file.
#pragma once

#include <cmath>

#include "kernels/kernel_table.h"

namespace gale::kernels {
// Gemma 2's attention soft-capping as ggml computes it: times 1 / cap, tanh, times cap. static:
// every translation unit (the ISA ones included) has its own copy, calling the same libm tanhf.
static inline float SoftCap(float s, float cap) { return cap * std::tanh(s * (1.0f / cap)); }

const KernelTable& ScalarTable();
const KernelTable& Avx2Table();  // with the AVX-VNNI int8 kernels where the CPU has them
const KernelTable& Avx2TableWithoutVnni();
// avx2_vnni.cc: the int8-activation slots with vpdpbusd (bitwise the maddubs ones).
void Avx2FillVnni(KernelTable& t);
// avx2_attention.cc: attend_many of the AVX2 tables.
void Avx2AttendMany(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                    int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap);
const KernelTable& Avx512Table();
// Parts of the AVX-512 table defined in their own files (avx512_packed.cc, avx512_attention.cc).
void Avx512FillPacked(KernelTable& t);
void Avx512AttendMany(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                      int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap);
// The scalar attention, for ISAs whose own kernel does not cover a head size.
void AttendManyReference(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                         int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap);
// The same with V's head size v_head_dim other than K's (outs: [v_head_dim] each): the path of
// every ISA for such caches (no architecture in use has them; the SIMD kernels take K = V).
void AttendManyReferenceKv(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                           int head_dim, int v_head_dim, float* const* outs, float* const* scores, const float* sinks,
                           float softcap);
void SoftmaxReference(float* x, int64_t n);
void RopeApplyReference(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin);
void RopeApplyNeoxReference(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin);
// GELU (tanh approximation as a logistic) times up, the scalar path; SIMD versions use it for tails.
void GeluMulReference(float* gate, const float* up, int64_t n);
inline constexpr float kGeluC1 = 1.5957691216057308f;          // 2 sqrt(2 / pi)
inline constexpr float kGeluC2 = 1.5957691216057308f * 0.044715f;
// The scalar W4A8 products and the W4 dequantizers (row by row through DequantizeRowRef), for
// ISAs without their own.
void GemmQuantW4A8G64Reference(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x,
                               int64_t num_tokens, float* y, int64_t ldy);
void GemmQuantW4A8G128Reference(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x,
                                int64_t num_tokens, float* y, int64_t ldy);
void DequantW4A16G64Reference(const void* src, float* dst, int64_t n);
void DequantW4A16G128Reference(const void* src, float* dst, int64_t n);
void DequantW4A16ZG64Reference(const void* src, float* dst, int64_t n);
void DequantW4A16ZG128Reference(const void* src, float* dst, int64_t n);
// The W4 dequantizers of every ISA in slot order from kSlotW4A16G64 (W4A8 ones dequantize as the
// W4A16 of their group: embeddings, tests).
#define GALE_W4_DEQUANT_REFERENCE                                                                          \
  DequantW4A16G64Reference, DequantW4A16G128Reference, DequantW4A16ZG64Reference, DequantW4A16ZG128Reference, \
      DequantW4A16G64Reference, DequantW4A16G128Reference
// The reference dequantizers of the slots from kSlotQ4_1 on (Q4_1, Q5_0, Q5_1, Q3_K, Q2_K, IQ4_NL,
// IQ4_XS, MXFP4, F8E4M3), in slot order, for every ISA's table (a SIMD one replaces them where it has its own).
void DequantQ4_1Reference(const void* src, float* dst, int64_t n);
void DequantQ5_0Reference(const void* src, float* dst, int64_t n);
void DequantQ5_1Reference(const void* src, float* dst, int64_t n);
void DequantQ3_KReference(const void* src, float* dst, int64_t n);
void DequantQ2_KReference(const void* src, float* dst, int64_t n);
void DequantIQ4_NLReference(const void* src, float* dst, int64_t n);
void DequantIQ4_XSReference(const void* src, float* dst, int64_t n);
void DequantMXFP4Reference(const void* src, float* dst, int64_t n);
void DequantF8E4M3Reference(const void* src, float* dst, int64_t n);
#define GALE_LATER_DEQUANT_REFERENCE                                                                  \
  DequantQ4_1Reference, DequantQ5_0Reference, DequantQ5_1Reference, DequantQ3_KReference, DequantQ2_KReference, \
      DequantIQ4_NLReference, DequantIQ4_XSReference, DequantMXFP4Reference, DequantF8E4M3Reference
// The vector expf's table (SiluMul on AVX2 and AVX-512, computed as glibc's expf): bits of
// 2^(i/32) minus i << 47, i < 32, 64-byte aligned. Built once, in the baseline translation unit.
const uint64_t* ExpfTable32();
// Scalar conversions, for ISAs without their own.
void ToF16Reference(const float* x, uint16_t* dst, int64_t n);
void ToBf16Reference(const float* x, uint16_t* dst, int64_t n);
}  // namespace gale::kernels
