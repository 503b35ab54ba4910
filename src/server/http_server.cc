// Beast sessions: read a request, route it, write the response or stream SSE chunks as the engine
// pushes tokens. Each connection runs on its own strand; the engine's stream notifications are
// posted onto that strand, so nothing here blocks and nothing races.
#include "server/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <variant>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "server/api_keys.h"
#include "base/memory.h"
#include "jinja/value.h"
#include "server/anthropic_api.h"
#include "server/ollama_api.h"
#include "server/openai_api.h"
#include "server/responses_api.h"

namespace gale::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// NOTE: handlers and sessions refer to the Impl by raw pointer: they live inside its io_context,
// which the Impl destroys (and them with it) before it goes; a shared_ptr would be a cycle.
struct HttpServer::Impl {
  ServerOptions opt;
  ResponseStore responses;  // the Responses API's stored responses (bounded, expiring)
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  // Parsing, template rendering and tokenization run here, never on the I/O threads, so a few
  // large bodies cannot stall /health, /metrics or other connections. NOTE: its threads run at a
  // lower scheduling priority (nice +5): on a machine with few cores, bodies being prepared must
  // not take the CPU from the I/O threads either.
  net::io_context work;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_guard;
  std::vector<std::thread> work_threads;
  // Large bodies (past kBulkBodyBytes: a long document, a 7 MB prompt) are prepared on a lane of
  // their own, so that a burst of them never queues a small request behind seconds of parsing and
  // tokenizing.
  static constexpr size_t kBulkBodyBytes = size_t{256} << 10;
  net::io_context bulk;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> bulk_guard;
  std::vector<std::thread> bulk_threads;
  net::io_context& LaneFor(size_t body_bytes) { return body_bytes > kBulkBodyBytes ? bulk : work; }
  std::atomic<int64_t> connections{0};  // open sessions (ServerOptions::max_connections)
  // Constraint compilation (bounded by the compiler's time limit) runs on threads of its own, at
  // a lower priority still (nice +10): a client's costly schema waits for other compilations, not
  // other requests.
  net::io_context compile;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> compile_guard;
  std::vector<std::thread> compile_threads;
  std::atomic<bool> accepting{true};
  std::atomic<int64_t> in_flight{0};       // generation requests being prepared or served
  std::atomic<int64_t> in_flight_seqs{0};  // their sequences (prompts x n) in the engine
  std::atomic<int64_t> in_flight_tokens{0};  // their tokens of work (prompt + max_tokens each)
  Metrics metrics;
  std::mutex state_mu;
  std::shared_ptr<const ServingState> state;  // null until ready
  std::atomic<uint64_t> next_id{1};

  // Memory back to the system 100 ms after the last request in flight ends, or the last one with
  // a large body (debounced): a burst's bodies, parses and grammars are freed by then, whichever
  // thread freed them, and a long generation elsewhere does not keep them.
  std::atomic<int64_t> bulk_in_flight{0};  // those of them with a body past kBulkBodyBytes
  net::strand<net::io_context::executor_type> release_strand{work.get_executor()};
  net::steady_timer release_timer{release_strand};
  void RequestEnded(bool bulk) {
    const bool last_bulk = bulk && --bulk_in_flight == 0;
    if (--in_flight != 0 && !last_bulk) return;
    net::post(release_strand, [this] {
      release_timer.expires_after(std::chrono::milliseconds(100));
      release_timer.async_wait([this](boost::system::error_code ec) {
        if (!ec && (in_flight.load() == 0 || bulk_in_flight.load() == 0)) ReleaseFreeMemory();
      });
    });
  }

  std::shared_ptr<const ServingState> Ready() {
    std::lock_guard<std::mutex> lock(state_mu);
    return state;
  }
  void Accept();
};

namespace {

using Request = http::request<http::string_body>;

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr size_t kMaxTargetBytes = 8 * 1024;

// A request, parsed and turned into prompts off the I/O threads (or why it cannot run).
struct Prepared {
  CompletionRequest req;
  std::vector<std::vector<int32_t>> prompts;  // token ids, one per prompt (a chat is one)
  std::vector<std::string> prompt_texts;      // [prompts], for echo
  // The output's constraint, if any: compiled on the compile threads after preparation.
  std::optional<grammar::Constraint> constraint;
  std::string constraint_param;  // the request field it came from, for errors
  std::shared_ptr<const grammar::CompiledGrammar> grammar;  // compiled
  bool parse_tools = false;      // take tool calls out of the output
  bool starts_thinking = false;  // the prompt opened a reasoning block
  bool anthropic = false;        // a Messages API request (its answer in Anthropic's shape)
  std::shared_ptr<const ResponsesRequest> responses;  // a Responses API request, translated
  std::optional<OllamaEndpoint> ollama;  // an Ollama API request (its answer in Ollama's shape)
  std::string ollama_model;              // ... the model it named (echoed)
};

// Messages as templates expect them: an assistant's tool call arguments as objects (templates
// write them with tojson; the API carries them as JSON text), as vLLM passes them.
Json TemplateMessages(const Json& messages) {
  Json out = messages;
  for (auto& m : out) {
    if (!m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& call : m["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      Json& fn = call["function"];
      if (fn.contains("arguments") && fn["arguments"].is_string()) {
        Json args = Json::parse(fn["arguments"].get<std::string>(), nullptr, false);
        if (args.is_object() && !jinja::JsonDeeperThan(args, kMaxRequestDepth)) fn["arguments"] = std::move(args);
      }
    }
  }
  return out;
}

// The chat template over the messages, with the tokenizer's BOS and EOS texts.
StatusOr<std::string> RenderChat(const ServingState& state, const Json& messages, bool add_generation_prompt,
                                 const Json& extra, bool parse_special = false) {
  const Tokenizer& tok = *state.tokenizer;
  const std::string bos = tok.bos_id() >= 0 ? tok.TokenText(tok.bos_id()) : "";
  const std::string eos = tok.eos_id() >= 0 ? tok.TokenText(tok.eos_id()) : "";
  // Strings from the request stay text where they spell a special token (see
  // MarkLiteralSpecialTexts), unless the caller asked for them to be parsed.
  auto request = [&](const Json& v) { return parse_special ? v : MarkLiteralSpecialTexts(tok, v); };
  return state.chat_template->Apply(request(TemplateMessages(messages)), add_generation_prompt, bos, eos, request(extra));
}

// Says once per field name (not per request) that a field was ignored.
void LogIgnoredFields(const std::vector<std::string>& fields) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& f : fields) {
    if (said.size() < 256 && said.insert(f).second) {
      std::fprintf(stderr, "note: ignoring the unknown request field '%s' (--strict-api refuses such requests)\n", f.c_str());
    }
  }
}

// A prompt of `bytes` bytes that cannot fit the per-request limit whatever it tokenizes to (each
// token stands for at most Tokenizer::max_token_bytes() bytes): refused before tokenizing it, so a
// 7 MB prompt costs no seconds of a request thread. Truncation and KV retention make the limit
// another: then the prompt is tokenized as usual.
std::optional<ApiError> CertainlyTooLong(const CompletionRequest& req, const ServingState& state, size_t bytes) {
  // Short prompts cost nothing to tokenize: the engine's own check says what is wrong with them.
  if (bytes < (size_t{64} << 10)) return std::nullopt;
  if (req.truncate_prompt_tokens > 0 || req.retention || state.engine->config().retention.active()) return std::nullopt;
  const int64_t limit = state.engine->max_request_tokens();
  const int64_t at_least = static_cast<int64_t>(bytes / state.tokenizer->max_token_bytes());
  const int64_t out = std::max<int64_t>(req.max_tokens, 1);
  if (at_least + out <= limit) return std::nullopt;
  return ApiError{400, fmt::format("the prompt's {} bytes are at least {} tokens, and with max_tokens {} that exceeds "
                                   "the limit of {} tokens per request; shorten it, lower max_tokens, or set "
                                   "truncate_prompt_tokens", bytes, at_least, req.max_tokens, limit),
                  "invalid_request_error", req.chat ? "messages" : "prompt"};
}

// kind: 0 completions, 1 chat, 2 embeddings.
std::variant<Prepared, ApiError> PrepareUnguarded(const std::string& body, int kind, const ServingState& state, bool strict);

// Runs on the work pool: whatever goes wrong (an exhausted allocation) is this request's 500,
// never an exception through a server thread.
std::variant<Prepared, ApiError> Prepare(const std::string& body, int kind, const ServingState& state, bool strict) {
  try {
    return PrepareUnguarded(body, kind, state, strict);
  } catch (const std::bad_alloc&) {
    return ApiError{500, "out of memory while preparing the request", "server_error", ""};
  } catch (const std::exception& e) {
    return ApiError{500, fmt::format("preparing the request failed: {}", e.what()), "server_error", ""};
  }
}

