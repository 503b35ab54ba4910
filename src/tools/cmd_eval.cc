// `gale eval ppl`: perplexity of a text, and KL divergence against a base model's saved
// log-probabilities. `gale eval tasks`: greedy outputs against a base model's, per category.
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "engine/api.h"
#include "model/chat_template.h"
#include "tools/cli_common.h"
#include "tools/commands.h"
#include "eval/eval.h"

namespace gale {
namespace {

struct TaskOpts {
  RetentionFlags retention;
  std::string model, base, file, kv_type = "f32", v_type, base_kv_type = "f32", output = "text", key_channels = "auto";
  int threads = ThreadPool::DefaultNumThreads();
};

int TasksFail(const Status& s) {
  std::fprintf(stderr, "gale eval tasks: %s\n", s.ToString().c_str());
  return 1;
}

// The cache flags of the model under test and of the base, checked.
struct TaskCacheFlags {
  kernels::KvType kv, base_kv;
  std::optional<kernels::KvType> v;
  RetentionConfig retention;
  std::optional<bool> key_channels;
};

StatusOr<TaskCacheFlags> ResolveTaskCacheFlags(const TaskOpts& t) {
  TaskCacheFlags f;
  ASSIGN_OR_RETURN(f.kv, ParseKvTypeFlag("--kv-type", t.kv_type));
  ASSIGN_OR_RETURN(f.base_kv, ParseKvTypeFlag("--base-kv-type", t.base_kv_type));
  if (!t.v_type.empty()) {
    ASSIGN_OR_RETURN(kernels::KvType v, ParseKvTypeFlag("--v-cache-dtype", t.v_type));
    f.v = v;
  }
  ASSIGN_OR_RETURN(f.retention, t.retention.Resolve());
  ASSIGN_OR_RETURN(f.key_channels, ParseKeyChannelsFlag(t.key_channels));
  return f;
}

// Every task's turns through the base and the model under test, greedily: turn r's prompt is the
// user turns so far with the base's replies between them.
class TaskRunner {
 public:
  TaskRunner(const std::vector<EvalTask>& list, const LoadedModel& m, Engine& base, Engine& engine)
      : list_(list), tok_(*m.tok), chat_(ChatTemplate::FromGguf(*m.file)), base_(base), engine_(engine),
        replies_(list.size()), outcomes_(list.size()) {}

  Status Run() {
    size_t max_turns = 0;
    for (const auto& task : list_) max_turns = std::max(max_turns, task.turns.size());
    for (size_t r = 0; r < max_turns; ++r) RETURN_IF_ERROR(RunTurn(r));
    return Status::Ok();
  }

  std::vector<TaskOutcome>& outcomes() { return outcomes_; }

 private:
  StatusOr<std::vector<int32_t>> PromptOf(size_t i, size_t r) const {
    const EvalTask& task = list_[i];
    if (task.turns.size() == 1) return tok_.Encode(task.turns[0]);
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    std::string plain;
    for (size_t k = 0; k <= r; ++k) {
      messages.push_back({{"role", "user"}, {"content", task.turns[k]}});
      plain += "User: " + task.turns[k] + "\nAssistant:";
      if (k < r) {
        messages.push_back({{"role", "assistant"}, {"content", replies_[i][k]}});
        plain += replies_[i][k] + "\n";
      }
    }
    if (!chat_.ok()) return tok_.Encode(plain);
    const std::string bos = tok_.bos_id() >= 0 ? tok_.TokenToPiece(tok_.bos_id()) : "";
    const std::string eos = tok_.eos_id() >= 0 ? tok_.TokenToPiece(tok_.eos_id()) : "";
    ASSIGN_OR_RETURN(std::string text, chat_->Apply(MarkLiteralSpecialTexts(tok_, messages), true, bos, eos));
    return TokenizeChatPrompt(tok_, text);
  }

