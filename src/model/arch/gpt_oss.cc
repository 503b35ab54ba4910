// gpt-oss (GGUF "gpt-oss", llama.cpp's openai_moe): per layer RMSNorm -> Q, K, V with biases ->
// RoPE (NEOX, the file's YaRN) -> attention with a learned sink logit per query head (it joins
// each softmax's denominator only), over a sliding window (attention.sliding_window) on the even
// layers and the whole context on the odd ones -> output projection with bias -> residual;
// RMSNorm (post_attention_norm) -> a mixture of experts: the router with its bias, the top k of
// the raw logits with a softmax over those k, each expert's gate and up with biases -> the clamped
// SwiGLU (x = min(gate, 7), y = clamp(up, -7, 7), x sigmoid(1.702 x) (y + 1)) -> down with bias,
// weighted and summed -> residual; final norm and the output layer. The experts are MXFP4 in the
// published files (any type gale runs works). As llama.cpp's graph for it: queries scaled by
// 1 / sqrt(head size), no shared experts, no weight renormalization.
#include "model/arch/arch.h"
#include "model/synth.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

struct GptOssLayer {
  TensorView attn_norm, post_attn_norm;
  MatrixWeight wq, wk, wv, wo;
  TensorView bq, bk, bv, bo;
  TensorView sinks;  // [num_heads]
  MoeWeights moe;
};

class GptOssModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp) {
    std::unique_ptr<GptOssModel> m(new GptOssModel());
    m->hp_ = std::move(hp);
    ModelHParams& h = m->hp_;
    const std::string p = h.arch + ".";
    h.rope_style = RopeStyle::kNeox;
    if (h.rope_dims != h.head_dim) {
      return InvalidArgument("gpt-oss: rope.dimension_count {} must be the head size {}", h.rope_dims, h.head_dim);
    }
    h.sliding_window = file.GetInt(p + "attention.sliding_window", 0);
    if (h.sliding_window <= 0) return InvalidArgument("gpt-oss: the file has no positive {}attention.sliding_window", p);
    // Windowed, then global (attention.sliding_window_pattern, default 2); the windowed layers'
    // RoPE scaled as the others, at rope.freq_base_swa (default: rope.freq_base).
    RETURN_IF_ERROR(ReadWindowedLayers(file, 2, &h));
    const double base_swa = file.GetDouble(p + "rope.freq_base_swa", h.rope_freq_base);
    if (!(base_swa > 0.0)) return InvalidArgument("gpt-oss: rope.freq_base_swa must be positive");
    if (static_cast<float>(base_swa) != h.rope_freq_base) SetWindowedRope(&h, static_cast<float>(base_swa), /*scaled=*/true);
    MoeHParams& moe = h.moe;
    if (!moe.enabled()) return InvalidArgument("gpt-oss: the file has no {}expert_count", p);
    if (moe.expert_ffn == 0) return InvalidArgument("gpt-oss: the file has no {}expert_feed_forward_length", p);
    if (moe.num_shared > 0 || moe.num_groups > 0 || moe.leading_dense > 0) {
      return Unimplemented("gpt-oss: shared experts, expert groups or dense leading layers are not part of this architecture");
    }
    moe.gating = ExpertGating::kSoftmaxWeight;  // as llama.cpp's graph fixes it, whatever the file says
    moe.norm_weights = false;
    moe.weights_scale = 1.0f;

    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      GptOssLayer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, h.q_dim(), &w.wq));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.v_dim(), &w.wv));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_q.bias", h.q_dim(), &w.bq));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_k.bias", h.kv_dim(), &w.bk));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_v.bias", h.v_dim(), &w.bv));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.attn_out_dim(), h.dim, &w.wo));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_output.bias", h.dim, &w.bo));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_sinks.weight", h.num_heads, &w.sinks));
      RETURN_IF_ERROR(tensors.Vector(b + "post_attention_norm.weight", h.dim, &w.post_attn_norm));
      // Optional in other mixtures, required here (the experts' fused or separate).
      const char* expert_bias = tensors.Has(b + "ffn_gate_up_exps.weight") ? "ffn_gate_up_exps.bias" : "ffn_gate_exps.bias";
      for (const char* bias : {"ffn_gate_inp.bias", expert_bias}) {
        if (!tensors.Has(b + bias)) return InvalidArgument("gpt-oss: tensor {}{} is missing", b, bias);
      }
      RETURN_IF_ERROR(LoadMoeWeights(tensors, b, h, &w.moe));
    }
    m->FinishLoad(tensors);
    return std::unique_ptr<Model>(std::move(m));
  }

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override {
    ForwardPass f(hp_, batch, kv, ws, pool, /*freq_factors=*/nullptr);
    f.Embed(token_embd_);
    for (int64_t l = f.first_layer(); l < f.end_layer(); ++l) {
      const GptOssLayer& w = layers_[l];
      f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                       LinearInput::kAttnIn, "matmul_qkv");
      f.AddBias(ws.q.data(), w.bq, hp_.q_dim());
      f.AddBias(ws.k.data(), w.bk, hp_.kv_dim());
      f.AddBias(ws.v.data(), w.bv, hp_.v_dim());
      f.Attention(l, &key_channels_, Floats(w.sinks));
      f.OutputProjection(l, w.wo, /*post_norm=*/nullptr, &w.bo);
      f.MoeFfn(l, Floats(w.post_attn_norm), w.moe, GateActivation::kSwigluOai);
    }
    f.OutputHead(output_norm_, output_);
    return Status::Ok();
  }

  std::vector<MatrixWeight*> LayerMatrices(int64_t layer) override {
    GptOssLayer& w = layers_[layer];
    std::vector<MatrixWeight*> all = {&w.wq, &w.wk, &w.wv, &w.wo};
    w.moe.AppendTo(&all);
    return all;
  }

 private:
  GptOssModel() = default;
  std::vector<GptOssLayer> layers_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadGptOss(const GgufFile& file, ModelHParams hp) {
  return GptOssModel::Load(file, std::move(hp));
}

