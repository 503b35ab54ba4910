// Deterministic random-weight GGUF files of any architecture gale runs, of named or custom
// shapes, for benchmarks and tests. Same seed, same shape and type: the same bytes. The vocab is a
// real SentencePiece-style vocab (bytes, characters, letter pairs and triples) so any prompt
// tokenizes. This file is the generic driver; each architecture's keys, tensors and named shapes
// are its own file's (model/arch/, through ArchSpec).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_writer.h"

namespace gale {

struct SynthShape {
  std::string name = "custom";
  std::string arch = "llama";  // general.architecture
  int64_t dim = 64;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 4;
  int64_t head_dim = 0;  // 0: dim / num_heads; else written as attention.key_length / value_length
  int64_t sliding_window = 0;  // gemma2, gemma3, gpt-oss: attention.sliding_window (0: 512, 512, 128); llama: none
  float attn_softcap = 50.0f, final_softcap = 30.0f;  // gemma2: the soft-capping of scores and logits
  int64_t ffn_dim = 128;
  int64_t vocab_size = 512;
  int64_t context_length = 2048;
  // > 0: a rope_freqs.weight tensor as llama.cpp's converter writes for Llama 3.1's frequency
  // scaling (factor 8, low/high frequency factors 1 and 4), with this as the original context
  // length (8192 in Llama 3.1; a small one here makes most of a small model's dims scaled); for
  // phi3, LongRoPE's long and short factors and attention factor with this original context.
  int64_t rope_freqs_ctx = 0;
  // > 0: YaRN RoPE scaling by this factor from the original context yarn_orig_ctx (the file's
  // rope.scaling.type yarn, factor, original_context_length, as llama.cpp's converters write it).
  double yarn_factor = 0.0;
  int64_t yarn_orig_ctx = 0;
  int64_t pooling_type = 0;  // > 0: {arch}.pooling_type (an embedding model: 1 mean, 2 cls, 3 last); bert: 0 = mean
  // A mixture of experts (llama: Mixtral-style; qwen3moe: required): experts per layer, experts per
  // token, and one expert's width (0: ffn_dim). The router is f32 (converters never quantize it).
  int64_t num_experts = 0;
  int64_t experts_used = 0;
  int64_t expert_ffn = 0;
  std::optional<GgmlType> expert_type;  // the experts' tensors' type (default: the file's type)
  // deepseek2 (latent attention, always with experts): the latent's rank (required), the query's
  // low rank (0: one wq), per head the query/key dims without RoPE, the RoPE dims (shared key part)
  // and the value dims; dense leading layers (of ffn_dim), shared experts (of expert_ffn each),
  // and DeepSeek-V3's routing: sigmoid scores, an exp_probs_b selection bias, expert groups
  // (0: none), weights renormalized and scaled by 2.5.
  // Other architectures: v_head_dim > 0 is V's head size where it differs from K's
  // (attention.value_length).
  int64_t kv_lora_rank = 0, q_lora_rank = 0, nope_dim = 0, rope_dim = 0, v_head_dim = 0;
  int64_t leading_dense = 0, shared_experts = 0, expert_groups = 0, groups_used = 0;
  // glm4moe (always with experts): Q/K/V biases and per-head norms, RoPE on rope_dim dims (0: half
  // the head), leading_dense and shared_experts as above, sigmoid routing with a selection bias,
  // and nextn_layers multi-token-prediction layers at the end (counted in num_layers).
  // gpt-oss (always with experts): biases on Q, K, V, the output and the router and experts, a
  // sink logit per query head, a sliding window (sliding_window) on the even layers.
  int64_t nextn_layers = 0;
  // deepseek4 (DeepSeek-V4, always with experts; q_lora_rank, rope_dim, head_dim and
  // sliding_window as above, one KV head): per layer the compression ratio (0 window only, 4 with
  // the lightning indexer, 128; shorter lists repeat their last value), the first hash_layers
  // layers routed by token id, the indexer's heads, head size and top-k, the grouped low-rank
  // output (out_groups groups of out_lora_rank), hc_count residual copies, and the experts'
  // SwiGLU clamp (0: none).
  std::vector<int64_t> compress_ratios;
  int64_t hash_layers = 0, indexer_heads = 0, indexer_dim = 0, indexer_top_k = 0;
  int64_t out_groups = 0, out_lora_rank = 0, hc_count = 4;
  float swiglu_clamp = 0.0f;
  // deepseek41 (DeepSeek-V4.1; the deepseek4 fields above, ratios 0, 1, 2 or multiples of 4): the
  // layers that compress KV (and own index keys; empty: the first of each run of one ratio) and
  // those that pick rows (empty: the KV sources); Engram at engram_layers (none if empty) with
  // engram_heads heads per n-gram size, rows of engram_dim, n-grams up to engram_ngram, and about
  // engram_rows rows per head (primes from there up).
  std::vector<int64_t> kv_source_layers, index_source_layers, engram_layers;
  // deepseek41's two-level index: the candidate source layer (-1: none), its blocks and their size.
  int64_t candidate_layer = -1, candidate_blocks = 0, candidate_block_size = 0;
  int64_t engram_heads = 0, engram_dim = 0, engram_ngram = 0, engram_rows = 0;
  // qwen35 (Gated DeltaNet): the convolution's taps (0: 4), each linear head's size (0: half the
  // attention head), key heads (0: the KV heads) and value heads (0: twice the key heads), and
  // the period of full-attention layers (0: 4). rope_dim above: rotated dims (0: a quarter head).
  int64_t ssm_conv = 0, ssm_state = 0, ssm_k_heads = 0, ssm_v_heads = 0, full_attention_interval = 0;
  // Keys written last, each under the architecture's prefix ("{arch}." + name), replacing what the
  // shape wrote: any key a loader reads, at any value (tests of every key's honouring or refusal).
  std::vector<std::pair<std::string, GgufValue>> keys;
};

// One --key of `gale synth`: NAME=TYPE:VALUE with TYPE u32, i32, u64, f32, bool or str, or an
// array of them (u32s, i32s, f32s, bools: comma-separated), NAME without the architecture's prefix.
StatusOr<std::pair<std::string, GgufValue>> ParseSynthKey(const std::string& spec);

// A named shape of a real model (its architecture's file lists them: "110m", "tinyllama-1.1b",
// "tiny" (a test-sized model), "qwen2.5-0.5b", "qwen3-0.6b", "phi3-mini", "gemma3-1b",
// "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v4-flash", "deepseek-v4.1-flash"): every per-layer
// shape, the expert count and top-k are the real model's; the mixtures keep some of their layers
// so that they fit a desktop's memory. An error names the known ones.
StatusOr<SynthShape> NamedSynthShape(const std::string& name);
std::vector<std::string> NamedSynthShapes();

// Builds the file: every tensor the architecture has, as llama.cpp's converters name them (Qwen2's
// Q/K/V biases, Qwen3's per-head Q/K norms, Phi-3's fused attn_qkv and ffn_up) so that llama.cpp
// loads it too; weights are generated while writing (WriteFile streams them). The common keys
// (sizes, heads, RoPE scaling, experts, the vocabulary) are written here, then the architecture's
// own keys and tensors by its writer (ArchSpec::synth_write), then SynthShape::keys.
// write_tokenizer: writes a real tokenizer's keys instead of the synthetic vocab (its vocabulary
// must be the shape's vocab_size; `gale synth --tokenizer` passes a Hugging Face one).
StatusOr<GgufWriter> SynthesizeModel(const SynthShape& shape, GgmlType type, uint64_t seed,
                                     const std::function<void(GgufWriter&)>& write_tokenizer = nullptr);

// What an architecture's writer works with: the shape, the file, the weight generators and the
// sizes derived from the shape. Weights are uniform in +-sqrt(3 / fan_in) (unit-variance
// activations through the projections); each tensor's generator is seeded from the seed and the
// tensor's name, so tensors do not depend on the order they are written in.
class SynthWriter {
 public:
  SynthWriter(const SynthShape& shape, GgmlType type, uint64_t seed, GgufWriter* out);

