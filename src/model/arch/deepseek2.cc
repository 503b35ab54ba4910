// DeepSeek-V2/V3/R1, Kimi-K2 and other files of GGUF architecture "deepseek2", in the MLA format
// llama.cpp's converter writes (attention.key_length_mla / value_length_mla, per-head attn_k_b and
// attn_v_b): latent attention (ForwardPass::LatentAttention; the cache holds one row of
// kv_lora_rank + rope dims per position and layer, both K and V), RoPE in normal mode on the
// rope part, leading dense layers, then a mixture of experts with shared experts in every other
// layer; the routing is the file's (softmax for V2, sigmoid with the exp_probs_b selection bias,
// expert groups, renormalized and scaled weights for V3).
#include <cmath>

#include "model/arch/arch.h"
#include "model/synth.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

struct DeepseekLayer {
  TensorView attn_norm, ffn_norm;
  LatentAttentionWeights attn;
  LayerFfn ffn;
};

class Deepseek2Model final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp) {
    std::unique_ptr<Deepseek2Model> m(new Deepseek2Model());
    m->hp_ = std::move(hp);
    ModelHParams& h = m->hp_;
    const std::string p = h.arch + ".";
    MlaHParams& mla = h.mla;
    const int64_t key_mla = file.GetInt(p + "attention.key_length_mla", 0);
    mla.v_head_dim = file.GetInt(p + "attention.value_length_mla", 0);
    mla.kv_lora_rank = file.GetInt(p + "attention.kv_lora_rank", 0);
    mla.q_lora_rank = file.GetInt(p + "attention.q_lora_rank", 0);
    if (key_mla == 0 || file.FindTensor("blk.0.attn_kv_b.weight") != nullptr) {
      return Unimplemented("deepseek2: this file predates llama.cpp's MLA format (attn_kv_b, no attention.key_length_mla): "
                           "convert it again with a current converter");
    }
    mla.nope_dim = key_mla - h.rope_dims;
    const int64_t value_length = file.GetInt(p + "attention.value_length", h.head_dim);
    h.v_head_dim = 0;  // the latent is K's and V's row: V's values are its first kv_lora_rank
    if (mla.kv_lora_rank <= 0 || mla.kv_lora_rank > 65536 || mla.nope_dim < 0 || mla.v_head_dim <= 0 ||
        mla.v_head_dim > 4096 || mla.q_lora_rank < 0 || mla.q_lora_rank > 65536 || h.num_kv_heads != 1 ||
        h.head_dim != mla.kv_lora_rank + h.rope_dims || value_length != mla.kv_lora_rank) {
      return InvalidArgument("deepseek2: inconsistent latent attention (kv_lora_rank {}, q_lora_rank {}, key_length {} "
                             "= kv_lora_rank + rope {}?, value_length {} = kv_lora_rank?, key_length_mla {}, "
                             "value_length_mla {}, head_count_kv {} = 1?)",
                             mla.kv_lora_rank, mla.q_lora_rank, h.head_dim, h.rope_dims, value_length, key_mla,
                             mla.v_head_dim, h.num_kv_heads);
    }
    h.rope_style = RopeStyle::kNormal;
    h.kv_latent = true;
    // The kernel scales by 1 / sqrt(head_dim) = 1 / sqrt(kv_lora_rank + rope); the model's scale
    // is mscale^2 / sqrt(nope + rope). With YaRN (as llama.cpp's graph for this architecture, checked
    // against it): RoPE's cos and sin are not scaled (YaRN's 1 + 0.1 ln(factor) is cancelled), and
    // mscale = attn_factor (1 + yarn_log_multiplier ln(factor)), DeepSeek's attention-scale
    // correction (the converter writes yarn_log_multiplier = 0.1 mscale_all_dim).
    // Mistral-Large-3's attention temperature (llama.cpp reads it for this architecture) is not
    // run here; nor is an attention factor outside YaRN's (llama.cpp scales both RoPE and scores by it).
    if (file.GetDouble(p + "attention.temperature_scale", 0.0) != 0.0) {
      return Unimplemented("deepseek2: {}attention.temperature_scale (attention temperature tuning) is not supported", p);
    }
    if (h.yarn_ext_factor == 0.0f && h.rope_attn_factor_file != 1.0f) {
      return Unimplemented("deepseek2: {}rope.scaling.attn_factor {} without YaRN is not supported", p, h.rope_attn_factor_file);
    }
    double mscale = 1.0;
    if (h.yarn_ext_factor != 0.0f || h.rope_freq_scale != 1.0f) {
      if (h.yarn_ext_factor == 0.0f) return Unimplemented("deepseek2: RoPE scaling other than YaRN is not supported");
      const double attn = file.GetDouble(p + "rope.scaling.attn_factor", 1.0);
      const double log_mul = file.GetDouble(p + "rope.scaling.yarn_log_multiplier", 0.0);
      h.rope_attn_factor = 1.0f;
      mscale = attn * (1.0 + log_mul * std::log(1.0 / static_cast<double>(h.rope_freq_scale)));
    }
    h.query_scale =
        static_cast<float>(mscale * mscale * std::sqrt(static_cast<double>(h.head_dim) / static_cast<double>(key_mla)));
    MoeHParams& moe = h.moe;
    if (!moe.enabled()) return InvalidArgument("deepseek2: the file has no deepseek2.expert_count");
    if (moe.expert_ffn == 0) return InvalidArgument("deepseek2: the file has no expert_feed_forward_length");
    if (moe.num_shared > 0 && moe.shared_ffn == 0) moe.shared_ffn = moe.expert_ffn * moe.num_shared;

    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    const int64_t heads = h.num_heads, qk = key_mla;
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      DeepseekLayer& w = m->layers_[l];
      LatentAttentionWeights& a = w.attn;
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      if (mla.q_lora_rank > 0) {
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_q_a.weight", h.dim, mla.q_lora_rank, &a.wq_a));
        RETURN_IF_ERROR(tensors.Vector(b + "attn_q_a_norm.weight", mla.q_lora_rank, &a.q_a_norm));
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_q_b.weight", mla.q_lora_rank, heads * qk, &a.wq_b));
      } else {
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, heads * qk, &a.wq));
      }
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_kv_a_mqa.weight", h.dim, h.head_dim, &a.wkv_a));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_kv_a_norm.weight", mla.kv_lora_rank, &a.kv_a_norm));
      RETURN_IF_ERROR(tensors.StackedMatrices(b + "attn_k_b.weight", mla.nope_dim, mla.kv_lora_rank, heads, &a.wk_b));
      RETURN_IF_ERROR(tensors.StackedMatrices(b + "attn_v_b.weight", mla.kv_lora_rank, mla.v_head_dim, heads, &a.wv_b));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", heads * mla.v_head_dim, h.dim, &a.wo));
      RETURN_IF_ERROR(tensors.Vector(b + "ffn_norm.weight", h.dim, &w.ffn_norm));
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
      const DeepseekLayer& w = layers_[l];
      f.LatentAttention(l, Floats(w.attn_norm), w.attn);
      f.Ffn(l, Floats(w.ffn_norm), w.ffn);
    }
    f.OutputHead(output_norm_, output_);
    return Status::Ok();
  }

  std::vector<MatrixWeight*> LayerMatrices(int64_t l) override {
    std::vector<MatrixWeight*> all;
    DeepseekLayer& w = layers_[l];
    w.attn.AppendTo(&all);
    w.ffn.AppendTo(&all, hp_, l);
    return all;
  }

 private:
  Deepseek2Model() = default;

  std::vector<DeepseekLayer> layers_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadDeepseek2(const GgufFile& file, ModelHParams hp) {
  return Deepseek2Model::Load(file, std::move(hp));
}

