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

std::vector<int32_t> TokenizeChatPrompt(const Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = tok.Encode(text, /*add_special=*/false, /*parse_special=*/true);
  if (tok.add_bos() && tok.bos_id() >= 0 && (ids.empty() || ids[0] != tok.bos_id())) {
    ids.insert(ids.begin(), tok.bos_id());
  }
  return ids;
}

}  // namespace gale
