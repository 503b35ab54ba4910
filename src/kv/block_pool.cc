// Block pool: an intrusive doubly linked free list over block ids, so a block can also leave the
// list from the middle (a prefix-cache hit on a freed block) in O(1).
#include "kv/block_pool.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/check.h"

namespace gale {

BlockPool::BlockPool(int32_t num_blocks)
    : ref_count_(num_blocks, 0),
      prev_(num_blocks, -1),
      next_(num_blocks, -1),
      hash_(num_blocks),
      has_hash_(num_blocks, 0) {
  CHECK(num_blocks > 0);
  for (int32_t b = 0; b < num_blocks; ++b) PushBack(b);
}

void BlockPool::PushBack(int32_t b) {
  prev_[b] = tail_;
  next_[b] = -1;
  if (tail_ >= 0) next_[tail_] = b; else head_ = b;
  tail_ = b;
  ++num_free_;
}

void BlockPool::Unlink(int32_t b) {
  if (prev_[b] >= 0) next_[prev_[b]] = next_[b]; else head_ = next_[b];
  if (next_[b] >= 0) prev_[next_[b]] = prev_[b]; else tail_ = prev_[b];
  prev_[b] = next_[b] = -1;
  --num_free_;
}

std::optional<int32_t> BlockPool::Allocate() {
  if (head_ < 0) return std::nullopt;
  const int32_t b = head_;
  Unlink(b);
  ref_count_[b] = 1;
  if (has_hash_[b]) {
    cached_.erase(hash_[b]);
    has_hash_[b] = 0;
    ++num_evictions_;
    if (record_evictions_) evicted_.push_back(hash_[b]);
  }
  return b;
}

std::optional<int32_t> BlockPool::LookupCached(const BlockHash& h) const {
  auto it = cached_.find(h);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::TakeCached(int32_t b) {
  CHECK(b >= 0 && b < num_blocks() && has_hash_[b]);
  if (ref_count_[b] == 0) Unlink(b);
  ++ref_count_[b];
}

bool BlockPool::SetHash(int32_t b, const BlockHash& h) {
  CHECK(b >= 0 && b < num_blocks() && ref_count_[b] > 0);
  if (has_hash_[b] || cached_.count(h)) return false;
  hash_[b] = h;
  has_hash_[b] = 1;
  cached_.emplace(h, b);
  return true;
}

void BlockPool::Retain(int32_t b) {
  CHECK(b >= 0 && b < num_blocks() && ref_count_[b] > 0);
  ++ref_count_[b];
}

void BlockPool::Release(int32_t b) {
  CHECK(b >= 0 && b < num_blocks() && ref_count_[b] > 0);
  if (--ref_count_[b] == 0) PushBack(b);
}

std::vector<int32_t> BlockPool::FreeList() const {
  std::vector<int32_t> out;
  for (int32_t b = head_; b >= 0; b = next_[b]) out.push_back(b);
  return out;
}

std::string BlockPool::CheckInvariants() const {
  std::vector<char> on_list(ref_count_.size(), 0);
  int32_t count = 0, prev = -1;
  for (int32_t b = head_; b >= 0; b = next_[b]) {
    if (b >= num_blocks()) return fmt::format("free list holds block {} out of range", b);
    if (on_list[b]) return fmt::format("block {} twice on the free list", b);
    if (prev_[b] != prev) return fmt::format("block {}: back link {} != {}", b, prev_[b], prev);
    on_list[b] = 1;
    prev = b;
    ++count;
  }
  if (prev != tail_) return "free list tail is wrong";
  if (count != num_free_) return fmt::format("free list has {} blocks, num_free says {}", count, num_free_);
  if (static_cast<int64_t>(cached_.size()) != std::count(has_hash_.begin(), has_hash_.end(), 1)) {
    return "cached-block map and block hashes disagree";
  }
  for (const auto& [h, b] : cached_) {
    if (!has_hash_[b] || !(hash_[b] == h)) return fmt::format("cached block {} has another hash", b);
  }
  for (int32_t b = 0; b < num_blocks(); ++b) {
    if (ref_count_[b] < 0) return fmt::format("block {} has ref count {}", b, ref_count_[b]);
    if ((ref_count_[b] == 0) != static_cast<bool>(on_list[b])) {
      return fmt::format("block {}: ref count {} but {} the free list", b, ref_count_[b], on_list[b] ? "on" : "not on");
    }
  }
  return "";
}

}  // namespace gale
