// Selective KV retention (an explicit, lossy mode; off by default): a sequence keeps only some of
// its positions' K/V in the cache, so long sequences hold a bounded number of blocks.
//
// Policies (`--kv-retention`):
//   window        the most recent `budget` positions
//   sink-window   the first `sink_tokens` positions (attention sinks, StreamingLLM) + the most recent
//   heavy-hitter  half the budget for the most recent positions, half for the positions with the
//                 largest attention accumulated so far (H2O), chosen per layer
// Eviction is by compaction: kept rows move down to the lowest slots in order (each layer
// separately), so the sequence's cache is a shorter run of slots and its last blocks are freed.
// K rows keep the RoPE rotation of their original position, so attention needs no positions;
// new tokens still get their real positions. A sequence evicts when its slots reach budget +
// slack (one block in the engine) and goes back to `budget`: one compaction per block of new
// tokens, and a whole block returned each time.
//
// Slots [0, pinned) are never touched: they hold blocks shared with other requests (a prefix
// taken from the prefix cache), which must not change in place; they count towards the budget.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/kv_storage.h"

namespace gale {

enum class RetentionPolicy { kNone, kWindow, kSinkWindow, kHeavyHitter };
const char* RetentionPolicyName(RetentionPolicy p);  // "none", "window", "sink-window", "heavy-hitter"
StatusOr<RetentionPolicy> ParseRetentionPolicy(const std::string& name);

struct RetentionConfig {
  RetentionPolicy policy = RetentionPolicy::kNone;
  int64_t budget = 0;         // positions a sequence keeps (after an eviction)
  double budget_ratio = 0.0;  // instead of budget: this share of the sequence's longest length
  int64_t sink_tokens = 4;    // sink-window: the first positions always kept
  bool active() const { return policy != RetentionPolicy::kNone; }
  // Errors for a policy without a budget, both or neither of budget and ratio, a ratio outside
  // (0, 1], or a budget too small for the policy.
  Status Validate() const;
  // The budget for a sequence of at most max_len tokens (the ratio's share, rounded up, at least
  // the policy's minimum).
  int64_t BudgetFor(int64_t max_len) const;
  // Smallest budget the policy works with.
  int64_t MinBudget() const;
};

// Retention on a model with sliding-window layers (windowed_model) compacts the full-attention
// layers only: the windowed ones must sit in layer groups of their own (which index positions
// and give back what the window passed), and there must be full-attention layers to compact.
// groups: the cache's layer groups. An error names what is missing.
Status CheckRetentionGroups(const KvLayerGroups& groups, bool windowed_model);

// The slots to keep, increasing, when a sequence of num_slots slots goes down to `budget`
// (max(budget, pinned + 1) when the pinned slots alone fill it). Keeps everything when num_slots
// <= budget. acc: [num_slots] accumulated attention (heavy-hitter; ignored by the others).
std::vector<int32_t> SelectSlots(const RetentionConfig& config, int64_t budget, int64_t num_slots, int64_t pinned,
                                 const float* acc);

// Moves the rows of `keep` (increasing slots of one sequence, keep[i] >= i) to slots 0, 1, ... of
// one layer, through the sequence's block table.
void CompactLayer(KvStorage& kv, int64_t layer, std::span<const int32_t> table, std::span<const int32_t> keep);

// One sequence's retention state: its budget, pinned prefix, attention accumulator (heavy-hitter:
// [num_layers, stride] probabilities summed over query heads and tokens), and evictions so far.
class SeqRetention {
 public:
  SeqRetention(const RetentionConfig& config, int64_t budget, int64_t num_layers, int64_t slack);

  const RetentionConfig& config() const { return config_; }
  int64_t budget() const { return budget_; }
  bool tracks_attention() const { return config_.policy == RetentionPolicy::kHeavyHitter; }
  // Slots [0, pinned) are never moved (a shared prefix); set at (re)admission.
  void Reset(int64_t pinned);
  int64_t pinned() const { return pinned_; }
  // Makes the accumulator cover slots [0, num_slots); its rows (null when not tracking).
  float* Accumulator(int64_t num_slots);
  int64_t stride() const { return stride_; }
  // After a step: when num_slots reached budget + slack, compacts every full-attention layer down
  // to the budget through its layer group's table (group_tables: every group's, KvLayerGroups;
  // windowed groups index positions and are left alone) and returns the new slot count (the
  // caller frees the blocks past it); else num_slots. The one-table form: a cache of one group.
  int64_t MaybeEvict(KvStorage& kv, std::span<const std::span<const int32_t>> group_tables, int64_t num_slots);
  int64_t MaybeEvict(KvStorage& kv, std::span<const int32_t> table, int64_t num_slots);
  int64_t num_evicted() const { return num_evicted_; }    // since the last Reset
  int64_t num_evictions() const { return num_evictions_; }  // compactions, since the last Reset

 private:
  RetentionConfig config_;
  int64_t budget_, num_layers_, slack_;
  int64_t pinned_ = 0;
  std::vector<float> acc_;  // [num_layers, stride_]
  int64_t stride_ = 0;
  int64_t num_evicted_ = 0, num_evictions_ = 0;
};

}  // namespace gale
