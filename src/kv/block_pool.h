// The block pool: ids of the KV cache's physical blocks, their reference counts and the free list.
// The free list is kept in eviction order (front = first to reuse): a released block goes to the
// back, so blocks freed longest ago are reused first; prefix caching (next) will keep a freed
// block's contents findable until it reaches the front. Owns ids only; the bytes are KvStorage's.
// Only the engine thread uses it: no locking.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gale {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_count_.size()); }
  int32_t num_free() const { return num_free_; }
  int32_t ref_count(int32_t block_id) const { return ref_count_[block_id]; }

  // Takes the block at the front of the free list (ref count 1), or nullopt when none is free.
  std::optional<int32_t> Allocate();
  // Another holder of an allocated block (prefix sharing).
  void Retain(int32_t block_id);
  // Drops one reference; at zero the block goes to the back of the free list.
  void Release(int32_t block_id);

  // Free-list order, front first (tests).
  std::vector<int32_t> FreeList() const;
  // "" when ref counts, the free list and num_free agree; else what is wrong (tests).
  std::string CheckInvariants() const;

 private:
  void Unlink(int32_t block_id);
  void PushBack(int32_t block_id);

  std::vector<int32_t> ref_count_;  // [num_blocks]
  std::vector<int32_t> prev_;       // [num_blocks] free-list links, -1 at the ends / when not free
  std::vector<int32_t> next_;       // [num_blocks]
  int32_t head_ = -1, tail_ = -1;
  int32_t num_free_ = 0;
};

}  // namespace gale
