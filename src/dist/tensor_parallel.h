// Tensor parallelism: every layer's attention heads and FFN width cut over the ranks (Megatron-LM's
// split, Model::ShardForTensorParallel): Q, K, V, gate and up by rows, so each rank computes its
// heads' attention over its own share of the paged KV cache and its share of the FFN's width; the
// output projection and down by columns, so each rank's product is a partial sum of the layer's
// output, and the ranks' partial sums are added (an all-reduce: two per layer) before the
// residual. Every rank then holds the whole residual stream and computes the norms itself.
//
// Rank 0 keeps HTTP, scheduler, KV block manager and sampler, sends each step's plan to every rank
// (the same message a pipeline sends, dist/step_message.h) and computes the output head; the
// others run the step with it. The sums are added in a fixed tree (base/tree_sum.h), so a given
// split gives the same bits every time, and a split into `slices` gives the same bits with any
// number of ranks that leaves each a power-of-two share of the slices (one process included:
// `--tensor-parallel-slices`), which is how the tests check it bitwise. Against a process that does
// not split at all, only the order of the additions differs (the logits agree to rounding).
//
// What it does not support fails clearly: KV retention's attention tracking and calibration
// observers (they read every head in one process); architectures without a dense split
// (Model::ShardForTensorParallel names them).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "base/status.h"
#include "base/thread_pool.h"
#include "dist/communicator.h"
#include "dist/driver_state.h"
#include "kv/kv_storage.h"
#include "model/model.h"

namespace gale::dist {

struct TensorParallelOptions {
  // A rank silent this long (during a step's all-reduces, or at start-up) fails the step, and
  // every later one: it is taken to be gone.
  std::chrono::milliseconds timeout{60000};
};

// Rank 0's side: the engine's forward (EngineConfig::forward) runs through it. The model is
// rank 0's share (Model::tensor_split().rank == 0, ranks == the communicator's size).
class TensorParallelDriver {
 public:
  // Waits for every rank's hello and checks it runs the same model split the same way.
  static StatusOr<std::unique_ptr<TensorParallelDriver>> Connect(const Model& model, Communicator& comm,
                                                                 TensorParallelOptions options);
  ~TensorParallelDriver();

  // One step, as Model::Forward. After a rank failed (or Abort), every call fails with the reason.
  Status Forward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool);
  // Makes a step in flight, and every later one, fail at once with `why` (any thread).
  void Abort(const std::string& why) { state_.Abort(why); }
  // Tells every rank to exit and waits for the messages to leave, at most `wait`.
  Status Stop(std::chrono::milliseconds wait = std::chrono::milliseconds(5000));
  std::string Describe() const;

 private:
  TensorParallelDriver(const Model& model, Communicator& comm, TensorParallelOptions options);

  const Model& model_;
  Communicator& comm_;
  TensorParallelOptions options_;
  DriverState state_{"the tensor-parallel group", "tensor parallelism"};
};

// Ranks > 0: says hello, then runs every step rank 0 sends (its heads and FFN share, the
// all-reduces with the others) until told to stop (StopWorkers). Returns Ok on a stop; an error
// where rank 0 stopped answering or sent something malformed.
Status RunTensorParallelWorker(const Model& model, Communicator& comm, ThreadPool& pool, TensorParallelOptions options);

}  // namespace gale::dist
