// The OpenAI API's JSON, both ways: a request body -> what to generate (or a precise 400), and
// engine results -> completion, chat completion, their streaming chunks, and error bodies.
// Pure functions; no sockets and no engine here.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/compiler.h"
#include "kv/retention.h"
#include "engine/api.h"
#include "server/tool_calls.h"

namespace gale::server {

using Json = nlohmann::ordered_json;

// Deepest nesting of arrays and objects a request body may have (tool schemas included): far past
// what real clients send, well inside what the recursive walks over it (copies, templates) take.
inline constexpr int kMaxRequestDepth = 64;

// max_tokens of a completions request that does not set it (OpenAI's default).
inline constexpr int64_t kCompletionsDefaultMaxTokens = 16;

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, if any
};

// A 400 naming the offending field (param; "" for the body as a whole).
ApiError BadRequest(const std::string& param, const std::string& message);

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
std::string ErrorBody(const ApiError& e);

// A request body as a JSON object (valid JSON, an object, nested at most kMaxRequestDepth deep),
// or a 400 saying which it is not.
std::variant<Json, ApiError> ParseRequestObject(const std::string& body);

struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::vector<std::string> prompts;           // completions: one text per prompt
  std::vector<std::vector<int32_t>> prompt_ids;  // completions given as token ids (instead of text)
  Json messages;                               // chat
  Json tools;                                  // chat: passed to the template when present
  // chat: "auto" (calls are parsed from the output), "none" (tools are not shown to the model),
  // "required" (the output is one or more calls), or "function" (one call of tool_choice_name).
  std::string tool_choice = "auto";
  std::string tool_choice_name;
  bool parallel_tool_calls = true;
  Json chat_template_kwargs;                   // chat: extra template variables
  int64_t max_tokens = 0;                      // 0: all that fits (chat's default); parsing sets completions'
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  // Special-token texts in the request become those tokens: chat message strings default to no
  // (they stay text), a completion prompt to yes.
  bool parse_special = false;
  SamplingParams sampling;
  bool has_seed = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int64_t truncate_prompt_tokens = -1;         // > 0: keep at most this many prompt tokens (head + tail)
  std::string cache_salt;
  int top_logprobs = -1;                       // -1: no logprobs; k >= 0: with k alternatives per token
  // gale's extension: "kv_retention" (policy), "kv_budget" (tokens) or "kv_budget_ratio",
  // "kv_sink_tokens"; unset: the server's --kv-retention.
  std::optional<RetentionConfig> retention;
  // Structured output: response_format json_object / json_schema, vLLM's guided_* and
  // structured_outputs, llama.cpp's grammar / json_schema (at most one of them).
  std::optional<grammar::Constraint> constraint;
  std::string constraint_param;                // the field it came from (for errors)
  std::vector<std::string> ignored_fields;     // unknown fields, ignored (not with strict parsing)
  // /v1/embeddings: prompts / prompt_ids hold the inputs; vectors as base64 of float32s or floats.
  bool embeddings = false;
  bool base64 = false;
};

// Parses and validates a request body for /v1/completions (chat = false) or /v1/chat/completions.
// Wrong types and out-of-range values are 400 errors naming the field. Unknown fields are listed
// in ignored_fields (as vLLM and llama-server ignore them: SDKs and agent frameworks send fields
// a server may not know), or with strict = true are 400 errors too.
std::variant<CompletionRequest, ApiError> ParseCompletionRequest(const std::string& body, bool chat, bool strict = false);

// The structured-output fields of a body (response_format, guided_json / _regex / _choice /
// _grammar, structured_outputs, grammar, json_schema) into r->constraint; at most one may be set.
std::optional<ApiError> ParseConstraintFields(const Json& body, CompletionRequest* r);

// /v1/embeddings: "input" (a string, strings, token ids or lists of them; at most 2,048),
// "encoding_format" float | base64, "dimensions" (only the model's own size; gale truncates
// nothing), "model", "user". Errors are 400s naming the field.
std::variant<CompletionRequest, ApiError> ParseEmbeddingRequest(const std::string& body, int64_t dim, bool strict = false);
// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}.
Json EmbeddingResponse(const CompletionRequest& req, const std::vector<std::vector<float>>& embeddings,
                       int64_t prompt_tokens);

const char* FinishReasonForApi(FinishReason r);  // "stop" (eos and stop strings), "length", ...

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::optional<int64_t> kv_evicted_tokens;  // set when a request used KV retention
};
Json UsageJson(const Usage& u);

struct Choice {
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<int32_t> tokens;          // generated (for logprobs)
  std::vector<TokenLogprobs> logprobs;  // [tokens] when asked for
  // Completions with echo and logprobs: the prompt's tokens and their log-probabilities
  // ([prompt_tokens - 1]: the first token has none), and the bytes of echoed text before the
  // generated text.
  bool echo_logprobs = false;
  std::vector<int32_t> prompt_tokens;
  std::vector<TokenLogprobs> prompt_logprobs;
  int64_t echo_bytes = 0;
  // Chat with tools or a reasoning model: the message taken apart (text then holds the content).
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool forced_calls = false;  // tool_choice required or named: the answer is calls, content null
  std::string stop_string;    // the stop string that ended it ("" for none)
  std::vector<float> embedding;  // /v1/embeddings
};

// A choice's "logprobs" object for tokens [begin, end) of it: chat ({"content": [...]}) or
// completions ({"tokens", "token_logprobs", "top_logprobs", "text_offset"}) shape. piece gives a
// token's text; text_offset is where token `begin` starts in the choice's text. with_prompt
// (completions with echo): the prompt's tokens come first, the first with a null log-probability
// (as vLLM and OpenAI's legacy API give them), at offsets that end where the echoed text ends.
Json LogprobsJson(bool chat, const Choice& c, size_t begin, size_t end,
                  const std::function<std::string(int32_t)>& piece, int64_t text_offset, bool with_prompt = false);

// A whole (non-streamed) response.
Json CompletionResponse(const CompletionRequest& req, const std::string& id, int64_t created,
                        const std::vector<Choice>& choices, const Usage& usage,
                        const std::function<std::string(int32_t)>& piece);
// One streamed chunk: a text delta for choice `index`, or (finish set) its end.
Json StreamChunk(const CompletionRequest& req, const std::string& id, int64_t created, int index,
                 const std::string& delta, std::optional<FinishReason> finish, bool first,
                 Json logprobs = nullptr);
// A chat chunk with this delta object ({"reasoning_content": ...}, {"tool_calls": [...]}).
Json ChatDeltaChunk(const CompletionRequest& req, const std::string& id, int64_t created, int index, Json delta,
                    std::optional<FinishReason> finish, bool tool_calls_finish = false);
// tool_calls entries of a message ({"id", "type": "function", "function": {"name", "arguments"}});
// streamed deltas carry their index too.
Json ToolCallsJson(const std::vector<ToolCall>& calls, bool with_index);

// The usage chunk of stream_options.include_usage: no choices.
Json UsageChunk(const CompletionRequest& req, const std::string& id, int64_t created, const Usage& usage);

}  // namespace gale::server