  static Status Collect(RequestStream& s, std::vector<int32_t>* ids, std::string* text) {
    StreamUpdate u;
    while (s.Next(&u)) {
      ids->insert(ids->end(), u.token_ids.begin(), u.token_ids.end());
      *text += u.text;
      if (u.finished && u.finish_reason == FinishReason::kError) return u.status;
    }
    return Status::Ok();
  }

  // Turn r of every task that has one, all submitted at once to both engines.
  Status RunTurn(size_t r) {
    struct Pending {
      size_t task;
      std::shared_ptr<RequestStream> base, got;
    };
    std::vector<Pending> pending;
    for (size_t i = 0; i < list_.size(); ++i) {
      if (r >= list_[i].turns.size()) continue;
      const std::string what = "task " + list_[i].id;
      auto prompt = PromptOf(i, r);
      if (!prompt.ok()) return prompt.status().WithContext(what);
      GenerationRequest req;
      req.prompt = *prompt;
      req.max_tokens = list_[i].max_tokens;
      req.sampling.temperature = 0.0f;
      req.stop_ids = tok_.eog_ids();
      if (tok_.bos_id() >= 0) req.stop_ids.push_back(tok_.bos_id());
      auto bs = base_.Submit(req);
      if (!bs.ok()) return bs.status().WithContext(what);
      auto gs = engine_.Submit(req);
      if (!gs.ok()) return gs.status().WithContext(what);
      pending.push_back({i, *bs, *gs});
    }
    for (auto& p : pending) {
      std::vector<int32_t> bt, gt;
      std::string btext, gtext;
      RETURN_IF_ERROR(Collect(*p.base, &bt, &btext));
      RETURN_IF_ERROR(Collect(*p.got, &gt, &gtext));
      TaskOutcome& o = outcomes_[p.task];
      o.base.insert(o.base.end(), bt.begin(), bt.end());
      o.got.insert(o.got.end(), gt.begin(), gt.end());
      o.base_text += (r > 0 ? "\n" : "") + btext;
      o.got_text += (r > 0 ? "\n" : "") + gtext;
      replies_[p.task].push_back(btext);
    }
    return Status::Ok();
  }

