// libFuzzer target for the OpenAI API's request path as the server runs it before the engine: the
// body parser (both endpoints; the first byte picks which), then for chat the template over the
// parsed messages, tools and chat_template_kwargs, then the response JSON for the request. Any
// crash, exception, hang or sanitizer report is a bug; 400 errors are fine.
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>

#include "model/chat_template.h"
#include "server/openai_api.h"

namespace {

// A template that walks everything a request can hand it (as real tool-calling templates do).
const char* kTemplate = R"({%- for m in messages -%}
<|{{ m.role }}|>{{ m.content if m.content is string else m.content | tojson }}
{%- if m.tool_calls is defined %}{% for c in m.tool_calls %}{{ c | tojson }}{% endfor %}{% endif %}
{%- for k, v in m.items() if k not in ['role', 'content'] %} {{ k }}={{ v | tojson }}{% endfor %}
{% endfor -%}
{%- if tools %}{% for t in tools %}{{ t | tojson(indent=2) }}{{ t.function.name if t.function is mapping }}{% endfor %}{% endif -%}
{%- if enable_thinking is defined and enable_thinking %}<think>{% endif -%}
{%- if add_generation_prompt %}<|assistant|>{% endif %})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const gale::ChatTemplate chat_template = gale::ChatTemplate::FromSource(kTemplate).value();
  const bool chat = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto parsed = gale::server::ParseCompletionRequest(body, chat);
  if (auto* e = std::get_if<gale::server::ApiError>(&parsed)) {
    (void)gale::server::ErrorBody(*e);
    return 0;
  }
  auto& req = std::get<gale::server::CompletionRequest>(parsed);
  if (chat) {
    nlohmann::ordered_json extra = req.chat_template_kwargs.is_object() ? req.chat_template_kwargs
                                                                        : nlohmann::ordered_json::object();
    if (req.tools.is_array()) extra["tools"] = req.tools;
    gale::jinja::RenderOptions o;
    o.max_time = std::chrono::milliseconds(200);
    (void)chat_template.Apply(req.messages, /*add_generation_prompt=*/true, "<s>", "</s>", extra, o);
  }
  gale::server::Choice c;
  c.text = "Hello \xe9";  // invalid UTF-8 on purpose: responses must still serialize
  c.tokens = {1, 2};
  c.logprobs.resize(2);
  c.finish_reason = gale::FinishReason::kStop;
  auto piece = [](int32_t id) { return std::string(1, static_cast<char>('a' + id)); };
  (void)gale::server::CompletionResponse(req, "id", 0, {c}, {}, piece).dump(-1, ' ', false,
                                                                           nlohmann::ordered_json::error_handler_t::replace);
  (void)gale::server::StreamChunk(req, "id", 0, 0, "x", std::nullopt, true).dump();
  return 0;
}
