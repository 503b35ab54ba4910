// Hyperparameter parsing and validation shared by every architecture.
#include "model/hparams.h"

#include <tuple>
#include <algorithm>
#include <cmath>

namespace gale {

const char* PoolingName(Pooling p) {
  switch (p) {
    case Pooling::kNone: return "none";
    case Pooling::kMean: return "mean";
    case Pooling::kCls: return "cls";
    case Pooling::kLast: return "last";
  }
  return "";
}

StatusOr<Pooling> ParsePooling(const std::string& name) {
  for (Pooling p : {Pooling::kNone, Pooling::kMean, Pooling::kCls, Pooling::kLast}) {
    if (name == PoolingName(p)) return p;
  }
  return InvalidArgument("pooling '{}' is not one of none, mean, cls, last", name);
}

Status MoeHParams::SetSoftmaxTopK(const std::string& arch, int64_t default_ffn) {
  if (expert_ffn == 0) expert_ffn = default_ffn;
  gating = ExpertGating::kSoftmax;
  norm_weights = true;
  if (num_shared > 0 || num_groups > 0 || leading_dense > 0) {
    return Unimplemented("{}: shared experts, expert groups and dense leading layers are not part of this architecture", arch);
  }
  return Status::Ok();
}

std::pair<float, float> YarnCorrDims(int64_t rope_dims, double base, double original_ctx, double beta_fast,
                                     double beta_slow) {
  const double dims = static_cast<double>(rope_dims);
  auto corr_dim = [&](double rotations) { return dims * std::log(original_ctx / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base)); };
  return {static_cast<float>(std::max(0.0, std::floor(corr_dim(beta_fast)))),
          static_cast<float>(std::min(dims - 1.0, std::ceil(corr_dim(beta_slow))))};
}

