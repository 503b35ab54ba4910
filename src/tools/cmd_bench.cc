// `gale bench`: prompt processing (ppN) and generation (tgN) throughput of a model, over
// repetitions after a warm-up, aggregate decode throughput against batch size, and each figure as
// a fraction of this machine's roofline (measured by probes, or given with --bandwidth).
// Output: a Markdown table (default), JSON (one array) or CSV. Forward passes only: no
// tokenizer or sampler, like llama-bench, so figures compare with it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/profiler.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "tools/cli_common.h"
#include "tools/commands.h"
#include "tools/roofline.h"

namespace gale {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string test;
  int64_t batch = 1;
  int threads = 1;
  std::string model_type;
  double tokens_per_second = 0.0;  // mean over repetitions
  double std = 0.0;
  double bytes_per_token = 0.0;
  double roofline_tokens_per_second = 0.0;
  double roofline_fraction = 0.0;
  double ttft_ms = 0.0;      // end-to-end tests: mean time to first token
  double seconds = 0.0;      // end-to-end tests: mean wall time of one run
  double spec_acceptance_rate = -1.0;    // end-to-end tests with --spec: accepted / guessed
  double spec_tokens_per_verify = -1.0;  // 1 + accepted per verification
};

void MeanStd(const std::vector<double>& v, double* mean, double* std) {
  double s = 0.0;
  for (double x : v) s += x;
  *mean = s / static_cast<double>(v.size());
  double var = 0.0;
  for (double x : v) var += (x - *mean) * (x - *mean);
  *std = v.size() > 1 ? std::sqrt(var / static_cast<double>(v.size() - 1)) : 0.0;
}

std::string ModelType(const GgufFile& file, const Model& model) {
  int64_t params = 0;
  for (const auto& t : file.tensors()) params += t.NumElements();
  // The FFN's type (a mixture's: its experts'; Phi-3's fused ffn_up; past dense leading layers).
  const GgufTensorInfo* ffn = nullptr;
  for (const char* name : {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_gate_exps.weight",
                           "blk.1.ffn_gate_exps.weight"}) {
    if (ffn == nullptr) ffn = file.FindTensor(name);
  }
  const std::string type = ffn ? std::string(TypeName(ffn->type_id)) : "?";
  const double m = static_cast<double>(params) / 1e6;
  char buf[64];
  if (m >= 1000) std::snprintf(buf, sizeof(buf), "%s %.1fB %s", model.hparams().arch.c_str(), m / 1000, type.c_str());
  else std::snprintf(buf, sizeof(buf), "%s %.0fM %s", model.hparams().arch.c_str(), m, type.c_str());
  return buf;
}

struct BenchOpts {
  std::string model, output = "md", batches, concurrency, isa;
  EngineOptions engine;
  int64_t shared_prefix = 0;
  int64_t n_prompt = 512, n_gen = 128;
  int reps = 5;
  int threads = ThreadPool::DefaultNumThreads();
  double bandwidth = 0.0;
  std::string trace, prompt_file;
  LoadOptions load;
  bool profile = false;
};

Status ParseSizeList(const std::string& text, const char* flag, std::vector<int64_t>* out) {
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v < 1 || v > 4096) return InvalidArgument("bad {} entry '{}'", flag, item);
    out->push_back(v);
  }
  return Status::Ok();
}

// What one forward pass of the model costs: the bytes it reads and the multiply-adds it does,
// and the machine's peak for the kernels that run it.
struct Work {
  Roofline roof;
  double peak_ops = 0.0;          // per second, of the kernels the FFN runs on
  double weight_bytes = 0.0;      // read by a forward pass (lookup tables aside)
  double matmul_params = 0.0;     // multiply-adds per token in the matmuls
  double expert_bytes = 0.0;      // of the weight bytes, a mixture's experts
  double used_fraction = 0.0;     // of a mixture's experts, the share a token uses
  double kv_bytes_per_pos = 0.0;  // KV bytes per position, all layers

  // Bytes a decode step of `batch` tokens reads: all but the experts, and of the experts the
  // expected share that at least one token routes to (uniform routing: 1 - (1 - k/E)^batch).
  double StepBytes(int64_t batch) const {
    return weight_bytes - expert_bytes * std::pow(1.0 - used_fraction, static_cast<double>(batch));
  }
};

