// Qwen2 / Qwen2.5 (GGUF "qwen2") and Qwen3 (GGUF "qwen3"), the dense models. Both are llama's
// layer with RoPE in NEOX mode (the halves of each head rotate together); Qwen2 adds biases to
// the Q, K and V products; Qwen3 has none but normalizes each head of Q and K (RMSNorm with a
// [head_size] weight) before RoPE, and its head size is attention.key_length, not dim / heads.
// Qwen3-MoE (GGUF "qwen3moe") is Qwen3's attention with a mixture of experts for every FFN:
// softmax over the experts, the top k renormalized to sum to one (as llama.cpp's graph for it),
// no shared experts; an expert's width is expert_feed_forward_length (else ffn / k).
#include "model/arch/arch.h"
#include "model/hf_checkpoint.h"
#include "model/synth.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

enum class Variant { kQwen2, kQwen3, kQwen3Moe };

struct QwenLayer : DenseMatrices {
  TensorView attn_norm, ffn_norm;
  TensorView bq, bk, bv;              // qwen2: [q_dim], [kv_dim], [kv_dim]
  TensorView q_norm, k_norm;          // qwen3: [head_dim] each
  MoeWeights moe;                     // qwen3moe
};

class QwenModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp, Variant variant) {
    std::unique_ptr<QwenModel> m(new QwenModel());
    m->hp_ = std::move(hp);
    m->hp_.rope_style = RopeStyle::kNeox;
    m->variant_ = variant;
    if (variant == Variant::kQwen3Moe) {
      MoeHParams& moe = m->hp_.moe;
      if (!moe.enabled()) return InvalidArgument("qwen3moe: the file has no qwen3moe.expert_count");
      RETURN_IF_ERROR(moe.SetSoftmaxTopK("qwen3moe", m->hp_.ffn_dim / moe.num_used));
    }
    const ModelHParams& h = m->hp_;
    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      QwenLayer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, h.q_dim(), &w.wq));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.v_dim(), &w.wv));
      if (variant == Variant::kQwen2) {
        RETURN_IF_ERROR(tensors.Vector(b + "attn_q.bias", h.q_dim(), &w.bq));
        RETURN_IF_ERROR(tensors.Vector(b + "attn_k.bias", h.kv_dim(), &w.bk));
        RETURN_IF_ERROR(tensors.Vector(b + "attn_v.bias", h.v_dim(), &w.bv));
      } else {
        RETURN_IF_ERROR(tensors.Vector(b + "attn_q_norm.weight", h.head_dim, &w.q_norm));
        RETURN_IF_ERROR(tensors.Vector(b + "attn_k_norm.weight", h.head_dim, &w.k_norm));
      }
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.attn_out_dim(), h.dim, &w.wo));
      RETURN_IF_ERROR(tensors.Vector(b + "ffn_norm.weight", h.dim, &w.ffn_norm));
      if (variant == Variant::kQwen3Moe) {
        RETURN_IF_ERROR(LoadMoeWeights(tensors, b, h, &w.moe));
        continue;
      }
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_gate.weight", h.dim, h.ffn_dim, &w.w_gate));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_up.weight", h.dim, h.ffn_dim, &w.w_up));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_down.weight", h.ffn_dim, h.dim, &w.w_down));
    }
    m->FinishLoad(tensors);
    return std::unique_ptr<Model>(std::move(m));
  }

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override {
    ForwardPass f(hp_, batch, kv, ws, pool, /*freq_factors=*/nullptr);
    f.Embed(token_embd_);
    for (int64_t l = f.first_layer(); l < f.end_layer(); ++l) {
      const QwenLayer& w = layers_[l];
      f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                       LinearInput::kAttnIn, "matmul_qkv");
      if (variant_ == Variant::kQwen2) {
        f.AddBias(ws.q.data(), w.bq, hp_.q_dim());
        f.AddBias(ws.k.data(), w.bk, hp_.kv_dim());
        f.AddBias(ws.v.data(), w.bv, hp_.v_dim());
      } else {
        f.HeadNorm(ws.q.data(), hp_.num_heads, w.q_norm, "q_norm", l);
        f.HeadNorm(ws.k.data(), hp_.num_kv_heads, w.k_norm, "k_norm", l);
      }
      f.Attention(l, &key_channels_);
      f.OutputProjection(l, w.wo);
      if (variant_ == Variant::kQwen3Moe) {
        f.MoeFfn(l, Floats(w.ffn_norm), w.moe);
      } else {
        f.GatedFfn(l, Floats(w.ffn_norm), w.w_gate, w.w_up, w.w_down);
      }
    }
    f.OutputHead(output_norm_, output_);
    return Status::Ok();
  }

  Status ShardLayer(int64_t layer, const TensorSharder& sharder) override {
    QwenLayer& w = layers_[layer];
    if (variant_ == Variant::kQwen2) {
      const std::string b = "blk." + std::to_string(layer) + " ";
      RETURN_IF_ERROR(sharder.Vector(&w.bq, b + "attention Q bias"));
      RETURN_IF_ERROR(sharder.KvVector(&w.bk, b + "attention K bias"));
      RETURN_IF_ERROR(sharder.KvVector(&w.bv, b + "attention V bias"));
    }
    return ShardDense(w, sharder, layer);
  }

  std::vector<MatrixWeight*> LayerMatrices(int64_t layer) override {
    QwenLayer& l = layers_[layer];
    std::vector<MatrixWeight*> all;
    if (variant_ == Variant::kQwen3Moe) {
      all = {&l.wq, &l.wk, &l.wv, &l.wo};
      l.moe.AppendTo(&all);
    } else {
      l.AppendTo(&all);
    }
    return all;
  }

 private:
  QwenModel() = default;
  Variant variant_ = Variant::kQwen2;
  std::vector<QwenLayer> layers_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadQwen2(const GgufFile& file, ModelHParams hp) {
  return QwenModel::Load(file, std::move(hp), Variant::kQwen2);
}
StatusOr<std::unique_ptr<Model>> LoadQwen3(const GgufFile& file, ModelHParams hp) {
  return QwenModel::Load(file, std::move(hp), Variant::kQwen3);
}
StatusOr<std::unique_ptr<Model>> LoadQwen3Moe(const GgufFile& file, ModelHParams hp) {
  return QwenModel::Load(file, std::move(hp), Variant::kQwen3Moe);
}

