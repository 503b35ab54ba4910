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

class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int64_t block_size);

  int64_t block_size() const { return block_size_; }
  const BlockPool& pool() const { return pool_; }
  int32_t num_free_blocks() const { return pool_.num_free(); }
  int64_t capacity_tokens() const { return static_cast<int64_t>(pool_.num_blocks()) * block_size_; }

  // Blocks needed to hold num_tokens positions.
  int64_t BlocksFor(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // Makes the request's table cover positions [0, num_tokens): allocates the missing blocks,
  // all or none. Returns the whole table, or nullopt (nothing changed) when too few are free.
  std::optional<std::span<const int32_t>> AllocateSlots(int64_t request_id, int64_t num_tokens);
  // Releases every block of the request (last block first, so the tail is reused before the head).
  void Free(int64_t request_id);

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
  };
  BlockPool pool_;
  int64_t block_size_;
  std::unordered_map<int64_t, Entry> tables_;
};

}  // namespace gale