Work MeasureWork(const GgufFile& file, const Model& model, const Roofline& roof) {
  const ModelHParams& hp = model.hparams();
  Work w;
  w.roof = roof;
  const GgufTensorInfo* ffn = file.FindTensor("blk.0.ffn_gate.weight");
  if (ffn == nullptr) ffn = file.FindTensor("blk." + std::to_string(hp.moe.leading_dense) + ".ffn_gate_exps.weight");
  // Matrices multiplied on the int8 dot instructions (Q8_0, Q4_0, the K-quants and gale's W4
  // types, packed) are bound by the int8 peak, BF16 ones on vdpbf16ps by the bf16 dot peak,
  // the others by the f32 FMA peak.
  const auto ffn_traits = ffn ? GetTypeTraits(ffn->type_id) : std::nullopt;
  const kernels::KernelTable& kt = kernels::Active();
  const kernels::TypeSlot ffn_slot = ffn_traits ? kernels::SlotOf(ffn_traits->type) : kernels::kSlotF32;
  const bool int8_path = ffn_traits && (kt.gemm_quant[ffn_slot] != nullptr || kt.gemm_packed[ffn_slot] != nullptr ||
                                        kt.gemm_packed_a16[ffn_slot] != nullptr);
  const bool bf16_path = !int8_path && ffn_traits && kt.gemm_bf16[ffn_slot] != nullptr;
  w.peak_ops = (int8_path ? roof.int8_dot_gops : bf16_path ? roof.bf16_dot_gflops : roof.f32_fma_gflops) * 1e9;
  // Bytes of weights a forward pass reads: everything but the lookup tables, of which it reads
  // a few rows per token: the embedding (unless the output layer is tied to it, then all of it)
  // and DeepSeek-V4.1's Engram tables (24 rows per layer and token of ~400M).
  auto is_table = [](const std::string& name) { return name.ends_with("engram_embd.weight"); };
  w.weight_bytes = static_cast<double>(model.weight_bytes());
  if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight"); embd && !model.tied_output()) {
    w.weight_bytes -= static_cast<double>(embd->num_bytes);
  }
  for (const auto& t : file.tensors()) {
    if (is_table(t.name)) w.weight_bytes -= static_cast<double>(t.num_bytes);
  }
  // Multiply-adds per token in the matmuls: every 2-D weight except the embedding lookup, and of
  // a mixture's experts (3-D tensors) the k of E a token uses.
  const MoeHParams& moe = hp.moe;
  w.used_fraction = moe.enabled() ? static_cast<double>(moe.num_used) / static_cast<double>(moe.num_experts) : 0.0;
  for (const auto& t : file.tensors()) {
    if (t.shape.size() == 2 && t.name != "token_embd.weight" && !is_table(t.name)) {
      w.matmul_params += static_cast<double>(t.NumElements());
    }
    if (t.shape.size() == 3) {
      w.matmul_params += static_cast<double>(t.NumElements()) * w.used_fraction;
      w.expert_bytes += static_cast<double>(t.num_bytes);
    }
  }
  if (model.tied_output()) w.matmul_params += static_cast<double>(hp.dim * hp.vocab_size);
  w.kv_bytes_per_pos = 1.0 * hp.num_layers * (hp.kv_dim() + hp.v_dim()) * sizeof(float);
  return w;
}

// One bench run's state: the options, the model and what its passes cost.
struct Bench {
  Bench(const BenchOpts& o, const GgufFile& file, const Model& model, ThreadPool& pool, const Work& work)
      : o(o), file(file), model(model), pool(pool), work(work) {}

  const BenchOpts& o;
  const GgufFile& file;
  const Model& model;
  ThreadPool& pool;
  Work work;
  Rng rng{42};
  Workspace ws;

  std::vector<int32_t> RandomTokens(int64_t n) {
    std::vector<int32_t> t(n);
    for (auto& id : t) id = static_cast<int32_t>(rng.NextU64() % static_cast<uint64_t>(model.hparams().vocab_size));
    return t;
  }
};

