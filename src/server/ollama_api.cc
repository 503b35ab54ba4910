// Ollama's API over the OpenAI paths (see ollama_api.h).
#include "server/ollama_api.h"

#include <ctime>

#include <fmt/format.h>

namespace gale::server {

namespace {

// RFC 3339 in UTC, with nanoseconds when given (nanos >= 0), as Ollama writes times.
std::string Rfc3339(int64_t unix_seconds, int64_t nanos = -1) {
  const std::time_t secs = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  const std::string fraction = nanos >= 0 ? fmt::format(".{:09}", nanos) : "";
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, fraction);
}

// Now, as Ollama writes created_at.
std::string Now() {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return Rfc3339(ns / 1000000000, ns % 1000000000);
}

// The served name with a tag, as Ollama lists models ("name:latest").
std::string Tagged(const std::string& name) { return name.find(':') == std::string::npos ? name + ":latest" : name; }

// "260.0K", "494.0M", "7.6B".
std::string ParameterSize(int64_t n) {
  const double x = static_cast<double>(n);
  if (x >= 1e9) return fmt::format("{:.1f}B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.1f}M", x / 1e6);
  return fmt::format("{:.1f}K", x / 1e3);
}

// An identifier of the served file (FNV-1a of its name and size), in a digest's place: clients
// compare digests to tell models apart; it is not a hash of the file's bytes.
std::string Digest(const OllamaModel& m) {
  uint64_t h = 1469598103934665603ull;
  for (char c : m.name + "/" + std::to_string(m.file_bytes)) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return fmt::format("{:016x}{:016x}{:016x}{:016x}", h, h * 31, h * 131, h * 1031);
}

Json Details(const OllamaModel& m) {
  return {{"parent_model", ""}, {"format", "gguf"}, {"family", m.architecture}, {"families", Json::array({m.architecture})},
          {"parameter_size", ParameterSize(m.parameters)}, {"quantization_level", m.quantization}};
}

// options -> the OpenAI body's sampling fields. Unknown options (num_thread, num_gpu, mirostat,
// ...) are ignored, as they tune Ollama's own runner; num_ctx cannot resize the server's context.
std::optional<ApiError> AddOptions(const Json& a, Json* c) {
  if (!a.contains("options") || a["options"].is_null()) return std::nullopt;
  const Json& o = a["options"];
  if (!o.is_object()) return BadRequest("options", "'options' must be an object");
  for (const auto& [from, to] : std::vector<std::pair<const char*, const char*>>{
           {"temperature", "temperature"}, {"top_k", "top_k"}, {"top_p", "top_p"}, {"min_p", "min_p"}, {"seed", "seed"},
           {"stop", "stop"}, {"presence_penalty", "presence_penalty"}, {"frequency_penalty", "frequency_penalty"},
           {"repeat_penalty", "repetition_penalty"}}) {
    if (o.contains(from) && !o[from].is_null()) (*c)[to] = o[from];
  }
  if (o.contains("num_predict") && !o["num_predict"].is_null()) {
    if (!o["num_predict"].is_number_integer()) return BadRequest("options.num_predict", "'num_predict' must be an integer");
    const int64_t n = o["num_predict"].get<int64_t>();
    if (n > 0) (*c)["max_tokens"] = n;  // -1 (no limit) and -2 (fill the context): all that fits
    if (n == 0) return BadRequest("options.num_predict", "'num_predict' must not be 0");
  }
  return std::nullopt;
}

std::optional<ApiError> AddFormat(const Json& a, Json* c) {
  if (!a.contains("format") || a["format"].is_null() || a["format"] == "") return std::nullopt;
  const Json& f = a["format"];
  if (f == "json") {
    (*c)["response_format"] = {{"type", "json_object"}};
  } else if (f.is_object()) {
    (*c)["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "format"}, {"schema", f}, {"strict", true}}}};
  } else {
    return BadRequest("format", "'format' must be \"json\" or a JSON schema");
  }
  return std::nullopt;
}

std::optional<ApiError> AddThink(const Json& a, Json* c) {
  if (!a.contains("think") || a["think"].is_null()) return std::nullopt;
  const Json& t = a["think"];
  if (!t.is_boolean() && !t.is_string()) return BadRequest("think", "'think' must be a boolean (or low, medium, high)");
  // The chat template decides what thinking means for its model (Qwen3's enable_thinking).
  (*c)["chat_template_kwargs"] = {{"enable_thinking", t.is_boolean() ? t.get<bool>() : true}};
  return std::nullopt;
}

// Ollama's messages as OpenAI's: tool calls' arguments objects as JSON text (with ids the tool
// messages after them refer to by the function's name), thinking as reasoning_content.
std::variant<Json, ApiError> Messages(const Json& in) {
  Json out = Json::array();
  std::vector<std::pair<std::string, std::string>> calls;  // (name, id) of the last assistant's calls
  for (size_t i = 0; i < in.size(); ++i) {
    const Json& m = in[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return BadRequest(at, "each message needs a 'role'");
    if (m.contains("images") && m["images"].is_array() && !m["images"].empty()) {
      return BadRequest(at + ".images", "images are not supported (text-only models)");
    }
    Json o = {{"role", m["role"]}, {"content", m.value("content", Json(""))}};
    if (!o["content"].is_string()) return BadRequest(at + ".content", "'content' must be a string");
    if (m.contains("thinking") && m["thinking"].is_string() && !m["thinking"].get<std::string>().empty()) {
      o["reasoning_content"] = m["thinking"];
    }
    if (m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty()) {
      calls.clear();
      Json tc = Json::array();
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        const Json& call = m["tool_calls"][k];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string()) {
          return BadRequest(fmt::format("{}.tool_calls[{}]", at, k), "a tool call needs function.name");
        }
        const Json args = call["function"].value("arguments", Json::object());
        const std::string id = call.contains("id") && call["id"].is_string() ? call["id"].get<std::string>() : fmt::format("call_{}_{}", i, k);
        calls.emplace_back(call["function"]["name"].get<std::string>(), id);
        tc.push_back({{"id", id}, {"type", "function"},
                      {"function", {{"name", call["function"]["name"]}, {"arguments", args.is_string() ? args.get<std::string>() : JsonText(args)}}}});
      }
      o["tool_calls"] = std::move(tc);
    }
    if (o["role"] == "tool") {
      const std::string name = m.value("tool_name", m.value("name", std::string()));
      std::string id = m.value("tool_call_id", std::string());
      for (const auto& [n, cid] : calls) {
        if (id.empty() && n == name) id = cid;
      }
      if (id.empty() && !calls.empty()) id = calls.front().second;
      o["tool_call_id"] = id;
      if (!name.empty()) o["name"] = name;
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace

bool OllamaModelMatches(const std::string& model, const OllamaModel& served) {
  return model == served.name || model == Tagged(served.name);
}

std::variant<OllamaRequest, ApiError> OllamaToOpenAi(OllamaEndpoint endpoint, const std::string& body, const OllamaModel& served) {
  auto parsed = ParseRequestObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& a = std::get<Json>(parsed);
  if (!a.contains("model") || !a["model"].is_string() || a["model"].get<std::string>().empty()) return BadRequest("model", "model is required");
  const std::string model = a["model"].get<std::string>();
  if (!OllamaModelMatches(model, served)) {
    return ApiError{404, fmt::format("model '{}' not found; this server has '{}'", model, Tagged(served.name)), "not_found_error", "model"};
  }
  OllamaRequest r;
  r.model = model;
  Json& c = r.body;
  c = Json::object();
  if (endpoint == OllamaEndpoint::kEmbed || endpoint == OllamaEndpoint::kEmbeddings) {
    r.chat = false;
    r.stream = false;
    const char* field = endpoint == OllamaEndpoint::kEmbed ? "input" : "prompt";
    if (!a.contains(field)) return BadRequest(field, fmt::format("'{}' is required", field));
    const Json& in = a[field];
    if (!in.is_string() && !(in.is_array() && !in.empty() && std::all_of(in.begin(), in.end(), [](const Json& x) { return x.is_string(); }))) {
      return BadRequest(field, fmt::format("'{}' must be a string or an array of strings", field));
    }
    c["input"] = in;
    return r;
  }
  if (a.contains("stream")) {
    if (!a["stream"].is_boolean()) return BadRequest("stream", "'stream' must be a boolean");
    r.stream = a["stream"].get<bool>();
  }
  if (auto e = AddOptions(a, &c)) return *e;
  if (auto e = AddFormat(a, &c)) return *e;
  if (auto e = AddThink(a, &c)) return *e;
  if (a.contains("tools") && !a["tools"].is_null()) c["tools"] = a["tools"];
  if (endpoint == OllamaEndpoint::kChat) {
    if (!a.contains("messages") || a["messages"].is_null() || (a["messages"].is_array() && a["messages"].empty())) {
      r.load_only = true;  // Ollama's way to load a model
      return r;
    }
    if (!a["messages"].is_array()) return BadRequest("messages", "'messages' must be an array");
    auto m = Messages(a["messages"]);
    if (auto* e = std::get_if<ApiError>(&m)) return *e;
    c["messages"] = std::move(std::get<Json>(m));
    return r;
  }
  // /api/generate
  for (const char* k : {"suffix", "template", "context"}) {
    if (a.contains(k) && !a[k].is_null() && !(a[k].is_string() && a[k].get<std::string>().empty()) && !(a[k].is_array() && a[k].empty())) {
      return BadRequest(k, fmt::format("'{}' is not supported (the model's own chat template is used; no fill-in-the-middle)", k));
    }
  }
  if (a.contains("images") && a["images"].is_array() && !a["images"].empty()) return BadRequest("images", "images are not supported (text-only models)");
  if (!a.contains("prompt") || a["prompt"].is_null() || a["prompt"] == "") {
    r.load_only = true;
    return r;
  }
  if (!a["prompt"].is_string()) return BadRequest("prompt", "'prompt' must be a string");
  if (a.value("raw", false) == true) {
    r.chat = false;  // the prompt as written, no template
    c["prompt"] = a["prompt"];
    r.all_that_fits = !c.contains("max_tokens");  // (completions default to 16; Ollama to all that fits)
    return r;
  }
  Json messages = Json::array();
  if (a.contains("system") && a["system"].is_string() && !a["system"].get<std::string>().empty()) {
    messages.push_back({{"role", "system"}, {"content", a["system"]}});
  }
  messages.push_back({{"role", "user"}, {"content", a["prompt"]}});
  c["messages"] = std::move(messages);
  return r;
}

std::string OllamaErrorBody(const std::string& message) { return JsonText({{"error", message}}); }

std::string OllamaDeltaLine(OllamaEndpoint endpoint, const std::string& model, const std::string& content,
                            const std::string& thinking, const std::vector<ToolCall>& calls) {
  Json line = {{"model", model}, {"created_at", Now()}};
  if (endpoint == OllamaEndpoint::kChat) {
    Json msg = {{"role", "assistant"}, {"content", content}};
    if (!thinking.empty()) msg["thinking"] = thinking;
    if (!calls.empty()) {
      Json tc = Json::array();
      for (const ToolCall& call : calls) {
        Json args = Json::parse(call.arguments, nullptr, false);
        tc.push_back({{"function", {{"name", call.name}, {"arguments", args.is_object() ? args : Json::object()}}}});
      }
      msg["tool_calls"] = std::move(tc);
    }
    line["message"] = std::move(msg);
  } else {
    line["response"] = content;
    if (!thinking.empty()) line["thinking"] = thinking;
  }
  line["done"] = false;
  return JsonText(line) + "\n";
}

Json OllamaFinal(OllamaEndpoint endpoint, const std::string& model, const Choice& c, const Usage& usage, const OllamaTimings& t,
                 bool whole) {
  Json out = Json::parse(OllamaDeltaLine(endpoint, model, whole ? c.text : "", whole ? c.reasoning : "",
                                         whole ? c.tool_calls : std::vector<ToolCall>{}));
  if (whole && c.forced_calls && endpoint == OllamaEndpoint::kChat) out["message"]["content"] = "";
  out["done"] = true;
  out["done_reason"] = c.finish_reason == FinishReason::kLength ? "length" : c.finish_reason == FinishReason::kNone ? "load" : "stop";
  out["total_duration"] = t.total_ns;
  out["load_duration"] = 0;
  out["prompt_eval_count"] = usage.prompt_tokens;
  out["prompt_eval_duration"] = t.prompt_ns;
  out["eval_count"] = usage.completion_tokens;
  out["eval_duration"] = t.eval_ns;
  return out;
}

Json OllamaEmbedResponse(OllamaEndpoint endpoint, const std::string& model, const std::vector<std::vector<float>>& embeddings,
                         int64_t prompt_tokens, const OllamaTimings& t) {
  if (endpoint == OllamaEndpoint::kEmbeddings) return {{"embedding", embeddings.empty() ? std::vector<float>{} : embeddings[0]}};
  return {{"model", model}, {"embeddings", embeddings}, {"total_duration", t.total_ns}, {"load_duration", 0},
          {"prompt_eval_count", prompt_tokens}};
}

Json OllamaTags(const OllamaModel& m) {
  return {{"models", Json::array({{{"name", Tagged(m.name)}, {"model", Tagged(m.name)}, {"modified_at", Rfc3339(m.loaded_at)},
                                   {"size", m.file_bytes}, {"digest", Digest(m)}, {"details", Details(m)}}})}};
}

Json OllamaPs(const OllamaModel& m) {
  // Loaded for as long as the server runs: keep_alive changes nothing.
  return {{"models", Json::array({{{"name", Tagged(m.name)}, {"model", Tagged(m.name)}, {"size", m.file_bytes}, {"digest", Digest(m)},
                                   {"details", Details(m)}, {"expires_at", "2999-12-31T23:59:59Z"}, {"size_vram", 0},
                                   {"context_length", m.context_length}}})}};
}

Json OllamaShow(const OllamaModel& m) {
  Json caps = Json::array();
  if (m.chat || !m.embedding) caps.push_back("completion");
  if (m.tools) caps.push_back("tools");
  if (m.thinking) caps.push_back("thinking");
  if (m.embedding) caps.push_back("embedding");
  Json info = {{"general.architecture", m.architecture}, {"general.parameter_count", m.parameters},
               {m.architecture + ".context_length", m.context_length}};
  return {{"modelfile", fmt::format("# served by gale\nFROM {}\n", m.name)}, {"parameters", ""}, {"template", m.template_source},
          {"details", Details(m)}, {"model_info", std::move(info)}, {"capabilities", std::move(caps)},
          {"modified_at", Rfc3339(m.loaded_at)}};
}

}  // namespace gale::server
