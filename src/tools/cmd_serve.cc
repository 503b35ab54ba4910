// `gale serve`: the OpenAI-compatible server. Listens first (so /health can say 503 while the
// model loads), loads the model, warms the engine up, then serves until SIGTERM or SIGINT: stop
// accepting, let requests in flight finish within --shutdown-timeout, cancel the rest, exit 0.
// With --pipeline-parallel N or --tensor-parallel N under mpirun, rank 0 is the server and the
// other ranks run their share of every step; there SIGTERM ends requests in flight at once with an
// error that says so (mpirun sends it to every rank, also when one of them died, so the group
// cannot be trusted to drain).
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>

#include <fmt/format.h>

#include "base/memory.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_file.h"
#include "model/chat_template.h"
#include "server/api_keys.h"
#include "server/http_server.h"
#include "server/kv_events.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace gale {

namespace {

struct ServeOpts {
  std::string model, isa, chat_template, served_name, tool_call_parser, pooling, kv_events_endpoint, kv_events_topic,
      kv_events_replay, api_key_file;
  std::vector<std::string> api_keys;
  int threads = ThreadPool::DefaultNumThreads();
  bool no_warmup = false;
  double shutdown_timeout = 10.0;
  int64_t constraint_compile_ms = grammar::kDefaultCompileTime.count();
  LoadOptions load;
  EngineOptions engine;
  server::ServerOptions http;
  ParallelFlags parallel;
};

void AddServeOptions(CLI::App& app, ServeOpts& o) {
  app.add_option("-m,--model", o.model, "GGUF model (default: the bundled stories260K)");
  app.add_option("--host", o.http.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.http.port, "port (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--api-key", o.api_keys,
                 "require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on the API routes and /metrics; may be "
                 "repeated (a key on the command line shows in ps: prefer --api-key-file or GALE_API_KEY)");
  app.add_option("--api-key-file", o.api_key_file,
                 "a file of keys, one per line (blank lines and # comments skipped), accepted as --api-key's");
  app.add_flag("--metrics-public", o.http.metrics_public, "serve /metrics without a key even when keys are set");
  app.add_option("--served-model-name", o.served_name, "model name in the API (default: the file name)");
  app.add_option("--chat-template", o.chat_template, "Jinja chat template file (default: the model's)");
  app.add_option("--max-body-bytes", o.http.max_body_bytes, "largest request body; larger gets 413")->capture_default_str();
  app.add_option("--max-waiting", o.http.max_waiting,
                 "sequences (prompts x n) waiting beyond the running batch before 429")->capture_default_str();
  app.add_option("--max-waiting-tokens", o.http.max_waiting_tokens,
                 "tokens of work (prompt + max_tokens of every sequence) in flight before 429; 0: no limit")
      ->capture_default_str();
  app.add_option("--http-threads", o.http.num_threads, "I/O threads")->capture_default_str();
  app.add_option("--max-connections", o.http.max_connections, "open connections past this get 503 (0: no cap)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option_function<int64_t>(
         "--idle-timeout", [&o](int64_t s) { o.http.idle_timeout = std::chrono::seconds(s); },
         "seconds an idle or half-sent connection is kept (default 30)")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  app.add_option("--max-constraint-compile-ms", o.constraint_compile_ms,
                 "CPU time a response_format / guided_* / tool_choice constraint may take to compile "
                 "(its thread's own: a loaded machine does not shorten it); past it: 400")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  app.add_option("--constraint-compile-threads", o.http.num_compile_threads,
                 "threads compiling constraints (apart from the engine's and the request threads)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("-t,--threads", o.threads, "compute threads")->capture_default_str();
  app.add_flag("--no-warmup", o.no_warmup, "skip the warm-up request before /health says ready");
  app.add_option("--tool-call-parser", o.tool_call_parser,
                 "how the model writes tool calls: hermes | llama3_json | mistral | deepseek_v3 | kimi_k2 | qwen3_coder | glm45 | "
                 "minimax_m2 | gpt_oss | gemma4 | functionary | functionary_v3_2 "
                 "(default: from the chat template)");
  app.add_option("--pooling", o.pooling,
                 "/v1/embeddings: pool hidden states this way (mean | cls | last | none; default: the model's pooling_type)");
  app.add_option("--cors-origins", o.http.cors_origins,
                 "origins browsers may call from, comma-separated, or * for any (default: no CORS headers)")
      ->delimiter(',');
  app.add_option("--kv-events-endpoint", o.kv_events_endpoint,
                 "publish KV-cache events (blocks stored / removed) as vLLM does, ZeroMQ PUB + msgpack, e.g. tcp://*:5557");
  app.add_option("--kv-events-topic", o.kv_events_topic, "the events' topic frame (default: empty, as vLLM's)");
  app.add_option("--kv-events-replay-endpoint", o.kv_events_replay,
                 "also answer replay requests for missed event batches (vLLM's ROUTER socket), e.g. tcp://*:5558");
  app.add_flag("--strict-api", o.http.strict_api, "refuse requests with unknown fields (default: ignore them, as vLLM does)");
  app.add_option("--shutdown-timeout", o.shutdown_timeout, "seconds requests in flight get to finish on SIGTERM")
      ->capture_default_str();
  o.engine.Register(app);
  o.load.Register(app);
  o.parallel.Register(app);
  app.add_option("--isa", o.isa, "force kernels: scalar | avx2 | avx512 (default: best for this CPU)");
}

// SIGTERM/SIGINT are taken by sigwait; every thread started after this inherits the mask.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Every connection is a file descriptor: allow as many as the hard limit permits.
void RaiseFileLimit() {
  rlimit fds{};
  if (getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < fds.rlim_max) {
    fds.rlim_cur = fds.rlim_max;
    setrlimit(RLIMIT_NOFILE, &fds);
  }
}

// --chat-template's, else the model's; none (null) only when the model has none.
StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(const ServeOpts& o, const GgufFile& file) {
  auto t = o.chat_template.empty() ? ChatTemplate::FromGguf(file) : ChatTemplate::FromFile(o.chat_template);
  if (t.ok()) return std::make_unique<ChatTemplate>(std::move(t).value());
  if (!o.chat_template.empty() || t.status().code() != StatusCode::kNotFound) return t.status();
  std::fprintf(stderr, "note: the model has no chat template; /v1/chat/completions needs --chat-template\n");
  return std::unique_ptr<ChatTemplate>();
}

// --kv-events-endpoint: the publisher the engine calls (null without it).
StatusOr<std::unique_ptr<server::KvEventPublisher>> StartKvEvents(const ServeOpts& o, EngineConfig* cfg) {
  if (!o.kv_events_replay.empty() && o.kv_events_endpoint.empty()) {
    return InvalidArgument("--kv-events-replay-endpoint needs --kv-events-endpoint");
  }
  if (o.kv_events_endpoint.empty()) return std::unique_ptr<server::KvEventPublisher>();
  if (!cfg->enable_prefix_caching) return InvalidArgument("--kv-events-endpoint needs the prefix cache");
  ASSIGN_OR_RETURN(auto pub, server::KvEventPublisher::Create(o.kv_events_endpoint, o.kv_events_topic, cfg->block_size,
                                                              o.kv_events_replay));
  cfg->kv_events = [p = pub.get()](std::vector<KvCacheEvent> events) { p->Publish(events); };
  std::fprintf(stderr, "publishing KV-cache events on %s\n", o.kv_events_endpoint.c_str());
  return pub;
}

// One short request (an embedding for an encoder) before /health says ready.
Status WarmUp(Engine& engine, const LoadedModel& loaded, std::optional<Pooling> pooling) {
  GenerationRequest warm;
  warm.prompt = loaded.tok->Encode("Hello");
  if (warm.prompt.empty()) warm.prompt.push_back(0);
  warm.max_tokens = 2;
  if (!loaded.model->hparams().causal) {
    warm.pooling = pooling.value_or(loaded.model->hparams().pooling);
    if (warm.pooling == Pooling::kNone) warm.pooling = Pooling::kMean;
  }
  auto s = engine.Submit(warm);
  if (!s.ok()) return s.status().WithContext("warm-up");
  StreamUpdate u;
  while ((*s)->Next(&u)) {
  }
  return Status::Ok();
}

// --served-model-name, else the file's name without .gguf.
std::string ServedName(const ServeOpts& o, const std::string& path) {
  if (!o.served_name.empty()) return o.served_name;
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name;
}

// Until SIGTERM or SIGINT; then drain, cancel what is left and stop.
void ServeUntilSignalled(const ServeOpts& o, const sigset_t& signals, server::HttpServer& http, Engine& engine,
                         ParallelGuard& parallel) {
  int sig = 0;
  sigwait(&signals, &sig);
  const char* sig_name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
  if (parallel.connected()) {
    std::fprintf(stderr, "%s: stopping the other ranks; requests in flight end with an error\n", sig_name);
    parallel.Abort(fmt::format("the server is stopping ({}; under mpirun another rank may have exited)", sig_name));
  }
  std::fprintf(stderr, "%s: draining (up to %.0f s)\n", sig_name, o.shutdown_timeout);
  const int64_t left = http.Drain(std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_timeout * 1000)));
  if (left > 0) std::fprintf(stderr, "cancelling %lld requests still running\n", static_cast<long long>(left));
  // Cancels whatever is still in flight (their streams end); the engine object stays until the
  // HTTP threads are done with it (it is destroyed after http.Stop, on the way out).
  engine.Shutdown();
  http.Drain(std::chrono::milliseconds(2000));
  http.Stop();
  std::fprintf(stderr, "stopped\n");
}

