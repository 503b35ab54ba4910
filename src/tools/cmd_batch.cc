// `gale batch`: offline batched generation. Reads JSONL requests, runs them all through the
// engine at once (continuous batching), writes one JSONL result per input line in input order,
// shows progress on a terminal and ends with a throughput summary. A bad line gets an "error"
// result and the rest still run (exit status 2 then).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/compiler.h"
#include "kernels/kernels.h"
#include "server/openai_api.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace gale {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Item {
  Json id;
  std::string prompt;
  GenerationRequest req;
  std::string error;  // set: this line fails without running
  std::shared_ptr<RequestStream> stream;
  std::string text;
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  Status status;
  int64_t num_prompt_tokens = 0, num_truncated_tokens = 0;
  int64_t kv_budget = 0, num_evicted_tokens = 0;
  bool done = false;
};

const char* OpenAiFinishReason(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    default: return "error";
  }
}

// Reads one line's fields over the defaults; "" on success, else what is wrong. Structured
// output fields (as the server takes them) are compiled by `grammars`.
std::string ParseLine(const std::string& line, const GenerationRequest& defaults, uint64_t default_seed,
                      grammar::GrammarCompiler& grammars, Item* item) {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "not valid JSON";
  if (!j.is_object()) return "a line must be a JSON object";
  item->req = defaults;
  item->req.sampling.seed = default_seed;
  if (j.contains("id")) item->id = j["id"];
  if (!j.contains("prompt") || !j["prompt"].is_string()) return "\"prompt\" (a string) is required";
  item->prompt = j["prompt"].get<std::string>();
  auto number = [&](const char* key, auto* out) -> std::string {
    if (!j.contains(key) || j[key].is_null()) return "";
    if (!j[key].is_number()) return fmt::format("\"{}\" must be a number", key);
    *out = j[key].get<std::remove_pointer_t<decltype(out)>>();
    return "";
  };
  if (auto e = number("max_tokens", &item->req.max_tokens); !e.empty()) return e;
  if (j.contains("max_tokens") && item->req.max_tokens < 1) return "\"max_tokens\" must be >= 1";
  if (auto e = number("temperature", &item->req.sampling.temperature); !e.empty()) return e;
  if (auto e = number("top_p", &item->req.sampling.top_p); !e.empty()) return e;
  if (j.contains("seed")) {
    if (!j["seed"].is_number_integer()) return "\"seed\" must be an integer";
    item->req.sampling.seed = j["seed"].get<uint64_t>();
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const Json& s = j["stop"];
    if (s.is_string()) {
      item->req.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& e : s) {
        if (!e.is_string()) return "\"stop\" must be a string or an array of strings";
        item->req.stop.push_back(e.get<std::string>());
      }
    } else {
      return "\"stop\" must be a string or an array of strings";
    }
  }
  // Again with the keys in their order: a schema's properties are written in it.
  server::CompletionRequest cr;
  if (auto e = server::ParseConstraintFields(server::Json::parse(line), &cr)) return e->message;
  if (cr.constraint) {
    auto g = grammars.Compile(*cr.constraint);
    if (!g.ok()) return fmt::format("\"{}\": {}", cr.constraint_param, g.status().message());
    item->req.grammar = std::move(*g);
  }
  return "";
}

struct BatchOpts {
  std::string model, input, output, isa;
  int threads = ThreadPool::DefaultNumThreads();
  int64_t max_tokens = 128;
  int64_t seed = 0;
  bool ignore_eos = false, truncate = false, no_progress = false;
  SamplingParams sp;
  LoadOptions load;
  EngineOptions engine;
  ParallelFlags parallel;
};

void AddBatchOptions(CLI::App& app, BatchOpts& o) {
  app.add_option("-m,--model", o.model, "GGUF model (default: the bundled stories260K)");
  app.add_option("-i,--input", o.input, "JSONL requests: {\"id\", \"prompt\", \"max_tokens\", \"temperature\", "
                                         "\"top_p\", \"seed\", \"stop\", and the server's structured-output fields "
                                         "(response_format, guided_json, ...)}, all but prompt optional")->required();
  app.add_option("-o,--output", o.output, "JSONL results, one per input line in input order")->required();
  app.add_option("-t,--threads", o.threads, "compute threads")->capture_default_str();
  app.add_option("-n,--max-tokens", o.max_tokens, "default max_tokens")->capture_default_str();
  app.add_option("--temp", o.sp.temperature, "default temperature (0 = greedy)")->capture_default_str();
  app.add_option("--top-k", o.sp.top_k, "top-k (0 = off)")->capture_default_str();
  app.add_option("--top-p", o.sp.top_p, "default top-p (1 = off)")->capture_default_str();
  app.add_option("--min-p", o.sp.min_p, "min-p (0 = off)")->capture_default_str();
  app.add_option("-s,--seed", o.seed, "base seed: a line without \"seed\" uses base + its line number")
      ->capture_default_str();
  app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-sequence tokens");
  app.add_flag("--truncate", o.truncate, "drop the middle of prompts too long to fit instead of failing them");
  app.add_flag("--no-progress", o.no_progress, "no progress bar");
  o.engine.Register(app);
  o.load.Register(app);
  o.parallel.Register(app);
  app.add_option("--isa", o.isa, "force kernels: scalar | avx2 | avx512 (default: best for this CPU)");
}

