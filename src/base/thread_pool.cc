// ThreadPool: workers sleep on a condition variable between jobs; the caller spins briefly for
// completion, since jobs are short (one matmul) and a futex wake-up costs more than the spin.
#include "base/thread_pool.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>

namespace gale {

namespace {
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
    const std::function<void(int64_t, int64_t)>* fn = job_fn_;
    const int64_t items = job_items_;
    const int parts = job_parts_;
    if (worker_idx < parts) {
      int64_t begin, end;
      PartRange(items, parts, worker_idx, &begin, &end);
      if (begin < end) (*fn)(begin, end);
    }
    // Every worker checks in, taking part or not, so the caller cannot publish the next job
    // while a worker may still be reading this one's fields.
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
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
  // The job fields are published by the generation bump (release); workers read them after
  // seeing it (acquire). A worker cannot still be reading the previous job: pending_ was 0.
  job_fn_ = &fn;
  job_items_ = num_items;
  job_parts_ = parts;
  pending_.store(num_threads_ - 1, std::memory_order_release);
  generation_.fetch_add(1);
  if (num_sleeping_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  int64_t begin, end;
  PartRange(num_items, parts, 0, &begin, &end);
  fn(begin, end);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace gale
