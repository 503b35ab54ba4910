// OpenAI's Responses API over the chat completions path (see responses_api.h).
#include "server/responses_api.h"

#include <utility>

#include <fmt/format.h>

namespace gale::server {

namespace {

// The response id's random part: item and call ids are made from it, so that a streamed response
// and the stored one name their items alike.
std::string Suffix(const std::string& id) { return id.rfind("resp_", 0) == 0 ? id.substr(5) : id; }
std::string MessageId(const std::string& id) { return "msg_" + Suffix(id); }
std::string ReasoningId(const std::string& id) { return "rs_" + Suffix(id); }
std::string CallItemId(const std::string& id, size_t i) { return fmt::format("fc_{}_{}", Suffix(id), i); }
std::string CallId(const std::string& id, size_t i) { return fmt::format("call_{}_{}", Suffix(id), i); }

// A message item's content as text: a string, or input_text / output_text parts.
std::variant<std::string, ApiError> ContentText(const Json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return BadRequest(field, fmt::format("'{}' must be a string or an array of content parts", field));
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& p = content[i];
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) return BadRequest(field, "each content part needs a 'type'");
    const std::string type = p["type"].get<std::string>();
    if (type == "input_text" || type == "output_text" || type == "text") {
      if (!p.contains("text") || !p["text"].is_string()) return BadRequest(fmt::format("{}[{}]", field, i), "a text part needs 'text'");
      out += p["text"].get<std::string>();
    } else if (type == "refusal") {
      if (p.contains("refusal") && p["refusal"].is_string()) out += p["refusal"].get<std::string>();
    } else {
      return BadRequest(fmt::format("{}[{}]", field, i), fmt::format("'{}' content is not supported (text-only models)", type));
    }
  }
  return out;
}

