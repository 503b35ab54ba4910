// KV cache manager: block tables per request over the block pool.
#include "kv/kv_cache_manager.h"

#include <fmt/format.h>

#include "base/check.h"

namespace gale {

KvCacheManager::KvCacheManager(int32_t num_blocks, int64_t block_size) : pool_(num_blocks), block_size_(block_size) {
  CHECK(block_size > 0);
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
