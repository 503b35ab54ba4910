// One persistent pool of compute threads, created at start-up (`-t N`). ParallelFor splits a
// range into a few contiguous chunks per thread, which the caller and the workers claim from one
// atomic counter: a worker the OS has preempted holds up nobody, since whoever runs takes the
// remaining chunks (the caller waits only for chunks already started). No thread is created per
// call. Results never depend on how the range is split: callers give each index independent work
// (see batch invariance in DESIGN.md).
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
  // Callers on different threads (two engines sharing a pool) take turns; fn must not call
  // ParallelFor on the same pool.
  void ParallelFor(int64_t num_items, const std::function<void(int64_t, int64_t)>& fn,
                   int64_t min_items_per_thread = 1);

  // Default pool size: the number of online CPUs.
  static int DefaultNumThreads();

  // The least estimated work (nanoseconds on one thread) worth a part of its own: handing a part
  // to another thread and joining it costs one to a few microseconds on this kind of machine
  // (its data moving between cores included), which is
  // more than a small model's whole product at decode (stories260K decoded 2.4x faster on one
  // thread than on two before calls were sized by their work).
  static constexpr double kMinPartNs = 2000;
  // min_items_per_thread for num_items items estimated to take total_ns together on one thread.
  static int64_t MinItemsForWork(int64_t num_items, double total_ns);

 private:
  void WorkerLoop(int worker_idx);
  // Claims and runs chunks of the current job until none is left.
  void RunChunks();

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex call_mu_;  // one job at a time
  std::condition_variable cv_;
  // Bumped once per job. Workers spin on it for a while before sleeping on cv_, because a
  // futex wake-up per matmul costs more than a decode step's matmul on a small model.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> num_sleeping_{0};
  std::atomic<bool> stop_{false};
  // The current job. claim_ packs [job id: 24 bits][chunks: 20][next chunk: 20]; a claim is a
  // compare-exchange on it, so it can only take a chunk of the job it read. job_fn_ and
  // job_items_ are written before claim_ is published and stay valid until done_ == chunks.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  uint64_t job_id_ = 0;  // caller side
  const std::function<void(int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_items_ = 0;
};

}  // namespace gale