  const SynthShape& s;
  const GgmlType type;         // the matrices'
  const GgmlType expert_type;  // the experts' (SynthShape::expert_type, else type)
  GgufWriter& w;
  const std::string p;         // the key prefix: "{arch}."
  // head_dim: SynthShape::head_dim, else dim / heads; V's head size (v_head_dim where set);
  // Q's, K's and V's row widths and the attention output's; one expert's width.
  int64_t head_dim, v_head, q_dim, kv_dim, v_dim, o_dim, expert_ffn;
  // Control tokens the architecture's files carry in the synthetic vocab's last ids (Phi-3's chat
  // tokens, which llama.cpp's loader looks up); the writer sets them, the vocab is written after.
  std::vector<std::string> control_tokens;

  // A matrix of `out` rows of `in` weights (experts > 0: a [in, out, experts] stack).
  Status Matrix(const std::string& name, int64_t in, int64_t out, GgmlType t, int64_t experts = 0);
  // An f32 tensor of base + uniform(-spread, spread): norm weights (1, or around 1 where a test
  // should see each element reach its own channel), biases around 0; [n], or [n, rows].
  Status Vector(const std::string& name, int64_t n, float base, float spread, int64_t rows = 0);
  Status Ones(const std::string& name, int64_t n) { return Vector(name, n, 1.0f, 0.0f); }
  // An f32 tensor of exactly these values.
  Status Floats(const std::string& name, const std::vector<float>& v);