namespace {

// gale synth: latent attention in llama.cpp's MLA format (the cache row is the key, its latent
// part the value) with DeepSeek-V3's routing: sigmoid scores, a selection bias, expert groups
// (0: none), weights renormalized and scaled by 2.5; dense leading layers and shared experts.
Status SynthCheck(const SynthShape& s) {
  if (s.kv_lora_rank <= 0 || s.rope_dim <= 0 || s.rope_dim % 2 != 0 || s.nope_dim < 0 || s.v_head_dim <= 0 ||
      s.q_lora_rank < 0 || s.leading_dense < 0 || s.leading_dense > s.num_layers || s.shared_experts < 0) {
    return InvalidArgument("synth: deepseek2 needs --kv-lora-rank, an even --rope-dim, --v-head-dim (and --nope-dim, --q-lora-rank)");
  }
  if (s.num_experts == 0) return InvalidArgument("synth: deepseek2 needs experts (--experts, --experts-used)");
  return Status::Ok();
}

Status SynthWrite(SynthWriter& w) {
  const SynthShape& s = w.s;
  GgufWriter& out = w.w;
  const std::string& p = w.p;
  const int64_t row = s.kv_lora_rank + s.rope_dim, qk = s.nope_dim + s.rope_dim;  // the cache row; Q's head
  out.SetU32(p + "attention.head_count_kv", 1);
  out.SetU32(p + "attention.key_length", static_cast<uint32_t>(row));
  out.SetU32(p + "attention.value_length", static_cast<uint32_t>(s.kv_lora_rank));
  out.SetU32(p + "attention.key_length_mla", static_cast<uint32_t>(qk));
  out.SetU32(p + "attention.value_length_mla", static_cast<uint32_t>(s.v_head_dim));
  out.SetU32(p + "attention.kv_lora_rank", static_cast<uint32_t>(s.kv_lora_rank));
  if (s.q_lora_rank > 0) out.SetU32(p + "attention.q_lora_rank", static_cast<uint32_t>(s.q_lora_rank));
  out.SetU32(p + "leading_dense_block_count", static_cast<uint32_t>(s.leading_dense));
  out.SetU32(p + "expert_shared_count", static_cast<uint32_t>(s.shared_experts));
  out.SetF32(p + "expert_weights_scale", 2.5f);
  out.SetBool(p + "expert_weights_norm", true);
  out.SetU32(p + "expert_gating_func", 2);  // sigmoid
  if (s.expert_groups > 1) {
    out.SetU32(p + "expert_group_count", static_cast<uint32_t>(s.expert_groups));
    out.SetU32(p + "expert_group_used_count", static_cast<uint32_t>(s.groups_used));
  }
  out.SetU32(p + "rope.dimension_count", static_cast<uint32_t>(s.rope_dim));
  out.SetU32(p + "expert_feed_forward_length", static_cast<uint32_t>(w.expert_ffn));
  if (s.yarn_factor > 0.0) out.SetF32(p + "rope.scaling.yarn_log_multiplier", 0.1f);  // DeepSeek-V3's converter: 0.1 * mscale_all_dim
  RETURN_IF_ERROR(w.Ones("output_norm.weight", s.dim));
  RETURN_IF_ERROR(w.Matrix("output.weight", s.dim, s.vocab_size, w.type));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    RETURN_IF_ERROR(w.Ones(b + "attn_norm.weight", s.dim));
    if (s.q_lora_rank > 0) {
      RETURN_IF_ERROR(w.Matrix(b + "attn_q_a.weight", s.dim, s.q_lora_rank, w.type));
      RETURN_IF_ERROR(w.Vector(b + "attn_q_a_norm.weight", s.q_lora_rank, 1.0f, 0.5f));
      RETURN_IF_ERROR(w.Matrix(b + "attn_q_b.weight", s.q_lora_rank, s.num_heads * qk, w.type));
    } else {
      RETURN_IF_ERROR(w.Matrix(b + "attn_q.weight", s.dim, s.num_heads * qk, w.type));
    }
    RETURN_IF_ERROR(w.Matrix(b + "attn_kv_a_mqa.weight", s.dim, row, w.type));
    RETURN_IF_ERROR(w.Vector(b + "attn_kv_a_norm.weight", s.kv_lora_rank, 1.0f, 0.5f));
    RETURN_IF_ERROR(w.Matrix(b + "attn_k_b.weight", s.nope_dim, s.kv_lora_rank, w.type, s.num_heads));
    RETURN_IF_ERROR(w.Matrix(b + "attn_v_b.weight", s.kv_lora_rank, s.v_head_dim, w.type, s.num_heads));
    RETURN_IF_ERROR(w.Matrix(b + "attn_output.weight", s.num_heads * s.v_head_dim, s.dim, w.type));
    RETURN_IF_ERROR(w.Ones(b + "ffn_norm.weight", s.dim));
    RETURN_IF_ERROR(l < s.leading_dense ? w.GatedFfn(b, s.ffn_dim) : w.BiasedExperts(b));
  }
  return Status::Ok();
}

}  // namespace

const ArchSpec kDeepseek2Arch = {.name = "deepseek2",
                                 .load = LoadDeepseek2,
                                 .experts = true,
                                 .latent_attention = true,
                                 .synth_check = SynthCheck,
                                 .synth_write = SynthWrite,
                                 .calibrated_quantization = false};

}  // namespace gale
