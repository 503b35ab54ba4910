// Gemma 2 (GGUF "gemma2") and Gemma 3 (GGUF "gemma3", the text model). Both: embeddings scaled by
// sqrt(dim); per layer RMSNorm -> Q, K, V -> RoPE (NEOX) -> attention -> output projection ->
// RMSNorm (post_attention_norm) -> residual; RMSNorm -> GeGLU (tanh GELU) -> RMSNorm
// (post_ffw_norm) -> residual; final norm and the output layer (tied to the embedding). The norm
// weights in GGUF already include Gemma's "1 +".
// Gemma 2: a sliding window (attention.sliding_window, default 4096) on the even layers, the whole
// context on the odd ones (attention.sliding_window_pattern, default 2); attention scores
// soft-capped (attn_logit_softcapping, default 50: s becomes 50 tanh(s / 50)) and the final logits
// too (final_logit_softcapping, default 30).
// Gemma 3: per-head Q/K RMSNorm before RoPE; five of every six layers (the pattern's default 6)
// over a sliding window with their own RoPE base (rope.freq_base_swa, default 10,000) and no
// scaling, the sixth global with rope.freq_base and the file's scaling; the final logits
// soft-capped only where the file sets final_logit_softcapping.
// As llama.cpp: queries scaled by 1 / sqrt(head size), or 1 / sqrt(dim / heads) for the 27B
// models (46 layers in Gemma 2, 62 in Gemma 3).
#include <cmath>

#include "model/arch/arch.h"
#include "model/hf_checkpoint.h"
#include "model/synth.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

enum class Variant { kGemma2, kGemma3 };

struct GemmaLayer : DenseMatrices {
  TensorView attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;
  TensorView q_norm, k_norm;  // gemma3
};

class GemmaModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp, Variant variant) {
    std::unique_ptr<GemmaModel> m(new GemmaModel());
    m->hp_ = std::move(hp);
    m->variant_ = variant;
    ModelHParams& h = m->hp_;
    h.rope_style = RopeStyle::kNeox;
    const std::string p = h.arch + ".";
    const bool gemma2 = variant == Variant::kGemma2;
    h.sliding_window = file.GetInt(p + "attention.sliding_window", gemma2 ? 4096 : 0);
    if (h.sliding_window < 0 || (gemma2 && h.sliding_window == 0)) {
      return InvalidArgument("{}: attention.sliding_window must be positive", h.arch);
    }
    if (h.sliding_window > 0) {
      // Which layers are windowed (attention.sliding_window_pattern; Gemma 2 by default every
      // other, Gemma 3 five of six) and their RoPE: Gemma 2's scaled as the others, at
      // rope.freq_base_swa (default: rope.freq_base); Gemma 3's unscaled, at rope.freq_base_swa
      // (default 10,000).
      RETURN_IF_ERROR(ReadWindowedLayers(file, gemma2 ? 2 : 6, &h));
      const double base_swa = file.GetDouble(p + "rope.freq_base_swa", gemma2 ? h.rope_freq_base : 10000.0);
      if (!(base_swa > 0.0)) return InvalidArgument("{}: rope.freq_base_swa must be positive", h.arch);
      SetWindowedRope(&h, static_cast<float>(base_swa), /*scaled=*/gemma2);
    }
    // Soft-capping: Gemma 2's scores (default 50) and logits (default 30); Gemma 3's logits where
    // the file asks (final_logit_softcapping; none by default).
    if (gemma2) h.attn_softcap = static_cast<float>(file.GetDouble(p + "attn_logit_softcapping", 50.0));
    h.final_softcap = static_cast<float>(file.GetDouble(p + "final_logit_softcapping", gemma2 ? 30.0 : 0.0));
    if ((gemma2 && !(h.attn_softcap > 0.0f)) || !(h.final_softcap >= 0.0f) || (gemma2 && h.final_softcap == 0.0f)) {
      return InvalidArgument("{}: attn_logit_softcapping and final_logit_softcapping must be positive", h.arch);
    }
    const double attn_dim = h.num_layers == (gemma2 ? 46 : 62)
                                ? static_cast<double>(h.dim) / static_cast<double>(h.num_heads)
                                : static_cast<double>(h.head_dim);
    h.query_scale = static_cast<float>(std::sqrt(static_cast<double>(h.head_dim)) / std::sqrt(attn_dim));
    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      GemmaLayer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, h.q_dim(), &w.wq));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.v_dim(), &w.wv));
      if (!gemma2) {
        RETURN_IF_ERROR(tensors.Vector(b + "attn_q_norm.weight", h.head_dim, &w.q_norm));
        RETURN_IF_ERROR(tensors.Vector(b + "attn_k_norm.weight", h.head_dim, &w.k_norm));
      }
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.attn_out_dim(), h.dim, &w.wo));
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
    for (int64_t l = f.first_layer(); l < f.end_layer(); ++l) {
      const GemmaLayer& w = layers_[l];
      f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                       LinearInput::kAttnIn, "matmul_qkv");
      if (variant_ == Variant::kGemma3) {
        f.HeadNorm(ws.q.data(), hp_.num_heads, w.q_norm, "q_norm", l);
        f.HeadNorm(ws.k.data(), hp_.num_kv_heads, w.k_norm, "k_norm", l);
      }
      f.Attention(l, &key_channels_);  // Gemma 2's soft-capping: hp_.attn_softcap
      f.OutputProjection(l, w.wo, &w.post_attn_norm);
      f.GatedFfn(l, Floats(w.ffn_norm), w.w_gate, w.w_up, w.w_down, GateActivation::kGeluTanh, &w.post_ffn_norm);
    }
    f.OutputHead(output_norm_, output_);  // and hp_.final_softcap
    return Status::Ok();
  }

  Status ShardLayer(int64_t layer, const TensorSharder& sharder) override {
    return ShardDense(layers_[layer], sharder, layer);
  }

  std::vector<MatrixWeight*> LayerMatrices(int64_t layer) override {
    std::vector<MatrixWeight*> all;
    layers_[layer].AppendTo(&all);
    return all;
  }

 private:
  GemmaModel() = default;
  Variant variant_ = Variant::kGemma3;
  std::vector<GemmaLayer> layers_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadGemma2(const GgufFile& file, ModelHParams hp) {
  return GemmaModel::Load(file, std::move(hp), Variant::kGemma2);
}
StatusOr<std::unique_ptr<Model>> LoadGemma3(const GgufFile& file, ModelHParams hp) {
  return GemmaModel::Load(file, std::move(hp), Variant::kGemma3);
}

