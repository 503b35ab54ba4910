#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace gale {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n;
    }
  }
}

TEST(ThreadPoolTest, ManyJobsInARow) {
  ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 2000; ++job) {
    pool.ParallelFor(64, [&](int64_t b, int64_t e) { sum += e - b; });
  }
  EXPECT_EQ(sum.load(), 2000 * 64);
}

TEST(ThreadPoolTest, MinItemsKeepsSmallJobsInline) {
  ThreadPool pool(4);
  int parts = 0;  // no atomics needed if it really runs inline
  pool.ParallelFor(10, [&](int64_t, int64_t) { ++parts; }, /*min_items_per_thread=*/16);
  EXPECT_EQ(parts, 1);
}

// Work sized by its estimated time: under kMinPartNs stays on the caller; more is split into parts
// of at least kMinPartNs each.
TEST(ThreadPoolTest, MinItemsForWorkSizesPartsByTime) {
  constexpr double kPart = ThreadPool::kMinPartNs;
  EXPECT_EQ(ThreadPool::MinItemsForWork(100, kPart / 2), 100);
  EXPECT_EQ(ThreadPool::MinItemsForWork(100, kPart), 100);
  EXPECT_EQ(ThreadPool::MinItemsForWork(100, 10 * kPart), 10);
  EXPECT_EQ(ThreadPool::MinItemsForWork(100, 1000 * kPart), 1);
  EXPECT_EQ(ThreadPool::MinItemsForWork(0, 10 * kPart), 1);
  ThreadPool pool(4);
  std::atomic<int> parts = 0;
  pool.ParallelFor(100, [&](int64_t, int64_t) { ++parts; }, ThreadPool::MinItemsForWork(100, kPart / 2));
  EXPECT_EQ(parts.load(), 1);
}

// Two threads (two engines sharing a pool) calling at once take turns instead of livelocking,
// and every job still runs each index exactly once.
TEST(ThreadPoolTest, CallersOnTwoThreadsTakeTurns) {
  ThreadPool pool(2);
  std::atomic<int64_t> sums[2] = {0, 0};
  auto caller = [&](int c) {
    for (int job = 0; job < 500; ++job) {
      pool.ParallelFor(100, [&](int64_t b, int64_t e) { sums[c] += e - b; });
    }
  };
  std::thread a(caller, 0), b(caller, 1);
  a.join();
  b.join();
  EXPECT_EQ(sums[0].load(), 500 * 100);
  EXPECT_EQ(sums[1].load(), 500 * 100);
}

}  // namespace
}  // namespace gale
