// Draft model: a catch-up chunk plus the first guess in one pass, then one pass per further guess.
#include "spec/draft.h"

#include <algorithm>

#include "base/profiler.h"

namespace gale {

StatusOr<std::unique_ptr<DraftProposer>> DraftProposer::Create(const Model& draft, const Model& target,
                                                               int64_t num_blocks, int64_t block_size,
                                                               kernels::KvType kv_type, kernels::KvType v_type,
                                                               ThreadPool& pool) {
  if (draft.hparams().vocab_size != target.hparams().vocab_size) {
    return InvalidArgument("the draft model's vocabulary has {} tokens, the target's {}: they must share one",
                           draft.hparams().vocab_size, target.hparams().vocab_size);
  }
  if (num_blocks < 1 || block_size < 1) return InvalidArgument("draft KV cache needs blocks, got {}", num_blocks);
  if (draft.hparams().recurrent_state_floats > 0) {
    // Its guesses run ahead of what the target accepts; a recurrent state cannot step back.
    return Unimplemented("a draft model with recurrent layers ({}) is not supported", draft.hparams().arch);
  }
  return std::unique_ptr<DraftProposer>(new DraftProposer(draft, num_blocks, block_size, kv_type, v_type, pool));
}

DraftProposer::DraftProposer(const Model& draft, int64_t num_blocks, int64_t block_size,
                             kernels::KvType kv_type, kernels::KvType v_type, ThreadPool& pool)
    : storage_(draft.kv_layout(), draft.kv_layout().Groups(false), num_blocks, block_size, kv_type, v_type),
      kv_(static_cast<int32_t>(num_blocks), block_size, /*enable_prefix_caching=*/false),
      runner_(draft, storage_, pool) {}

Status DraftProposer::Propose(std::span<const Job> jobs, std::vector<std::vector<int32_t>>* out) {
  out->assign(jobs.size(), {});
  seqs_tokens_.resize(jobs.size());
  active_.clear();
  int64_t rounds = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    const int64_t len = static_cast<int64_t>(j.tokens.size());
    if (j.k < 1 || len < 1) continue;
    auto [it, added] = computed_.try_emplace(j.request_id, 0);
    if (added) {
      SamplingParams greedy;
      greedy.temperature = 0.0f;
      runner_.AddRequest(j.request_id, greedy);
    }
    if (it->second >= len) it->second = len - 1;  // the last token's K/V come with this pass
    // Inputs reach position len + k - 2 (the (k-1)-th guess).
    if (!kv_.AllocateSlots(j.request_id, len + j.k - 1)) continue;
    seqs_tokens_[i].assign(j.tokens.begin(), j.tokens.end());
    active_.push_back(i);
    rounds = std::max(rounds, j.k);
  }
  ProfileSpan span("draft", "spec", static_cast<int64_t>(active_.size()));
  for (int64_t round = 0; round < rounds; ++round) {
    seqs_.clear();
    std::vector<size_t> in_pass;
    for (size_t i : active_) {
      const Job& j = jobs[i];
      if (round >= j.k) continue;
      int64_t& done = computed_[j.request_id];
      const int64_t len = static_cast<int64_t>(seqs_tokens_[i].size());
      seqs_.push_back({j.request_id, seqs_tokens_[i], done, len - done, kv_.BlockTable(j.request_id), true});
      in_pass.push_back(i);
    }
    RETURN_IF_ERROR(runner_.Execute(seqs_, &sampled_));
    for (size_t s = 0; s < in_pass.size(); ++s) {
      const size_t i = in_pass[s];
      computed_[jobs[i].request_id] = static_cast<int64_t>(seqs_tokens_[i].size());
      const int32_t t = sampled_[s].front();
      seqs_tokens_[i].push_back(t);
      (*out)[i].push_back(t);
    }
  }
  return Status::Ok();
}

void DraftProposer::Rollback(int64_t request_id, int64_t num_valid) {
  auto it = computed_.find(request_id);
  if (it == computed_.end()) return;
  if (it->second > num_valid) it->second = num_valid;
  kv_.TrimSlots(request_id, it->second);
}

void DraftProposer::Release(int64_t request_id) {
  if (computed_.erase(request_id) == 0) return;
  kv_.Free(request_id);
  runner_.RemoveRequest(request_id);
}

}  // namespace gale
