// Scheduler: one Schedule/Update pair per engine step.
#include "sched/scheduler.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "base/check.h"

namespace gale {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kEos: return "eos";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

Status SchedulerConfig::Validate() const {
  if (max_num_batched_tokens < 1) return InvalidArgument("max_num_batched_tokens must be >= 1, got {}", max_num_batched_tokens);
  if (max_batch_size < 1) return InvalidArgument("max_batch_size must be >= 1, got {}", max_batch_size);
  if (prefill_chunk_size < 1) return InvalidArgument("prefill_chunk_size must be >= 1, got {}", prefill_chunk_size);
  if (max_seq_len < 0) return InvalidArgument("max_seq_len must be >= 0, got {}", max_seq_len);
  return Status::Ok();
}

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager* kv) : config_(config), kv_(kv) {
  CHECK(config_.Validate().ok());
  max_request_tokens_ = kv_->capacity_tokens(config_.max_num_batched_tokens);
  capacity_ = kv_->capacity_tokens(config_.max_num_batched_tokens, /*retaining=*/true);
  if (config_.max_seq_len > 0) max_request_tokens_ = std::min(max_request_tokens_, config_.max_seq_len);
}

Status Scheduler::Add(std::unique_ptr<SeqRequest> req) {
  if (req->tokens.empty()) return InvalidArgument("request {}: the prompt has no tokens", req->id);
  if (req->max_new_tokens < 1) return InvalidArgument("request {}: max_tokens must be >= 1", req->id);
  if (req->retains()) {
    const int64_t limit = config_.max_seq_len > 0 ? config_.max_seq_len : std::numeric_limits<int64_t>::max();
    if (req->num_tokens() + req->max_new_tokens > limit) {
      return InvalidArgument("request {}: prompt of {} tokens + max_tokens {} exceeds max_seq_len {}", req->id,
                             req->num_tokens(), req->max_new_tokens, limit);
    }
    if (req->kv_budget + kv_->block_size() > capacity_) {
      return InvalidArgument("request {}: a KV budget of {} tokens (+ one block) exceeds all KV memory ({} tokens)",
                             req->id, req->kv_budget, capacity_);
    }
  } else if (req->num_tokens() + req->max_new_tokens > max_request_tokens_) {
    return InvalidArgument("request {}: prompt of {} tokens + max_tokens {} exceeds the limit of {} tokens per request",
                           req->id, req->num_tokens(), req->max_new_tokens, max_request_tokens_);
  }
  req->num_prompt_tokens = req->num_tokens();
  req->num_computed_tokens = 0;
  waiting_.push_back(std::move(req));
  return Status::Ok();
}

std::unique_ptr<SeqRequest> Scheduler::Abort(int64_t id, FinishReason reason) {
  std::unique_ptr<SeqRequest> out;
  auto match = [id](const std::unique_ptr<SeqRequest>& r) { return r->id == id; };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    out = std::move(*it);
    running_.erase(it);
  } else if (auto wt = std::find_if(waiting_.begin(), waiting_.end(), match); wt != waiting_.end()) {
    out = std::move(*wt);
    waiting_.erase(wt);
  } else {
    return nullptr;
  }
  kv_->Free(id);
  out->finish_reason = reason;
  return out;
}

