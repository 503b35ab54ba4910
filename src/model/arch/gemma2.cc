// Gemma 2 (GGUF "gemma2"): embeddings scaled by sqrt(dim); per layer RMSNorm -> Q, K, V -> RoPE
// (NEOX) -> attention whose scores are soft-capped (attn_logit_softcapping, default 50: s becomes
// 50 tanh(s / 50)), over a sliding window (attention.sliding_window, default 4096) on the even
// layers and the whole context on the odd ones -> output projection -> RMSNorm
// (post_attention_norm) -> residual; RMSNorm -> GeGLU (tanh GELU) -> RMSNorm (post_ffw_norm) ->
// residual; final norm, the output layer (tied to the embedding), and the logits soft-capped
// (final_logit_softcapping, default 30). As llama.cpp: queries scaled by 1 / sqrt(head size), or
// 1 / sqrt(dim / heads) for the 46-layer (27B) model; one RoPE base for every layer. The norm
// weights in GGUF already include Gemma's "1 +".
#include <cmath>

#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

struct Gemma2Layer : DenseMatrices {
  TensorView attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;
};

class Gemma2Model final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp) {
    std::unique_ptr<Gemma2Model> m(new Gemma2Model());
    m->hp_ = std::move(hp);
    ModelHParams& h = m->hp_;
    h.rope_style = RopeStyle::kNeox;
    const std::string p = h.arch + ".";
    h.sliding_window = file.GetInt(p + "attention.sliding_window", 4096);
    if (h.sliding_window <= 0) return InvalidArgument("gemma2: attention.sliding_window must be positive");
    // Windowed, then global (llama.cpp's swa pattern 2).
    h.swa_layers.resize(static_cast<size_t>(h.num_layers));
    for (int64_t l = 0; l < h.num_layers; ++l) h.swa_layers[l] = l % 2 == 0;
    h.attn_softcap = static_cast<float>(file.GetDouble(p + "attn_logit_softcapping", 50.0));
    h.final_softcap = static_cast<float>(file.GetDouble(p + "final_logit_softcapping", 30.0));
    if (!(h.attn_softcap > 0.0f) || !(h.final_softcap > 0.0f)) {
      return InvalidArgument("gemma2: attn_logit_softcapping and final_logit_softcapping must be positive");
    }
    const double attn_dim = h.num_layers == 46 ? static_cast<double>(h.dim) / static_cast<double>(h.num_heads)
                                               : static_cast<double>(h.head_dim);
    h.query_scale = static_cast<float>(std::sqrt(static_cast<double>(h.head_dim)) / std::sqrt(attn_dim));
    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      Gemma2Layer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, h.q_dim(), &w.wq));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.kv_dim(), &w.wv));
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
      const Gemma2Layer& w = layers_[l];
      f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                       LinearInput::kAttnIn, "matmul_qkv");
      f.Attention(l, &key_channels_);
      f.OutputProjection(l, w.wo, &w.post_attn_norm);
      f.GatedFfn(l, Floats(w.ffn_norm), w.w_gate, w.w_up, w.w_down, GateActivation::kGeluTanh, &w.post_ffn_norm);
    }
    f.OutputHead(output_norm_, output_);
    return Status::Ok();
  }

  std::vector<MatrixWeight*> Matrices() override {
    std::vector<MatrixWeight*> all;
    for (Gemma2Layer& l : layers_) l.AppendTo(&all);
    all.push_back(&output_);
    return all;
  }

 private:
  Gemma2Model() = default;
  std::vector<Gemma2Layer> layers_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadGemma2(const GgufFile& file, ModelHParams hp) {
  return Gemma2Model::Load(file, std::move(hp));
}

}  // namespace gale
