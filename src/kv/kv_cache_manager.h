// Which blocks each request holds: block tables (logical block -> physical block id) per request,
// one per layer group (KvLayerGroups), grown as the request's tokens grow and released when it
// finishes or is preempted; a windowed group's tables also give back what the window passed.
// Deals in block ids only (KvStorage owns the bytes). "No room" is a value, never an error.
// Only the engine thread uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_storage.h"

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
  // A given-back entry of a table (a block behind every window of its group).
  static constexpr int32_t kNoBlock = gale::kNoBlock;

  // group_windows: one entry per layer group (KvLayerGroups::window): its sliding window, 0 for
  // full attention. Each group has a table per request; a windowed group's blocks that its window
  // has passed are given back by ReleaseBehindWindows.
  KvCacheManager(int32_t num_blocks, int64_t block_size, bool enable_prefix_caching = false,
                 std::vector<int64_t> group_windows = {0});

  int64_t block_size() const { return block_size_; }
  const BlockPool& pool() const { return pool_; }
  int32_t num_free_blocks() const { return pool_.num_free(); }
  int64_t num_groups() const { return static_cast<int64_t>(windows_.size()); }
  const std::vector<int64_t>& group_windows() const { return windows_; }
  // The longest request all blocks hold, when no step computes more than max_step_tokens (the
  // windowed groups hold their window plus one step); one group of full attention: every block.
  // retaining: the most cache slots of a request with a KV budget, whose positions (and so its
  // windowed groups' blocks) are not bounded by its slots.
  int64_t capacity_tokens(int64_t max_step_tokens = 0, bool retaining = false) const;
  // Blocks a request of num_tokens holds at most (at its last step) in a cache of these groups
  // (retaining: num_tokens slots, any number of positions).
  static int64_t PeakBlocks(std::span<const int64_t> group_windows, int64_t block_size, int64_t num_tokens,
                            int64_t max_step_tokens, bool retaining = false);

  // Blocks needed to hold num_tokens positions (in one group).
  int64_t BlocksFor(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // Makes each of the request's tables cover [0, num_tokens): allocates the missing blocks, all or
  // none. Returns group 0's table, or nullopt (nothing changed) when too few are free.
  // Full-attention groups index a request's cache slots, windowed groups its positions: with KV
  // retention (compacted slots) a request's slots run behind its positions, and num_positions
  // (default: num_tokens) is what the windowed groups cover. Retention compacts full groups only.
  std::optional<std::span<const int32_t>> AllocateSlots(int64_t request_id, int64_t num_tokens,
                                                        int64_t num_positions = -1);
  // Before a step whose first new token is at first_slot: gives back the blocks of windowed
  // groups that no token from first_slot on reads (wholly before first_slot + 1 - window). They
  // become kNoBlock in the tables; cached ones stay findable until reused. Returns how many.
  int64_t ReleaseBehindWindows(int64_t request_id, int64_t first_slot);
  // Shrinks the request's tables to [0, num_tokens) (windowed groups: [0, num_positions), by
  // default num_tokens): releases the blocks past them (speculative slots whose tokens were
  // rejected, slots retention compacted away). No-op for tables that hold no more.
  void TrimSlots(int64_t request_id, int64_t num_tokens, int64_t num_positions = -1);
  // Releases every block of the request (last block first, so the tail is reused before the head).
  // Cached blocks stay findable until they are reused.
  void Free(int64_t request_id);

  // Prefix cache (when enabled). For a request that holds no blocks: takes the longest chain of
  // cached blocks that hold its first tokens, always leaving at least one token to compute, and
  // returns how many tokens they cover (a multiple of block_size; 0 when disabled or no hit).
  // With windowed groups a hit of k blocks needs every full group's k blocks and each windowed
  // group's blocks within one window of position k * block_size (the others are kNoBlock).
  // max_hit_tokens >= 0: no longer hit than that (KV retention's budget; the lookup still counts
  // the whole prompt).
  int64_t AllocateCachedPrefix(int64_t request_id, std::span<const int32_t> tokens, const std::string& salt,
                               int64_t max_hit_tokens = -1);
  // Makes the request's blocks that are now full (num_computed tokens in the cache) findable.
  void CacheFullBlocks(int64_t request_id, std::span<const int32_t> tokens, int64_t num_computed,
                       const std::string& salt);
  bool prefix_caching() const { return prefix_caching_; }
  // The hash a request's first num_blocks blocks are cached under (group 0's key of the last
  // one): it names the prefix tokens[0, num_blocks * block_size) with the salt.
  BlockHash PrefixHash(std::span<const int32_t> tokens, int64_t num_blocks, const std::string& salt) const;
  // When set, a hit must also end where `resumable` accepts (given PrefixHash of the hit): a
  // model with recurrent layers resumes only where its states were checkpointed. The longest
  // chain that does is taken.
  void set_resumable(std::function<bool(const BlockHash&)> resumable) { resumable_ = std::move(resumable); }
  // KV-cache events: off by default; when on, every block of group 0 made findable and every one
  // evicted is recorded until TakeEvents (the removals of a step come before what it stored:
  // evictions happen as blocks are allocated, storing after the forward).
  void set_record_events(bool on);
  std::vector<KvCacheEvent> TakeEvents();
  int64_t num_lookups() const { return num_lookups_; }
  int64_t num_lookup_tokens() const { return num_lookup_tokens_; }
  int64_t num_hit_tokens() const { return num_hit_tokens_; }
  // Blocks ReleaseBehindWindows has given back so far.
  int64_t num_window_released() const { return num_window_released_; }

  // Group 0's table (every group's covers the same positions).
  std::span<const int32_t> BlockTable(int64_t request_id) const { return BlockTable(request_id, 0); }
  std::span<const int32_t> BlockTable(int64_t request_id, int64_t group) const;
  // Every group's table, group order; valid until the request's tables next change.
  std::span<const std::span<const int32_t>> BlockTables(int64_t request_id) const;
  // Blocks the request holds now, over all groups (kNoBlock entries not counted).
  int64_t HeldBlocks(int64_t request_id) const;
  int64_t num_requests() const { return static_cast<int64_t>(tables_.size()); }

  // Positions allocated but not (yet) holding a token: the unfilled tails of last blocks.
  int64_t WastedSlots() const;
  // "" when every held block is held by exactly its owners; else what is wrong (tests).
  std::string CheckInvariants() const;

 private:
  struct Entry {
    std::vector<std::vector<int32_t>> blocks;  // [num_groups][logical block]
    std::vector<int64_t> released;             // [num_groups] leading entries given back
    int64_t num_tokens = 0;     // slots the full groups cover
    int64_t num_positions = 0;  // positions the windowed groups cover (num_tokens without retention)
    std::vector<BlockHash> hashes;  // of the first hashes.size() blocks (group 0's key), all registered or cached
    mutable std::vector<std::span<const int32_t>> views;  // BlockTables
  };
  Entry NewEntry() const;
  BlockHash HashBlock(const BlockHash& parent, std::span<const int32_t> tokens, const std::string& salt) const;
  // First logical block a token at slot reads in group g.
  int64_t FirstNeededBlock(int64_t g, int64_t slot) const;

  BlockPool pool_;
  int64_t block_size_;
  bool prefix_caching_;
  std::vector<int64_t> windows_;  // [num_groups]
  int64_t num_lookups_ = 0, num_lookup_tokens_ = 0, num_hit_tokens_ = 0, num_window_released_ = 0;
  std::unordered_map<int64_t, Entry> tables_;
  bool record_events_ = false;
  std::vector<KvCacheEvent> stored_;
  std::function<bool(const BlockHash&)> resumable_;
};

}  // namespace gale