// ppN: one forward pass over n_prompt random tokens, per repetition.
StatusOr<Result> Prefill(Bench& b) {
  const ModelHParams& hp = b.model.hparams();
  const int64_t n = b.o.n_prompt;
  KvCache kv(hp, n);
  ForwardBatch batch;
  batch.tokens = b.RandomTokens(n);
  for (int64_t i = 0; i < n; ++i) batch.positions.push_back(static_cast<int32_t>(i));
  std::vector<double> tps;
  for (int rep = 0; rep <= b.o.reps; ++rep) {
    const auto t0 = Clock::now();
    ProfileSpan span("prefill", "step", n);
    RETURN_IF_ERROR(b.model.Forward(batch, kv, b.ws, b.pool));
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) tps.push_back(static_cast<double>(n) / sec);
  }
  Result r;
  r.test = "pp" + std::to_string(n);
  MeanStd(tps, &r.tokens_per_second, &r.std);
  r.bytes_per_token = b.work.weight_bytes / static_cast<double>(n);
  // Compute bound: 2 ops per multiply-add, plus attention (QK and PV, causal: half the square).
  const double ops = 2.0 * b.work.matmul_params + 2.0 * 2.0 * hp.num_layers * hp.dim * (n / 2.0);
  r.roofline_tokens_per_second = b.work.peak_ops / ops;
  return r;
}

// tgN at one batch size: n_gen decode steps of `batch` sequences, per repetition.
StatusOr<Result> Decode(Bench& b, int64_t batch) {
  const int64_t n_gen = b.o.n_gen;
  KvCache caches(b.model.hparams(), n_gen + 1, batch);
  std::vector<double> tps;
  for (int rep = 0; rep <= b.o.reps; ++rep) {
    const auto t0 = Clock::now();
    for (int64_t step = 0; step < n_gen; ++step) {
      ForwardBatch fb;
      fb.tokens = b.RandomTokens(batch);
      for (int64_t s = 0; s < batch; ++s) {
        fb.positions.push_back(static_cast<int32_t>(step));
        fb.seq_idx.push_back(static_cast<int32_t>(s));
        fb.logit_rows.push_back(static_cast<int32_t>(s));
      }
      ProfileSpan span("decode", "step", batch);
      RETURN_IF_ERROR(b.model.Forward(fb, caches, b.ws, b.pool));
    }
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) tps.push_back(static_cast<double>(batch * n_gen) / sec);
  }
  Result r;
  r.test = "tg" + std::to_string(n_gen);
  r.batch = batch;
  MeanStd(tps, &r.tokens_per_second, &r.std);
  // Memory bound: weights once per step for the whole batch, plus each sequence's KV
  // (on average half the generated length).
  r.bytes_per_token = b.work.StepBytes(batch) / static_cast<double>(batch) + b.work.kv_bytes_per_pos * (n_gen / 2.0);
  const double mem_tps = b.work.roof.read_bandwidth_gbs * 1e9 / r.bytes_per_token;
  const double compute_tps = b.work.peak_ops / (2.0 * b.work.matmul_params);
  r.roofline_tokens_per_second = std::min(mem_tps, compute_tps);
  return r;
}

// End to end through the engine: requests of a shared prefix (random tokens or --prompt-file's
// text) and their own random tokens.
class EndToEnd {
 public:
  struct Run {
    double tokens_per_second, ttft_ms, seconds;
  };

  EndToEnd(Bench& b, Engine& engine) : b_(b), engine_(engine) {}

  Status Prepare() {
    n_prompt_ = std::max<int64_t>(b_.o.n_prompt, 1);
    n_gen_ = std::max<int64_t>(b_.o.n_gen, 1);
    prefix_ = b_.RandomTokens(b_.o.shared_prefix);
    if (b_.o.prompt_file.empty()) return Status::Ok();
    auto text = ReadTextFile(b_.o.prompt_file);
    if (!text.ok()) return text.status().WithContext("--prompt-file");
    auto tok = Tokenizer::FromGguf(b_.file);
    if (!tok.ok()) return tok.status().WithContext("--prompt-file needs the model's tokenizer");
    std::vector<int32_t> ids = (*tok)->Encode(*text);
    if ((*tok)->bos_id() >= 0) ids.insert(ids.begin(), (*tok)->bos_id());
    prefix_.insert(prefix_.end(), ids.begin(), ids.end());
    n_prompt_ = 0;
    return Status::Ok();
  }

