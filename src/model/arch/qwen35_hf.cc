// Qwen3.5 / 3.6 checkpoints as Hugging Face publishes them (Qwen3_5ForCausalLM, the multimodal
// Qwen3_5ForConditionalGeneration whose text model this converts, and the MoE ones) to gale's
// qwen35 / qwen35moe GGUF as llama.cpp's converter writes it (conversion/qwen.py of its 2026-09-28
// release; the layout below is what its qwen35 graph reads):
// - Gated DeltaNet layers (linear_attn.*): in_proj_qkv -> attn_qkv, in_proj_z -> attn_gate,
//   in_proj_a / in_proj_b -> ssm_alpha / ssm_beta, conv1d [C, 1, K] -> ssm_conv1d (f32),
//   A_log -> ssm_a = -exp(A_log), dt_bias -> ssm_dt.bias, norm -> ssm_norm, out_proj -> ssm_out.
//   Hugging Face groups the value heads by key head (value head h reads key head h / r, r value
//   heads per key head); ggml tiles them (h reads h % key_heads): every per-value-head row range
//   (the V rows of in_proj_qkv and of the convolution, in_proj_z, in_proj_a/b, A_log, dt_bias)
//   and out_proj's columns go from grouped to tiled order.
// - Full-attention layers: q_proj (query and output gate per head, as they are), k_proj, v_proj,
//   o_proj, q_norm, k_norm; RoPE rows as they are (NEOX-style multi-section RoPE).
// - The zero-centred RMSNorms store w where GGUF stores 1 + w (input_layernorm,
//   post_attention_layernorm -> post_attention_norm, q_norm, k_norm, model.norm); the gated
//   norm of the linear layers (linear_attn.norm) is plain.
// - MoE: mlp.gate -> ffn_gate_inp (f32), routed experts per expert or fused (experts.gate_up_proj
//   [E, 2F, D], experts.down_proj [E, D, F]) -> ffn_{gate,up,down}_exps, shared_expert.* ->
//   *_shexp, shared_expert_gate -> ffn_gate_inp_shexp (f32).
// The multi-token-prediction block (mtp.*) and the vision tower are not converted (listed as
// skipped). Matrices take --outtype; vectors, the convolution and the routers are f32.
#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/arch/arch.h"
#include "model/hf_checkpoint.h"
#include "model/hf_tokenizer.h"