// What Ollama's info endpoints say of the served file.
server::OllamaModel OllamaFacts(const GgufFile& file, const std::string& name, const Engine& engine, const server::ServingState& state) {
  server::OllamaModel m;
  m.name = name;
  auto arch = file.GetString("general.architecture");
  m.architecture = arch.ok() ? *arch : "unknown";
  std::map<uint32_t, uint64_t> bytes_by_type;
  for (const GgufTensorInfo& t : file.tensors()) {
    m.parameters += t.NumElements();
    bytes_by_type[t.type_id] += t.num_bytes;
  }
  uint32_t most = 0;
  for (const auto& [type, bytes] : bytes_by_type) {
    if (bytes > bytes_by_type[most]) most = type;
  }
  std::string quant(TypeName(most));
  for (char& c : quant) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  m.quantization = quant;
  m.file_bytes = static_cast<int64_t>(file.file_bytes());
  m.context_length = engine.max_request_tokens();
  m.chat = state.chat_template != nullptr;
  m.template_source = m.chat ? state.chat_template->source() : "";
  m.tools = m.chat && m.template_source.find("tools") != std::string::npos;
  m.thinking = state.reasoning.has_value();
  m.embedding = state.pooling != Pooling::kNone;
  m.loaded_at = state.created;
  return m;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "gale serve: %s\n", s.ToString().c_str());
  return 1;
}

