// The pieces architectures are built from (model/arch/*.cc): one ForwardPass per Forward call
// holds the batch, its cache, scratch and threads, and the per-token data every layer shares
// (RoPE angles, block tables, cache slots, rows for tracked attention scores); its methods are
// the blocks: normed products, bias, per-head norm, RoPE + KV write + paged attention (with KV
// retention's tracking), output projection, gated FFN, output head. Profiler spans and
// calibration hooks (ActivationObserver) live here, not in each architecture.
//
// Every block splits work across threads by token (or by fixed blocks of an output), never by
// the batch's shape, so a token's results do not depend on what else is in the batch.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "kv/kv_storage.h"
#include "model/model.h"
#include "model/sharding.h"

namespace gale {

class ProfileSpan;

// Products of one input, given as the matrices and their outputs.
struct SameInput {
  kernels::MatMulOutput o[3];
  size_t n = 0;
  SameInput(std::initializer_list<std::pair<const MatrixWeight*, float*>> outs) {
    CHECK(outs.size() <= std::size(o));
    for (const auto& [w, y] : outs) o[n++] = {&w->view, w->packed.get(), y};
  }
  std::span<const kernels::MatMulOutput> span() const { return {o, n}; }
};

// The seven matrices of a dense decoder layer: attention's Q, K, V and output, the FFN's gate,
// up and down. Architectures' layer structs derive from it.
struct DenseMatrices {
  MatrixWeight wq, wk, wv, wo, w_gate, w_up, w_down;
  void AppendTo(std::vector<MatrixWeight*>* all) {
    for (MatrixWeight* w : {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}) all->push_back(w);
  }
};

// The dense split of a layer (Megatron-LM's): Q, K, V, gate and up by rows, output and down by
// columns. `layer` names it in errors.
Status ShardDense(DenseMatrices& m, const TensorSharder& sharder, int64_t layer);

// One expert of a mixture: a gated FFN of the expert width, with biases where the model has them
// (gpt-oss: rows of the file's [width, experts] ffn_{gate,up,down}_exps.bias; null elsewhere).
struct ExpertMatrices {
  MatrixWeight gate, up, down;
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
};

// A mixture-of-experts FFN (llama.cpp's tensors): the router ffn_gate_inp ([num_experts] rows of
// dim, f32 in every converter's output), its bias where the model has one, the selection bias
// exp_probs_b (DeepSeek-V3: added to the scores for the choice only), the experts (one 3-D tensor
// per matrix in the file, one view per expert here so each packs and streams on its own), and
// the shared experts' FFN where there are any.
struct MoeWeights {
  MatrixWeight router;
  TensorView router_bias, selection_bias;  // empty (data null) where absent
  std::vector<ExpertMatrices> experts;
  MatrixWeight shared_gate, shared_up, shared_down;  // empty where num_shared == 0
  // Qwen2-MoE's and Qwen3.5-MoE's gate of the shared experts (ffn_gate_inp_shexp, [dim] f32):
  // their output times sigmoid(gate . x) per token; empty where absent.
  TensorView shared_expert_gate;
  // DeepSeek-V4's hash routing: [vocab, num_used] expert ids per token id (ffn_gate_tid2eid), the
  // router then only weighs them; null: the router chooses.
  const int32_t* token_experts = nullptr;
  int64_t token_experts_vocab = 0;
  // DeepSeek-V4's SwiGLU clamp (swiglu_clamp_exp / _shexp): gate = min(gate, c) and up = clamp(up,
  // -c, c) before silu(gate) * up; none at or below 1e-6 (llama.cpp's threshold).
  float clamp = 0.0f, shared_clamp = 0.0f;
  bool has_shared() const { return !shared_gate.view.shape.empty(); }
  void AppendTo(std::vector<MatrixWeight*>* all);
};
// Reads a layer's mixture (prefix "blk.N."): ffn_gate_inp, ffn_{gate,up,down}_exps (or the fused
// ffn_gate_up_exps: per expert the gate's rows, then up's, as llama.cpp splits it), and
// ffn_gate_inp.bias, exp_probs_b.bias, ffn_{gate,up,down}_exps.bias (all three or none, f32) and
// ffn_{gate,up,down}_shexp where the file has them (the shared ones required when
// hp.moe.num_shared > 0), with ffn_gate_inp_shexp where the file has it.
Status LoadMoeWeights(class TensorLoader& tensors, const std::string& prefix, const ModelHParams& hp, MoeWeights* w);

// One token's routing (llama.cpp's build_moe_ffn): scores ([num_experts]) holds the router's
// logits on entry and the selection scores on return (the gating's probabilities plus
// selection_bias where given); chosen ([num_used]) receives the chosen experts, best first, and
// weight their weights (the probabilities of the chosen, softmaxed among themselves for
// kSoftmaxWeight, renormalized and scaled as moe says). Ties go to the lower expert id.
// scratch: [3 * num_experts] floats.
// fixed: the token's experts where a table chose them (MoeWeights::token_experts; their weights
// still come from the scores), or null.
void RouteToken(const MoeHParams& moe, float* scores, const float* selection_bias, int32_t* chosen, float* weight,
                float* scratch, const int32_t* fixed = nullptr);

// A layer's feed-forward that is a dense gated FFN in a mixture's leading layers
// (MoeHParams::dense_layer) and a mixture of experts in the others.
struct LayerFfn {
  MatrixWeight gate, up, down;  // dense layers
  MoeWeights moe;               // the others
  // Reads ffn_{gate,up,down} (of ffn_dim) or the mixture (LoadMoeWeights) of layer `layer`.
  Status Load(class TensorLoader& tensors, const std::string& prefix, const ModelHParams& hp, int64_t layer);
  void AppendTo(std::vector<MatrixWeight*>* all, const ModelHParams& hp, int64_t layer);
};

// Latent attention's matrices (deepseek2's tensors, MLA format): the query projection (wq, or the
// low-rank pair wq_a -> q_a_norm -> wq_b), the joint latent-and-RoPE projection wkv_a with the
// latent's norm, per head the key up-projection wk_b ([kv_lora_rank] rows of nope_dim: queries
// are absorbed through it into the latent space) and the value up-projection wv_b ([v_head_dim]
// rows of kv_lora_rank), and the output projection.
struct LatentAttentionWeights {
  MatrixWeight wq, wq_a, wq_b;  // wq where the file has no q_lora_rank, else wq_a and wq_b
  TensorView q_a_norm;
  MatrixWeight wkv_a;
  TensorView kv_a_norm;
  std::vector<MatrixWeight> wk_b, wv_b;  // [num_heads] each
  MatrixWeight wo;
  void AppendTo(std::vector<MatrixWeight*>* all);
};

// The feed-forward's gate activation: SiLU (SwiGLU), GELU with the tanh approximation (GeGLU), or
// gpt-oss's clamped SwiGLU (ggml's swiglu_oai: x = min(gate, 7), y = clamp(up, -7, 7),
// x / (1 + e^(-1.702 x)) * (y + 1)).
enum class GateActivation : uint8_t { kSilu = 0, kGeluTanh = 1, kSwigluOai = 2 };

class ForwardPass {
 public:
  // Sizes the workspace for the batch (Model::Forward has checked it) and fills the per-token
  // tables. freq_factors: RoPE frequency divisors ([rope_dims / 2], Llama 3's rope_freqs) or null.
  ForwardPass(const ModelHParams& hp, const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool,
              const float* freq_factors);