namespace gale {
namespace {

using Json = nlohmann::json;

StatusOr<int64_t> Int(const Json& j, const char* key, int64_t fallback = -1) {
  return HfConfigInt(j, key, fallback, 0, int64_t{1} << 26);
}

struct Q35Config {
  int64_t dim = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, ctx = 0;
  int64_t conv = 0, k_heads = 0, v_heads = 0, state = 0;  // Gated DeltaNet
  int64_t experts = 0, used = 0, expert_ffn = 0, shared_ffn = 0;
  int64_t rope_dims = 0;
  std::vector<int32_t> sections;
  std::vector<bool> recurrent;
  bool tied = false;
  int64_t conv_dim() const { return 2 * k_heads * state + v_heads * state; }
  // Tiled position j of a per-value-head range <- its grouped position in the checkpoint.
  int64_t GroupedHead(int64_t j) const {
    const int64_t r = v_heads / k_heads;
    return (j % k_heads) * r + j / k_heads;
  }
};

StatusOr<Q35Config> ReadConfig(const Json& cfg) {
  Q35Config c;
  ASSIGN_OR_RETURN(c.dim, Int(cfg, "hidden_size"));
  ASSIGN_OR_RETURN(c.layers, Int(cfg, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.heads, Int(cfg, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.kv_heads, Int(cfg, "num_key_value_heads", c.heads));
  ASSIGN_OR_RETURN(c.head_dim, Int(cfg, "head_dim", c.heads > 0 ? c.dim / c.heads : 0));
  ASSIGN_OR_RETURN(c.vocab, Int(cfg, "vocab_size"));
  ASSIGN_OR_RETURN(c.ctx, Int(cfg, "max_position_embeddings", 262144));
  ASSIGN_OR_RETURN(c.conv, Int(cfg, "linear_conv_kernel_dim", 4));
  ASSIGN_OR_RETURN(c.k_heads, Int(cfg, "linear_num_key_heads"));
  ASSIGN_OR_RETURN(c.v_heads, Int(cfg, "linear_num_value_heads"));
  ASSIGN_OR_RETURN(c.state, Int(cfg, "linear_key_head_dim"));
  ASSIGN_OR_RETURN(const int64_t v_head_dim, Int(cfg, "linear_value_head_dim", c.state));
  ASSIGN_OR_RETURN(c.experts, Int(cfg, "num_experts", 0));
  if (c.dim < 1 || c.layers < 1 || c.heads < 1 || c.kv_heads < 1 || c.heads % c.kv_heads != 0 || c.head_dim < 2 ||
      c.head_dim % 2 != 0 || c.vocab < 1) {
    return InvalidArgument("config.json: hidden_size {}, {} layers, {} heads ({} KV) of {}, vocabulary {}: sizes must be "
                           "positive, the heads a multiple of the KV heads, the head size even",
                           c.dim, c.layers, c.heads, c.kv_heads, c.head_dim, c.vocab);
  }
  if (c.conv < 1 || c.k_heads < 1 || c.v_heads < 1 || c.v_heads % c.k_heads != 0 || c.state < 1) {
    return InvalidArgument("config.json: linear attention of {} key and {} value heads of {}, kernel {}: the value heads "
                           "must be a multiple of the key heads", c.k_heads, c.v_heads, c.state, c.conv);
  }
  if (v_head_dim != c.state) {
    return Unimplemented("config.json: linear_value_head_dim {} differs from linear_key_head_dim {} (Qwen3.5's are "
                         "equal; the GGUF layout has one state size)", v_head_dim, c.state);
  }
  if (!cfg.value("attn_output_gate", true)) {
    return Unimplemented("config.json: attn_output_gate false (Qwen3.5's attention always has its output gate)");
  }
  if (c.experts > 0) {
    ASSIGN_OR_RETURN(c.used, Int(cfg, "num_experts_per_tok"));
    ASSIGN_OR_RETURN(c.expert_ffn, Int(cfg, "moe_intermediate_size"));
    ASSIGN_OR_RETURN(c.shared_ffn, Int(cfg, "shared_expert_intermediate_size"));
    ASSIGN_OR_RETURN(c.ffn, Int(cfg, "intermediate_size", c.shared_ffn));
    if (c.used < 1 || c.used > c.experts || c.expert_ffn < 1 || c.shared_ffn < 1) {
      return InvalidArgument("config.json: {} experts, {} per token, of {} (shared {}): out of range", c.experts, c.used,
                             c.expert_ffn, c.shared_ffn);
    }
    if (!cfg.value("norm_topk_prob", true)) {
      return Unimplemented("config.json: norm_topk_prob false (qwen35moe renormalizes the chosen experts' weights)");
    }
  } else {
    ASSIGN_OR_RETURN(c.ffn, Int(cfg, "intermediate_size"));
  }
  // Layer kinds: layer_types, else every full_attention_interval-th layer is full attention.
  ASSIGN_OR_RETURN(const int64_t interval, Int(cfg, "full_attention_interval", 4));
  if (cfg.contains("layer_types") && cfg["layer_types"].is_array()) {
    const Json& kinds = cfg["layer_types"];
    if (static_cast<int64_t>(kinds.size()) != c.layers) {
      return InvalidArgument("config.json: layer_types has {} entries for {} layers", kinds.size(), c.layers);
    }
    for (const Json& k : kinds) {
      const std::string kind = k.is_string() ? k.get<std::string>() : "";
      if (kind != "linear_attention" && kind != "full_attention") {
        return InvalidArgument("config.json: layer type '{}' (linear_attention or full_attention)", k.dump());
      }
      c.recurrent.push_back(kind == "linear_attention");
    }
  } else {
    if (interval < 1) return InvalidArgument("config.json: full_attention_interval must be at least 1");
    for (int64_t l = 0; l < c.layers; ++l) c.recurrent.push_back((l + 1) % interval != 0);
  }
  // RoPE: rope_parameters (or the older top-level keys): a quarter of each head rotated by
  // default, in Qwen3.5's interleaved sections [11, 11, 10] (the fourth, for text, unrotated).
  const Json rope = cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object() ? cfg["rope_parameters"]
                    : cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object()  ? cfg["rope_scaling"]
                                                                                      : Json::object();
  const std::string rope_type = rope.value("rope_type", rope.value("type", "default"));
  if (rope_type != "default" && rope_type != "mrope") {
    return Unimplemented("config.json: RoPE type '{}' is not supported for Qwen3.5 (default multi-section only)",
                         rope_type);
  }
  const double partial = HfConfigNum(rope, "partial_rotary_factor", HfConfigNum(cfg, "partial_rotary_factor", 0.25));
  c.rope_dims = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  if (c.rope_dims < 2 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0) {
    return InvalidArgument("config.json: partial_rotary_factor {} gives {} rotated dims of {}", partial, c.rope_dims,
                           c.head_dim);
  }
  c.sections = {11, 11, 10, 0};
  if (rope.contains("mrope_section")) {
    if (!rope["mrope_section"].is_array() || rope["mrope_section"].size() > 4) {
      return InvalidArgument("config.json: mrope_section must be a list of at most four section sizes");
    }
    c.sections.clear();
    for (const Json& s : rope["mrope_section"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > 4096) {
        return InvalidArgument("config.json: mrope_section holds {}", s.dump());
      }
      c.sections.push_back(s.get<int32_t>());
    }
    c.sections.resize(4, 0);
  }
  c.tied = cfg.value("tie_word_embeddings", false);
  return c;
}

void WriteKeys(const Json& cfg, const Q35Config& c, const std::string& p, GgufWriter* out) {
  out->SetU32(p + "context_length", static_cast<uint32_t>(c.ctx));
  out->SetU32(p + "embedding_length", static_cast<uint32_t>(c.dim));
  out->SetU32(p + "feed_forward_length", static_cast<uint32_t>(c.ffn));
  out->SetU32(p + "block_count", static_cast<uint32_t>(c.layers));
  out->SetU32(p + "attention.head_count", static_cast<uint32_t>(c.heads));
  out->SetU32(p + "attention.head_count_kv", static_cast<uint32_t>(c.kv_heads));
  out->SetU32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  out->SetU32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  out->SetF32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(HfConfigNum(cfg, "rms_norm_eps", 1e-6)));
  const Json rope = cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object() ? cfg["rope_parameters"]
                                                                                        : Json::object();
  out->SetF32(p + "rope.freq_base",
              static_cast<float>(HfConfigNum(rope, "rope_theta", HfConfigNum(cfg, "rope_theta", 10000000.0))));
  out->SetU32(p + "rope.dimension_count", static_cast<uint32_t>(c.rope_dims));
  out->SetValue(p + "rope.dimension_sections", GgufValue::I32Array(c.sections));
  out->SetU32(p + "ssm.conv_kernel", static_cast<uint32_t>(c.conv));
  out->SetU32(p + "ssm.state_size", static_cast<uint32_t>(c.state));
  out->SetU32(p + "ssm.group_count", static_cast<uint32_t>(c.k_heads));
  out->SetU32(p + "ssm.time_step_rank", static_cast<uint32_t>(c.v_heads));
  out->SetU32(p + "ssm.inner_size", static_cast<uint32_t>(c.v_heads * c.state));
  std::vector<GgufValue> kinds;
  for (bool r : c.recurrent) kinds.push_back(GgufValue::Bool(r));
  out->SetValue(p + "attention.recurrent_layers", GgufValue::Array(GgufValueType::kBool, kinds));
  if (c.experts > 0) {
    out->SetU32(p + "expert_count", static_cast<uint32_t>(c.experts));
    out->SetU32(p + "expert_used_count", static_cast<uint32_t>(c.used));
    out->SetU32(p + "expert_feed_forward_length", static_cast<uint32_t>(c.expert_ffn));
    out->SetU32(p + "expert_shared_feed_forward_length", static_cast<uint32_t>(c.shared_ffn));
  }
  out->SetU32(p + "vocab_size", static_cast<uint32_t>(c.vocab));
}

// One GGUF tensor from rows of checkpoint tensors: output row r is source row rows[r] (of tensor
// srcs[r]), its columns taken in col_from's order (empty: as they are), each value through `value`.
class Writer {
 public:
  Writer(const HfTensors& tensors, GgmlType type, GgufWriter* out, HfConvertReport* report)
      : tensors_(tensors), type_(type), out_(out), report_(report) {}

  struct Source {
    const SafetensorsTensor* t;
    std::shared_ptr<SafetensorsFile> file;
  };
  // The tensor's source, its shape checked (nullopt-like error when missing).
  StatusOr<Source> Find(const std::string& name, const std::vector<int64_t>& shape) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return InvalidArgument("tensor '{}' is missing from the checkpoint", name);
    const SafetensorsTensor& t = *it->second.second;
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
      return InvalidArgument("tensor '{}' is {}; convert reads F32, F16 and BF16", name, t.dtype);
    }
    if (t.shape != shape) {
      return InvalidArgument("tensor '{}' has shape [{}], expected [{}]", name, fmt::join(t.shape, ", "),
                             fmt::join(shape, ", "));
    }
    used_.insert(name);
    return Source{&t, it->second.first};
  }
  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  bool Used(const std::string& name) const { return used_.count(name) > 0; }

