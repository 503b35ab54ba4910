// KV cache manager: block tables per request over the block pool.
#include "kv/kv_cache_manager.h"

#include <cstring>

#include <fmt/format.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/check.h"

namespace gale {

KvCacheManager::KvCacheManager(int32_t num_blocks, int64_t block_size, bool enable_prefix_caching)
    : pool_(num_blocks), block_size_(block_size), prefix_caching_(enable_prefix_caching) {
  CHECK(block_size > 0);
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

int64_t KvCacheManager::AllocateCachedPrefix(int64_t request_id, std::span<const int32_t> tokens,
                                             const std::string& salt) {
  if (!prefix_caching_ || tokens.empty()) return 0;
  CHECK(BlockTable(request_id).empty());
  ++num_lookups_;
  num_lookup_tokens_ += static_cast<int64_t>(tokens.size());
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size_;
  Entry e;
  BlockHash parent;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const BlockHash h = HashBlock(parent, tokens.subspan(i * block_size_, block_size_), i == 0 ? salt : std::string());
    const auto b = pool_.LookupCached(h);
    if (!b) break;
    pool_.TakeCached(*b);
    e.blocks.push_back(*b);
    e.hashes.push_back(h);
    parent = h;
  }
  if (e.blocks.empty()) return 0;
  e.num_tokens = static_cast<int64_t>(e.blocks.size()) * block_size_;
  num_hit_tokens_ += e.num_tokens;
  const int64_t hit = e.num_tokens;
  tables_[request_id] = std::move(e);
  return hit;
}

void KvCacheManager::CacheFullBlocks(int64_t request_id, std::span<const int32_t> tokens, int64_t num_computed,
                                     const std::string& salt) {
  if (!prefix_caching_) return;
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return;
  Entry& e = it->second;
  const int64_t full = std::min<int64_t>(num_computed / block_size_, static_cast<int64_t>(e.blocks.size()));
  KvCacheEvent ev;
  auto flush = [&] {
    if (!ev.hashes.empty()) stored_.push_back(std::move(ev));
    ev = KvCacheEvent();
  };
  for (int64_t i = static_cast<int64_t>(e.hashes.size()); i < full; ++i) {
    const BlockHash parent = i == 0 ? BlockHash{} : e.hashes[i - 1];
    const std::span<const int32_t> block = tokens.subspan(i * block_size_, block_size_);
    const BlockHash h = HashBlock(parent, block, i == 0 ? salt : std::string());
    const bool stored = pool_.SetHash(e.blocks[i], h);
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
  if (!evicted.empty()) {
    KvCacheEvent removed;
    removed.kind = KvCacheEvent::Kind::kRemoved;
    for (const BlockHash& h : evicted) removed.hashes.push_back(h.lo);
    out.push_back(std::move(removed));
  }
  for (KvCacheEvent& ev : stored_) out.push_back(std::move(ev));
  stored_.clear();
  return out;
}

std::optional<std::span<const int32_t>> KvCacheManager::AllocateSlots(int64_t request_id, int64_t num_tokens) {
  Entry& e = tables_[request_id];
  const int64_t need = BlocksFor(num_tokens) - static_cast<int64_t>(e.blocks.size());
  if (need > pool_.num_free()) {
    if (e.blocks.empty()) tables_.erase(request_id);
    return std::nullopt;
  }
  for (int64_t i = 0; i < need; ++i) e.blocks.push_back(*pool_.Allocate());
  if (num_tokens > e.num_tokens) e.num_tokens = num_tokens;
  return std::span<const int32_t>(e.blocks);
}

void KvCacheManager::TrimSlots(int64_t request_id, int64_t num_tokens) {
  auto it = tables_.find(request_id);
  if (it == tables_.end() || num_tokens >= it->second.num_tokens) return;
  Entry& e = it->second;
  const size_t keep = static_cast<size_t>(BlocksFor(num_tokens));
  while (e.blocks.size() > keep) {
    pool_.Release(e.blocks.back());
    e.blocks.pop_back();
  }
  if (e.hashes.size() > keep) e.hashes.resize(keep);
  e.num_tokens = num_tokens;
  if (e.blocks.empty()) tables_.erase(it);
}

void KvCacheManager::Free(int64_t request_id) {
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return;
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) pool_.Release(*b);
  tables_.erase(it);
}

std::span<const int32_t> KvCacheManager::BlockTable(int64_t request_id) const {
  auto it = tables_.find(request_id);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

int64_t KvCacheManager::WastedSlots() const {
  int64_t wasted = 0;
  for (const auto& [id, e] : tables_) wasted += static_cast<int64_t>(e.blocks.size()) * block_size_ - e.num_tokens;
  return wasted;
}

std::string KvCacheManager::CheckInvariants() const {
  if (std::string s = pool_.CheckInvariants(); !s.empty()) return s;
  std::vector<int32_t> holders(pool_.num_blocks(), 0);
  for (const auto& [id, e] : tables_) {
    if (static_cast<int64_t>(e.blocks.size()) != BlocksFor(e.num_tokens)) {
      return fmt::format("request {} holds {} blocks for {} tokens", id, e.blocks.size(), e.num_tokens);
    }
    for (int32_t b : e.blocks) ++holders[b];
  }
  for (int32_t b = 0; b < pool_.num_blocks(); ++b) {
    if (holders[b] != pool_.ref_count(b)) {
      return fmt::format("block {}: {} holders, ref count {}", b, holders[b], pool_.ref_count(b));
    }
  }
  return "";
}

}  // namespace gale
