// `gale run`: load a GGUF, tokenize the prompt, stream the generated text to stdout, and report
// prompt and generation speed on stderr. Without -m it runs the bundled default model.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "base/cpu.h"
#include "base/profiler.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "tools/chat.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace gale {
namespace {

struct RunOpts {
  std::string model, prompt, isa;
  int64_t n_predict = 128;
  int64_t ctx = 0;
  int threads = ThreadPool::DefaultNumThreads();
  int64_t seed = -1;
  bool ignore_eos = false;
  bool profile = false;
  std::string trace;
  LoadOptions load;
  SamplingParams sp;
  bool chat = false;
  std::string chat_template, system;
  EngineOptions engine;
};

void AddRunOptions(CLI::App& app, RunOpts& o) {
  app.add_option("-m,--model", o.model, "GGUF model (default: the bundled stories260K)");
  app.add_option("-p,--prompt", o.prompt, "prompt text");
  app.add_option("-n,--n-predict", o.n_predict, "tokens to generate")->capture_default_str();
  app.add_option("-c,--ctx-size", o.ctx, "context size in tokens (0 = the model's)")->capture_default_str();
  app.add_option("-t,--threads", o.threads, "compute threads")->capture_default_str();
  app.add_option("--temp", o.sp.temperature, "temperature (0 = greedy)")->capture_default_str();
  app.add_option("--top-k", o.sp.top_k, "top-k (0 = off)")->capture_default_str();
  app.add_option("--top-p", o.sp.top_p, "top-p (1 = off)")->capture_default_str();
  app.add_option("--min-p", o.sp.min_p, "min-p (0 = off)")->capture_default_str();
  app.add_option("--repeat-penalty", o.sp.repeat_penalty, "repeat penalty (1 = off)")->capture_default_str();
  app.add_option("--repeat-last-n", o.sp.repeat_last_n, "tokens the penalties look back over (-1 = all)")
      ->capture_default_str();
  app.add_option("--presence-penalty", o.sp.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("--frequency-penalty", o.sp.frequency_penalty, "frequency penalty")->capture_default_str();
  app.add_option("-s,--seed", o.seed, "RNG seed (-1 = random)")->capture_default_str();
  app.add_flag("--ignore-eos", o.ignore_eos, "keep generating past end-of-sequence tokens");
  app.add_option("--trace", o.trace, "write a Chrome trace-event JSON of every op (open in Perfetto)");
  app.add_flag("--profile", o.profile, "print time per op, prefill/decode share, CPU-side time and memory");
  app.add_flag("--chat", o.chat, "interactive multi-turn chat with the model's chat template (stdin/stdout)");
  app.add_option("--chat-template", o.chat_template, "with --chat: a Jinja chat template file instead of the model's");
  app.add_option("--system", o.system, "with --chat: a system message");
  o.engine.Register(app);
  o.load.Register(app);
  app.add_option("--isa", o.isa, "force kernels: scalar | avx2 | avx512 (default: best for this CPU)");
}

int Fail(const Status& s) {
  std::fprintf(stderr, "gale run: %s\n", s.ToString().c_str());
  return 1;
}

uint64_t SeedOf(const RunOpts& o) {
  return o.seed >= 0 ? static_cast<uint64_t>(o.seed)
                     : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

// --chat: the interactive loop of tools/chat.
int RunChatMode(const RunOpts& o) {
  if (Status s = SelectIsa(o.isa); !s.ok()) return Fail(s);
  if (o.threads < 1) return Fail(InvalidArgument("-t must be >= 1"));
  auto loaded = LoadTextModel(o.model, o.load);
  if (!loaded.ok()) return Fail(loaded.status());
  ChatOptions co;
  co.chat_template_file = o.chat_template;
  co.system = o.system;
  co.max_tokens = o.n_predict > 0 ? o.n_predict : 512;
  co.sampling = o.sp;
  co.sampling.seed = SeedOf(o);
  co.ignore_eos = o.ignore_eos;
  co.threads = o.threads;
  return RunChat(*loaded, co);
}

// The prompt's tokens and the request, its length cut to fit the context.
StatusOr<GenerationRequest> MakeRequest(const RunOpts& o, const Tokenizer& tok, int64_t ctx) {
  std::vector<int32_t> prompt;
  {
    ProfileSpan span("tokenize", "cpu");
    prompt = tok.Encode(o.prompt);
  }
  if (prompt.empty()) prompt.push_back(tok.bos_id() >= 0 ? tok.bos_id() : 0);
  int64_t n_predict = o.n_predict;
  if (static_cast<int64_t>(prompt.size()) >= ctx) {
    return InvalidArgument("the prompt has {} tokens, the context only {}", prompt.size(), ctx);
  }
  if (static_cast<int64_t>(prompt.size()) + n_predict > ctx) {
    n_predict = ctx - static_cast<int64_t>(prompt.size());
    std::fprintf(stderr, "note: generating at most %lld tokens to stay within the context of %lld\n",
                 static_cast<long long>(n_predict), static_cast<long long>(ctx));
  }
  GenerationRequest gr;
  gr.prompt = prompt;
  gr.max_tokens = std::max<int64_t>(n_predict, 1);
  gr.sampling = o.sp;
  gr.sampling.seed = SeedOf(o);
  if (!o.ignore_eos) {
    // End of generation; llama2.c-style models also end a story by emitting BOS.
    gr.stop_ids = tok.eog_ids();
    if (tok.bos_id() >= 0) gr.stop_ids.push_back(tok.bos_id());
  }
  return gr;
}

struct Streamed {
  int64_t generated = 0, prompt_tokens = 0;
  Status error;
  std::string retention;  // what KV retention evicted, if it ran
};

// The generated text to stdout as it comes. The engine's detokenizer starts after the prompt; at
// the very start (empty prompt) the add-space-prefix space of the first word is dropped.
Streamed StreamToStdout(RequestStream& stream, bool at_start) {
  Streamed r;
  StreamUpdate u;
  bool first_text = true;
  while (stream.Next(&u)) {
    r.generated += static_cast<int64_t>(u.token_ids.size());
    r.prompt_tokens = u.num_prompt_tokens;
    std::string text = u.text;
    if (at_start && first_text && !text.empty()) {
      if (text[0] == ' ') text.erase(0, 1);
      first_text = false;
    }
    {
      ProfileSpan span("detokenize_emit", "cpu");
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    if (u.finished && u.finish_reason == FinishReason::kError) r.error = u.status;
    if (u.finished && u.kv_budget > 0) {
      r.retention = fmt::format("KV retention: {} of {} positions evicted (budget {} tokens)", u.num_evicted_tokens,
                                r.prompt_tokens + r.generated, u.kv_budget);
    }
  }
  return r;
}

int RunOnce(RunOpts& o) {
  if (Status s = SelectIsa(o.isa); !s.ok()) return Fail(s);
  if (o.n_predict < 0) return Fail(InvalidArgument("-n must be >= 0"));
  if (o.threads < 1) return Fail(InvalidArgument("-t must be >= 1"));
  auto loaded = LoadTextModel(o.model, o.load);
  if (!loaded.ok()) return Fail(loaded.status());
  const Model& model = *loaded->model;
  const Tokenizer& tok = *loaded->tok;
  const ModelHParams& hp = model.hparams();
  const int64_t ctx = o.ctx > 0 ? o.ctx : hp.context_length;
  std::unique_ptr<Profiler> profiler;
  if (o.profile || !o.trace.empty()) {
    profiler = std::make_unique<Profiler>();
    SetProfiler(profiler.get());
  }
  auto gr = MakeRequest(o, tok, ctx);
  if (!gr.ok()) return Fail(gr.status());
  ThreadPool pool(o.threads);
  auto cfg = o.engine.Resolve();
  if (!cfg.ok()) return Fail(cfg.status());
  cfg->sched.max_batch_size = 1;
  cfg->sched.max_seq_len = ctx;
  auto engine = Engine::Create(model, &tok, *cfg, pool);
  if (!engine.ok()) return Fail(engine.status());
  std::fprintf(stderr, "model: %s (%s, dim %lld, %lld layers, vocab %lld, %.1f MiB weights, %s); kernels: %s; threads: %d\n",
               loaded->path.c_str(), hp.arch.c_str(), static_cast<long long>(hp.dim), static_cast<long long>(hp.num_layers),
               static_cast<long long>(hp.vocab_size), model.weight_bytes() / 1048576.0,
               loaded->copied ? "read into memory" : "mapped", kernels::ActiveKernelsName().c_str(), o.threads);
  std::fputs(o.prompt.c_str(), stdout);
  std::fflush(stdout);
  auto stream = (*engine)->Submit(std::move(*gr));
  if (!stream.ok()) return Fail(stream.status());
  const Streamed r = StreamToStdout(**stream, o.prompt.empty());
  const auto end = std::chrono::steady_clock::now();
  std::fputc('\n', stdout);
  std::fflush(stdout);  // before the stats on stderr, so the two do not interleave
  if (!r.error.ok()) return Fail(r.error);
  const auto first = (*stream)->first_token_at();
  const double prompt_s = first ? std::chrono::duration<double>(*first - (*stream)->created_at()).count() : 0.0;
  const double gen_s = first ? std::chrono::duration<double>(end - *first).count() : 0.0;
  const uint64_t kv_bytes = (*engine)->kv_bytes(), activations = (*engine)->activation_bytes();
  std::string spec = (*engine)->DescribeSpec();
  if (!spec.empty()) spec += "; " + (*engine)->DescribeSpecCosts();
  engine->reset();  // the engine thread stops recording before the profile is read
  SetProfiler(nullptr);
  if (!o.trace.empty()) {
    if (Status s = profiler->WriteChromeTrace(o.trace); !s.ok()) return Fail(s);
    std::fprintf(stderr, "trace: %s (%zu events)\n", o.trace.c_str(), profiler->events().size());
  }
  if (o.profile) {
    std::fprintf(stderr, "%s", profiler->Summary().c_str());
    std::fprintf(stderr,
                 "memory: weights %.1f MiB (file; %.1f MiB of it given back once packed) + %.1f MiB (packed for "
                 "%s), KV cache %.2f MiB, activations %.2f MiB\n",
                 model.weight_bytes() / 1048576.0, model.released_bytes() / 1048576.0,
                 model.packed_bytes() / 1048576.0, kernels::ActiveKernelsName().c_str(), kv_bytes / 1048576.0,
                 activations / 1048576.0);
  }
  const double pp = prompt_s > 0 ? r.prompt_tokens / prompt_s : 0.0;
  const int64_t decoded = r.generated - 1;  // the first token comes from the prefill
  const double tg = decoded > 0 && gen_s > 0 ? decoded / gen_s : 0.0;
  std::fprintf(stderr, "prompt: %lld tokens in %.3f s (%.1f tok/s); generation: %lld tokens in %.3f s (%.1f tok/s)\n",
               static_cast<long long>(r.prompt_tokens), prompt_s, pp, static_cast<long long>(r.generated), gen_s, tg);
  if (!spec.empty()) std::fprintf(stderr, "%s\n", spec.c_str());
  if (!r.retention.empty()) std::fprintf(stderr, "%s\n", r.retention.c_str());
  return 0;
}

}  // namespace

CommandFn RegisterRun(CLI::App& app) {
  auto o = std::make_shared<RunOpts>();
  AddRunOptions(app, *o);
  return [o]() { return o->chat ? RunChatMode(*o) : RunOnce(*o); };
}

}  // namespace gale