// A constraint compiled on the compile threads: an exhausted allocation is this request's 400
// (the constraint asked for more than the server has), never an exception through a thread.
StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> CompileGuarded(grammar::GrammarCompiler& compiler,
                                                                         const grammar::Constraint& c) {
  try {
    return compiler.Compile(c);
  } catch (const std::bad_alloc&) {
    return InvalidArgument("the constraint needs more memory to compile than the server has");
  } catch (const std::exception& e) {
    return InvalidArgument("compiling the constraint failed: {}", e.what());
  }
}

std::variant<Prepared, ApiError> PrepareUnguarded(const std::string& body, int kind, const ServingState& state, bool strict) {
  if (kind == 2 && state.pooling == Pooling::kNone) {
    return ApiError{400, "this model has no pooling type (it is not an embedding model); start gale serve with "
                         "--pooling mean|cls|last to pool its hidden states", "invalid_request_error", ""};
  }
  auto parsed = kind == 2 ? ParseEmbeddingRequest(body, state.embedding_dim, strict) : ParseCompletionRequest(body, kind == 1, strict);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  Prepared p;
  p.req = std::move(std::get<CompletionRequest>(parsed));
  CompletionRequest& req = p.req;
  LogIgnoredFields(req.ignored_fields);
  if (req.constraint) {
    if (state.grammars == nullptr) return ApiError{400, "structured outputs are not available on this server", "invalid_request_error", req.constraint_param};
    p.constraint = *req.constraint;
    p.constraint_param = req.constraint_param;
  }
  const Tokenizer& tok = *state.tokenizer;
  if (!req.model.empty() && req.model != state.model_name) {
    return ApiError{404, fmt::format("model '{}' does not exist; this server has '{}'", req.model, state.model_name),
                    "not_found_error", "model"};
  }
  req.model = state.model_name;
  for (int32_t id : req.stop_token_ids) {
    if (id >= tok.vocab_size()) {
      return ApiError{400, fmt::format("stop token id {} outside the vocabulary [0, {})", id, tok.vocab_size()),
                      "invalid_request_error", "stop_token_ids"};
    }
  }
  if (req.chat) {
    if (state.chat_template == nullptr) {
      return ApiError{400, "this model has no chat template; start the server with --chat-template FILE",
                      "invalid_request_error", ""};
    }
    Json extra = req.chat_template_kwargs.is_object() ? req.chat_template_kwargs : Json::object();
    // tool_choice none: the model is not shown the tools, so it does not call them.
    const bool tools = req.tools.is_array() && !req.tools.empty() && req.tool_choice != "none";
    if (tools) extra["tools"] = req.tools;
    p.parse_tools = tools;
    if (tools && (req.tool_choice == "required" || req.tool_choice == "function")) {
      if (req.constraint) {
        return ApiError{400, fmt::format("tool_choice {} and '{}' both constrain the output; give one", req.tool_choice,
                                         req.constraint_param), "invalid_request_error", "tool_choice"};
      }
      if (state.grammars == nullptr) return ApiError{400, "tool_choice required needs structured outputs, not available here", "invalid_request_error", "tool_choice"};
      auto gbnf = ToolCallGrammar(state.tool_format, req.tools, req.tool_choice_name, req.parallel_tool_calls,
                                  [&tok](std::string_view text) { return tok.TokenId(text); });
      if (!gbnf.ok()) return ApiError{400, gbnf.status().message(), "invalid_request_error", "tools"};
      p.constraint = grammar::Constraint{grammar::Constraint::Kind::kGbnf, *gbnf, ""};
      p.constraint_param = "tools";
    }
    auto text = RenderChat(state, req.messages, /*add_generation_prompt=*/true, extra, req.parse_special);
    if (!text.ok()) return ApiError{400, text.status().message(), "invalid_request_error", "messages"};
    const std::string shown = StripLiteralMarks(*text);
    if (state.reasoning) {
      const std::string_view open = state.reasoning->open;
      const size_t end = shown.find_last_not_of(" \n\t\r");
      p.starts_thinking = end != std::string::npos && end + 1 >= open.size() && shown.compare(end + 1 - open.size(), open.size(), open) == 0;
    }
    // The template opened a think block (thinking on, as the template and enable_thinking say):
    // the model thinks freely, and the constraint (JSON, the forced call) applies to the answer
    // after it, which then comes back as content or tool_calls, not inside reasoning_content.
    if (p.starts_thinking && p.constraint) p.constraint->after = state.reasoning->close;
    if (auto e = CertainlyTooLong(req, state, text->size())) return *e;
    p.prompts.push_back(TokenizeChatPrompt(tok, *text));
    p.prompt_texts.push_back(shown);
  } else {
    for (const auto& prompt : req.prompts) {
      if (auto e = CertainlyTooLong(req, state, prompt.size())) return *e;
      p.prompts.push_back(tok.Encode(prompt, /*add_special=*/true, req.parse_special));
      p.prompt_texts.push_back(prompt);
    }
    for (const auto& ids : req.prompt_ids) {
      p.prompts.push_back(ids);
      p.prompt_texts.push_back(tok.Decode(ids));
    }
  }
  return p;
}