  // gguf_shape: {cols, rows(, experts)}; rows: (source, row) per output row over all of them.
  Status Add(const std::string& gguf, std::vector<int64_t> gguf_shape, std::vector<std::pair<Source, int64_t>> rows,
             std::vector<int64_t> col_from, bool f32, std::function<float(float)> value = nullptr) {
    const int64_t cols = gguf_shape[0];
    const GgmlType target = f32 ? GgmlType::kF32 : type_;
    const int64_t dst_row = RowBytes(target, cols);
    ++report_->num_tensors;
    return out_->AddTensor(gguf, static_cast<uint32_t>(target), std::move(gguf_shape),
                           [=, rows = std::move(rows), col_from = std::move(col_from)](uint8_t* dst, uint64_t) {
                             std::vector<float> row(static_cast<size_t>(cols)), moved(static_cast<size_t>(cols));
                             std::vector<float> raw(static_cast<size_t>(cols));
                             for (size_t r = 0; r < rows.size(); ++r) {
                               const SafetensorsTensor& t = *rows[r].first.t;
                               const GgmlType src = t.dtype == "F32"   ? GgmlType::kF32
                                                    : t.dtype == "F16" ? GgmlType::kF16
                                                                       : GgmlType::kBF16;
                               const int64_t src_row = RowBytes(src, cols);
                               // Safetensors packs tensors back to back: a row may start at an odd
                               // address, so it is copied to aligned memory first.
                               std::memcpy(raw.data(), t.data + rows[r].second * src_row, static_cast<size_t>(src_row));
                               DequantizeRowRef(src, raw.data(), row.data(), cols);
                               if (!col_from.empty()) {
                                 for (int64_t c = 0; c < cols; ++c) moved[c] = row[col_from[c]];
                                 row.swap(moved);
                               }
                               if (value) {
                                 for (float& v : row) v = value(v);
                               }
                               QuantizeRowRef(target, row.data(), dst + r * dst_row, cols);
                             }
                           });
  }

