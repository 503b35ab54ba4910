// Phi-3 / Phi-3.5 / Phi-4-mini (GGUF "phi3"): llama's layer with Q, K and V in one fused matrix
// (attn_qkv), gate and up in one (ffn_up: the gate's rows first), RoPE in NEOX mode, and for the
// long-context models LongRoPE: per-frequency divisors (rope_factors_long / rope_factors_short,
// the long ones when the model's context exceeds rope.scaling.original_context_length, as
// llama.cpp picks them for its default context) and rope.scaling.attn_factor multiplying cos and
// sin. The fused matrices are read as row ranges of the file's tensor (no copy): the blocks see
// the same separate products as llama's.
#include <cmath>
#include <cstring>

#include "model/arch/arch.h"
#include "model/hf_checkpoint.h"
#include "model/synth.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

struct Phi3Layer : DenseMatrices {
  TensorView attn_norm, ffn_norm;
};

class Phi3Model final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp) {
    std::unique_ptr<Phi3Model> m(new Phi3Model());
    m->hp_ = std::move(hp);
    m->hp_.rope_style = RopeStyle::kNeox;
    const ModelHParams& h = m->hp_;
    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      Phi3Layer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.SplitMatrix(b + "attn_qkv.weight", h.dim,
                                          {{h.q_dim(), &w.wq}, {h.kv_dim(), &w.wk}, {h.v_dim(), &w.wv}}));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.attn_out_dim(), h.dim, &w.wo));
      RETURN_IF_ERROR(tensors.Vector(b + "ffn_norm.weight", h.dim, &w.ffn_norm));
      RETURN_IF_ERROR(tensors.SplitMatrix(b + "ffn_up.weight", h.dim, {{h.ffn_dim, &w.w_gate}, {h.ffn_dim, &w.w_up}}));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_down.weight", h.ffn_dim, h.dim, &w.w_down));
    }
    // LongRoPE: both factor tensors or neither.
    const std::string p = h.arch + ".";
    const bool has_long = tensors.Has("rope_factors_long.weight"), has_short = tensors.Has("rope_factors_short.weight");
    if (has_long != has_short) return InvalidArgument("phi3: rope_factors_long.weight and rope_factors_short.weight come together");
    if (has_long) {
      const int64_t original = file.GetInt(p + "rope.scaling.original_context_length", 0);
      if (original <= 0) return InvalidArgument("phi3: rope factors without rope.scaling.original_context_length");
      const char* which = h.context_length > original ? "rope_factors_long.weight" : "rope_factors_short.weight";
      TensorView f;
      RETURN_IF_ERROR(tensors.Vector(which, h.rope_dims / 2, &f));
      tensors.MarkUsed(h.context_length > original ? "rope_factors_short.weight" : "rope_factors_long.weight");
      m->rope_factors_.assign(reinterpret_cast<const float*>(f.data), reinterpret_cast<const float*>(f.data) + h.rope_dims / 2);
      for (float v : m->rope_factors_) {
        if (!(v > 0.0f) || !std::isfinite(v)) return InvalidArgument("tensor {}: factor {} is not positive", which, v);
      }
    }
    // LongRoPE's attention factor is rope.scaling.attn_factor (ReadHParams).
    m->FinishLoad(tensors);
    return std::unique_ptr<Model>(std::move(m));
  }

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override {
    ForwardPass f(hp_, batch, kv, ws, pool, rope_factors_.empty() ? nullptr : rope_factors_.data());
    f.Embed(token_embd_);
    for (int64_t l = f.first_layer(); l < f.end_layer(); ++l) {
      const Phi3Layer& w = layers_[l];
      f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                       LinearInput::kAttnIn, "matmul_qkv");
      f.Attention(l, &key_channels_);
      f.OutputProjection(l, w.wo);
      f.GatedFfn(l, Floats(w.ffn_norm), w.w_gate, w.w_up, w.w_down);
    }
    f.OutputHead(output_norm_, output_);
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
  Phi3Model() = default;
  std::vector<Phi3Layer> layers_;
  std::vector<float> rope_factors_;  // [rope_dims / 2] LongRoPE divisors; empty: none
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadPhi3(const GgufFile& file, ModelHParams hp) {
  return Phi3Model::Load(file, std::move(hp));
}

