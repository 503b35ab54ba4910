// A model's chat template: the Jinja template in the GGUF's tokenizer.chat_template (or a file
// that overrides it) rendered the way Hugging Face's apply_chat_template does, with messages,
// add_generation_prompt, bos_token and eos_token (plus optional tools and extra variables).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "jinja/template.h"
#include "model/tokenizer.h"

namespace gale {

class ChatTemplate {
 public:
  // From tokenizer.chat_template; NotFound when the file has none.
  static StatusOr<ChatTemplate> FromGguf(const GgufFile& file);
  static StatusOr<ChatTemplate> FromSource(const std::string& source);
  static StatusOr<ChatTemplate> FromFile(const std::string& path);

  // messages: a JSON array of {"role", "content", ...}. extra: more template variables (tools,
  // enable_thinking, ...); its keys override the defaults. bos/eos: the tokenizer's token texts.
  StatusOr<std::string> Apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                              const std::string& bos_token, const std::string& eos_token,
                              const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                              const jinja::RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
};

// Special-token texts in what a caller sends must stay text (a message saying "<|im_end|>" must not
// end its turn): MarkLiteralSpecialTexts returns v with every occurrence of a control or unknown
// token's text inside any of its strings wrapped in two Unicode noncharacters (U+FDD0, U+FDD1;
// ones already there become U+FFFD). The template renders the marked strings like any other, and
// TokenizeChatPrompt keeps each marked span as text and drops the marks. Call it on the messages
// and tools before Apply; StripLiteralMarks gives the rendered text as the model sees it.
nlohmann::ordered_json MarkLiteralSpecialTexts(const Tokenizer& tok, const nlohmann::ordered_json& v);
std::string StripLiteralMarks(std::string_view text);

// Token ids of a rendered chat prompt: special-token texts from the template (<|im_start|>, the
// BOS text) become those tokens, marked spans stay text; BOS is added in front only when the vocab
// wants it and the text did not already start with it.
std::vector<int32_t> TokenizeChatPrompt(const Tokenizer& tok, const std::string& text);

}  // namespace gale
