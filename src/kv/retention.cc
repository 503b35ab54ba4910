// KV retention: which slots a sequence keeps, and the compaction that frees the rest.
#include "kv/retention.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/check.h"

namespace gale {

const char* RetentionPolicyName(RetentionPolicy p) {
  switch (p) {
    case RetentionPolicy::kNone: return "none";
    case RetentionPolicy::kWindow: return "window";
    case RetentionPolicy::kSinkWindow: return "sink-window";
    case RetentionPolicy::kHeavyHitter: return "heavy-hitter";
  }
  return "?";
}

StatusOr<RetentionPolicy> ParseRetentionPolicy(const std::string& name) {
  if (name == "none") return RetentionPolicy::kNone;
  if (name == "window") return RetentionPolicy::kWindow;
  if (name == "sink-window") return RetentionPolicy::kSinkWindow;
  if (name == "heavy-hitter") return RetentionPolicy::kHeavyHitter;
  return InvalidArgument("KV retention policy '{}' is not one of none, window, sink-window, heavy-hitter", name);
}

int64_t RetentionConfig::MinBudget() const {
  switch (policy) {
    case RetentionPolicy::kNone: return 0;
    case RetentionPolicy::kWindow: return 1;
    case RetentionPolicy::kSinkWindow: return sink_tokens + 1;
    case RetentionPolicy::kHeavyHitter: return 2;
  }
  return 1;
}

Status RetentionConfig::Validate() const {
  if (sink_tokens < 0) return InvalidArgument("KV sink tokens must be >= 0, got {}", sink_tokens);
  if (!active()) return Status::Ok();
  if (budget < 0) return InvalidArgument("KV budget must be >= 1 token, got {}", budget);
  if (!(budget_ratio >= 0.0 && budget_ratio <= 1.0)) {
    return InvalidArgument("KV budget ratio must be in (0, 1], got {}", budget_ratio);
  }
  if ((budget > 0) == (budget_ratio > 0.0)) {
    return InvalidArgument("KV retention '{}' needs exactly one of a budget in tokens or a budget ratio",
                           RetentionPolicyName(policy));
  }
  if (budget > 0 && budget < MinBudget()) {
    return InvalidArgument("KV budget of {} tokens is below the {} policy's minimum of {}", budget,
                           RetentionPolicyName(policy), MinBudget());
  }
  return Status::Ok();
}

int64_t RetentionConfig::BudgetFor(int64_t max_len) const {
  if (budget > 0) return budget;
  const auto share = static_cast<int64_t>(std::ceil(budget_ratio * static_cast<double>(max_len)));
  return std::max(share, MinBudget());
}

namespace {

// Slots kept whatever the scores: the pinned prefix, and the sinks for sink-window.
int64_t FixedSlots(const RetentionConfig& config, int64_t num_slots, int64_t pinned) {
  int64_t fixed = pinned;
  if (config.policy == RetentionPolicy::kSinkWindow) fixed = std::max(fixed, std::min(config.sink_tokens, num_slots));
  return fixed;
}

int64_t TargetSlots(const RetentionConfig& config, int64_t budget, int64_t num_slots, int64_t pinned) {
  return std::max(budget, FixedSlots(config, num_slots, pinned) + 1);
}

}  // namespace

std::vector<int32_t> SelectSlots(const RetentionConfig& config, int64_t budget, int64_t num_slots, int64_t pinned,
                                 const float* acc) {
  std::vector<int32_t> keep;
  const int64_t fixed = FixedSlots(config, num_slots, pinned);
  const int64_t target = TargetSlots(config, budget, num_slots, pinned);
  if (!config.active() || num_slots <= target) {
    keep.resize(static_cast<size_t>(num_slots));
    std::iota(keep.begin(), keep.end(), 0);
    return keep;
  }
  keep.reserve(static_cast<size_t>(target));
  for (int64_t s = 0; s < fixed; ++s) keep.push_back(static_cast<int32_t>(s));
  int64_t recent = target - fixed;
  if (config.policy == RetentionPolicy::kHeavyHitter) {
    recent = std::max<int64_t>(1, (target - fixed) / 2);
    const int64_t heavy = target - fixed - recent;
    // The `heavy` largest accumulated scores among the middle slots; ties go to the earlier slot.
    std::vector<int32_t> middle(static_cast<size_t>(num_slots - recent - fixed));
    std::iota(middle.begin(), middle.end(), static_cast<int32_t>(fixed));
    auto more = [acc](int32_t a, int32_t b) { return acc[a] > acc[b] || (acc[a] == acc[b] && a < b); };
    std::nth_element(middle.begin(), middle.begin() + heavy, middle.end(), more);
    middle.resize(static_cast<size_t>(heavy));
    std::sort(middle.begin(), middle.end());
    keep.insert(keep.end(), middle.begin(), middle.end());
  }
  for (int64_t s = num_slots - recent; s < num_slots; ++s) keep.push_back(static_cast<int32_t>(s));
  return keep;
}

void CompactLayer(KvStorage& kv, int64_t layer, std::span<const int32_t> table, std::span<const int32_t> keep) {
  const int64_t bs = kv.block_size();
  for (size_t i = 0; i < keep.size(); ++i) {
    const int64_t src = keep[i], dst = static_cast<int64_t>(i);
    DCHECK(src >= dst);
    if (src == dst) continue;
    kv.CopyRow(layer, table[src / bs], src % bs, table[dst / bs], dst % bs);
  }
}

SeqRetention::SeqRetention(const RetentionConfig& config, int64_t budget, int64_t num_layers, int64_t slack)
    : config_(config), budget_(budget), num_layers_(num_layers), slack_(std::max<int64_t>(1, slack)) {}

void SeqRetention::Reset(int64_t pinned) {
  pinned_ = pinned;
  std::fill(acc_.begin(), acc_.end(), 0.0f);
  num_evicted_ = 0;
  num_evictions_ = 0;
}

float* SeqRetention::Accumulator(int64_t num_slots) {
  if (!tracks_attention()) return nullptr;
  if (num_slots > stride_) {
    const int64_t stride = std::max({num_slots, 2 * stride_, budget_ + slack_ + 16});
    std::vector<float> grown(static_cast<size_t>(num_layers_ * stride), 0.0f);
    for (int64_t l = 0; l < num_layers_ && stride_ > 0; ++l) {
      std::copy_n(acc_.begin() + l * stride_, stride_, grown.begin() + l * stride);
    }
    acc_ = std::move(grown);
    stride_ = stride;
  }
  return acc_.data();
}

Status CheckRetentionGroups(const KvLayerGroups& groups, bool windowed_model) {
  if (!windowed_model) return Status::Ok();
  if (std::find(groups.window.begin(), groups.window.end(), 0) == groups.window.end()) {
    return InvalidArgument("KV retention needs full-attention layers: every layer of this model has a window of {} "
                           "(its cache is bounded by the window already)", groups.window[0]);
  }
  if (groups.num_groups() == 1) {
    return InvalidArgument("KV retention on a sliding-window model needs its windowed layers in layer groups of "
                           "their own (drop --no-kv-window-groups)");
  }
  return Status::Ok();
}

int64_t SeqRetention::MaybeEvict(KvStorage& kv, std::span<const int32_t> table, int64_t num_slots) {
  CHECK(kv.num_groups() == 1);
  const std::span<const int32_t> tables[1] = {table};
  return MaybeEvict(kv, tables, num_slots);
}

int64_t SeqRetention::MaybeEvict(KvStorage& kv, std::span<const std::span<const int32_t>> group_tables,
                                 int64_t num_slots) {
  if (!config_.active()) return num_slots;
  const int64_t target = TargetSlots(config_, budget_, num_slots, pinned_);
  if (num_slots < target + slack_) return num_slots;
  const KvLayerGroups& groups = kv.groups();
  CHECK(static_cast<int64_t>(group_tables.size()) == groups.num_groups());
  std::vector<int32_t> keep;
  bool first = true;
  for (int64_t l = 0; l < num_layers_; ++l) {
    // Windowed layer groups index positions and give back what their window passed: untouched.
    const int32_t g = groups.group_of[l];
    if (groups.window[g] > 0) continue;
    // Window policies keep the same slots in every layer; heavy hitters are each layer's own.
    if (tracks_attention()) {
      float* row = Accumulator(num_slots) + l * stride_;
      keep = SelectSlots(config_, budget_, num_slots, pinned_, row);
      for (size_t i = 0; i < keep.size(); ++i) row[i] = row[keep[i]];
      std::fill(row + keep.size(), row + num_slots, 0.0f);
    } else if (first) {
      keep = SelectSlots(config_, budget_, num_slots, pinned_, nullptr);
    }
    first = false;
    CompactLayer(kv, l, group_tables[g], keep);
  }
  CHECK(!first);  // a model with full-attention layers (CheckRetention)
  const int64_t kept = static_cast<int64_t>(keep.size());
  num_evicted_ += num_slots - kept;
  ++num_evictions_;
  return kept;
}

}  // namespace gale