// /tokenize and /detokenize, in llama-server's shape ({"content"} -> {"tokens"}, {"tokens"} ->
// {"content"}) and vLLM's ({"prompt"} or {"messages"} -> {"tokens", "count", "max_model_len"},
// {"tokens"} -> {"prompt"}): both answers carry both sets of keys.
std::variant<Json, ApiError> TokenizeRequest(const std::string& body, bool detokenize, const ServingState& state) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return ApiError{400, "the request body must be a JSON object", "invalid_request_error", ""};
  if (jinja::JsonDeeperThan(j, kMaxRequestDepth)) return ApiError{400, "the request body nests too deep", "invalid_request_error", ""};
  const Tokenizer& tok = *state.tokenizer;
  auto flag = [&](const char* k, bool dflt) -> std::optional<bool> {
    if (!j.contains(k) || j[k].is_null()) return dflt;
    if (!j[k].is_boolean()) return std::nullopt;
    return j[k].get<bool>();
  };
  if (detokenize) {
    if (!j.contains("tokens") || !j["tokens"].is_array()) return ApiError{400, "'tokens' (an array of token ids) is required", "invalid_request_error", "tokens"};
    std::vector<int32_t> ids;
    for (const auto& t : j["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size()) {
        return ApiError{400, fmt::format("token {} is not in the vocabulary [0, {})", t.dump(), tok.vocab_size()), "invalid_request_error", "tokens"};
      }
      ids.push_back(t.get<int32_t>());
    }
    std::string text;
    for (int32_t id : ids) text += tok.TokenToPiece(id);
    return Json{{"content", text}, {"prompt", text}};
  }
  std::vector<int32_t> ids;
  if (j.contains("messages")) {
    if (state.chat_template == nullptr) return ApiError{400, "this model has no chat template", "invalid_request_error", "messages"};
    if (!j["messages"].is_array()) return ApiError{400, "'messages' must be an array", "invalid_request_error", "messages"};
    const auto gen = flag("add_generation_prompt", true);
    if (!gen) return ApiError{400, "'add_generation_prompt' must be true or false", "invalid_request_error", "add_generation_prompt"};
    auto text = RenderChat(state, j["messages"], *gen, Json::object());
    if (!text.ok()) return ApiError{400, text.status().message(), "invalid_request_error", "messages"};
    ids = TokenizeChatPrompt(tok, *text);
  } else {
    const char* key = j.contains("content") ? "content" : "prompt";
    if (!j.contains(key) || !j[key].is_string()) return ApiError{400, "'content' (or 'prompt'), a string, is required", "invalid_request_error", "content"};
    // llama-server adds no special tokens unless asked; vLLM adds them unless told not to.
    const auto add = j.contains("add_special") ? flag("add_special", false) : flag("add_special_tokens", std::string(key) == "prompt");
    const auto special = flag("parse_special", true);
    if (!add || !special) return ApiError{400, "add_special / add_special_tokens / parse_special must be true or false", "invalid_request_error", ""};
    ids = tok.Encode(j[key].get<std::string>(), *add, *special);
  }
  const auto pieces = flag("with_pieces", false);
  if (!pieces) return ApiError{400, "'with_pieces' must be true or false", "invalid_request_error", "with_pieces"};
  Json tokens = Json::array();
  for (int32_t id : ids) {
    if (*pieces) {
      tokens.push_back({{"id", id}, {"piece", tok.TokenToPiece(id)}});
    } else {
      tokens.push_back(id);
    }
  }
  return Json{{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", state.engine->max_request_tokens()}};
}

// Whether the peer has closed its end (EOF or an error), without taking any byte it sent.
bool PeerClosed(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// A request the engine ended with an error: the client's (a constraint its output could not
// follow: 400, param response_format) or the server's (500).
ApiError EngineError(const Status& error, bool request_error, const std::string& constraint_param) {
  if (request_error) return {400, error.message(), "invalid_request_error", constraint_param};
  return {500, error.message(), "server_error", ""};
}

std::string RandomHex() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{:016x}", rng());
}

// One generation (all choices of one API request) in flight on a session.
struct Generation {
  CompletionRequest req;
  std::string id;
  int64_t created = 0;
  std::vector<std::shared_ptr<RequestStream>> streams;  // [choices]
  std::vector<Choice> choices;
  std::vector<bool> done, started;
  std::vector<int64_t> generated, prompt_tokens, cached_tokens, evicted_tokens;
  bool retained = false;  // a request used KV retention
  std::vector<std::string> echo_prefix;  // completions with echo: the prompt text, sent first
  std::vector<std::vector<int32_t>> echo_tokens;  // echo with logprobs: the prompt's tokens
  std::vector<std::optional<MessageStream>> messages;  // [choices] chat with tools or reasoning
  std::vector<std::vector<std::string>> call_ids;      // [choices][call index] streamed calls' ids
  bool final_sent = false;
  std::optional<AnthropicEvents> anthropic;  // a Messages API request's (streamed or not)
  std::shared_ptr<const ResponsesRequest> responses;  // a Responses API request's
  std::optional<ResponsesEvents> responses_events;    // ... when streamed
  std::optional<OllamaEndpoint> ollama;               // an Ollama API request's endpoint
  std::string ollama_model;
  const Tokenizer* tok = nullptr;
  std::string constraint_param;  // the request field its output constraint came from
  std::string Piece(int32_t id) const { return tok->TokenToPiece(id); }
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl* server)
      : stream_(std::move(socket)), server_(server), watch_timer_(stream_.get_executor()) {
    ++server_->connections;
  }
  ~Session() { --server_->connections; }

  void Run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->DoRead(); });
  }

 private:
  void DoRead() {
    parser_.emplace();
    parser_->body_limit(server_->opt.max_body_bytes);
    parser_->header_limit(kMaxHeaderBytes);
    stream_.expires_after(server_->opt.idle_timeout);
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->OnRead(ec);
    });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      return SendError(ApiError{413, fmt::format("request body over the limit of {} bytes",
                                                 server_->opt.max_body_bytes), "invalid_request_error", ""},
                       /*close=*/true);
    }
    if (ec == http::error::header_limit) {
      // The parser takes the request line as soon as it has it: without one, the URL is too long.
      if (parser_->get().target().empty()) {
        return SendError(ApiError{414, fmt::format("request URL over {} bytes", kMaxHeaderBytes), "invalid_request_error", ""},
                         /*close=*/true);
      }
      return SendError(ApiError{431, fmt::format("request header fields over {} bytes", kMaxHeaderBytes),
                                "invalid_request_error", ""},
                       /*close=*/true);
    }
    if (ec == http::error::end_of_stream || ec) return Close();
    // The idle timeout covers waiting for a request, not preparing it: a constraint may compile
    // for seconds, and an answer must not find its connection timed out.
    stream_.expires_never();
    Request req = parser_->release();
    keep_alive_ = req.keep_alive();
    Route(std::move(req));
  }

  void Close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.close();
  }

  void Send(http::status status, const std::string& content_type, std::string body, bool close = false,
            const std::string& retry_after = "") {
    server_->metrics.HttpResponse(static_cast<int>(status));
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "gale");
    res->set(http::field::content_type, content_type);
    if (!retry_after.empty()) res->set(http::field::retry_after, retry_after);
    Cors(*res);
    res->keep_alive(keep_alive_ && !close);
    res->body() = std::move(body);
    res->prepare_payload();
    stream_.expires_after(server_->opt.idle_timeout);  // a client that stops reading
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      if (ec || !res->keep_alive()) return self->Close();
      self->DoRead();
    });
  }

  // The request's Origin when --cors-origins allows it ("" otherwise).
  std::string AllowedOrigin(const Request& req) const {
    const auto origin = req[http::field::origin];
    if (origin.empty() || server_->opt.cors_origins.empty()) return "";
    for (const auto& o : server_->opt.cors_origins) {
      if (o == "*" || o == origin) return std::string(origin);
    }
    return "";
  }

  template <typename Response>
  void Cors(Response& res) const {
    if (cors_origin_.empty()) return;
    res.set(http::field::access_control_allow_origin, cors_origin_);
    res.set(http::field::vary, "Origin");
  }

  void SendJson(const Json& j) { Send(http::status::ok, "application/json", JsonText(j)); }

  void SendError(const ApiError& e, bool close = false, const std::string& retry_after = "") {
    Send(static_cast<http::status>(e.status), "application/json",
         anthropic_ ? AnthropicErrorBody(e) : ollama_ ? OllamaErrorBody(e.message) : ErrorBody(e), close, retry_after);
  }

  void Route(Request req) {
    if (req.target().size() > kMaxTargetBytes) {
      return SendError({414, fmt::format("request URL over {} bytes", kMaxTargetBytes), "invalid_request_error", ""},
                       /*close=*/true);
    }
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    const bool messages = path == "/v1/messages", count_tokens = path == "/v1/messages/count_tokens";
    anthropic_ = messages || count_tokens;  // errors in Anthropic's shape
    ollama_ = path.rfind("/api/", 0) == 0;  // ... in Ollama's
    const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
    cors_origin_ = AllowedOrigin(req);
    if (req.method() == http::verb::options && !cors_origin_.empty()) {
      // A browser's preflight: no API key is sent with it.
      auto res = std::make_shared<http::response<http::string_body>>(http::status::no_content, 11);
      res->set(http::field::server, "gale");
      Cors(*res);
      res->set(http::field::access_control_allow_methods, "GET, POST, DELETE, OPTIONS");
      const auto asked = req[http::field::access_control_request_headers];
      res->set(http::field::access_control_allow_headers, asked.empty() ? "Authorization, Content-Type" : std::string(asked));
      res->set(http::field::access_control_max_age, "600");
      res->keep_alive(keep_alive_);
      res->prepare_payload();
      server_->metrics.HttpResponse(204);
      return http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
        if (ec || !res->keep_alive()) return self->Close();
        self->DoRead();
      });
    }
    auto state = server_->Ready();
    if (path == "/health") {
      if (!get) return SendError({405, "use GET", "invalid_request_error", ""});
      if (!state) return Send(http::status::service_unavailable, "application/json", R"({"status":"loading"})");
      return Send(http::status::ok, "application/json", R"({"status":"ok"})");
    }
    // OpenAI's clients send the key as a bearer token, Anthropic's as x-api-key.
    const auto sv = [](beast::string_view v) { return std::string_view(v.data(), v.size()); };
    const std::string_view auth = sv(req[http::field::authorization]);
    const std::string_view bearer = auth.starts_with("Bearer ") ? auth.substr(7) : std::string_view();
    const bool key_ok = ApiKeyMatches(server_->opt.api_keys, bearer) ||
                        ApiKeyMatches(server_->opt.api_keys, sv(req["x-api-key"]));
    const char* kWrongKey = "missing or wrong API key (Authorization: Bearer <key>, or x-api-key)";
    if (path == "/metrics") {
      if (!get) return SendError({405, "use GET", "invalid_request_error", ""});
      if (!key_ok && !server_->opt.metrics_public) return SendError({401, kWrongKey, "authentication_error", ""});
      return Send(http::status::ok, "text/plain; version=0.0.4", server_->metrics.Render(state ? state->engine : nullptr,
                                                                                            state ? state->model_name : ""));
    }
    const bool tokenize = path == "/tokenize" || path == "/v1/tokenize", detokenize = path == "/detokenize" || path == "/v1/detokenize";
    if (path.rfind("/v1/", 0) != 0 && !ollama_ && !tokenize && !detokenize) {
      return SendError({404, fmt::format("no route for {}", path), "not_found_error", ""});
    }
    if (!key_ok) return SendError({401, kWrongKey, "authentication_error", ""});
    if (!state) return SendError({503, "the model is still loading", "service_unavailable", ""}, false, "5");
    if (tokenize || detokenize) {
      if (!post) return SendError({405, "use POST", "invalid_request_error", ""});
      return AnswerOffThread(std::move(req.body()), "tokenizing", [detokenize, state](const std::string& body) {
        return TokenizeRequest(body, detokenize, *state);
      });
    }
    if (path == "/v1/models") {
      if (!get) return SendError({405, "use GET", "invalid_request_error", ""});
      Json m = {{"id", state->model_name}, {"object", "model"}, {"created", state->created}, {"owned_by", "gale"}};
      m["max_model_len"] = state->engine->max_request_tokens();
      return SendJson(Json{{"object", "list"}, {"data", Json::array({m})}});
    }
    if (count_tokens) return CountTokens(std::move(req), state);
    if (ollama_) return Ollama(std::move(req), path, state);
    if (path.rfind("/v1/responses/", 0) == 0) return StoredResponse(req, path.substr(14));
    const bool responses = path == "/v1/responses";
    const bool chat = path == "/v1/chat/completions" || messages || responses, embed = path == "/v1/embeddings";
    if (!chat && !embed && path != "/v1/completions") {
      return SendError({404, fmt::format("no route for {}", path), "not_found_error", ""});
    }
    const int kind = embed ? 2 : chat ? 1 : 0;
    if (!post) return SendError({405, "use POST", "invalid_request_error", ""});
    if (!Admit(*state, req.body().size())) return;
    net::io_context& lane = server_->LaneFor(req.body().size());  // before the body moves
    net::post(lane, [self = shared_from_this(), req = std::move(req), kind, state, messages, responses]() mutable {
      auto prepared = messages    ? PrepareMessages(req.body(), *state, self->server_->opt.strict_api)
                      : responses ? self->PrepareResponses(req.body(), *state)
                                  : Prepare(req.body(), kind, *state, self->server_->opt.strict_api);
      req = {};  // the body's memory goes now, not when the generation ends
      self->CompileThenLaunch(std::move(prepared), std::move(state));
    });
  }

  // Counts a request that will generate in flight (so a drain waits for it and the engine
  // outlives it), or refuses it when the server is stopping or full: false then (answered).
  bool Admit(const ServingState& state, size_t body_bytes) {
    ++server_->in_flight;
    bulk_ = body_bytes > HttpServer::Impl::kBulkBodyBytes;
    if (bulk_) ++server_->bulk_in_flight;
    if (!server_->accepting.load()) {
      Reject({503, "the server is shutting down", "service_unavailable", ""}, "5");
      return false;
    }
    if (AtCapacity(1, state)) {
      Reject({429, "the server is at capacity; retry later", "rate_limit_error", ""}, "1");
      return false;
    }
    return true;
  }

  // Launches a prepared request (or answers its error) once its constraint is compiled: from the
  // compiler's cache, or on the compile threads (compiling may take up to the server's limit, so
  // neither other requests' preparation nor the engine waits for it).
  void CompileThenLaunch(std::variant<Prepared, ApiError> prepared, std::shared_ptr<const ServingState> state) {
    Prepared* p = std::get_if<Prepared>(&prepared);
    if (p == nullptr || !p->constraint || TakeCachedGrammar(*p, *state, &prepared)) return PostLaunch(std::move(prepared), state);
    net::post(server_->compile, [self = shared_from_this(), prepared = std::move(prepared), state]() mutable {
      Prepared& p = std::get<Prepared>(prepared);
      const auto t0 = std::chrono::steady_clock::now();
      auto g = CompileGuarded(*state->grammars, *p.constraint);
      // A costly compilation (kept or refused) leaves much freed memory behind.
      if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(20)) ReleaseFreeMemory();
      if (g.ok()) {
        p.grammar = std::move(*g);
      } else {
        prepared = ApiError{400, g.status().message(), "invalid_request_error", p.constraint_param};
      }
      self->PostLaunch(std::move(prepared), state);
    });
  }

  // A Messages API body: translated to a chat completions body, then prepared as one.
  static std::variant<Prepared, ApiError> PrepareMessages(const std::string& body, const ServingState& state, bool strict) {
    auto chat = AnthropicToChat(body, /*count_tokens=*/false);
    if (auto* e = std::get_if<ApiError>(&chat)) return *e;
    auto prepared = Prepare(std::get<Json>(chat).dump(), 1, state, strict);
    if (auto* p = std::get_if<Prepared>(&prepared)) p->anthropic = true;
    return prepared;
  }

  // Ollama's API: the info endpoints answered here; chat, generate and embed translated and run
  // as the OpenAI requests they become.
  void Ollama(Request req, const std::string& path, std::shared_ptr<const ServingState> state) {
    const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
    const OllamaModel& m = state->ollama;
    if (path == "/api/version") return get ? SendJson(Json{{"version", "0.12.0"}}) : SendError({405, "use GET", "", ""});
    if (path == "/api/tags") return get ? SendJson(OllamaTags(m)) : SendError({405, "use GET", "", ""});
    if (path == "/api/ps") return get ? SendJson(OllamaPs(m)) : SendError({405, "use GET", "", ""});
    if (path == "/api/show") {
      if (!post) return SendError({405, "use POST", "", ""});
      auto body = ParseRequestObject(req.body());
      if (auto* e = std::get_if<ApiError>(&body)) return SendError(*e);
      const Json& b = std::get<Json>(body);
      const Json name = b.contains("model") ? b["model"] : b.value("name", Json(nullptr));
      if (!name.is_string() || !OllamaModelMatches(name.get<std::string>(), m)) {
        return SendError({404, fmt::format("model '{}' not found", name.is_string() ? name.get<std::string>() : name.dump()), "", ""});
      }
      return SendJson(OllamaShow(m));
    }
    std::optional<OllamaEndpoint> ep;
    if (path == "/api/chat") ep = OllamaEndpoint::kChat;
    if (path == "/api/generate") ep = OllamaEndpoint::kGenerate;
    if (path == "/api/embed") ep = OllamaEndpoint::kEmbed;
    if (path == "/api/embeddings") ep = OllamaEndpoint::kEmbeddings;
    if (!ep) return SendError({404, fmt::format("no route for {}", path), "not_found_error", ""});
    if (!post) return SendError({405, "use POST", "invalid_request_error", ""});
    if (!Admit(*state, req.body().size())) return;
    net::io_context& lane = server_->LaneFor(req.body().size());
    net::post(lane, [self = shared_from_this(), body = std::move(req.body()), endpoint = *ep, state]() mutable {
      std::variant<Prepared, ApiError> prepared = ApiError{};
      std::optional<Json> load;  // a request that only loads the model: answered at once
      auto r = OllamaToOpenAi(endpoint, body, state->ollama);
      if (auto* e = std::get_if<ApiError>(&r)) {
        prepared = *e;
      } else {
        OllamaRequest& o = std::get<OllamaRequest>(r);
        if (o.load_only) {
          load = OllamaFinal(endpoint, o.model, Choice{}, Usage{}, OllamaTimings{}, /*whole=*/true);
        } else {
          o.body["stream"] = o.stream;
          const bool embed = endpoint == OllamaEndpoint::kEmbed || endpoint == OllamaEndpoint::kEmbeddings;
          prepared = Prepare(o.body.dump(), embed ? 2 : o.chat ? 1 : 0, *state, /*strict=*/false);
          if (auto* p = std::get_if<Prepared>(&prepared)) {
            p->ollama = endpoint;
            p->ollama_model = o.model;
            if (o.all_that_fits) p->req.max_tokens = 0;
          }
        }
      }
      if (load) {
        return net::post(self->stream_.get_executor(), [self, load = std::move(*load)]() {
          self->server_->RequestEnded(self->bulk_);
          self->SendJson(load);
        });
      }
      self->CompileThenLaunch(std::move(prepared), std::move(state));
    });
  }

  // A Responses API body: translated to a chat completions body (with a stored response's
  // conversation before it), then prepared as one.
  std::variant<Prepared, ApiError> PrepareResponses(const std::string& body, const ServingState& state) {
    auto r = ResponsesToChat(body, server_->responses);
    if (auto* e = std::get_if<ApiError>(&r)) return *e;
    auto shared = std::make_shared<const ResponsesRequest>(std::move(std::get<ResponsesRequest>(r)));
    auto prepared = Prepare(shared->chat.dump(), 1, state, server_->opt.strict_api);
    if (auto* p = std::get_if<Prepared>(&prepared)) p->responses = std::move(shared);
    return prepared;
  }

  // GET /v1/responses/{id}: a stored response; DELETE removes it.
  void StoredResponse(const Request& req, const std::string& id) {
    const bool get = req.method() == http::verb::get, del = req.method() == http::verb::delete_;
    if (!get && !del) return SendError({405, "use GET or DELETE", "invalid_request_error", ""});
    const std::string missing = fmt::format("no stored response '{}' (stored responses expire, and only with store: true)", id);
    if (del) {
      if (!server_->responses.Delete(id)) return SendError({404, missing, "invalid_request_error", ""});
      return SendJson(Json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
    }
    auto entry = server_->responses.Get(id);
    if (!entry) return SendError({404, missing, "invalid_request_error", ""});
    SendJson(entry->response);
  }

  // The Response of a finished Responses API request, stored when it asked to be.
  Json FinishResponse(const Generation& g, const Usage& usage) {
    const Choice& c = g.choices.at(0);
    Json response = ResponseObject(g.id, g.created, g.req.model, *g.responses, c, usage);
    if (g.responses->store) {
      Json messages = g.responses->messages;
      messages.push_back(AssistantChatMessage(g.id, c));
      server_->responses.Put(g.id, {response, std::move(messages)});
    }
    return response;
  }

  // /v1/messages/count_tokens: the prompt the template renders for the body, counted (prepared
  // off the I/O thread, as a generation's is; nothing is generated).
  void CountTokens(Request req, std::shared_ptr<const ServingState> state) {
    if (req.method() != http::verb::post) return SendError({405, "use POST", "invalid_request_error", ""});
    const bool strict = server_->opt.strict_api;
    AnswerOffThread(std::move(req.body()), "counting tokens", [state, strict](const std::string& body) -> std::variant<Json, ApiError> {
      auto chat = AnthropicToChat(body, /*count_tokens=*/true);
      if (auto* e = std::get_if<ApiError>(&chat)) return *e;
      auto prepared = Prepare(std::get<Json>(chat).dump(), 1, *state, strict);
      if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
      return Json{{"input_tokens", std::get<Prepared>(prepared).prompts.at(0).size()}};
    });
  }

  // A request answered without the engine (tokenize, count_tokens): `work` runs on a preparation
  // lane, never an I/O thread, and whatever it throws is this request's 500 ("<what> failed").
  void AnswerOffThread(std::string body, const char* what, std::function<std::variant<Json, ApiError>(const std::string&)> work) {
    // (The lane is chosen before the body moves into the task: argument order is unspecified.)
    net::io_context& lane = server_->LaneFor(body.size());
    net::post(lane, [self = shared_from_this(), body = std::move(body), what, work = std::move(work)]() {
      std::variant<Json, ApiError> r;
      try {
        r = work(body);
      } catch (const std::exception& e) {
        r = ApiError{500, fmt::format("{} failed: {}", what, e.what()), "server_error", ""};
      }
      net::post(self->stream_.get_executor(), [self, r = std::move(r)]() {
        if (const auto* e = std::get_if<ApiError>(&r)) return self->SendError(*e);
        self->SendJson(std::get<Json>(r));
      });
    });
  }

  // Sets the grammar (or the refusal) where the compiler has it already; false when it must be
  // compiled.
  bool TakeCachedGrammar(Prepared& p, const ServingState& state, std::variant<Prepared, ApiError>* out) {
    auto hit = state.grammars->Cached(*p.constraint);
    if (!hit) return false;
    if (hit->ok()) {
      p.grammar = std::move(**hit);
    } else {
      *out = ApiError{400, hit->status().message(), "invalid_request_error", p.constraint_param};
    }
    return true;
  }

  void PostLaunch(std::variant<Prepared, ApiError> prepared, std::shared_ptr<const ServingState> state) {
    net::post(stream_.get_executor(), [self = shared_from_this(), prepared = std::move(prepared), state]() mutable {
      self->Launch(std::move(prepared), *state);
    });
  }

  // Back-pressure: sequences beyond what the engine runs at once wait; past max_waiting, refuse.
  // (Counted here, synchronously, so a burst cannot slip past the engine's lagging counters.)
  bool AtCapacity(int64_t num_seqs, const ServingState& state, int64_t num_tokens = 0) const {
    const int64_t batch = state.engine->config().sched.max_batch_size;
    if (server_->opt.max_waiting_tokens > 0 &&
        server_->in_flight_tokens.load() + num_tokens > server_->opt.max_waiting_tokens) {
      return true;
    }
    return server_->in_flight_seqs.load() + num_seqs - batch > server_->opt.max_waiting;
  }

  // Ends a request counted in flight that never started generating.
  void Reject(const ApiError& e, const std::string& retry_after = "") {
    server_->RequestEnded(bulk_);
    server_->metrics.RequestDone("rejected", 0, 0, -1, 0);
    SendError(e, false, retry_after);
  }

  // Tokens of work of a request: each sequence's prompt and what it may generate (max_tokens 0:
  // all that fits in the per-request limit).
  static int64_t WorkTokens(const CompletionRequest& req, const std::vector<std::vector<int32_t>>& prompts,
                            const Engine& engine) {
    int64_t num_tokens = 0;
    for (const auto& prompt : prompts) {
      const int64_t len = static_cast<int64_t>(prompt.size());
      const int64_t out = req.max_tokens > 0 ? req.max_tokens : std::max<int64_t>(0, engine.max_request_tokens() - len);
      num_tokens += (len + out) * req.n;
    }
    return num_tokens;
  }

  // The engine's requests for the API request's prompts x n, seeds consecutive from the request's
  // (or a random) seed; each one's echo in gen.
  std::vector<GenerationRequest> SubRequests(const Prepared& p, const ServingState& state, Generation& gen) {
    const CompletionRequest& req = p.req;
    const Tokenizer& tok = *state.tokenizer;
    const uint64_t base_seed = req.has_seed ? req.sampling.seed : std::random_device{}();
    std::vector<GenerationRequest> subs;
    // All sequences of this API request form one group: the engine admits fairly between groups.
    const int64_t group = static_cast<int64_t>(server_->next_id.fetch_add(1));
    for (size_t pi = 0; pi < p.prompts.size(); ++pi) {
      for (int k = 0; k < req.n; ++k) {
        GenerationRequest g;
        g.group = group;
        g.prompt = p.prompts[pi];
        if (req.truncate_prompt_tokens > 0 && static_cast<int64_t>(g.prompt.size()) > req.truncate_prompt_tokens) {
          // Keep the last tokens, as vLLM's truncate_prompt_tokens does.
          g.prompt.erase(g.prompt.begin(), g.prompt.end() - req.truncate_prompt_tokens);
        }
        g.max_tokens = req.max_tokens;
        g.sampling = req.sampling;
        g.sampling.seed = base_seed + static_cast<uint64_t>(subs.size());
        g.stop = req.stop;
        g.stop_ids = req.stop_token_ids;
        if (!req.ignore_eos) g.stop_ids.insert(g.stop_ids.end(), tok.eog_ids().begin(), tok.eog_ids().end());
        g.cache_salt = req.cache_salt;
        g.top_logprobs = req.top_logprobs;
        // Echo with logprobs reports the prompt's tokens too: the engine computes them.
        if (req.echo && req.top_logprobs >= 0) g.prompt_logprobs = req.top_logprobs;
        g.retention = req.retention;
        g.grammar = p.grammar;
        g.render_special = req.chat && RendersControlTokens(state.tool_format);
        if (state.tool_format == ToolCallFormat::kGptOss && g.render_special && g.grammar) {
          // gpt-oss's call grammar ends with <|call|> itself (ToolCallGrammar): not a stop token then.
          const int32_t call = tok.TokenId("<|call|>");
          g.stop_ids.erase(std::remove(g.stop_ids.begin(), g.stop_ids.end(), call), g.stop_ids.end());
        }
        if (req.embeddings) {
          g.pooling = state.pooling;
          g.stop_ids.clear();
          g.retention.reset();
        }
        gen.echo_tokens.push_back(req.echo && req.top_logprobs >= 0 ? g.prompt : std::vector<int32_t>{});
        subs.push_back(std::move(g));
        gen.echo_prefix.push_back(req.echo ? p.prompt_texts[pi] : "");
      }
    }
    return subs;
  }

  // Per choice: its state, and a message stream where tool calls or reasoning are taken apart.
  // gpt-oss's harmony messages are always taken apart (their channels say what is reasoning), and
  // so are Functionary v3.2's (every message starts with its recipient, "all" for text).
  static void InitChoices(Generation& gen, const Prepared& p, const ServingState& state) {
    const size_t n = gen.streams.size();
    gen.choices.resize(n);
    gen.done.assign(n, false);
    gen.started.assign(n, false);
    gen.generated.assign(n, 0);
    gen.prompt_tokens.assign(n, 0);
    gen.cached_tokens.assign(n, 0);
    gen.evicted_tokens.assign(n, 0);
    gen.messages.resize(n);
    gen.call_ids.resize(n);
    for (Choice& c : gen.choices) c.forced_calls = p.constraint_param == "tools";
    const bool harmony = state.tool_format == ToolCallFormat::kGptOss || state.tool_format == ToolCallFormat::kFunctionaryV32;
    if (!p.req.chat || !(p.parse_tools || state.reasoning || harmony)) return;
    auto types = std::make_shared<const ToolParamTypes>(ParamTypesOf(p.req.tools));
    for (auto& m : gen.messages) {
      m.emplace(p.parse_tools || harmony ? std::optional<ToolCallFormat>(state.tool_format) : std::nullopt, state.reasoning,
                p.starts_thinking, /*forced_calls=*/p.constraint_param == "tools", types);
    }
  }

  // Streamed: the event-stream header first, then chunks as they come; otherwise the answer when
  // it is whole, the socket watched meanwhile.
  void StartAnswer() {
    if (!gen_->req.stream) {
      WatchClosed();
      Pump();
      return;
    }
    auto res = std::make_shared<http::response<http::empty_body>>(http::status::ok, 11);
    res->set(http::field::server, "gale");
    res->set(http::field::content_type, gen_->ollama ? "application/x-ndjson" : "text/event-stream");
    res->set(http::field::cache_control, "no-cache");
    // Kept alive after the last chunk (HTTP/1.1 clients reuse the connection for their next request).
    res->keep_alive(keep_alive_);
    res->chunked(true);
    Cors(*res);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*res);
    writing_ = true;
    http::async_write_header(stream_, *sr, [self = shared_from_this(), res, sr](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->Abort();
      self->WatchDisconnect();
      self->Pump();
    });
  }

  void Launch(std::variant<Prepared, ApiError> prepared, const ServingState& state) {
    if (auto* e = std::get_if<ApiError>(&prepared)) return Reject(*e);
    if (!server_->accepting.load()) return Reject({503, "the server is shutting down", "service_unavailable", ""}, "5");
    Prepared& p = std::get<Prepared>(prepared);
    const CompletionRequest& req = p.req;
    Engine& engine = *state.engine;
    const int64_t num_seqs = static_cast<int64_t>(p.prompts.size()) * req.n;
    const int64_t most = engine.config().sched.max_batch_size + server_->opt.max_waiting;
    if (num_seqs > most) {
      return Reject({400, fmt::format("this request asks for {} sequences (prompts x n); the server takes at most {} at "
                                      "once (--max-batch-size + --max-waiting)", num_seqs, most),
                     "invalid_request_error", req.chat ? "n" : "prompt"});
    }
    const int64_t num_tokens = WorkTokens(req, p.prompts, engine);
    if (server_->opt.max_waiting_tokens > 0 && num_tokens > server_->opt.max_waiting_tokens) {
      return Reject({400, fmt::format("this request asks for {} tokens of work (prompt + max_tokens of each sequence); "
                                      "the server takes at most {} at once (--max-waiting-tokens)",
                                      num_tokens, server_->opt.max_waiting_tokens),
                     "invalid_request_error", "max_tokens"});
    }
    if (AtCapacity(num_seqs, state, num_tokens)) {
      return Reject({429, "the server is at capacity; retry later", "rate_limit_error", ""}, "1");
    }
    auto gen = std::make_shared<Generation>();
    gen->id = (p.anthropic ? "msg_" : p.responses ? "resp_" : req.chat ? "chatcmpl-" : "cmpl-") + RandomHex();
    gen->created = static_cast<int64_t>(std::time(nullptr));
    if (p.anthropic) gen->anthropic.emplace(gen->id, state.model_name);
    if (p.responses) {
      gen->responses = p.responses;
      if (req.stream) gen->responses_events.emplace(gen->id, gen->created, state.model_name);
    }
    gen->ollama = p.ollama;
    gen->ollama_model = p.ollama_model;
    gen->tok = state.tokenizer;
    gen->constraint_param = p.constraint_param;
    for (auto& g : SubRequests(p, state, *gen)) {
      auto s = engine.Submit(std::move(g));
      if (!s.ok()) {
        for (auto& st : gen->streams) engine.Cancel(st->id());
        if (s.status().code() == StatusCode::kUnavailable) {  // the server is stopping
          return Reject({503, s.status().message(), "service_unavailable", ""}, "5");
        }
        return Reject({400, s.status().message(), "invalid_request_error", "prompt"});
      }
      gen->streams.push_back(*s);
    }
    InitChoices(*gen, p, state);
    gen->req = std::move(p.req);
    gen_ = gen;
    self_hold_ = shared_from_this();  // no I/O is pending while a non-streamed answer is computed
    engine_ = state.engine;
    gen_seqs_ = static_cast<int64_t>(gen->streams.size());
    gen_tokens_ = num_tokens;
    server_->in_flight_seqs += gen_seqs_;
    server_->in_flight_tokens += gen_tokens_;
    stream_.expires_never();
    std::weak_ptr<Session> weak = weak_from_this();
    auto executor = stream_.get_executor();
    for (auto& st : gen->streams) {
      st->SetNotify([weak, executor] {
        net::post(executor, [weak] {
          if (auto self = weak.lock()) self->Pump();
        });
      });
    }
    StartAnswer();
  }

  // A non-streamed request has no read pending (a pipelined next request must stay unread), so
  // whether its client is still there is asked of the socket every so often; a client that has
  // gone cancels its request (and SDK retries do not pile up work for nobody).
  void WatchClosed() {
    watch_timer_.expires_after(std::chrono::milliseconds(100));
    watch_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || !self->gen_ || self->gen_->req.stream) return;
      if (PeerClosed(self->stream_.socket().native_handle())) return self->Abort();
      self->WatchClosed();
    });
  }

  // While streaming, a pending read notices the client going away (EOF or reset) at once.
  // Bytes a client sends meanwhile (its next request, pipelined) are kept for the next read. Once
  // the stream has ended, WriteLast cancels this read and it resumes reading requests.
  void WatchDisconnect() {
    stream_.socket().async_read_some(net::buffer(watch_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (!ec && n > 0) {
        auto dst = self->buffer_.prepare(n);
        std::memcpy(dst.data(), self->watch_buf_, n);
        self->buffer_.commit(n);
      }
      if (self->gen_) {
        if (ec) return self->Abort();
        return self->WatchDisconnect();
      }
      if (!self->resume_reading_) return;  // not a kept-alive stream's end: nothing to resume
      self->resume_reading_ = false;
      if (ec && ec != net::error::operation_aborted) return self->Close();
      self->DoRead();
    });
  }

  // The client is gone: cancel every choice (their blocks are freed at the next engine step).
  void Abort() {
    if (!gen_) return;
    for (size_t i = 0; i < gen_->streams.size(); ++i) {
      if (!gen_->done[i]) engine_->Cancel(gen_->streams[i]->id());
    }
    FinishGeneration("abort");
    Close();
  }

  void FinishGeneration(const std::string& outcome) {
    if (!gen_) return;
    auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < gen_->streams.size(); ++i) {
      auto& st = gen_->streams[i];
      st->SetNotify(nullptr);
      const auto first = st->first_token_at();
      const double ttft = first ? std::chrono::duration<double>(*first - st->created_at()).count() : -1.0;
      const double e2e = std::chrono::duration<double>(now - st->created_at()).count();
      const std::string o = outcome == "ok" ? FinishReasonForApi(gen_->choices[i].finish_reason) : outcome;
      server_->metrics.RequestDone(o, gen_->prompt_tokens[i], gen_->generated[i], ttft, e2e);
    }
    gen_.reset();
    watch_timer_.cancel();
    server_->in_flight_seqs -= gen_seqs_;
    server_->in_flight_tokens -= gen_tokens_;
    gen_seqs_ = 0;
    gen_tokens_ = 0;
    server_->RequestEnded(bulk_);
    // Callers hold their own reference, so this cannot destroy the session under them.
    self_hold_.reset();
  }

  Usage TotalUsage() const {
    Usage u;
    const int n = gen_->req.n;
    for (size_t i = 0; i < gen_->streams.size(); ++i) {
      u.completion_tokens += gen_->generated[i];
      if (static_cast<int>(i) % n == 0) {
        u.prompt_tokens += gen_->prompt_tokens[i];
        u.cached_tokens += gen_->cached_tokens[i];
      }
    }
    if (gen_->retained) {
      u.kv_evicted_tokens = 0;
      for (int64_t e : gen_->evicted_tokens) *u.kv_evicted_tokens += e;
    }
    return u;
  }

  static std::string NewCallId() { return "call_" + RandomHex() + RandomHex().substr(0, 8); }

  // Choice i's time so far, time to its first token and since it (Ollama's durations).
  OllamaTimings Timings(size_t i) const {
    const auto& st = gen_->streams.at(i);
    const auto now = std::chrono::steady_clock::now();
    const auto first = st->first_token_at().value_or(now);
    auto ns = [](auto d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); };
    return {ns(now - st->created_at()), ns(first - st->created_at()), ns(now - first)};
  }

  // OpenAI's streamed tool_calls: a call's first delta has its id, type and name (and the start of
  // its arguments); later ones only more arguments. Consecutive pieces of one call are one entry.
  static Json CallDeltasJson(const std::vector<CallDelta>& deltas, std::vector<std::string>* ids) {
    Json out = Json::array();
    for (const CallDelta& d : deltas) {
      if (!d.name.empty()) {
        if (ids->size() <= d.index) ids->resize(d.index + 1);
        (*ids)[d.index] = NewCallId();
        out.push_back({{"index", d.index}, {"id", (*ids)[d.index]}, {"type", "function"},
                       {"function", {{"name", d.name}, {"arguments", d.arguments}}}});
      } else if (!out.empty() && out.back()["index"] == d.index) {
        out.back()["function"]["arguments"] = out.back()["function"]["arguments"].get<std::string>() + d.arguments;
      } else if (!d.arguments.empty()) {
        out.push_back({{"index", d.index}, {"function", {{"arguments", d.arguments}}}});
      }
    }
    return out;
  }

  // One update of choice i as its API streams it (OpenAI's chunks, Anthropic's or the Responses
  // API's events, Ollama's lines).
  std::string StreamPiece(size_t i, const StreamUpdate& u, const std::string& delta, const std::string& reasoning_delta,
                          const std::vector<CallDelta>& call_deltas, const Json& lp) {
    Generation& g = *gen_;
    const Choice& ch = g.choices[i];
    std::string sse;
    if (g.ollama) {
      // Ollama's stream: a line per piece; tool calls whole, then the final line.
      if (!delta.empty() || !reasoning_delta.empty()) sse += OllamaDeltaLine(*g.ollama, g.ollama_model, delta, reasoning_delta, {});
      if (u.finished && u.finish_reason != FinishReason::kError) {
        if (!ch.tool_calls.empty()) sse += OllamaDeltaLine(*g.ollama, g.ollama_model, "", "", ch.tool_calls);
        sse += JsonText(OllamaFinal(*g.ollama, g.ollama_model, ch, TotalUsage(), Timings(i), /*whole=*/false)) + "\n";
      }
    } else if (g.responses) {
      ResponsesEvents& ev = *g.responses_events;
      if (!g.started[i]) sse += ev.Start(*g.responses);
      sse += ev.Thinking(reasoning_delta);
      sse += ev.Text(delta);
      sse += ev.Calls(call_deltas);
      if (u.finished && u.finish_reason != FinishReason::kError) sse += ev.End(FinishResponse(g, TotalUsage()));
    } else if (g.anthropic) {
      AnthropicEvents& ev = *g.anthropic;
      if (!g.started[i]) sse += ev.Start(Usage{u.num_prompt_tokens, 0, 0, std::nullopt});
      // (One statement each: the events' order is the calls' order.)
      sse += ev.Thinking(reasoning_delta);
      sse += ev.Text(delta);
      sse += ev.Calls(call_deltas);
      if (u.finished && u.finish_reason != FinishReason::kError) sse += ev.End(ch, TotalUsage());
    } else {
      if (!reasoning_delta.empty()) {
        Json d = {{"reasoning_content", reasoning_delta}};
        if (!g.started[i]) d["role"] = "assistant";
        sse += "data: " + JsonText(ChatDeltaChunk(g.req, g.id, g.created, static_cast<int>(i), d, std::nullopt)) + "\n\n";
        g.started[i] = true;
      }
      if (!delta.empty() || !g.started[i] || !lp.is_null()) {
        sse += "data: " + JsonText(StreamChunk(g.req, g.id, g.created, static_cast<int>(i), delta, std::nullopt, !g.started[i], lp)) +
               "\n\n";
      }
      if (Json calls = CallDeltasJson(call_deltas, &g.call_ids[i]); !calls.empty()) {
        Json d = {{"tool_calls", std::move(calls)}};
        sse += "data: " + JsonText(ChatDeltaChunk(g.req, g.id, g.created, static_cast<int>(i), d, std::nullopt)) + "\n\n";
      }
      if (u.finished) {
        const bool ended = u.finish_reason == FinishReason::kStop || u.finish_reason == FinishReason::kEos;
        if (g.req.chat) {
          sse += "data: " + JsonText(ChatDeltaChunk(g.req, g.id, g.created, static_cast<int>(i), Json::object(), u.finish_reason,
                                                ended && !ch.tool_calls.empty())) + "\n\n";
        } else {
          sse += "data: " + JsonText(StreamChunk(g.req, g.id, g.created, static_cast<int>(i), "", u.finish_reason, false)) + "\n\n";
        }
      }
    }
    return sse;
  }

  // The whole answer of a non-streamed generation, in its API's shape.
  Json WholeBody() {
    Generation& g = *gen_;
    Json body;
    if (g.req.embeddings) {
      std::vector<std::vector<float>> vectors;
      for (auto& c : g.choices) vectors.push_back(std::move(c.embedding));
      body = g.ollama ? OllamaEmbedResponse(*g.ollama, g.ollama_model, vectors, TotalUsage().prompt_tokens, Timings(0))
                      : EmbeddingResponse(g.req, vectors, TotalUsage().prompt_tokens);
    } else if (g.ollama) {
      body = OllamaFinal(*g.ollama, g.ollama_model, g.choices.at(0), TotalUsage(), Timings(0), /*whole=*/true);
    } else if (g.anthropic) {
      body = AnthropicMessage(g.id, g.req.model, g.choices.at(0), TotalUsage());
    } else if (g.responses) {
      body = FinishResponse(g, TotalUsage());
    } else {
      body = CompletionResponse(g.req, g.id, g.created, g.choices, TotalUsage(), [&g](int32_t id) { return g.Piece(id); });
    }
    return body;
  }

  // What a stream sends after its choices end: an engine error, then OpenAI's usage chunk and
  // [DONE] (the other APIs' streams end with their choices' final events).
  std::string StreamEnd(const Status& error, bool request_error) {
    Generation& g = *gen_;
    std::string sse;
    if (!error.ok()) {
      const ApiError e = EngineError(error, request_error, g.constraint_param);
      if (g.ollama) return OllamaErrorBody(e.message) + "\n";
      if (g.responses) return g.responses_events->Error(e);
      if (g.anthropic) return AnthropicEvents::Error(e);
      sse += "data: " + ErrorBody(e) + "\n\n";
    }
    if (g.ollama || g.responses || g.anthropic) return sse;
    if (g.req.include_usage) {
      sse += "data: " + JsonText(UsageChunk(g.req, g.id, g.created, TotalUsage())) + "\n\n";
    }
    return sse + "data: [DONE]\n\n";
  }

  // Takes what the engine pushed; streams it (SSE) or, when everything is done, sends the whole
  // response. Runs on the session's strand.
  void Pump() {
    if (!gen_ || writing_) return;
    Generation& g = *gen_;
    std::string sse;
    Status error;
    bool request_error = false;  // the error is the request's (its constraint), a 400
    for (size_t i = 0; i < g.streams.size(); ++i) {
      StreamUpdate u;
      while (!g.done[i] && g.streams[i]->TryNext(&u)) {
        g.generated[i] += static_cast<int64_t>(u.token_ids.size());
        server_->metrics.Tokens(g.started[i] ? 0 : u.num_prompt_tokens, static_cast<int64_t>(u.token_ids.size()));
        g.prompt_tokens[i] = u.num_prompt_tokens;
        std::string delta = u.text;
        if (!g.started[i] && !g.echo_prefix[i].empty()) delta = g.echo_prefix[i] + delta;
        const size_t tok_begin = g.choices[i].tokens.size();
        const int64_t text_begin = static_cast<int64_t>(g.choices[i].text.size());
        Choice& ch = g.choices[i];
        // A chat message with tools or reasoning: the text is taken apart as it comes.
        std::string reasoning_delta;
        std::vector<CallDelta> call_deltas;  // streamed: each call's name, then its arguments as written
        ParsedMessage tail;
        std::optional<MessageStream>& ms = g.messages[i];
        if (ms) {
          MessageStream::Delta d = ms->Push(delta);
          call_deltas = std::move(d.calls);
          if (u.finished) {
            std::vector<CallDelta> rest;
            tail = ms->Finish(&rest);
            call_deltas.insert(call_deltas.end(), rest.begin(), rest.end());
            d.content += tail.content;
            d.reasoning += tail.reasoning;
            for (ToolCall& c : tail.calls) c.id = NewCallId();
            ch.tool_calls = tail.calls;
          }
          delta = std::move(d.content);
          reasoning_delta = std::move(d.reasoning);
          ch.reasoning += reasoning_delta;
        }
        g.choices[i].text += delta;
        const bool first_echo = !g.started[i] && !g.echo_tokens[i].empty();
        if (first_echo) {
          ch.echo_logprobs = true;
          ch.prompt_tokens = g.echo_tokens[i];
          ch.prompt_logprobs = u.prompt_logprobs;
          ch.echo_bytes = static_cast<int64_t>(g.echo_prefix[i].size());
        }
        ch.tokens.insert(ch.tokens.end(), u.token_ids.begin(), u.token_ids.end());
        ch.logprobs.insert(ch.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
        Json lp = nullptr;
        if (g.req.top_logprobs >= 0 && (ch.tokens.size() > tok_begin || first_echo)) {
          // The first chunk's text starts with the echoed prompt: generated tokens follow it.
          const int64_t gen_offset = first_echo ? ch.echo_bytes : text_begin;
          lp = LogprobsJson(g.req.chat, ch, tok_begin, ch.tokens.size(), [&g](int32_t id) { return g.Piece(id); },
                            gen_offset, first_echo);
        }
        if (u.finished) {
          g.done[i] = true;
          g.choices[i].finish_reason = u.finish_reason;
          g.choices[i].embedding = std::move(u.embedding);
          g.cached_tokens[i] = u.num_cached_tokens;
          g.evicted_tokens[i] = u.num_evicted_tokens;
          g.retained = g.retained || u.kv_budget > 0;
          g.choices[i].stop_string = u.stop_string;
          if (u.finish_reason == FinishReason::kError) {
            error = u.status;
            request_error = u.request_error;
          }
        }
        if (g.req.stream) sse += StreamPiece(i, u, delta, reasoning_delta, call_deltas, lp);
        g.started[i] = true;
      }
    }
    const bool all_done = std::all_of(g.done.begin(), g.done.end(), [](bool b) { return b; });
    if (!g.req.stream) {
      if (!all_done) return;
      if (!error.ok()) {
        const ApiError e = EngineError(error, request_error, g.constraint_param);  // before g goes
        FinishGeneration("error");
        return SendError(e);
      }
      Json body = WholeBody();
      FinishGeneration("ok");
      return SendJson(body);
    }
    bool last = false;
    if (all_done && !g.final_sent) {
      sse += StreamEnd(error, request_error);
      g.final_sent = true;
      last = true;
    }
    if (sse.empty()) return;
    WriteChunk(std::move(sse), last);
  }

  void WriteChunk(std::string data, bool last) {
    writing_ = true;
    auto buf = std::make_shared<std::string>(std::move(data));
    auto on_done = [self = shared_from_this(), buf, last](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->Abort();
      if (last) {
        self->WriteLast();
        return;
      }
      self->Pump();
    };
    net::async_write(stream_, http::make_chunk(net::buffer(*buf)), std::move(on_done));
  }

  void WriteLast() {
    writing_ = true;
    net::async_write(stream_, http::make_chunk_last(), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->FinishGeneration("ok");
      if (ec || !self->keep_alive_) return self->Close();
      // The disconnect watch still has a read pending: cancelling it hands the connection back to
      // the request reader (WatchDisconnect).
      self->resume_reading_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
  }

  beast::tcp_stream stream_;
  HttpServer::Impl* server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = true;
  bool writing_ = false;
  bool resume_reading_ = false;  // a kept-alive stream has ended: the watch read hands over
  std::string cors_origin_;      // this request's allowed Origin, echoed in CORS headers
  bool anthropic_ = false;       // this request is Anthropic's Messages API: its errors in that shape
  bool ollama_ = false;          // ... Ollama's API (/api/...)
  std::shared_ptr<Generation> gen_;
  std::shared_ptr<Session> self_hold_;  // set while a generation is in flight
  Engine* engine_ = nullptr;
  int64_t gen_seqs_ = 0;                // the generation's sequences, counted in in_flight_seqs
  int64_t gen_tokens_ = 0;              // its tokens of work, counted in in_flight_tokens
  bool bulk_ = false;                   // the request in flight has a large body (bulk_in_flight)
  net::steady_timer watch_timer_;       // non-streamed generations: is the client still there
  char watch_buf_[512];
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!accepting.load() || ec == net::error::operation_aborted) return;
    if (!ec) {
      // No Nagle: a streamed response's header and its first chunk are separate small writes,
      // and the second would otherwise wait for the client's delayed ACK of the first (~40 ms).
      beast::error_code opt_ec;
      socket.set_option(tcp::no_delay(true), opt_ec);
      if (opt.max_connections > 0 && connections.load() >= opt.max_connections) {
        // Past the cap: a short 503 (a fresh socket takes these bytes at once) and the door.
        static const std::string kFull = [] {
          const std::string body = ErrorBody({503, "too many open connections (gale serve --max-connections)",
                                              "service_unavailable", ""});
          return fmt::format("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                             "Connection: close\r\nContent-Length: {}\r\n\r\n{}", body.size(), body);
        }();
        socket.non_blocking(true, opt_ec);
        net::write(socket, net::buffer(kFull), opt_ec);
        socket.close(opt_ec);
        metrics.HttpResponse(503);
        return Accept();
      }
      std::make_shared<Session>(std::move(socket), this)->Run();
      return Accept();
    }
    // Out of file descriptors (or another transient failure): retry shortly instead of spinning.
    auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(100));
    timer->async_wait([this, timer](beast::error_code) {
      if (accepting.load()) Accept();
    });
  });
}

