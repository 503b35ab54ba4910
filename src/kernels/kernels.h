// The only numeric API model code sees. Free functions over plain pointers and TensorViews,
// dispatched once at start-up through a KernelTable chosen from CPUID: a scalar reference is
// always built; AVX2 and AVX-512 each live in their own translation unit with their own flags.
// Every output element is reduced in a fixed order that does not depend on batch size or thread
// count (batch invariance, DESIGN.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/thread_pool.h"
#include "kernels/kernel_table.h"
#include "gguf/gguf_file.h"

namespace gale::kernels {

// "scalar", "avx2" or "avx512" -> the Isa (nullopt otherwise). Does not check the CPU.
std::optional<Isa> ParseIsa(std::string_view name);

// The table for an ISA, or nullptr when this CPU cannot run it.
const KernelTable* GetKernelTable(Isa isa);
// Best ISA this CPU supports; GALE_ISA=scalar|avx2|avx512 in the environment caps it.
Isa BestIsa();
const KernelTable& Active();
void SetActiveIsa(Isa isa);  // CHECKs that the CPU supports it
// The active table for people: its ISA's name, with its variant if any ("avx2 (avx-vnni)").
std::string ActiveKernelsName();

// ---- Drivers over the active table ---------------------------------------------------------

// A weight matrix laid out again for one ISA's GEMM (see KernelTable::pack). Owns its bytes,
// unless they are in a caller's buffer (then data's deleter does nothing).
struct PackedWeights {
  Isa isa;
  GgmlType type;
  int64_t num_rows = 0;
  int64_t cols = 0;
  int64_t group_bytes = 0;  // bytes per kPackedRowGroup rows
  std::unique_ptr<uint8_t, void (*)(void*)> data{nullptr, nullptr};
};
// Packs w for the active ISA, or returns nullptr when that ISA reads the GGUF layout directly.
std::unique_ptr<PackedWeights> PackForActiveIsa(const TensorView& w);
// Bytes w takes packed for the active ISA (0 where it is not packed), and the packing into dst
// (that many bytes, 64-byte aligned, owned by the caller): one buffer can then hold every matrix
// of a model without rounding each up to huge pages.
int64_t PackedBytesForActiveIsa(const TensorView& w);
std::unique_ptr<PackedWeights> PackForActiveIsa(const TensorView& w, uint8_t* dst);

// y[t, r] = dot(W[r, :], x[t, :]): W is [rows, cols] (ggml shape {cols, rows}), x is
// [num_tokens, cols], y is [num_tokens, rows]. Rows are split across the pool.
void MatMul(const TensorView& w, const float* x, int64_t num_tokens, float* y, ThreadPool& pool);
// The same product reading packed weights when they were packed for the active ISA (else w).
void MatMul(const TensorView& w, const PackedWeights* packed, const float* x, int64_t num_tokens, float* y,
            ThreadPool& pool);

// Several products of the same activations (wq/wk/wv, w_gate/w_up): each as MatMul computes it,
// bitwise, with the activations quantized once per kind (int8, 16-bit) for all of them. The
// matrices must have the same number of columns.
struct MatMulOutput {
  const TensorView* w;
  const PackedWeights* packed;  // may be nullptr
  float* y;                     // [num_tokens, rows of w]
};
void MatMulSameInput(std::span<const MatMulOutput> outs, const float* x, int64_t num_tokens, ThreadPool& pool);

// Products of different row ranges of one input (a mixture of experts: each expert's matrix times
// the rows of the tokens routed to it): product i is MatMul of its matrix with rows
// [row_begin, row_begin + num_rows) of x ([total_rows, cols]) into its y ([num_rows, rows of w]),
// bitwise, with x quantized once per kind for all of them and every product's row groups in one
// parallel pass (an expert's weights stream once for all its tokens).
struct GroupedProduct {
  MatMulOutput out;
  int64_t row_begin = 0;
  int64_t num_rows = 0;
};
void MatMulGrouped(std::span<const GroupedProduct> products, const float* x, int64_t total_rows, ThreadPool& pool);

// Whether every product reads quantized activations (int8 or 16-bit), so that
// MatMulSameInputNormed can fuse the norm into their quantization.
bool ReadQuantizedActivations(std::span<const MatMulOutput> outs);

// MatMulSameInput of RmsNorm(x[t], w, eps) for each token t, where ReadQuantizedActivations(outs):
// each token is normalized into per-thread scratch and quantized at once, so the normalized rows
// never make a pass through memory. Bitwise RmsNorm of every token, then MatMulSameInput.
struct RmsNormInput {
  const float* x;  // [num_tokens, cols], before the norm
  const float* w;  // [cols]
  float eps;
};
void MatMulSameInputNormed(std::span<const MatMulOutput> outs, const RmsNormInput& in, int64_t num_tokens,
                           ThreadPool& pool);

// out[i, :] = dequantized row ids[i] of W ([rows, cols]); ids must be in range.
void GetRows(const TensorView& w, const int32_t* ids, int64_t num_ids, float* out);

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);
void SiluMul(float* gate, const float* up, int64_t n);
// gate = gelu(gate) * up with GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715
// x^3))) (GeGLU: Gemma), computed as x / (1 + exp(-2 sqrt(2 / pi) (x + 0.044715 x^3))), the same
// function; bitwise the same on every ISA.
void GeluTanhMul(float* gate, const float* up, int64_t n);
// out = (x - mean) / sqrt(variance + eps) * w + b (LayerNorm; b may be null), the sums in double
// as ggml's norm; scalar, the same on every ISA. out may be x.
void LayerNorm(const float* x, const float* w, const float* b, int64_t n, float eps, float* out);
// x = gelu(x) in place, the tanh approximation 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
// (BERT's FFN as llama.cpp runs it); scalar, the same on every ISA.
void GeluTanh(float* x, int64_t n);
// x = softmax(x) in place (n >= 1); y += a * x.
void Softmax(float* x, int64_t n);
void Axpy(float a, const float* x, float* y, int64_t n);
// Gated DeltaNet's recurrence on one head over n tokens (KernelTable::delta_rule).
void DeltaRule(float* m, int64_t s, const struct DeltaRuleTokens& t);

