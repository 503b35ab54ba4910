// Model runner: batch assembly, one forward, per-request sampling.
#include "runner/model_runner.h"

#include <algorithm>
#include <cmath>

#include "base/profiler.h"
#include "kernels/kernels.h"

namespace gale {

void ModelRunner::AddRequest(int64_t request_id, const SamplingParams& params, int top_logprobs,
                             std::shared_ptr<const grammar::CompiledGrammar> grammar, std::vector<int32_t> stop_ids,
                             Pooling pooling) {
  PerRequest r{Sampler(params), top_logprobs, nullptr, Status::Ok(), pooling, {}, 0};
  if (grammar) r.matcher = std::make_unique<grammar::GrammarMatcher>(std::move(grammar), std::move(stop_ids));
  requests_.insert_or_assign(request_id, std::move(r));
}

ModelRunner::GrammarState ModelRunner::grammar_state(int64_t request_id) const {
  GrammarState s;
  auto it = requests_.find(request_id);
  if (it == requests_.end() || !it->second.matcher) return s;
  s.status = it->second.grammar_status;
  s.done = it->second.matcher->Done();
  return s;
}

std::vector<float> ModelRunner::Embedding(int64_t request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second.pooling == Pooling::kNone || it->second.num_pooled == 0) return {};
  const PerRequest& r = it->second;
  const double count = r.pooling == Pooling::kMean ? static_cast<double>(r.num_pooled) : 1.0;
  double norm = 0.0;
  for (double v : r.pooled) norm += (v / count) * (v / count);
  norm = std::sqrt(norm);
  std::vector<float> out(r.pooled.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(norm > 0.0 ? r.pooled[i] / count / norm : 0.0);
  return out;
}

size_t ModelRunner::GrammarAllowedPrefix(int64_t request_id, std::span<const int32_t> drafts) {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || !it->second.matcher) return drafts.size();
  return it->second.matcher->AllowedPrefix(drafts);
}

void ModelRunner::RemoveRequest(int64_t request_id) { requests_.erase(request_id); }

namespace {

// Log-softmax statistics of a logits row taken before sampling changes it.
void Logprobs(std::span<const float> logits, int32_t token, int k, TokenLogprobs* out) {
  float max = logits[0];
  for (float l : logits) max = l > max ? l : max;
  thread_local std::vector<float> w;  // exp(l - max) by the kernel table's vector expf
  w.resize(logits.size());
  kernels::Active().exp_shifted(logits.data(), max, w.data(), static_cast<int64_t>(logits.size()));
  double sum = 0.0;
  for (float v : w) sum += v;
  const float log_z = max + static_cast<float>(std::log(sum));
  out->logprob = logits[token] - log_z;
  out->top.clear();
  if (k <= 0) return;
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  const size_t kk = std::min<size_t>(static_cast<size_t>(k), idx.size());
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (size_t i = 0; i < kk; ++i) out->top.emplace_back(idx[i], logits[idx[i]] - log_z);
}

}  // namespace

