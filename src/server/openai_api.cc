// OpenAI request parsing and response formatting.
#include "server/openai_api.h"

#include <algorithm>
#include <initializer_list>
#include <set>
#include <variant>

#include <fmt/format.h>

#include "jinja/value.h"

namespace gale::server {
namespace {


// A JSON integer that can be a token id (0 <= id < 2^31); nullopt otherwise. The vocabulary's
// own size is checked by whoever knows it (the server, the engine).
std::optional<int32_t> TokenId(const Json& e) {
  if (!e.is_number_integer()) return std::nullopt;
  if (e.is_number_unsigned()) {
    if (e.get<uint64_t>() > INT32_MAX) return std::nullopt;
  } else if (e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX) {
    return std::nullopt;
  }
  return e.get<int32_t>();
}

// A body as a JSON object, checked before anything walks it (copies, template values and
// rendering walk it recursively).
std::variant<Json, ApiError> ParseObject(const std::string& body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return BadRequest("", "the request body is not valid JSON");
  if (!j.is_object()) return BadRequest("", "the request body must be a JSON object");
  if (jinja::JsonDeeperThan(j, kMaxRequestDepth)) {
    return BadRequest("", fmt::format("the request body nests arrays and objects deeper than {} levels", kMaxRequestDepth));
  }
  return j;
}

// Completions' prompt and embeddings' input: a string, strings, token ids or lists of them, into
// r->prompts / r->prompt_ids. field names it in errors ("prompt" or "input").
std::optional<ApiError> ParsePrompts(const Json& p, const std::string& field, CompletionRequest* r) {
  const std::string shape = fmt::format("'{}' must be a string, an array of strings or of token ids", field);
  auto ids_of = [&](const Json& a) -> std::optional<ApiError> {
    std::vector<int32_t> ids;
    for (const auto& x : a) {
      if (!x.is_number_integer()) return BadRequest(field, fmt::format("token id {}s must be integers", field));
      const auto id = TokenId(x);
      if (!id) return BadRequest(field, fmt::format("{} token id {} is not a token id", field, x.dump()));
      ids.push_back(*id);
    }
    r->prompt_ids.push_back(std::move(ids));
    return std::nullopt;
  };
  if (p.is_string()) {
    r->prompts.push_back(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p[0].is_string()) {
    for (const auto& e : p) {
      if (!e.is_string()) return BadRequest(field, shape);
      r->prompts.push_back(e.get<std::string>());
    }
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    return ids_of(p);
  } else if (p.is_array() && !p.empty() && p[0].is_array()) {
    for (const auto& e : p) {
      if (!e.is_array() || e.empty()) return BadRequest(field, fmt::format("token id {}s must be non-empty arrays of integers", field));
      if (auto err = ids_of(e)) return err;
    }
  } else {
    return BadRequest(field, fmt::format("'{}' must be a non-empty string, an array of strings or of token ids", field));
  }
  return std::nullopt;
}

}  // namespace

std::variant<Json, ApiError> ParseRequestObject(const std::string& body) { return ParseObject(body); }

ApiError BadRequest(const std::string& param, const std::string& message) {
  return ApiError{400, message, "invalid_request_error", param};
}

std::string ErrorBody(const ApiError& e) {
  Json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (e.status >= 400) err["code"] = e.status;
  return JsonText(Json{{"error", err}});
}

const char* FinishReasonForApi(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: return "";
  }
  return "";
}

namespace {

std::variant<CompletionRequest, ApiError> ParseBody(const std::string& body, bool chat, bool strict);

}  // namespace

std::variant<CompletionRequest, ApiError> ParseCompletionRequest(const std::string& body, bool chat, bool strict) {
  // Every access below checks types first; this is the boundary that keeps a missed check (a
  // JSON type error) a 400 rather than an exception through a server thread.
  try {
    return ParseBody(body, chat, strict);
  } catch (const nlohmann::json::exception& e) {
    return BadRequest("", fmt::format("the request body has a field of an unexpected type ({})", e.what()));
  }
}

// The structured-output fields, all forms of one thing: at most one may be set.
std::optional<ApiError> ParseConstraintFields(const Json& j, CompletionRequest* r) {
  using Kind = grammar::Constraint::Kind;
  auto set = [&](const std::string& param, Kind kind, std::string text) -> std::optional<ApiError> {
    if (r->constraint) {
      return BadRequest(param, fmt::format("'{}' and '{}' both constrain the output; give one", r->constraint_param, param));
    }
    r->constraint = grammar::Constraint{kind, std::move(text), ""};
    r->constraint_param = param;
    return std::nullopt;
  };
  auto has = [&](const Json& o, const char* k) { return o.contains(k) && !o[k].is_null(); };
  if (has(j, "response_format")) {
    const Json& rf = j["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
      return BadRequest("response_format", "'response_format' must be an object with a string 'type'");
    }
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object()) {
        return BadRequest("response_format", "response_format json_schema needs a 'json_schema' object");
      }
      const Json& js = rf["json_schema"];
      if (!js.contains("schema")) {
        return BadRequest("response_format", "response_format json_schema needs 'json_schema.schema'");
      }
      if (!js["schema"].is_object() && !js["schema"].is_boolean()) {
        return BadRequest("response_format", "'json_schema.schema' must be a JSON Schema object");
      }
      if (auto e = set("response_format", Kind::kJsonSchema, JsonText(js["schema"]))) return e;
      // "strict": false asks for the schema as JSON Schema reads it: an object without
      // additionalProperties takes other keys too (strict, or no word, closes it).
      if (js.contains("strict") && js["strict"] == false) r->constraint->objects = grammar::ObjectKeys::kOpen;
    } else if (type == "json_object") {
      // llama-server takes a schema here too.
      if (has(rf, "schema")) {
        if (auto e = set("response_format", Kind::kJsonSchema, JsonText(rf["schema"]))) return e;
      } else if (auto e = set("response_format", Kind::kJsonObject, "")) {
        return e;
      }
    } else if (type != "text") {
      return BadRequest("response_format", fmt::format("unknown response_format type '{}' (text, json_object, json_schema)", type));
    }
  }
  // A schema given as an object or as JSON text (vLLM takes both).
  auto schema_field = [&](const std::string& param, const Json& v) -> std::optional<ApiError> {
    if (v.is_string()) {
      Json parsed = Json::parse(v.get<std::string>(), nullptr, false);
      if (parsed.is_discarded()) return BadRequest(param, fmt::format("'{}' is not valid JSON", param));
      return set(param, Kind::kJsonSchema, JsonText(parsed));
    }
    if (!v.is_object() && !v.is_boolean()) return BadRequest(param, fmt::format("'{}' must be a JSON Schema", param));
    return set(param, Kind::kJsonSchema, JsonText(v));
  };
  auto string_field = [&](const std::string& param, const Json& v, Kind kind) -> std::optional<ApiError> {
    if (!v.is_string()) return BadRequest(param, fmt::format("'{}' must be a string", param));
    return set(param, kind, v.get<std::string>());
  };
  auto choice_field = [&](const std::string& param, const Json& v) -> std::optional<ApiError> {
    if (!v.is_array() || v.empty()) return BadRequest(param, fmt::format("'{}' must be a non-empty array of strings", param));
    for (const auto& c : v) {
      if (!c.is_string()) return BadRequest(param, fmt::format("'{}' must be a non-empty array of strings", param));
    }
    return set(param, Kind::kChoice, v.dump());
  };
  if (has(j, "guided_json")) {
    if (auto e = schema_field("guided_json", j["guided_json"])) return e;
  }
  if (has(j, "guided_regex")) {
    if (auto e = string_field("guided_regex", j["guided_regex"], Kind::kRegex)) return e;
  }
  if (has(j, "guided_choice")) {
    if (auto e = choice_field("guided_choice", j["guided_choice"])) return e;
  }
  if (has(j, "guided_grammar")) {
    if (auto e = string_field("guided_grammar", j["guided_grammar"], Kind::kGbnf)) return e;
  }
  if (has(j, "grammar")) {
    if (auto e = string_field("grammar", j["grammar"], Kind::kGbnf)) return e;
  }
  if (has(j, "json_schema")) {
    if (auto e = schema_field("json_schema", j["json_schema"])) return e;
  }
  if (has(j, "structured_outputs")) {
    const Json& so = j["structured_outputs"];
    if (!so.is_object()) return BadRequest("structured_outputs", "'structured_outputs' must be an object");
    for (auto it = so.begin(); it != so.end(); ++it) {
      const std::string& k = it.key();
      const std::string param = "structured_outputs." + k;
      if (it.value().is_null()) continue;
      std::optional<ApiError> e;
      if (k == "json") {
        e = schema_field(param, it.value());
      } else if (k == "regex") {
        e = string_field(param, it.value(), Kind::kRegex);
      } else if (k == "choice") {
        e = choice_field(param, it.value());
      } else if (k == "grammar") {
        e = string_field(param, it.value(), Kind::kGbnf);
      } else if (k == "json_object") {
        if (!it.value().is_boolean()) return BadRequest(param, "'structured_outputs.json_object' must be true or false");
        if (it.value().get<bool>()) e = set(param, Kind::kJsonObject, "");
      } else if (k == "backend" || k == "disable_fallback" || k == "disable_any_whitespace" ||
                 k == "disable_additional_properties" || k == "whitespace_pattern") {
        // Options of vLLM's backends; gale has one.
      } else {
        return BadRequest(param, fmt::format("unknown field '{}'", param));
      }
      if (e) return e;
    }
  }
  return std::nullopt;
}