StatusOr<ModelHParams> ReadHParams(const GgufFile& file) {
  ModelHParams hp;
  ASSIGN_OR_RETURN(hp.arch, file.GetString("general.architecture"));
  const std::string p = hp.arch + ".";
  ASSIGN_OR_RETURN(hp.dim, file.GetInt(p + "embedding_length"));
  ASSIGN_OR_RETURN(hp.ffn_dim, file.GetInt(p + "feed_forward_length"));
  ASSIGN_OR_RETURN(hp.num_layers, file.GetInt(p + "block_count"));
  ASSIGN_OR_RETURN(hp.num_heads, file.GetInt(p + "attention.head_count"));
  hp.num_kv_heads = file.GetInt(p + "attention.head_count_kv", hp.num_heads);
  hp.context_length = file.GetInt(p + "context_length", 2048);
  hp.rms_eps = static_cast<float>(file.GetDouble(p + "attention.layer_norm_rms_epsilon", 1e-5));
  hp.rope_freq_base = static_cast<float>(file.GetDouble(p + "rope.freq_base", 10000.0));

  auto bad = [&](const char* what) {
    return InvalidArgument("model hyperparameters: {} (dim {}, heads {}, kv heads {}, layers {}, ffn {})",
                           what, hp.dim, hp.num_heads, hp.num_kv_heads, hp.num_layers, hp.ffn_dim);
  };
  constexpr int64_t kLimit = 1 << 20;
  if (hp.dim <= 0 || hp.dim > kLimit) return bad("embedding_length out of range");
  if (hp.ffn_dim <= 0 || hp.ffn_dim > 16 * kLimit) return bad("feed_forward_length out of range");
  if (hp.num_layers <= 0 || hp.num_layers > 4096) return bad("block_count out of range");
  if (hp.num_heads <= 0 || hp.num_heads > 4096) return bad("head_count out of range");
  if (hp.num_kv_heads <= 0 || hp.num_heads % hp.num_kv_heads != 0) return bad("head_count_kv must divide head_count");
  if (hp.context_length <= 0) return bad("context_length must be positive");
  // The head size: attention.key_length where the file sets it (Qwen3, Gemma: not dim / heads).
  const int64_t key_length = file.GetInt(p + "attention.key_length", 0);
  const int64_t value_length = file.GetInt(p + "attention.value_length", key_length);
  if (key_length != 0) {
    if (key_length < 0 || key_length > 4096 || key_length % 2 != 0) return bad("attention.key_length must be even and at most 4096");
    hp.head_dim = key_length;
  } else {
    if (hp.dim % hp.num_heads != 0) return bad("head_count must divide embedding_length (or the file must set attention.key_length)");
    hp.head_dim = hp.dim / hp.num_heads;
  }
  // V's head size where it differs (deepseek2's latent rows have V's values as K's first
  // elements: its loader checks them).
  if (value_length != 0 && value_length != hp.head_dim && hp.arch != "deepseek2") {
    if (value_length < 0 || value_length > 4096 || value_length % 2 != 0) {
      return bad("attention.value_length must be even and at most 4096");
    }
    hp.v_head_dim = value_length;
  }
  hp.rope_dims = file.GetInt(p + "rope.dimension_count", hp.head_dim);
  if (hp.rope_dims <= 0 || hp.rope_dims > hp.head_dim || hp.rope_dims % 2 != 0) {
    return bad("rope.dimension_count must be even and at most the head size");
  }
  if (!(hp.rms_eps > 0.0f) || !(hp.rope_freq_base > 0.0f)) return bad("rms epsilon and rope freq_base must be positive");
  const int64_t pooling = file.GetInt(p + "pooling_type", 0);
  if (pooling < 0 || pooling > 3) {
    return Unimplemented("{}pooling_type {} is not supported (0 none, 1 mean, 2 cls, 3 last; 4 rank is not)", p, pooling);
  }
  hp.pooling = static_cast<Pooling>(pooling);

  MoeHParams& moe = hp.moe;
  moe.num_experts = file.GetInt(p + "expert_count", 0);
  if (moe.num_experts != 0) {
    moe.num_used = file.GetInt(p + "expert_used_count", 0);
    moe.expert_ffn = file.GetInt(p + "expert_feed_forward_length", 0);
    moe.num_shared = file.GetInt(p + "expert_shared_count", 0);
    moe.shared_ffn = file.GetInt(p + "expert_shared_feed_forward_length", 0);
    moe.leading_dense = file.GetInt(p + "leading_dense_block_count", 0);
    moe.num_groups = file.GetInt(p + "expert_group_count", 0);
    moe.groups_used = file.GetInt(p + "expert_group_used_count", 0);
    if (const GgufValue* norm = file.Find(p + "expert_weights_norm"); norm != nullptr) {
      moe.norm_weights = norm->AsBool().value_or(norm->AsInt().value_or(0) != 0);
    }
    const double scale = file.GetDouble(p + "expert_weights_scale", 0.0);
    moe.weights_scale = scale == 0.0 ? 1.0f : static_cast<float>(scale);
    const int64_t gating = file.GetInt(p + "expert_gating_func", 0);
    if (gating < 0 || gating > 4) {
      return Unimplemented("{}expert_gating_func {} is not supported (1 softmax, 2 sigmoid, 3 softmax of the chosen, 4 "
                           "sqrt of softplus)", p, gating);
    }
    if (gating != 0) moe.gating = static_cast<ExpertGating>(gating);
    auto bad_moe = [&](const char* what) {
      return InvalidArgument("model hyperparameters: {} (experts {}, used {}, expert ffn {}, groups {} using {})", what,
                             moe.num_experts, moe.num_used, moe.expert_ffn, moe.num_groups, moe.groups_used);
    };
    if (moe.num_experts < 0 || moe.num_experts > 4096) return bad_moe("expert_count out of range");
    if (moe.num_used <= 0 || moe.num_used > moe.num_experts) return bad_moe("expert_used_count must be in [1, expert_count]");
    if (moe.expert_ffn < 0 || moe.expert_ffn > 16 * kLimit) return bad_moe("expert_feed_forward_length out of range");
    if (moe.num_shared < 0 || moe.num_shared > 64 || moe.shared_ffn < 0 || moe.shared_ffn > 16 * kLimit) {
      return bad_moe("expert_shared_count or its feed_forward_length out of range");
    }
    if (moe.leading_dense < 0 || moe.leading_dense > hp.num_layers) return bad_moe("leading_dense_block_count out of range");
    if (!std::isfinite(moe.weights_scale) || !(moe.weights_scale > 0.0f)) return bad_moe("expert_weights_scale must be positive");
    if (moe.num_groups > 1) {
      if (moe.num_experts % moe.num_groups != 0 || moe.groups_used <= 0 || moe.groups_used > moe.num_groups ||
          moe.num_used > moe.groups_used * (moe.num_experts / moe.num_groups)) {
        return bad_moe("expert groups must divide expert_count, and the groups used must hold expert_used_count experts");
      }
    } else {
      moe.num_groups = moe.groups_used = 0;
    }
  }

  const GgufValue* scaling_type = file.Find(p + "rope.scaling.type");
  if (scaling_type != nullptr && scaling_type->AsString() != nullptr) {
    const std::string& t = *scaling_type->AsString();
    if (t == "linear") {
      const double factor = file.GetDouble(p + "rope.scaling.factor", 1.0);
      if (!(factor > 0.0)) return bad("rope.scaling.factor must be positive");
      hp.rope_freq_scale = static_cast<float>(1.0 / factor);
    } else if (t == "yarn") {
      // As llama.cpp: theta blends interpolation (1 / factor) and extrapolation over the dims
      // between the correction dims of beta_fast and beta_slow rotations in the original context;
      // cos and sin scaled by attn_factor * (1 + 0.1 ln(factor)).
      const double factor = file.GetDouble(p + "rope.scaling.factor", 1.0);
      const double original = static_cast<double>(file.GetInt(p + "rope.scaling.original_context_length", hp.context_length));
      const double beta_fast = file.GetDouble(p + "rope.scaling.yarn_beta_fast", 32.0);
      const double beta_slow = file.GetDouble(p + "rope.scaling.yarn_beta_slow", 1.0);
      const double ext = file.GetDouble(p + "rope.scaling.yarn_ext_factor", 1.0);
      const double attn = file.GetDouble(p + "rope.scaling.attn_factor", 1.0);
      if (!(factor >= 1.0) || !(original > 0.0) || !(beta_fast > 0.0) || !(beta_slow > 0.0) || !(ext >= 0.0) ||
          !(attn > 0.0)) {
        return bad("yarn: rope.scaling.factor >= 1, original_context_length, the betas and attn_factor must be positive");
      }
      hp.rope_freq_scale = static_cast<float>(1.0 / factor);
      hp.yarn_orig_ctx = original;
      hp.yarn_beta_fast = beta_fast;
      hp.yarn_beta_slow = beta_slow;
      std::tie(hp.yarn_corr_low, hp.yarn_corr_high) =
          YarnCorrDims(hp.rope_dims, hp.rope_freq_base, original, beta_fast, beta_slow);
      hp.yarn_ext_factor = static_cast<float>(ext);
      hp.rope_attn_factor = static_cast<float>(attn * (ext != 0.0 ? 1.0 + 0.1 * std::log(factor) : 1.0));
    } else if (t != "none") {
      return Unimplemented("rope scaling type '{}' is not supported yet (gale supports none, linear, yarn, and llama3 "
                           "through the rope_freqs tensor)", t);
    }
  }
  return hp;
}

}  // namespace gale