// Fills batch_ with the chunks of seqs (every layer group's block tables), pool_jobs_ with the
// rows a pooling reads and sample_jobs_ with the rows to sample.
Status ModelRunner::BuildBatch(std::span<const RunnerSeq> seqs) {
  ForwardBatch& b = batch_;
  b.tokens.clear();
  b.positions.clear();
  b.seq_idx.clear();
  b.logit_rows.clear();
  b.block_tables.clear();
  b.hidden_rows.clear();
  pool_jobs_.clear();
  b.slots.clear();
  b.attn_acc.clear();
  b.state_slots.clear();
  b.state_snapshots.clear();
  sample_jobs_.clear();
  bool any_slots = false, any_acc = false, any_snapshots = false;
  for (const RunnerSeq& q : seqs) {
    any_slots = any_slots || (q.slot_start >= 0 && q.slot_start != q.start);
    any_acc = any_acc || q.attn_acc != nullptr;
    any_snapshots = any_snapshots || !q.state_snapshots.empty();
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    const RunnerSeq& q = seqs[s];
    if (q.start < 0 || q.num_new < 1 || q.start + q.num_new > static_cast<int64_t>(q.tokens.size())) {
      return InvalidArgument("request {}: chunk [{}, +{}) outside its {} tokens", q.request_id, q.start, q.num_new,
                             q.tokens.size());
    }
    if (q.num_spec < 0 || q.num_spec >= q.num_new || (q.num_spec > 0 && !q.sample)) {
      return InvalidArgument("request {}: {} drafts in a chunk of {} tokens", q.request_id, q.num_spec, q.num_new);
    }
    if (q.slot_start > q.start) return InvalidArgument("request {}: slot {} past position {}", q.request_id, q.slot_start, q.start);
    const int64_t slot0 = q.slot_start >= 0 ? q.slot_start : q.start;
    for (int64_t i = q.start; i < q.start + q.num_new; ++i) {
      b.tokens.push_back(q.tokens[i]);
      b.positions.push_back(static_cast<int32_t>(i));
      b.seq_idx.push_back(static_cast<int32_t>(s));
      if (any_slots) b.slots.push_back(static_cast<int32_t>(slot0 + i - q.start));
    }
    if (any_acc) b.attn_acc.push_back({q.attn_acc, q.attn_acc_stride});
    if (q.state_slot >= 0) b.state_slots.push_back(q.state_slot);
    if (any_snapshots) b.state_snapshots.push_back(q.state_snapshots);
    auto it = requests_.find(q.request_id);
    PerRequest* req = it == requests_.end() ? nullptr : &it->second;
    if (req != nullptr && req->pooling != Pooling::kNone) {
      // The prompt positions of this chunk that the pooling reads.
      const int64_t end = std::min(q.start + q.num_new, q.num_prompt);
      int64_t lo = q.start, hi = end;  // [lo, hi)
      if (req->pooling == Pooling::kCls) hi = std::min<int64_t>(hi, 1);
      if (req->pooling == Pooling::kLast) lo = std::max(lo, q.num_prompt - 1);
      if (lo < hi || q.start == 0) {
        pool_jobs_.push_back({req, static_cast<int64_t>(b.hidden_rows.size()), std::max<int64_t>(0, hi - lo), q.start == 0});
        const int64_t base = static_cast<int64_t>(b.tokens.size()) - q.num_new;
        for (int64_t p = lo; p < hi; ++p) b.hidden_rows.push_back(static_cast<int32_t>(base + p - q.start));
      }
    }
    if (q.sample) {
      if (req == nullptr) return Internal("request {} has no sampler", q.request_id);
      sample_jobs_.push_back({s, static_cast<int64_t>(b.logit_rows.size()), req});
      const int64_t end = static_cast<int64_t>(b.tokens.size());
      for (int64_t row = end - 1 - q.num_spec; row < end; ++row) b.logit_rows.push_back(static_cast<int32_t>(row));
    }
    b.block_tables.push_back(q.group_tables.empty() ? q.block_table : q.group_tables[0]);
  }
  // Further layer groups' tables follow group 0's, group-major (ForwardBatch::block_tables).
  const size_t num_groups = seqs.empty() ? 1 : std::max<size_t>(1, seqs[0].group_tables.size());
  for (size_t g = 1; g < num_groups; ++g) {
    for (const RunnerSeq& q : seqs) {
      if (q.group_tables.size() != num_groups) {
        return InvalidArgument("request {}: {} layer groups' tables, the step has {}", q.request_id,
                               q.group_tables.size(), num_groups);
      }
      b.block_tables.push_back(q.group_tables[g]);
    }
  }
  return Status::Ok();
}

// Prompt rows after every sampled row (so the sampled rows keep their places): the chunk's
// positions before the prompt's last token.
std::vector<ModelRunner::PromptJob> ModelRunner::AddPromptRows(std::span<const RunnerSeq> seqs) {
  std::vector<PromptJob> prompt_jobs;
  int64_t base = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const RunnerSeq& q = seqs[s];
    const int64_t end = std::min(q.start + q.num_new, q.num_prompt - 1);
    if (q.prompt_logprobs >= 0 && end > q.start) {
      prompt_jobs.push_back({s, static_cast<int64_t>(batch_.logit_rows.size()), q.start, end - q.start});
      for (int64_t p = q.start; p < end; ++p) batch_.logit_rows.push_back(static_cast<int32_t>(base + p - q.start));
    }
    base += q.num_new;
  }
  return prompt_jobs;
}

// The pooled requests' hidden rows added to their sums (mean) or kept (cls, last).
void ModelRunner::AccumulatePooling() {
  const int64_t dim = model_.hparams().dim;
  for (const PoolJob& pj : pool_jobs_) {
    PerRequest& r = *pj.req;
    if (pj.restart || r.pooled.empty()) {
      r.pooled.assign(static_cast<size_t>(dim), 0.0);
      r.num_pooled = 0;
    }
    for (int64_t i = 0; i < pj.count; ++i) {
      const float* row = ws_.hidden.data() + (pj.first_row + i) * dim;
      if (r.pooling == Pooling::kMean) {
        for (int64_t d = 0; d < dim; ++d) r.pooled[d] += row[d];
      } else {
        for (int64_t d = 0; d < dim; ++d) r.pooled[d] = row[d];
      }
      ++r.num_pooled;
    }
  }
}