// Every non-blank line of the input as an item (a bad one with its error), prompts tokenized.
std::vector<Item> ReadItems(std::istream& in, const BatchOpts& o, const Tokenizer& tok, ThreadPool& pool) {
  GenerationRequest defaults;
  defaults.max_tokens = o.max_tokens;
  defaults.sampling = o.sp;
  defaults.truncate = o.truncate;
  if (!o.ignore_eos) {
    // End of generation; llama2.c-style models also end a story by emitting BOS.
    defaults.stop_ids = tok.eog_ids();
    if (tok.bos_id() >= 0) defaults.stop_ids.push_back(tok.bos_id());
  }
  grammar::GrammarCompiler grammars(MakeTokenTrie(tok));
  std::vector<Item> items;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Item item;
    item.id = line_no;
    const std::string err = ParseLine(line, defaults, static_cast<uint64_t>(o.seed + line_no), grammars, &item);
    if (!err.empty()) item.error = fmt::format("{}:{}: {}", o.input, line_no, err);
    items.push_back(std::move(item));
  }
  std::vector<std::string> texts;
  for (const Item& it : items) texts.push_back(it.prompt);
  auto ids = tok.EncodeBatch(texts, pool);
  for (size_t i = 0; i < items.size(); ++i) items[i].req.prompt = std::move(ids[i]);
  return items;
}

// Collects the streams' results and writes each line as soon as all lines before it are written.
class Collector {
 public:
  Collector(std::vector<Item>& items, std::ostream& out) : items_(items), out_(out) {}

  // Takes what the streams have now; true if anything came.
  bool Poll() {
    bool any = false;
    for (Item& it : items_) {
      if (it.done) continue;
      if (!it.stream) {
        it.done = true;
        ++num_done_;
        any = true;
        continue;
      }
      StreamUpdate u;
      while (it.stream->NextUntil(Clock::now(), &u)) {
        any = true;
        it.tokens.insert(it.tokens.end(), u.token_ids.begin(), u.token_ids.end());
        generated_ += static_cast<int64_t>(u.token_ids.size());
        it.text += u.text;
        it.num_prompt_tokens = u.num_prompt_tokens;
        it.num_truncated_tokens = u.num_truncated_tokens;
        if (u.finished) {
          it.kv_budget = u.kv_budget;
          it.num_evicted_tokens = u.num_evicted_tokens;
          it.reason = u.finish_reason;
          it.status = u.status;
          it.done = true;
          ++num_done_;
          prompt_tokens_ += it.num_prompt_tokens;
          break;
        }
      }
    }
    return any;
  }

  void WriteReady() {
    for (; next_to_write_ < items_.size() && items_[next_to_write_].done; ++next_to_write_) {
      Item& it = items_[next_to_write_];
      Json j;
      j["id"] = it.id;
      if (!it.error.empty() || it.reason == FinishReason::kError) {
        j["error"] = !it.error.empty() ? it.error : it.status.message();
        ++num_failed_;
      } else {
        j["text"] = it.text;
        j["tokens"] = it.tokens;
        j["finish_reason"] = OpenAiFinishReason(it.reason);
        j["prompt_tokens"] = it.num_prompt_tokens;
        if (it.num_truncated_tokens > 0) j["truncated_tokens"] = it.num_truncated_tokens;
        if (it.kv_budget > 0) j["kv_evicted_tokens"] = it.num_evicted_tokens;
      }
      out_ << j.dump(-1, ' ', false, Json::error_handler_t::replace) << '\n';
      it.text.clear();
      it.tokens.clear();
    }
  }

  void DrawProgress(double sec) const {
    const int width = 30;
    const int filled = items_.empty() ? width : static_cast<int>(width * num_done_ / items_.size());
    std::fprintf(stderr, "\r[%s%s] %zu/%zu requests, %lld tokens, %.1f tok/s ", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), num_done_, items_.size(), static_cast<long long>(generated_),
                 sec > 0 ? generated_ / sec : 0.0);
  }

  bool finished() const { return num_done_ == items_.size(); }
  size_t num_failed() const { return num_failed_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t generated() const { return generated_; }

 private:
  std::vector<Item>& items_;
  std::ostream& out_;
  size_t num_done_ = 0, next_to_write_ = 0, num_failed_ = 0;
  int64_t prompt_tokens_ = 0, generated_ = 0;
};