namespace {

// gale synth: the fused matrices, Phi-3's chat control tokens in the vocab's last ids (llama.cpp's
// loader looks some of them up), and with rope_freqs_ctx LongRoPE as Phi-3.5's converter writes it:
// long and short divisors per frequency (here rising from 1 to 8 and to 1.5), the original
// context, and the attention factor sqrt(1 + ln(context / original) / ln(original)).
Status SynthWrite(SynthWriter& w) {
  const SynthShape& s = w.s;
  w.control_tokens = {"<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"};
  RETURN_IF_ERROR(w.DecoderLayers({.fused_qkv = true, .fused_gate_up = true}));
  if (s.rope_freqs_ctx <= 0) return Status::Ok();
  const int64_t half = w.head_dim / 2;
  for (const auto& [name, top] : {std::pair<const char*, float>{"rope_factors_long.weight", 8.0f},
                                  std::pair<const char*, float>{"rope_factors_short.weight", 1.5f}}) {
    std::vector<float> f(half);
    for (int64_t i = 0; i < half; ++i) f[i] = 1.0f + (top - 1.0f) * static_cast<float>(i) / static_cast<float>(half);
    RETURN_IF_ERROR(w.Floats(name, f));
  }
  w.w.SetU32(w.p + "rope.scaling.original_context_length", static_cast<uint32_t>(s.rope_freqs_ctx));
  const double scale = static_cast<double>(s.context_length) / static_cast<double>(s.rope_freqs_ctx);
  w.w.SetF32(w.p + "rope.scaling.attn_factor",
             static_cast<float>(std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(s.rope_freqs_ctx)))));
  return Status::Ok();
}

std::vector<SynthShape> SynthShapes() {
  SynthShape s;
  s.name = "phi3-mini", s.arch = "phi3";
  s.dim = 3072, s.num_layers = 32, s.num_heads = 32, s.num_kv_heads = 32, s.ffn_dim = 8192, s.vocab_size = 32064;
  s.context_length = 4096;
  return {s};
}

// gale convert --hf: fused qkv_proj and gate_up_proj, part of each head rotated
// (partial_rotary_factor: Phi-3.5, Phi-4-mini). As llama.cpp's converter: the original context
// always; with LongRoPE ("longrope", "su") the long and short divisors as tensors and the
// attention factor sqrt(1 + ln(s) / ln(original)) for s = context / original.
Status HfKeys(HfKeysContext& c) {
  const nlohmann::json& config = c.config;
  c.rope_scaling_done = true;
  ASSIGN_OR_RETURN(const int64_t original,
                   HfConfigInt(config, "original_max_position_embeddings", c.context_length, 1, int64_t{1} << 24));
  c.out->SetU32(c.p + "rope.scaling.original_context_length", static_cast<uint32_t>(original));
  const nlohmann::json* rs =
      config.contains("rope_scaling") && config["rope_scaling"].is_object() ? &config["rope_scaling"] : nullptr;
  if (rs == nullptr) return Status::Ok();
  if (!rs->contains("long_factor")) return InvalidArgument("config.json: phi3 rope_scaling without long_factor is not supported");
  const std::string kind = rs->value("type", rs->value("rope_type", ""));
  if (kind != "longrope" && kind != "su") {
    return InvalidArgument("config.json: phi3 rope_scaling '{}' is not supported (longrope)", kind);
  }
  const double scale = static_cast<double>(c.context_length) / static_cast<double>(original);
  const double attn = scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(original))) : 1.0;
  c.out->SetF32(c.p + "rope.scaling.attn_factor", static_cast<float>(attn));
  for (const auto& [key, name] : {std::pair<const char*, const char*>{"long_factor", "rope_factors_long.weight"},
                                  std::pair<const char*, const char*>{"short_factor", "rope_factors_short.weight"}}) {
    const nlohmann::json& f = (*rs)[key];
    if (!f.is_array() || static_cast<int64_t>(f.size()) != c.rope_dims / 2) {
      return InvalidArgument("config.json: rope_scaling.{} must hold {} numbers", key, c.rope_dims / 2);
    }
    std::vector<float> v;
    for (const auto& x : f) {
      if (!x.is_number() || !(x.get<double>() > 0.0) || !std::isfinite(x.get<double>())) {
        return InvalidArgument("config.json: rope_scaling.{} holds {}, not a positive number", key, x.dump());
      }
      v.push_back(x.get<float>());
    }
    RETURN_IF_ERROR(c.AddFloats(name, v));
  }
  return Status::Ok();
}

const HfFamily kHf = {.names = {"Phi3ForCausalLM", "phi3"}, .fused = true, .partial_rotary = true, .keys = HfKeys};

}  // namespace

const ArchSpec kPhi3Arch = {
    .name = "phi3", .load = LoadPhi3, .synth_write = SynthWrite, .synth_shapes = SynthShapes, .hf = &kHf};

}  // namespace gale
