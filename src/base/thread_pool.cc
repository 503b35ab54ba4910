// ThreadPool: workers spin briefly, then sleep on a condition variable between jobs; chunks are
// claimed through one packed atomic, so the caller never waits on a worker that has not started.
#include "base/thread_pool.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace gale {

namespace {
constexpr int kNextBits = 20, kChunkBits = 20;
constexpr uint64_t kFieldMask = (uint64_t{1} << kNextBits) - 1;
uint64_t NextOf(uint64_t c) { return c & kFieldMask; }
uint64_t ChunksOf(uint64_t c) { return (c >> kNextBits) & kFieldMask; }

void PartRange(int64_t num_items, int num_parts, int part_idx, int64_t* begin, int64_t* end) {
  const int64_t base = num_items / num_parts;
  const int64_t extra = num_items % num_parts;
  *begin = part_idx * base + std::min<int64_t>(part_idx, extra);
  *end = *begin + base + (part_idx < extra ? 1 : 0);
}
}  // namespace

int ThreadPool::DefaultNumThreads() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  uint64_t c = claim_.load(std::memory_order_acquire);
  while (NextOf(c) < ChunksOf(c)) {
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    // Chunk NextOf(c) of the job is ours: the job cannot finish (and its fields cannot change)
    // before we count it done.
    int64_t begin, end;
    PartRange(job_items_, static_cast<int>(ChunksOf(c)), static_cast<int>(NextOf(c)), &begin, &end);
    if (begin < end) (*job_fn_)(begin, end);
    done_.fetch_add(1, std::memory_order_release);
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop(int worker_idx) {
  constexpr int kSpinIterations = 1 << 15;  // roughly 0.1-1 ms of pause instructions
  uint64_t seen = 0;
  for (;;) {
    for (int spins = 0; generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations; ++spins) {
      _mm_pause();
    }
    if (generation_.load() == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      num_sleeping_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
      num_sleeping_.fetch_sub(1);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    RunChunks();
  }
}

int64_t ThreadPool::MinItemsForWork(int64_t num_items, double total_ns) {
  if (num_items <= 0 || total_ns <= kMinPartNs) return std::max<int64_t>(1, num_items);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(num_items) * kMinPartNs / total_ns)));
}

void ThreadPool::ParallelFor(int64_t num_items, const std::function<void(int64_t, int64_t)>& fn,
                             int64_t min_items_per_thread) {
  if (num_items <= 0) return;
  const int64_t max_parts = std::max<int64_t>(1, num_items / std::max<int64_t>(1, min_items_per_thread));
  const int parts = static_cast<int>(std::min<int64_t>(num_threads_, max_parts));
  if (parts == 1) {
    fn(0, num_items);
    return;
  }
  // A few chunks per thread: small enough that the others can absorb a preempted worker's share.
  const int64_t chunks = std::min<int64_t>({max_parts, int64_t{4} * parts, static_cast<int64_t>(kFieldMask)});
  std::lock_guard<std::mutex> turn(call_mu_);
  job_fn_ = &fn;
  job_items_ = num_items;
  done_.store(0, std::memory_order_relaxed);
  job_id_ = (job_id_ + 1) & ((uint64_t{1} << (64 - kNextBits - kChunkBits)) - 1);
  claim_.store((job_id_ << (kNextBits + kChunkBits)) | (static_cast<uint64_t>(chunks) << kNextBits),
               std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  if (num_sleeping_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  RunChunks();
  int spins = 0;
  while (done_.load(std::memory_order_acquire) != chunks) {
    if (++spins < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace gale
