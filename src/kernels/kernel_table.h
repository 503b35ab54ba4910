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
enum TypeSlot {
  kSlotF32 = 0, kSlotF16, kSlotBF16, kSlotQ8_0, kSlotQ4_0, kSlotQ4_K, kSlotQ5_K, kSlotQ6_K,
  kSlotW4A16G64, kSlotW4A16G128, kSlotW4A16ZG64, kSlotW4A16ZG128, kSlotW4A8G64, kSlotW4A8G128,
  kSlotQ4_1, kSlotQ5_0, kSlotQ5_1, kSlotQ3_K, kSlotQ2_K, kSlotIQ4_NL, kSlotIQ4_XS,
  kSlotMXFP4, kSlotF8E4M3, kNumTypeSlots
};
TypeSlot SlotOf(GgmlType type);

using VecDotFn = float (*)(const void* w_row, const float* x, int64_t n);

// Activations quantized for the int8 paths (Q8_0 and Q4_0 weights): per token, per block of 32,
// d * q with q = round-half-even(x / d) in [-127, 127], d = max|x| / 127, and the block's sum of q
// (for the unsigned-times-signed dot instructions). Same quantizer on every ISA.
// Rows are zero-padded to a multiple of kActPad elements (d = qsum = 0 there), so kernels that
// work in groups of 4 blocks may read past k.
inline constexpr int64_t kActPad = 128;
struct QuantizedActs {
  const int8_t* qs;     // [num_tokens, k_stride]
  const float* d;       // [num_tokens, k_stride / 32]
  const int32_t* qsum;  // [num_tokens, k_stride / 32]
  int64_t k;            // elements per token, a multiple of 32
  int64_t k_stride;     // k rounded up to kActPad
  // 16-bit activations (QuantizeActivations16, the W4A16 packed path): q in [-32767, 32767] with
  // d = max|x| / 32767, split into qs = q >> 8 (signed high bytes) and lo = q & 255 (unsigned low
  // bytes); qsum is the sum of q. nullptr for the int8 activations above.
  const uint8_t* lo = nullptr;  // [num_tokens, k_stride]
  // int8 activations through kernels::MatMul: each block's two 16-value halves' sums of q (Q6_K's
  // sub-blocks), [num_tokens, k_stride / 16]; nullptr where the caller did not compute them.
  const int32_t* half_sums = nullptr;
};

// Element type of the KV cache. int8/int4: each KV head's row segment is an f16 scale followed
// by head_dim symmetric integers (int8: -127..127; int4: -7..7 stored + 8 in nibbles, element 2i
// in the low and 2i+1 in the high nibble of byte i); value = scale * integer.
enum class KvType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kInt8 = 3, kInt4 = 4 };

// The K and V rows of one KV head of one sequence in a paged cache. Position p is in slot
//   block_table[p / block_size] * block_size + p % block_size
// at byte offset slot * k_row_bytes from k and slot * v_row_bytes from v (K and V may be of
// different types). A contiguous cache is one block: block_table = {0}, block_size >= the length.
struct KvBlockView {
  const uint8_t* k;            // K storage of one layer, offset to the KV head's row segment
  const uint8_t* v;            // V storage, same
  const int32_t* block_table;  // [num_logical_blocks] physical block ids
  int64_t block_size;          // positions per block
  int64_t k_row_bytes;         // bytes from one slot to the next in K
  int64_t v_row_bytes;         // in V
  KvType k_type;
  KvType v_type;
  // Null: every query reads the KV head at k / v. Else, per query, which KV head it reads, counted
  // from that one (its row segments are that many k_head_bytes / v_head_bytes further): queries of
  // different heads of one sequence in one call, so a kernel can interleave their work.
  const int32_t* query_heads = nullptr;
  int64_t k_head_bytes = 0;
  int64_t v_head_bytes = 0;

  // The view of the head that query i reads, with query_heads null.
  KvBlockView ForQuery(int i) const {
    KvBlockView one = *this;
    if (query_heads != nullptr) {
      one.k += query_heads[i] * k_head_bytes;
      one.v += query_heads[i] * v_head_bytes;
      one.query_heads = nullptr;
    }
    return one;
  }
};

// Most queries one attend_many call takes.
inline constexpr int kMaxAttendQueries = 16;

