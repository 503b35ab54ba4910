// Draft-model proposals for speculative decoding: a smaller model with the same vocabulary
// guesses the next k tokens greedily (so the proposal is deterministic, which is what the
// runner's verification rule assumes). It has its own paged KV cache, with one block table per
// request, kept in step with the target: after each step its K/V are trimmed to the tokens the
// target accepted, and the next proposal first catches up on the tokens it has not seen.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_storage.h"
#include "model/model.h"
#include "runner/model_runner.h"

namespace gale {

class DraftProposer {
 public:
  // Errors when the draft's vocabulary differs from the target's.
  static StatusOr<std::unique_ptr<DraftProposer>> Create(const Model& draft, const Model& target,
                                                         int64_t num_blocks, int64_t block_size,
                                                         kernels::KvType kv_type, kernels::KvType v_type,
                                                         ThreadPool& pool);

  struct Job {
    int64_t request_id;
    std::span<const int32_t> tokens;  // the request's tokens; the proposal continues them
    int64_t k;                        // tokens wanted (>= 1)
  };
  // Proposes up to job.k tokens per job (fewer, or none, when its KV memory is short), running
  // the draft k times over all jobs together. (*out)[i] belongs to jobs[i].
  Status Propose(std::span<const Job> jobs, std::vector<std::vector<int32_t>>* out);
  // The target now holds K/V for the first num_valid tokens of the request: forget the draft's
  // K/V past them.
  void Rollback(int64_t request_id, int64_t num_valid);
  // Frees everything the draft holds for the request (finished, cancelled or preempted).
  void Release(int64_t request_id);

  uint64_t kv_bytes() const { return storage_.num_bytes(); }
  int64_t num_requests() const { return static_cast<int64_t>(computed_.size()); }
  int32_t num_free_blocks() const { return kv_.num_free_blocks(); }
  int32_t num_blocks() const { return kv_.pool().num_blocks(); }

 private:
  DraftProposer(const Model& draft, int64_t num_blocks, int64_t block_size, kernels::KvType kv_type,
                kernels::KvType v_type, ThreadPool& pool);

  KvStorage storage_;
  KvCacheManager kv_;
  ModelRunner runner_;
  std::unordered_map<int64_t, int64_t> computed_;  // request -> tokens whose draft K/V are valid
  // Scratch reused across steps.
  std::vector<std::vector<int32_t>> seqs_tokens_;
  std::vector<RunnerSeq> seqs_;
  std::vector<size_t> active_;
  std::vector<std::vector<int32_t>> sampled_;
};

}  // namespace gale
