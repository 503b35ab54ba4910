// Hugging Face llama checkpoints to GGUF.
#include "tools/hf_convert.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "gguf/safetensors.h"
#include "tools/cli_common.h"

namespace gale {
namespace {

using Json = nlohmann::json;

StatusOr<Json> ReadJson(const std::filesystem::path& p, bool required) {
  if (!required && !std::filesystem::exists(p)) return Json();
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(p.string()));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("'{}' is not a JSON object", p.string());
  return j;
}

StatusOr<int64_t> IntField(const Json& j, const char* key, int64_t fallback = -1) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback >= 0) return fallback;
    return InvalidArgument("config.json: '{}' is missing", key);
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1 || j[key].get<int64_t>() > (int64_t{1} << 24)) {
    return InvalidArgument("config.json: '{}' must be a positive integer", key);
  }
  return j[key].get<int64_t>();
}

double NumField(const Json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

// The token string of an added token or special-token field ("<s>" or {"content": "<s>"}).
std::string TokenContent(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

StatusOr<HfConvertReport> ConvertHf(const std::string& dir_name, GgmlType type, GgufWriter* out) {
  namespace fs = std::filesystem;
  if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16) {
    return InvalidArgument("convert writes f32, f16 or bf16 (quantize afterwards with gale quantize)");
  }
  const fs::path dir(dir_name);
  ASSIGN_OR_RETURN(const Json config, ReadJson(dir / "config.json", true));
  std::string arch = config.value("model_type", "");
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string()) {
    arch = config["architectures"][0].get<std::string>();
  }
  if (arch != "LlamaForCausalLM" && arch != "llama" && arch != "MistralForCausalLM" && arch != "mistral") {
    return InvalidArgument("config.json: architecture '{}' is not a llama-family model (LlamaForCausalLM)", arch);
  }
  ASSIGN_OR_RETURN(const int64_t dim, IntField(config, "hidden_size"));
  ASSIGN_OR_RETURN(const int64_t ffn, IntField(config, "intermediate_size"));
  ASSIGN_OR_RETURN(const int64_t layers, IntField(config, "num_hidden_layers"));
  ASSIGN_OR_RETURN(const int64_t heads, IntField(config, "num_attention_heads"));
  ASSIGN_OR_RETURN(const int64_t kv_heads, IntField(config, "num_key_value_heads", heads));
  ASSIGN_OR_RETURN(const int64_t vocab, IntField(config, "vocab_size"));
  ASSIGN_OR_RETURN(const int64_t ctx, IntField(config, "max_position_embeddings", 2048));
  if (dim % heads != 0 || heads % kv_heads != 0 || (dim / heads) % 2 != 0) {
    return InvalidArgument("config.json: {} heads ({} KV) do not divide hidden_size {} into even heads", heads,
                           kv_heads, dim);
  }
  const int64_t head_dim = dim / heads;
  const bool tied = config.value("tie_word_embeddings", false);

  // Tensors from every safetensors file in the folder (sharded checkpoints too).
  // The writer fills tensors later: each callback keeps its file alive.
  std::map<std::string, std::pair<std::shared_ptr<SafetensorsFile>, const SafetensorsTensor*>> tensors;
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) return InvalidArgument("'{}' has no .safetensors files", dir_name);
  for (const auto& p : paths) {
    ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> f, SafetensorsFile::Open(p.string()));
    for (const auto& t : f->tensors()) {
      if (!tensors.emplace(t.name, std::make_pair(f, &t)).second) {
        return InvalidArgument("tensor '{}' is in two files", t.name);
      }
    }
  }

  // Tokenizer.
  ASSIGN_OR_RETURN(const Json tj, ReadJson(dir / "tokenizer.json", true));
  ASSIGN_OR_RETURN(const Json tcfg, ReadJson(dir / "tokenizer_config.json", false));
  if (!tj.contains("model") || !tj["model"].is_object() || tj["model"].value("type", "") != "BPE") {
    return InvalidArgument("tokenizer.json: only BPE tokenizers are supported");
  }
  const Json& tm = tj["model"];
  // SentencePiece-style (Llama 2, Mistral, TinyLlama): byte fallback, "▁" for spaces. GGUF's
  // "llama" tokenizer merges by token score; a merge's rank gives its result's score.
  const bool spm = tm.value("byte_fallback", false);
  HfConvertReport report;
  // Pre-tokenizer: GPT-2's byte-level regex, or Llama 3's split regex then byte level.
  const Json& pt = tj.contains("pre_tokenizer") ? tj["pre_tokenizer"] : Json();
  auto is_byte_level = [](const Json& p) { return p.is_object() && p.value("type", "") == "ByteLevel"; };
  if (spm) {
    report.pre = "sentencepiece";
  } else if (is_byte_level(pt) && pt.value("use_regex", true)) {
    report.pre = "gpt-2";
  } else if (pt.is_object() && pt.value("type", "") == "Sequence" && pt.contains("pretokenizers") &&
             pt["pretokenizers"].is_array()) {
    for (const auto& p : pt["pretokenizers"]) {
      if (p.value("type", "") != "Split" || !p.contains("pattern")) continue;
      const std::string re = p["pattern"].value("Regex", "");
      if (re.find("(?i:'s|'t|'re|'ve|'m|'ll|'d)") != std::string::npos && re.find("\\p{N}{1,3}") != std::string::npos) {
        report.pre = "llama-bpe";
      }
    }
  }
  if (report.pre.empty()) {
    return InvalidArgument("tokenizer.json: pre-tokenizer not recognized (supported: GPT-2's byte level, Llama 3's split)");
  }
  if (!tm.contains("vocab") || !tm["vocab"].is_object() || !tm.contains("merges") || !tm["merges"].is_array()) {
    return InvalidArgument("tokenizer.json: model.vocab and model.merges are required");
  }
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  auto place = [&](int64_t id, const std::string& tok, int32_t ty) -> Status {
    if (id < 0 || id >= (int64_t{1} << 24)) return InvalidArgument("tokenizer.json: token id {} out of range", id);
    if (static_cast<int64_t>(tokens.size()) <= id) {
      tokens.resize(static_cast<size_t>(id + 1));
      types.resize(static_cast<size_t>(id + 1), 0);
    }
    tokens[id] = tok;
    types[id] = ty;
    return Status::Ok();
  };
  const std::string unk = tm.contains("unk_token") ? TokenContent(tm["unk_token"]) : "";
  for (auto it = tm["vocab"].begin(); it != tm["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return InvalidArgument("tokenizer.json: vocab entry '{}' has no id", it.key());
    const std::string& k = it.key();
    const bool byte = spm && k.size() == 6 && k.rfind("<0x", 0) == 0 && k.back() == '>';
    RETURN_IF_ERROR(place(it.value().get<int64_t>(), k, k == unk && spm ? 2 : byte ? 6 : 1));
  }
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& a : tj["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer()) continue;
      const std::string content = TokenContent(a);
      const int32_t ty = spm && content == unk ? 2 : a.value("special", false) ? 3 : 4;
      RETURN_IF_ERROR(place(a["id"].get<int64_t>(), content, ty));
    }
  }
  if (static_cast<int64_t>(tokens.size()) > vocab) {
    return InvalidArgument("tokenizer.json has {} tokens, the model's vocab_size is {}", tokens.size(), vocab);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == 0) {
      tokens[i] = fmt::format("[PAD{}]", i);
      types[i] = 5;
    }
  }
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < vocab; ++i) {
    tokens.push_back(fmt::format("[PAD{}]", i));
    types.push_back(5);
  }
  std::vector<std::string> merges;
  for (const auto& m : tm["merges"]) {
    if (m.is_string()) {
      merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      return InvalidArgument("tokenizer.json: merge {} is not a pair", merges.size());
    }
  }
  // SentencePiece scores: a merge of rank r makes a token of score -r (the first merge that makes
  // it); tokens no merge makes are never merged to (lowest score).
  std::vector<float> scores;
  if (spm) {
    std::unordered_map<std::string, int64_t> ids;
    for (size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<int64_t>(i));
    scores.assign(tokens.size(), -1e9f);
    for (size_t r = 0; r < merges.size(); ++r) {
      const size_t sp = merges[r].find(' ');
      if (sp == std::string::npos) return InvalidArgument("tokenizer.json: merge {} is not a pair", r);
      auto it = ids.find(merges[r].substr(0, sp) + merges[r].substr(sp + 1));
      if (it != ids.end() && scores[it->second] == -1e9f) scores[it->second] = -static_cast<float>(r);
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (types[i] != 1) scores[i] = 0.0f;
    }
  }
  auto id_of = [&](const std::string& content) -> int64_t {
    if (content.empty()) return -1;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] == content) return static_cast<int64_t>(i);
    }
    return -1;
  };
  auto special_id = [&](const char* tok_key, const char* cfg_key) -> int64_t {
    if (tcfg.is_object() && tcfg.contains(tok_key)) {
      if (const int64_t id = id_of(TokenContent(tcfg[tok_key])); id >= 0) return id;
    }
    if (config.contains(cfg_key)) {
      const Json& v = config[cfg_key];
      if (v.is_number_integer()) return v.get<int64_t>();
      if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
    }
    return -1;
  };
  const int64_t bos = special_id("bos_token", "bos_token_id"), eos = special_id("eos_token", "eos_token_id");
  bool add_bos = false;
  if (tcfg.is_object() && tcfg.contains("add_bos_token") && tcfg["add_bos_token"].is_boolean()) {
    add_bos = tcfg["add_bos_token"].get<bool>();
  } else if (bos >= 0 && tj.contains("post_processor") && !tj["post_processor"].is_null()) {
    add_bos = tj["post_processor"].dump().find(Json(tokens[bos]).dump()) != std::string::npos;
  }

  // Metadata.
  out->SetString("general.architecture", "llama");
  out->SetString("general.name", dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string());
  out->SetU32("general.file_type", type == GgmlType::kF32 ? 0 : type == GgmlType::kF16 ? 1 : 32);
  out->SetU32("llama.context_length", static_cast<uint32_t>(ctx));
  out->SetU32("llama.embedding_length", static_cast<uint32_t>(dim));
  out->SetU32("llama.feed_forward_length", static_cast<uint32_t>(ffn));
  out->SetU32("llama.block_count", static_cast<uint32_t>(layers));
  out->SetU32("llama.attention.head_count", static_cast<uint32_t>(heads));
  out->SetU32("llama.attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  out->SetU32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));
  out->SetF32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(NumField(config, "rms_norm_eps", 1e-5)));
  out->SetF32("llama.rope.freq_base", static_cast<float>(NumField(config, "rope_theta", 10000.0)));
  if (config.contains("rope_scaling") && config["rope_scaling"].is_object()) {
    const Json& rs = config["rope_scaling"];
    const std::string kind = rs.value("type", rs.value("rope_type", ""));
    if (kind != "linear") return InvalidArgument("config.json: rope_scaling '{}' is not supported (only linear)", kind);
    out->SetString("llama.rope.scaling.type", "linear");
    out->SetF32("llama.rope.scaling.factor", static_cast<float>(NumField(rs, "factor", 1.0)));
  }
  out->SetU32("llama.vocab_size", static_cast<uint32_t>(vocab));
  out->SetValue("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
  out->SetValue("tokenizer.ggml.token_type", GgufValue::I32Array(types));
  if (spm) {
    out->SetString("tokenizer.ggml.model", "llama");
    out->SetValue("tokenizer.ggml.scores", GgufValue::F32Array(scores));
    // A space prefix when the normalizer prepends "▁" (or a Metaspace pre-tokenizer does).
    const std::string norm = tj.contains("normalizer") ? tj["normalizer"].dump() : "";
    const bool prefix = norm.find("\"Prepend\"") != std::string::npos ||
                        (pt.is_object() && pt.value("type", "") == "Metaspace" && pt.value("prepend_scheme", "always") != "never");
    out->SetBool("tokenizer.ggml.add_space_prefix", prefix);
    if (const int64_t u = id_of(unk); u >= 0) out->SetU32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(u));
  } else {
    out->SetString("tokenizer.ggml.model", "gpt2");
    out->SetString("tokenizer.ggml.pre", report.pre);
    out->SetValue("tokenizer.ggml.merges", GgufValue::StringArray(merges));
  }
  if (bos >= 0) out->SetU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  if (eos >= 0) out->SetU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos));
  out->SetBool("tokenizer.ggml.add_bos_token", add_bos);
  if (tcfg.is_object() && tcfg.contains("chat_template") && tcfg["chat_template"].is_string()) {
    out->SetString("tokenizer.chat_template", tcfg["chat_template"].get<std::string>());
  }

  // Weights.
  std::map<std::string, bool> used;
  auto add = [&](const std::string& hf, const std::string& gguf, std::vector<int64_t> want, int64_t permute_heads,
                 bool required = true) -> Status {
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
      for (int64_t r = 0; r < rows; ++r) {
        // Hugging Face orders each head's rows as [first halves; second halves] (rotate-half
        // RoPE); GGUF interleaves them: row h*hd + 2i + j comes from row h*hd + j*hd/2 + i.
        int64_t from = r;
        if (hd > 0) {
          const int64_t h = r / hd, i = (r % hd) / 2, j = r % 2;
          from = h * hd + j * (hd / 2) + i;
        }
        DequantizeRowRef(src_type, src + from * src_row, row.data(), cols);
        QuantizeRowRef(target, row.data(), dst + r * dst_row, cols);
      }
    });
  };
  RETURN_IF_ERROR(add("model.embed_tokens.weight", "token_embd.weight", {vocab, dim}, 0));
  for (int64_t l = 0; l < layers; ++l) {
    const std::string h = fmt::format("model.layers.{}.", l), g = fmt::format("blk.{}.", l);
    RETURN_IF_ERROR(add(h + "input_layernorm.weight", g + "attn_norm.weight", {dim}, 0));
    RETURN_IF_ERROR(add(h + "self_attn.q_proj.weight", g + "attn_q.weight", {dim, dim}, heads));
    RETURN_IF_ERROR(add(h + "self_attn.k_proj.weight", g + "attn_k.weight", {kv_heads * head_dim, dim}, kv_heads));
    RETURN_IF_ERROR(add(h + "self_attn.v_proj.weight", g + "attn_v.weight", {kv_heads * head_dim, dim}, 0));
    RETURN_IF_ERROR(add(h + "self_attn.o_proj.weight", g + "attn_output.weight", {dim, dim}, 0));
    RETURN_IF_ERROR(add(h + "post_attention_layernorm.weight", g + "ffn_norm.weight", {dim}, 0));
    RETURN_IF_ERROR(add(h + "mlp.gate_proj.weight", g + "ffn_gate.weight", {ffn, dim}, 0));
    RETURN_IF_ERROR(add(h + "mlp.up_proj.weight", g + "ffn_up.weight", {ffn, dim}, 0));
    RETURN_IF_ERROR(add(h + "mlp.down_proj.weight", g + "ffn_down.weight", {dim, ffn}, 0));
  }
  RETURN_IF_ERROR(add("model.norm.weight", "output_norm.weight", {dim}, 0));
  if (!tied) RETURN_IF_ERROR(add("lm_head.weight", "output.weight", {vocab, dim}, 0, /*required=*/false));
  for (const auto& [name, t] : tensors) {
    if (!used.count(name)) report.skipped.push_back(name);
  }
  report.vocab = vocab;
  report.layers = layers;
  return report;
}

}  // namespace gale