namespace {

// Typed, range-checked reads of a request's optional fields: absent or null leaves *out as is.
class FieldReader {
 public:
  explicit FieldReader(const Json& j) : j_(j) {}

  bool Has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  std::optional<ApiError> Num(const char* key, double lo, double hi, double* out) const {
    if (!Has(key)) return std::nullopt;
    if (!j_[key].is_number()) return BadRequest(key, fmt::format("'{}' must be a number", key));
    const double v = j_[key].get<double>();
    if (!(v >= lo && v <= hi)) return BadRequest(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v));
    *out = v;
    return std::nullopt;
  }
  std::optional<ApiError> Float(const char* key, double lo, double hi, float* out) const {
    double d = *out;
    if (auto e = Num(key, lo, hi, &d)) return e;
    *out = static_cast<float>(d);
    return std::nullopt;
  }
  std::optional<ApiError> Integer(const char* key, int64_t lo, int64_t hi, int64_t* out) const {
    if (!Has(key)) return std::nullopt;
    if (!j_[key].is_number_integer()) return BadRequest(key, fmt::format("'{}' must be an integer", key));
    if (j_[key].is_number_unsigned() && j_[key].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return BadRequest(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, j_[key].get<uint64_t>()));
    }
    const int64_t v = j_[key].get<int64_t>();
    if (v < lo || v > hi) return BadRequest(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, v));
    *out = v;
    return std::nullopt;
  }
  std::optional<ApiError> Boolean(const char* key, bool* out) const {
    if (!Has(key)) return std::nullopt;
    if (!j_[key].is_boolean()) return BadRequest(key, fmt::format("'{}' must be true or false", key));
    *out = j_[key].get<bool>();
    return std::nullopt;
  }

 private:
  const Json& j_;
};