void PrintSummary(const Engine& engine, const Collector& c, size_t num_items, double sec) {
  const EngineStats& st = engine.stats();
  const int64_t bs = engine.config().block_size;
  const int64_t peak_blocks = st.max_used_blocks.load();
  const int64_t prompt_tokens = c.prompt_tokens(), generated = c.generated();
  std::fprintf(stderr,
               "batch: %zu requests (%zu failed) in %.2f s: %lld prompt + %lld generated tokens; %.1f generated tok/s, "
               "%.1f total tok/s; %lld steps, %lld preemptions; KV peak %lld of %lld blocks, waste at most %lld "
               "slots (%.1f%% of the peak)\n",
               num_items, c.num_failed(), sec, static_cast<long long>(prompt_tokens), static_cast<long long>(generated),
               sec > 0 ? generated / sec : 0.0, sec > 0 ? (prompt_tokens + generated) / sec : 0.0,
               static_cast<long long>(st.num_steps.load()), static_cast<long long>(st.num_preemptions.load()),
               static_cast<long long>(peak_blocks), static_cast<long long>(engine.num_blocks()),
               static_cast<long long>(st.max_wasted_slots.load()),
               peak_blocks > 0 ? 100.0 * st.max_wasted_slots.load() / (peak_blocks * bs) : 0.0);
  if (engine.config().enable_prefix_caching) {
    std::fprintf(stderr, "prefix cache: %lld of %lld prompt tokens found, %lld blocks cached, %lld evictions\n",
                 static_cast<long long>(st.prefix_cache_hit_tokens.load()),
                 static_cast<long long>(st.prefix_cache_query_tokens.load()),
                 static_cast<long long>(st.prefix_cache_blocks.load()),
                 static_cast<long long>(st.prefix_cache_evictions.load()));
  }
  if (const std::string spec = engine.DescribeSpec(); !spec.empty()) std::fprintf(stderr, "%s\n", spec.c_str());
}

int Fail(const Status& s) {
  std::fprintf(stderr, "gale batch: %s\n", s.ToString().c_str());
  return 1;
}

int RunBatch(BatchOpts& o) {
  if (Status s = SelectIsa(o.isa); !s.ok()) return Fail(s);
  auto rank = StartParallelRank(o.parallel, o.model, &o.load, o.threads, "batch");
  if (!rank.ok()) return Fail(rank.status());
  if (rank->exit_code) return *rank->exit_code;
  ParallelGuard parallel(rank->comm);  // outlives the engine
  if (o.threads < 1) return Fail(InvalidArgument("-t must be >= 1"));
  if (o.max_tokens < 1) return Fail(InvalidArgument("-n must be >= 1"));
  auto cfg = o.engine.Resolve();
  if (!cfg.ok()) return Fail(cfg.status());
  std::ifstream in(o.input);
  if (!in) return Fail(IoError("cannot open {}", o.input));
  std::ofstream out(o.output);
  if (!out) return Fail(IoError("cannot write {}", o.output));
  auto loaded = LoadTextModel(o.model, o.load);
  if (!loaded.ok()) return Fail(loaded.status());
  const Tokenizer& tok = *loaded->tok;
  ThreadPool pool(o.threads);
  std::vector<Item> items = ReadItems(in, o, tok, pool);
  if (Status s = parallel.Connect(o.parallel, *loaded->model, &*cfg); !s.ok()) return Fail(s);
  auto engine = Engine::Create(*loaded->model, &tok, *cfg, pool);
  if (!engine.ok()) return Fail(engine.status());
  const ModelHParams& hp = loaded->model->hparams();
  std::fprintf(stderr, "model: %s (%s, dim %lld, %lld layers, %.1f MiB weights); kernels: %s; threads: %d\n",
               loaded->path.c_str(), hp.arch.c_str(), static_cast<long long>(hp.dim),
               static_cast<long long>(hp.num_layers), loaded->model->weight_bytes() / 1048576.0,
               kernels::ActiveKernelsName().c_str(), o.threads);
  std::fprintf(stderr, "%s\n", (*engine)->Describe().c_str());

  const auto t0 = Clock::now();
  for (Item& it : items) {
    if (!it.error.empty()) continue;
    auto s = (*engine)->Submit(it.req);
    if (!s.ok()) {
      it.error = s.status().message();
      continue;
    }
    it.stream = *s;
  }
  const bool progress = !o.no_progress && isatty(STDERR_FILENO);
  Collector collector(items, out);
  auto last_draw = Clock::now();
  while (true) {
    const bool any = collector.Poll();
    collector.WriteReady();
    const bool finished = collector.finished();
    if (progress && (finished || Clock::now() - last_draw > std::chrono::milliseconds(100))) {
      collector.DrawProgress(std::chrono::duration<double>(Clock::now() - t0).count());
      last_draw = Clock::now();
    }
    if (finished) break;
    if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (progress) std::fputc('\n', stderr);
  out.flush();
  if (!out) return Fail(IoError("writing {} failed", o.output));
  PrintSummary(**engine, collector, items.size(), std::chrono::duration<double>(Clock::now() - t0).count());
  return collector.num_failed() > 0 ? 2 : 0;
}

}  // namespace

CommandFn RegisterBatch(CLI::App& app) {
  auto o = std::make_shared<BatchOpts>();
  AddBatchOptions(app, *o);
  return [o]() { return RunBatch(*o); };
}

}  // namespace gale
