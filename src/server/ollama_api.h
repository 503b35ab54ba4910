// Ollama's API (/api/chat, /api/generate, /api/embed and /api/embeddings, /api/tags, /api/show,
// /api/ps, /api/version) as a translation layer over the chat, completions and embeddings paths:
// an Ollama body becomes an OpenAI body (messages, prompt, options, format, tools, think), and the
// result becomes Ollama's JSON, streamed as newline-delimited JSON (Ollama streams by default).
// Errors are {"error": "..."}. Pure functions; no sockets, no engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "server/openai_api.h"
#include "server/tool_calls.h"

namespace gale::server {

// What the info endpoints say of the served model.
struct OllamaModel {
  std::string name;          // as served (clients may add ":latest")
  std::string architecture;  // general.architecture
  std::string quantization;  // the type of most of the weights ("Q4_0", "F16", ...)
  int64_t parameters = 0;
  int64_t file_bytes = 0;
  int64_t context_length = 0;
  bool chat = false;         // a chat template is loaded
  bool tools = false;        // ... and it writes tool calls
  bool thinking = false;     // ... and its model reasons
  bool embedding = false;    // /api/embed is served
  std::string template_source;
  int64_t loaded_at = 0;     // unix seconds
};

enum class OllamaEndpoint { kChat, kGenerate, kEmbed, kEmbeddings };

// Whether `model` (a request's) names the served model: the name, or the name with ":latest".
bool OllamaModelMatches(const std::string& model, const OllamaModel& served);

// The OpenAI body (chat completions for /api/chat and /api/generate, completions for a raw
// generate, embeddings for /api/embed and /api/embeddings) for an Ollama body, or a 400 (404 for
// another model). stream: whether the answer streams (Ollama's default is yes).
struct OllamaRequest {
  std::string model;    // as the request names it (answers echo it)
  Json body;
  bool chat = true;     // the body is a chat completions body (else completions or embeddings)
  bool stream = true;
  bool load_only = false;  // /api/generate or /api/chat without a prompt or messages: just "load"
  // A raw generate without num_predict: all that fits (the completions body cannot say so; the
  // server sets it on the parsed request).
  bool all_that_fits = false;
};
std::variant<OllamaRequest, ApiError> OllamaToOpenAi(OllamaEndpoint endpoint, const std::string& body, const OllamaModel& served);

std::string OllamaErrorBody(const std::string& message);

// Timings an answer reports, in nanoseconds.
struct OllamaTimings {
  int64_t total_ns = 0, prompt_ns = 0, eval_ns = 0;
};

// One streamed line (newline-terminated): a chat message delta (content, thinking, whole tool
// calls) or a generate response delta.
std::string OllamaDeltaLine(OllamaEndpoint endpoint, const std::string& model, const std::string& content,
                            const std::string& thinking, const std::vector<ToolCall>& calls);
// The final object (streamed: the last line, with empty deltas; otherwise the whole answer).
Json OllamaFinal(OllamaEndpoint endpoint, const std::string& model, const Choice& c, const Usage& usage,
                 const OllamaTimings& t, bool whole);
// /api/embed's and /api/embeddings' answers.
Json OllamaEmbedResponse(OllamaEndpoint endpoint, const std::string& model, const std::vector<std::vector<float>>& embeddings,
                         int64_t prompt_tokens, const OllamaTimings& t);

// The info endpoints.
Json OllamaTags(const OllamaModel& m);
Json OllamaPs(const OllamaModel& m);
Json OllamaShow(const OllamaModel& m);

}  // namespace gale::server
