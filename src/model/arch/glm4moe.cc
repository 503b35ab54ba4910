// GLM-4.5 / GLM-4.5-Air / GLM-4.6 / GLM-4.7 (GGUF "glm4moe"): Q, K, V with biases (and per-head
// Q/K norms where the file has them), NEOX RoPE on the first rope.dimension_count dims of each
// head (partial rotary), the pre-FFN norm stored as post_attention_norm, dense leading layers,
// then a mixture of experts with shared experts: sigmoid scores (the default when the file names
// no gating function) with the exp_probs_b selection bias, weights renormalized and scaled as the
// file says. The file's last nextn_predict_layers layers are multi-token-prediction layers that
// the forward pass skips (as llama.cpp does); their tensors are read and left unused.
#include "model/arch/arch.h"
#include "model/synth.h"
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

namespace {

// gale synth: Q/K/V biases and per-head norms, RoPE on rope_dim dims (0: half the head), dense
// leading layers and shared experts, sigmoid routing with a selection bias (weights scaled by
// 1.5), and nextn_layers multi-token-prediction layers at the end (counted in num_layers).
Status SynthCheck(const SynthShape& s) {
  if (s.nextn_layers < 0 || s.nextn_layers >= s.num_layers || s.leading_dense < 0 ||
      s.leading_dense > s.num_layers - s.nextn_layers || s.shared_experts < 0) {
    return InvalidArgument("synth: glm4moe: {} layers with {} dense and {} nextn", s.num_layers, s.leading_dense, s.nextn_layers);
  }
  if (s.num_experts == 0) return InvalidArgument("synth: glm4moe needs experts (--experts, --experts-used)");
  return Status::Ok();
}

Status SynthWrite(SynthWriter& w) {
  const SynthShape& s = w.s;
  GgufWriter& out = w.w;
  const std::string& p = w.p;
  out.SetU32(p + "leading_dense_block_count", static_cast<uint32_t>(s.leading_dense));
  out.SetU32(p + "expert_shared_count", static_cast<uint32_t>(s.shared_experts));
  out.SetF32(p + "expert_weights_scale", 1.5f);
  out.SetBool(p + "expert_weights_norm", true);
  out.SetU32(p + "expert_gating_func", 2);  // sigmoid
  out.SetU32(p + "nextn_predict_layers", static_cast<uint32_t>(s.nextn_layers));
  out.SetU32(p + "rope.dimension_count", static_cast<uint32_t>(s.rope_dim > 0 ? s.rope_dim : w.head_dim / 2));
  out.SetF32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  out.SetF32(p + "rope.freq_base", 1000000.0f);
  out.SetU32(p + "expert_feed_forward_length", static_cast<uint32_t>(w.expert_ffn));
  RETURN_IF_ERROR(w.Ones("output_norm.weight", s.dim));
  RETURN_IF_ERROR(w.Matrix("output.weight", s.dim, s.vocab_size, w.type));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    RETURN_IF_ERROR(w.Ones(b + "attn_norm.weight", s.dim));
    RETURN_IF_ERROR(w.Qkv(b, /*biases=*/true));
    RETURN_IF_ERROR(w.Vector(b + "attn_q_norm.weight", w.head_dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(w.Vector(b + "attn_k_norm.weight", w.head_dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(w.Matrix(b + "attn_output.weight", w.o_dim, s.dim, w.type));
    RETURN_IF_ERROR(w.Vector(b + "post_attention_norm.weight", s.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(l < s.leading_dense ? w.GatedFfn(b, s.ffn_dim) : w.BiasedExperts(b));
    if (l >= s.num_layers - s.nextn_layers) {  // multi-token prediction: never run
      RETURN_IF_ERROR(w.Matrix(b + "nextn.eh_proj.weight", 2 * s.dim, s.dim, w.type));
      RETURN_IF_ERROR(w.Ones(b + "nextn.enorm.weight", s.dim));
      RETURN_IF_ERROR(w.Ones(b + "nextn.hnorm.weight", s.dim));
      RETURN_IF_ERROR(w.Ones(b + "nextn.shared_head_norm.weight", s.dim));
    }
  }
  return Status::Ok();
}

}  // namespace

const ArchSpec kGlm4MoeArch = {
    .name = "glm4moe", .load = LoadGlm4Moe, .experts = true, .synth_check = SynthCheck, .synth_write = SynthWrite};

}  // namespace gale