void Scheduler::Preempt(std::unique_ptr<SeqRequest> req) {
  kv_->Free(req->id);
  req->num_computed_tokens = 0;  // recompute prompt + generated tokens when readmitted
  req->num_evicted = 0;
  req->num_pinned_slots = 0;
  req->spec_tokens.clear();
  ++req->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(std::move(req));
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  int64_t budget = config_.max_num_batched_tokens;
  // Tokens of req to compute this step: the rest of its tokens, capped by the chunk size and budget.
  // A request with a KV budget also stays within all KV memory (it evicts after the step).
  auto num_new = [&](const SeqRequest& r) {
    const int64_t left = r.num_tokens() - r.num_computed_tokens;
    const int64_t n = std::min({left, config_.prefill_chunk_size, budget});
    if (r.whole_prompt && r.num_computed_tokens < r.num_prompt_tokens && n < left) return int64_t{0};
    return r.retains() ? std::max<int64_t>(1, std::min(n, capacity_ - r.num_slots())) : n;
  };

  // 1. Running requests, oldest first. A request that cannot get its blocks preempts the newest
  //    running request (possibly itself) until it can.
  //    A decoding request with drafts verifies as many as the budget and its length limit allow;
  //    when their slots do not fit, it decodes without them before anything is preempted.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SeqRequest& r = *running_[i];
    const int64_t n = num_new(r);
    if (n == 0) {  // a whole prompt that does not fit the rest of this step's budget
      ++i;
      continue;
    }
    // Windowed layer groups index positions (retention compacts only the full groups' slots).
    kv_->ReleaseBehindWindows(r.id, r.num_computed_tokens);
    int64_t spec = 0;
    if (n == 1 && r.num_computed_tokens + 1 == r.num_tokens()) {
      spec = std::min({static_cast<int64_t>(r.spec_tokens.size()), budget - 1,
                       r.max_new_tokens - r.num_generated() - 1});
      spec = std::max<int64_t>(spec, 0);
      if (spec > 0 && !kv_->AllocateSlots(r.id, r.num_slots() + n + spec, r.num_computed_tokens + n + spec)) spec = 0;
    }
    if (spec > 0 || kv_->AllocateSlots(r.id, r.num_slots() + n, r.num_computed_tokens + n)) {
      plan.seqs.push_back({&r, r.num_computed_tokens, n + spec, r.num_computed_tokens + n == r.num_tokens(), spec});
      plan.num_tokens += n + spec;
      budget -= n + spec;
      ++i;
      continue;
    }
    std::unique_ptr<SeqRequest> victim = std::move(running_.back());
    running_.pop_back();
    plan.preempted.push_back(victim->id);
    Preempt(std::move(victim));
    // When the victim was r itself, i == running_.size() now and the loop ends.
  }

  // 2. Waiting requests, in order, while there is budget, room in the batch and free blocks.
  //    Not in a step that preempted: the memory just freed goes to the running requests.
  //    The next one is the first of a group with the fewest running requests (with one request
  //    per group, as by default, that is the first in line: FCFS).
  if (plan.preempted.empty()) {
    std::unordered_map<int64_t, int64_t> running_per_group;
    for (const auto& r : running_) ++running_per_group[r->group];
    auto next_waiting = [&] {
      size_t best = 0;
      int64_t best_running = INT64_MAX;
      for (size_t k = 0; k < waiting_.size() && best_running > 0; ++k) {
        const auto it = running_per_group.find(waiting_[k]->group);
        const int64_t n = it == running_per_group.end() ? 0 : it->second;
        if (n < best_running) {
          best = k;
          best_running = n;
        }
      }
      return waiting_.begin() + static_cast<std::ptrdiff_t>(best);
    };
    while (budget > 0 && !waiting_.empty() && static_cast<int64_t>(running_.size()) < config_.max_batch_size) {
      const auto next = next_waiting();
      SeqRequest& r = **next;
      // Blocks whose K/V another request (or this one before preemption) already computed.
      // The shared prefix is never evicted: a request with a KV budget takes no more than it holds.
      const int64_t max_hit = r.retains() ? r.kv_budget / kv_->block_size() * kv_->block_size() : -1;
      const int64_t cached = r.no_cached_prefix ? 0 : kv_->AllocateCachedPrefix(r.id, r.tokens, r.cache_salt, max_hit);
      r.num_computed_tokens = cached;
      r.num_evicted = 0;
      r.num_pinned_slots = cached;
      const int64_t n = num_new(r);
      if (n == 0 || !kv_->AllocateSlots(r.id, r.num_computed_tokens + n)) {
        kv_->Free(r.id);
        r.num_computed_tokens = 0;
        r.num_pinned_slots = 0;
        break;
      }
      if (r.num_cached_tokens < 0) r.num_cached_tokens = cached;
      plan.seqs.push_back({&r, r.num_computed_tokens, n, r.num_computed_tokens + n == r.num_tokens()});
      plan.num_tokens += n;
      budget -= n;
      ++running_per_group[r.group];
      running_.push_back(std::move(*next));
      waiting_.erase(next);
    }
  }
  return plan;
}