  // c requests at once, greedy, no early stop.
  StatusOr<Run> RunOnce(int64_t c) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < c; ++i) {
      GenerationRequest req;
      req.prompt = prefix_;
      const auto own = b_.RandomTokens(n_prompt_);  // none with --prompt-file
      req.prompt.insert(req.prompt.end(), own.begin(), own.end());
      req.max_tokens = n_gen_;
      req.sampling.temperature = 0.0f;
      auto st = engine_.Submit(std::move(req));
      if (!st.ok()) return st.status();
      streams.push_back(*st);
    }
    int64_t generated = 0;
    double ttft_sum = 0.0;
    for (auto& st : streams) {
      StreamUpdate u;
      while (st->Next(&u)) {
        generated += static_cast<int64_t>(u.token_ids.size());
        if (u.finished && u.finish_reason == FinishReason::kError) return u.status;
      }
      if (auto first = st->first_token_at()) ttft_sum += std::chrono::duration<double>(*first - st->created_at()).count();
    }
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    return Run{static_cast<double>(generated) / sec, 1e3 * ttft_sum / static_cast<double>(c), sec};
  }

  // Repetitions at concurrency c, with the speculative figures of those runs.
  StatusOr<Result> Measure(int64_t c) {
    const EngineStats& es = engine_.stats();
    std::vector<double> tps, ttft, secs;
    const int64_t drafts0 = es.spec_num_drafts, guessed0 = es.spec_num_draft_tokens,
                  accepted0 = es.spec_num_accepted_tokens;
    for (int rep = 0; rep < b_.o.reps; ++rep) {
      auto t = RunOnce(c);
      if (!t.ok()) return t.status();
      tps.push_back(t->tokens_per_second);
      ttft.push_back(t->ttft_ms);
      secs.push_back(t->seconds);
    }
    Result r;
    r.test = !b_.o.prompt_file.empty() ? fmt::format("e2e file{}+n{}", prefix_.size(), n_gen_)
             : b_.o.shared_prefix > 0  ? fmt::format("e2e s{}+p{}+n{}", b_.o.shared_prefix, n_prompt_, n_gen_)
                                       : fmt::format("e2e p{}+n{}", n_prompt_, n_gen_);
    if (engine_.config().spec.method != SpecMethod::kOff) {
      const double drafts = static_cast<double>(es.spec_num_drafts - drafts0);
      const double guessed = static_cast<double>(es.spec_num_draft_tokens - guessed0);
      const double accepted = static_cast<double>(es.spec_num_accepted_tokens - accepted0);
      r.spec_acceptance_rate = guessed > 0 ? accepted / guessed : 0.0;
      r.spec_tokens_per_verify = drafts > 0 ? 1.0 + accepted / drafts : 0.0;
      r.test += " spec-" + std::string(SpecMethodName(engine_.config().spec.method));
    }
    r.batch = c;
    MeanStd(tps, &r.tokens_per_second, &r.std);
    double unused;
    MeanStd(ttft, &r.ttft_ms, &unused);
    MeanStd(secs, &r.seconds, &unused);
    std::fprintf(stderr, "concurrency %lld: %.1f generated tok/s, mean TTFT %.1f ms, %.3f s per run%s\n",
                 static_cast<long long>(c), r.tokens_per_second, r.ttft_ms, r.seconds,
                 r.spec_acceptance_rate < 0
                     ? ""
                     : fmt::format("; speculative: {:.1f}% of guesses accepted, {:.2f} tokens per verifying step",
                                   100.0 * r.spec_acceptance_rate, r.spec_tokens_per_verify)
                           .c_str());
    return r;
  }

  // The speculative step costs, the prefix cache's hits and each concurrency's speed-up.
  void Summarize(const std::vector<Result>& results) const {
    if (const std::string spec = engine_.DescribeSpec(); !spec.empty()) {
      std::fprintf(stderr, "%s; %s\n", spec.c_str(), engine_.DescribeSpecCosts().c_str());
    }
    const EngineStats& es = engine_.stats();
    if (engine_.config().enable_prefix_caching) {
      const int64_t hit = es.prefix_cache_hit_tokens.load(), query = es.prefix_cache_query_tokens.load();
      std::fprintf(stderr, "prefix cache: %lld of %lld prompt tokens found (%.1f%%), %lld blocks cached, %lld evictions\n",
                   static_cast<long long>(hit), static_cast<long long>(query),
                   query > 0 ? 100.0 * static_cast<double>(hit) / static_cast<double>(query) : 0.0,
                   static_cast<long long>(es.prefix_cache_blocks.load()),
                   static_cast<long long>(es.prefix_cache_evictions.load()));
    }
    const Result* one = nullptr;
    for (const auto& r : results) {
      if (r.test[0] == 'e' && r.batch == 1) one = &r;
    }
    if (one == nullptr) return;
    for (const auto& r : results) {
      if (r.test[0] == 'e' && r.batch > 1) {
        std::fprintf(stderr, "concurrency %lld: %.2fx the single-request rate\n", static_cast<long long>(r.batch),
                     r.tokens_per_second / one->tokens_per_second);
      }
    }
  }

 private:
  Bench& b_;
  Engine& engine_;
  int64_t n_prompt_ = 1, n_gen_ = 1;
  std::vector<int32_t> prefix_;
};

