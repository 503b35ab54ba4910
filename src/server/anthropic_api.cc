// Anthropic's Messages API over the chat completions path (see anthropic_api.h).
#include "server/anthropic_api.h"

#include <fmt/format.h>

namespace gale::server {

namespace {

// The text of a string or of an array of text blocks (system, tool_result content); a block of
// another type is a 400 (images and documents are not read).
std::variant<std::string, ApiError> TextOf(const Json& v, const std::string& field) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return BadRequest(field, fmt::format("'{}' must be a string or an array of content blocks", field));
  std::string out;
  for (const Json& b : v) {
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) {
      return BadRequest(field, fmt::format("each block of '{}' must be an object with a 'type'", field));
    }
    const std::string type = b["type"].get<std::string>();
    if (type != "text") return BadRequest(field, fmt::format("'{}' blocks of type '{}' are not supported here (text only)", field, type));
    if (!b.contains("text") || !b["text"].is_string()) return BadRequest(field, fmt::format("a text block of '{}' needs 'text'", field));
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

// One Messages message as chat messages (appended to out): a user's tool_result blocks become
// tool messages (in their order, text between them a user message), an assistant's tool_use
// blocks its tool_calls and its thinking blocks its reasoning_content.
std::optional<ApiError> AddMessage(const Json& m, size_t i, Json* out) {
  const std::string field = fmt::format("messages[{}]", i);
  if (!m.is_object()) return BadRequest(field, "each message must be an object");
  if (!m.contains("role") || !m["role"].is_string()) return BadRequest(field + ".role", "each message needs a 'role'");
  const std::string role = m["role"].get<std::string>();
  if (role != "user" && role != "assistant") return BadRequest(field + ".role", "'role' must be 'user' or 'assistant'");
  if (!m.contains("content")) return BadRequest(field + ".content", "each message needs 'content'");
  const Json& content = m["content"];
  if (content.is_string()) {
    out->push_back({{"role", role}, {"content", content}});
    return std::nullopt;
  }
  if (!content.is_array()) return BadRequest(field + ".content", "'content' must be a string or an array of content blocks");
  std::string text, thinking;
  Json calls = Json::array();
  auto flush_user_text = [&] {
    if (!text.empty()) out->push_back({{"role", "user"}, {"content", text}});
    text.clear();
  };
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& b = content[j];
    const std::string at = fmt::format("{}.content[{}]", field, j);
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) return BadRequest(at, "each content block needs a 'type'");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) return BadRequest(at, "a text block needs 'text'");
      if (!text.empty()) text += "\n";
      text += b["text"].get<std::string>();
    } else if (type == "tool_use" && role == "assistant") {
      if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string()) {
        return BadRequest(at, "a tool_use block needs 'id' and 'name'");
      }
      const Json input = b.value("input", Json::object());
      if (!input.is_object()) return BadRequest(at + ".input", "'input' must be an object");
      calls.push_back({{"id", b["id"]}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", JsonText(input)}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) return BadRequest(at, "a tool_result block needs 'tool_use_id'");
      std::string result;
      if (b.contains("content")) {
        auto t = TextOf(b["content"], at + ".content");
        if (auto* e = std::get_if<ApiError>(&t)) return *e;
        result = std::get<std::string>(t);
      }
      if (b.value("is_error", false)) result = "Error: " + result;
      flush_user_text();
      out->push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
    } else if ((type == "thinking" || type == "redacted_thinking") && role == "assistant") {
      if (type == "thinking" && b.contains("thinking") && b["thinking"].is_string()) thinking += b["thinking"].get<std::string>();
    } else if (type == "image" || type == "document") {
      return BadRequest(at, fmt::format("'{}' blocks are not supported (text-only models)", type));
    } else {
      return BadRequest(at, fmt::format("a {} message cannot hold a '{}' block", role, type));
    }
  }
  if (role == "user") {
    flush_user_text();
    return std::nullopt;
  }
  Json msg = {{"role", "assistant"}, {"content", text.empty() && !calls.empty() ? Json(nullptr) : Json(text)}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  out->push_back(std::move(msg));
  return std::nullopt;
}

std::string ErrorType(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

// Anthropic's usage object: input_tokens are those not read from the cache.
Json UsageObject(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached_tokens},
          {"output_tokens", u.completion_tokens}};
}

Json ToolInput(const std::string& arguments) {
  Json input = Json::parse(arguments, nullptr, false);
  return input.is_object() ? input : Json::object();
}

