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

StatusOr<HfConvertReport> Convert(const std::string& dir_name, GgmlType type, GgufWriter* out) {
  namespace fs = std::filesystem;
  if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16) {
    return InvalidArgument("convert writes f32, f16 or bf16 (quantize afterwards with gale quantize)");
  }
  const fs::path dir(dir_name);
  ASSIGN_OR_RETURN(Json config, ReadHfJson(dir / "config.json", true));
  std::string hf_arch = config.value("model_type", "");
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string()) {
    hf_arch = config["architectures"][0].get<std::string>();
  }
  // The architecture whose family lists this checkpoint (its file describes the conversion).
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
  const bool shifted_norms = family.gemma_layout;  // norms store 1 + w
  ASSIGN_OR_RETURN(const int64_t dim, IntField(config, "hidden_size"));
  ASSIGN_OR_RETURN(const int64_t ffn, IntField(config, "intermediate_size"));
  ASSIGN_OR_RETURN(const int64_t layers, IntField(config, "num_hidden_layers"));
  ASSIGN_OR_RETURN(const int64_t heads, IntField(config, "num_attention_heads"));
  ASSIGN_OR_RETURN(const int64_t kv_heads, IntField(config, "num_key_value_heads", heads));
  ASSIGN_OR_RETURN(const int64_t vocab, IntField(config, "vocab_size"));
  ASSIGN_OR_RETURN(const int64_t ctx, IntField(config, "max_position_embeddings", 2048));
  // head_dim where the config gives it (Qwen3, Mistral NeMo: not hidden_size / heads).
  int64_t head_dim = 0;
  if (config.contains("head_dim") && !config["head_dim"].is_null()) {
    ASSIGN_OR_RETURN(head_dim, IntField(config, "head_dim"));
  } else if (heads > 0 && dim % heads == 0) {
    head_dim = dim / heads;
  }
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 || head_dim % 2 != 0) {
    return InvalidArgument("config.json: {} heads ({} KV) of size {} for hidden_size {}: heads must be a multiple of "
                           "the KV heads and of an even size", heads, kv_heads, head_dim, dim);
  }
  const int64_t q_dim = heads * head_dim;
  const bool tied = config.value("tie_word_embeddings", shifted_norms);
  // Tensors from every safetensors file in the folder (sharded checkpoints too).
  // The writer fills tensors later: each callback keeps its file alive.
  ASSIGN_OR_RETURN(const HfTensors tensors, LoadHfTensors(dir));

  // Tokenizer.
  ASSIGN_OR_RETURN(const HfTokenizerFiles tokenizer_files, ReadHfTokenizerFiles(dir));
  ASSIGN_OR_RETURN(const HfTokenizer tokenizer,
                   ImportHfTokenizer(tokenizer_files.tokenizer, tokenizer_files.config, config, vocab));
  HfConvertReport report;
  report.pre = tokenizer.pre;

  // Metadata.
  out->SetString("general.architecture", gguf_arch);
  out->SetString("general.name", HfModelName(dir));
  out->SetU32("general.file_type", type == GgmlType::kF32 ? 0 : type == GgmlType::kF16 ? 1 : 32);
  const std::string p = gguf_arch + ".";
  out->SetU32(p + "context_length", static_cast<uint32_t>(ctx));
  out->SetU32(p + "embedding_length", static_cast<uint32_t>(dim));
  out->SetU32(p + "feed_forward_length", static_cast<uint32_t>(ffn));
  out->SetU32(p + "block_count", static_cast<uint32_t>(layers));
  out->SetU32(p + "attention.head_count", static_cast<uint32_t>(heads));
  out->SetU32(p + "attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  // Phi-3.5/Phi-4-mini may rotate part of each head (partial_rotary_factor).
  const double rotary = NumField(config, "partial_rotary_factor", 1.0);
  const int64_t rope_dims = family.partial_rotary ? static_cast<int64_t>(rotary * static_cast<double>(dim)) / heads : head_dim;
  if (rope_dims <= 0 || rope_dims > head_dim || rope_dims % 2 != 0) {
    return InvalidArgument("config.json: partial_rotary_factor {} gives {} rotated dims of {}", rotary, rope_dims, head_dim);
  }
  out->SetU32(p + "rope.dimension_count", static_cast<uint32_t>(rope_dims));
  if (head_dim * heads != dim || family.gemma_layout) {  // Gemma's converters write the head size always
    out->SetU32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
    out->SetU32(p + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  out->SetF32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(NumField(config, "rms_norm_eps", 1e-5)));
  out->SetF32(p + "rope.freq_base", static_cast<float>(NumField(config, "rope_theta", 10000.0)));
  // The family's own keys (windows, soft-caps, RoPE scaling of its own kind), then the RoPE
  // scaling every family writes alike.
  HfKeysContext keys{config, out, p, dim, layers, heads, head_dim, rope_dims, ctx};
  if (family.keys != nullptr) RETURN_IF_ERROR(family.keys(keys));
  if (!keys.rope_scaling_done && config.contains("rope_scaling") && config["rope_scaling"].is_object()) {
    const Json& rs = config["rope_scaling"];
    const std::string kind = rs.value("type", rs.value("rope_type", ""));
    if (kind == "yarn") {
      // As llama.cpp's converters: the type, factor and original context (Qwen2.5's long-context
      // configs); the betas only where the config sets them.
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
  }
  out->SetU32(p + "vocab_size", static_cast<uint32_t>(vocab));
  WriteHfTokenizer(tokenizer, out);

  // Weights.
  std::map<std::string, bool> used;
  // Gemma's RMSNorm multiplies by 1 + w; GGUF stores 1 + w (norm_shift 1).
  auto add = [&](const std::string& hf_name, const std::string& gguf, std::vector<int64_t> want, int64_t permute_heads,
                 bool required = true, float norm_shift = 0.0f) -> Status {
    std::string hf = hf_name;
    if (!tensors.count(hf) && hf.rfind("model.", 0) == 0) {  // Gemma 3 multimodal: the text model's names
      for (const char* prefix : {"language_model.model.", "model.language_model."}) {
        if (tensors.count(prefix + hf.substr(6))) {
          hf = prefix + hf.substr(6);
          break;
        }
      }
    }
    auto it = tensors.find(hf);
    if (it == tensors.end()) {
      if (required) return InvalidArgument("tensor '{}' is missing from the checkpoint", hf);
      return Status::Ok();
    }
    const SafetensorsTensor& t = *it->second.second;
    const std::shared_ptr<SafetensorsFile> file = it->second.first;
    used[hf] = true;
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
      return InvalidArgument("tensor '{}' is {}; convert reads F32, F16 and BF16", hf, t.dtype);
    }
    // Safetensors rows are ggml rows of the same element type.
    const GgmlType src_type = t.dtype == "F32" ? GgmlType::kF32 : t.dtype == "F16" ? GgmlType::kF16 : GgmlType::kBF16;
    if (t.shape != want) {
      return InvalidArgument("tensor '{}' has shape [{}], expected [{}]", hf, fmt::join(t.shape, ", "), fmt::join(want, ", "));
    }
    const bool matrix = want.size() == 2;
    const GgmlType target = matrix ? type : GgmlType::kF32;
    const int64_t rows = matrix ? want[0] : 1, cols = matrix ? want[1] : want[0];
    const int64_t hd = matrix && permute_heads > 0 ? rows / permute_heads : 0;
    const uint8_t* src = t.data;
    const int64_t src_row = RowBytes(src_type, cols), dst_row = RowBytes(target, cols);
    std::vector<int64_t> shape = matrix ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{cols};
    ++report.num_tensors;
    return out->AddTensor(gguf, static_cast<uint32_t>(target), std::move(shape), [=, file = file](uint8_t* dst, uint64_t) {
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
  };
  RETURN_IF_ERROR(add("model.embed_tokens.weight", "token_embd.weight", {vocab, dim}, 0));
  for (int64_t l = 0; l < layers; ++l) {
    const std::string h = fmt::format("model.layers.{}.", l), g = fmt::format("blk.{}.", l);
    // One layer's tensors: Phi-3 keeps Q, K, V and gate, up fused (row ranges as llama.cpp's phi3
    // reads them); Gemma's norms (its 1 + w) sit before and after attention and the FFN.
    const float shift = shifted_norms ? 1.0f : 0.0f;
    const int64_t kv_dim = kv_heads * head_dim;
    RETURN_IF_ERROR(add(h + "input_layernorm.weight", g + "attn_norm.weight", {dim}, 0, true, shift));
    if (family.fused) {
      RETURN_IF_ERROR(add(h + "self_attn.qkv_proj.weight", g + "attn_qkv.weight", {q_dim + 2 * kv_dim, dim}, 0));
    } else {
      RETURN_IF_ERROR(add(h + "self_attn.q_proj.weight", g + "attn_q.weight", {q_dim, dim}, family.permute_qk ? heads : 0));
      RETURN_IF_ERROR(add(h + "self_attn.k_proj.weight", g + "attn_k.weight", {kv_dim, dim}, family.permute_qk ? kv_heads : 0));
      RETURN_IF_ERROR(add(h + "self_attn.v_proj.weight", g + "attn_v.weight", {kv_dim, dim}, 0));
    }
    if (family.qkv_bias) {
      RETURN_IF_ERROR(add(h + "self_attn.q_proj.bias", g + "attn_q.bias", {q_dim}, 0));
      RETURN_IF_ERROR(add(h + "self_attn.k_proj.bias", g + "attn_k.bias", {kv_dim}, 0));
      RETURN_IF_ERROR(add(h + "self_attn.v_proj.bias", g + "attn_v.bias", {kv_dim}, 0));
    }
    if (family.qk_norm) {
      RETURN_IF_ERROR(add(h + "self_attn.q_norm.weight", g + "attn_q_norm.weight", {head_dim}, 0, true, shift));
      RETURN_IF_ERROR(add(h + "self_attn.k_norm.weight", g + "attn_k_norm.weight", {head_dim}, 0, true, shift));
    }
    RETURN_IF_ERROR(add(h + "self_attn.o_proj.weight", g + "attn_output.weight", {dim, q_dim}, 0));
    if (family.gemma_layout) {
      RETURN_IF_ERROR(add(h + "post_attention_layernorm.weight", g + "post_attention_norm.weight", {dim}, 0, true, shift));
      RETURN_IF_ERROR(add(h + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", {dim}, 0, true, shift));
    } else {
      RETURN_IF_ERROR(add(h + "post_attention_layernorm.weight", g + "ffn_norm.weight", {dim}, 0));
    }
    if (family.fused) {
      RETURN_IF_ERROR(add(h + "mlp.gate_up_proj.weight", g + "ffn_up.weight", {2 * ffn, dim}, 0));
    } else {
      RETURN_IF_ERROR(add(h + "mlp.gate_proj.weight", g + "ffn_gate.weight", {ffn, dim}, 0));
      RETURN_IF_ERROR(add(h + "mlp.up_proj.weight", g + "ffn_up.weight", {ffn, dim}, 0));
    }
    RETURN_IF_ERROR(add(h + "mlp.down_proj.weight", g + "ffn_down.weight", {dim, ffn}, 0));
    if (family.gemma_layout) {
      RETURN_IF_ERROR(add(h + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", {dim}, 0, true, shift));
    }
  }
  RETURN_IF_ERROR(add("model.norm.weight", "output_norm.weight", {dim}, 0, true, shifted_norms ? 1.0f : 0.0f));
  if (!tied) RETURN_IF_ERROR(add("lm_head.weight", "output.weight", {vocab, dim}, 0, /*required=*/false));
  for (const auto& [name, t] : tensors) {
    if (!used.count(name)) report.skipped.push_back(name);
  }
  report.vocab = vocab;
  report.layers = layers;
  return report;
}

}  // namespace

}  // namespace gale
