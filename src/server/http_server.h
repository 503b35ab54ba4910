// `gale serve`'s HTTP side: Boost.Beast on Asio, asynchronous (a few threads serve any number of
// idle or streaming connections). Routes the OpenAI endpoints to the engine, streams Server-Sent
// Events, cancels a request whose client disconnects mid-stream, and answers /health, /v1/models
// and /metrics. Tokenization and chat templates run here, never on the engine thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/api.h"
#include "grammar/compiler.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "server/metrics.h"
#include "server/ollama_api.h"
#include "server/tool_calls.h"

namespace gale::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;              // 0: any free port (see HttpServer::port)
  int num_threads = 2;               // I/O threads
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  // Non-empty: every API route (/v1/*, /api/*, /tokenize, /detokenize) and /metrics need one of
  // these as "Authorization: Bearer <key>" or "x-api-key: <key>" (server/api_keys.h).
  std::vector<std::string> api_keys;
  bool metrics_public = false;       // /metrics answers without a key even when keys are set
  // Sequences (prompts x n of every request) waiting beyond the engine's batch; past this: 429
  // with Retry-After. A request asking for more than max_batch_size + max_waiting at once: 400.
  int64_t max_waiting = 512;
  // Tokens of work (prompt + max_tokens of every sequence) in flight; past this: 429, and a request
  // over it alone: 400. 0: no limit (sequences and the per-request token limit bound it).
  int64_t max_waiting_tokens = 0;
  int num_work_threads = 2;          // parse, render and tokenize requests off the I/O threads
  int num_compile_threads = 1;       // compile output constraints (grammar::GrammarCompiler)
  // An idle kept-alive connection, a request whose header and body have not all arrived, or an
  // answer the client does not read, is closed after this (preparing and generating take as long
  // as they take).
  std::chrono::seconds idle_timeout{30};
  // Open connections beyond this are answered 503 and closed (0: no cap).
  int64_t max_connections = 4096;
  bool strict_api = false;           // unknown request fields are 400 errors instead of ignored
  // Browsers' cross-origin requests: origins allowed ("*" any), empty: no CORS headers at all.
  std::vector<std::string> cors_origins;
};

// What is served, once the model is loaded and warmed up. Until then /health and /v1/* answer 503.
struct ServingState {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: /v1/chat/completions answers 400
  grammar::GrammarCompiler* grammars = nullptr;  // null: structured outputs answer 400
  ToolCallFormat tool_format = ToolCallFormat::kHermes;  // how the model writes tool calls
  // How the model marks its reasoning (returned as reasoning_content), if it does.
  std::optional<ReasoningMarkers> reasoning;
  Pooling pooling = Pooling::kNone;  // /v1/embeddings pools hidden states this way; kNone: 400
  int64_t embedding_dim = 0;         // the model's hidden size
  std::string model_name;
  int64_t created = 0;  // unix seconds, for /v1/models
  OllamaModel ollama;   // what Ollama's /api/tags, /api/show and /api/ps say of the model
};

class HttpServer {
 public:
  explicit HttpServer(const ServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads.
  Status Start();
  uint16_t port() const;
  void SetReady(const ServingState& state);

  // Graceful stop: no new connections; then waits for requests in flight (up to timeout) and
  // returns how many were still running.
  int64_t Drain(std::chrono::milliseconds timeout);
  // Stops the I/O threads (in-flight connections are dropped).
  void Stop();

  Metrics& metrics();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gale::server