// Quantizes one token's activations (k a multiple of 32) into the QuantizedActs layout, zeroing
// the padding up to k_stride.
void QuantizeActivations(const float* x, int64_t k, int64_t k_stride, int8_t* qs, float* d, int32_t* qsum);
// The same at 16 bits (QuantizedActs::lo): relative error 2^-16 of the block's largest value,
// finer than bf16's 2^-9 per value, and exact integer dots on the int8 dot instructions.
void QuantizeActivations16(const float* x, int64_t k, int64_t k_stride, int8_t* hi, uint8_t* lo, float* d,
                           int32_t* qsum);

// Weight repacking: an ISA may lay a weight matrix out again at load time in a form its GEMM
// reads faster. Packed matrices are stored in groups of kPackedRowGroup rows (the last group
// padded); packed_group_bytes(k) is the size of one group. gemm_packed then takes the group
// stride as its row_bytes argument and a row count that starts at a group boundary.
inline constexpr int64_t kPackedRowGroup = 16;
using PackedGroupBytesFn = int64_t (*)(int64_t k);
using PackFn = void (*)(const uint8_t* src, int64_t src_row_bytes, int64_t num_rows, int64_t k, uint8_t* dst);

// Y[t, r] = W[r, :] . X[t, :] for r < num_rows, t < num_tokens; Y row stride ldy. W rows are
// row_bytes apart. Each output is computed by the same sequence of operations whatever
// num_rows and num_tokens are (batch invariance).
using GemmFloatFn = void (*)(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const float* x, int64_t k,
                             int64_t num_tokens, float* y, int64_t ldy);
using GemmQuantFn = void (*)(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const QuantizedActs& x,
                             int64_t num_tokens, float* y, int64_t ldy);
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
// The same with activations rounded to bf16 (to_bf16: round to nearest even), x[t * k_stride + i]
// with k_stride = k rounded up to kBf16ActPad and zeros after k.
inline constexpr int64_t kBf16ActPad = 32;
using GemmBf16Fn = void (*)(const uint8_t* w, int64_t row_bytes, int64_t num_rows, const uint16_t* x, int64_t k,
                            int64_t num_tokens, float* y, int64_t ldy);

// The tokens of KernelTable::delta_rule: token i's k, q, v at k + i * stride (and q, v likewise),
// its decay and beta, its output at out + i * out_stride.
struct DeltaRuleTokens {
  int64_t n = 0;
  const float *k = nullptr, *q = nullptr, *v = nullptr;
  int64_t stride = 0;
  const float *decay = nullptr, *beta = nullptr;
  float scale = 1.0f;
  float* out = nullptr;
  int64_t out_stride = 0;
};

