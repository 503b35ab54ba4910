// Perplexity over sliding windows, the log-probabilities file, KL divergence.
#include "eval/eval.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

namespace gale {

double PplResult::ppl() const { return std::exp(nll); }

StatusOr<PplResult> EvaluatePerplexity(const Model& model, const std::vector<int32_t>& tokens,
                                       const PplOptions& options, bool keep_logprobs, ThreadPool& pool) {
  const ModelHParams& hp = model.hparams();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < 2) return InvalidArgument("the text has {} token(s); perplexity needs at least 2", n);
  for (int32_t t : tokens) {
    if (t < 0 || t >= hp.vocab_size) return InvalidArgument("token id {} outside the vocabulary [0, {})", t, hp.vocab_size);
  }
  int64_t ctx = options.ctx > 0 ? options.ctx : (hp.context_length > 0 ? hp.context_length : 2048);
  if (options.ctx < 0) return InvalidArgument("--ctx must be >= 0, got {}", options.ctx);
  if (hp.context_length > 0 && ctx > hp.context_length) {
    return InvalidArgument("--ctx {} exceeds the model's context of {}", ctx, hp.context_length);
  }
  ctx = std::min(ctx, n);
  if (ctx < 2) return InvalidArgument("--ctx must be >= 2");
  if (options.stride > ctx) return InvalidArgument("--stride {} exceeds --ctx {}", options.stride, ctx);
  // A window's first token has nothing before it to be predicted from, so windows overlap by at
  // least one token (stride ctx means ctx - 1) and every token after the first is scored once.
  const int64_t stride = std::min(options.stride > 0 ? options.stride : std::max<int64_t>(1, ctx / 2), ctx - 1);
  if ((options.kv_type == kernels::KvType::kInt4 || options.v_kv_type == kernels::KvType::kInt4) && hp.head_dim % 2) {
    return InvalidArgument("int4 KV needs an even head size");
  }

  RETURN_IF_ERROR(options.retention.Validate());
  if (options.chunk < 1) return InvalidArgument("the streaming chunk must be >= 1 token, got {}", options.chunk);
  const bool retain = options.retention.active();
  // With retention the windowed layers sit in layer groups of their own (the KvCache below).
  if (retain) RETURN_IF_ERROR(CheckRetentionGroups(model.kv_layout().Groups(true), hp.sliding_window > 0));
  const int64_t budget = retain ? options.retention.BudgetFor(ctx) : 0;

  PplResult r;
  r.vocab = hp.vocab_size;
  r.kv_budget = budget;
  r.tokens = tokens;
  const int64_t vocab = hp.vocab_size;
  Workspace ws;
  double nll_sum = 0.0;
  int64_t scored_until = 1;  // tokens [1, scored_until) are scored
  std::vector<double> lp(static_cast<size_t>(vocab));
  for (int64_t start = 0; scored_until < n; start += stride) {
    const int64_t end = std::min(start + ctx, n);
    // Retention compacts full-attention layers only: windowed ones in layer groups of their own.
    KvCache kv(hp, end - start, 1, options.kv_type, 16, options.v_kv_type, /*window_groups=*/retain);
    if (options.key_channels) kv.storage().set_key_channels(*options.key_channels);
    const int64_t len = end - 1 - start;  // inputs of the window
    std::vector<float> logits;            // [len, vocab] with retention (gathered chunk by chunk)
    if (!retain) {
      ForwardBatch b;
      b.tokens.assign(tokens.begin() + start, tokens.begin() + end - 1);
      for (int64_t i = 0; i < len; ++i) b.positions.push_back(static_cast<int32_t>(i));
      b.all_logits = true;
      RETURN_IF_ERROR(model.Forward(b, kv, ws, pool));
    } else {
      SeqRetention keep(options.retention, budget, hp.num_layers, options.chunk);
      keep.Reset(0);
      logits.resize(static_cast<size_t>(len * vocab));
      int64_t slots = 0;
      for (int64_t c = 0; c < len; c += options.chunk) {
        const int64_t n_chunk = std::min(options.chunk, len - c);
        ForwardBatch b;
        kv.Attach(b);
        for (int64_t i = c; i < c + n_chunk; ++i) {
          b.tokens.push_back(tokens[start + i]);
          b.positions.push_back(static_cast<int32_t>(i));
          b.slots.push_back(static_cast<int32_t>(slots + i - c));
        }
        if (float* acc = keep.Accumulator(slots + n_chunk)) b.attn_acc = {{acc, keep.stride()}};
        b.all_logits = true;
        RETURN_IF_ERROR(model.Forward(b, kv.storage(), ws, pool));
        std::copy_n(ws.logits.begin(), n_chunk * vocab, logits.begin() + c * vocab);
        slots = keep.MaybeEvict(kv.storage(), b.block_tables, slots + n_chunk);  // one sequence: a table per group
      }
      r.num_evicted += keep.num_evicted();
    }
    const float* window_logits = retain ? logits.data() : ws.logits.data();
    // Row i predicts token start + i + 1; score the ones not scored by an earlier window.
    for (int64_t target = std::max(scored_until, start + 1); target < end; ++target) {
      const float* l = window_logits + (target - start - 1) * vocab;
      double max = l[0];
      for (int64_t j = 1; j < vocab; ++j) max = std::max<double>(max, l[j]);
      double sum = 0.0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(l[j] - max);
      const double log_z = max + std::log(sum);
      nll_sum -= l[tokens[target]] - log_z;
      if (keep_logprobs) {
        for (int64_t j = 0; j < vocab; ++j) r.logprobs.push_back(static_cast<float>(l[j] - log_z));
      }
      ++r.num_scored;
    }
    scored_until = end;
    if (end == n) break;
  }
  r.nll = nll_sum / static_cast<double>(r.num_scored);
  return r;
}

