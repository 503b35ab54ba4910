// Block pool and cache manager: ref counts, free-list order, all-or-nothing allocation, and long
// random sequences of allocate/retain/release with the invariants checked after every operation.
#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include "base/rng.h"
#include "kv/kv_cache_manager.h"

namespace gale {
namespace {

TEST(BlockPoolTest, AllocatesInFreeListOrderAndReleasesToTheBack) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(*pool.Allocate(), 0);
  EXPECT_EQ(*pool.Allocate(), 1);
  EXPECT_EQ(*pool.Allocate(), 2);
  EXPECT_EQ(*pool.Allocate(), 3);
  EXPECT_FALSE(pool.Allocate().has_value());
  pool.Release(2);
  pool.Release(0);
  EXPECT_EQ(pool.FreeList(), (std::vector<int32_t>{2, 0}));
  pool.Retain(1);
  pool.Release(1);
  EXPECT_EQ(pool.ref_count(1), 1);  // still held once
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(*pool.Allocate(), 2);  // freed longest ago is reused first
  EXPECT_EQ(pool.CheckInvariants(), "");
}

TEST(BlockPoolTest, RandomRetainReleaseKeepsInvariants) {
  BlockPool pool(37);
  Rng rng(5);
  std::vector<int32_t> held;  // one entry per reference
  for (int step = 0; step < 20000; ++step) {
    const uint64_t op = rng.NextU64() % 3;
    if (op == 0) {
      if (auto b = pool.Allocate()) held.push_back(*b); else ASSERT_EQ(pool.num_free(), 0);
    } else if (op == 1 && !held.empty()) {
      const int32_t b = held[rng.NextU64() % held.size()];
      pool.Retain(b);
      held.push_back(b);
    } else if (!held.empty()) {
      const size_t i = rng.NextU64() % held.size();
      pool.Release(held[i]);
      held[i] = held.back();
      held.pop_back();
    }
    ASSERT_EQ(pool.CheckInvariants(), "") << "step " << step;
  }
  for (int32_t b : held) pool.Release(b);
  EXPECT_EQ(pool.num_free(), 37);
  EXPECT_EQ(pool.CheckInvariants(), "");
}

TEST(KvCacheManagerTest, AllocatesAllOrNothingAndCountsWaste) {
  KvCacheManager kv(5, 4);
  EXPECT_EQ(kv.capacity_tokens(), 20);
  auto t = kv.AllocateSlots(1, 5);  // 2 blocks, 3 slots unfilled
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->size(), 2u);
  EXPECT_EQ(kv.WastedSlots(), 3);
  EXPECT_TRUE(kv.AllocateSlots(1, 8).has_value());  // fills the second block: no new block
  EXPECT_EQ(kv.BlockTable(1).size(), 2u);
  EXPECT_EQ(kv.WastedSlots(), 0);
  EXPECT_FALSE(kv.AllocateSlots(2, 13).has_value());  // needs 4, 3 free: nothing taken
  EXPECT_EQ(kv.num_free_blocks(), 3);
  EXPECT_TRUE(kv.BlockTable(2).empty());
  EXPECT_EQ(kv.num_requests(), 1);
  ASSERT_TRUE(kv.AllocateSlots(2, 12).has_value());
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
  const std::vector<int32_t> table(kv.BlockTable(2).begin(), kv.BlockTable(2).end());
  kv.Free(2);
  // The tail goes back first, so it is reused before the head.
  EXPECT_EQ(kv.pool().FreeList(), (std::vector<int32_t>{table[2], table[1], table[0]}));
  kv.Free(1);
  kv.Free(1);  // unknown: no-op
  EXPECT_EQ(kv.num_free_blocks(), 5);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

}  // namespace
}  // namespace gale
