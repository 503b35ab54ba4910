// KV cache manager: block tables per request over the block pool.
#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/check.h"

namespace gale {

KvCacheManager::KvCacheManager(int32_t num_blocks, int64_t block_size, bool enable_prefix_caching,
                               std::vector<int64_t> group_windows)
    : pool_(num_blocks), block_size_(block_size), prefix_caching_(enable_prefix_caching),
      windows_(std::move(group_windows)) {
  CHECK(block_size > 0 && !windows_.empty());
}

int64_t KvCacheManager::PeakBlocks(std::span<const int64_t> group_windows, int64_t block_size, int64_t num_tokens,
                                   int64_t max_step_tokens, bool retaining) {
  const int64_t all = (num_tokens + block_size - 1) / block_size;
  int64_t total = 0;
  for (int64_t w : group_windows) {
    // A step of n tokens from position f holds blocks floor((f + 1 - w) / bs) .. floor((f + n - 1) / bs).
    const int64_t windowed = (w - 1 + std::max<int64_t>(max_step_tokens, 1) + block_size - 1) / block_size + 1;
    total += w == 0 ? all : retaining ? windowed : std::min(all, windowed);
  }
  return total;
}

int64_t KvCacheManager::capacity_tokens(int64_t max_step_tokens, bool retaining) const {
  const int64_t blocks = pool_.num_blocks();
  if (windows_.size() == 1 && windows_[0] == 0) return blocks * block_size_;
  int64_t lo = 0, hi = int64_t{1} << 40;  // the largest T with PeakBlocks(T) <= blocks
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (PeakBlocks(windows_, block_size_, mid, max_step_tokens, retaining) <= blocks) lo = mid; else hi = mid - 1;
  }
  return lo;
}

KvCacheManager::Entry KvCacheManager::NewEntry() const {
  Entry e;
  e.blocks.resize(windows_.size());
  e.released.assign(windows_.size(), 0);
  return e;
}

int64_t KvCacheManager::FirstNeededBlock(int64_t g, int64_t slot) const {
  const int64_t w = windows_[g];
  return w > 0 ? std::max<int64_t>(0, slot + 1 - w) / block_size_ : 0;
}

BlockHash KvCacheManager::HashBlock(const BlockHash& parent, std::span<const int32_t> tokens,
                                    const std::string& salt) const {
  thread_local std::vector<uint8_t> buf;
  buf.resize(16 + tokens.size() * 4 + salt.size());
  std::memcpy(buf.data(), &parent.lo, 8);
  std::memcpy(buf.data() + 8, &parent.hi, 8);
  std::memcpy(buf.data() + 16, tokens.data(), tokens.size() * 4);
  if (!salt.empty()) std::memcpy(buf.data() + 16 + tokens.size() * 4, salt.data(), salt.size());
  const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  return {h.low64, h.high64};
}

BlockHash KvCacheManager::PrefixHash(std::span<const int32_t> tokens, int64_t num_blocks,
                                    const std::string& salt) const {
  CHECK(num_blocks >= 1 && num_blocks * block_size_ <= static_cast<int64_t>(tokens.size()));
  BlockHash h;
  for (int64_t i = 0; i < num_blocks; ++i) {
    h = HashBlock(h, tokens.subspan(i * block_size_, block_size_), i == 0 ? salt : std::string());
  }
  return h;
}

namespace {
BlockHash InGroup(BlockHash h, int64_t g) {
  h.group = static_cast<int32_t>(g);
  return h;
}
}  // namespace

int64_t KvCacheManager::AllocateCachedPrefix(int64_t request_id, std::span<const int32_t> tokens,
                                             const std::string& salt, int64_t max_hit_tokens) {
  if (!prefix_caching_ || tokens.empty()) return 0;
  CHECK(BlockTable(request_id).empty());
  ++num_lookups_;
  num_lookup_tokens_ += static_cast<int64_t>(tokens.size());
  int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  if (max_hit_tokens >= 0) max_blocks = std::min(max_blocks, max_hit_tokens / block_size_);
  const int64_t num_groups = static_cast<int64_t>(windows_.size());
  // The chain's hashes as far as every full-attention group holds it (with none: all of it).
  std::vector<BlockHash> chain;
  BlockHash parent;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const BlockHash h = HashBlock(parent, tokens.subspan(i * block_size_, block_size_), i == 0 ? salt : std::string());
    bool held = true;
    for (int64_t g = 0; g < num_groups && held; ++g) {
      if (windows_[g] == 0) held = pool_.LookupCached(InGroup(h, g)).has_value();
    }
    if (!held) break;
    chain.push_back(h);
    parent = h;
  }
  // The longest hit whose windowed groups hold the blocks its first computed token reads. A
  // missing block i rules out every hit that reads it: the next candidate is i blocks.
  int64_t k = static_cast<int64_t>(chain.size());
  for (bool held = false; k > 0 && !held;) {
    held = true;
    for (int64_t g = 0; g < num_groups && held; ++g) {
      if (windows_[g] == 0) continue;
      for (int64_t i = k - 1; i >= FirstNeededBlock(g, k * block_size_); --i) {
        if (!pool_.LookupCached(InGroup(chain[i], g))) {
          held = false;
          k = i;
          break;
        }
      }
    }
    if (held && resumable_ && !resumable_(chain[k - 1])) {
      held = false;
      --k;
    }
  }
  if (k == 0) return 0;
  Entry e = NewEntry();
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t first = FirstNeededBlock(g, k * block_size_);
    e.released[g] = first;
    e.blocks[g].assign(first, kNoBlock);
    for (int64_t i = first; i < k; ++i) {
      const int32_t b = *pool_.LookupCached(InGroup(chain[i], g));
      pool_.TakeCached(b);
      e.blocks[g].push_back(b);
    }
  }
  e.hashes.assign(chain.begin(), chain.begin() + k);
  e.num_tokens = e.num_positions = k * block_size_;
  num_hit_tokens_ += e.num_tokens;
  tables_[request_id] = std::move(e);
  return k * block_size_;
}