Status SaveLogprobs(const std::string& path, const PplResult& r) {
  std::ofstream f(path, std::ios::binary);
  if (!f) return IoError("cannot write '{}'", path);
  const uint32_t vocab = static_cast<uint32_t>(r.vocab);
  const uint64_t scored = static_cast<uint64_t>(r.num_scored), ntok = r.tokens.size();
  if (r.logprobs.size() != scored * vocab) return Internal("no log-probabilities kept to save");
  f.write("GALEPPL1", 8);
  f.write(reinterpret_cast<const char*>(&vocab), 4);
  f.write(reinterpret_cast<const char*>(&scored), 8);
  f.write(reinterpret_cast<const char*>(&ntok), 8);
  f.write(reinterpret_cast<const char*>(r.tokens.data()), static_cast<std::streamsize>(ntok * 4));
  f.write(reinterpret_cast<const char*>(r.logprobs.data()), static_cast<std::streamsize>(r.logprobs.size() * 4));
  f.flush();
  if (!f) return IoError("writing '{}' failed", path);
  return Status::Ok();
}

StatusOr<PplResult> LoadLogprobs(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError("cannot open '{}'", path);
  f.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  char magic[8];
  uint32_t vocab = 0;
  uint64_t scored = 0, ntok = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&vocab), 4);
  f.read(reinterpret_cast<char*>(&scored), 8);
  f.read(reinterpret_cast<char*>(&ntok), 8);
  if (!f || std::memcmp(magic, "GALEPPL1", 8) != 0) return InvalidArgument("'{}' is not a gale log-probabilities file", path);
  // Sizes must add up exactly before anything is allocated.
  const uint64_t header = 28;
  if (vocab == 0 || vocab > (1u << 24) || ntok > (uint64_t{1} << 32) || scored + 1 != ntok ||
      size != header + ntok * 4 + scored * vocab * 4) {
    return InvalidArgument("'{}': header (vocab {}, {} scored of {} tokens) does not match its {} bytes", path, vocab,
                           scored, ntok, size);
  }
  PplResult r;
  r.vocab = vocab;
  r.num_scored = static_cast<int64_t>(scored);
  r.tokens.resize(ntok);
  r.logprobs.resize(scored * vocab);
  f.read(reinterpret_cast<char*>(r.tokens.data()), static_cast<std::streamsize>(ntok * 4));
  f.read(reinterpret_cast<char*>(r.logprobs.data()), static_cast<std::streamsize>(r.logprobs.size() * 4));
  if (!f) return IoError("reading '{}' failed", path);
  double nll = 0.0;
  for (uint64_t i = 0; i < scored; ++i) {
    const int32_t t = r.tokens[i + 1];
    if (t < 0 || static_cast<uint32_t>(t) >= vocab) return InvalidArgument("'{}': token id {} outside its vocabulary", path, t);
    nll -= r.logprobs[i * vocab + static_cast<uint64_t>(t)];
  }
  r.nll = scored > 0 ? nll / static_cast<double>(scored) : 0.0;
  return r;
}