// Fields in none of the `known` sets: a 400 with --strict-api, else listed as ignored (vLLM
// ignores them).
std::optional<ApiError> CheckFields(const Json& j, std::initializer_list<const std::set<std::string>*> known,
                                    bool strict, CompletionRequest* r) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (std::any_of(known.begin(), known.end(), [&](const std::set<std::string>* set) { return set->count(k) > 0; })) {
      continue;
    }
    if (strict) return BadRequest(k, fmt::format("unknown field '{}'", k));
    r->ignored_fields.push_back(k);
  }
  return std::nullopt;
}

std::optional<ApiError> CheckKnownFields(const Json& j, bool chat, bool strict, CompletionRequest* r) {
  static const std::set<std::string> kCommon = {
      "model", "max_tokens", "n", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed",
      "stop", "stop_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
      "top_logprobs", "user", "ignore_eos", "truncate_prompt_tokens", "cache_salt", "logit_bias",
      "kv_retention", "kv_budget", "kv_budget_ratio", "kv_sink_tokens", "response_format", "guided_json",
      "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern",
      "structured_outputs", "grammar", "json_schema", "max_completion_tokens", "parse_special"};
  static const std::set<std::string> kCompletion = {"prompt", "echo", "suffix", "best_of"};
  static const std::set<std::string> kChat = {"messages", "tools", "tool_choice",
                                              "parallel_tool_calls", "chat_template_kwargs"};
  return CheckFields(j, {&kCommon, chat ? &kChat : &kCompletion}, strict, r);
}