void KvCacheManager::CacheFullBlocks(int64_t request_id, std::span<const int32_t> tokens, int64_t num_computed,
                                     const std::string& salt) {
  if (!prefix_caching_) return;
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return;
  Entry& e = it->second;
  const int64_t full = std::min<int64_t>(num_computed / block_size_, static_cast<int64_t>(e.blocks[0].size()));
  KvCacheEvent ev;
  auto flush = [&] {
    if (!ev.hashes.empty()) stored_.push_back(std::move(ev));
    ev = KvCacheEvent();
  };
  for (int64_t i = static_cast<int64_t>(e.hashes.size()); i < full; ++i) {
    const BlockHash parent = i == 0 ? BlockHash{} : e.hashes[i - 1];
    const std::span<const int32_t> block = tokens.subspan(i * block_size_, block_size_);
    const BlockHash h = HashBlock(parent, block, i == 0 ? salt : std::string());
    bool stored = false;
    for (size_t g = 0; g < e.blocks.size(); ++g) {
      // A windowed group's block may be given back already (it was full, so hashed, unless the
      // cache was off then): nothing to record.
      const int32_t b = e.blocks[g][i];
      if (b == kNoBlock) continue;
      const bool s = pool_.SetHash(b, InGroup(h, static_cast<int64_t>(g)));
      if (g == 0) stored = s;
    }
    e.hashes.push_back(h);
    if (!record_events_) continue;
    if (!stored) {  // another block holds these tokens already: not news
      flush();
      continue;
    }
    if (ev.hashes.empty() && i > 0) ev.parent = parent.lo;
    ev.hashes.push_back(h.lo);
    ev.tokens.insert(ev.tokens.end(), block.begin(), block.end());
  }
  if (record_events_) flush();
}

void KvCacheManager::set_record_events(bool on) {
  record_events_ = on;
  pool_.set_record_evictions(on);
}

std::vector<KvCacheEvent> KvCacheManager::TakeEvents() {
  std::vector<KvCacheEvent> out;
  std::vector<BlockHash> evicted = pool_.TakeEvicted();
  KvCacheEvent removed;
  removed.kind = KvCacheEvent::Kind::kRemoved;
  for (const BlockHash& h : evicted) {
    if (h.group == 0) removed.hashes.push_back(h.lo);
  }
  if (!removed.hashes.empty()) out.push_back(std::move(removed));
  for (KvCacheEvent& ev : stored_) out.push_back(std::move(ev));
  stored_.clear();
  return out;
}

std::optional<std::span<const int32_t>> KvCacheManager::AllocateSlots(int64_t request_id, int64_t num_tokens,
                                                                      int64_t num_positions) {
  if (num_positions < 0) num_positions = num_tokens;
  auto [it, inserted] = tables_.try_emplace(request_id);
  Entry& e = it->second;
  if (inserted) e = NewEntry();
  auto target = [&](size_t g) { return BlocksFor(windows_[g] > 0 ? num_positions : num_tokens); };
  int64_t need = 0;
  for (size_t g = 0; g < e.blocks.size(); ++g) need += std::max<int64_t>(0, target(g) - static_cast<int64_t>(e.blocks[g].size()));
  if (need > pool_.num_free()) {
    if (e.blocks[0].empty()) tables_.erase(it);
    return std::nullopt;
  }
  for (size_t g = 0; g < e.blocks.size(); ++g) {
    while (static_cast<int64_t>(e.blocks[g].size()) < target(g)) e.blocks[g].push_back(*pool_.Allocate());
  }
  e.num_tokens = std::max(e.num_tokens, num_tokens);
  e.num_positions = std::max(e.num_positions, num_positions);
  return std::span<const int32_t>(e.blocks[0]);
}

