// Hugging Face checkpoints to GGUF: the driver (a family by its architecture's HfFamily) and the
// llama-like layout's converter.
#include "convert/hf_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "gguf/safetensors.h"
#include "base/file.h"
#include "model/arch_spec.h"
#include "model/hf_checkpoint.h"
#include "model/hf_tokenizer.h"

namespace gale {

namespace {

using Json = nlohmann::json;

StatusOr<int64_t> IntField(const Json& j, const char* key, int64_t fallback = -1) {
  return HfConfigInt(j, key, fallback, 1, int64_t{1} << 24);
}

double NumField(const Json& j, const char* key, double fallback) { return HfConfigNum(j, key, fallback); }

StatusOr<HfConvertReport> Convert(const std::string& dir_name, GgmlType type, GgufWriter* out);

}  // namespace

StatusOr<HfConvertReport> ConvertHf(const std::string& dir_name, GgmlType type, GgufWriter* out) {
  // config.json's optional fields are read with Json::value(), which throws when one is there
  // with another type: that is an error in the checkpoint, not an exception out of the tool.
  try {
    return Convert(dir_name, type, out);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("{}: a JSON field has an unexpected type ({})", dir_name, e.what());
  }
}

StatusOr<HfTokenizer> ReadHfTokenizerDir(const std::string& dir_name) {
  const std::filesystem::path dir(dir_name);
  ASSIGN_OR_RETURN(const HfTokenizerFiles files, ReadHfTokenizerFiles(dir));
  const Json& tj = files.tokenizer;
  int64_t vocab = 0;
  try {
    if (tj.contains("model") && tj["model"].contains("vocab") && tj["model"]["vocab"].is_object()) {
      for (const auto& [k, v] : tj["model"]["vocab"].items()) {
        if (v.is_number_integer()) vocab = std::max<int64_t>(vocab, v.get<int64_t>() + 1);
      }
    }
    if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
      for (const auto& a : tj["added_tokens"]) {
        if (a.is_object() && a.contains("id") && a["id"].is_number_integer()) {
          vocab = std::max<int64_t>(vocab, a["id"].get<int64_t>() + 1);
        }
      }
    }
    return ImportHfTokenizer(tj, files.config, Json::object(), vocab);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("{}: a JSON field has an unexpected type ({})", dir_name, e.what());
  }
}

namespace {

// The architecture whose family lists this checkpoint (its file describes the conversion).
StatusOr<const ArchSpec*> FindFamily(const Json& config) {
  std::string hf_arch = config.value("model_type", "");
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string()) {
    hf_arch = config["architectures"][0].get<std::string>();
  }
  const ArchSpec* spec = nullptr;
  std::vector<std::string> known;
  for (const ArchSpec* a : Architectures()) {
    if (a->hf == nullptr) continue;
    for (std::string_view n : a->hf->names) {
      if (n == hf_arch && spec == nullptr) spec = a;
      if (n.find("For") != std::string_view::npos) known.emplace_back(n);
    }
  }
  if (spec == nullptr) {
    return InvalidArgument("config.json: architecture '{}' is not supported ({})", hf_arch, fmt::join(known, ", "));
  }
  return spec;
}

// The llama-like layout's sizes from config.json.
struct LlamaShape {
  int64_t dim = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, vocab = 0, ctx = 0, head_dim = 0;
  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
};