Status RunEndToEnd(Bench& b, const EngineConfig& cfg, const std::vector<int64_t>& concurrency,
                   std::vector<Result>* results) {
  ASSIGN_OR_RETURN(auto engine, Engine::Create(b.model, nullptr, cfg, b.pool));
  std::fprintf(stderr, "%s\n", engine->Describe().c_str());
  EndToEnd e2e(b, *engine);
  RETURN_IF_ERROR(e2e.Prepare());
  if (auto warm = e2e.RunOnce(1); !warm.ok()) return warm.status();
  for (int64_t c : concurrency) {
    ASSIGN_OR_RETURN(Result r, e2e.Measure(c));
    results->push_back(r);
  }
  e2e.Summarize(*results);
  return Status::Ok();
}

// Load balance of the forward passes (the engine's runs have their own workspace): per layer,
// the busiest expert's tokens over the mean, then the worst and the median layer.
void ReportExpertBalance(const ModelHParams& hp, const std::vector<int64_t>& expert_tokens) {
  const MoeHParams& moe = hp.moe;
  std::vector<double> ratio;
  for (int64_t l = moe.leading_dense; l < hp.num_layers; ++l) {
    int64_t most = 0, total = 0;
    for (int64_t e = 0; e < moe.num_experts; ++e) {
      most = std::max(most, expert_tokens[l * moe.num_experts + e]);
      total += expert_tokens[l * moe.num_experts + e];
    }
    if (total > 0) ratio.push_back(static_cast<double>(most) * static_cast<double>(moe.num_experts) / static_cast<double>(total));
  }
  std::sort(ratio.begin(), ratio.end());
  if (!ratio.empty()) {
    std::fprintf(stderr, "expert load balance: the busiest expert had %.2fx the mean tokens (median layer), %.2fx (worst layer)\n",
                 ratio[ratio.size() / 2], ratio.back());
  }
}

void PrintResults(const BenchOpts& o, const Work& work, const std::vector<Result>& results) {
  if (o.output == "json") {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : results) {
      arr.push_back({{"test", r.test},
                     {"batch", r.batch},
                     {"threads", r.threads},
                     {"model_type", r.model_type},
                     {"model", o.model},
                     {"isa", kernels::IsaName(kernels::Active().isa)},
                     {"tokens_per_second", r.tokens_per_second},
                     {"std", r.std},
                     {"repetitions", o.reps},
                     {"bytes_per_token", r.bytes_per_token},
                     {"roofline_tokens_per_second", r.roofline_tokens_per_second},
                     {"roofline_fraction", r.roofline_fraction},
                     {"read_bandwidth_gbs", work.roof.read_bandwidth_gbs},
                     {"peak_gops", work.peak_ops / 1e9},
                     {"ttft_ms", r.ttft_ms},
                     {"seconds", r.seconds}});
      if (r.spec_acceptance_rate >= 0) {
        arr.back()["spec_acceptance_rate"] = r.spec_acceptance_rate;
        arr.back()["spec_mean_accepted_length"] = r.spec_tokens_per_verify;
      }
    }
    std::printf("%s\n", arr.dump(2).c_str());
  } else if (o.output == "csv") {
    std::printf("test,batch,threads,model_type,tokens_per_second,std,bytes_per_token,roofline_fraction\n");
    for (const auto& r : results) {
      std::printf("%s,%lld,%d,%s,%.2f,%.2f,%.0f,%.4f\n", r.test.c_str(), static_cast<long long>(r.batch), r.threads,
                  r.model_type.c_str(), r.tokens_per_second, r.std, r.bytes_per_token, r.roofline_fraction);
    }
  } else {
    std::printf("| model | test | batch | threads | tokens/s | std | bytes/token | roofline tok/s | of roofline |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& r : results) {
      std::printf("| %s | %s | %lld | %d | %.1f | %.1f | %.3g | %.1f | %.0f%% |\n", r.model_type.c_str(), r.test.c_str(),
                  static_cast<long long>(r.batch), r.threads, r.tokens_per_second, r.std, r.bytes_per_token,
                  r.roofline_tokens_per_second, 100.0 * r.roofline_fraction);
    }
  }
}