  int64_t num_tokens() const { return n_; }
  // The sublayers' outputs replace ws.x instead of adding to it (DeepSeek-V4's hyper-connections
  // add them to the residual copies themselves).
  void set_replace_residual(bool on) { replace_residual_ = on; }
  Workspace& ws() { return ws_; }
  // The layers this pass runs (ForwardBatch::first_layer/end_layer: a pipeline stage's).
  int64_t first_layer() const { return first_layer_; }
  int64_t end_layer() const { return end_layer_; }

  // ws.x = the tokens' rows of the embedding table, times scale (Gemma: sqrt(dim)); a stage after
  // the first copies its input rows (ForwardBatch::input) instead.
  void Embed(const TensorView& token_embd, float scale = 1.0f);
  // outs = products of RmsNorm(ws.x) with norm_w; the observer sees the normed rows as `which`.
  void NormedProducts(int64_t layer, const float* norm_w, const SameInput& outs, LinearInput which, const char* name);
  // outs = products of x ([num_tokens, in]) without a norm (BERT's post-norm layers); the
  // observer sees x as `which`.
  void Products(int64_t layer, const float* x, int64_t in, const SameInput& outs, LinearInput which, const char* name);
  // y[t, :] += bias for every token; y is [num_tokens, width], bias f32 [width].
  void AddBias(float* y, const TensorView& bias, int64_t width);
  // RmsNorm of each head's row of x ([num_tokens, num_heads * head_dim]) with w ([head_dim]).
  void HeadNorm(float* x, int64_t num_heads, const TensorView& w, const char* name, int64_t layer);
  // RoPE on ws.q and ws.k (the calibrated key transform where key_channels is given and the
  // cache uses it), the cache write of K and V, then attention of ws.q over the cache into ws.xb
  // ([num_tokens, q_dim]), with KV retention's tracking where the batch asks for it. The layer's
  // sliding window (hp.LayerWindow) and its own RoPE base where it has one apply; queries are
  // scaled by hp.query_scale. sinks: null, or per query head a logit that joins each softmax's
  // denominator (gpt-oss's attention sinks, [num_heads]).
  void Attention(int64_t layer, const KeyChannels* key_channels, const float* sinks = nullptr);
  // Latent attention (hp.mla) of n = RmsNorm(ws.x) * norm_w, in the absorbed form for every
  // token: each head's query = [wk_b(h) q_nope(h), RoPE(q_pe(h))] against the cache rows
  // [RmsNorm(latent), RoPE(k_pe)] (one row per position, both K and V: multi-query attention over
  // kv_lora_rank + rope_dims), scaled as hp.query_scale says; each head's output's latent part
  // through wv_b(h), the heads through wo, added to ws.x.
  void LatentAttention(int64_t layer, const float* norm_w, const LatentAttentionWeights& w);
  // ws.x += ws.xb * wo (+ bias where given), or RmsNorm(that) * post_norm where given (Gemma's
  // post-attention norm); the observer sees ws.xb as kAttnOut.
  void OutputProjection(int64_t layer, const MatrixWeight& wo, const TensorView* post_norm = nullptr,
                        const TensorView* bias = nullptr);
  // ws.x += down(act(gate(n)) * up(n)) with n = RmsNorm(ws.x) * norm_w, the sum normed by
  // post_norm first where given.
  void GatedFfn(int64_t layer, const float* norm_w, const MatrixWeight& gate, const MatrixWeight& up,
                const MatrixWeight& down, GateActivation act = GateActivation::kSilu,
                const TensorView* post_norm = nullptr);
  // ws.x += the mixture of experts of n = RmsNorm(ws.x) * norm_w: each token's chosen experts'
  // down(act(gate(n)) * up(n)) times their weights, summed best first, plus the shared experts'
  // FFN of n where the model has one; the sum normed by post_norm first where given. Tokens are
  // grouped by expert, so an active expert's weights stream once per step for all its tokens;
  // a token's result does not depend on which other tokens share its experts.
  void MoeFfn(int64_t layer, const float* norm_w, const MoeWeights& w, GateActivation act = GateActivation::kSilu,
              const TensorView* post_norm = nullptr);
  // GatedFfn or MoeFfn, as the layer is.
  void Ffn(int64_t layer, const float* norm_w, const LayerFfn& w);
  // ws.logits = output(RmsNorm(x) * norm_w) for the rows the batch wants (soft-capped where
  // hp.final_softcap says), [rows, output's rows]: the vocabulary, or a tensor-parallel rank's
  // share (Model::head_rows). Nothing in a pipeline stage (ws.x is its output;
  // ForwardBatch::output_head).
  void OutputHead(const TensorView& output_norm, const MatrixWeight& output);
  // An encoder's end (no language-model head): ws.hidden = ws.x's rows the batch names in
  // hidden_rows, as they are; the logit rows the batch wants are zeros (embedding requests
  // sample one token that is never shown).
  void EncoderOutput();
  // x[t, :] = LayerNorm(x[t, :]) * w + b for every token (eps hp.norm_eps; w and b f32 [dim]).
  void LayerNormRows(float* x, const TensorView& w, const TensorView& b, const char* name, int64_t layer);

