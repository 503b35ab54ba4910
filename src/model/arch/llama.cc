// llama (GGUF "llama"): Llama 1-3.x, Mistral-style files, TinyLlama, llama2.c's models. Per layer
// RMSNorm -> Q, K, V -> RoPE (normal mode; Llama 3.1-3.3's frequency divisors from
// rope_freqs.weight) -> cache -> attention -> output projection -> residual, RMSNorm -> SwiGLU ->
// residual; final norm and output layer. A file with llama.attention.sliding_window (Mistral 7B
// v0.1) attends over that window on every layer. Mixtral-style files (llama.expert_count > 0) have a
// mixture of experts in place of every FFN: softmax over the experts, the top k renormalized (as
// llama.cpp's graph), each expert of feed_forward_length.
#include <cmath>
#include <cstring>

#include "model/arch/arch.h"
#include "model/hf_checkpoint.h"
#include "model/rope_scaling.h"
#include "model/synth.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

struct LlamaLayer : DenseMatrices {
  TensorView attn_norm, ffn_norm;
  MoeWeights moe;  // Mixtral-style files
};

class LlamaModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp) {
    std::unique_ptr<LlamaModel> m(new LlamaModel());
    m->hp_ = std::move(hp);
    MoeHParams& moe = m->hp_.moe;
    if (moe.enabled()) RETURN_IF_ERROR(moe.SetSoftmaxTopK("llama", m->hp_.ffn_dim));
    // Mistral 7B v0.1-style files: a sliding window on every layer when the file sets one (as
    // Hugging Face's Mistral attends; llama.cpp's llama graph ignores the key).
    m->hp_.sliding_window = file.GetInt(m->hp_.arch + ".attention.sliding_window", 0);
    if (m->hp_.sliding_window < 0) return InvalidArgument("llama: attention.sliding_window must not be negative");
    const ModelHParams& h = m->hp_;
    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      LlamaLayer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, h.q_dim(), &w.wq));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.v_dim(), &w.wv));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.attn_out_dim(), h.dim, &w.wo));
      RETURN_IF_ERROR(tensors.Vector(b + "ffn_norm.weight", h.dim, &w.ffn_norm));
      if (moe.enabled()) {
        RETURN_IF_ERROR(LoadMoeWeights(tensors, b, h, &w.moe));
        continue;
      }
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_gate.weight", h.dim, h.ffn_dim, &w.w_gate));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_up.weight", h.dim, h.ffn_dim, &w.w_up));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_down.weight", h.ffn_dim, h.dim, &w.w_down));
    }
    ASSIGN_OR_RETURN(m->rope_freq_factors_, ReadRopeFreqFactors(tensors, h));
    m->FinishLoad(tensors);
    return std::unique_ptr<Model>(std::move(m));
  }

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override {
    ForwardPass f(hp_, batch, kv, ws, pool, rope_freq_factors_.empty() ? nullptr : rope_freq_factors_.data());
    f.Embed(token_embd_);
    for (int64_t l = f.first_layer(); l < f.end_layer(); ++l) {
      const LlamaLayer& w = layers_[l];
      f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                       LinearInput::kAttnIn, "matmul_qkv");
      f.Attention(l, &key_channels_);
      f.OutputProjection(l, w.wo);
      if (hp_.moe.enabled()) {
        f.MoeFfn(l, Floats(w.ffn_norm), w.moe);
      } else {
        f.GatedFfn(l, Floats(w.ffn_norm), w.w_gate, w.w_up, w.w_down);
      }
    }
    f.OutputHead(output_norm_, output_);
    return Status::Ok();
  }

  Status ShardLayer(int64_t layer, const TensorSharder& sharder) override {
    return ShardDense(layers_[layer], sharder, layer);
  }

  std::vector<MatrixWeight*> LayerMatrices(int64_t layer) override {
    LlamaLayer& l = layers_[layer];
    std::vector<MatrixWeight*> all;
    if (hp_.moe.enabled()) {
      all = {&l.wq, &l.wk, &l.wv, &l.wo};
      l.moe.AppendTo(&all);
    } else {
      l.AppendTo(&all);
    }
    return all;
  }

 private:
  LlamaModel() = default;
  std::vector<LlamaLayer> layers_;
  std::vector<float> rope_freq_factors_;  // [rope_dims / 2] from rope_freqs.weight; empty: none
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadLlama(const GgufFile& file, ModelHParams hp) {
  hp.rope_style = RopeStyle::kNormal;
  return LlamaModel::Load(file, std::move(hp));
}