// temperature ... seed, over OpenAI's defaults (not the CLI's).
std::optional<ApiError> ParseSampling(const Json& j, SamplingParams* s, bool* has_seed) {
  const FieldReader f(j);
  s->temperature = 1.0f;
  s->top_k = 0;
  s->top_p = 1.0f;
  s->min_p = 0.0f;
  s->presence_penalty = 0.0f;
  s->frequency_penalty = 0.0f;
  s->repeat_penalty = 1.0f;
  s->repeat_last_n = -1;
  if (auto e = f.Float("temperature", 0.0, 2.0, &s->temperature)) return e;
  if (auto e = f.Float("top_p", 0.0, 1.0, &s->top_p)) return e;
  if (s->top_p <= 0.0f) return BadRequest("top_p", "'top_p' must be in (0, 1]");
  int64_t top_k = 0;
  if (auto e = f.Integer("top_k", -1, 1 << 20, &top_k)) return e;
  s->top_k = top_k < 0 ? 0 : static_cast<int32_t>(top_k);
  if (auto e = f.Float("min_p", 0.0, 1.0, &s->min_p)) return e;
  if (auto e = f.Float("presence_penalty", -2.0, 2.0, &s->presence_penalty)) return e;
  if (auto e = f.Float("frequency_penalty", -2.0, 2.0, &s->frequency_penalty)) return e;
  if (auto e = f.Float("repetition_penalty", 0.01, 10.0, &s->repeat_penalty)) return e;
  if (f.Has("seed")) {
    const Json& seed = j["seed"];
    if (!seed.is_number_integer()) return BadRequest("seed", "'seed' must be an integer");
    // -1 asks for a random seed (llama.cpp's meaning); any other value is used as given,
    // negative ones as their two's complement.
    if (seed.is_number_unsigned() || seed.get<int64_t>() != -1) {
      s->seed = seed.is_number_unsigned() ? seed.get<uint64_t>() : static_cast<uint64_t>(seed.get<int64_t>());
      *has_seed = true;
    }
  }
  return std::nullopt;
}

// max_tokens, n, stream and its options, ignore_eos.
std::optional<ApiError> ParseLengthAndStream(const Json& j, CompletionRequest* r) {
  const FieldReader f(j);
  int64_t i = 0;
  if (auto e = f.Integer("max_tokens", 1, int64_t{1} << 30, &i)) return e;
  if (auto e = f.Integer("max_completion_tokens", 1, int64_t{1} << 30, &i)) return e;
  // Unset: OpenAI's completions default; chat generates as much as fits (0).
  r->max_tokens = i > 0 ? i : r->chat ? 0 : kCompletionsDefaultMaxTokens;
  i = 1;
  if (auto e = f.Integer("n", 1, 16, &i)) return e;
  r->n = static_cast<int>(i);
  if (auto e = f.Boolean("stream", &r->stream)) return e;
  if (auto e = f.Boolean("ignore_eos", &r->ignore_eos)) return e;
  if (!f.Has("stream_options")) return std::nullopt;
  const Json& so = j["stream_options"];
  if (!so.is_object()) return BadRequest("stream_options", "'stream_options' must be an object");
  for (auto it = so.begin(); it != so.end(); ++it) {
    if (it.key() != "include_usage" && it.key() != "continuous_usage_stats") {
      return BadRequest("stream_options", fmt::format("unknown field 'stream_options.{}'", it.key()));
    }
  }
  if (so.contains("include_usage")) {
    if (!so["include_usage"].is_boolean()) return BadRequest("stream_options", "'include_usage' must be true or false");
    r->include_usage = so["include_usage"].get<bool>();
  }
  if (!r->stream) return BadRequest("stream_options", "'stream_options' is only allowed with 'stream': true");
  return std::nullopt;
}

std::optional<ApiError> ParseStops(const Json& j, CompletionRequest* r) {
  if (j.contains("stop") && !j["stop"].is_null()) {
    const Json& s = j["stop"];
    if (s.is_string()) {
      r->stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& e : s) {
        if (!e.is_string()) return BadRequest("stop", "'stop' must be a string or an array of strings");
        r->stop.push_back(e.get<std::string>());
      }
    } else {
      return BadRequest("stop", "'stop' must be a string or an array of strings");
    }
    if (r->stop.size() > 16) return BadRequest("stop", "at most 16 stop sequences");
    for (const auto& s2 : r->stop) {
      if (s2.empty()) return BadRequest("stop", "stop sequences must not be empty");
    }
  }
  if (j.contains("stop_token_ids") && !j["stop_token_ids"].is_null()) {
    if (!j["stop_token_ids"].is_array()) return BadRequest("stop_token_ids", "'stop_token_ids' must be an array of integers");
    for (const auto& e : j["stop_token_ids"]) {
      if (!e.is_number_integer()) return BadRequest("stop_token_ids", "'stop_token_ids' must be an array of integers");
      const auto id = TokenId(e);
      if (!id) return BadRequest("stop_token_ids", fmt::format("stop token id {} is not a token id", e.dump()));
      r->stop_token_ids.push_back(*id);
    }
  }
  return std::nullopt;
}

