// Hugging Face tokenizer.json to GGUF's tokenizer keys.
#include "model/hf_tokenizer.h"

#include <unordered_map>

#include <fmt/format.h>

namespace gale {
namespace {

using Json = nlohmann::json;

// The token string of an added token or special-token field ("<s>" or {"content": "<s>"}).
std::string TokenContent(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

// The pre-tokenizer's llama.cpp name: GPT-2's byte-level regex, Llama 3's, Qwen2's, gpt-4o's or
// DeepSeek-V3's splits ("" when none of these).
std::string PreTokenizerName(const Json& pt) {
  auto is_byte_level = [](const Json& p) { return p.is_object() && p.value("type", "") == "ByteLevel"; };
  if (is_byte_level(pt) && pt.value("use_regex", true)) return "gpt-2";
  if (!pt.is_object() || pt.value("type", "") != "Sequence" || !pt.contains("pretokenizers") ||
      !pt["pretokenizers"].is_array()) {
    return "";
  }
  std::vector<std::string> splits;
  for (const auto& p : pt["pretokenizers"]) {
    if (p.value("type", "") == "Split" && p.contains("pattern")) splits.push_back(p["pattern"].value("Regex", ""));
  }
  // DeepSeek-V3 (and R1): three splits, digit groups, CJK and kana runs, then its word expression.
  if (splits.size() == 3 && splits[0] == "\\p{N}{1,3}" && splits[1] == "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+" &&
      splits[2].find("[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+") != std::string::npos) {
    return "deepseek-v3";
  }
  for (const std::string& re : splits) {
    // o200k (gpt-oss, Llama 4): letter runs by case category. Checked first: it also has
    // Llama 3's contractions and digit groups.
    if (re.find("[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+") != std::string::npos &&
        re.find("\\p{N}{1,3}") != std::string::npos) {
      return "gpt-4o";
    }
    // Llama 3 groups up to three digits; Qwen2 (Qwen2.5, Qwen3 too) splits every digit.
    if (re.find("(?i:'s|'t|'re|'ve|'m|'ll|'d)") != std::string::npos && re.find("\\p{N}{1,3}") != std::string::npos) {
      return "llama-bpe";
    }
    if (re.find("(?i:'s|'t|'re|'ve|'m|'ll|'d)") != std::string::npos &&
        re.find("\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+") != std::string::npos) {
      return "qwen2";
    }
  }
  return "";
}

// The vocabulary by id with llama.cpp's token types (1 normal, 2 unknown, 3 control, 4 user
// defined, 5 unused: the [PADn] fillers up to the model's vocab_size, 6 byte).
Status ReadVocab(const Json& tj, bool spm, const std::string& unk, int64_t vocab, std::vector<std::string>* tokens,
                 std::vector<int32_t>* types) {
  const Json& tm = tj["model"];
  auto place = [&](int64_t id, const std::string& tok, int32_t ty) -> Status {
    if (id < 0 || id >= (int64_t{1} << 24)) return InvalidArgument("tokenizer.json: token id {} out of range", id);
    if (static_cast<int64_t>(tokens->size()) <= id) {
      tokens->resize(static_cast<size_t>(id + 1));
      types->resize(static_cast<size_t>(id + 1), 0);
    }
    (*tokens)[id] = tok;
    (*types)[id] = ty;
    return Status::Ok();
  };
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
  if (static_cast<int64_t>(tokens->size()) > vocab) {
    return InvalidArgument("tokenizer.json has {} tokens, the model's vocab_size is {}", tokens->size(), vocab);
  }
  for (size_t i = 0; i < tokens->size(); ++i) {
    if ((*types)[i] == 0) {
      (*tokens)[i] = fmt::format("[PAD{}]", i);
      (*types)[i] = 5;
    }
  }
  for (int64_t i = static_cast<int64_t>(tokens->size()); i < vocab; ++i) {
    tokens->push_back(fmt::format("[PAD{}]", i));
    types->push_back(5);
  }
  return Status::Ok();
}

StatusOr<std::vector<std::string>> ReadMerges(const Json& tm) {
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
  return merges;
}

// SentencePiece scores: a merge of rank r makes a token of score -r (the first merge that makes
// it); tokens no merge makes are never merged to (lowest score).
StatusOr<std::vector<float>> SpmScores(const std::vector<std::string>& tokens, const std::vector<int32_t>& types,
                                       const std::vector<std::string>& merges) {
  std::unordered_map<std::string, int64_t> ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<int64_t>(i));
  std::vector<float> scores(tokens.size(), -1e9f);
  for (size_t r = 0; r < merges.size(); ++r) {
    const size_t sp = merges[r].find(' ');
    if (sp == std::string::npos) return InvalidArgument("tokenizer.json: merge {} is not a pair", r);
    auto it = ids.find(merges[r].substr(0, sp) + merges[r].substr(sp + 1));
    if (it != ids.end() && scores[it->second] == -1e9f) scores[it->second] = -static_cast<float>(r);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != 1) scores[i] = 0.0f;
  }
  return scores;
}

int64_t IdOf(const std::vector<std::string>& tokens, const std::string& content) {
  if (content.empty()) return -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == content) return static_cast<int64_t>(i);
  }
  return -1;
}