  // A tensor as it is (rows in order, or reordered by row_from), `rows` x `cols` (a vector: rows 1).
  Status Copy(const std::string& hf, const std::string& gguf, std::vector<int64_t> hf_shape, bool f32,
              std::vector<int64_t> row_from = {}, std::vector<int64_t> col_from = {},
              std::function<float(float)> value = nullptr) {
    ASSIGN_OR_RETURN(const Source s, Find(hf, hf_shape));
    const bool vector = hf_shape.size() == 1;
    const int64_t rows = vector ? 1 : hf_shape[0], cols = vector ? hf_shape[0] : hf_shape[1];
    std::vector<std::pair<Source, int64_t>> src;
    for (int64_t r = 0; r < rows; ++r) src.emplace_back(s, row_from.empty() ? r : row_from[r]);
    std::vector<int64_t> shape = vector ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
    return Add(gguf, std::move(shape), std::move(src), std::move(col_from), f32 || vector, std::move(value));
  }

 private:
  const HfTensors& tensors_;
  const GgmlType type_;
  GgufWriter* out_;
  HfConvertReport* report_;
  std::set<std::string> used_;
};

// Rows of a range of per-value-head blocks of `size` rows, from grouped to tiled order, after
// `first` rows kept as they are.
std::vector<int64_t> TiledRows(const Q35Config& c, int64_t first, int64_t size) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < first; ++r) rows.push_back(r);
  for (int64_t j = 0; j < c.v_heads; ++j) {
    for (int64_t x = 0; x < size; ++x) rows.push_back(first + c.GroupedHead(j) * size + x);
  }
  return rows;
}