void ModelRunner::PromptLogprobsOf(std::span<const RunnerSeq> seqs, const std::vector<PromptJob>& prompt_jobs,
                                   std::vector<PromptLogprobs>* prompt_logprobs) {
  const int64_t vocab = model_.hparams().vocab_size;
  prompt_logprobs->assign(seqs.size(), PromptLogprobs{});
  for (const PromptJob& pj : prompt_jobs) {
    const RunnerSeq& q = seqs[pj.seq];
    PromptLogprobs& out = (*prompt_logprobs)[pj.seq];
    out.first = pj.first;
    out.entries.resize(static_cast<size_t>(pj.count));
    pool_.ParallelFor(pj.count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        std::span<const float> logits(ws_.logits.data() + (pj.row + i) * vocab, vocab);
        Logprobs(logits, q.tokens[pj.first + i + 1], q.prompt_logprobs, &out.entries[i]);
      }
    });
  }
}

// Each request has its own sampler, so requests can be sampled in parallel with the same
// results; a request's rows are sampled in order, drafts accepted while they match.
void ModelRunner::SampleAll(std::span<const RunnerSeq> seqs, std::vector<std::vector<int32_t>>* sampled,
                            std::vector<std::vector<TokenLogprobs>>* logprobs) {
  const int64_t vocab = model_.hparams().vocab_size;
  const std::vector<SampleJob>& jobs = sample_jobs_;
  pool_.ParallelFor(static_cast<int64_t>(jobs.size()), [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> raw;  // [vocab] the row before penalties touch it
    for (int64_t j = begin; j < end; ++j) {
      const RunnerSeq& q = seqs[jobs[j].seq];
      PerRequest& r = *jobs[j].req;
      std::vector<int32_t>& out = (*sampled)[jobs[j].seq];
      const bool want = r.top_logprobs >= 0 && logprobs != nullptr;
      // Row i follows the input at position `input`; drafts are tokens[input + 1].
      const int64_t first_input = q.start + q.num_new - 1 - q.num_spec;
      for (int64_t i = 0; i <= q.num_spec; ++i) {
        const int64_t input = first_input + i;
        std::span<float> logits(ws_.logits.data() + (jobs[j].row + i) * vocab, vocab);
        if (want) raw.assign(logits.begin(), logits.end());
        int32_t t = r.sampler.Sample(logits, q.tokens.first(input + 1), r.matcher.get());
        if (r.matcher) {
          // The request ends when its grammar cannot go on; the token it gets meanwhile (0) is
          // never shown: the engine ends the request with the error first.
          if (t < 0) {
            r.grammar_status = r.matcher->status().ok() ? InvalidArgument("no token of the vocabulary can continue the grammar here")
                                                        : r.matcher->status();
            t = 0;
          } else if (Status s = r.matcher->Accept(t); !s.ok()) {
            r.grammar_status = s;
          }
        }
        out.push_back(t);
        if (want) Logprobs(raw, t, r.top_logprobs, &(*logprobs)[jobs[j].seq].emplace_back());
        if (i == q.num_spec || q.tokens[input + 1] != t) break;
        if (r.matcher && (!r.grammar_status.ok() || r.matcher->Done())) break;
      }
    }
  });
}

Status ModelRunner::Execute(std::span<const RunnerSeq> seqs, std::vector<std::vector<int32_t>>* sampled,
                            std::vector<std::vector<TokenLogprobs>>* logprobs,
                            std::vector<PromptLogprobs>* prompt_logprobs) {
  RETURN_IF_ERROR(BuildBatch(seqs));
  std::vector<PromptJob> prompt_jobs;
  if (prompt_logprobs != nullptr) prompt_jobs = AddPromptRows(seqs);
  // A step of only partial prefills wants no logits, but Forward always computes at least one
  // row: ask for the last token's and ignore it.
  ForwardBatch& b = batch_;
  if (b.logit_rows.empty()) b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
  RETURN_IF_ERROR(forward_ ? forward_(b, kv_, ws_, pool_) : model_.Forward(b, kv_, ws_, pool_));
  AccumulatePooling();
  if (prompt_logprobs != nullptr) PromptLogprobsOf(seqs, prompt_jobs, prompt_logprobs);
  sampled->resize(seqs.size());
  for (auto& v : *sampled) v.clear();
  if (logprobs != nullptr) {
    logprobs->resize(seqs.size());
    for (auto& v : *logprobs) v.clear();
  }
  if (sample_jobs_.empty()) return Status::Ok();
  ProfileSpan span("sample", "cpu", static_cast<int64_t>(b.logit_rows.size()));
  SampleAll(seqs, sampled, logprobs);
  return Status::Ok();
}

}  // namespace gale
