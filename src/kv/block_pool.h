// The block pool: ids of the KV cache's physical blocks, their reference counts and the free list.
// The free list is kept in eviction order (front = first to reuse): a released block goes to the
// back, so blocks freed longest ago are reused first; prefix caching (next) will keep a freed
// block's contents findable until it reaches the front. Owns ids only; the bytes are KvStorage's.
// Only the engine thread uses it: no locking.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gale {

// Identity of a full block's contents: a 128-bit hash chained over its parent block's hash and
// its token ids (and the request's cache salt for the first block), and the layer group whose
// K/V the block holds (KvLayerGroups: the same tokens have one block per group).
struct BlockHash {
  uint64_t lo = 0, hi = 0;
  int32_t group = 0;
  bool operator==(const BlockHash& o) const { return lo == o.lo && hi == o.hi && group == o.group; }
};
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    return static_cast<size_t>((h.lo + static_cast<uint64_t>(h.group)) ^ (h.hi * 0x9e3779b97f4a7c15ull));
  }
};

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_count_.size()); }
  int32_t num_free() const { return num_free_; }
  int32_t ref_count(int32_t block_id) const { return ref_count_[block_id]; }

  // Takes the block at the front of the free list (ref count 1), or nullopt when none is free.
  // A cached block taken this way is evicted: its hash is forgotten.
  std::optional<int32_t> Allocate();

  // Prefix cache. A full block's hash maps to the block holding those tokens' K/V, whether in use
  // or free (a free cached block stays on the free list in LRU order until Allocate evicts it).
  std::optional<int32_t> LookupCached(const BlockHash& h) const;
  // Takes a reference to a cached block (off the free list if it was free).
  void TakeCached(int32_t block_id);
  // Records that block_id holds the tokens hashed to h; no-op (false) if h already has a block.
  bool SetHash(int32_t block_id, const BlockHash& h);
  // With recording on, the hashes Allocate evicts are kept until taken (KV-cache events).
  void set_record_evictions(bool on) { record_evictions_ = on; }
  std::vector<BlockHash> TakeEvicted() { return std::exchange(evicted_, {}); }
  int64_t num_cached() const { return static_cast<int64_t>(cached_.size()); }
  int64_t num_evictions() const { return num_evictions_; }
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
  std::vector<BlockHash> hash_;     // [num_blocks] valid where has_hash_
  std::vector<char> has_hash_;      // [num_blocks]
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;
  int64_t num_evictions_ = 0;
  bool record_evictions_ = false;
  std::vector<BlockHash> evicted_;
};

}  // namespace gale
