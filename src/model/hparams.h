// Hyperparameters of a decoder-only transformer, read from GGUF metadata under the architecture's
// prefix (`qwen3.embedding_length`, ...) with llama.cpp's key names and defaults. What every
// architecture shares lives here; an architecture's own keys are read by its file in model/arch/.
#pragma once

#include <utility>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace gale {

// How RoPE pairs a head's dims: llama's "normal" mode rotates adjacent pairs (2i, 2i+1); NEOX
// (GPT-NeoX, Qwen, Gemma, Phi-3) rotates the halves' pairs (i, i + rope_dims / 2).
// kNone: no rotary embedding (BERT: learned position embeddings instead).
enum class RopeStyle : uint8_t { kNormal = 0, kNeox = 1, kNone = 2 };

// How a sequence's hidden states become one embedding (GGUF `{arch}.pooling_type`, llama.cpp's
// values): the mean over its tokens, the first token's (CLS), or the last token's. Of the final
// norm's output, as llama.cpp pools.
enum class Pooling : uint8_t { kNone = 0, kMean = 1, kCls = 2, kLast = 3 };
const char* PoolingName(Pooling p);  // "none", "mean", "cls", "last"
StatusOr<Pooling> ParsePooling(const std::string& name);

// How a mixture of experts scores its experts (llama.cpp's expert_gating_func values): softmax
// over all experts, then the top k (Mixtral, Qwen-MoE); sigmoid of each (DeepSeek-V3, GLM-4.5+);
// the top k of the raw logits, then a softmax over those k (gpt-oss).
enum class ExpertGating : uint8_t { kSoftmax = 1, kSigmoid = 2, kSoftmaxWeight = 3, kSqrtSoftplus = 4 };

// A mixture-of-experts feed-forward's shape and routing ({arch}.expert_* keys, llama.cpp's names).
// num_experts == 0: a dense model. What a key leaves open (the gating where the file has none,
// whether weights are renormalized) the architecture sets, as llama.cpp's graph for it does.
struct MoeHParams {
  int64_t num_experts = 0;     // expert_count
  int64_t num_used = 0;        // expert_used_count: experts per token
  int64_t expert_ffn = 0;      // expert_feed_forward_length: one expert's hidden width
  int64_t num_shared = 0;      // expert_shared_count: always-on experts, one FFN of their width
  int64_t shared_ffn = 0;      // expert_shared_feed_forward_length (0: expert_ffn * num_shared)
  int64_t leading_dense = 0;   // leading_dense_block_count: the first layers have a dense FFN
  ExpertGating gating = ExpertGating::kSoftmax;
  bool norm_weights = false;   // the chosen experts' weights divided by their sum
  float weights_scale = 1.0f;  // expert_weights_scale, after the normalization
  // Group-limited routing (DeepSeek-V3): experts in num_groups equal groups, a token choosing
  // among the groups_used groups whose two best selection scores sum highest. 0: no groups.
  int64_t num_groups = 0, groups_used = 0;

  bool enabled() const { return num_experts > 0; }
  bool dense_layer(int64_t layer) const { return !enabled() || layer < leading_dense; }
  // Mixtral's and Qwen-MoE's routing, as llama.cpp's graphs for them fix it: softmax, the top k
  // renormalized, experts of default_ffn where the file names no width; an error naming `arch`
  // when the file asks for shared experts, groups or dense leading layers.
  Status SetSoftmaxTopK(const std::string& arch, int64_t default_ffn);
};

// Latent attention (DeepSeek's MLA, GGUF "deepseek2" as llama.cpp's converter writes it since it
// stores the absorbed form): queries (through a low-rank q_lora_rank bottleneck where it is > 0)
// of nope_dim + rope dims per head; one compressed latent of kv_lora_rank per position, which with
// its RoPE part (rope_dims, shared by all heads) is the cache row, both K and V; v_head_dim
// values per head come out of the latent through a per-head up-projection.
struct MlaHParams {
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t nope_dim = 0;    // key_length_mla - rope_dims
  int64_t v_head_dim = 0;  // value_length_mla
  bool enabled() const { return kv_lora_rank > 0; }
};