float PlusOne(float v) { return v + 1.0f; }

Status AddDeltaNet(Writer& w, const Q35Config& c, const std::string& h, const std::string& g) {
  const std::string a = h + "linear_attn.";
  const int64_t key_rows = 2 * c.k_heads * c.state, value = c.v_heads * c.state;
  RETURN_IF_ERROR(w.Copy(a + "in_proj_qkv.weight", g + "attn_qkv.weight", {c.conv_dim(), c.dim}, false,
                         TiledRows(c, key_rows, c.state)));
  RETURN_IF_ERROR(w.Copy(a + "in_proj_z.weight", g + "attn_gate.weight", {value, c.dim}, false, TiledRows(c, 0, c.state)));
  RETURN_IF_ERROR(w.Copy(a + "in_proj_b.weight", g + "ssm_beta.weight", {c.v_heads, c.dim}, false, TiledRows(c, 0, 1)));
  RETURN_IF_ERROR(w.Copy(a + "in_proj_a.weight", g + "ssm_alpha.weight", {c.v_heads, c.dim}, false, TiledRows(c, 0, 1)));
  // [channels, 1, K]: a row of K taps per channel.
  {
    ASSIGN_OR_RETURN(const Writer::Source s, w.Find(a + "conv1d.weight", {c.conv_dim(), 1, c.conv}));
    std::vector<std::pair<Writer::Source, int64_t>> rows;
    for (int64_t r : TiledRows(c, key_rows, c.state)) rows.emplace_back(s, r);
    RETURN_IF_ERROR(w.Add(g + "ssm_conv1d.weight", {c.conv, c.conv_dim()}, std::move(rows), {}, /*f32=*/true));
  }
  // Per value head: the decay's bias and -exp(A_log).
  std::vector<int64_t> heads;
  for (int64_t j = 0; j < c.v_heads; ++j) heads.push_back(c.GroupedHead(j));
  RETURN_IF_ERROR(w.Copy(a + "dt_bias", g + "ssm_dt.bias", {c.v_heads}, true, {}, heads));
  RETURN_IF_ERROR(w.Copy(a + "A_log", g + "ssm_a", {c.v_heads}, true, {}, heads, [](float v) { return -std::exp(v); }));
  RETURN_IF_ERROR(w.Copy(a + "norm.weight", g + "ssm_norm.weight", {c.state}, true));
  std::vector<int64_t> cols = TiledRows(c, 0, c.state);
  return w.Copy(a + "out_proj.weight", g + "ssm_out.weight", {c.dim, value}, false, {}, std::move(cols));
}

Status AddAttention(Writer& w, const Q35Config& c, const std::string& h, const std::string& g) {
  const std::string a = h + "self_attn.";
  const int64_t q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  RETURN_IF_ERROR(w.Copy(a + "q_proj.weight", g + "attn_q.weight", {2 * q, c.dim}, false));
  RETURN_IF_ERROR(w.Copy(a + "k_proj.weight", g + "attn_k.weight", {kv, c.dim}, false));
  RETURN_IF_ERROR(w.Copy(a + "v_proj.weight", g + "attn_v.weight", {kv, c.dim}, false));
  RETURN_IF_ERROR(w.Copy(a + "o_proj.weight", g + "attn_output.weight", {c.dim, q}, false));
  RETURN_IF_ERROR(w.Copy(a + "q_norm.weight", g + "attn_q_norm.weight", {c.head_dim}, true, {}, {}, PlusOne));
  return w.Copy(a + "k_norm.weight", g + "attn_k_norm.weight", {c.head_dim}, true, {}, {}, PlusOne);
}