HttpServer::HttpServer(const ServerOptions& options) : impl_(std::make_unique<Impl>()) { impl_->opt = options; }

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start() {
  beast::error_code ec;
  const auto addr = net::ip::make_address(impl_->opt.host, ec);
  if (ec) return InvalidArgument("--host '{}' is not an IP address", impl_->opt.host);
  tcp::endpoint ep(addr, impl_->opt.port);
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return IoError("cannot listen on {}:{}: {}", impl_->opt.host, impl_->opt.port, ec.message());
  impl_->work_guard.emplace(impl_->work.get_executor());
  for (int i = 0; i < std::max(1, impl_->opt.num_work_threads); ++i) {
    impl_->work_threads.emplace_back([impl = impl_.get()] {
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 5);  // this thread only (Linux)
      impl->work.run();
    });
  }
  impl_->bulk_guard.emplace(impl_->bulk.get_executor());
  for (int i = 0; i < std::max(1, impl_->opt.num_work_threads / 2); ++i) {
    impl_->bulk_threads.emplace_back([impl = impl_.get()] {
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 5);
      impl->bulk.run();
    });
  }
  impl_->compile_guard.emplace(impl_->compile.get_executor());
  for (int i = 0; i < std::max(1, impl_->opt.num_compile_threads); ++i) {
    impl_->compile_threads.emplace_back([impl = impl_.get()] {
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 10);
      impl->compile.run();
    });
  }
  impl_->Accept();
  for (int i = 0; i < std::max(1, impl_->opt.num_threads); ++i) {
    impl_->threads.emplace_back([impl = impl_.get()] { impl->ioc.run(); });
  }
  return Status::Ok();
}