// One input item as chat messages (appended). Consecutive function calls join one assistant
// message's tool_calls; a reasoning item's text becomes the next assistant message's reasoning.
std::optional<ApiError> AddItem(const Json& item, size_t i, Json* out, std::string* pending_reasoning) {
  const std::string field = fmt::format("input[{}]", i);
  if (!item.is_object()) return BadRequest(field, "each input item must be an object");
  const std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "message";
  // The assistant message a function call joins: the turn's last one (its text, then its calls).
  auto assistant = [&]() -> Json& {
    if (out->empty() || out->back()["role"] != "assistant") {
      Json m = {{"role", "assistant"}, {"content", nullptr}};
      if (!pending_reasoning->empty()) m["reasoning_content"] = std::exchange(*pending_reasoning, "");
      out->push_back(std::move(m));
    }
    if (!out->back().contains("tool_calls")) out->back()["tool_calls"] = Json::array();
    return out->back();
  };
  if (type == "message") {
    if (!item.contains("role") || !item["role"].is_string()) return BadRequest(field + ".role", "a message needs a 'role'");
    std::string role = item["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "user" && role != "system" && role != "assistant") {
      return BadRequest(field + ".role", "'role' must be user, system, developer or assistant");
    }
    if (!item.contains("content")) return BadRequest(field + ".content", "a message needs 'content'");
    auto text = ContentText(item["content"], field + ".content");
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    Json m = {{"role", role}, {"content", std::get<std::string>(text)}};
    if (role == "assistant" && !pending_reasoning->empty()) m["reasoning_content"] = std::exchange(*pending_reasoning, "");
    out->push_back(std::move(m));
  } else if (type == "function_call") {
    for (const char* k : {"call_id", "name", "arguments"}) {
      if (!item.contains(k) || !item[k].is_string()) return BadRequest(field + "." + k, fmt::format("a function_call needs '{}'", k));
    }
    assistant()["tool_calls"].push_back(
        {{"id", item["call_id"]}, {"type", "function"}, {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
  } else if (type == "function_call_output") {
    if (!item.contains("call_id") || !item["call_id"].is_string()) return BadRequest(field + ".call_id", "a function_call_output needs 'call_id'");
    if (!item.contains("output")) return BadRequest(field + ".output", "a function_call_output needs 'output'");
    std::string output;
    if (item["output"].is_string()) {
      output = item["output"].get<std::string>();
    } else {
      auto text = ContentText(item["output"], field + ".output");
      if (auto* e = std::get_if<ApiError>(&text)) return *e;
      output = std::get<std::string>(text);
    }
    out->push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", output}});
  } else if (type == "reasoning") {
    for (const char* k : {"content", "summary"}) {
      if (!item.contains(k) || !item[k].is_array()) continue;
      for (const Json& p : item[k]) {
        if (p.is_object() && p.contains("text") && p["text"].is_string()) *pending_reasoning += p["text"].get<std::string>();
      }
      if (!pending_reasoning->empty()) break;  // the full text where given, else the summary
    }
  } else {
    return BadRequest(field + ".type", fmt::format("input items of type '{}' are not supported", type));
  }
  return std::nullopt;
}

Json UsageObject(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

Json ReasoningItem(const std::string& id, const std::string& text, const char* status) {
  Json item = {{"id", ReasoningId(id)}, {"type", "reasoning"}, {"summary", Json::array()}, {"status", status}};
  item["content"] = Json::array({{{"type", "reasoning_text"}, {"text", text}}});
  return item;
}

Json TextPart(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", Json::array()}};
}

Json MessageItem(const std::string& id, const std::string& text, const char* status) {
  Json content = Json::array();
  if (std::string_view(status) == "completed") content.push_back(TextPart(text));
  return {{"id", MessageId(id)}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}

Json CallItem(const std::string& id, size_t i, const std::string& name, const std::string& arguments, const char* status) {
  return {{"id", CallItemId(id, i)}, {"type", "function_call"}, {"status", status}, {"call_id", CallId(id, i)},
          {"name", name}, {"arguments", arguments}};
}

// Function tools (flat, as the Responses API writes them), tool_choice and text.format into the
// chat body.
std::optional<ApiError> AddTools(const Json& a, Json* c) {
  if (a.contains("tools") && !a["tools"].is_null()) {
    if (!a["tools"].is_array()) return BadRequest("tools", "'tools' must be an array");
    Json tools = Json::array();
    for (size_t i = 0; i < a["tools"].size(); ++i) {
      const Json& t = a["tools"][i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object() || t.value("type", "") != "function") {
        return BadRequest(at + ".type", "only function tools are supported (no built-in tools such as web_search or file_search)");
      }
      if (!t.contains("name") || !t["name"].is_string()) return BadRequest(at + ".name", "a function tool needs a 'name'");
      Json fn = {{"name", t["name"]}, {"parameters", t.value("parameters", Json({{"type", "object"}, {"properties", Json::object()}}))}};
      if (t.contains("description") && !t["description"].is_null()) fn["description"] = t["description"];
      if (t.contains("strict") && !t["strict"].is_null()) fn["strict"] = t["strict"];
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    if (!tools.empty()) (*c)["tools"] = std::move(tools);
  }
  if (a.contains("tool_choice") && !a["tool_choice"].is_null()) {
    const Json& tc = a["tool_choice"];
    if (tc.is_string()) {
      (*c)["tool_choice"] = tc;
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name") && tc["name"].is_string()) {
      (*c)["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      return BadRequest("tool_choice", "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\": ...}");
    }
  }
  if (a.contains("text") && a["text"].is_object() && a["text"].contains("format")) {
    const Json& f = a["text"]["format"];
    if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) return BadRequest("text.format", "'text.format' needs a 'type'");
    const std::string type = f["type"].get<std::string>();
    if (type == "json_schema") {
      Json js = {{"name", f.value("name", "response")}, {"schema", f.value("schema", Json::object())}};
      if (f.contains("strict")) js["strict"] = f["strict"];
      (*c)["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
    } else if (type == "json_object") {
      (*c)["response_format"] = {{"type", "json_object"}};
    } else if (type != "text") {
      return BadRequest("text.format.type", "'text.format' type must be text, json_object or json_schema");
    }
  }
  return std::nullopt;
}

}  // namespace

void ResponseStore::Evict(std::chrono::steady_clock::time_point now) {
  while (!order_.empty()) {
    auto it = slots_.find(order_.front());
    if (it == slots_.end()) {  // deleted
      order_.pop_front();
      continue;
    }
    if (slots_.size() <= limits_.max_responses && bytes_ <= limits_.max_bytes && now - it->second.at < limits_.ttl) break;
    bytes_ -= it->second.bytes;
    slots_.erase(it);
    order_.pop_front();
  }
}

void ResponseStore::Put(const std::string& id, Entry entry) {
  const size_t bytes = JsonText(entry.response).size() + JsonText(entry.messages).size();
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (auto it = slots_.find(id); it != slots_.end()) {
    bytes_ -= it->second.bytes;
    slots_.erase(it);
  }
  slots_[id] = Slot{std::move(entry), bytes, now};
  order_.push_back(id);
  bytes_ += bytes;
  Evict(now);
}

std::optional<ResponseStore::Entry> ResponseStore::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  Evict(std::chrono::steady_clock::now());
  auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  return it->second.entry;
}

bool ResponseStore::Delete(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return false;
  bytes_ -= it->second.bytes;
  slots_.erase(it);
  return true;
}

size_t ResponseStore::size() {
  std::lock_guard<std::mutex> lock(mu_);
  Evict(std::chrono::steady_clock::now());
  return slots_.size();
}

std::variant<ResponsesRequest, ApiError> ResponsesToChat(const std::string& body, ResponseStore& store) {
  auto parsed = ParseRequestObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& a = std::get<Json>(parsed);
  ResponsesRequest r;
  Json& c = r.chat;
  c = Json::object();
  if (a.contains("model")) c["model"] = a["model"];
  // The conversation: a stored response's, then the instructions, then the input.
  Json conversation = Json::array();
  if (a.contains("previous_response_id") && !a["previous_response_id"].is_null()) {
    if (!a["previous_response_id"].is_string()) return BadRequest("previous_response_id", "'previous_response_id' must be a string");
    auto prev = store.Get(a["previous_response_id"].get<std::string>());
    if (!prev) {
      return ApiError{404, fmt::format("no stored response '{}' (stored responses expire, and only with store: true)",
                                       a["previous_response_id"].get<std::string>()),
                      "invalid_request_error", "previous_response_id"};
    }
    conversation = prev->messages;
  }
  Json messages = Json::array();
  if (a.contains("instructions") && !a["instructions"].is_null()) {
    if (!a["instructions"].is_string()) return BadRequest("instructions", "'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", a["instructions"]}});
  }
  if (!a.contains("input")) return BadRequest("input", "'input' is required");
  const Json& input = a["input"];
  Json sent = Json::array();  // this request's own messages (stored; instructions are not carried over)
  if (input.is_string()) {
    sent.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    std::string reasoning;
    for (size_t i = 0; i < input.size(); ++i) {
      if (auto e = AddItem(input[i], i, &sent, &reasoning)) return *e;
    }
  } else {
    return BadRequest("input", "'input' must be a string or an array of items");
  }
  r.messages = conversation;
  for (const Json& m : sent) r.messages.push_back(m);
  for (const Json& m : r.messages) messages.push_back(m);
  if (messages.empty()) return BadRequest("input", "'input' holds no message");
  c["messages"] = std::move(messages);
  if (a.contains("max_output_tokens") && !a["max_output_tokens"].is_null()) c["max_tokens"] = a["max_output_tokens"];
  for (const char* k : {"temperature", "top_p", "parallel_tool_calls", "stream"}) {
    if (a.contains(k) && !a[k].is_null()) c[k] = a[k];
  }
  r.stream = a.value("stream", false) == true;
  if (a.contains("store")) {
    if (!a["store"].is_boolean()) return BadRequest("store", "'store' must be a boolean");
    r.store = a["store"].get<bool>();
  }
  if (auto e = AddTools(a, &c)) return *e;
  if (a.contains("reasoning") && a["reasoning"].is_object() && a["reasoning"].contains("effort") && a["reasoning"]["effort"].is_string()) {
    // The chat template decides what thinking means for its model (Qwen3's enable_thinking).
    c["chat_template_kwargs"] = {{"enable_thinking", a["reasoning"]["effort"] != "none" && a["reasoning"]["effort"] != "minimal"}};
  }
  // What the Response repeats of the request.
  r.echo = {{"instructions", a.value("instructions", Json(nullptr))},
            {"max_output_tokens", a.value("max_output_tokens", Json(nullptr))},
            {"parallel_tool_calls", a.value("parallel_tool_calls", Json(true))},
            {"previous_response_id", a.value("previous_response_id", Json(nullptr))},
            {"reasoning", a.value("reasoning", Json({{"effort", nullptr}, {"summary", nullptr}}))},
            {"store", r.store},
            {"temperature", a.value("temperature", Json(1.0))},
            {"text", a.value("text", Json({{"format", {{"type", "text"}}}}))},
            {"tool_choice", a.value("tool_choice", Json("auto"))},
            {"tools", a.value("tools", Json::array())},
            {"top_p", a.value("top_p", Json(1.0))},
            {"truncation", "disabled"},
            {"metadata", a.value("metadata", Json::object())}};
  return r;
}

Json ResponseObject(const std::string& id, int64_t created, const std::string& model, const ResponsesRequest& r,
                    const Choice& c, const Usage& usage) {
  Json output = Json::array();
  if (!c.reasoning.empty()) output.push_back(ReasoningItem(id, c.reasoning, "completed"));
  if (!c.text.empty() && !c.forced_calls) output.push_back(MessageItem(id, c.text, "completed"));
  for (size_t i = 0; i < c.tool_calls.size(); ++i) {
    output.push_back(CallItem(id, i, c.tool_calls[i].name, c.tool_calls[i].arguments, "completed"));
  }
  const bool cut = c.finish_reason == FinishReason::kLength;
  Json out = {{"id", id}, {"object", "response"}, {"created_at", created}, {"status", cut ? "incomplete" : "completed"},
              {"error", nullptr},
              {"incomplete_details", cut ? Json({{"reason", "max_output_tokens"}}) : Json(nullptr)},
              {"model", model}, {"output", std::move(output)}, {"usage", UsageObject(usage)}};
  for (auto it = r.echo.begin(); it != r.echo.end(); ++it) out[it.key()] = it.value();
  return out;
}

Json AssistantChatMessage(const std::string& id, const Choice& c) {
  Json m = {{"role", "assistant"}, {"content", c.text.empty() || c.forced_calls ? Json(nullptr) : Json(c.text)}};
  if (!c.reasoning.empty()) m["reasoning_content"] = c.reasoning;
  if (!c.tool_calls.empty()) {
    Json calls = Json::array();
    for (size_t i = 0; i < c.tool_calls.size(); ++i) {
      calls.push_back({{"id", CallId(id, i)}, {"type", "function"},
                       {"function", {{"name", c.tool_calls[i].name}, {"arguments", c.tool_calls[i].arguments}}}});
    }
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

std::string ResponsesEvents::Event(const std::string& type, Json data) {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return fmt::format("event: {}\ndata: {}\n\n", type, JsonText(data));
}

std::string ResponsesEvents::Start(const ResponsesRequest& r) {
  Json response = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", "in_progress"}, {"error", nullptr},
                   {"incomplete_details", nullptr}, {"model", model_}, {"output", Json::array()}, {"usage", nullptr}};
  for (auto it = r.echo.begin(); it != r.echo.end(); ++it) response[it.key()] = it.value();
  std::string out = Event("response.created", {{"response", response}});
  return out += Event("response.in_progress", {{"response", response}});
}

std::string ResponsesEvents::Open(Item kind, Json item) {
  std::string out = Close();
  open_ = kind;
  ++output_index_;
  item_ = std::move(item);
  text_.clear();
  out += Event("response.output_item.added", {{"output_index", output_index_}, {"item", item_}});
  if (kind == Item::kMessage) {
    out += Event("response.content_part.added", {{"item_id", item_["id"]}, {"output_index", output_index_}, {"content_index", 0},
                                                 {"part", TextPart("")}});
  }
  return out;
}

std::string ResponsesEvents::Close() {
  if (open_ == Item::kNone) return "";
  std::string out;
  const Json item_id = item_["id"];
  if (open_ == Item::kReasoning) {
    out += Event("response.reasoning_text.done", {{"item_id", item_id}, {"output_index", output_index_}, {"content_index", 0}, {"text", text_}});
    item_ = ReasoningItem(id_, text_, "completed");
  } else if (open_ == Item::kMessage) {
    out += Event("response.output_text.done", {{"item_id", item_id}, {"output_index", output_index_}, {"content_index", 0}, {"text", text_}});
    out += Event("response.content_part.done", {{"item_id", item_id}, {"output_index", output_index_}, {"content_index", 0},
                                                {"part", TextPart(text_)}});
    item_ = MessageItem(id_, text_, "completed");
  } else {
    out += Event("response.function_call_arguments.done", {{"item_id", item_id}, {"output_index", output_index_}, {"arguments", text_}});
    item_ = CallItem(id_, open_call_, item_["name"].get<std::string>(), text_, "completed");
  }
  out += Event("response.output_item.done", {{"output_index", output_index_}, {"item", item_}});
  open_ = Item::kNone;
  return out;
}

std::string ResponsesEvents::Thinking(std::string_view text) {
  if (text.empty()) return "";
  std::string out = open_ == Item::kReasoning ? "" : Open(Item::kReasoning, ReasoningItem(id_, "", "in_progress"));
  text_ += text;
  return out += Event("response.reasoning_text.delta",
                      {{"item_id", item_["id"]}, {"output_index", output_index_}, {"content_index", 0}, {"delta", std::string(text)}});
}

std::string ResponsesEvents::Text(std::string_view text) {
  if (text.empty()) return "";
  std::string out = open_ == Item::kMessage ? "" : Open(Item::kMessage, MessageItem(id_, "", "in_progress"));
  text_ += text;
  return out += Event("response.output_text.delta", {{"item_id", item_["id"]}, {"output_index", output_index_}, {"content_index", 0},
                                                     {"delta", std::string(text)}, {"logprobs", Json::array()}});
}

std::string ResponsesEvents::Calls(const std::vector<CallDelta>& deltas) {
  std::string out;
  for (const CallDelta& d : deltas) {
    if (!d.name.empty()) {
      out += Open(Item::kCall, CallItem(id_, d.index, d.name, "", "in_progress"));
      open_call_ = d.index;
    }
    if (d.arguments.empty() || open_ != Item::kCall || open_call_ != d.index) continue;
    text_ += d.arguments;
    out += Event("response.function_call_arguments.delta", {{"item_id", item_["id"]}, {"output_index", output_index_}, {"delta", d.arguments}});
  }
  return out;
}

std::string ResponsesEvents::End(const Json& response) {
  std::string out = Close();
  return out += Event(response["status"] == "incomplete" ? "response.incomplete" : "response.completed", {{"response", response}});
}

std::string ResponsesEvents::Error(const ApiError& e) {
  std::string out = Close();
  return out += Event("error", {{"code", e.type}, {"message", e.message}, {"param", e.param.empty() ? Json(nullptr) : Json(e.param)}});
}

}  // namespace gale::server
