// Chat template loading and application.
#include "model/chat_template.h"

#include <fstream>
#include <sstream>

namespace gale {

StatusOr<ChatTemplate> ChatTemplate::FromSource(const std::string& source) {
  ChatTemplate t;
  t.source_ = source;
  auto parsed = jinja::Template::Parse(source);
  if (!parsed.ok()) return parsed.status().WithContext("chat template");
  t.template_ = std::move(parsed).value();
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::FromGguf(const GgufFile& file) {
  auto src = file.GetString("tokenizer.chat_template");
  if (!src.ok()) return NotFound("the model has no tokenizer.chat_template (give one with --chat-template FILE)");
  return FromSource(*src);
}

StatusOr<ChatTemplate> ChatTemplate::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot open chat template '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto t = FromSource(ss.str());
  if (!t.ok()) return t.status().WithContext(path);
  return t;
}

StatusOr<std::string> ChatTemplate::Apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                          const std::string& bos_token, const std::string& eos_token,
                                          const nlohmann::ordered_json& extra,
                                          const jinja::RenderOptions& options) const {
  if (!messages.is_array()) return InvalidArgument("messages must be a JSON array");
  // Checked before anything copies them: copying and converting JSON recurse.
  if (jinja::JsonDeeperThan(messages, jinja::kMaxDepth - 2) || jinja::JsonDeeperThan(extra, jinja::kMaxDepth - 2)) {
    return InvalidArgument("messages or template variables nest deeper than {} levels", jinja::kMaxDepth - 2);
  }
  nlohmann::ordered_json ctx = {{"messages", messages},
                                {"add_generation_prompt", add_generation_prompt},
                                {"bos_token", bos_token},
                                {"eos_token", eos_token}};
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  }
  auto out = template_.Render(ctx, options);
  if (!out.ok()) return out.status().WithContext("chat template");
  return out;
}

namespace {

constexpr std::string_view kOpenMark = "\xef\xb7\x90";   // U+FDD0
constexpr std::string_view kCloseMark = "\xef\xb7\x91";  // U+FDD1
constexpr std::string_view kReplacement = "\xef\xbf\xbd";

std::string MarkString(const Tokenizer& tok, const std::string& s) {
  std::string clean;
  if (s.find("\xef\xb7") != std::string::npos) {  // the marks themselves never come from outside
    clean = s;
    for (std::string_view m : {kOpenMark, kCloseMark}) {
      for (size_t at; (at = clean.find(m)) != std::string::npos;) clean.replace(at, m.size(), kReplacement);
    }
  }
  const std::string& in = clean.empty() ? s : clean;
  const auto spans = tok.ControlTextSpans(in);
  if (spans.empty()) return in;
  std::string out;
  size_t at = 0;
  for (const auto& [b, e] : spans) {
    out.append(in, at, b - at).append(kOpenMark).append(in, b, e - b).append(kCloseMark);
    at = e;
  }
  return out.append(in, at);
}

}  // namespace

nlohmann::ordered_json MarkLiteralSpecialTexts(const Tokenizer& tok, const nlohmann::ordered_json& v) {
  if (v.is_string()) return MarkString(tok, v.get_ref<const std::string&>());
  if (v.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& e : v) out.push_back(MarkLiteralSpecialTexts(tok, e));
    return out;
  }
  if (v.is_object()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (auto it = v.begin(); it != v.end(); ++it) out[it.key()] = MarkLiteralSpecialTexts(tok, it.value());
    return out;
  }
  return v;
}

namespace {

// text without the marks, and the byte ranges (in it) that were marked. An opening mark without
// a closing one (a template that cut a string) holds to the end; a lone closing mark is dropped.
std::string Unmark(std::string_view text, std::vector<std::pair<size_t, size_t>>* literal) {
  std::string out;
  out.reserve(text.size());
  size_t open = std::string::npos;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kOpenMark.size(), kOpenMark) == 0) {
      if (open == std::string::npos) open = out.size();
      i += kOpenMark.size();
    } else if (text.compare(i, kCloseMark.size(), kCloseMark) == 0) {
      if (open != std::string::npos && literal != nullptr && out.size() > open) literal->emplace_back(open, out.size());
      open = std::string::npos;
      i += kCloseMark.size();
    } else {
      out += text[i++];
    }
  }
  if (open != std::string::npos && literal != nullptr && out.size() > open) literal->emplace_back(open, out.size());
  return out;
}

}  // namespace

std::string StripLiteralMarks(std::string_view text) { return Unmark(text, nullptr); }

std::vector<int32_t> TokenizeChatPrompt(const Tokenizer& tok, const std::string& marked) {
  std::vector<std::pair<size_t, size_t>> literal;
  const std::string text = Unmark(marked, &literal);
  std::vector<int32_t> ids = tok.Encode(text, /*add_special=*/false, /*parse_special=*/true, literal);
  if (tok.add_bos() && tok.bos_id() >= 0 && (ids.empty() || ids[0] != tok.bos_id())) {
    ids.insert(ids.begin(), tok.bos_id());
  }
  return ids;
}

}  // namespace gale