namespace {

// gale synth: Gemma's epsilon and RoPE base (1e-6, 1e6), a window always (512 unless the shape
// sets one), Gemma 2's two soft-caps, Gemma 3's per-head norms; norms after both sublayers; the
// embedding tied to the head.
Status SynthWrite(SynthWriter& w, bool gemma2) {
  const SynthShape& s = w.s;
  w.w.SetF32(w.p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.w.SetF32(w.p + "rope.freq_base", 1000000.0f);
  w.w.SetU32(w.p + "attention.sliding_window", static_cast<uint32_t>(s.sliding_window > 0 ? s.sliding_window : 512));
  if (gemma2) {
    w.w.SetF32(w.p + "attn_logit_softcapping", s.attn_softcap);
    w.w.SetF32(w.p + "final_logit_softcapping", s.final_softcap);
  }
  return w.DecoderLayers({.tied_output = true, .qk_norm = !gemma2, .post_norms = true});
}
Status SynthWriteGemma2(SynthWriter& w) { return SynthWrite(w, true); }
Status SynthWriteGemma3(SynthWriter& w) { return SynthWrite(w, false); }

std::vector<SynthShape> SynthShapesGemma3() {
  SynthShape s;
  s.name = "gemma3-1b", s.arch = "gemma3";
  s.dim = 1152, s.num_layers = 26, s.num_heads = 4, s.num_kv_heads = 1, s.head_dim = 256, s.ffn_dim = 6912;
  s.vocab_size = 262144, s.context_length = 32768, s.sliding_window = 512;
  return {s};
}

// gale convert --hf: Gemma's layout (HfFamily::gemma_layout) and keys, as llama.cpp's converters
// write them: Gemma 2's two soft-caps and window; Gemma 3's window unless every layer is global,
// its window pattern (sliding_window_pattern, or the per-layer layer_types of newer configs), the
// windowed layers' RoPE base (rope_local_base_freq) and a final soft-cap where the config sets one.
// gale (as llama.cpp) scales queries by 1 / sqrt(head size), or by 1 / sqrt(dim / heads) for the
// 27B models: a checkpoint asking for another query_pre_attn_scalar is refused.
Status HfKeys(HfKeysContext& c, bool gemma2) {
  const nlohmann::json& config = c.config;
  if (config.contains("query_pre_attn_scalar") && config["query_pre_attn_scalar"].is_number()) {
    const bool wide = c.layers == (gemma2 ? 46 : 62);
    const double want = wide ? static_cast<double>(c.dim) / static_cast<double>(c.heads) : static_cast<double>(c.head_dim);
    if (config["query_pre_attn_scalar"].get<double>() != want) {
      return InvalidArgument("config.json: query_pre_attn_scalar {} is not supported for {} layers of head size {} "
                             "(gale uses {})", config["query_pre_attn_scalar"].dump(), c.layers, c.head_dim, want);
    }
  }
  auto window = [&]() -> Status {
    ASSIGN_OR_RETURN(const int64_t w, HfConfigInt(config, "sliding_window", 4096, 1, int64_t{1} << 24));
    c.out->SetU32(c.p + "attention.sliding_window", static_cast<uint32_t>(w));
    return Status::Ok();
  };
  if (gemma2) {
    c.out->SetF32(c.p + "attn_logit_softcapping", static_cast<float>(HfConfigNum(config, "attn_logit_softcapping", 50.0)));
    c.out->SetF32(c.p + "final_logit_softcapping", static_cast<float>(HfConfigNum(config, "final_logit_softcapping", 30.0)));
    return window();
  }
  if (config.contains("final_logit_softcapping") && config["final_logit_softcapping"].is_number()) {
    c.out->SetF32(c.p + "final_logit_softcapping", config["final_logit_softcapping"].get<float>());
  }
  if (config.contains("rope_local_base_freq") && config["rope_local_base_freq"].is_number()) {
    c.out->SetF32(c.p + "rope.freq_base_swa", config["rope_local_base_freq"].get<float>());
  }
  if (config.contains("layer_types") && config["layer_types"].is_array()) {
    std::vector<GgufValue> windowed;
    for (const auto& t : config["layer_types"]) {
      if (!t.is_string()) return InvalidArgument("config.json: layer_types holds {}, not a string", t.dump());
      windowed.push_back(GgufValue::Bool(t.get<std::string>() == "sliding_attention"));
    }
    c.out->SetValue(c.p + "attention.sliding_window_pattern", GgufValue::Array(GgufValueType::kBool, std::move(windowed)));
    return window();
  }
  const double period = HfConfigNum(config, "sliding_window_pattern", 6.0);
  if (period == 1.0) return Status::Ok();  // every layer global
  if (period != 6.0) c.out->SetU32(c.p + "attention.sliding_window_pattern", static_cast<uint32_t>(period));
  return window();
}
Status HfKeysGemma2(HfKeysContext& c) { return HfKeys(c, true); }
Status HfKeysGemma3(HfKeysContext& c) { return HfKeys(c, false); }

const HfFamily kHfGemma2 = {.names = {"Gemma2ForCausalLM", "gemma2"}, .gemma_layout = true, .keys = HfKeysGemma2};
const HfFamily kHfGemma3 = {.names = {"Gemma3ForCausalLM", "gemma3_text", "Gemma3ForConditionalGeneration"},
                            .qk_norm = true,
                            .gemma_layout = true,
                            .keys = HfKeysGemma3};

}  // namespace

const ArchSpec kGemma2Arch = {.name = "gemma2", .load = LoadGemma2, .synth_write = SynthWriteGemma2, .hf = &kHfGemma2};
const ArchSpec kGemma3Arch = {.name = "gemma3",
                              .load = LoadGemma3,
                              .synth_write = SynthWriteGemma3,
                              .synth_shapes = SynthShapesGemma3,
                              .hf = &kHfGemma3};

}  // namespace gale