// The knee of the throughput curve: the first batch size after which doubling the batch gains
// less than 20% aggregate throughput.
void ReportKnee(const std::vector<Result>& results) {
  std::vector<const Result*> tg;
  for (const auto& r : results) {
    if (r.test[0] == 't') tg.push_back(&r);
  }
  int64_t knee = tg.back()->batch;
  for (size_t i = 0; i + 1 < tg.size(); ++i) {
    const double gain = tg[i + 1]->tokens_per_second / tg[i]->tokens_per_second;
    const double size_ratio = static_cast<double>(tg[i + 1]->batch) / static_cast<double>(tg[i]->batch);
    if (gain < 1.0 + 0.2 * std::log2(size_ratio)) {
      knee = tg[i]->batch;
      break;
    }
  }
  std::fprintf(stderr, "throughput knee: batch %lld (%.1f tok/s aggregate at batch 1, %.1f at %lld)\n",
               static_cast<long long>(knee), tg.front()->tokens_per_second, tg.back()->tokens_per_second,
               static_cast<long long>(tg.back()->batch));
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "gale bench: %s\n", msg.c_str());
  return 1;
}

int RunBench(BenchOpts& o) {
  if (o.model.empty()) return Fail("-m MODEL is required");
  if (o.output != "md" && o.output != "json" && o.output != "csv") return Fail("-o must be md, json or csv");
  if (o.reps < 1 || o.threads < 1 || o.n_prompt < 0 || o.n_gen < 0) return Fail("-r, -t must be >= 1; -p, -n >= 0");
  if (!o.isa.empty()) {
    const auto isa = kernels::ParseIsa(o.isa);
    if (!isa || !kernels::GetKernelTable(*isa)) return Fail("--isa '" + o.isa + "' is unknown or not supported by this CPU");
    kernels::SetActiveIsa(*isa);
  }
  std::vector<int64_t> batches, concurrency;
  if (Status s = ParseSizeList(o.batches, "--batch", &batches); !s.ok()) return Fail(s.message());
  if (Status s = ParseSizeList(o.concurrency, "--concurrency", &concurrency); !s.ok()) return Fail(s.message());
  auto engine_cfg = o.engine.Resolve();
  if (!engine_cfg.ok()) return Fail(engine_cfg.status().ToString());
  // The shared loader: packing (or the note that a file too large runs mapped), --mlock.
  auto loaded = LoadTextModel(o.model, o.load);
  if (!loaded.ok()) return Fail(loaded.status().ToString());
  const Model& model = *loaded->model;
  const ModelHParams& hp = model.hparams();
  ThreadPool pool(o.threads);
  Roofline roof = MeasureRoofline(pool);
  if (o.bandwidth > 0) roof.read_bandwidth_gbs = o.bandwidth;
  Bench b(o, *loaded->file, model, pool, MeasureWork(*loaded->file, model, roof));
  const std::string model_type = ModelType(b.file, model);
  const MoeHParams& moe = hp.moe;
  if (moe.enabled()) {
    std::fprintf(stderr, "experts: %lld of %lld per token; active weights %.1f MiB per token of %.1f MiB (experts %.1f MiB)\n",
                 static_cast<long long>(moe.num_used), static_cast<long long>(moe.num_experts),
                 b.work.StepBytes(1) / 1048576.0, b.work.weight_bytes / 1048576.0, b.work.expert_bytes / 1048576.0);
  }
  std::fprintf(stderr,
               "model: %s (%s), threads %d, kernels %s; roofline: %.1f GB/s read, %.0f GFLOP/s f32, %.0f GFLOP/s "
               "bf16, %.0f GOP/s int8\n",
               o.model.c_str(), model_type.c_str(), o.threads, kernels::ActiveKernelsName().c_str(),
               roof.read_bandwidth_gbs, roof.f32_fma_gflops, roof.bf16_dot_gflops, roof.int8_dot_gops);

  std::unique_ptr<Profiler> profiler;
  if (o.profile || !o.trace.empty()) {
    profiler = std::make_unique<Profiler>();
    SetProfiler(profiler.get());
  }
  std::vector<Result> results;
  if (o.profile && moe.enabled()) b.ws.expert_tokens.assign(hp.num_layers * moe.num_experts, 0);
  if (o.n_prompt > 0 && concurrency.empty()) {
    auto r = Prefill(b);
    if (!r.ok()) return Fail(r.status().ToString());
    results.push_back(*r);
  }
  if (o.n_gen > 0 && concurrency.empty()) {
    if (batches.empty()) batches.push_back(1);
    for (int64_t batch : batches) {
      auto r = Decode(b, batch);
      if (!r.ok()) return Fail(r.status().ToString());
      results.push_back(*r);
    }
  }
  if (!concurrency.empty()) {
    if (Status s = RunEndToEnd(b, *engine_cfg, concurrency, &results); !s.ok()) return Fail(s.ToString());
  }
  SetProfiler(nullptr);
  if (!o.trace.empty()) {
    if (Status s = profiler->WriteChromeTrace(o.trace); !s.ok()) return Fail(s.ToString());
  }
  if (o.profile) std::fprintf(stderr, "%s", profiler->Summary().c_str());
  if (!b.ws.expert_tokens.empty()) ReportExpertBalance(hp, b.ws.expert_tokens);
  for (auto& r : results) {
    r.threads = o.threads;
    r.model_type = model_type;
    r.roofline_fraction = r.roofline_tokens_per_second > 0 ? r.tokens_per_second / r.roofline_tokens_per_second : 0.0;
  }
  PrintResults(o, b.work, results);
  if (batches.size() > 1) ReportKnee(results);
  return 0;
}

}  // namespace