StatusOr<LlamaShape> ReadShape(const Json& config) {
  LlamaShape s;
  ASSIGN_OR_RETURN(s.dim, IntField(config, "hidden_size"));
  ASSIGN_OR_RETURN(s.ffn, IntField(config, "intermediate_size"));
  ASSIGN_OR_RETURN(s.layers, IntField(config, "num_hidden_layers"));
  ASSIGN_OR_RETURN(s.heads, IntField(config, "num_attention_heads"));
  ASSIGN_OR_RETURN(s.kv_heads, IntField(config, "num_key_value_heads", s.heads));
  ASSIGN_OR_RETURN(s.vocab, IntField(config, "vocab_size"));
  ASSIGN_OR_RETURN(s.ctx, IntField(config, "max_position_embeddings", 2048));
  // head_dim where the config gives it (Qwen3, Mistral NeMo: not hidden_size / heads).
  if (config.contains("head_dim") && !config["head_dim"].is_null()) {
    ASSIGN_OR_RETURN(s.head_dim, IntField(config, "head_dim"));
  } else if (s.heads > 0 && s.dim % s.heads == 0) {
    s.head_dim = s.dim / s.heads;
  }
  if (s.heads <= 0 || s.kv_heads <= 0 || s.heads % s.kv_heads != 0 || s.head_dim <= 0 || s.head_dim % 2 != 0) {
    return InvalidArgument("config.json: {} heads ({} KV) of size {} for hidden_size {}: heads must be a multiple of "
                           "the KV heads and of an even size", s.heads, s.kv_heads, s.head_dim, s.dim);
  }
  return s;
}

// RoPE scaling every family writes alike: YaRN (as llama.cpp's converters: the type, factor and
// original context, as in Qwen2.5's long-context configs; the betas only where the config sets
// them) or linear.
Status WriteRopeScaling(const Json& config, const std::string& gguf_arch, int64_t ctx, GgufWriter* out) {
  const std::string p = gguf_arch + ".";
  if (!config.contains("rope_scaling") || !config["rope_scaling"].is_object()) return Status::Ok();
  const Json& rs = config["rope_scaling"];
  const std::string kind = rs.value("type", rs.value("rope_type", ""));
  if (kind == "yarn") {
    out->SetString(p + "rope.scaling.type", "yarn");
    out->SetF32(p + "rope.scaling.factor", static_cast<float>(NumField(rs, "factor", 1.0)));
    ASSIGN_OR_RETURN(const int64_t original, IntField(rs, "original_max_position_embeddings", ctx));
    out->SetU32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(original));
    if (rs.contains("beta_fast")) out->SetF32(p + "rope.scaling.yarn_beta_fast", static_cast<float>(NumField(rs, "beta_fast", 32.0)));
    if (rs.contains("beta_slow")) out->SetF32(p + "rope.scaling.yarn_beta_slow", static_cast<float>(NumField(rs, "beta_slow", 1.0)));
  } else if (kind == "linear") {
    out->SetString(p + "rope.scaling.type", "linear");
    out->SetF32(p + "rope.scaling.factor", static_cast<float>(NumField(rs, "factor", 1.0)));
  } else {
    return InvalidArgument("config.json: rope_scaling '{}' is not supported for {}", kind, gguf_arch);
  }
  return Status::Ok();
}

