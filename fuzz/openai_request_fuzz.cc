// libFuzzer target for the API request paths as the server runs them before the engine: the first
// byte picks the API (OpenAI completions or chat; Anthropic's Messages or count_tokens; OpenAI's
// Responses; Ollama's chat, generate or embed), whose translation (for the others) gives the body
// the OpenAI parser reads; then for chat the template over the parsed messages, tools and
// chat_template_kwargs, then the response JSON in each API's shape. Any crash, exception, hang
// or sanitizer report is a bug; 400 errors are fine.
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>

#include "model/chat_template.h"
#include "server/anthropic_api.h"
#include "server/ollama_api.h"
#include "server/openai_api.h"
#include "server/responses_api.h"

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
  using gale::server::ApiError;
  using gale::server::Json;
  bool chat = data[0] & 1;
  const int api = (data[0] >> 1) & 7;  // 0: OpenAI's (chat or not); else a translation first
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  static gale::server::ResponseStore store;
  static const bool stored = [] {
    store.Put("resp_a", {Json::object(), Json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])")});
    return true;
  }();
  (void)stored;
  static const gale::server::OllamaModel ollama = [] {
    gale::server::OllamaModel m;
    m.name = "m";
    return m;
  }();
  std::optional<gale::server::ResponsesRequest> responses;
  std::optional<gale::server::OllamaEndpoint> ollama_endpoint;
  if (api == 1 || api == 2) {
    auto r = gale::server::AnthropicToChat(body, /*count_tokens=*/api == 2);
    if (auto* e = std::get_if<ApiError>(&r)) return (void)gale::server::AnthropicErrorBody(*e), 0;
    body = std::get<Json>(r).dump();
    chat = true;
  } else if (api == 3) {
    auto r = gale::server::ResponsesToChat(body, store);
    if (auto* e = std::get_if<ApiError>(&r)) return (void)gale::server::ErrorBody(*e), 0;
    responses = std::get<gale::server::ResponsesRequest>(r);
    body = responses->chat.dump();
    chat = true;
  } else if (api >= 4) {
    ollama_endpoint = api == 4 ? gale::server::OllamaEndpoint::kChat : api == 5 ? gale::server::OllamaEndpoint::kGenerate
                      : api == 6 ? gale::server::OllamaEndpoint::kEmbed : gale::server::OllamaEndpoint::kEmbeddings;
    auto r = gale::server::OllamaToOpenAi(*ollama_endpoint, body, ollama);
    if (auto* e = std::get_if<ApiError>(&r)) return (void)gale::server::OllamaErrorBody(e->message), 0;
    const auto& o = std::get<gale::server::OllamaRequest>(r);
    if (o.load_only || api >= 6) return 0;  // (embeddings' bodies: the embeddings parser's own fuzzing is the OpenAI one's)
    body = o.body.dump();
    chat = o.chat;
  }
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
  c.reasoning = "\xff";
  c.tool_calls = {{"f", "{\"a\": [1", ""}};  // arguments that do not parse: still a valid answer
  if (api == 1 || api == 2) (void)gale::server::AnthropicMessage("msg_a", "m", c, {}).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (responses) {
    (void)gale::server::ResponseObject("resp_b", 0, "m", *responses, c, {}).dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  if (ollama_endpoint) (void)gale::server::OllamaFinal(*ollama_endpoint, "m", c, {}, {}, true).dump(-1, ' ', false, Json::error_handler_t::replace);
  return 0;
}
