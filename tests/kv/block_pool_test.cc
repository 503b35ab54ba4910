// Block pool and cache manager: ref counts, free-list order, all-or-nothing allocation, and long
// random sequences of allocate/retain/release with the invariants checked after every operation.
#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include "base/rng.h"
#include "kv/kv_cache_manager.h"
#include "kv/state_checkpoints.h"

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

// Speculative slots: the table grows for the drafts, then shrinks to the accepted tokens; the
// blocks past them return to the pool and the waste is again only the last block's tail.
TEST(KvCacheManagerTest, TrimReleasesTheTailBlocks) {
  KvCacheManager kv(6, 4);
  ASSERT_TRUE(kv.AllocateSlots(1, 6).has_value());
  ASSERT_TRUE(kv.AllocateSlots(1, 6 + 9).has_value());  // 4 blocks
  EXPECT_EQ(kv.num_free_blocks(), 2);
  const int32_t third = kv.BlockTable(1)[2];
  kv.TrimSlots(1, 9);  // 3 blocks keep positions 0..8
  EXPECT_EQ(kv.BlockTable(1).size(), 3u);
  EXPECT_EQ(kv.BlockTable(1)[2], third);
  EXPECT_EQ(kv.num_free_blocks(), 3);
  EXPECT_EQ(kv.WastedSlots(), 3);
  EXPECT_EQ(kv.CheckInvariants(), "");
  kv.TrimSlots(1, 12);  // holds no more than that: no-op
  EXPECT_EQ(kv.BlockTable(1).size(), 3u);
  kv.TrimSlots(7, 1);   // unknown: no-op
  kv.TrimSlots(1, 0);   // nothing left: the request holds no blocks
  EXPECT_EQ(kv.num_requests(), 0);
  EXPECT_EQ(kv.num_free_blocks(), 6);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

std::vector<int32_t> Seq(int n, int start = 0) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

TEST(PrefixCacheTest, ReusesFullBlocksAndLeavesOneTokenToCompute) {
  KvCacheManager kv(16, 4, /*enable_prefix_caching=*/true);
  const auto a = Seq(10);
  EXPECT_EQ(kv.AllocateCachedPrefix(1, a, ""), 0);  // cold
  ASSERT_TRUE(kv.AllocateSlots(1, 10));
  kv.CacheFullBlocks(1, a, 10, "");  // blocks 0 and 1 are full; block 2 holds 2 of 4
  EXPECT_EQ(kv.pool().num_cached(), 2);
  // Same first 9 tokens: both full blocks hit, shared with request 1.
  auto b = Seq(9);
  EXPECT_EQ(kv.AllocateCachedPrefix(2, b, ""), 8);
  EXPECT_EQ(kv.BlockTable(2)[0], kv.BlockTable(1)[0]);
  EXPECT_EQ(kv.pool().ref_count(kv.BlockTable(1)[0]), 2);
  // Exactly 8 tokens: at most one block, so the last token is computed.
  EXPECT_EQ(kv.AllocateCachedPrefix(3, Seq(8), ""), 4);
  // Another salt, or another first block: no hit.
  EXPECT_EQ(kv.AllocateCachedPrefix(4, a, "tenant-b"), 0);
  auto c = a;
  c[0] = 99;
  EXPECT_EQ(kv.AllocateCachedPrefix(5, c, ""), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
  for (int64_t id : {1, 2, 3}) kv.Free(id);
  EXPECT_EQ(kv.num_free_blocks(), 16);
  // Freed, the blocks stay findable...
  EXPECT_EQ(kv.AllocateCachedPrefix(6, a, ""), 8);
  kv.Free(6);
  // ...until allocation needs them: taking all 16 evicts both.
  ASSERT_TRUE(kv.AllocateSlots(7, 64));
  EXPECT_EQ(kv.pool().num_cached(), 0);
  EXPECT_EQ(kv.pool().num_evictions(), 2);
  kv.Free(7);
  EXPECT_EQ(kv.AllocateCachedPrefix(8, a, ""), 0);
  EXPECT_EQ(kv.CheckInvariants(), "");
  EXPECT_EQ(kv.num_hit_tokens(), 8 + 4 + 8);
}

// A model with recurrent layers resumes only where a state was checkpointed: the longest hit
// whose end the filter accepts is taken. PrefixHash names a prefix as the chain does.
TEST(PrefixCacheTest, HitsEndWhereTheModelCanResume) {
  KvCacheManager kv(16, 4, /*enable_prefix_caching=*/true);
  const auto a = Seq(20);
  ASSERT_TRUE(kv.AllocateSlots(1, 20));
  kv.CacheFullBlocks(1, a, 20, "s");
  StateCheckpoints ckpt(0, 2);
  kv.set_resumable([&](const BlockHash& h) { return ckpt.Contains(h); });
  EXPECT_EQ(kv.AllocateCachedPrefix(2, a, "s"), 0) << "no checkpoint: no hit";
  ASSERT_TRUE(ckpt.Save(kv.PrefixHash(a, 2, "s")).has_value());
  EXPECT_EQ(kv.AllocateCachedPrefix(3, a, "s"), 8);
  ASSERT_TRUE(ckpt.Save(kv.PrefixHash(a, 4, "s")).has_value());
  EXPECT_EQ(kv.AllocateCachedPrefix(4, a, "s"), 16);
  EXPECT_EQ(kv.AllocateCachedPrefix(5, a, ""), 0) << "another salt names another prefix";
  EXPECT_EQ(kv.CheckInvariants(), "");
}

// Checkpoints: a slot per prefix, the least recently used given up first.
TEST(StateCheckpointsTest, KeepsTheMostRecentlyUsed) {
  StateCheckpoints c(10, 2);
  const BlockHash a{1, 0}, b{2, 0}, d{3, 0};
  EXPECT_EQ(c.Save(a), 10);
  EXPECT_EQ(c.Save(b), 11);
  EXPECT_FALSE(c.Save(a).has_value()) << "kept already (now the most recent)";
  EXPECT_EQ(c.Save(d), 11) << "b was the least recently used";
  EXPECT_TRUE(c.Contains(a));
  EXPECT_FALSE(c.Contains(b));
  EXPECT_EQ(c.Find(d), 11);
  EXPECT_EQ(c.Save(b), 10);
  EXPECT_EQ(c.num_saved(), 4);
  // A slot in use is not given up: the next least recently used is; with every slot busy, none.
  const BlockHash e{4, 0}, f{5, 0};
  EXPECT_EQ(c.Save(e, std::vector<int64_t>{11}), 10);  // b (slot 10) is now the most recent, d (11) busy
  EXPECT_FALSE(c.Save(f, std::vector<int64_t>{10, 11}).has_value());
  StateCheckpoints none(0, 0);
  EXPECT_FALSE(none.Save(a).has_value());
}

TEST(PrefixCacheTest, DisabledFindsNothing) {
  KvCacheManager kv(8, 4);
  const auto a = Seq(10);
  ASSERT_TRUE(kv.AllocateSlots(1, 10));
  kv.CacheFullBlocks(1, a, 10, "");
  EXPECT_EQ(kv.AllocateCachedPrefix(2, a, ""), 0);
  EXPECT_EQ(kv.pool().num_cached(), 0);
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

// Gemma 3's pattern (every sixth layer global): groups of the four global layers' size, the
// global group first, the 22 windowed layers in six groups (two slots of the last unused).
TEST(KvLayerGroupsTest, GroupsLayersByWindowInEqualSizes) {
  std::vector<int64_t> windows(26, 512);
  for (int64_t l = 5; l < 26; l += 6) windows[l] = 0;
  const KvLayerGroups g = KvLayerGroups::ForWindows(windows);
  EXPECT_EQ(g.layers_per_block, 4);
  ASSERT_EQ(g.num_groups(), 7);
  EXPECT_EQ(g.window[0], 0);
  for (int64_t i = 1; i < 7; ++i) EXPECT_EQ(g.window[i], 512);
  EXPECT_EQ(g.group_of[5], 0);
  EXPECT_EQ(g.slot_of[23], 3);
  EXPECT_EQ(g.group_of[0], 1);
  EXPECT_EQ(g.slot_of[4], 0);  // layers 0 1 2 3 | 4 6 7 8 | ...
  EXPECT_EQ(g.group_of[25], 6);
  // One window value for all layers (or none): one group of every layer.
  const KvLayerGroups all = KvLayerGroups::ForWindows(std::vector<int64_t>(5, 64));
  EXPECT_EQ(all.num_groups(), 1);
  EXPECT_EQ(all.layers_per_block, 5);
  EXPECT_EQ(all.window[0], 64);
  EXPECT_EQ(KvLayerGroups::ForWindows(std::vector<int64_t>(3, 0)).window[0], 0);
}

// A full group and a windowed one (window 6, blocks of 4): before each step the windowed group
// gives back the blocks no new token reads; the full group keeps every block.
TEST(KvCacheManagerTest, WindowedGroupsGiveBackBlocksBehindTheWindow) {
  KvCacheManager kv(32, 4, /*enable_prefix_caching=*/false, {0, 6});
  ASSERT_TRUE(kv.AllocateSlots(1, 10));  // 3 blocks per group
  EXPECT_EQ(kv.HeldBlocks(1), 6);
  // The next token is at slot 10: it reads slots 5..10, blocks 1 and 2 of the windowed group.
  EXPECT_EQ(kv.ReleaseBehindWindows(1, 10), 1);
  EXPECT_EQ(kv.BlockTable(1, 1)[0], KvCacheManager::kNoBlock);
  EXPECT_NE(kv.BlockTable(1, 0)[0], KvCacheManager::kNoBlock);
  EXPECT_EQ(kv.ReleaseBehindWindows(1, 10), 0);  // once
  EXPECT_EQ(kv.CheckInvariants(), "");
  ASSERT_TRUE(kv.AllocateSlots(1, 30));  // a chunk of 20: 8 blocks per group
  EXPECT_EQ(kv.ReleaseBehindWindows(1, 30), 5);  // slot 30 reads 25..30: blocks 6 and 7
  EXPECT_EQ(kv.HeldBlocks(1), 8 + 2);
  EXPECT_EQ(kv.num_free_blocks(), 32 - 10);
  // Trimming (rejected drafts) and freeing skip what was given back.
  kv.TrimSlots(1, 26);
  EXPECT_EQ(kv.HeldBlocks(1), 7 + 1);
  EXPECT_EQ(kv.CheckInvariants(), "");
  kv.Free(1);
  EXPECT_EQ(kv.num_free_blocks(), 32);
  EXPECT_EQ(kv.CheckInvariants(), "");
  // The longest request: every block of the full group plus a window and a step in the other.
  EXPECT_EQ(KvCacheManager::PeakBlocks(std::vector<int64_t>{0, 6}, 4, 100, 8), 25 + (6 - 1 + 8 + 3) / 4 + 1);
  EXPECT_EQ(kv.capacity_tokens(8), (32 - 5) * 4);
  KvCacheManager single(32, 4);
  EXPECT_EQ(single.capacity_tokens(8), 128);
}

// A prefix hit with a windowed group takes the full group's blocks and only the windowed blocks
// within one window of the first token to compute; when one of those was evicted, the hit is
// the longest one whose window is still whole.
TEST(PrefixCacheTest, HitsWithWindowedGroupsNeedOnlyTheLastWindow) {
  KvCacheManager kv(20, 4, /*enable_prefix_caching=*/true, {0, 6});
  const auto a = Seq(30);
  ASSERT_TRUE(kv.AllocateSlots(1, 30));  // 8 blocks per group, 4 left free
  kv.CacheFullBlocks(1, a, 30, "");      // 7 full blocks per group
  EXPECT_EQ(kv.ReleaseBehindWindows(1, 30), 6);  // windowed 0..5 go back, still findable
  kv.Free(1);  // free list: 4 never used, windowed 0..5, full 7..0, windowed 7, 6
  // 29 tokens: at most 7 blocks (28 tokens); slot 28 reads 23..28: windowed blocks 5 and 6.
  EXPECT_EQ(kv.AllocateCachedPrefix(2, Seq(29), ""), 28);
  EXPECT_EQ(kv.BlockTable(2, 0).size(), 7u);
  EXPECT_EQ(kv.BlockTable(2, 1)[4], KvCacheManager::kNoBlock);
  EXPECT_NE(kv.BlockTable(2, 1)[5], KvCacheManager::kNoBlock);
  EXPECT_EQ(kv.HeldBlocks(2), 7 + 2);
  EXPECT_EQ(kv.CheckInvariants(), "");
  kv.Free(2);
  // A prompt that shares 24 tokens: 6 blocks, whose windowed blocks 4 and 5 were given back
  // while request 1 ran and are found all the same.
  auto c = Seq(24);
  for (int32_t t : {500, 501, 502, 503, 504}) c.push_back(t);
  EXPECT_EQ(kv.AllocateCachedPrefix(3, c, ""), 24);
  EXPECT_EQ(kv.HeldBlocks(3), 6 + 2);
  kv.Free(3);
  // Another request takes 8 blocks: the 4 unused and windowed 0..3 are evicted; no hit needs them.
  ASSERT_TRUE(kv.AllocateSlots(6, 16));
  EXPECT_EQ(kv.AllocateCachedPrefix(4, Seq(29), ""), 28);
  EXPECT_EQ(kv.CheckInvariants(), "");
  kv.Free(4);
  kv.Free(6);
  EXPECT_EQ(kv.num_free_blocks(), 20);
  EXPECT_EQ(kv.CheckInvariants(), "");
}

}  // namespace
}  // namespace gale