CommandFn RegisterBench(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  app.add_option("-m,--model", o->model, "GGUF model (required unless `serve`)");
  auto serve = std::make_shared<std::function<int()>>();
  RegisterBenchServe(app, serve.get());
  app.add_option("-p,--n-prompt", o->n_prompt, "prompt tokens for the ppN test (0 = skip)")->capture_default_str();
  app.add_option("-n,--n-gen", o->n_gen, "generated tokens for the tgN test (0 = skip)")->capture_default_str();
  app.add_option("-r,--repetitions", o->reps, "repetitions after one warm-up")->capture_default_str();
  app.add_option("-t,--threads", o->threads, "threads")->capture_default_str();
  app.add_option("--batch", o->batches, "decode batch sizes for the throughput curve, e.g. 1,2,4,8,16,32");
  app.add_option("--concurrency", o->concurrency,
                 "end-to-end through the engine: this many requests at once, each -p prompt and -n generated "
                 "tokens, e.g. 1,16,32 (aggregate generated tokens/s)");
  app.add_option("--shared-prefix", o->shared_prefix,
                 "with --concurrency: this many tokens (one fixed random text, like a system prompt) in "
                 "front of every request's -p tokens")
      ->capture_default_str();
  app.add_option("--prompt-file", o->prompt_file,
                 "with --concurrency: every request's prompt is this file's text (e.g. a document to "
                 "summarize or code to complete, for --spec ngram) instead of -p random tokens");
  o->engine.Register(app);
  app.add_option("-o,--output", o->output, "md | json | csv")->capture_default_str();
  app.add_option("--bandwidth", o->bandwidth, "memory read bandwidth in GB/s (default: measure it)");
  o->load.Register(app);
  app.add_option("--isa", o->isa, "force kernels: scalar | avx2 | avx512");
  app.add_option("--trace", o->trace, "write a Chrome trace-event JSON of every op (open in Perfetto)");
  app.add_flag("--profile", o->profile, "print time per op kind and the prefill/decode split");
  return [o, serve]() {
    if (const int rc = (*serve)(); rc >= 0) return rc;  // `gale bench serve ...`
    return RunBench(*o);
  };
}

}  // namespace gale
