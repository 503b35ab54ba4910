// Recurrent-state checkpoints for prefix caching on hybrid models (Qwen3.5): a pool of state
// slots, each holding the state a sequence had after a block-aligned prefix, found by that
// prefix's hash (KvCacheManager::PrefixHash). A prefix-cache hit resumes from the checkpoint at its
// end, so a hit of k blocks needs the k blocks' K/V and this. Least recently used goes first.
// Slots and bytes are KvStorage's; only the engine thread uses it.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace gale {

class StateCheckpoints {
 public:
  // Slots [first_slot, first_slot + count) of the storage's state slots.
  StateCheckpoints(int64_t first_slot, int64_t count);

  int64_t capacity() const { return count_; }
  int64_t size() const { return static_cast<int64_t>(lru_.size()); }
  int64_t num_saved() const { return num_saved_; }
  bool Contains(const BlockHash& h) const { return index_.contains(h); }
  // The slot holding the state after the prefix h (now the most recently used), if any.
  std::optional<int64_t> Find(const BlockHash& h);
  // A slot to write the state after the prefix h into (when all are taken, the least recently
  // used one not in `busy` given up), or nullopt when h has one already (then the most recently
  // used) or no slot can be had.
  std::optional<int64_t> Save(const BlockHash& h, std::span<const int64_t> busy = {});
  // Forgets the checkpoint of h (its slot is taken first by the next Save); no-op when none.
  void Drop(const BlockHash& h);

 private:
  struct Entry {
    BlockHash hash;
    int64_t slot;
  };
  int64_t count_;
  std::list<Entry> lru_;  // front: most recently used
  std::vector<int64_t> free_;  // slots no checkpoint holds (next at the back)
  std::unordered_map<BlockHash, std::list<Entry>::iterator, BlockHashHasher> index_;
  int64_t num_saved_ = 0;
};

}  // namespace gale
