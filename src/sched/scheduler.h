// The token-budget scheduler (vLLM v1's rule): every step, running requests first (their decode
// token, or the next chunk of an unfinished prefill), then new chunks of waiting requests, within
// max_num_batched_tokens and max_batch_size. There are no prefill and decode phases: a request
// has num_computed_tokens out of its tokens (prompt + generated), and each step computes the
// next ones. When blocks run out, the newest running request is preempted (its blocks freed,
// recomputed later). Pure logic over token ids and block ids: no tensors, no threads.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache_manager.h"

namespace gale {

enum class FinishReason { kNone, kEos, kLength, kStop, kCancelled, kError };
const char* FinishReasonName(FinishReason r);  // "eos", "length", "stop", "cancelled", "error"

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 512;  // tokens computed per step, all requests together
  int64_t max_batch_size = 32;           // requests running at once
  int64_t prefill_chunk_size = 512;      // most tokens of one request per step
  int64_t max_seq_len = 0;               // prompt + output of one request; 0: KV capacity
  Status Validate() const;
};

// The scheduler's view of one request.
struct SeqRequest {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then the generated tokens
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;  // tokens whose K/V are in the cache
  int64_t max_new_tokens = 0;
  std::vector<int32_t> stop_ids;  // generation ends after one of these (EOS, EOT)
  FinishReason finish_reason = FinishReason::kNone;
  int64_t num_preemptions = 0;
  std::string cache_salt;             // requests with different salts never share cached blocks
  int64_t group = 0;                  // admission is fair between groups (Schedule)
  bool no_cached_prefix = false;      // computes its whole prompt (for its prompt's log-probabilities)
  // An encoder's prompt (every token attends to all of them): admitted only when the step can
  // compute all of it, never in chunks.
  bool whole_prompt = false;
  int64_t num_cached_tokens = -1;     // prompt tokens found in the prefix cache at first admission
  // Speculative decoding: tokens a proposer guessed follow `tokens`, set before Schedule. The
  // step verifies them with the request's decode token (num_tokens_with_spec = num_tokens +
  // spec_tokens.size() slots); Update and preemption clear them.
  std::vector<int32_t> spec_tokens;
  // KV retention (lossy; the engine evicts, the scheduler only counts): with kv_budget > 0 the
  // cache holds num_slots() = num_computed_tokens - num_evicted of the request's positions, the
  // request may be longer than KV memory (max_seq_len still applies), its blocks are never
  // offered to the prefix cache, and slots [0, num_pinned_slots) came from it at admission.
  int64_t kv_budget = 0;
  int64_t num_evicted = 0;
  int64_t num_pinned_slots = 0;
  int64_t num_slots() const { return num_computed_tokens - num_evicted; }
  bool retains() const { return kv_budget > 0; }

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_generated() const { return num_tokens() - num_prompt_tokens; }
};

// One request's share of a step: tokens [start, start + num_new_tokens) of req->tokens followed
// by req->spec_tokens[0, num_spec). sample: the chunk ends at the last token, so its logits give
// the next token; with num_spec > 0 the last 1 + num_spec rows' logits verify the drafts.
struct ScheduledSeq {
  SeqRequest* req;
  int64_t start;
  int64_t num_new_tokens;  // including the num_spec drafts
  bool sample;
  int64_t num_spec = 0;
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  int64_t num_tokens = 0;
  std::vector<int64_t> preempted;  // ids preempted while planning this step
  bool empty() const { return seqs.empty(); }
};

// What the runner produced for a plan, per ScheduledSeq: nothing where sample is false, else
// the accepted drafts followed by one sampled token (1 to 1 + num_spec tokens).
struct RunnerOutput {
  std::vector<std::vector<int32_t>> tokens;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager* kv);

  // Most tokens (prompt + output) one request may have: max_seq_len capped by all KV memory.
  int64_t max_request_tokens() const { return max_request_tokens_; }
  // The largest KV budget + one block a request may have (its slots all KV memory holds).
  int64_t retaining_capacity() const { return capacity_; }

  // Queues a request. Admission takes waiting requests in order, except that the request of a
  // group with fewer running requests goes first (groups: SeqRequest::group), so one API request
  // that fans out into hundreds of sequences cannot hold the batch against a small one: that one
  // gets the next free place in the batch. Errors when it can never fit: prompt + max_new_tokens over
  // max_request_tokens() (for a request with a KV budget: over max_seq_len, or a budget plus a
  // block over all KV memory), an empty prompt, or max_new_tokens < 1.
  Status Add(std::unique_ptr<SeqRequest> req);
  // Removes a request wherever it is, freeing its blocks; nullptr when unknown. Not during a step.
  std::unique_ptr<SeqRequest> Abort(int64_t id, FinishReason reason);

  StepPlan Schedule();
  // Advances the planned requests, appends their new tokens (up to a stop token or the length
  // limit), releases the slots of rejected drafts, and returns the requests that finished
  // (blocks freed) in plan order.
  std::vector<std::unique_ptr<SeqRequest>> Update(const StepPlan& plan, const RunnerOutput& out);


  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Running requests, oldest first (the engine sets their spec_tokens before Schedule).
  std::vector<SeqRequest*> running() const;
  // Since the start: verifications of a request's drafts, drafts verified, drafts accepted.
  int64_t num_spec_verifications() const { return num_spec_verifications_; }
  int64_t num_spec_proposed() const { return num_spec_proposed_; }
  int64_t num_spec_accepted() const { return num_spec_accepted_; }
  const SchedulerConfig& config() const { return config_; }

  // "" when queues, block tables and the pool agree; else what is wrong (tests).
  std::string CheckInvariants() const;

 private:
  void Preempt(std::unique_ptr<SeqRequest> req);

  SchedulerConfig config_;
  KvCacheManager* kv_;
  int64_t capacity_ = 0;  // the most slots of a request with a KV budget all KV memory holds
  int64_t max_request_tokens_;
  std::deque<std::unique_ptr<SeqRequest>> waiting_;   // front: next to admit
  std::vector<std::unique_ptr<SeqRequest>> running_;  // admission order: back is preempted first
  int64_t num_preemptions_ = 0;
  int64_t num_spec_verifications_ = 0, num_spec_proposed_ = 0, num_spec_accepted_ = 0;
};

}  // namespace gale