int64_t KvCacheManager::ReleaseBehindWindows(int64_t request_id, int64_t first_slot) {
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return 0;
  Entry& e = it->second;
  int64_t released = 0;
  for (size_t g = 0; g < e.blocks.size(); ++g) {
    if (windows_[g] == 0) continue;
    std::vector<int32_t>& t = e.blocks[g];
    const int64_t upto = std::min<int64_t>(FirstNeededBlock(static_cast<int64_t>(g), first_slot), t.size());
    for (int64_t i = e.released[g]; i < upto; ++i) {
      if (t[i] == kNoBlock) continue;
      pool_.Release(t[i]);
      t[i] = kNoBlock;
      ++released;
    }
    e.released[g] = std::max(e.released[g], upto);
  }
  num_window_released_ += released;
  return released;
}

void KvCacheManager::TrimSlots(int64_t request_id, int64_t num_tokens, int64_t num_positions) {
  if (num_positions < 0) num_positions = num_tokens;
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return;
  Entry& e = it->second;
  if (num_tokens >= e.num_tokens && num_positions >= e.num_positions) return;
  num_tokens = std::min(num_tokens, e.num_tokens);
  num_positions = std::min(num_positions, e.num_positions);
  for (size_t g = 0; g < e.blocks.size(); ++g) {
    std::vector<int32_t>& t = e.blocks[g];
    const size_t keep = static_cast<size_t>(BlocksFor(windows_[g] > 0 ? num_positions : num_tokens));
    while (t.size() > keep) {
      if (t.back() != kNoBlock) pool_.Release(t.back());
      t.pop_back();
    }
    e.released[g] = std::min<int64_t>(e.released[g], static_cast<int64_t>(keep));
  }
  const size_t keep = static_cast<size_t>(BlocksFor(std::min(num_tokens, num_positions)));
  if (e.hashes.size() > keep) e.hashes.resize(keep);
  e.num_tokens = num_tokens;
  e.num_positions = num_positions;
  if (e.blocks[0].empty()) tables_.erase(it);
}

void KvCacheManager::Free(int64_t request_id) {
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return;
  for (const auto& t : it->second.blocks) {
    for (auto b = t.rbegin(); b != t.rend(); ++b) {
      if (*b != kNoBlock) pool_.Release(*b);
    }
  }
  tables_.erase(it);
}

std::span<const int32_t> KvCacheManager::BlockTable(int64_t request_id, int64_t group) const {
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return {};
  return it->second.blocks[group];
}

std::span<const std::span<const int32_t>> KvCacheManager::BlockTables(int64_t request_id) const {
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return {};
  const Entry& e = it->second;
  e.views.assign(e.blocks.begin(), e.blocks.end());
  return e.views;
}

int64_t KvCacheManager::HeldBlocks(int64_t request_id) const {
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return 0;
  int64_t held = 0;
  for (const auto& t : it->second.blocks) held += static_cast<int64_t>(std::count_if(t.begin(), t.end(), [](int32_t b) { return b != kNoBlock; }));
  return held;
}

int64_t KvCacheManager::WastedSlots() const {
  int64_t wasted = 0;
  for (const auto& [id, e] : tables_) {
    for (size_t g = 0; g < e.blocks.size(); ++g) {
      wasted += static_cast<int64_t>(e.blocks[g].size()) * block_size_ - (windows_[g] > 0 ? e.num_positions : e.num_tokens);
    }
  }
  return wasted;
}

std::string KvCacheManager::CheckInvariants() const {
  if (std::string s = pool_.CheckInvariants(); !s.empty()) return s;
  std::vector<int32_t> holders(pool_.num_blocks(), 0);
  for (const auto& [id, e] : tables_) {
    if (e.num_positions < e.num_tokens) return fmt::format("request {}: {} positions, {} slots", id, e.num_positions, e.num_tokens);
    for (size_t g = 0; g < e.blocks.size(); ++g) {
      const auto& t = e.blocks[g];
      const int64_t n = windows_[g] > 0 ? e.num_positions : e.num_tokens;
      if (static_cast<int64_t>(t.size()) != BlocksFor(n)) {
        return fmt::format("request {} holds {} blocks of group {} for {} tokens", id, t.size(), g, n);
      }
      for (size_t i = 0; i < t.size(); ++i) {
        if (t[i] == kNoBlock) {
          if (windows_[g] == 0 || static_cast<int64_t>(i) >= e.released[g]) {
            return fmt::format("request {}: block {} of group {} given back outside its window", id, i, g);
          }
          continue;
        }
        ++holders[t[i]];
      }
    }
  }
  for (int32_t b = 0; b < pool_.num_blocks(); ++b) {
    if (holders[b] != pool_.ref_count(b)) {
      return fmt::format("block {}: {} holders, ref count {}", b, holders[b], pool_.ref_count(b));
    }
  }
  return "";
}

}  // namespace gale