// The hyperparameter keys of the llama-like layout, the family's own keys, and RoPE scaling.
Status WriteHParams(const Json& config, const std::string& gguf_arch, const HfFamily& family, const LlamaShape& s,
                    GgufWriter* out) {
  const std::string p = gguf_arch + ".";
  out->SetU32(p + "context_length", static_cast<uint32_t>(s.ctx));
  out->SetU32(p + "embedding_length", static_cast<uint32_t>(s.dim));
  out->SetU32(p + "feed_forward_length", static_cast<uint32_t>(s.ffn));
  out->SetU32(p + "block_count", static_cast<uint32_t>(s.layers));
  out->SetU32(p + "attention.head_count", static_cast<uint32_t>(s.heads));
  out->SetU32(p + "attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  // Phi-3.5/Phi-4-mini may rotate part of each head (partial_rotary_factor).
  const double rotary = NumField(config, "partial_rotary_factor", 1.0);
  const int64_t rope_dims =
      family.partial_rotary ? static_cast<int64_t>(rotary * static_cast<double>(s.dim)) / s.heads : s.head_dim;
  if (rope_dims <= 0 || rope_dims > s.head_dim || rope_dims % 2 != 0) {
    return InvalidArgument("config.json: partial_rotary_factor {} gives {} rotated dims of {}", rotary, rope_dims, s.head_dim);
  }
  out->SetU32(p + "rope.dimension_count", static_cast<uint32_t>(rope_dims));
  if (s.head_dim * s.heads != s.dim || family.gemma_layout) {  // Gemma's converters write the head size always
    out->SetU32(p + "attention.key_length", static_cast<uint32_t>(s.head_dim));
    out->SetU32(p + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  }
  out->SetF32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(NumField(config, "rms_norm_eps", 1e-5)));
  out->SetF32(p + "rope.freq_base", static_cast<float>(NumField(config, "rope_theta", 10000.0)));
  // The family's own keys (windows, soft-caps, RoPE scaling of its own kind), then the RoPE
  // scaling every family writes alike.
  HfKeysContext keys{config, out, p, s.dim, s.layers, s.heads, s.head_dim, rope_dims, s.ctx};
  if (family.keys != nullptr) RETURN_IF_ERROR(family.keys(keys));
  if (!keys.rope_scaling_done) RETURN_IF_ERROR(WriteRopeScaling(config, gguf_arch, s.ctx, out));
  out->SetU32(p + "vocab_size", static_cast<uint32_t>(s.vocab));
  return Status::Ok();
}

// Checkpoint tensors into the GGUF writer: renamed, shape-checked, converted row by row when
// the writer asks for them.
class TensorCopier {
 public:
  TensorCopier(const HfTensors& tensors, GgmlType type, GgufWriter* out, HfConvertReport* report)
      : tensors_(tensors), type_(type), out_(out), report_(report) {}

  // permute_heads > 0: a Q or K matrix of that many heads, reordered from rotate-half RoPE.
  // Gemma's RMSNorm multiplies by 1 + w; GGUF stores 1 + w (norm_shift 1).
  Status Add(const std::string& hf_name, const std::string& gguf, std::vector<int64_t> want, int64_t permute_heads,
             bool required = true, float norm_shift = 0.0f);

  // The checkpoint's tensors not added.
  std::vector<std::string> Unused() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : tensors_) {
      if (!used_.count(name)) out.push_back(name);
    }
    return out;
  }

 private:
  const HfTensors& tensors_;
  const GgmlType type_;
  GgufWriter* out_;
  HfConvertReport* report_;
  std::map<std::string, bool> used_;
};

Status TensorCopier::Add(const std::string& hf_name, const std::string& gguf, std::vector<int64_t> want,
                         int64_t permute_heads, bool required, float norm_shift) {
  std::string hf = hf_name;
  if (!tensors_.count(hf) && hf.rfind("model.", 0) == 0) {  // Gemma 3 multimodal: the text model's names
    for (const char* prefix : {"language_model.model.", "model.language_model."}) {
      if (tensors_.count(prefix + hf.substr(6))) {
        hf = prefix + hf.substr(6);
        break;
      }
    }
  }
  auto it = tensors_.find(hf);
  if (it == tensors_.end()) {
    if (required) return InvalidArgument("tensor '{}' is missing from the checkpoint", hf);
    return Status::Ok();
  }
  const SafetensorsTensor& t = *it->second.second;
  const std::shared_ptr<SafetensorsFile> file = it->second.first;
  used_[hf] = true;
  if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
    return InvalidArgument("tensor '{}' is {}; convert reads F32, F16 and BF16", hf, t.dtype);
  }
  // Safetensors rows are ggml rows of the same element type.
  const GgmlType src_type = t.dtype == "F32" ? GgmlType::kF32 : t.dtype == "F16" ? GgmlType::kF16 : GgmlType::kBF16;
  if (t.shape != want) {
    return InvalidArgument("tensor '{}' has shape [{}], expected [{}]", hf, fmt::join(t.shape, ", "), fmt::join(want, ", "));
  }
  const bool matrix = want.size() == 2;
  const GgmlType target = matrix ? type_ : GgmlType::kF32;
  const int64_t rows = matrix ? want[0] : 1, cols = matrix ? want[1] : want[0];
  const int64_t hd = matrix && permute_heads > 0 ? rows / permute_heads : 0;
  const uint8_t* src = t.data;
  const int64_t src_row = RowBytes(src_type, cols), dst_row = RowBytes(target, cols);
  std::vector<int64_t> shape = matrix ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{cols};
  ++report_->num_tensors;
  return out_->AddTensor(gguf, static_cast<uint32_t>(target), std::move(shape), [=, file = file](uint8_t* dst, uint64_t) {
    std::vector<float> row(static_cast<size_t>(cols));
    // Safetensors packs tensors back to back, so a row may start at an odd address: copy it to
    // aligned memory first.
    std::vector<float> raw(static_cast<size_t>((src_row + 3) / 4));
    for (int64_t r = 0; r < rows; ++r) {
      // Hugging Face orders each head's rows as [first halves; second halves] (rotate-half
      // RoPE); GGUF interleaves them: row h*hd + 2i + j comes from row h*hd + j*hd/2 + i.
      int64_t from = r;
      if (hd > 0) {
        const int64_t h = r / hd, i = (r % hd) / 2, j = r % 2;
        from = h * hd + j * (hd / 2) + i;
      }
      std::memcpy(raw.data(), src + from * src_row, static_cast<size_t>(src_row));
      DequantizeRowRef(src_type, raw.data(), row.data(), cols);
      if (norm_shift != 0.0f) {
        for (float& v : row) v += norm_shift;
      }
      QuantizeRowRef(target, row.data(), dst + r * dst_row, cols);
    }
  });
}