namespace {

// gale synth: Qwen's own epsilon and RoPE base (1e-6, 1e6), Qwen2's biases, Qwen3's per-head norms;
// Qwen3-MoE always with experts (their width as expert_feed_forward_length).
void SynthKeys(SynthWriter& w) {
  w.w.SetF32(w.p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.w.SetF32(w.p + "rope.freq_base", 1000000.0f);
}
Status SynthWriteQwen2(SynthWriter& w) {
  SynthKeys(w);
  return w.DecoderLayers({.qkv_bias = true});
}
Status SynthWriteQwen3(SynthWriter& w) {
  SynthKeys(w);
  if (w.s.num_experts > 0) w.w.SetU32(w.p + "expert_feed_forward_length", static_cast<uint32_t>(w.expert_ffn));
  return w.DecoderLayers({.qk_norm = true});
}
Status SynthCheckQwen3Moe(const SynthShape& s) {
  if (s.num_experts == 0) return InvalidArgument("synth: qwen3moe needs experts (--experts, --experts-used)");
  return Status::Ok();
}

std::vector<SynthShape> SynthShapesQwen2() {
  SynthShape s;
  s.name = "qwen2.5-0.5b", s.arch = "qwen2";
  s.dim = 896, s.num_layers = 24, s.num_heads = 14, s.num_kv_heads = 2, s.ffn_dim = 4864, s.vocab_size = 151936;
  s.context_length = 32768;
  return {s};
}
std::vector<SynthShape> SynthShapesQwen3() {
  SynthShape s;
  s.name = "qwen3-0.6b", s.arch = "qwen3";
  s.dim = 1024, s.num_layers = 28, s.num_heads = 16, s.num_kv_heads = 8, s.head_dim = 128, s.ffn_dim = 3072;
  s.vocab_size = 151936, s.context_length = 40960;
  return {s};
}
std::vector<SynthShape> SynthShapesQwen3Moe() {
  SynthShape s;  // Qwen3-30B-A3B's shapes, 12 of its 48 layers
  s.name = "qwen3-30b-a3b", s.arch = "qwen3moe";
  s.dim = 2048, s.num_layers = 12, s.num_heads = 32, s.num_kv_heads = 4, s.head_dim = 128, s.ffn_dim = 6144;
  s.vocab_size = 151936, s.context_length = 40960;
  s.num_experts = 128, s.experts_used = 8, s.expert_ffn = 768;
  return {s};
}

// gale convert --hf: NEOX-mode RoPE as Hugging Face computes it (rows as they are); Qwen2's
// Q/K/V biases, Qwen3's per-head norms.
const HfFamily kHfQwen2 = {.names = {"Qwen2ForCausalLM", "qwen2"}, .qkv_bias = true};
const HfFamily kHfQwen3 = {.names = {"Qwen3ForCausalLM", "qwen3"}, .qk_norm = true};

}  // namespace

const ArchSpec kQwen2Arch = {.name = "qwen2",
                             .load = LoadQwen2,
                             .synth_write = SynthWriteQwen2,
                             .synth_shapes = SynthShapesQwen2,
                             .hf = &kHfQwen2};
const ArchSpec kQwen3Arch = {.name = "qwen3",
                             .load = LoadQwen3,
                             .synth_write = SynthWriteQwen3,
                             .synth_shapes = SynthShapesQwen3,
                             .hf = &kHfQwen3};
const ArchSpec kQwen3MoeArch = {.name = "qwen3moe",
                                .load = LoadQwen3Moe,
                                .experts = true,
                                .synth_check = SynthCheckQwen3Moe,
                                .synth_write = SynthWriteQwen3,
                                .synth_shapes = SynthShapesQwen3Moe};

}  // namespace gale