// Routed experts, per expert (mlp.experts.E.gate_proj ...) or fused (experts.gate_up_proj,
// experts.down_proj), as ffn_{gate,up,down}_exps {cols, rows, experts}.
Status AddExperts(Writer& w, const Q35Config& c, const std::string& h, const std::string& g) {
  const std::string m = h + "mlp.experts.";
  const int64_t e = c.experts, f = c.expert_ffn, d = c.dim;
  std::vector<std::pair<Writer::Source, int64_t>> gate, up, down;
  if (w.Has(m + "gate_up_proj") || w.Has(m + "gate_up_proj.weight")) {
    const std::string gu = w.Has(m + "gate_up_proj") ? m + "gate_up_proj" : m + "gate_up_proj.weight";
    const std::string dn = w.Has(m + "down_proj") ? m + "down_proj" : m + "down_proj.weight";
    ASSIGN_OR_RETURN(const Writer::Source s, w.Find(gu, {e, 2 * f, d}));
    ASSIGN_OR_RETURN(const Writer::Source t, w.Find(dn, {e, d, f}));
    for (int64_t x = 0; x < e; ++x) {
      for (int64_t r = 0; r < f; ++r) gate.emplace_back(s, x * 2 * f + r), up.emplace_back(s, x * 2 * f + f + r);
      for (int64_t r = 0; r < d; ++r) down.emplace_back(t, x * d + r);
    }
  } else {
    for (int64_t x = 0; x < e; ++x) {
      const std::string p = m + std::to_string(x) + ".";
      ASSIGN_OR_RETURN(const Writer::Source sg, w.Find(p + "gate_proj.weight", {f, d}));
      ASSIGN_OR_RETURN(const Writer::Source su, w.Find(p + "up_proj.weight", {f, d}));
      ASSIGN_OR_RETURN(const Writer::Source sd, w.Find(p + "down_proj.weight", {d, f}));
      for (int64_t r = 0; r < f; ++r) gate.emplace_back(sg, r), up.emplace_back(su, r);
      for (int64_t r = 0; r < d; ++r) down.emplace_back(sd, r);
    }
  }
  RETURN_IF_ERROR(w.Add(g + "ffn_gate_exps.weight", {d, f, e}, std::move(gate), {}, false));
  RETURN_IF_ERROR(w.Add(g + "ffn_up_exps.weight", {d, f, e}, std::move(up), {}, false));
  return w.Add(g + "ffn_down_exps.weight", {f, d, e}, std::move(down), {}, false);
}

Status AddFfn(Writer& w, const Q35Config& c, const std::string& h, const std::string& g) {
  const std::string m = h + "mlp.";
  if (c.experts == 0) {
    RETURN_IF_ERROR(w.Copy(m + "gate_proj.weight", g + "ffn_gate.weight", {c.ffn, c.dim}, false));
    RETURN_IF_ERROR(w.Copy(m + "up_proj.weight", g + "ffn_up.weight", {c.ffn, c.dim}, false));
    return w.Copy(m + "down_proj.weight", g + "ffn_down.weight", {c.dim, c.ffn}, false);
  }
  RETURN_IF_ERROR(w.Copy(m + "gate.weight", g + "ffn_gate_inp.weight", {c.experts, c.dim}, /*f32=*/true));
  RETURN_IF_ERROR(AddExperts(w, c, h, g));
  const int64_t s = c.shared_ffn;
  RETURN_IF_ERROR(w.Copy(m + "shared_expert.gate_proj.weight", g + "ffn_gate_shexp.weight", {s, c.dim}, false));
  RETURN_IF_ERROR(w.Copy(m + "shared_expert.up_proj.weight", g + "ffn_up_shexp.weight", {s, c.dim}, false));
  RETURN_IF_ERROR(w.Copy(m + "shared_expert.down_proj.weight", g + "ffn_down_shexp.weight", {c.dim, s}, false));
  // [1, dim]: one gate per token.
  ASSIGN_OR_RETURN(const Writer::Source gs, w.Find(m + "shared_expert_gate.weight", {1, c.dim}));
  return w.Add(g + "ffn_gate_inp_shexp.weight", {c.dim}, {{gs, 0}}, {}, /*f32=*/true);
}

