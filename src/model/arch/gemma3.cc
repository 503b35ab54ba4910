// Gemma 3 (GGUF "gemma3", the text model): embeddings scaled by sqrt(dim); per layer RMSNorm ->
// Q, K, V -> per-head Q/K RMSNorm -> RoPE (NEOX) -> attention, in five of every six layers over a
// sliding window (attention.sliding_window) with their own RoPE base 10,000 and no scaling, the
// sixth global with rope.freq_base and the file's scaling -> output projection -> RMSNorm
// (post_attention_norm) -> residual; RMSNorm -> GeGLU (tanh GELU) -> RMSNorm (post_ffw_norm) ->
// residual; final norm and the output layer (tied to the embedding). As llama.cpp: queries
// scaled by 1 / sqrt(head size), or 1 / sqrt(dim / heads) for the 62-layer (27B) model. The
// norm weights in GGUF already include Gemma's "1 +".
#include <cmath>

#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

struct Gemma3Layer : DenseMatrices {
  TensorView attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffn_norm;
};

class Gemma3Model final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp) {
    std::unique_ptr<Gemma3Model> m(new Gemma3Model());
    m->hp_ = std::move(hp);
    ModelHParams& h = m->hp_;
    h.rope_style = RopeStyle::kNeox;
    const std::string p = h.arch + ".";
    h.sliding_window = file.GetInt(p + "attention.sliding_window", 0);
    if (h.sliding_window < 0) return InvalidArgument("gemma3: attention.sliding_window must not be negative");
    if (h.sliding_window > 0) {
      // Five windowed layers, then one global (llama.cpp's swa pattern 6).
      h.swa_layers.resize(static_cast<size_t>(h.num_layers));
      for (int64_t l = 0; l < h.num_layers; ++l) h.swa_layers[l] = l % 6 < 5;
      h.rope_freq_base_swa = 10000.0f;
    }
    const double attn_dim = h.num_layers == 62 ? static_cast<double>(h.dim) / static_cast<double>(h.num_heads)
                                               : static_cast<double>(h.head_dim);
    h.query_scale = static_cast<float>(std::sqrt(static_cast<double>(h.head_dim)) / std::sqrt(attn_dim));
    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      Gemma3Layer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, h.q_dim(), &w.wq));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.kv_dim(), &w.wv));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_q_norm.weight", h.head_dim, &w.q_norm));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_k_norm.weight", h.head_dim, &w.k_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.q_dim(), h.dim, &w.wo));
      RETURN_IF_ERROR(tensors.Vector(b + "post_attention_norm.weight", h.dim, &w.post_attn_norm));
      RETURN_IF_ERROR(tensors.Vector(b + "ffn_norm.weight", h.dim, &w.ffn_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_gate.weight", h.dim, h.ffn_dim, &w.w_gate));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_up.weight", h.dim, h.ffn_dim, &w.w_up));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_down.weight", h.ffn_dim, h.dim, &w.w_down));
      RETURN_IF_ERROR(tensors.Vector(b + "post_ffw_norm.weight", h.dim, &w.post_ffn_norm));
    }
    m->FinishLoad(tensors);
    return std::unique_ptr<Model>(std::move(m));
  }

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override {
    ForwardPass f(hp_, batch, kv, ws, pool, /*freq_factors=*/nullptr);
    f.Embed(token_embd_, std::sqrt(static_cast<float>(hp_.dim)));
    for (int64_t l = 0; l < hp_.num_layers; ++l) {
      const Gemma3Layer& w = layers_[l];
      f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                       LinearInput::kAttnIn, "matmul_qkv");
      f.HeadNorm(ws.q.data(), hp_.num_heads, w.q_norm, "q_norm", l);
      f.HeadNorm(ws.k.data(), hp_.num_kv_heads, w.k_norm, "k_norm", l);
      f.Attention(l, &key_channels_);
      f.OutputProjection(l, w.wo, &w.post_attn_norm);
      f.GatedFfn(l, Floats(w.ffn_norm), w.w_gate, w.w_up, w.w_down, GateActivation::kGeluTanh, &w.post_ffn_norm);
    }
    f.OutputHead(output_norm_, output_);
    return Status::Ok();
  }

  std::vector<MatrixWeight*> Matrices() override {
    std::vector<MatrixWeight*> all;
    for (Gemma3Layer& l : layers_) l.AppendTo(&all);
    all.push_back(&output_);
    return all;
  }

 private:
  Gemma3Model() = default;
  std::vector<Gemma3Layer> layers_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadGemma3(const GgufFile& file, ModelHParams hp) {
  return Gemma3Model::Load(file, std::move(hp));
}

}  // namespace gale