struct KernelTable {
  Isa isa;
  // dot(w_row dequantized, x) over n elements; n is a multiple of the type's block size
  // (nullptr for the K-quants: they go through dequantize_row).
  VecDotFn vec_dot[kNumTypeSlots];
  DequantizeRowFn dequantize_row[kNumTypeSlots];
  // Matrix products: gemm_float for F32/F16/BF16 weights (f32 activations), gemm_quant for
  // Q8_0/Q4_0 weights (int8 activations); nullptr where the slot uses the other one. Slots with
  // neither (the K-quants, for now) are dequantized row by row and multiplied as f32.
  GemmFloatFn gemm_float[kNumTypeSlots];
  GemmQuantFn gemm_quant[kNumTypeSlots];
  // Optional repacked layout per slot: pack and packed_group_bytes set with one of gemm_packed
  // (int8 activations) or gemm_packed_a16 (16-bit activations), or all nullptr.
  PackedGroupBytesFn packed_group_bytes[kNumTypeSlots];
  PackFn pack[kNumTypeSlots];
  GemmQuantFn gemm_packed[kNumTypeSlots];
  GemmQuantFn gemm_packed_a16[kNumTypeSlots];
  // BF16 weights times bf16 activations where the ISA has a bf16 dot product (AVX512-BF16's
  // vdpbf16ps: twice the multiply-adds of an f32 FMA), as llama.cpp does for BF16 matrices; when
  // set it replaces gemm_float for the slot at every batch size. nullptr elsewhere.
  GemmBf16Fn gemm_bf16[kNumTypeSlots];
  // out[i] = w[i] * x[i] / sqrt(mean(x^2) + eps)
  void (*rms_norm)(const float* x, const float* w, int64_t n, float eps, float* out);
  // gate[i] = silu(gate[i]) * up[i]
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  // y[i] += a * x[i]
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // dst[i] = x[i] as f16 / bf16, round to nearest even (bitwise Fp32ToFp16 / Fp32ToBf16).
  void (*to_f16)(const float* x, uint16_t* dst, int64_t n);
  void (*to_bf16)(const float* x, uint16_t* dst, int64_t n);
  // Query heads that share one KV head's cache (or, with kv.query_heads, each its own KV head of
  // one sequence): out_i = softmax(q_i . k_p / sqrt(head_dim)) . v_p over positions p < lens[i],
  // K/V rows read through the block table of kv. Each query's reduction order depends only on its
  // own length, not on the other queries nor on the block size (batch invariance; a paged cache
  // gives bitwise what a contiguous one gives).
  // scores: null, or per query null or [lens[i]] floats that receive its scaled scores
  // q_i . k_p / sqrt(head_dim) before the softmax (KV retention's attention tracking).
  // sinks: null, or per query a logit that joins the softmax's denominator only (gpt-oss's
  // attention sinks: out_i = sum_p e^(s_p) v_p / (e^(sink_i) + sum_p e^(s_p))); -inf for none.
  // softcap > 0: every score s becomes softcap * tanh(s / softcap) before the softmax (and in
  // scores) (Gemma 2's attention logit soft-capping); 0 for none.
  void (*attend_many)(const float* const* qs, const int64_t* lens, int num_queries, const KvBlockView& kv,
                      int head_dim, float* const* outs, float* const* scores, const float* sinks, float softcap);
  // x = softmax(x) in place, n >= 1 (KV retention's attention tracking; not batch-critical).
  void (*softmax)(float* x, int64_t n);
  // Rotates adjacent pairs (x[2i], x[2i+1]) of the first rope_dims of each head of x
  // ([num_heads, head_dim]) by the angle whose cos, sin are cos_sin[2i], cos_sin[2i+1]:
  // (x0 c - x1 s, x0 s + x1 c), each product rounded then summed (bitwise the scalar path).
  void (*rope_apply)(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin);
  // gate[i] = gelu(gate[i]) * up[i], GELU's tanh approximation written as a logistic:
  // x * (1 / (1 + exp(-x * (c1 + c2 * x * x)))), c1 = 2 sqrt(2 / pi), c2 = c1 * 0.044715, each
  // operation rounded as the scalar path rounds it (bitwise the scalar path).
  void (*gelu_mul)(float* gate, const float* up, int64_t n);
  // The same in NEOX mode: pairs (x[i], x[i + rope_dims / 2]) rotate by cos_sin[2i], cos_sin[2i+1].
  void (*rope_apply_neox)(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin);
  // The first index of the largest of x[0, n), n >= 1; NaNs never win (a NaN at 0 returns 0).
  int64_t (*argmax)(const float* x, int64_t n);
  // out[i] = expf(x[i] - m), bitwise glibc's expf (the sampler's softmax weights).
  void (*exp_shifted)(const float* x, float m, float* out, int64_t n);
  // QuantizeActivations / QuantizeActivations16 (above), bitwise the scalar ones.
  void (*quantize_acts)(const float* x, int64_t k, int64_t k_stride, int8_t* qs, float* d, int32_t* qsum);
  void (*quantize_acts16)(const float* x, int64_t k, int64_t k_stride, int8_t* hi, uint8_t* lo, float* d,
                          int32_t* qsum);
  // n tokens of the gated delta rule on one head's state m ([s, s]: row j is value element j over
  // the key elements). For each token i in order: m_j *= decay[i]; d = (v_j - m_j . k) * beta[i];
  // m_j += d * k; out_j = (m_j . q) * scale (Gated DeltaNet's recurrence). A row's update reads
  // only that row, so a row may go through several tokens before the next row (the state then
  // streams through the cache once per several tokens, not per token); a row's arithmetic is the
  // same however the loops are blocked, so n tokens at once are bitwise n calls of one.
  void (*delta_rule)(float* m, int64_t s, const DeltaRuleTokens& t);
  // What this table adds to its ISA's baseline where the CPU allows (shown beside the ISA's name),
  // or nullptr: "avx-vnni" for AVX2 with 256-bit vpdpbusd.
  const char* variant = nullptr;
};

}  // namespace gale::kernels