  const std::vector<EvalTask>& list_;
  const Tokenizer& tok_;
  const StatusOr<ChatTemplate> chat_;
  Engine& base_;
  Engine& engine_;
  std::vector<std::vector<std::string>> replies_;
  std::vector<TaskOutcome> outcomes_;
};

// Each outcome's agreement with the base (exact, first divergence, whether structured ones
// parse), as the JSON report's per-task entries.
nlohmann::json CompareOutcomes(const std::vector<EvalTask>& list, std::vector<TaskOutcome>& outcomes) {
  nlohmann::json per_task = nlohmann::json::array();
  for (size_t i = 0; i < list.size(); ++i) {
    TaskOutcome& o = outcomes[i];
    o.exact = o.base == o.got;
    size_t d = 0;
    while (d < o.base.size() && d < o.got.size() && o.base[d] == o.got[d]) ++d;
    o.first_divergence = static_cast<int64_t>(d);
    if (list[i].structured()) {
      o.base_parses = nlohmann::json::accept(list[i].json_prefix + o.base_text);
      o.got_parses = nlohmann::json::accept(list[i].json_prefix + o.got_text);
    }
    per_task.push_back({{"id", list[i].id},
                        {"category", list[i].category},
                        {"exact", o.exact},
                        {"first_divergence", o.first_divergence},
                        {"base_tokens", o.base.size()},
                        {"tokens", o.got.size()},
                        {"base_text", o.base_text},
                        {"text", o.got_text}});
    if (list[i].structured()) {
      per_task.back()["base_parses"] = o.base_parses;
      per_task.back()["parses"] = o.got_parses;
    }
  }
  return per_task;
}

void PrintTaskScores(const TaskOpts& t, const std::vector<CategoryScore>& scores, const nlohmann::json& per_task,
                     const std::string& model_path, const std::string& base_path) {
  if (t.output == "json") {
    nlohmann::json cats = nlohmann::json::array();
    for (const auto& c : scores) {
      cats.push_back({{"category", c.category},
                      {"tasks", c.tasks},
                      {"exact_match_rate", static_cast<double>(c.exact) / static_cast<double>(c.tasks)},
                      {"mean_first_divergence", c.mean_first_divergence},
                      {"token_agreement", c.token_agreement},
                      {"base_parses", c.base_parses},
                      {"no_longer_parse", c.no_longer_parse}});
    }
    std::printf("%s\n", nlohmann::json({{"model", model_path}, {"base", base_path}, {"kv_type", t.kv_type},
                                        {"base_kv_type", t.base_kv_type},
                                        {"kv_retention", t.retention.Describe()}, {"categories", cats}, {"tasks", per_task}})
                            .dump(2)
                            .c_str());
    return;
  }
  std::printf("| category | tasks | exact match | mean first divergence (tokens) | tokens agreeing before it | structured: no longer parse |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto& c : scores) {
    std::printf("| %s | %lld | %.1f%% | %.1f | %.1f%% | %s |\n", c.category.c_str(), static_cast<long long>(c.tasks),
                100.0 * static_cast<double>(c.exact) / static_cast<double>(c.tasks), c.mean_first_divergence,
                100.0 * c.token_agreement,
                c.base_parses > 0 ? fmt::format("{} of {}", c.no_longer_parse, c.base_parses).c_str() : "-");
  }
}

int RunTasks(const TaskOpts& t) {
  if (t.output != "text" && t.output != "json") return TasksFail(InvalidArgument("-o must be text or json"));
  if (t.threads < 1) return TasksFail(InvalidArgument("-t must be >= 1"));
  auto flags = ResolveTaskCacheFlags(t);
  if (!flags.ok()) return TasksFail(flags.status());
  auto text = ReadTextFile(t.file);
  if (!text.ok()) return TasksFail(text.status());
  auto parsed = ParseTasks(*text);
  if (!parsed.ok()) return TasksFail(parsed.status().WithContext(t.file));
  const std::vector<EvalTask>& list = *parsed;
  auto m = LoadTextModel(t.model, LoadOptions{});
  if (!m.ok()) return TasksFail(m.status());
  std::optional<LoadedModel> b;
  const LoadedModel* base = &*m;
  if (!t.base.empty() && t.base != m->path) {
    auto bl = LoadTextModel(t.base, LoadOptions{});
    if (!bl.ok()) return TasksFail(bl.status().WithContext("--base"));
    if (bl->model->hparams().vocab_size != m->model->hparams().vocab_size) {
      return TasksFail(InvalidArgument("the base's vocabulary ({}) differs from the model's ({})",
                                       bl->model->hparams().vocab_size, m->model->hparams().vocab_size));
    }
    b.emplace(std::move(*bl));
    base = &*b;
  }
  ThreadPool pool(t.threads);
  auto make_engine = [&](const LoadedModel& lm, kernels::KvType k, std::optional<kernels::KvType> vt,
                         const RetentionConfig& rc = {}, std::optional<bool> kc = std::nullopt) {
    EngineConfig cfg;
    cfg.retention = rc;
    cfg.key_channels = kc;
    cfg.kv_type = k;
    cfg.v_kv_type = vt;
    cfg.kv_cache_memory_bytes = 256ull << 20;
    return Engine::Create(*lm.model, lm.tok.get(), cfg, pool);
  };
  auto base_engine = make_engine(*base, flags->base_kv, std::nullopt);
  if (!base_engine.ok()) return TasksFail(base_engine.status());
  auto engine = make_engine(*m, flags->kv, flags->v, flags->retention, flags->key_channels);
  if (!engine.ok()) return TasksFail(engine.status());
  TaskRunner runner(list, *m, **base_engine, **engine);
  if (Status s = runner.Run(); !s.ok()) return TasksFail(s);
  const nlohmann::json per_task = CompareOutcomes(list, runner.outcomes());
  PrintTaskScores(t, ScoreTasks(list, runner.outcomes()), per_task, m->path, base->path);
  return 0;
}

}  // namespace

CommandFn RegisterEval(CLI::App& app) {
  struct Opts {
    std::string model, file, save_logits, kl_base, kv_type = "f32", v_type, output = "text", key_channels = "auto";
    int64_t ctx = 0, stride = 0;
    int threads = ThreadPool::DefaultNumThreads();
    LoadOptions load;
    RetentionFlags retention;
  };
  auto o = std::make_shared<Opts>();
  app.require_subcommand(1);
  CLI::App* ppl = app.add_subcommand("ppl", "perplexity of a text; KL divergence against a base model's log-probabilities");
  ppl->add_option("-m,--model", o->model, "GGUF model (default: the bundled one)");
  ppl->add_option("-f,--file", o->file, "the text")->required();
  ppl->add_option("--ctx", o->ctx, "window length in tokens (default: the model's context)");
  ppl->add_option("--stride", o->stride, "window step (default: half the window)");
  ppl->add_option("--kv-type", o->kv_type, "KV cache type during the evaluation: f32 | f16 | bf16 | int8 | int4")
      ->capture_default_str();
  ppl->add_option("--v-cache-dtype", o->v_type, "V's type when it differs from --kv-type");
  ppl->add_option("--kv-key-channels", o->key_channels, kKeyChannelsHelp)->capture_default_str();
  ppl->add_option("--save-logits", o->save_logits, "write every scored position's log-probabilities (the base for --kl-base)");
  ppl->add_option("--kl-base", o->kl_base, "compare with a base's --save-logits file: KL divergence, top-1 agreement");
  ppl->add_option("-t,--threads", o->threads, "threads")->capture_default_str();
  ppl->add_option("-o,--output", o->output, "text | json")->capture_default_str();
  o->load.Register(*ppl);
  o->retention.Register(*ppl, "KV retention: positions kept as a share of the window");

  auto t = std::make_shared<TaskOpts>();
  CLI::App* tasks = app.add_subcommand("tasks", "greedy outputs against a base model's: exact match, first divergence, "
                                                "structured outputs that no longer parse, per category");
  tasks->add_option("-m,--model", t->model, "GGUF model to evaluate (default: the bundled one)");
  tasks->add_option("--base", t->base, "GGUF base model (default: the same file, e.g. to evaluate a KV type)");
  tasks->add_option("-f,--file", t->file, "tasks JSONL")->required();
  tasks->add_option("--kv-type", t->kv_type, "the evaluated model's KV type")->capture_default_str();
  tasks->add_option("--v-cache-dtype", t->v_type, "its V type when it differs");
  tasks->add_option("--kv-key-channels", t->key_channels, kKeyChannelsHelp)->capture_default_str();
  tasks->add_option("--base-kv-type", t->base_kv_type, "the base's KV type")->capture_default_str();
  tasks->add_option("-t,--threads", t->threads, "threads")->capture_default_str();
  tasks->add_option("-o,--output", t->output, "text | json")->capture_default_str();
  t->retention.Register(*tasks, "KV retention: positions kept as a share of each request (prompt + max_tokens)");
  return [o, t, tasks]() {
    if (tasks->parsed()) return RunTasks(*t);
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale eval: %s\n", s.ToString().c_str());
      return 1;
    };
    if (o->output != "text" && o->output != "json") return fail(InvalidArgument("-o must be text or json"));
    const auto kv = ParseKvTypeFlag("--kv-type", o->kv_type);
    if (!kv.ok()) return fail(kv.status());
    if (o->threads < 1) return fail(InvalidArgument("-t must be >= 1"));
    std::optional<kernels::KvType> v;
    if (!o->v_type.empty()) {
      auto vv = ParseKvTypeFlag("--v-cache-dtype", o->v_type);
      if (!vv.ok()) return fail(vv.status());
      v = *vv;
    }
    auto retention = o->retention.Resolve();
    if (!retention.ok()) return fail(retention.status());
    auto key_channels = ParseKeyChannelsFlag(o->key_channels);
    if (!key_channels.ok()) return fail(key_channels.status());
    auto read = ReadTextFile(o->file);
    if (!read.ok()) return fail(read.status());
    const std::string& text = *read;
    if (text.find('\0') != std::string::npos) return fail(InvalidArgument("'{}' is binary, not text", o->file));
    auto m = LoadTextModel(o->model, o->load);
    if (!m.ok()) return fail(m.status());
    const std::vector<int32_t> tokens = m->tok->Encode(text);
    ThreadPool pool(o->threads);
    PplOptions opt;
    opt.ctx = o->ctx;
    opt.stride = o->stride;
    opt.kv_type = *kv;
    opt.v_kv_type = v;
    opt.retention = *retention;
    opt.key_channels = *key_channels;
    auto r = EvaluatePerplexity(*m->model, tokens, opt, !o->save_logits.empty() || !o->kl_base.empty(), pool);
    if (!r.ok()) return fail(r.status().WithContext(o->file));
    const bool key_channels_used =
        !m->model->key_channels().empty() && key_channels->value_or(KvStorage::KeyChannelsByDefault(*kv));
    nlohmann::json j = {{"model", m->path},
                        {"file", o->file},
                        {"kv_type", o->kv_type},
                        {"v_cache_dtype", o->v_type.empty() ? o->kv_type : o->v_type},
                        {"key_channels", key_channels_used},
                        {"tokens", tokens.size()},
                        {"scored", r->num_scored},
                        {"nll", r->nll},
                        {"perplexity", r->ppl()}};
    if (retention->active()) {
      j["kv_retention"] = o->retention.Describe();
      j["kv_budget"] = r->kv_budget;
      j["kv_evicted_tokens"] = r->num_evicted;
    }
    if (!o->save_logits.empty()) {
      if (Status s = SaveLogprobs(o->save_logits, *r); !s.ok()) return fail(s);
    }
    if (!o->kl_base.empty()) {
      auto base = LoadLogprobs(o->kl_base);
      if (!base.ok()) return fail(base.status());
      auto kl = CompareLogprobs(*base, *r);
      if (!kl.ok()) return fail(kl.status().WithContext(o->kl_base));
      j["base_perplexity"] = kl->base_ppl;
      j["kl_mean"] = kl->mean;
      j["kl_median"] = kl->median;
      j["kl_p99"] = kl->p99;
      j["kl_max"] = kl->max;
      j["top1_agreement"] = kl->top1_agreement;
    }
    if (o->output == "json") {
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }
    std::printf("perplexity %.4f over %lld tokens (mean NLL %.5f nats), KV %s%s%s%s\n", r->ppl(),
                static_cast<long long>(r->num_scored), r->nll, o->kv_type.c_str(),
                o->v_type.empty() ? "" : (" / V " + o->v_type).c_str(),
                key_channels_used ? " (keys per channel, calibrated)" : "",
                retention->active() ? fmt::format("; KV retention {} (budget {} tokens, {} positions evicted)",
                                                  o->retention.Describe(), r->kv_budget, r->num_evicted).c_str()
                                    : "");
    if (j.contains("kl_mean")) {
      std::printf("vs base (perplexity %.4f): KL mean %.6f, median %.6f, p99 %.6f, max %.6f; top-1 agreement %.2f%%\n",
                  j["base_perplexity"].get<double>(), j["kl_mean"].get<double>(), j["kl_median"].get<double>(),
                  j["kl_p99"].get<double>(), j["kl_max"].get<double>(), 100.0 * j["top1_agreement"].get<double>());
    }
    return 0;
  };
}

}  // namespace gale
