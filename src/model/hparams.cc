// Hyperparameter parsing and validation shared by every architecture.
#include "model/hparams.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

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

namespace {

// A key read strictly: its default when absent, an error naming it when present with a type that
// is not a number (GgufFile::GetInt's default would hide a value the file really sets).
StatusOr<int64_t> OptionalInt(const GgufFile& file, const std::string& key, int64_t dflt) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) return dflt;
  if (!v->AsInt()) return InvalidArgument("metadata key '{}' is a {}, expected an integer", key, GgufValueTypeName(v->type));
  return *v->AsInt();
}

StatusOr<double> OptionalDouble(const GgufFile& file, const std::string& key, double dflt) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) return dflt;
  if (!v->AsDouble()) return InvalidArgument("metadata key '{}' is a {}, expected a number", key, GgufValueTypeName(v->type));
  return *v->AsDouble();
}

}  // namespace

StatusOr<int64_t> PerLayerInt(const GgufFile& file, const std::string& key, int64_t num_layers, std::optional<int64_t> dflt) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) {
    if (dflt) return *dflt;
    return NotFound("metadata key '{}' is missing", key);
  }
  if (v->type != GgufValueType::kArray) {
    if (!v->AsInt()) return InvalidArgument("metadata key '{}' is a {}, expected an integer", key, GgufValueTypeName(v->type));
    return *v->AsInt();
  }
  // llama.cpp takes a value per layer; gale's layers share one, so the values must agree.
  if (static_cast<int64_t>(v->array.size()) != num_layers || v->array.empty()) {
    return InvalidArgument("metadata key '{}' holds {} values for {} layers", key, v->array.size(), num_layers);
  }
  const std::optional<int64_t> first = v->array[0].AsInt();
  for (const GgufValue& e : v->array) {
    if (!e.AsInt()) return InvalidArgument("metadata key '{}' holds a {}, expected integers", key, GgufValueTypeName(e.type));
    if (*e.AsInt() != *first) {
      return Unimplemented("metadata key '{}' differs between layers ({} and {}); gale runs every layer of a model with "
                           "one value", key, *first, *e.AsInt());
    }
  }
  return *first;
}