namespace {

// gale synth: biases on Q, K, V, the output, the router and the experts, a sink logit per query
// head, a window always (128 unless the shape sets one) on the even layers, RoPE base 150,000.
Status SynthCheck(const SynthShape& s) {
  if (s.num_experts == 0) return InvalidArgument("synth: gpt-oss needs experts (--experts, --experts-used)");
  return Status::Ok();
}

Status SynthWrite(SynthWriter& w) {
  const SynthShape& s = w.s;
  w.w.SetF32(w.p + "rope.freq_base", 150000.0f);
  w.w.SetU32(w.p + "attention.sliding_window", static_cast<uint32_t>(s.sliding_window > 0 ? s.sliding_window : 128));
  w.w.SetU32(w.p + "expert_feed_forward_length", static_cast<uint32_t>(w.expert_ffn));
  RETURN_IF_ERROR(w.Ones("output_norm.weight", s.dim));
  RETURN_IF_ERROR(w.Matrix("output.weight", s.dim, s.vocab_size, w.type));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    // The FFN's norm is post_attention_norm here.
    const std::string b = "blk." + std::to_string(l) + ".";
    RETURN_IF_ERROR(w.Ones(b + "attn_norm.weight", s.dim));
    RETURN_IF_ERROR(w.Qkv(b, /*biases=*/true));
    RETURN_IF_ERROR(w.Matrix(b + "attn_output.weight", w.o_dim, s.dim, w.type));
    RETURN_IF_ERROR(w.Vector(b + "attn_output.bias", s.dim, 0.0f, 0.2f));
    RETURN_IF_ERROR(w.Vector(b + "attn_sinks.weight", s.num_heads, 0.0f, 2.0f));
    RETURN_IF_ERROR(w.Vector(b + "post_attention_norm.weight", s.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(w.Router(b));
    RETURN_IF_ERROR(w.Vector(b + "ffn_gate_inp.bias", s.num_experts, 0.0f, 0.5f));
    RETURN_IF_ERROR(w.Experts(b));
    RETURN_IF_ERROR(w.Vector(b + "ffn_gate_exps.bias", w.expert_ffn, 0.0f, 0.5f, s.num_experts));
    RETURN_IF_ERROR(w.Vector(b + "ffn_up_exps.bias", w.expert_ffn, 0.0f, 0.5f, s.num_experts));
    RETURN_IF_ERROR(w.Vector(b + "ffn_down_exps.bias", s.dim, 0.0f, 0.2f, s.num_experts));
  }
  return Status::Ok();
}

std::vector<SynthShape> SynthShapes() {
  SynthShape s;  // gpt-oss-20b's shapes, 12 of its 24 layers, the experts MXFP4 as published
  s.name = "gpt-oss-20b", s.arch = "gpt-oss";
  s.dim = 2880, s.num_layers = 12, s.num_heads = 64, s.num_kv_heads = 8, s.head_dim = 64, s.ffn_dim = 2880;
  s.vocab_size = 201088, s.context_length = 131072, s.sliding_window = 128;
  s.num_experts = 32, s.experts_used = 4, s.expert_ffn = 2880;
  s.yarn_factor = 32.0, s.yarn_orig_ctx = 4096;
  s.expert_type = GgmlType::kMXFP4;
  return {s};
}

}  // namespace

const ArchSpec kGptOssArch = {.name = "gpt-oss",
                              .load = LoadGptOss,
                              .experts = true,
                              .synth_check = SynthCheck,
                              .synth_write = SynthWrite,
                              .synth_shapes = SynthShapes};

}  // namespace gale