std::vector<std::unique_ptr<SeqRequest>> Scheduler::Update(const StepPlan& plan, const RunnerOutput& out) {
  CHECK(out.tokens.size() == plan.seqs.size());
  std::vector<int64_t> finished_ids;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    SeqRequest& r = *s.req;
    const std::vector<int32_t>& produced = out.tokens[i];
    r.spec_tokens.clear();
    if (!s.sample) {
      CHECK(produced.empty());
      r.num_computed_tokens = s.start + s.num_new_tokens;
      if (!r.retains()) kv_->CacheFullBlocks(r.id, r.tokens, r.num_computed_tokens, r.cache_salt);
      continue;
    }
    CHECK(!produced.empty() && static_cast<int64_t>(produced.size()) <= 1 + s.num_spec);
    // Output j came from the row of input start + num_new - num_spec - 1 + j: the K/V of the
    // inputs up to the last accepted draft are valid, those of rejected drafts are not.
    const int64_t first_row = s.start + s.num_new_tokens - s.num_spec - 1;
    int64_t appended = 0;
    for (int32_t tok : produced) {
      CHECK(tok >= 0);
      r.tokens.push_back(tok);
      ++appended;
      if (std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) != r.stop_ids.end()) {
        r.finish_reason = FinishReason::kEos;
      } else if (r.num_generated() >= r.max_new_tokens) {
        r.finish_reason = FinishReason::kLength;
      }
      if (r.finish_reason != FinishReason::kNone) break;
    }
    num_spec_verifications_ += s.num_spec > 0;
    num_spec_proposed_ += s.num_spec;
    num_spec_accepted_ += static_cast<int64_t>(produced.size()) - 1;
    r.num_computed_tokens = first_row + appended;
    if (s.num_spec > 0) kv_->TrimSlots(r.id, r.num_slots(), r.num_computed_tokens);
    if (!r.retains()) kv_->CacheFullBlocks(r.id, r.tokens, r.num_computed_tokens, r.cache_salt);
    if (r.finish_reason != FinishReason::kNone) finished_ids.push_back(r.id);
  }
  std::vector<std::unique_ptr<SeqRequest>> finished;
  for (int64_t id : finished_ids) {
    auto it = std::find_if(running_.begin(), running_.end(), [id](const auto& r) { return r->id == id; });
    CHECK(it != running_.end());
    kv_->Free(id);
    finished.push_back(std::move(*it));
    running_.erase(it);
  }
  return finished;
}

std::vector<SeqRequest*> Scheduler::running() const {
  std::vector<SeqRequest*> out;
  out.reserve(running_.size());
  for (const auto& r : running_) out.push_back(r.get());
  return out;
}

std::string Scheduler::CheckInvariants() const {
  if (std::string s = kv_->CheckInvariants(); !s.empty()) return s;
  if (static_cast<int64_t>(running_.size()) > config_.max_batch_size) {
    return fmt::format("{} running > max_batch_size {}", running_.size(), config_.max_batch_size);
  }
  int64_t holders = 0;
  for (const auto& r : running_) {
    if (r->num_computed_tokens > r->num_tokens()) return fmt::format("request {} computed past its tokens", r->id);
    const int64_t blocks = static_cast<int64_t>(kv_->BlockTable(r->id).size());
    if (r->num_evicted < 0 || r->num_evicted > r->num_computed_tokens) {
      return fmt::format("request {}: {} evicted of {} computed tokens", r->id, r->num_evicted, r->num_computed_tokens);
    }
    if (!r->retains() && r->num_evicted != 0) return fmt::format("request {} evicted without a KV budget", r->id);
    if (blocks < kv_->BlocksFor(r->num_slots())) {
      return fmt::format("request {}: {} blocks for {} slots", r->id, blocks, r->num_slots());
    }
    if (blocks > 0) ++holders;
  }
  for (const auto& r : waiting_) {
    if (!kv_->BlockTable(r->id).empty()) return fmt::format("waiting request {} holds blocks", r->id);
    if (r->num_computed_tokens != 0) return fmt::format("waiting request {} has computed tokens", r->id);
  }
  if (holders != kv_->num_requests()) {
    return fmt::format("{} requests hold blocks, the cache manager knows {}", holders, kv_->num_requests());
  }
  return "";
}

}  // namespace gale