StatusOr<KlResult> CompareLogprobs(const PplResult& base, const PplResult& r) {
  if (base.vocab != r.vocab) return InvalidArgument("vocabularies differ: base {}, this {}", base.vocab, r.vocab);
  if (base.tokens != r.tokens) return InvalidArgument("the base was scored on a different text (or tokenization)");
  if (base.logprobs.size() != r.logprobs.size() || r.logprobs.empty()) {
    return InvalidArgument("log-probabilities missing or of different lengths");
  }
  const int64_t vocab = r.vocab, n = r.num_scored;
  std::vector<double> kls(static_cast<size_t>(n));
  int64_t agree = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* p = base.logprobs.data() + i * vocab;
    const float* q = r.logprobs.data() + i * vocab;
    double kl = 0.0;
    int64_t ap = 0, aq = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      kl += std::exp(static_cast<double>(p[j])) * (static_cast<double>(p[j]) - q[j]);
      if (p[j] > p[ap]) ap = j;
      if (q[j] > q[aq]) aq = j;
    }
    kls[static_cast<size_t>(i)] = std::max(0.0, kl);  // rounding can make a zero KL slightly negative
    agree += ap == aq;
  }
  KlResult k;
  for (double v : kls) k.mean += v;
  k.mean /= static_cast<double>(n);
  std::sort(kls.begin(), kls.end());
  auto pct = [&](double q) { return kls[static_cast<size_t>(std::min<double>(n - 1, std::floor(q * (n - 1) + 0.5)))]; };
  k.median = pct(0.5);
  k.p99 = pct(0.99);
  k.max = kls.back();
  k.top1_agreement = static_cast<double>(agree) / static_cast<double>(n);
  k.base_ppl = base.ppl();
  return k;
}

}  // namespace gale

namespace gale {

StatusOr<std::vector<EvalTask>> ParseTasks(const std::string& text) {
  std::vector<EvalTask> tasks;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument("tasks line {}: not a JSON object", line_no);
    EvalTask t;
    t.id = j.contains("id") ? (j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump()) : std::to_string(line_no);
    if (!j.contains("category") || !j["category"].is_string()) return InvalidArgument("tasks line {}: 'category' (a string) is required", line_no);
    t.category = j["category"].get<std::string>();
    if (j.contains("turns")) {
      if (!j["turns"].is_array() || j["turns"].empty()) return InvalidArgument("tasks line {}: 'turns' must be a non-empty array", line_no);
      for (const auto& turn : j["turns"]) {
        if (!turn.is_string()) return InvalidArgument("tasks line {}: every turn must be a string", line_no);
        t.turns.push_back(turn.get<std::string>());
      }
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      t.turns.push_back(j["prompt"].get<std::string>());
    } else {
      return InvalidArgument("tasks line {}: 'prompt' (a string) or 'turns' is required", line_no);
    }
    if (j.contains("max_tokens")) {
      if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1 || j["max_tokens"].get<int64_t>() > 100000) {
        return InvalidArgument("tasks line {}: 'max_tokens' must be an integer in [1, 100000]", line_no);
      }
      t.max_tokens = j["max_tokens"].get<int64_t>();
    }
    if (j.contains("json_prefix")) {
      if (!j["json_prefix"].is_string()) return InvalidArgument("tasks line {}: 'json_prefix' must be a string", line_no);
      t.json_prefix = j["json_prefix"].get<std::string>();
    }
    tasks.push_back(std::move(t));
  }
  if (tasks.empty()) return InvalidArgument("the task file has no tasks");
  return tasks;
}

std::vector<CategoryScore> ScoreTasks(const std::vector<EvalTask>& tasks, const std::vector<TaskOutcome>& outcomes) {
  std::vector<CategoryScore> out;
  auto find = [&](const std::string& c) -> CategoryScore& {
    for (auto& s : out) {
      if (s.category == c) return s;
    }
    out.push_back(CategoryScore{c});
    return out.back();
  };
  for (size_t i = 0; i < tasks.size() && i < outcomes.size(); ++i) {
    CategoryScore& s = find(tasks[i].category);
    const TaskOutcome& o = outcomes[i];
    ++s.tasks;
    s.exact += o.exact;
    s.mean_first_divergence += static_cast<double>(o.first_divergence);
    s.token_agreement += o.base.empty() ? 1.0 : static_cast<double>(o.first_divergence) / static_cast<double>(o.base.size());
    if (tasks[i].structured() && o.base_parses) {
      ++s.base_parses;
      s.no_longer_parse += !o.got_parses;
    }
  }
  for (auto& s : out) {
    s.mean_first_divergence /= static_cast<double>(s.tasks);
    s.token_agreement /= static_cast<double>(s.tasks);
  }
  return out;
}

}  // namespace gale