struct ModelHParams {
  std::string arch;         // general.architecture
  int64_t dim = 0;          // embedding_length
  int64_t ffn_dim = 0;      // feed_forward_length
  int64_t num_layers = 0;   // block_count less the multi-token-prediction layers (never run)
  int64_t num_nextn_layers = 0;  // nextn_predict_layers: the last layers of block_count
  int64_t num_heads = 0;    // attention.head_count
  int64_t num_kv_heads = 0; // attention.head_count_kv (defaults to num_heads)
  int64_t head_dim = 0;     // attention.key_length (defaults to dim / num_heads): Q's and K's
  int64_t v_head_dim = 0;   // attention.value_length where it differs from key_length; 0: head_dim
  int64_t rope_dims = 0;    // rope.dimension_count (defaults to head_dim)
  int64_t context_length = 0;
  int64_t vocab_size = 0;   // rows of token_embd
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor for linear scaling
  float rope_attn_factor = 1.0f;  // multiplies RoPE's cos and sin (LongRoPE's, YaRN's attention scaling)
  float rope_attn_factor_file = 1.0f;  // rope.scaling.attn_factor as the file says (without YaRN's term)
  // YaRN (rope.scaling.type yarn): ext_factor > 0, the correction dims' range in pairs.
  float yarn_ext_factor = 0.0f;
  float yarn_corr_low = 0.0f, yarn_corr_high = 0.0f;
  // Its inputs, for architectures that apply it at another base too (DeepSeek-V4: YarnCorrDims).
  double yarn_orig_ctx = 0.0, yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  RopeStyle rope_style = RopeStyle::kNormal;  // set by the architecture
  // Sliding-window attention (set by the architecture): the window in positions, 0 for none, and
  // which layers use it ([num_layers]; empty: all when sliding_window > 0). Windowed layers may
  // have their own RoPE base (rope_freq_base_swa > 0): unscaled (Gemma 3), or scaled as the
  // other layers (rope_swa_scaled: Gemma 2, gpt-oss).
  int64_t sliding_window = 0;
  std::vector<uint8_t> swa_layers;
  float rope_freq_base_swa = 0.0f;
  bool rope_swa_scaled = false;
  float yarn_corr_low_swa = 0.0f, yarn_corr_high_swa = 0.0f;  // YaRN's correction dims at that base
  // attention.key_length_swa, value_length_swa, rope.dimension_count_swa as the file sets them
  // (0: absent); windowed layers of other sizes are not supported (CheckWindowedSizes).
  int64_t swa_key_length = 0, swa_value_length = 0, swa_rope_dims = 0;
  // Multiplies the queries before attention's 1 / sqrt(head_dim) (Gemma's query_pre_attn_scalar).
  float query_scale = 1.0f;
  // Gemma 2's soft-capping (set by the architecture): attention scores and the final logits
  // through cap * tanh(x / cap); 0 for none.
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  Pooling pooling = Pooling::kNone;  // an embedding model's (pooling_type); kNone for others
  // An encoder (BERT; set by the architecture): every token attends to every token of its
  // sequence, so a sequence is computed whole in one batch; it has no language-model head.
  bool causal = true;
  std::optional<bool> causal_key;  // attention.causal where the file sets it
  float norm_eps = 1e-12f;  // attention.layer_norm_epsilon: LayerNorm's (BERT)
  MoeHParams moe;
  MlaHParams mla;
  // The cache's one row per position is both K and V (latent attention; set by the architecture).
  bool kv_latent = false;
  // The cache's layers where they are not one per model layer (DeepSeek-V4 keeps several kinds of
  // rows per layer; set by the architecture): each one's window (0: full). Empty: one per layer,
  // with LayerWindow's window.
  std::vector<int64_t> kv_windows;
  // Floats of recurrent state each sequence keeps (linear-attention layers: Gated DeltaNet's
  // state and its convolution's last inputs; set by the architecture). 0: none.
  int64_t recurrent_state_floats = 0;
  int64_t kv_num_layers() const { return kv_windows.empty() ? num_layers : static_cast<int64_t>(kv_windows.size()); }
  int64_t KvLayerWindow(int64_t kv_layer) const { return kv_windows.empty() ? LayerWindow(kv_layer) : kv_windows[kv_layer]; }

  int64_t LayerWindow(int64_t layer) const {
    if (sliding_window <= 0) return 0;
    return swa_layers.empty() || swa_layers[layer] ? sliding_window : 0;
  }

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // V's head size (attention.value_length; head_dim unless the file sets another), the V rows'
  // width over all KV heads, and attention's output width (the output projection's input).
  int64_t value_head() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  int64_t v_dim() const { return num_kv_heads * value_head(); }
  int64_t attn_out_dim() const { return num_heads * value_head(); }
};

// Reads and validates the keys every architecture shares; errors name the key and the rule
// broken. The architecture itself is not checked here (model/registry.cc does).
StatusOr<ModelHParams> ReadHParams(const GgufFile& file);

// A key llama.cpp reads as one value or one per layer (head counts, widths): the value, the same
// for every one of num_layers layers, or an error naming the key (gale's layers share one);
// dflt when absent (an error when there is none).
StatusOr<int64_t> PerLayerInt(const GgufFile& file, const std::string& key, int64_t num_layers,
                              std::optional<int64_t> dflt = std::nullopt);

// Windowed layers' RoPE (the architecture's choice): their own base, scaled as the other layers or
// not at all.
void SetWindowedRope(ModelHParams* hp, float base, bool scaled);

// A key llama.cpp reads as a bool per layer (an array of at least num_layers bools or integers):
// out[l] = layer l's; an error naming the key otherwise.
Status ReadLayerFlags(const GgufValue& v, const std::string& key, int64_t num_layers, std::vector<uint8_t>* out);

// Which layers are windowed, as llama.cpp reads it (load_swa_pattern): the file's
// attention.sliding_window_pattern, a bool per layer or a period n (layer l windowed when
// l % n < n - 1; 0: every layer), else default_period. Sets hp->swa_layers.
Status ReadWindowedLayers(const GgufFile& file, int64_t default_period, ModelHParams* hp);

// The checks that need the architecture's choices (after its loader ran): windowed layers of the
// file's own head or RoPE sizes are refused, as is attention.causal false in a decoder.
Status CheckLoadedHParams(const ModelHParams& hp);

// YaRN's correction dims (ggml's rope_yarn_corr_dims) for rope_dims dims at RoPE base `base`:
// [low, high], the dims whose wavelengths make beta_fast and beta_slow rotations over the original
// context, clamped to [0, rope_dims - 1].
std::pair<float, float> YarnCorrDims(int64_t rope_dims, double base, double original_ctx, double beta_fast,
                                     double beta_slow);

}  // namespace gale