// A tool_use block's id: the message's id (msg_...) with the call's index.
std::string ToolUseId(const std::string& message_id, size_t i) {
  return fmt::format("toolu_{}_{}", message_id.rfind("msg_", 0) == 0 ? message_id.substr(4) : message_id, i);
}

std::string Event(const char* type, const Json& data) { return fmt::format("event: {}\ndata: {}\n\n", type, JsonText(data)); }

}  // namespace

std::variant<Json, ApiError> AnthropicToChat(const std::string& body, bool count_tokens) {
  auto parsed = ParseRequestObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& a = std::get<Json>(parsed);
  Json c = Json::object();
  // (The model is the one the server has, whatever 'model' names: Anthropic's clients send their
  // own model names, as they do to llama-server.)
  if (a.contains("model") && !a["model"].is_string()) return BadRequest("model", "'model' must be a string");
  if (!count_tokens) {
    if (!a.contains("max_tokens")) return BadRequest("max_tokens", "'max_tokens' is required");
    if (!a["max_tokens"].is_number_integer() || a["max_tokens"].get<int64_t>() < 1) {
      return BadRequest("max_tokens", "'max_tokens' must be a positive integer");
    }
    c["max_tokens"] = a["max_tokens"];
  } else {
    c["max_tokens"] = 1;
  }
  Json messages = Json::array();
  if (a.contains("system")) {
    auto t = TextOf(a["system"], "system");
    if (auto* e = std::get_if<ApiError>(&t)) return *e;
    if (!std::get<std::string>(t).empty()) messages.push_back({{"role", "system"}, {"content", std::get<std::string>(t)}});
  }
  if (!a.contains("messages") || !a["messages"].is_array()) return BadRequest("messages", "'messages' must be an array");
  if (a["messages"].empty()) return BadRequest("messages", "'messages' must not be empty");
  for (size_t i = 0; i < a["messages"].size(); ++i) {
    if (auto e = AddMessage(a["messages"][i], i, &messages)) return *e;
  }
  c["messages"] = std::move(messages);
  for (const char* k : {"temperature", "top_p", "top_k", "stream"}) {
    if (a.contains(k)) c[k] = a[k];
  }
  if (count_tokens) c.erase("stream");
  if (a.contains("stop_sequences")) {
    if (!a["stop_sequences"].is_array()) return BadRequest("stop_sequences", "'stop_sequences' must be an array of strings");
    c["stop"] = a["stop_sequences"];
  }
  if (a.contains("tools")) {
    if (!a["tools"].is_array()) return BadRequest("tools", "'tools' must be an array");
    Json tools = Json::array();
    for (size_t i = 0; i < a["tools"].size(); ++i) {
      const Json& t = a["tools"][i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) return BadRequest(at, "each tool needs a 'name'");
      if (t.contains("type") && t["type"] != "custom") {
        return BadRequest(at + ".type", fmt::format("server tools ('{}') are not supported; tools with an input_schema are",
                                             t["type"].is_string() ? t["type"].get<std::string>() : t["type"].dump()));
      }
      if (!t.contains("input_schema") || !t["input_schema"].is_object()) return BadRequest(at + ".input_schema", "each tool needs an 'input_schema' object");
      Json fn = {{"name", t["name"]}, {"parameters", t["input_schema"]}};
      if (t.contains("description")) fn["description"] = t["description"];
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    if (!tools.empty()) c["tools"] = std::move(tools);
  }
  if (a.contains("tool_choice")) {
    const Json& tc = a["tool_choice"];
    if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string()) {
      return BadRequest("tool_choice", "'tool_choice' must be an object with a 'type'");
    }
    const std::string type = tc["type"].get<std::string>();
    if (type == "auto") {
      c["tool_choice"] = "auto";
    } else if (type == "any") {
      c["tool_choice"] = "required";
    } else if (type == "none") {
      c["tool_choice"] = "none";
    } else if (type == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string()) return BadRequest("tool_choice.name", "a 'tool' tool_choice needs a 'name'");
      c["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      return BadRequest("tool_choice.type", "'tool_choice' type must be auto, any, tool or none");
    }
    if (tc.value("disable_parallel_tool_use", false) == true) c["parallel_tool_calls"] = false;
    if (!c.contains("tools") && type != "none" && type != "auto") return BadRequest("tool_choice", "'tool_choice' needs 'tools'");
  }
  if (a.contains("thinking")) {
    const Json& th = a["thinking"];
    if (!th.is_object() || !th.contains("type") || !th["type"].is_string()) return BadRequest("thinking", "'thinking' must be an object with a 'type'");
    const std::string type = th["type"].get<std::string>();
    if (type != "enabled" && type != "disabled" && type != "adaptive") return BadRequest("thinking.type", "'thinking' type must be enabled or disabled");
    // The chat template decides what thinking means for its model (Qwen3's enable_thinking).
    c["chat_template_kwargs"] = {{"enable_thinking", type != "disabled"}};
  }
  return c;
}