namespace {

// gale synth: llama's layer (Mixtral's experts where the shape has them), a window on every layer
// where it has one (Mistral 7B v0.1), and Llama 3.1's rope_freqs tensor as llama.cpp's converter
// writes it (factor 8, low/high frequency factors 1 and 4, the shape's original context).
Status SynthWrite(SynthWriter& w) {
  const SynthShape& s = w.s;
  if (s.sliding_window > 0) w.w.SetU32(w.p + "attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
  RETURN_IF_ERROR(w.DecoderLayers({}));
  if (s.rope_freqs_ctx > 0) {
    RETURN_IF_ERROR(w.Floats("rope_freqs.weight", Llama3RopeFreqFactors(w.head_dim, 10000.0, 8.0, 1.0, 4.0,
                                                                         static_cast<double>(s.rope_freqs_ctx))));
  }
  return Status::Ok();
}

std::vector<SynthShape> SynthShapes() {
  SynthShape m110, tinyllama, tiny;
  m110.name = "110m";
  m110.dim = 768, m110.num_layers = 12, m110.num_heads = 12, m110.num_kv_heads = 12, m110.ffn_dim = 2048;
  m110.vocab_size = 32000;
  tinyllama.name = "tinyllama-1.1b";
  tinyllama.dim = 2048, tinyllama.num_layers = 22, tinyllama.num_heads = 32, tinyllama.num_kv_heads = 4;
  tinyllama.ffn_dim = 5632, tinyllama.vocab_size = 32000;
  tiny.name = "tiny";  // a test-sized model
  tiny.dim = 128, tiny.num_layers = 2, tiny.num_heads = 4, tiny.num_kv_heads = 2, tiny.ffn_dim = 256;
  tiny.vocab_size = 2048, tiny.context_length = 512;
  for (SynthShape* shape : {&m110, &tinyllama, &tiny}) shape->arch = "llama";
  return {m110, tinyllama, tiny};
}

// gale convert --hf: Llama and Mistral checkpoints (RoPE in normal mode: q/k rows permuted from
// Hugging Face's rotate-half order). Mistral 7B v0.1's window (later configs set it to null), and
// Llama 3.1's rope_scaling "llama3" as llama.cpp's converter writes it: the divisors as the
// rope_freqs tensor, no scaling type in the metadata.
Status HfKeys(HfKeysContext& c) {
  const nlohmann::json& config = c.config;
  if (config.contains("sliding_window") && config["sliding_window"].is_number_integer()) {
    ASSIGN_OR_RETURN(const int64_t window, HfConfigInt(config, "sliding_window", -1, 1, int64_t{1} << 24));
    if (window < c.context_length) c.out->SetU32(c.p + "attention.sliding_window", static_cast<uint32_t>(window));
  }
  if (!config.contains("rope_scaling") || !config["rope_scaling"].is_object()) return Status::Ok();
  const nlohmann::json& rs = config["rope_scaling"];
  if (rs.value("type", rs.value("rope_type", "")) != "llama3") return Status::Ok();
  const std::vector<float> f = Llama3RopeFreqFactors(
      c.head_dim, HfConfigNum(config, "rope_theta", 10000.0), HfConfigNum(rs, "factor", 8.0),
      HfConfigNum(rs, "low_freq_factor", 1.0), HfConfigNum(rs, "high_freq_factor", 4.0),
      HfConfigNum(rs, "original_max_position_embeddings", 8192.0));
  for (float v : f) {
    if (!(v > 0.0f) || !std::isfinite(v)) return InvalidArgument("config.json: rope_scaling gives a factor of {}", v);
  }
  c.rope_scaling_done = true;
  return c.AddFloats("rope_freqs.weight", f);
}

const HfFamily kHf = {.names = {"LlamaForCausalLM", "llama", "MistralForCausalLM", "mistral"},
                      .permute_qk = true,
                      .keys = HfKeys};

}  // namespace

const ArchSpec kLlamaArch = {
    .name = "llama",
    .load = LoadLlama,
    .experts = true,
    .synth_write = SynthWrite,
    .synth_shapes = SynthShapes,
    .hf = &kHf,
};

}  // namespace gale
