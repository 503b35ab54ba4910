// Hugging Face llama checkpoints to GGUF.
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
#include "model/rope_scaling.h"
#include "convert/hf_tokenizer.h"
#include "convert/hf_internal.h"

namespace gale {

StatusOr<nlohmann::json> ReadHfJson(const std::filesystem::path& p, bool required) {
  if (!required && !std::filesystem::exists(p)) return nlohmann::json();
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(p.string()));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("'{}' is not a JSON object", p.string());
  return j;
}

StatusOr<int64_t> HfConfigInt(const nlohmann::json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback >= 0) return fallback;
    return InvalidArgument("config.json: '{}' is missing", key);
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < lo || j[key].get<int64_t>() > hi) {
    return InvalidArgument("config.json: '{}' must be an integer in [{}, {}]", key, lo, hi);
  }
  return j[key].get<int64_t>();
}

double HfConfigNum(const nlohmann::json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

StatusOr<HfTokenizerFiles> ReadHfTokenizerFiles(const std::filesystem::path& dir) {
  HfTokenizerFiles f;
  ASSIGN_OR_RETURN(f.tokenizer, ReadHfJson(dir / "tokenizer.json", true));
  ASSIGN_OR_RETURN(f.config, ReadHfJson(dir / "tokenizer_config.json", false));
  return f;
}

std::string HfModelName(const std::filesystem::path& dir) {
  return dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
}

StatusOr<HfTensors> LoadHfTensors(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  HfTensors tensors;
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) return InvalidArgument("'{}' has no .safetensors files", dir.string());
  for (const auto& p : paths) {
    ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> f, SafetensorsFile::Open(p.string()));
    for (const auto& t : f->tensors()) {
      if (!tensors.emplace(t.name, std::make_pair(f, &t)).second) {
        return InvalidArgument("tensor '{}' is in two files", t.name);
      }
    }
  }
  return tensors;
}

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
  std::string arch = config.value("model_type", "");
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string()) {
    arch = config["architectures"][0].get<std::string>();
  }
  // Gemma 3's multimodal checkpoints: the text model's config is text_config, its tensors under
  // language_model (the vision tower is not converted; a note lists what was skipped).
  if (arch == "Gemma3ForConditionalGeneration") {
    if (!config.contains("text_config") || !config["text_config"].is_object()) {
      return InvalidArgument("config.json: Gemma3ForConditionalGeneration without text_config");
    }
    const Json text = config["text_config"];
    for (auto it = text.begin(); it != text.end(); ++it) config[it.key()] = it.value();
    arch = "Gemma3ForCausalLM";
  }
  if (arch == "DeepseekV4ForCausalLM" || arch == "deepseek_v4" || arch == "DeepseekV41ForCausalLM" ||
      arch == "deepseek_v41" || arch == "DeepseekV41ForConditionalGeneration") {
    return ConvertDeepseek4Hf(dir, config, type, out);
  }
  // The GGUF architecture: llama (Llama, Mistral: RoPE in normal mode, so q/k rows are permuted
  // from Hugging Face's rotate-half order), qwen2 (Q/K/V biases) and qwen3 (per-head Q/K norms),
  // both NEOX-mode RoPE as Hugging Face computes it (rows as they are).
  std::string gguf_arch;
  if (arch == "LlamaForCausalLM" || arch == "llama" || arch == "MistralForCausalLM" || arch == "mistral") {
    gguf_arch = "llama";
  } else if (arch == "Qwen2ForCausalLM" || arch == "qwen2") {
    gguf_arch = "qwen2";
  } else if (arch == "Qwen3ForCausalLM" || arch == "qwen3") {
    gguf_arch = "qwen3";
  } else if (arch == "Phi3ForCausalLM" || arch == "phi3") {
    gguf_arch = "phi3";  // fused qkv_proj and gate_up_proj, NEOX RoPE, LongRoPE factors
  } else if (arch == "Gemma2ForCausalLM" || arch == "gemma2") {
    gguf_arch = "gemma2";
  } else if (arch == "Gemma3ForCausalLM" || arch == "gemma3_text") {
    gguf_arch = "gemma3";
  } else {
    return InvalidArgument("config.json: architecture '{}' is not supported (LlamaForCausalLM, MistralForCausalLM, "
                           "Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "
                           "Gemma3ForConditionalGeneration, DeepseekV4ForCausalLM, DeepseekV41ForCausalLM)", arch);
  }
  const bool gemma = gguf_arch == "gemma2" || gguf_arch == "gemma3";
  const bool neox = gguf_arch != "llama";
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
  const bool tied = config.value("tie_word_embeddings", gemma);
  if (gemma && config.contains("query_pre_attn_scalar") && config["query_pre_attn_scalar"].is_number()) {
    // gale (as llama.cpp) scales queries by 1 / sqrt(head size), or by 1 / sqrt(dim / heads) for
    // the 27B models; a checkpoint asking for anything else would run with the wrong scale.
    const bool wide = layers == (gguf_arch == "gemma2" ? 46 : 62);
    const double want = wide ? static_cast<double>(dim) / static_cast<double>(heads) : static_cast<double>(head_dim);
    if (config["query_pre_attn_scalar"].get<double>() != want) {
      return InvalidArgument("config.json: query_pre_attn_scalar {} is not supported for {} layers of head size {} "
                             "(gale uses {})", config["query_pre_attn_scalar"].dump(), layers, head_dim, want);
    }
  }

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
  const int64_t rope_dims = gguf_arch == "phi3" ? static_cast<int64_t>(rotary * static_cast<double>(dim)) / heads : head_dim;
  if (rope_dims <= 0 || rope_dims > head_dim || rope_dims % 2 != 0) {
    return InvalidArgument("config.json: partial_rotary_factor {} gives {} rotated dims of {}", rotary, rope_dims, head_dim);
  }
  out->SetU32(p + "rope.dimension_count", static_cast<uint32_t>(rope_dims));
  if (head_dim * heads != dim || gemma) {  // Gemma's converters write the head size always
    out->SetU32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
    out->SetU32(p + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  out->SetF32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(NumField(config, "rms_norm_eps", 1e-5)));
  out->SetF32(p + "rope.freq_base", static_cast<float>(NumField(config, "rope_theta", 10000.0)));
  if (gguf_arch == "phi3") {
    // As llama.cpp's converter: the original context always; with LongRoPE ("longrope", "su") the
    // long and short divisors as tensors and the attention factor sqrt(1 + ln(s) / ln(original))
    // for s = context / original.
    ASSIGN_OR_RETURN(const int64_t original, IntField(config, "original_max_position_embeddings", ctx));
    if (original <= 0) return InvalidArgument("config.json: original_max_position_embeddings must be positive");
    out->SetU32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(original));
    const Json* rs = config.contains("rope_scaling") && config["rope_scaling"].is_object() ? &config["rope_scaling"] : nullptr;
    if (rs != nullptr && rs->contains("long_factor")) {
      const std::string kind = rs->value("type", rs->value("rope_type", ""));
      if (kind != "longrope" && kind != "su") {
        return InvalidArgument("config.json: phi3 rope_scaling '{}' is not supported (longrope)", kind);
      }
      const double scale = static_cast<double>(ctx) / static_cast<double>(original);
      const double attn = scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(original))) : 1.0;
      out->SetF32(p + "rope.scaling.attn_factor", static_cast<float>(attn));
      for (const auto& [key, name] : {std::pair<const char*, const char*>{"long_factor", "rope_factors_long.weight"},
                                      std::pair<const char*, const char*>{"short_factor", "rope_factors_short.weight"}}) {
        const Json& f = (*rs)[key];
        if (!f.is_array() || static_cast<int64_t>(f.size()) != rope_dims / 2) {
          return InvalidArgument("config.json: rope_scaling.{} must hold {} numbers", key, rope_dims / 2);
        }
        std::vector<float> v;
        for (const auto& x : f) {
          if (!x.is_number() || !(x.get<double>() > 0.0) || !std::isfinite(x.get<double>())) {
            return InvalidArgument("config.json: rope_scaling.{} holds {}, not a positive number", key, x.dump());
          }
          v.push_back(x.get<float>());
        }
        std::vector<uint8_t> bytes(v.size() * sizeof(float));
        std::memcpy(bytes.data(), v.data(), bytes.size());
        RETURN_IF_ERROR(out->AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), {static_cast<int64_t>(v.size())},
                                       std::move(bytes)));
      }
    } else if (rs != nullptr) {
      return InvalidArgument("config.json: phi3 rope_scaling without long_factor is not supported");
    }
  } else if (config.contains("rope_scaling") && config["rope_scaling"].is_object()) {
    const Json& rs = config["rope_scaling"];
    const std::string kind = rs.value("type", rs.value("rope_type", ""));
    if (kind == "llama3" && gguf_arch == "llama") {
      // As llama.cpp's converter: the divisors as a tensor, no scaling type in the metadata.
      const std::vector<float> f = Llama3RopeFreqFactors(head_dim, NumField(config, "rope_theta", 10000.0),
                                                         NumField(rs, "factor", 8.0), NumField(rs, "low_freq_factor", 1.0),
                                                         NumField(rs, "high_freq_factor", 4.0),
                                                         NumField(rs, "original_max_position_embeddings", 8192.0));
      for (float v : f) {
        if (!(v > 0.0f) || !std::isfinite(v)) return InvalidArgument("config.json: rope_scaling gives a factor of {}", v);
      }
      std::vector<uint8_t> bytes(f.size() * sizeof(float));
      std::memcpy(bytes.data(), f.data(), bytes.size());
      RETURN_IF_ERROR(out->AddTensor("rope_freqs.weight", static_cast<uint32_t>(GgmlType::kF32),
                                     {static_cast<int64_t>(f.size())}, std::move(bytes)));
    } else if (kind == "yarn") {
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
      return InvalidArgument("config.json: rope_scaling '{}' is not supported for {} (linear, yarn{})", kind, gguf_arch,
                             gguf_arch == "llama" ? ", llama3" : "");
    }
  }
  if (gguf_arch == "llama" && config.contains("sliding_window") && config["sliding_window"].is_number_integer()) {
    // Mistral 7B v0.1's window (later Mistral configs set it to null).
    ASSIGN_OR_RETURN(const int64_t window, IntField(config, "sliding_window"));
    if (window < ctx) out->SetU32(p + "attention.sliding_window", static_cast<uint32_t>(window));
  }
  if (gemma) {
    // As llama.cpp's converters: Gemma 2's two soft-caps and window, Gemma 3's window unless
    // every layer is global (its final soft-cap is refused).
    if (gguf_arch == "gemma2") {
      out->SetF32(p + "attn_logit_softcapping", static_cast<float>(NumField(config, "attn_logit_softcapping", 50.0)));
      out->SetF32(p + "final_logit_softcapping", static_cast<float>(NumField(config, "final_logit_softcapping", 30.0)));
      ASSIGN_OR_RETURN(const int64_t window, IntField(config, "sliding_window", 4096));
      out->SetU32(p + "attention.sliding_window", static_cast<uint32_t>(window));
    } else {
      if (config.contains("final_logit_softcapping") && config["final_logit_softcapping"].is_number()) {
        return InvalidArgument("config.json: gemma3 with final_logit_softcapping is not supported");
      }
      if (NumField(config, "sliding_window_pattern", 6.0) != 1.0) {
        ASSIGN_OR_RETURN(const int64_t window, IntField(config, "sliding_window", 4096));
        out->SetU32(p + "attention.sliding_window", static_cast<uint32_t>(window));
      }
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
    const float shift = gemma ? 1.0f : 0.0f;
    const int64_t kv_dim = kv_heads * head_dim;
    RETURN_IF_ERROR(add(h + "input_layernorm.weight", g + "attn_norm.weight", {dim}, 0, true, shift));
    if (gguf_arch == "phi3") {
      RETURN_IF_ERROR(add(h + "self_attn.qkv_proj.weight", g + "attn_qkv.weight", {q_dim + 2 * kv_dim, dim}, 0));
    } else {
      RETURN_IF_ERROR(add(h + "self_attn.q_proj.weight", g + "attn_q.weight", {q_dim, dim}, neox ? 0 : heads));
      RETURN_IF_ERROR(add(h + "self_attn.k_proj.weight", g + "attn_k.weight", {kv_dim, dim}, neox ? 0 : kv_heads));
      RETURN_IF_ERROR(add(h + "self_attn.v_proj.weight", g + "attn_v.weight", {kv_dim, dim}, 0));
    }
    if (gguf_arch == "qwen2") {
      RETURN_IF_ERROR(add(h + "self_attn.q_proj.bias", g + "attn_q.bias", {q_dim}, 0));
      RETURN_IF_ERROR(add(h + "self_attn.k_proj.bias", g + "attn_k.bias", {kv_dim}, 0));
      RETURN_IF_ERROR(add(h + "self_attn.v_proj.bias", g + "attn_v.bias", {kv_dim}, 0));
    } else if (gguf_arch == "qwen3" || gguf_arch == "gemma3") {
      RETURN_IF_ERROR(add(h + "self_attn.q_norm.weight", g + "attn_q_norm.weight", {head_dim}, 0, true, shift));
      RETURN_IF_ERROR(add(h + "self_attn.k_norm.weight", g + "attn_k_norm.weight", {head_dim}, 0, true, shift));
    }
    RETURN_IF_ERROR(add(h + "self_attn.o_proj.weight", g + "attn_output.weight", {dim, q_dim}, 0));
    if (gemma) {
      RETURN_IF_ERROR(add(h + "post_attention_layernorm.weight", g + "post_attention_norm.weight", {dim}, 0, true, shift));
      RETURN_IF_ERROR(add(h + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", {dim}, 0, true, shift));
    } else {
      RETURN_IF_ERROR(add(h + "post_attention_layernorm.weight", g + "ffn_norm.weight", {dim}, 0));
    }
    if (gguf_arch == "phi3") {
      RETURN_IF_ERROR(add(h + "mlp.gate_up_proj.weight", g + "ffn_up.weight", {2 * ffn, dim}, 0));
    } else {
      RETURN_IF_ERROR(add(h + "mlp.gate_proj.weight", g + "ffn_gate.weight", {ffn, dim}, 0));
      RETURN_IF_ERROR(add(h + "mlp.up_proj.weight", g + "ffn_up.weight", {ffn, dim}, 0));
    }
    RETURN_IF_ERROR(add(h + "mlp.down_proj.weight", g + "ffn_down.weight", {dim, ffn}, 0));
    if (gemma) {
      RETURN_IF_ERROR(add(h + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", {dim}, 0, true, shift));
    }
  }
  RETURN_IF_ERROR(add("model.norm.weight", "output_norm.weight", {dim}, 0, true, gemma ? 1.0f : 0.0f));
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