// One layer's tensors: Phi-3 keeps Q, K, V and gate, up fused (row ranges as llama.cpp's phi3
// reads them); Gemma's norms (its 1 + w) sit before and after attention and the FFN.
Status AddLayer(TensorCopier& c, const HfFamily& family, const LlamaShape& s, int64_t l) {
  const std::string h = fmt::format("model.layers.{}.", l), g = fmt::format("blk.{}.", l);
  const float shift = family.gemma_layout ? 1.0f : 0.0f;
  const int64_t dim = s.dim, ffn = s.ffn, q_dim = s.q_dim(), kv_dim = s.kv_dim(), head_dim = s.head_dim;
  RETURN_IF_ERROR(c.Add(h + "input_layernorm.weight", g + "attn_norm.weight", {dim}, 0, true, shift));
  if (family.fused) {
    RETURN_IF_ERROR(c.Add(h + "self_attn.qkv_proj.weight", g + "attn_qkv.weight", {q_dim + 2 * kv_dim, dim}, 0));
  } else {
    RETURN_IF_ERROR(c.Add(h + "self_attn.q_proj.weight", g + "attn_q.weight", {q_dim, dim}, family.permute_qk ? s.heads : 0));
    RETURN_IF_ERROR(c.Add(h + "self_attn.k_proj.weight", g + "attn_k.weight", {kv_dim, dim}, family.permute_qk ? s.kv_heads : 0));
    RETURN_IF_ERROR(c.Add(h + "self_attn.v_proj.weight", g + "attn_v.weight", {kv_dim, dim}, 0));
  }
  if (family.qkv_bias) {
    RETURN_IF_ERROR(c.Add(h + "self_attn.q_proj.bias", g + "attn_q.bias", {q_dim}, 0));
    RETURN_IF_ERROR(c.Add(h + "self_attn.k_proj.bias", g + "attn_k.bias", {kv_dim}, 0));
    RETURN_IF_ERROR(c.Add(h + "self_attn.v_proj.bias", g + "attn_v.bias", {kv_dim}, 0));
  }
  if (family.qk_norm) {
    RETURN_IF_ERROR(c.Add(h + "self_attn.q_norm.weight", g + "attn_q_norm.weight", {head_dim}, 0, true, shift));
    RETURN_IF_ERROR(c.Add(h + "self_attn.k_norm.weight", g + "attn_k_norm.weight", {head_dim}, 0, true, shift));
  }
  RETURN_IF_ERROR(c.Add(h + "self_attn.o_proj.weight", g + "attn_output.weight", {dim, q_dim}, 0));
  if (family.gemma_layout) {
    RETURN_IF_ERROR(c.Add(h + "post_attention_layernorm.weight", g + "post_attention_norm.weight", {dim}, 0, true, shift));
    RETURN_IF_ERROR(c.Add(h + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", {dim}, 0, true, shift));
  } else {
    RETURN_IF_ERROR(c.Add(h + "post_attention_layernorm.weight", g + "ffn_norm.weight", {dim}, 0));
  }
  if (family.fused) {
    RETURN_IF_ERROR(c.Add(h + "mlp.gate_up_proj.weight", g + "ffn_up.weight", {2 * ffn, dim}, 0));
  } else {
    RETURN_IF_ERROR(c.Add(h + "mlp.gate_proj.weight", g + "ffn_gate.weight", {ffn, dim}, 0));
    RETURN_IF_ERROR(c.Add(h + "mlp.up_proj.weight", g + "ffn_up.weight", {ffn, dim}, 0));
  }
  RETURN_IF_ERROR(c.Add(h + "mlp.down_proj.weight", g + "ffn_down.weight", {dim, ffn}, 0));
  if (family.gemma_layout) {
    RETURN_IF_ERROR(c.Add(h + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", {dim}, 0, true, shift));
  }
  return Status::Ok();
}

StatusOr<HfConvertReport> Convert(const std::string& dir_name, GgmlType type, GgufWriter* out) {
  namespace fs = std::filesystem;
  if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16) {
    return InvalidArgument("convert writes f32, f16 or bf16 (quantize afterwards with gale quantize)");
  }
  const fs::path dir(dir_name);
  ASSIGN_OR_RETURN(Json config, ReadHfJson(dir / "config.json", true));
  ASSIGN_OR_RETURN(const ArchSpec* spec, FindFamily(config));
  const HfFamily& family = *spec->hf;
  if (family.convert != nullptr) return family.convert(dir, config, type, out);
  // A multimodal checkpoint (Gemma 3's): the text model's config is text_config, its tensors under
  // language_model (the vision tower is not converted; a note lists what was skipped).
  if (config.contains("text_config")) {
    if (!config["text_config"].is_object()) return InvalidArgument("config.json: text_config is not an object");
    const Json text = config["text_config"];
    for (auto it = text.begin(); it != text.end(); ++it) config[it.key()] = it.value();
  }
  const std::string gguf_arch = spec->name;
  ASSIGN_OR_RETURN(const LlamaShape s, ReadShape(config));
  const bool tied = config.value("tie_word_embeddings", family.gemma_layout);
  // Tensors from every safetensors file in the folder (sharded checkpoints too).
  // The writer fills tensors later: each callback keeps its file alive.
  ASSIGN_OR_RETURN(const HfTensors tensors, LoadHfTensors(dir));
  ASSIGN_OR_RETURN(const HfFileStart start, StartHfFile(dir, config, s.vocab, gguf_arch,
                                                       type == GgmlType::kF32 ? 0 : type == GgmlType::kF16 ? 1 : 32, out));
  HfConvertReport report;
  report.pre = start.tokenizer.pre;
  RETURN_IF_ERROR(WriteHParams(config, gguf_arch, family, s, out));
  WriteHfTokenizer(start.tokenizer, out);

  TensorCopier copier(tensors, type, out, &report);
  RETURN_IF_ERROR(copier.Add("model.embed_tokens.weight", "token_embd.weight", {s.vocab, s.dim}, 0));
  for (int64_t l = 0; l < s.layers; ++l) RETURN_IF_ERROR(AddLayer(copier, family, s, l));
  RETURN_IF_ERROR(copier.Add("model.norm.weight", "output_norm.weight", {s.dim}, 0, true, family.gemma_layout ? 1.0f : 0.0f));
  if (!tied) RETURN_IF_ERROR(copier.Add("lm_head.weight", "output.weight", {s.vocab, s.dim}, 0, /*required=*/false));
  report.skipped = copier.Unused();
  report.vocab = s.vocab;
  report.layers = s.layers;
  return report;
}

}  // namespace

}  // namespace gale