uint16_t HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

void HttpServer::SetReady(const ServingState& state) {
  std::lock_guard<std::mutex> lock(impl_->state_mu);
  impl_->state = std::make_shared<const ServingState>(state);
}

int64_t HttpServer::Drain(std::chrono::milliseconds timeout) {
  impl_->accepting = false;
  net::post(impl_->ioc, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (impl_->in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return impl_->in_flight.load();
}

void HttpServer::Stop() {
  if (impl_->threads.empty()) return;
  impl_->accepting = false;
  // Preparations still running post their results to the I/O threads: finish them first.
  impl_->work_guard.reset();
  for (auto& t : impl_->work_threads) t.join();
  impl_->work_threads.clear();
  impl_->bulk_guard.reset();
  for (auto& t : impl_->bulk_threads) t.join();
  impl_->bulk_threads.clear();
  impl_->compile_guard.reset();
  for (auto& t : impl_->compile_threads) t.join();
  impl_->compile_threads.clear();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  // Let what was queued (final stream writes, finished generations) run once more, so sessions
  // release themselves; whatever is still pending is destroyed with the io_context.
  impl_->ioc.restart();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < deadline && impl_->ioc.poll() > 0) {
  }
}

Metrics& HttpServer::metrics() { return impl_->metrics; }

}  // namespace gale::server
