// Model runner: turns one step's scheduled chunks into a ForwardBatch (tokens, positions, block
// tables, which rows need logits), runs the model once for all of them, and samples the next
// token of each request whose chunk reached its last token, with that request's own sampler
// (seeded per request, so a request's samples do not depend on what it was batched with).
// Knows nothing of queues or scheduling policy.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "grammar/matcher.h"
#include "kv/kv_storage.h"
#include "model/model.h"
#include "runner/sampler.h"

namespace gale {

// One request's chunk in a step: tokens[start, start + num_new) are computed at positions
// start.. (the tokens before a sampled row are the sampler's penalty history). The last num_spec
// of them are drafts to verify (tokens ends with them): the last 1 + num_spec rows are sampled in
// order, and each draft is accepted while it equals what was sampled before it.
struct RunnerSeq {
  int64_t request_id;
  std::span<const int32_t> tokens;
  int64_t start;
  int64_t num_new;
  std::span<const int32_t> block_table;
  bool sample;
  int64_t num_spec = 0;
  // KV retention: the chunk's first cache slot (-1: start; evicted positions make it smaller)
  // and the sequence's attention accumulator (ForwardBatch::attn_acc), if it tracks one.
  int64_t slot_start = -1;
  float* attn_acc = nullptr;
  int64_t attn_acc_stride = 0;
  // Prompt log-probabilities (completions' echo with logprobs): with prompt_logprobs = k >= 0,
  // every row of the chunk at a position p < num_prompt - 1 gives token p + 1's log-probability
  // given the tokens before it, with k alternatives.
  int64_t num_prompt = 0;
  int prompt_logprobs = -1;
  // A cache of several layer groups (KvLayerGroups): every group's table, group 0's first (then
  // block_table is not read). Empty: one group, block_table.
  std::span<const std::span<const int32_t>> group_tables = {};
  // Models with recurrent layers: the sequence's state slot (ForwardBatch::state_slots); -1: none.
  int32_t state_slot = -1;
  // States kept part way through the chunk (ForwardBatch::state_snapshots): a verifying request's
  // after its decode token and guesses, a prompt's at its last block boundary.
  std::span<const StateSnapshot> state_snapshots = {};
};

// Log-probabilities of a sampled token under the model (log-softmax of the raw logits, before
// penalties and temperature, as vLLM reports them) and the k most likely alternatives.
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // [k] (token, logprob), most likely first
};

// A chunk's prompt log-probabilities: entries[i] is token (first + i + 1)'s.
struct PromptLogprobs {
  int64_t first = 0;
  std::vector<TokenLogprobs> entries;
};

class ModelRunner {
 public:
  ModelRunner(const Model& model, KvStorage& kv, ThreadPool& pool) : model_(model), kv_(kv), pool_(pool) {}

  // top_logprobs: -1 no log-probabilities; k >= 0: the sampled token's and k alternatives.
  // grammar: the request's output must follow it (stop_ids are allowed where it may end).
  void AddRequest(int64_t request_id, const SamplingParams& params, int top_logprobs = -1,
                  std::shared_ptr<const grammar::CompiledGrammar> grammar = nullptr,
                  std::vector<int32_t> stop_ids = {}, Pooling pooling = Pooling::kNone);
  void RemoveRequest(int64_t request_id);

  // A grammar-constrained request after a step: Ok while it may go on; an error when no token
  // could continue its grammar (the request must end); `done` when its grammar is complete and
  // nothing can follow.
  struct GrammarState {
    bool done = false;
    Status status;
  };
  GrammarState grammar_state(int64_t request_id) const;
  // How many of `drafts` the request's grammar allows in a row from where it is (all when it has
  // none): speculative guesses are cut there before they are verified.
  size_t GrammarAllowedPrefix(int64_t request_id, std::span<const int32_t> drafts);

  // An embedding request (pooling set): its prompt's hidden states pooled so far, L2-normalized;
  // whole once its last prompt chunk has run. Chunks are added in position order (a chunk at
  // position 0 starts over: preemption recomputes from there), so chunking changes nothing.
  std::vector<float> Embedding(int64_t request_id) const;

  // One forward pass over all chunks. sampled[i] is what seqs[i] produced: empty where !sample,
  // else its accepted drafts and then one sampled token. Sampling row j draws exactly as decoding
  // one token at a time would (same history, same next draw of the request's RNG), so output
  // does not depend on whether drafts were verified: for a greedy request that is the usual
  // longest-matching-prefix rule; for a sampled one it is the standard rejection rule for a
  // deterministic draft (accept d with probability p(d), else draw from p without d), realised
  // by drawing t ~ p and accepting when t == d. logprobs[i] has one entry per produced token
  // where the request asked for log-probabilities. prompt_logprobs[i] holds seqs[i]'s prompt
  // log-probabilities where it asked for them (RunnerSeq::prompt_logprobs).
  Status Execute(std::span<const RunnerSeq> seqs, std::vector<std::vector<int32_t>>* sampled,
                 std::vector<std::vector<TokenLogprobs>>* logprobs = nullptr,
                 std::vector<PromptLogprobs>* prompt_logprobs = nullptr);

  const Workspace& workspace() const { return ws_; }
  // Runs the forward through `forward` instead of Model::Forward (EngineConfig::forward).
  using ForwardFn = std::function<Status(const ForwardBatch&, KvStorage&, Workspace&, ThreadPool&)>;
  void set_forward(ForwardFn forward) { forward_ = std::move(forward); }

 private:
  const Model& model_;
  KvStorage& kv_;
  ThreadPool& pool_;
  Workspace ws_;
  ForwardFn forward_;
  ForwardBatch batch_;  // reused across steps
  struct PerRequest {
    Sampler sampler;
    int top_logprobs;
    std::unique_ptr<grammar::GrammarMatcher> matcher;  // null: unconstrained
    Status grammar_status;
    Pooling pooling = Pooling::kNone;
    std::vector<double> pooled;  // [dim] the sum (mean) or the row (cls, last) so far
    int64_t num_pooled = 0;
  };
  struct PoolJob {
    PerRequest* req;
    int64_t first_row;  // in ws_.hidden
    int64_t count;
    bool restart;       // the chunk starts at position 0
  };
  std::vector<PoolJob> pool_jobs_;
  std::unordered_map<int64_t, PerRequest> requests_;
  struct SampleJob {
    size_t seq;        // index in seqs
    int64_t row;       // its first logits row
    PerRequest* req;
  };
  std::vector<SampleJob> sample_jobs_;  // [seqs sampled this step]
  struct PromptJob {
    size_t seq;
    int64_t row, first, count;  // its first logits row; the positions [first, first + count)
  };

  // Execute's steps, in order.
  Status BuildBatch(std::span<const RunnerSeq> seqs);
  std::vector<PromptJob> AddPromptRows(std::span<const RunnerSeq> seqs);
  void AccumulatePooling();
  void PromptLogprobsOf(std::span<const RunnerSeq> seqs, const std::vector<PromptJob>& prompt_jobs,
                        std::vector<PromptLogprobs>* prompt_logprobs);
  void SampleAll(std::span<const RunnerSeq> seqs, std::vector<std::vector<int32_t>>* sampled,
                 std::vector<std::vector<TokenLogprobs>>* logprobs);
};

}  // namespace gale