std::string AnthropicErrorBody(const ApiError& e) {
  return JsonText({{"type", "error"}, {"error", {{"type", ErrorType(e.status)}, {"message", e.message}}}});
}

std::string AnthropicStopReason(const Choice& c) {
  const bool ended = c.finish_reason == FinishReason::kEos || c.finish_reason == FinishReason::kStop;
  if (ended && !c.tool_calls.empty()) return "tool_use";
  if (c.finish_reason == FinishReason::kLength) return "max_tokens";
  if (c.finish_reason == FinishReason::kStop && !c.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

Json AnthropicMessage(const std::string& id, const std::string& model, const Choice& c, const Usage& usage) {
  Json content = Json::array();
  if (!c.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
  if (!c.text.empty() && !c.forced_calls) content.push_back({{"type", "text"}, {"text", c.text}});
  for (size_t i = 0; i < c.tool_calls.size(); ++i) {
    const ToolCall& call = c.tool_calls[i];
    content.push_back({{"type", "tool_use"}, {"id", ToolUseId(id, i)}, {"name", call.name}, {"input", ToolInput(call.arguments)}});
  }
  const std::string stop = AnthropicStopReason(c);
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model},
          {"content", std::move(content)},
          {"stop_reason", stop},
          {"stop_sequence", stop == "stop_sequence" ? Json(c.stop_string) : Json(nullptr)},
          {"usage", UsageObject(usage)}};
}

std::string AnthropicEvents::Start(const Usage& usage) {
  Json u = UsageObject(usage);
  u["output_tokens"] = 0;
  const Json message = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", Json::array()},
                        {"stop_reason", nullptr}, {"stop_sequence", nullptr}, {"usage", std::move(u)}};
  return Event("message_start", {{"type", "message_start"}, {"message", message}}) + Event("ping", {{"type", "ping"}});
}

std::string AnthropicEvents::Open(Block kind, Json content_block) {
  std::string out = Close();
  open_ = kind;
  ++index_;
  return out + Event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(content_block)}});
}

std::string AnthropicEvents::Close() {
  if (open_ == Block::kNone) return "";
  std::string out;
  if (open_ == Block::kThinking) {
    // The SDKs expect a thinking block's signature before its end; gale signs nothing.
    out += Event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                         {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
  }
  open_ = Block::kNone;
  return out + Event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicEvents::Thinking(std::string_view text) {
  if (text.empty()) return "";
  std::string out = open_ == Block::kThinking ? "" : Open(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}});
  return out += Event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                             {"delta", {{"type", "thinking_delta"}, {"thinking", std::string(text)}}}});
}

std::string AnthropicEvents::Text(std::string_view text) {
  if (text.empty()) return "";
  std::string out = open_ == Block::kText ? "" : Open(Block::kText, {{"type", "text"}, {"text", ""}});
  return out += Event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                             {"delta", {{"type", "text_delta"}, {"text", std::string(text)}}}});
}

std::string AnthropicEvents::Calls(const std::vector<CallDelta>& deltas) {
  std::string out;
  for (const CallDelta& d : deltas) {
    if (!d.name.empty()) {
      out += Open(Block::kTool, {{"type", "tool_use"}, {"id", ToolUseId(id_, d.index)}, {"name", d.name}, {"input", Json::object()}});
      open_call_ = d.index;
    }
    if (d.arguments.empty()) continue;
    // Arguments belong to the open call (a call's pieces come before the next call is named).
    if (open_ != Block::kTool || open_call_ != d.index) continue;
    out += Event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                         {"delta", {{"type", "input_json_delta"}, {"partial_json", d.arguments}}}});
  }
  return out;
}

std::string AnthropicEvents::End(const Choice& c, const Usage& usage) {
  std::string out = Close();
  const std::string stop = AnthropicStopReason(c);
  const Json delta = {{"stop_reason", stop}, {"stop_sequence", stop == "stop_sequence" ? Json(c.stop_string) : Json(nullptr)}};
  out += Event("message_delta", {{"type", "message_delta"}, {"delta", delta}, {"usage", {{"output_tokens", usage.completion_tokens}}}});
  return out + Event("message_stop", {{"type", "message_stop"}});
}

std::string AnthropicEvents::Error(const ApiError& e) {
  return "event: error\ndata: " + AnthropicErrorBody(e) + "\n\n";
}

}  // namespace gale::server
