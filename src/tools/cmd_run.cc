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
#include "runner/generate.h"
#include "tools/chat.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace gale {
CommandFn RegisterRun(CLI::App& app) {
  struct Opts {
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
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "GGUF model (default: the bundled stories260K)");
  app.add_option("-p,--prompt", o->prompt, "prompt text");
  app.add_option("-n,--n-predict", o->n_predict, "tokens to generate")->capture_default_str();
  app.add_option("-c,--ctx-size", o->ctx, "context size in tokens (0 = the model's)")->capture_default_str();
  app.add_option("-t,--threads", o->threads, "compute threads")->capture_default_str();
  app.add_option("--temp", o->sp.temperature, "temperature (0 = greedy)")->capture_default_str();
  app.add_option("--top-k", o->sp.top_k, "top-k (0 = off)")->capture_default_str();
  app.add_option("--top-p", o->sp.top_p, "top-p (1 = off)")->capture_default_str();
  app.add_option("--min-p", o->sp.min_p, "min-p (0 = off)")->capture_default_str();
  app.add_option("--repeat-penalty", o->sp.repeat_penalty, "repeat penalty (1 = off)")->capture_default_str();
  app.add_option("--repeat-last-n", o->sp.repeat_last_n, "tokens the penalties look back over (-1 = all)")
      ->capture_default_str();
  app.add_option("--presence-penalty", o->sp.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("--frequency-penalty", o->sp.frequency_penalty, "frequency penalty")->capture_default_str();
  app.add_option("-s,--seed", o->seed, "RNG seed (-1 = random)")->capture_default_str();
  app.add_flag("--ignore-eos", o->ignore_eos, "keep generating past end-of-sequence tokens");
  app.add_option("--trace", o->trace, "write a Chrome trace-event JSON of every op (open in Perfetto)");
  app.add_flag("--profile", o->profile, "print time per op, prefill/decode share, CPU-side time and memory");
  app.add_flag("--chat", o->chat, "interactive multi-turn chat with the model's chat template (stdin/stdout)");
  app.add_option("--chat-template", o->chat_template, "with --chat: a Jinja chat template file instead of the model's");
  app.add_option("--system", o->system, "with --chat: a system message");
  o->engine.Register(app);
  o->load.Register(app);
  app.add_option("--isa", o->isa, "force kernels: scalar | avx2 | avx512 (default: best for this CPU)");
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale run: %s\n", s.ToString().c_str());
      return 1;
    };
    if (o->chat) {
      if (Status s = SelectIsa(o->isa); !s.ok()) return fail(s);
      if (o->threads < 1) return fail(InvalidArgument("-t must be >= 1"));
      auto loaded = LoadTextModel(o->model, o->load);
      if (!loaded.ok()) return fail(loaded.status());
      ChatOptions co;
      co.chat_template_file = o->chat_template;
      co.system = o->system;
      co.max_tokens = o->n_predict > 0 ? o->n_predict : 512;
      co.sampling = o->sp;
      co.sampling.seed = o->seed >= 0 ? static_cast<uint64_t>(o->seed)
                                      : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
      co.ignore_eos = o->ignore_eos;
      co.threads = o->threads;
      return RunChat(*loaded, co);
    }
    if (Status s = SelectIsa(o->isa); !s.ok()) return fail(s);
    if (o->n_predict < 0) return fail(InvalidArgument("-n must be >= 0"));
    if (o->threads < 1) return fail(InvalidArgument("-t must be >= 1"));
    auto loaded = LoadTextModel(o->model, o->load);
    if (!loaded.ok()) return fail(loaded.status());
    const std::string& path = loaded->path;
    const bool copy = loaded->copied;
    auto& model = loaded->model;
    auto& tok = loaded->tok;
    const ModelHParams& hp = model->hparams();
    const int64_t ctx = o->ctx > 0 ? o->ctx : hp.context_length;
    std::unique_ptr<Profiler> profiler;
    if (o->profile || !o->trace.empty()) {
      profiler = std::make_unique<Profiler>();
      SetProfiler(profiler.get());
    }
    std::vector<int32_t> prompt;
    {
      ProfileSpan span("tokenize", "cpu");
      prompt = tok->Encode(o->prompt);
    }
    if (prompt.empty()) prompt.push_back(tok->bos_id() >= 0 ? tok->bos_id() : 0);
    int64_t n_predict = o->n_predict;
    if (static_cast<int64_t>(prompt.size()) >= ctx) {
      return fail(InvalidArgument("the prompt has {} tokens, the context only {}", prompt.size(), ctx));
    }
    if (static_cast<int64_t>(prompt.size()) + n_predict > ctx) {
      n_predict = ctx - static_cast<int64_t>(prompt.size());
      std::fprintf(stderr, "note: generating at most %lld tokens to stay within the context of %lld\n",
                   static_cast<long long>(n_predict), static_cast<long long>(ctx));
    }
    GenerationRequest gr;
    gr.prompt = prompt;
    gr.max_tokens = std::max<int64_t>(n_predict, 1);
    gr.sampling = o->sp;
    gr.sampling.seed = o->seed >= 0 ? static_cast<uint64_t>(o->seed)
                                    : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    if (!o->ignore_eos) {
      // End of sequence; llama2.c-style models also end a story by emitting BOS.
      for (int32_t id : {tok->eos_id(), tok->bos_id()}) {
        if (id >= 0) gr.stop_ids.push_back(id);
      }
    }
    ThreadPool pool(o->threads);
    auto cfg = o->engine.Resolve();
    if (!cfg.ok()) return fail(cfg.status());
    cfg->sched.max_batch_size = 1;
    cfg->sched.max_seq_len = ctx;
    auto engine = Engine::Create(*model, tok.get(), *cfg, pool);
    if (!engine.ok()) return fail(engine.status());
    std::fprintf(stderr, "model: %s (%s, dim %lld, %lld layers, vocab %lld, %.1f MiB weights, %s); kernels: %s; threads: %d\n",
                 path.c_str(), hp.arch.c_str(), static_cast<long long>(hp.dim), static_cast<long long>(hp.num_layers),
                 static_cast<long long>(hp.vocab_size), model->weight_bytes() / 1048576.0,
                 copy ? "read into memory" : "mapped", kernels::ActiveKernelsName().c_str(), o->threads);
    std::fputs(o->prompt.c_str(), stdout);
    std::fflush(stdout);
    // The engine's detokenizer starts after the prompt; at the very start (empty prompt) the
    // add-space-prefix space of the first word is dropped, as before.
    const bool at_start = o->prompt.empty();
    auto stream = (*engine)->Submit(std::move(gr));
    if (!stream.ok()) return fail(stream.status());
    StreamUpdate u;
    int64_t generated = 0, prompt_tokens = 0;
    bool first_text = true;
    Status error;
    std::string retention;
    while ((*stream)->Next(&u)) {
      generated += static_cast<int64_t>(u.token_ids.size());
      prompt_tokens = u.num_prompt_tokens;
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
      if (u.finished && u.finish_reason == FinishReason::kError) error = u.status;
      if (u.finished && u.kv_budget > 0) {
        retention = fmt::format("KV retention: {} of {} positions evicted (budget {} tokens)", u.num_evicted_tokens,
                                prompt_tokens + generated, u.kv_budget);
      }
    }
    const auto end = std::chrono::steady_clock::now();
    std::fputc('\n', stdout);
    std::fflush(stdout);  // before the stats on stderr, so the two do not interleave
    if (!error.ok()) return fail(error);
    const auto first = (*stream)->first_token_at();
    const double prompt_s = first ? std::chrono::duration<double>(*first - (*stream)->created_at()).count() : 0.0;
    const double gen_s = first ? std::chrono::duration<double>(end - *first).count() : 0.0;
    const uint64_t kv_bytes = (*engine)->kv_bytes(), activations = (*engine)->activation_bytes();
    std::string spec = (*engine)->DescribeSpec();
    if (!spec.empty()) spec += "; " + (*engine)->DescribeSpecCosts();
    engine->reset();  // the engine thread stops recording before the profile is read
    SetProfiler(nullptr);
    if (!o->trace.empty()) {
      if (Status s = profiler->WriteChromeTrace(o->trace); !s.ok()) return fail(s);
      std::fprintf(stderr, "trace: %s (%zu events)\n", o->trace.c_str(), profiler->events().size());
    }
    if (o->profile) {
      std::fprintf(stderr, "%s", profiler->Summary().c_str());
      std::fprintf(stderr,
                   "memory: weights %.1f MiB (file; %.1f MiB of it given back once packed) + %.1f MiB (packed for "
                   "%s), KV cache %.2f MiB, activations %.2f MiB\n",
                   model->weight_bytes() / 1048576.0, model->released_bytes() / 1048576.0,
                   model->packed_bytes() / 1048576.0, kernels::ActiveKernelsName().c_str(), kv_bytes / 1048576.0,
                   activations / 1048576.0);
    }
    const double pp = prompt_s > 0 ? prompt_tokens / prompt_s : 0.0;
    const int64_t decoded = generated - 1;  // the first token comes from the prefill
    const double tg = decoded > 0 && gen_s > 0 ? decoded / gen_s : 0.0;
    std::fprintf(stderr, "prompt: %lld tokens in %.3f s (%.1f tok/s); generation: %lld tokens in %.3f s (%.1f tok/s)\n",
                 static_cast<long long>(prompt_tokens), prompt_s, pp, static_cast<long long>(generated), gen_s, tg);
    if (!spec.empty()) std::fprintf(stderr, "%s\n", spec.c_str());
    if (!retention.empty()) std::fprintf(stderr, "%s\n", retention.c_str());
    return 0;
  };
}

}  // namespace gale