 private:
  // The block tables layer l's tokens read ([n], their layer group's).
  const int32_t* const* Tables(int64_t layer) const { return ws_.tables.data() + kv_.groups().group_of[layer] * n_; }
  void AccumulateAttention(int64_t layer);
  // ws.xb = RmsNorm(ws.x) * norm_w per token; the observer sees it as `which`.
  void NormRows(int64_t layer, const float* norm_w, LinearInput which);
  // Tensor parallelism: ws.xb2's rows summed over the ranks (ForwardBatch::partial_sums).
  void SumPartials(int64_t layer);
  // MoeFfn's steps, in order.
  void MoeRoute(int64_t layer, const MoeWeights& w, ProfileSpan& span);
  std::vector<int64_t> MoeGather(int64_t layer, ProfileSpan& span);
  void MoeExperts(int64_t layer, const MoeWeights& w, GateActivation act, const std::vector<int64_t>& first,
                  ProfileSpan& span);
  void MoeShared(int64_t layer, const MoeWeights& w, GateActivation act, ProfileSpan& span);
  void MoeCombine(bool shared);
  // ws.x += ws.xb2, through RmsNorm(.) * post_norm where given.
  void Residual(int64_t layer, const TensorView* post_norm);

  const ModelHParams& hp_;
  const ForwardBatch& batch_;
  KvStorage& kv_;
  Workspace& ws_;
  ThreadPool& pool_;
  int64_t n_ = 0;
  int64_t first_layer_ = 0, end_layer_ = 0;
  bool tracking_ = false;
  bool replace_residual_ = false;
  int64_t kv_positions_ = 0;  // cache rows attention reads per layer, for the profile's bytes
  std::vector<int32_t> seq_end_slots_;  // encoders: the last slot of each token's sequence
};

// y = x * w^T; a matrix kept as parts (MatrixWeight::parts) is each part's product over its
// columns of x, added in TreeSum's order.
void MatMul(const MatrixWeight& w, const float* x, int64_t num_tokens, float* y, ThreadPool& pool);
inline int64_t WeightBytes(const MatrixWeight& w) { return static_cast<int64_t>(w.view.num_bytes); }

}  // namespace gale
