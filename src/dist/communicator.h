// The seam between ranks of one model spread over processes (pipeline parallelism today):
// rank, size, point-to-point messages, and the collectives built on them (broadcast, an
// all-reduce that sums in a fixed order). Two backends: MPI (Open MPI; `mpirun` or Slurm starts the
// processes, dist/mpi_communicator.cc) and in-process threads (LocalGroup, for tests). Messages
// between one pair of ranks with one tag arrive in the order they were sent.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace gale::dist {

// How long a receive may wait: until `timeout` (negative: no limit) or until *cancel is set
// (either fails with kUnavailable, naming the peer).
struct Wait {
  std::chrono::milliseconds timeout{-1};
  const std::atomic<bool>* cancel = nullptr;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Queues bytes for rank `dest` and returns at once; the communicator owns them until they are
  // delivered (Flush waits for that). Never blocks on the receiver.
  virtual Status Send(int dest, int tag, std::vector<uint8_t> bytes) = 0;
  // The next message from rank `src` with `tag`.
  virtual StatusOr<std::vector<uint8_t>> Recv(int src, int tag, const Wait& wait) = 0;
  // Waits until every queued send has left.
  virtual Status Flush(const Wait& wait) = 0;

  // Root's bytes on every rank (the others' *bytes are replaced).
  Status Broadcast(int root, std::vector<uint8_t>* bytes, const Wait& wait, int tag = kCollectiveTag);
  // x = the sum over ranks of x, the same bits on every rank: rank 0 adds the ranks' vectors in
  // TreeSum's order ((x0 + x1) + (x2 + x3) for four), then broadcasts the sum.
  Status AllReduceSum(std::span<float> x, const Wait& wait, int tag = kCollectiveTag);

  static constexpr int kCollectiveTag = 100;
};

// n communicators (ranks 0..n-1) over in-process queues, for tests: each rank on its own thread.
std::vector<std::unique_ptr<Communicator>> LocalGroup(int n);

// The MPI world, initialized on the first call (MPI_THREAD_SERIALIZED: one thread at a time
// talks). Errors where the binary was started without an MPI launcher's environment or MPI
// fails to start.
StatusOr<Communicator*> MpiWorld();
// Whether this process was started by an MPI launcher (mpirun, srun with PMIx): its environment.
bool LaunchedByMpi();
// MPI_Finalize where MpiWorld started MPI (after every send has left).
void MpiFinalize();

}  // namespace gale::dist
