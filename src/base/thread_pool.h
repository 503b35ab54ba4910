// One persistent pool of compute threads, created at start-up (`-t N`). ParallelFor splits a
// range statically into one contiguous part per thread; the calling thread takes part 0. No
// thread is created per call. Results never depend on how the range is split: callers give
// each index independent work (see batch invariance in DESIGN.md).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gale {

class ThreadPool {
 public:
  // num_threads counts the caller; 1 means everything runs inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) on disjoint subranges covering [0, num_items). Returns when all are done.
  // min_items_per_thread keeps tiny ranges on fewer threads (waking a thread costs microseconds).
  void ParallelFor(int64_t num_items, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t min_items_per_thread = 1);

  // Default pool size: the number of online CPUs.
  static int DefaultNumThreads();

 private:
  void WorkerLoop(int worker_idx);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Bumped once per job. Workers spin on it for a while before sleeping on cv_, because a
  // futex wake-up per matmul costs more than a decode step's matmul on a small model.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> num_sleeping_{0};
  std::atomic<bool> stop_{false};
  // The current job, valid while pending_ > 0.
  const std::function<void(int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_items_ = 0;
  int job_parts_ = 0;
  std::atomic<int> pending_{0};
};

}  // namespace gale