  // Parts several architectures share. `b` is the layer's prefix "blk.N.".
  Status Qkv(const std::string& b, bool biases);  // attn_q, attn_k, attn_v (and their biases)
  Status Router(const std::string& b);            // ffn_gate_inp, f32 (converters never quantize it)
  Status Experts(const std::string& b);           // ffn_{gate,up,down}_exps
  // DeepSeek-V3's and GLM's mixture: the router, a selection bias, the experts, the shared ones.
  Status BiasedExperts(const std::string& b);
  // ffn_gate, ffn_up, ffn_down (with suffix: ffn_gate_shexp, ...)
  Status GatedFfn(const std::string& b, int64_t width, const std::string& suffix = "");
  uint64_t seed() const { return seed_; }  // for an architecture's own random constants

  // The decoder layer most architectures share (llama's: norms, Q/K/V, output, gated FFN or a
  // mixture of experts) with the variations they take, and the output norm and head before it.
  struct DecoderLayout {
    bool tied_output = false;    // no output.weight: the embedding is the head
    bool fused_qkv = false;      // attn_qkv: Q's, K's and V's rows in one matrix
    bool fused_gate_up = false;  // ffn_up: the gate's rows, then up's
    bool qkv_bias = false;       // attn_{q,k,v}.bias
    bool qk_norm = false;        // attn_q_norm, attn_k_norm: a [head_dim] RMSNorm per head
    bool post_norms = false;     // post_attention_norm and post_ffw_norm around the sublayers
  };
  Status DecoderLayers(const DecoderLayout& layout);

 private:
  uint64_t seed_;
};

// One --key of `gale synth`: NAME=TYPE:VALUE with TYPE u32, i32, u64, f32, bool or str, or an
// array of them (u32s, i32s, f32s, bools: comma-separated), NAME without the architecture's prefix.
StatusOr<std::pair<std::string, GgufValue>> ParseSynthKey(const std::string& spec);

// The synthetic vocab's pieces (with '▁'), scores and token types.
void SynthVocab(int64_t vocab_size, std::vector<std::string>* tokens, std::vector<float>* scores,
                std::vector<int32_t>* types);

}  // namespace gale