int RunServe(ServeOpts& o) {
  if (Status s = SelectIsa(o.isa); !s.ok()) return Fail(s);
  if (o.threads < 1) return Fail(InvalidArgument("-t must be >= 1"));
  auto rank = StartParallelRank(o.parallel, o.model, &o.load, o.threads, "serve");
  if (!rank.ok()) return Fail(rank.status());
  if (rank->exit_code) return *rank->exit_code;
  ParallelGuard parallel(rank->comm);  // outlives the engine
  auto cfg = o.engine.Resolve();
  if (!cfg.ok()) return Fail(cfg.status());
  // Keys from the flags and the file; GALE_API_KEY when neither gives one.
  const char* env_key = std::getenv("GALE_API_KEY");
  auto keys = server::ResolveApiKeys(o.api_keys, o.api_key_file,
                                     env_key != nullptr ? std::optional<std::string>(env_key) : std::nullopt);
  if (!keys.ok()) return Fail(keys.status());
  o.http.api_keys = std::move(*keys);
  std::optional<Pooling> pooling;
  if (!o.pooling.empty()) {
    auto p = ParsePooling(o.pooling);
    if (!p.ok()) return Fail(p.status());
    pooling = *p;
  }
  std::optional<server::ToolCallFormat> tool_format;
  if (!o.tool_call_parser.empty()) {
    auto f = server::ParseToolCallFormat(o.tool_call_parser);
    if (!f.ok()) return Fail(f.status());
    tool_format = *f;
  }
  const sigset_t signals = BlockStopSignals();
  RaiseFileLimit();
  KeepLargeAllocationsMapped();  // a burst of large bodies leaves nothing behind
  server::HttpServer http(o.http);
  // Bound first, so a taken port fails at once and /health answers 503 while loading; said
  // only once the model has loaded, so a file that fails to load never reads as a server up.
  if (Status s = http.Start(); !s.ok()) return Fail(s);
  auto loaded = LoadModel(o.model, o.load);
  if (!loaded.ok()) return Fail(loaded.status());
  std::fprintf(stderr, "listening on http://%s:%u\n", o.http.host.c_str(), http.port());
  std::fflush(stderr);
  auto chat_template = LoadChatTemplate(o, *loaded->file);
  if (!chat_template.ok()) return Fail(chat_template.status());
  ThreadPool pool(o.threads);
  auto kv_events = StartKvEvents(o, &*cfg);  // outlives the engine, which calls it
  if (!kv_events.ok()) return Fail(kv_events.status());
  if (Status s = parallel.Connect(o.parallel, *loaded->model, &*cfg); !s.ok()) return Fail(s);
  auto engine = Engine::Create(*loaded->model, loaded->tok.get(), *cfg, pool);
  if (!engine.ok()) return Fail(engine.status());
  std::fprintf(stderr, "%s\n", (*engine)->Describe().c_str());
  if (!o.no_warmup) {
    if (Status s = WarmUp(**engine, *loaded, pooling); !s.ok()) return Fail(s);
  }
  const std::string name = ServedName(o, loaded->path);
  grammar::GrammarCompiler grammars(MakeTokenTrie(*loaded->tok), 64, std::chrono::milliseconds(o.constraint_compile_ms));
  const ChatTemplate* tmpl = chat_template->get();
  server::ServingState state;
  state.grammars = &grammars;
  if (tool_format) {
    state.tool_format = *tool_format;
  } else if (tmpl) {
    state.tool_format = server::DetectToolCallFormat(tmpl->source());
  }
  state.pooling = pooling.value_or(loaded->model->hparams().pooling);
  state.embedding_dim = loaded->model->hparams().dim;
  if (tmpl) state.reasoning = server::DetectReasoning(tmpl->source());
  state.engine = engine->get();
  state.tokenizer = loaded->tok.get();
  state.chat_template = tmpl;
  state.model_name = name;
  state.created = static_cast<int64_t>(std::time(nullptr));
  state.ollama = OllamaFacts(*loaded->file, name, **engine, state);
  http.SetReady(state);
  if (tmpl) {
    const std::string thinks =
        state.reasoning ? fmt::format("; reasoning in {}...{} blocks", state.reasoning->open, state.reasoning->close) : "";
    std::fprintf(stderr, "tool calls: the %s parser (%s)%s\n", server::ToolCallFormatName(state.tool_format),
                 tool_format ? "--tool-call-parser" : "from the chat template", thinks.c_str());
  }
  std::fprintf(stderr, "ready: serving '%s'\n", name.c_str());
  std::fflush(stderr);
  ServeUntilSignalled(o, signals, http, **engine, parallel);
  return 0;
}

}  // namespace

CommandFn RegisterServe(CLI::App& app) {
  auto o = std::make_shared<ServeOpts>();
  AddServeOptions(app, *o);
  return [o]() { return RunServe(*o); };
}

}  // namespace gale