// Rotary embedding in llama's "normal" mode (adjacent pairs (2i, 2i+1) rotate together), applied
// to the first rope_dims of each head of x ([num_heads, head_dim]) at position pos, in two steps
// so a forward pass computes the angles once per token instead of once per layer.
// theta_i = pos * freq_scale / freq_base^(2i / rope_dims). RopeAngles fills cos_sin
// ([rope_dims / 2, 2]) for a position; RopeApply rotates.
// freq_factors (null: none): [rope_dims / 2] divisors of each frequency (Llama 3's rope_freqs).
void RopeAngles(int rope_dims, int64_t pos, float freq_base, float freq_scale, float* cos_sin,
                const float* freq_factors = nullptr);
void RopeApply(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin);
// YaRN (as ggml's rope_yarn): pair i's angle blends the interpolated theta * freq_scale and the
// extrapolated theta by ramp(i) * ext_factor, ramp(i) = 1 - clamp((i - corr_low) / max(0.001,
// corr_high - corr_low), 0, 1); cos and sin are not scaled here (the caller's attention factor).
void RopeAnglesYarn(int rope_dims, int64_t pos, float freq_base, float freq_scale, float ext_factor, float corr_low,
                    float corr_high, float* cos_sin, const float* freq_factors = nullptr);
// NEOX mode (GPT-NeoX, Qwen, Gemma, Phi-3): pairs (i, i + rope_dims / 2) rotate together by the
// same angles (cos_sin from RopeAngles, pair i's angle at cos_sin[2i], cos_sin[2i + 1]).
void RopeApplyNeox(float* x, int num_heads, int head_dim, int rope_dims, const float* cos_sin);

// Bytes of one KV head's row segment (one position): head_dim elements, plus the f16 scale for
// int8/int4 (int4 needs an even head_dim).
inline int64_t KvHeadBytes(KvType type, int64_t head_dim) {
  switch (type) {
    case KvType::kF32: return 4 * head_dim;
    case KvType::kF16:
    case KvType::kBF16: return 2 * head_dim;
    case KvType::kInt8: return 2 + head_dim;
    case KvType::kInt4: return 2 + head_dim / 2;
  }
  return 0;
}
inline bool KvTypeQuantized(KvType type) { return type == KvType::kInt8 || type == KvType::kInt4; }
const char* KvTypeName(KvType type);
std::optional<KvType> ParseKvType(std::string_view name);  // "f32", "f16", "bf16", "int8", "int4"

// One KV head's row segment to and from f32 (scalar; the quantized types round to nearest with
// the f16-rounded scale amax / 127 or amax / 7).
void StoreKvHead(const float* x, int64_t head_dim, KvType type, uint8_t* dst);
void LoadKvHead(const uint8_t* src, int64_t head_dim, KvType type, float* out);

// One layer of a paged KV cache as attention reads it: K and V are each
// [num_blocks, block_size, num_kv_heads] row segments of KvHeadBytes(type, head_dim) bytes, each
// of its own type.
struct KvLayer {
  const uint8_t* k;
  const uint8_t* v;
  int64_t block_size;
  KvType k_type;
  KvType v_type;
};

// Causal attention through block tables. q: [num_tokens, num_heads * head_dim]; token t reads
// positions [0, positions[t]] of its sequence, whose logical block i is physical block
// block_tables[t][i] (tokens of one sequence share one table pointer and come in position
// order). out: [num_tokens, num_heads * head_dim] (head_dim: v_head_dim's, below).
// positions here are cache slots: with KV retention a sequence's slots are fewer than its
// positions (RoPE used the real ones when K was written). scores: null, or per token null or
// [num_heads, positions[t] + 1] floats receiving each head's scaled scores before the softmax.
// window > 0: a sliding window, token t attends to slots [max(0, positions[t] + 1 - window),
// positions[t]] (llama.cpp's standard SWA: keys less than `window` positions back); scores must
// then be null. sinks: null, or per query head a logit that joins each softmax's denominator only
// (gpt-oss's attention sinks). softcap > 0: scores through softcap * tanh(s / softcap) (Gemma 2).
// v_head_dim > 0: V's head size where it differs from K's (head_dim); out is then
// [num_tokens, num_heads * v_head_dim] (the scalar kernel on every ISA).
void Attention(const float* q, int64_t num_tokens, const int32_t* positions, const int32_t* const* block_tables,
               const KvLayer& kv, int num_heads, int num_kv_heads, int head_dim, float* out, ThreadPool& pool,
               float* const* scores = nullptr, int64_t window = 0, const float* sinks = nullptr, float softcap = 0.0f,
               int v_head_dim = 0);

}  // namespace gale::kernels