// Chat: logprobs (bool) + top_logprobs; completions: logprobs N.
std::optional<ApiError> ParseLogprobs(const Json& j, bool chat, CompletionRequest* r) {
  const FieldReader f(j);
  if (chat) {
    bool on = false;
    if (auto e = f.Boolean("logprobs", &on)) return e;
    int64_t i = 0;
    if (auto e = f.Integer("top_logprobs", 0, 20, &i)) return e;
    if (f.Has("top_logprobs") && !on) return BadRequest("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->top_logprobs = on ? static_cast<int>(i) : -1;
    return std::nullopt;
  }
  int64_t i = -1;
  if (auto e = f.Integer("logprobs", 0, 20, &i)) return e;
  r->top_logprobs = static_cast<int>(i);
  if (f.Has("top_logprobs")) return BadRequest("top_logprobs", "completions take 'logprobs': N (top_logprobs is for chat)");
  return std::nullopt;
}

// {"token id": bias in [-100, 100]}; the vocabulary bound is checked by the server.
std::optional<ApiError> ParseLogitBias(const Json& j, SamplingParams* s) {
  if (!j.contains("logit_bias") || j["logit_bias"].is_null()) return std::nullopt;
  if (!j["logit_bias"].is_object()) return BadRequest("logit_bias", "'logit_bias' must be an object of token id -> bias");
  for (auto it = j["logit_bias"].begin(); it != j["logit_bias"].end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), ::isdigit)) id = std::stoll(key);
    if (id < 0 || id > INT32_MAX) return BadRequest("logit_bias", fmt::format("logit_bias key '{}' is not a token id", key));
    if (!it.value().is_number()) return BadRequest("logit_bias", fmt::format("logit_bias for token {} must be a number", key));
    const double bias = it.value().get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return BadRequest("logit_bias", fmt::format("logit_bias for token {} must be in [-100, 100], got {}", key, bias));
    }
    if (s->logit_bias.size() >= 1024) return BadRequest("logit_bias", "at most 1024 logit_bias entries");
    s->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::nullopt;
}

// truncate_prompt_tokens, cache_salt, user, and the KV retention fields.
std::optional<ApiError> ParseCacheFields(const Json& j, CompletionRequest* r) {
  const FieldReader f(j);
  int64_t i = -1;
  if (auto e = f.Integer("truncate_prompt_tokens", 1, int64_t{1} << 30, &i)) return e;
  r->truncate_prompt_tokens = i;
  if (f.Has("cache_salt")) {
    if (!j["cache_salt"].is_string()) return BadRequest("cache_salt", "'cache_salt' must be a string");
    r->cache_salt = j["cache_salt"].get<std::string>();
  }
  if (f.Has("user") && !j["user"].is_string()) return BadRequest("user", "'user' must be a string");
  if (!f.Has("kv_retention")) {
    for (const char* k : {"kv_budget", "kv_budget_ratio", "kv_sink_tokens"}) {
      if (f.Has(k)) return BadRequest(k, fmt::format("'{}' needs 'kv_retention'", k));
    }
    return std::nullopt;
  }
  if (!j["kv_retention"].is_string()) return BadRequest("kv_retention", "'kv_retention' must be a string");
  auto policy = ParseRetentionPolicy(j["kv_retention"].get<std::string>());
  if (!policy.ok()) return BadRequest("kv_retention", policy.status().message());
  RetentionConfig rc;
  rc.policy = *policy;
  i = 0;
  if (auto e = f.Integer("kv_budget", 1, int64_t{1} << 30, &i)) return e;
  rc.budget = i;
  double d = 0.0;
  if (auto e = f.Num("kv_budget_ratio", 0.0, 1.0, &d)) return e;
  rc.budget_ratio = d;
  i = rc.sink_tokens;
  if (auto e = f.Integer("kv_sink_tokens", 0, int64_t{1} << 20, &i)) return e;
  rc.sink_tokens = i;
  if (Status st = rc.Validate(); !st.ok()) return BadRequest("kv_retention", st.message());
  r->retention = rc;
  return std::nullopt;
}

// Checked messages; text parts become one string (templates expect content to be a string).
std::optional<ApiError> ParseMessages(const Json& j, CompletionRequest* r) {
  if (!j.contains("messages")) return BadRequest("messages", "'messages' is required");
  const Json& m = j["messages"];
  if (!m.is_array() || m.empty()) return BadRequest("messages", "'messages' must be a non-empty array");
  for (const auto& msg : m) {
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string()) {
      return BadRequest("messages", "every message must be an object with a string 'role'");
    }
    const std::string role = msg["role"];
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer") {
      return BadRequest("messages", fmt::format("unknown role '{}'", role));
    }
    if (msg.contains("content") && !msg["content"].is_null() && !msg["content"].is_string()) {
      // Content parts: only text parts, which are joined.
      if (!msg["content"].is_array()) return BadRequest("messages", "'content' must be a string or an array of text parts");
      for (const auto& part : msg["content"]) {
        // NOTE: no Json::value() on request data: it throws when the field has another type.
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return BadRequest("messages", "only text content parts are supported");
        }
      }
    }
  }
  r->messages = Json::array();
  for (const auto& msg : m) {
    Json copy = msg;
    if (copy.contains("content") && copy["content"].is_array()) {
      std::string text;
      for (const auto& part : copy["content"]) text += part["text"].get<std::string>();
      copy["content"] = text;
    }
    r->messages.push_back(std::move(copy));
  }
  return std::nullopt;
}

