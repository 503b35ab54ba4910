// Which blocks each request holds: one block table (logical block -> physical block id) per
// request, grown as the request's tokens grow and released when it finishes or is preempted.
// Deals in block ids only (KvStorage owns the bytes). "No room" is a value, never an error.
// Only the engine thread uses it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace gale {

// A change to what the prefix cache can find, as vLLM publishes them (KV-cache events for
// cache-aware routers): blocks stored (their hashes in chain order, the parent hash of the first,
// block_size tokens per block) or removed (evicted). Hashes are the low 64 bits of BlockHash.
struct KvCacheEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;  // kStored: none when the first block starts a sequence
  std::vector<int32_t> tokens;     // kStored
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int64_t block_size, bool enable_prefix_caching = false);

  int64_t block_size() const { return block_size_; }
  const BlockPool& pool() const { return pool_; }
  int32_t num_free_blocks() const { return pool_.num_free(); }
  int64_t capacity_tokens() const { return static_cast<int64_t>(pool_.num_blocks()) * block_size_; }

  // Blocks needed to hold num_tokens positions.
  int64_t BlocksFor(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // Makes the request's table cover positions [0, num_tokens): allocates the missing blocks,
  // all or none. Returns the whole table, or nullopt (nothing changed) when too few are free.
  std::optional<std::span<const int32_t>> AllocateSlots(int64_t request_id, int64_t num_tokens);
  // Shrinks the request's table to positions [0, num_tokens): releases the blocks past them
  // (speculative slots whose tokens were rejected). No-op when it already holds no more.
  void TrimSlots(int64_t request_id, int64_t num_tokens);
  // Releases every block of the request (last block first, so the tail is reused before the head).
  // Cached blocks stay findable until they are reused.
  void Free(int64_t request_id);

  // Prefix cache (when enabled). For a request that holds no blocks: takes the longest chain of
  // cached blocks that hold its first tokens, always leaving at least one token to compute, and
  // returns how many tokens they cover (a multiple of block_size; 0 when disabled or no hit).
  int64_t AllocateCachedPrefix(int64_t request_id, std::span<const int32_t> tokens, const std::string& salt);
  // Makes the request's blocks that are now full (num_computed tokens in the cache) findable.
  void CacheFullBlocks(int64_t request_id, std::span<const int32_t> tokens, int64_t num_computed,
                       const std::string& salt);
  bool prefix_caching() const { return prefix_caching_; }
  // KV-cache events: off by default; when on, every block made findable and every one evicted is
  // recorded until TakeEvents (the removals of a step come before what it stored: evictions
  // happen as blocks are allocated, storing after the forward).
  void set_record_events(bool on);
  std::vector<KvCacheEvent> TakeEvents();
  int64_t num_lookups() const { return num_lookups_; }
  int64_t num_lookup_tokens() const { return num_lookup_tokens_; }
  int64_t num_hit_tokens() const { return num_hit_tokens_; }

  std::span<const int32_t> BlockTable(int64_t request_id) const;
  int64_t num_requests() const { return static_cast<int64_t>(tables_.size()); }

  // Positions allocated but not (yet) holding a token: the unfilled tails of last blocks.
  int64_t WastedSlots() const;
  // "" when every held block is held by exactly its owners; else what is wrong (tests).
  std::string CheckInvariants() const;

 private:
  struct Entry {
    std::vector<int32_t> blocks;
    int64_t num_tokens = 0;
    std::vector<BlockHash> hashes;  // of the first hashes.size() blocks, all registered or cached
  };
  BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens, const std::string& salt) const;

  BlockPool pool_;
  int64_t block_size_;
  bool prefix_caching_;
  int64_t num_lookups_ = 0, num_lookup_tokens_ = 0, num_hit_tokens_ = 0;
  std::unordered_map<int64_t, Entry> tables_;
  bool record_events_ = false;
  std::vector<KvCacheEvent> stored_;
};

}  // namespace gale