// BOS and EOS: tokenizer_config.json's token, else config.json's id; whether BOS is added.
Status ReadSpecialTokens(const Json& tj, const Json& tcfg, const Json& config, HfTokenizer& t) {
  auto special_id = [&](const char* tok_key, const char* cfg_key) -> int64_t {
    if (tcfg.is_object() && tcfg.contains(tok_key)) {
      if (const int64_t id = IdOf(t.tokens, TokenContent(tcfg[tok_key])); id >= 0) return id;
    }
    if (config.contains(cfg_key)) {
      const Json& v = config[cfg_key];
      if (v.is_number_integer()) return v.get<int64_t>();
      if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
    }
    return -1;
  };
  t.bos = special_id("bos_token", "bos_token_id");
  t.eos = special_id("eos_token", "eos_token_id");
  for (const auto& [what, id] : {std::pair{"bos", t.bos}, std::pair{"eos", t.eos}}) {
    if (id >= static_cast<int64_t>(t.tokens.size())) {
      return InvalidArgument("config.json: {}_token_id {} outside the vocabulary of {} tokens", what, id, t.tokens.size());
    }
  }
  t.add_bos = false;
  if (tcfg.is_object() && tcfg.contains("add_bos_token") && tcfg["add_bos_token"].is_boolean()) {
    t.add_bos = tcfg["add_bos_token"].get<bool>();
  } else if (t.bos >= 0 && tj.contains("post_processor") && !tj["post_processor"].is_null()) {
    t.add_bos = tj["post_processor"].dump().find(Json(t.tokens[t.bos]).dump()) != std::string::npos;
  }
  return Status::Ok();
}

StatusOr<HfTokenizer> Import(const Json& tj, const Json& tcfg, const Json& config, int64_t vocab) {
  if (!tj.contains("model") || !tj["model"].is_object() || tj["model"].value("type", "") != "BPE") {
    return InvalidArgument("tokenizer.json: only BPE tokenizers are supported");
  }
  const Json& tm = tj["model"];
  // SentencePiece-style (Llama 2, Mistral, TinyLlama): byte fallback, "▁" for spaces. GGUF's
  // "llama" tokenizer merges by token score; a merge's rank gives its result's score.
  HfTokenizer t;
  t.spm = tm.value("byte_fallback", false);
  const Json& pt = tj.contains("pre_tokenizer") ? tj["pre_tokenizer"] : Json();
  t.pre = t.spm ? "sentencepiece" : PreTokenizerName(pt);
  if (t.pre.empty()) {
    return InvalidArgument("tokenizer.json: pre-tokenizer not recognized (supported: GPT-2's byte level, Llama 3's, "
                           "Qwen2's, gpt-4o's and DeepSeek-V3's splits)");
  }
  if (!tm.contains("vocab") || !tm["vocab"].is_object() || !tm.contains("merges") || !tm["merges"].is_array()) {
    return InvalidArgument("tokenizer.json: model.vocab and model.merges are required");
  }
  const std::string unk = tm.contains("unk_token") ? TokenContent(tm["unk_token"]) : "";
  RETURN_IF_ERROR(ReadVocab(tj, t.spm, unk, vocab, &t.tokens, &t.types));
  ASSIGN_OR_RETURN(t.merges, ReadMerges(tm));
  if (t.spm) {
    ASSIGN_OR_RETURN(t.scores, SpmScores(t.tokens, t.types, t.merges));
  }
  RETURN_IF_ERROR(ReadSpecialTokens(tj, tcfg, config, t));
  if (t.spm) {
    // A space prefix when the normalizer prepends "▁" (or a Metaspace pre-tokenizer does).
    const std::string norm = tj.contains("normalizer") ? tj["normalizer"].dump() : "";
    t.add_space_prefix = norm.find("\"Prepend\"") != std::string::npos ||
                         (pt.is_object() && pt.value("type", "") == "Metaspace" && pt.value("prepend_scheme", "always") != "never");
    t.unk = IdOf(t.tokens, unk);
  }
  if (tcfg.is_object() && tcfg.contains("chat_template") && tcfg["chat_template"].is_string()) {
    t.chat_template = tcfg["chat_template"].get<std::string>();
  }
  return t;
}

}  // namespace

StatusOr<HfTokenizer> ImportHfTokenizer(const Json& tokenizer_json, const Json& tokenizer_config, const Json& config,
                                        int64_t vocab) {
  if (vocab < 1 || vocab > (int64_t{1} << 24)) return InvalidArgument("vocab_size {} out of range", vocab);
  // Optional fields are read with Json::value(), which throws when the field is there with another
  // type: such a file is an error, not an exception out of `gale convert`.
  try {
    return Import(tokenizer_json, tokenizer_config, config, vocab);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("tokenizer.json: a field has an unexpected type ({})", e.what());
  }
}

void WriteHfTokenizer(const HfTokenizer& t, GgufWriter* out) {
  out->SetValue("tokenizer.ggml.tokens", GgufValue::StringArray(t.tokens));
  out->SetValue("tokenizer.ggml.token_type", GgufValue::I32Array(t.types));
  if (t.spm) {
    out->SetString("tokenizer.ggml.model", "llama");
    out->SetValue("tokenizer.ggml.scores", GgufValue::F32Array(t.scores));
    out->SetBool("tokenizer.ggml.add_space_prefix", t.add_space_prefix);
    if (t.unk >= 0) out->SetU32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(t.unk));
  } else {
    out->SetString("tokenizer.ggml.model", "gpt2");
    out->SetString("tokenizer.ggml.pre", t.pre);
    out->SetValue("tokenizer.ggml.merges", GgufValue::StringArray(t.merges));
  }
  if (t.bos >= 0) out->SetU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(t.bos));
  if (t.eos >= 0) out->SetU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(t.eos));
  out->SetBool("tokenizer.ggml.add_bos_token", t.add_bos);
  if (t.chat_template) out->SetString("tokenizer.chat_template", *t.chat_template);
}

}  // namespace gale