// tools, tool_choice, parallel_tool_calls, chat_template_kwargs.
std::optional<ApiError> ParseToolFields(const Json& j, CompletionRequest* r) {
  const FieldReader f(j);
  if (f.Has("tools")) {
    if (!j["tools"].is_array()) return BadRequest("tools", "'tools' must be an array");
    for (const auto& t : j["tools"]) {
      if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
          !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string()) {
        return BadRequest("tools", "every tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
      }
    }
    r->tools = j["tools"];
  }
  if (f.Has("tool_choice")) {
    const Json& tc = j["tool_choice"];
    if (tc.is_string()) {
      const std::string c = tc.get<std::string>();
      if (c != "auto" && c != "none" && c != "required") {
        return BadRequest("tool_choice", fmt::format("tool_choice '{}' is not one of auto, none, required", c));
      }
      r->tool_choice = c;
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() && tc["function"].contains("name") &&
               tc["function"]["name"].is_string()) {
      r->tool_choice = "function";
      r->tool_choice_name = tc["function"]["name"].get<std::string>();
    } else {
      return BadRequest("tool_choice", "tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if ((r->tool_choice == "required" || r->tool_choice == "function") && !r->tools.is_array()) {
      return BadRequest("tool_choice", fmt::format("tool_choice {} needs 'tools'", r->tool_choice));
    }
  }
  if (auto e = f.Boolean("parallel_tool_calls", &r->parallel_tool_calls)) return e;
  if (f.Has("chat_template_kwargs")) {
    if (!j["chat_template_kwargs"].is_object()) return BadRequest("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    r->chat_template_kwargs = j["chat_template_kwargs"];
  }
  return std::nullopt;
}

// prompt, echo, best_of, suffix.
std::optional<ApiError> ParseCompletionFields(const Json& j, CompletionRequest* r) {
  if (!j.contains("prompt")) return BadRequest("prompt", "'prompt' is required");
  if (auto e = ParsePrompts(j["prompt"], "prompt", r)) return e;
  if (r->prompts.size() + r->prompt_ids.size() > 64) return BadRequest("prompt", "at most 64 prompts per request");
  if (auto e = FieldReader(j).Boolean("echo", &r->echo)) return e;
  r->parse_special = true;  // a raw prompt is the caller's own template text, as llama.cpp and vLLM read it
  return std::nullopt;
}

std::variant<CompletionRequest, ApiError> ParseBody(const std::string& body, bool chat, bool strict) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  Json j = std::move(std::get<Json>(parsed));
  CompletionRequest r;
  r.chat = chat;
  if (auto e = CheckKnownFields(j, chat, strict, &r)) return *e;
  if (j.contains("model")) {
    if (!j["model"].is_string()) return BadRequest("model", "'model' must be a string");
    r.model = j["model"].get<std::string>();
  }
  if (auto e = ParseSampling(j, &r.sampling, &r.has_seed)) return *e;
  if (auto e = ParseLengthAndStream(j, &r)) return *e;
  if (auto e = ParseStops(j, &r)) return *e;
  if (auto e = ParseLogprobs(j, chat, &r)) return *e;
  if (auto e = ParseLogitBias(j, &r.sampling)) return *e;
  if (j.contains("best_of") && !j["best_of"].is_null() && !(j["best_of"].is_number_integer() && j["best_of"].get<int64_t>() == 1)) {
    return BadRequest("best_of", "'best_of' other than 1 is not supported");
  }
  if (j.contains("suffix") && !j["suffix"].is_null()) return BadRequest("suffix", "'suffix' is not supported");
  if (auto e = ParseConstraintFields(j, &r)) return *e;
  if (auto e = ParseCacheFields(j, &r)) return *e;
  if (auto e = chat ? ParseMessages(j, &r) : ParseCompletionFields(j, &r)) return *e;
  if (chat) {
    if (auto e = ParseToolFields(j, &r)) return *e;
  }
  if (auto e = FieldReader(j).Boolean("parse_special", &r.parse_special)) return *e;
  return r;
}

}  // namespace

