// GLM-4.5 / GLM-4.5-Air / GLM-4.6 / GLM-4.7 (GGUF "glm4moe"): Q, K, V with biases (and per-head
// Q/K norms where the file has them), NEOX RoPE on the first rope.dimension_count dims of each
// head (partial rotary), the pre-FFN norm stored as post_attention_norm, dense leading layers,
// then a mixture of experts with shared experts: sigmoid scores (the default when the file names
// no gating function) with the exp_probs_b selection bias, weights renormalized and scaled as the
// file says. The file's last nextn_predict_layers layers are multi-token-prediction layers that
// the forward pass skips (as llama.cpp does); their tensors are read and left unused.
#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

struct GlmLayer {
  TensorView attn_norm, ffn_norm;
  MatrixWeight wq, wk, wv, wo;
  TensorView bq, bk, bv;
  TensorView q_norm, k_norm;  // empty where the file has none
  LayerFfn ffn;
};

class Glm4MoeModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp) {
    std::unique_ptr<Glm4MoeModel> m(new Glm4MoeModel());
    m->hp_ = std::move(hp);
    ModelHParams& h = m->hp_;
    h.rope_style = RopeStyle::kNeox;
    // M-RoPE's sections (GLM-4.5V's vision positions): text-only RoPE here.
    if (const GgufValue* sec = file.Find(h.arch + ".rope.dimension_sections"); sec != nullptr) {
      for (const GgufValue& v : sec->type == GgufValueType::kArray ? sec->array : std::vector<GgufValue>{*sec}) {
        if (v.AsInt().value_or(1) != 0) {
          return Unimplemented("glm4moe: {}.rope.dimension_sections (multimodal M-RoPE) is not supported", h.arch);
        }
      }
    }
    MoeHParams& moe = h.moe;
    if (!moe.enabled()) return InvalidArgument("glm4moe: the file has no glm4moe.expert_count");
    if (file.Find(h.arch + ".expert_gating_func") == nullptr) moe.gating = ExpertGating::kSigmoid;
    if (moe.expert_ffn == 0) moe.expert_ffn = h.ffn_dim / moe.num_used;
    if (moe.num_shared > 0 && moe.shared_ffn == 0) moe.shared_ffn = moe.expert_ffn * moe.num_shared;
    if (moe.leading_dense > h.num_layers) return InvalidArgument("glm4moe: more dense leading layers than layers");

    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      GlmLayer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, h.q_dim(), &w.wq));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.v_dim(), &w.wv));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_q.bias", h.q_dim(), &w.bq));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_k.bias", h.kv_dim(), &w.bk));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_v.bias", h.v_dim(), &w.bv));
      if (tensors.Has(b + "attn_q_norm.weight")) RETURN_IF_ERROR(tensors.Vector(b + "attn_q_norm.weight", h.head_dim, &w.q_norm));
      if (tensors.Has(b + "attn_k_norm.weight")) RETURN_IF_ERROR(tensors.Vector(b + "attn_k_norm.weight", h.head_dim, &w.k_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.attn_out_dim(), h.dim, &w.wo));
      RETURN_IF_ERROR(tensors.Vector(b + "post_attention_norm.weight", h.dim, &w.ffn_norm));
      if (!moe.dense_layer(l) && !tensors.Has(b + "exp_probs_b.bias")) {
        return InvalidArgument("glm4moe: tensor {}exp_probs_b.bias is missing", b);
      }
      RETURN_IF_ERROR(w.ffn.Load(tensors, b, h, l));
    }
    m->FinishLoad(tensors);
    return std::unique_ptr<Model>(std::move(m));
  }

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override {
    ForwardPass f(hp_, batch, kv, ws, pool, /*freq_factors=*/nullptr);
    f.Embed(token_embd_);
    for (int64_t l = f.first_layer(); l < f.end_layer(); ++l) {
      const GlmLayer& w = layers_[l];
      f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                       LinearInput::kAttnIn, "matmul_qkv");
      f.AddBias(ws.q.data(), w.bq, hp_.q_dim());
      f.AddBias(ws.k.data(), w.bk, hp_.kv_dim());
      f.AddBias(ws.v.data(), w.bv, hp_.v_dim());
      if (w.q_norm.data != nullptr) f.HeadNorm(ws.q.data(), hp_.num_heads, w.q_norm, "q_norm", l);
      if (w.k_norm.data != nullptr) f.HeadNorm(ws.k.data(), hp_.num_kv_heads, w.k_norm, "k_norm", l);
      f.Attention(l, &key_channels_);
      f.OutputProjection(l, w.wo);
      f.Ffn(l, Floats(w.ffn_norm), w.ffn);
    }
    f.OutputHead(output_norm_, output_);
    return Status::Ok();
  }

  std::vector<MatrixWeight*> LayerMatrices(int64_t l) override {
    GlmLayer& w = layers_[l];
    std::vector<MatrixWeight*> all = {&w.wq, &w.wk, &w.wv, &w.wo};
    w.ffn.AppendTo(&all, hp_, l);
    return all;
  }

 private:
  Glm4MoeModel() = default;
  std::vector<GlmLayer> layers_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadGlm4Moe(const GgufFile& file, ModelHParams hp) {
  return Glm4MoeModel::Load(file, std::move(hp));
}

}  // namespace gale