namespace {

Status BadHParams(const ModelHParams& hp, const char* what) {
  return InvalidArgument("model hyperparameters: {} (dim {}, heads {}, kv heads {}, layers {}, ffn {})", what, hp.dim,
                         hp.num_heads, hp.num_kv_heads, hp.num_layers, hp.ffn_dim);
}

// The head sizes (K, V, the windowed layers'), the rotated dims and the pooling.
Status ReadHeadKeys(const GgufFile& file, const std::string& p, ModelHParams& hp) {
  auto bad = [&](const char* what) { return BadHParams(hp, what); };
  // The head size: attention.key_length where the file sets it (Qwen3, Gemma: not dim / heads).
  ASSIGN_OR_RETURN(const int64_t key_length, OptionalInt(file, p + "attention.key_length", 0));
  ASSIGN_OR_RETURN(const int64_t value_length, OptionalInt(file, p + "attention.value_length", key_length));
  if (key_length != 0) {
    if (key_length < 0 || key_length > 4096 || key_length % 2 != 0) return bad("attention.key_length must be even and at most 4096");
    hp.head_dim = key_length;
  } else {
    if (hp.dim % hp.num_heads != 0) return bad("head_count must divide embedding_length (or the file must set attention.key_length)");
    hp.head_dim = hp.dim / hp.num_heads;
  }
  // V's head size where it differs (latent attention's rows have V's values as K's first
  // elements: such an architecture's loader reads and checks them, and resets this).
  if (value_length != 0 && value_length != hp.head_dim) {
    if (value_length < 0 || value_length > 4096 || value_length % 2 != 0) {
      return bad("attention.value_length must be even and at most 4096");
    }
    hp.v_head_dim = value_length;
  }
  ASSIGN_OR_RETURN(hp.rope_dims, OptionalInt(file, p + "rope.dimension_count", hp.head_dim));
  // The windowed layers' own sizes (Gemma 4 has them): kept to be checked against the
  // architecture's windowed layers (CheckWindowedSizes).
  ASSIGN_OR_RETURN(hp.swa_key_length, OptionalInt(file, p + "attention.key_length_swa", 0));
  ASSIGN_OR_RETURN(hp.swa_value_length, OptionalInt(file, p + "attention.value_length_swa", 0));
  ASSIGN_OR_RETURN(hp.swa_rope_dims, OptionalInt(file, p + "rope.dimension_count_swa", 0));
  if (hp.rope_dims <= 0 || hp.rope_dims > hp.head_dim || hp.rope_dims % 2 != 0) {
    return bad("rope.dimension_count must be even and at most the head size");
  }
  if (!(hp.rms_eps > 0.0f) || !(hp.rope_freq_base > 0.0f)) return bad("rms epsilon and rope freq_base must be positive");
  ASSIGN_OR_RETURN(const int64_t pooling, OptionalInt(file, p + "pooling_type", 0));
  if (pooling < 0 || pooling > 3) {
    return Unimplemented("{}pooling_type {} is not supported (0 none, 1 mean, 2 cls, 3 last; 4 rank is not)", p, pooling);
  }
  hp.pooling = static_cast<Pooling>(pooling);

  return Status::Ok();
}

// A mixture of experts' keys (expert_count set), checked.
Status ReadExpertKeys(const GgufFile& file, const std::string& p, int64_t block_count, ModelHParams& hp) {
  constexpr int64_t kLimit = 1 << 20;
  MoeHParams& moe = hp.moe;
  ASSIGN_OR_RETURN(moe.num_used, PerLayerInt(file, p + "expert_used_count", block_count, 0));
  ASSIGN_OR_RETURN(moe.expert_ffn, PerLayerInt(file, p + "expert_feed_forward_length", block_count, 0));
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
  return Status::Ok();
}

// RoPE scaling as llama.cpp reads it: the type defaults to linear (a factor alone scales
// linearly; rope.scale_linear is its older name), "none" never scales, and attn_factor scales
// cos and sin whatever the type.
Status ReadRopeScaling(const GgufFile& file, const std::string& p, ModelHParams& hp) {
  auto bad = [&](const char* what) { return BadHParams(hp, what); };
  std::string type = "linear";
  if (const GgufValue* t = file.Find(p + "rope.scaling.type"); t != nullptr) {
    if (t->AsString() == nullptr) return InvalidArgument("metadata key '{}rope.scaling.type' is not a string", p);
    type = *t->AsString();
  }
  ASSIGN_OR_RETURN(double factor, OptionalDouble(file, p + "rope.scaling.factor", 0.0));
  if (factor == 0.0) {
    ASSIGN_OR_RETURN(factor, OptionalDouble(file, p + "rope.scale_linear", 0.0));
  }
  if (factor == 0.0) factor = 1.0;
  ASSIGN_OR_RETURN(const double attn, OptionalDouble(file, p + "rope.scaling.attn_factor", 1.0));
  if (!(factor > 0.0) || !std::isfinite(factor)) return bad("rope.scaling.factor must be positive");
  if (!(attn > 0.0) || !std::isfinite(attn)) return bad("rope.scaling.attn_factor must be positive");
  hp.rope_attn_factor = static_cast<float>(attn);
  hp.rope_attn_factor_file = static_cast<float>(attn);
  if (type == "linear") {
    hp.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (type == "yarn") {
    // As llama.cpp: theta blends interpolation (1 / factor) and extrapolation over the dims
    // between the correction dims of beta_fast and beta_slow rotations in the original context;
    // cos and sin scaled by attn_factor * (1 + 0.1 ln(factor)).
    ASSIGN_OR_RETURN(const int64_t original_ctx,
                     OptionalInt(file, p + "rope.scaling.original_context_length", hp.context_length));
    const double original = static_cast<double>(original_ctx);
    const double beta_fast = file.GetDouble(p + "rope.scaling.yarn_beta_fast", 32.0);
    const double beta_slow = file.GetDouble(p + "rope.scaling.yarn_beta_slow", 1.0);
    const double ext = file.GetDouble(p + "rope.scaling.yarn_ext_factor", 1.0);
    if (!(factor >= 1.0) || !(original > 0.0) || !(beta_fast > 0.0) || !(beta_slow > 0.0) || !(ext >= 0.0)) {
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
  } else if (type != "none") {
    return Unimplemented("{}rope.scaling.type '{}' is not supported yet (gale supports none, linear, yarn, and "
                         "llama3 through the rope_freqs tensor)", p, type);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ModelHParams> ReadHParams(const GgufFile& file) {
  ModelHParams hp;
  ASSIGN_OR_RETURN(hp.arch, file.GetString("general.architecture"));
  const std::string p = hp.arch + ".";
  ASSIGN_OR_RETURN(hp.dim, file.GetInt(p + "embedding_length"));
  ASSIGN_OR_RETURN(const int64_t block_count, file.GetInt(p + "block_count"));
  if (block_count <= 0 || block_count > 4096) return InvalidArgument("model hyperparameters: block_count {} out of range", block_count);
  // The last nextn_predict_layers layers are multi-token-prediction heads: not part of the
  // forward pass (their tensors stay unread), as llama.cpp's n_layer() leaves them out.
  ASSIGN_OR_RETURN(const int64_t nextn, OptionalInt(file, p + "nextn_predict_layers", 0));
  if (nextn < 0 || nextn >= block_count) {
    return InvalidArgument("model hyperparameters: nextn_predict_layers {} of {} layers", nextn, block_count);
  }
  hp.num_layers = block_count - nextn;
  hp.num_nextn_layers = nextn;
  ASSIGN_OR_RETURN(hp.ffn_dim, PerLayerInt(file, p + "feed_forward_length", block_count));
  ASSIGN_OR_RETURN(hp.num_heads, PerLayerInt(file, p + "attention.head_count", block_count));
  ASSIGN_OR_RETURN(hp.num_kv_heads, PerLayerInt(file, p + "attention.head_count_kv", block_count, hp.num_heads));
  ASSIGN_OR_RETURN(hp.context_length, OptionalInt(file, p + "context_length", 2048));
  ASSIGN_OR_RETURN(const double rms_eps, OptionalDouble(file, p + "attention.layer_norm_rms_epsilon", 1e-5));
  hp.rms_eps = static_cast<float>(rms_eps);
  ASSIGN_OR_RETURN(const double freq_base, OptionalDouble(file, p + "rope.freq_base", 10000.0));
  hp.rope_freq_base = static_cast<float>(freq_base);
  // What llama.cpp reads for every architecture and gale does not run: refused unless the file
  // leaves them at their meaning-free defaults (docs/model-layer.md lists every key).
  if (const int64_t out = file.GetInt(p + "embedding_length_out", hp.dim); out != hp.dim) {
    return Unimplemented("{}embedding_length_out {} differs from embedding_length {}: output projections to another "
                         "width are not supported", p, out, hp.dim);
  }
  if (const GgufValue* labels = file.Find(p + "classifier.output_labels"); labels != nullptr && !labels->array.empty()) {
    return Unimplemented("{}classifier.output_labels: classification heads are not supported (gale pools embeddings "
                         "or generates)", p);
  }
  if (const GgufValue* causal = file.Find(p + "attention.causal"); causal != nullptr) {
    if (!causal->AsBool()) return InvalidArgument("metadata key '{}attention.causal' is not a bool", p);
    hp.causal_key = *causal->AsBool();
  }

  auto bad = [&](const char* what) { return BadHParams(hp, what); };
  constexpr int64_t kLimit = 1 << 20;
  if (hp.dim <= 0 || hp.dim > kLimit) return bad("embedding_length out of range");
  if (hp.ffn_dim <= 0 || hp.ffn_dim > 16 * kLimit) return bad("feed_forward_length out of range");
  if (hp.num_heads <= 0 || hp.num_heads > 4096) return bad("head_count out of range");
  if (hp.num_kv_heads <= 0 || hp.num_heads % hp.num_kv_heads != 0) return bad("head_count_kv must divide head_count");
  if (hp.context_length <= 0) return bad("context_length must be positive");
  RETURN_IF_ERROR(ReadHeadKeys(file, p, hp));
  ASSIGN_OR_RETURN(hp.moe.num_experts, OptionalInt(file, p + "expert_count", 0));
  if (hp.moe.num_experts != 0) RETURN_IF_ERROR(ReadExpertKeys(file, p, block_count, hp));
  RETURN_IF_ERROR(ReadRopeScaling(file, p, hp));
  return hp;
}

void SetWindowedRope(ModelHParams* hp, float base, bool scaled) {
  hp->rope_freq_base_swa = base;
  hp->rope_swa_scaled = scaled;
  if (scaled && hp->yarn_ext_factor != 0.0f) {
    std::tie(hp->yarn_corr_low_swa, hp->yarn_corr_high_swa) =
        YarnCorrDims(hp->rope_dims, base, hp->yarn_orig_ctx, hp->yarn_beta_fast, hp->yarn_beta_slow);
  }
}

Status ReadLayerFlags(const GgufValue& v, const std::string& key, int64_t num_layers, std::vector<uint8_t>* out) {
  // One bool per layer of the file (its multi-token-prediction layers included).
  if (v.type != GgufValueType::kArray || static_cast<int64_t>(v.array.size()) < num_layers) {
    return InvalidArgument("metadata key '{}' holds {} values for {} layers", key,
                           v.type == GgufValueType::kArray ? v.array.size() : 1, num_layers);
  }
  out->assign(static_cast<size_t>(num_layers), 0);
  for (int64_t l = 0; l < num_layers; ++l) {
    const std::optional<bool> b = v.array[l].AsBool();
    const std::optional<int64_t> i = v.array[l].AsInt();
    if (!b && !i) return InvalidArgument("metadata key '{}' holds a {}, expected bools", key, GgufValueTypeName(v.array[l].type));
    (*out)[l] = b ? *b : *i != 0;
  }
  return Status::Ok();
}

Status ReadWindowedLayers(const GgufFile& file, int64_t default_period, ModelHParams* hp) {
  const std::string key = hp->arch + ".attention.sliding_window_pattern";
  hp->swa_layers.assign(static_cast<size_t>(hp->num_layers), 0);
  const GgufValue* v = file.Find(key);
  if (v != nullptr && v->type == GgufValueType::kArray) return ReadLayerFlags(*v, key, hp->num_layers, &hp->swa_layers);
  int64_t period = default_period;
  if (v != nullptr) {
    if (!v->AsInt() || *v->AsInt() < 0) return InvalidArgument("metadata key '{}' must be a period >= 0 or bools", key);
    period = *v->AsInt();
  }
  for (int64_t l = 0; l < hp->num_layers; ++l) hp->swa_layers[l] = period == 0 || l % period < period - 1;
  return Status::Ok();
}

Status CheckLoadedHParams(const ModelHParams& hp) {
  const std::string p = hp.arch + ".";
  bool windowed = false;
  for (int64_t l = 0; l < hp.num_layers; ++l) windowed = windowed || hp.LayerWindow(l) > 0;
  if (windowed) {
    auto differs = [&](const char* key, int64_t swa, int64_t full) -> Status {
      if (swa == 0 || swa == full) return Status::Ok();
      return Unimplemented("{}{} {} differs from the other layers' {}: windowed layers of their own head or RoPE "
                           "size are not supported", p, key, swa, full);
    };
    RETURN_IF_ERROR(differs("attention.key_length_swa", hp.swa_key_length, hp.head_dim));
    RETURN_IF_ERROR(differs("attention.value_length_swa", hp.swa_value_length, hp.value_head()));
    RETURN_IF_ERROR(differs("rope.dimension_count_swa", hp.swa_rope_dims, hp.rope_dims));
  }
  if (hp.causal_key && *hp.causal_key != hp.causal) {
    return Unimplemented("{}attention.causal is {}: gale runs {} {}", p, *hp.causal_key, hp.arch,
                         hp.causal ? "as a causal decoder (bidirectional attention is for its encoders)"
                                   : "as a bidirectional encoder");
  }
  return Status::Ok();
}

}  // namespace gale
