// The MPI backend of the Communicator: nonblocking sends that own their bytes until MPI has
// them, receives by probe (the size travels with the message). Waiting polls (Backoff), so an
// idle rank costs no core (Open MPI's blocking calls spin) and a wait can give up on a deadline
// or when told to.
//
// MPI moves a message larger than its eager size (4 KiB over shared memory, 64 KiB over TCP)
// only while the sender is inside an MPI call: a rank that sends its rows and computes on would
// hold them until its next call, and the receiver would wait out that whole computation (a
// pipeline's stages would take turns instead of overlapping). So while sends are pending a
// progress thread tests them every 20-500 us; a mutex serializes every MPI call
// (MPI_THREAD_SERIALIZED: one thread at a time).
#include <mpi.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "dist/communicator.h"

namespace gale::dist {
namespace {

// Between polls: yield the core for the first 100 ms of a wait, then sleep 50 us doubling to
// 1 ms. A stage's rows usually come within a stage's compute time (tens of ms at decode) and a
// sleeping rank wakes late: sleeping from 2 ms on cost a 6-layer 7B-shaped decode 10% (61.7 vs
// 68.5 ms per token through 2 stages); a yield still lets a rank that shares the core compute, and
// an idle rank (no steps) sleeps.
class Backoff {
 public:
  void Pause() {
    const auto waited = std::chrono::steady_clock::now() - start_;
    if (waited < std::chrono::milliseconds(100)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (sleep_us_ < 1000) sleep_us_ *= 2;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  int sleep_us_ = 50;
};

Status Expired(const Wait& wait, std::chrono::steady_clock::time_point start, const char* what, int peer) {
  if (wait.cancel != nullptr && wait.cancel->load()) return Unavailable("stopped while {} rank {}", what, peer);
  if (wait.timeout.count() >= 0 && std::chrono::steady_clock::now() - start >= wait.timeout) {
    return Unavailable("rank {} did not answer within {} ms ({})", peer, wait.timeout.count(), what);
  }
  return Status::Ok();
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    progress_ = std::thread([this] { ProgressLoop(); });
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Send(int dest, int tag, std::vector<uint8_t> bytes) override {
    if (dest < 0 || dest >= size_) return InvalidArgument("send to rank {} of {}", dest, size_);
    if (bytes.size() > static_cast<size_t>(INT32_MAX)) return InvalidArgument("message of {} bytes", bytes.size());
    std::lock_guard<std::mutex> lock(mu_);
    Pending& p = pending_.emplace_back();
    p.bytes = std::move(bytes);
    p.dest = dest;
    const int rc = MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, dest, tag, MPI_COMM_WORLD,
                             &p.request);
    if (rc != MPI_SUCCESS) {
      pending_.pop_back();
      return Unavailable("MPI_Isend to rank {} failed ({})", dest, rc);
    }
    Status s = Progress();
    if (!pending_.empty()) progress_cv_.notify_one();
    return s;
  }

  StatusOr<std::vector<uint8_t>> Recv(int src, int tag, const Wait& wait) override {
    if (src < 0 || src >= size_) return InvalidArgument("receive from rank {} of {}", src, size_);
    const auto start = std::chrono::steady_clock::now();
    Backoff backoff;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        MPI_Status st;
        int found = 0;
        if (MPI_Iprobe(src, tag, MPI_COMM_WORLD, &found, &st) != MPI_SUCCESS) {
          return Unavailable("MPI_Iprobe for rank {} failed", src);
        }
        if (found) {
          int count = 0;
          MPI_Get_count(&st, MPI_BYTE, &count);
          std::vector<uint8_t> bytes(static_cast<size_t>(count));
          if (MPI_Recv(bytes.data(), count, MPI_BYTE, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            return Unavailable("MPI_Recv from rank {} failed", src);
          }
          return bytes;
        }
        RETURN_IF_ERROR(Progress());
      }
      RETURN_IF_ERROR(Expired(wait, start, "waiting for", src));
      backoff.Pause();
    }
  }

  Status Flush(const Wait& wait) override {
    const auto start = std::chrono::steady_clock::now();
    Backoff backoff;
    for (;;) {
      int dest = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        RETURN_IF_ERROR(Progress());
        if (pending_.empty()) return Status::Ok();
        dest = pending_.front().dest;
      }
      RETURN_IF_ERROR(Expired(wait, start, "sending to", dest));
      backoff.Pause();
    }
  }

  // Ends the progress thread; sends still queued (a peer that stopped) are abandoned, not waited
  // for. Before MPI_Finalize.
  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      (void)Progress();
    }
    progress_cv_.notify_all();
    if (progress_.joinable()) progress_.join();
  }

 private:
  struct Pending {
    std::vector<uint8_t> bytes;
    int dest = 0;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  // Drops the sends MPI has finished with. Under mu_.
  Status Progress() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      if (MPI_Test(&it->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        return Unavailable("a send to rank {} failed", it->dest);
      }
      it = done ? pending_.erase(it) : std::next(it);
    }
    return Status::Ok();
  }

  // While sends are pending: test them, sleeping 20 us doubling to 500 us between tests.
  void ProgressLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      progress_cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
      int sleep_us = 20;
      while (!stop_ && !pending_.empty()) {
        (void)Progress();  // a failed send is reported to the next caller that tests it
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
        sleep_us = std::min(sleep_us * 2, 500);
        lock.lock();
      }
    }
  }

  int rank_ = 0, size_ = 1;
  std::mutex mu_;  // every MPI call, and pending_
  std::deque<Pending> pending_;
  std::condition_variable progress_cv_;
  bool stop_ = false;
  std::thread progress_;
};

MpiCommunicator* g_world = nullptr;

}  // namespace

bool LaunchedByMpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

StatusOr<Communicator*> MpiWorld() {
  if (g_world != nullptr) return static_cast<Communicator*>(g_world);
  if (!LaunchedByMpi()) {
    return InvalidArgument("not started by an MPI launcher (run it under mpirun -np N, or srun)");
  }
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    return Unavailable("MPI_Init_thread failed");
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    return Unavailable("this MPI does not allow calls from more than one thread (MPI_THREAD_SERIALIZED)");
  }
  // Errors come back as return codes (turned into Status) instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_world = new MpiCommunicator();
  return static_cast<Communicator*>(g_world);
}

void MpiFinalize() {
  if (g_world == nullptr) return;
  g_world->Shutdown();
  MPI_Finalize();
  delete g_world;
  g_world = nullptr;
}

}  // namespace gale::dist