StatusOr<HfConvertReport> ConvertQwen35Hf(const std::filesystem::path& dir, const Json& outer, GgmlType type,
                                          GgufWriter* out) {
  if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16) {
    return InvalidArgument("convert writes f32, f16 or bf16 (quantize afterwards with gale quantize)");
  }
  // A multimodal checkpoint's text model: text_config over the outer keys.
  Json cfg = outer;
  if (outer.contains("text_config")) {
    if (!outer["text_config"].is_object()) return InvalidArgument("config.json: text_config is not an object");
    for (auto it = outer["text_config"].begin(); it != outer["text_config"].end(); ++it) cfg[it.key()] = it.value();
  }
  ASSIGN_OR_RETURN(const Q35Config c, ReadConfig(cfg));
  const std::string arch = c.experts > 0 ? "qwen35moe" : "qwen35";
  ASSIGN_OR_RETURN(const HfTensors tensors, LoadHfTensors(dir));
  // The text model's names: model.* (CausalLM) or model.language_model.* (ConditionalGeneration).
  std::string prefix;
  for (const char* p : {"model.", "model.language_model.", "language_model.model."}) {
    if (tensors.count(std::string(p) + "embed_tokens.weight")) {
      prefix = p;
      break;
    }
  }
  if (prefix.empty()) return InvalidArgument("tensor 'model.embed_tokens.weight' is missing from the checkpoint");
  ASSIGN_OR_RETURN(const HfFileStart start,
                   StartHfFile(dir, cfg, c.vocab, arch, type == GgmlType::kF32 ? 0 : type == GgmlType::kF16 ? 1 : 32, out));
  HfConvertReport report;
  report.pre = start.tokenizer.pre;
  WriteKeys(cfg, c, arch + ".", out);
  WriteHfTokenizer(start.tokenizer, out);

  Writer w(tensors, type, out, &report);
  RETURN_IF_ERROR(w.Copy(prefix + "embed_tokens.weight", "token_embd.weight", {c.vocab, c.dim}, false));
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string h = fmt::format("{}layers.{}.", prefix, l), g = fmt::format("blk.{}.", l);
    RETURN_IF_ERROR(w.Copy(h + "input_layernorm.weight", g + "attn_norm.weight", {c.dim}, true, {}, {}, PlusOne));
    RETURN_IF_ERROR(
        w.Copy(h + "post_attention_layernorm.weight", g + "post_attention_norm.weight", {c.dim}, true, {}, {}, PlusOne));
    RETURN_IF_ERROR(c.recurrent[l] ? AddDeltaNet(w, c, h, g) : AddAttention(w, c, h, g));
    RETURN_IF_ERROR(AddFfn(w, c, h, g));
  }
  RETURN_IF_ERROR(w.Copy(prefix + "norm.weight", "output_norm.weight", {c.dim}, true, {}, {}, PlusOne));
  if (!c.tied || w.Has("lm_head.weight")) {
    RETURN_IF_ERROR(w.Copy("lm_head.weight", "output.weight", {c.vocab, c.dim}, false));
  }
  for (const auto& [name, t] : tensors) {
    if (!w.Used(name)) report.skipped.push_back(name);
  }
  report.vocab = c.vocab;
  report.layers = c.layers;
  return report;
}

}  // namespace

const HfFamily kQwen35HfFamily = {
    .names = {"Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "qwen3_5", "qwen3_5_text",
              "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", "qwen3_5_moe_text"},
    .convert = ConvertQwen35Hf,
};

}  // namespace gale
