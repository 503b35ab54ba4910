#include "kv/state_checkpoints.h"

#include <algorithm>

namespace gale {

StateCheckpoints::StateCheckpoints(int64_t first_slot, int64_t count) : count_(count) {
  for (int64_t s = first_slot + count - 1; s >= first_slot; --s) free_.push_back(s);
}

std::optional<int64_t> StateCheckpoints::Find(const BlockHash& h) {
  auto it = index_.find(h);
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->slot;
}

std::optional<int64_t> StateCheckpoints::Save(const BlockHash& h, std::span<const int64_t> busy) {
  if (count_ == 0 || Find(h)) return std::nullopt;
  int64_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    auto victim = lru_.end();
    for (auto it = lru_.end(); it != lru_.begin();) {
      --it;
      if (std::find(busy.begin(), busy.end(), it->slot) == busy.end()) {
        victim = it;
        break;
      }
    }
    if (victim == lru_.end()) return std::nullopt;
    slot = victim->slot;
    index_.erase(victim->hash);
    lru_.erase(victim);
  }
  lru_.push_front({h, slot});
  index_[h] = lru_.begin();
  ++num_saved_;
  return slot;
}

void StateCheckpoints::Drop(const BlockHash& h) {
  auto it = index_.find(h);
  if (it == index_.end()) return;
  free_.push_back(it->second->slot);
  lru_.erase(it->second);
  index_.erase(it);
}

}  // namespace gale