std::variant<CompletionRequest, ApiError> ParseEmbeddingRequest(const std::string& body, int64_t dim, bool strict) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  Json j = std::move(std::get<Json>(parsed));
  CompletionRequest r;
  r.embeddings = true;
  static const std::set<std::string> kKnown = {"input", "model", "encoding_format", "dimensions", "user"};
  if (auto e = CheckFields(j, {&kKnown}, strict, &r)) return *e;
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return BadRequest("model", "'model' must be a string");
    r.model = j["model"].get<std::string>();
  }
  if (j.contains("encoding_format") && !j["encoding_format"].is_null()) {
    if (j["encoding_format"] == "base64") {
      r.base64 = true;
    } else if (j["encoding_format"] != "float") {
      return BadRequest("encoding_format", "'encoding_format' must be float or base64");
    }
  }
  if (j.contains("dimensions") && !j["dimensions"].is_null()) {
    if (!j["dimensions"].is_number_integer() || j["dimensions"].get<int64_t>() != dim) {
      return BadRequest("dimensions", fmt::format("'dimensions' can only be this model's embedding size, {}", dim));
    }
  }
  if (j.contains("user") && !j["user"].is_null() && !j["user"].is_string()) return BadRequest("user", "'user' must be a string");
  if (!j.contains("input")) return BadRequest("input", "'input' is required");
  if (auto e = ParsePrompts(j["input"], "input", &r)) return *e;
  for (const auto& p : r.prompts) {
    if (p.empty()) return BadRequest("input", "an input string is empty");
  }
  if (r.prompts.size() + r.prompt_ids.size() > 2048) return BadRequest("input", "at most 2048 inputs per request");
  r.max_tokens = 1;
  return r;
}

Json EmbeddingResponse(const CompletionRequest& req, const std::vector<std::vector<float>>& embeddings,
                       int64_t prompt_tokens) {
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  Json data = Json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    Json e = {{"object", "embedding"}, {"index", i}};
    if (req.base64) {
      // Little-endian float32s, as OpenAI sends them (x86 is little-endian).
      const auto* bytes = reinterpret_cast<const uint8_t*>(embeddings[i].data());
      const size_t n = embeddings[i].size() * sizeof(float);
      std::string s;
      s.reserve((n + 2) / 3 * 4);
      for (size_t k = 0; k < n; k += 3) {
        const uint32_t v = (uint32_t{bytes[k]} << 16) | (k + 1 < n ? uint32_t{bytes[k + 1]} << 8 : 0) | (k + 2 < n ? bytes[k + 2] : 0);
        s += kB64[(v >> 18) & 63];
        s += kB64[(v >> 12) & 63];
        s += k + 1 < n ? kB64[(v >> 6) & 63] : '=';
        s += k + 2 < n ? kB64[v & 63] : '=';
      }
      e["embedding"] = s;
    } else {
      e["embedding"] = embeddings[i];
    }
    data.push_back(std::move(e));
  }
  return Json{{"object", "list"},
              {"data", std::move(data)},
              {"model", req.model},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

Json UsageJson(const Usage& u) {
  Json j{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  if (u.kv_evicted_tokens) j["kv_evicted_tokens"] = *u.kv_evicted_tokens;
  return j;
}

Json LogprobsJson(bool chat, const Choice& c, size_t begin, size_t end,
                  const std::function<std::string(int32_t)>& piece, int64_t text_offset, bool with_prompt) {
  auto bytes = [](const std::string& s) {
    Json b = Json::array();
    for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
    return b;
  };
  end = std::min(end, std::min(c.tokens.size(), c.logprobs.size()));
  if (chat) {
    Json content = Json::array();
    for (size_t i = begin; i < end; ++i) {
      const std::string tok = piece(c.tokens[i]);
      Json top = Json::array();
      for (const auto& [id, lp] : c.logprobs[i].top) {
        const std::string t = piece(id);
        top.push_back({{"token", t}, {"logprob", lp}, {"bytes", bytes(t)}});
      }
      content.push_back({{"token", tok}, {"logprob", c.logprobs[i].logprob}, {"bytes", bytes(tok)}, {"top_logprobs", top}});
    }
    return Json{{"content", content}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  // The legacy shape's alternatives: {piece: logprob}, the chosen token among them.
  auto legacy_top = [&piece](const TokenLogprobs& lp, const std::string& tok) {
    Json alts = Json::object();
    for (const auto& [id, l] : lp.top) alts[piece(id)] = l;
    alts[tok] = lp.logprob;
    return alts;
  };
  if (with_prompt) {
    // Offsets counted back from the end of the echoed text: the pieces can hold more than the
    // text (SentencePiece's leading space of the first word), never less at its end.
    std::vector<std::string> pieces;
    int64_t total = 0;
    for (int32_t id : c.prompt_tokens) {
      pieces.push_back(piece(id));
      total += static_cast<int64_t>(pieces.back().size());
    }
    int64_t at = c.echo_bytes - total;
    for (size_t i = 0; i < c.prompt_tokens.size(); ++i) {
      const std::string& tok = pieces[i];
      tokens.push_back(tok);
      offsets.push_back(std::clamp<int64_t>(at, 0, c.echo_bytes));
      at += static_cast<int64_t>(tok.size());
      if (i == 0 || i - 1 >= c.prompt_logprobs.size()) {
        token_logprobs.push_back(nullptr);
        top.push_back(nullptr);
        continue;
      }
      const TokenLogprobs& lp = c.prompt_logprobs[i - 1];
      token_logprobs.push_back(lp.logprob);
      top.push_back(legacy_top(lp, tok));
    }
  }
  int64_t offset = text_offset;
  for (size_t i = begin; i < end; ++i) {
    const std::string tok = piece(c.tokens[i]);
    tokens.push_back(tok);
    token_logprobs.push_back(c.logprobs[i].logprob);
    top.push_back(legacy_top(c.logprobs[i], tok));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(tok.size());
  }
  return Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

Json CompletionResponse(const CompletionRequest& req, const std::string& id, int64_t created,
                        const std::vector<Choice>& choices, const Usage& usage,
                        const std::function<std::string(int32_t)>& piece) {
  Json out = {{"id", id},
              {"object", req.chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", req.model}};
  Json arr = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    Json c = {{"index", i}};
    const bool calls = !choices[i].tool_calls.empty();
    if (req.chat) {
      const bool null_content = (calls || choices[i].forced_calls) && choices[i].text.empty();
      c["message"] = {{"role", "assistant"}, {"content", null_content ? Json(nullptr) : Json(choices[i].text)}};
      if (!choices[i].reasoning.empty()) c["message"]["reasoning_content"] = choices[i].reasoning;
      if (calls) c["message"]["tool_calls"] = ToolCallsJson(choices[i].tool_calls, /*with_index=*/false);
    } else {
      c["text"] = choices[i].text;
    }
    c["logprobs"] = req.top_logprobs >= 0 ? LogprobsJson(req.chat, choices[i], 0, choices[i].tokens.size(), piece,
                                                         choices[i].echo_bytes, choices[i].echo_logprobs)
                                          : Json(nullptr);
    const bool ended = choices[i].finish_reason == FinishReason::kStop || choices[i].finish_reason == FinishReason::kEos;
    c["finish_reason"] = calls && ended ? "tool_calls" : FinishReasonForApi(choices[i].finish_reason);
    arr.push_back(std::move(c));
  }
  out["choices"] = std::move(arr);
  out["usage"] = UsageJson(usage);
  return out;
}

Json StreamChunk(const CompletionRequest& req, const std::string& id, int64_t created, int index,
                 const std::string& delta, std::optional<FinishReason> finish, bool first, Json logprobs) {
  Json c = {{"index", index}};
  if (req.chat) {
    Json d = Json::object();
    if (first) d["role"] = "assistant";
    if (!delta.empty() || (first && !finish)) d["content"] = delta;
    c["delta"] = std::move(d);
  } else {
    c["text"] = delta;
  }
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish ? Json(FinishReasonForApi(*finish)) : Json(nullptr);
  return Json{{"id", id},
              {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", req.model},
              {"choices", Json::array({c})}};
}

Json ToolCallsJson(const std::vector<ToolCall>& calls, bool with_index) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json c = Json::object();
    if (with_index) c["index"] = i;
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

Json ChatDeltaChunk(const CompletionRequest& req, const std::string& id, int64_t created, int index, Json delta,
                    std::optional<FinishReason> finish, bool tool_calls_finish) {
  Json c = {{"index", index}, {"delta", std::move(delta)}, {"logprobs", nullptr}};
  c["finish_reason"] = !finish ? Json(nullptr) : tool_calls_finish ? Json("tool_calls") : Json(FinishReasonForApi(*finish));
  return Json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", req.model},
              {"choices", Json::array({c})}};
}

Json UsageChunk(const CompletionRequest& req, const std::string& id, int64_t created, const Usage& usage) {
  return Json{{"id", id},
              {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", req.model},
              {"choices", Json::array()},
              {"usage", UsageJson(usage)}};
}

}  // namespace gale::server
