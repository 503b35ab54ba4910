// Pipeline parallelism: a model's layers split into contiguous ranges, one per rank. Rank 0 keeps
// everything else (HTTP, scheduler, KV block manager, sampler) and, per engine step, sends the
// step's plan (the ForwardBatch: tokens, positions, block tables, slots, wanted rows, and the KV
// storage's shape) to every rank; each rank runs its layers on its own share of the paged KV cache
// (the same block ids, its layers' bytes); only the residual stream ([tokens, dim] floats) crosses
// a stage boundary, and the last stage sends back only the rows whose logits (or hidden states)
// are wanted, from which rank 0 computes the output head: dim floats per sampled token back
// instead of vocab (16 KB instead of 513 KB per token for a Llama-3-8B).
//
// A step's sequences are cut into micro-batches (whole sequences, about equal tokens) that follow
// each other through the stages, so while stage 1 runs micro-batch 0 stage 0 runs micro-batch 1.
// Batch invariance (DESIGN.md) makes the cut invisible: every token's logits are bitwise those of
// one process running the whole model, whatever the number of stages or micro-batches.
//
// What a stage does not support fails clearly: KV retention's attention tracking and calibration
// observers (both read every layer in one process).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "dist/communicator.h"
#include "dist/driver_state.h"
#include "kv/kv_storage.h"
#include "model/model.h"

namespace gale::dist {

struct PipelineOptions {
  // Most micro-batches per step (never more than the step has sequences); 0: the number of stages.
  int micro_batches = 0;
  // A stage that sends nothing for this long fails the step (and every later one): the rank is
  // taken to be gone. Also how long start-up waits for the ranks to say hello.
  std::chrono::milliseconds timeout{60000};
};

// The layers [first, end) of each of num_stages stages: as equal as whole layers allow, the first
// stages one more where they do not divide.
std::vector<std::pair<int64_t, int64_t>> StageLayers(int64_t num_layers, int num_stages);

// A step's micro-batch: some of its sequences, whole, renumbered from 0, with the rows of the
// step's logits (and hidden rows) each of its wanted rows fills (-1: one computed but not wanted).
struct MicroBatch {
  ForwardBatch batch;             // block_tables point into the step's
  int64_t first_token = 0;        // its tokens are the step's [first_token, first_token + n)
  std::vector<int32_t> logit_out;   // [batch.logit_rows.size()]
  std::vector<int32_t> hidden_out;  // [batch.hidden_rows.size()]
};
// Cuts a step (its tokens grouped by sequence, in sequence order) into at most max_parts
// micro-batches of whole sequences; one part where the tokens are not grouped so.
std::vector<MicroBatch> SplitMicroBatches(const ForwardBatch& batch, int64_t num_groups, int max_parts);

// Rank 0's side: the engine's forward (EngineConfig::forward) runs through it.
class PipelineDriver {
 public:
  // Waits for every rank's hello and checks it runs the same model (an error names the rank and
  // what differs).
  static StatusOr<std::unique_ptr<PipelineDriver>> Connect(const Model& model, Communicator& comm,
                                                           PipelineOptions options);
  ~PipelineDriver();

  // One step, as Model::Forward: on return ws.logits (and ws.hidden) hold the wanted rows. After
  // a stage failed (or Abort), every call fails with the reason.
  Status Forward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool);
  // Makes a step in flight, and every later one, fail at once with `why` (any thread).
  void Abort(const std::string& why) { state_.Abort(why); }
  // Tells every rank to exit (their RunPipelineWorker returns) and waits for the messages to
  // leave, at most `wait`.
  Status Stop(std::chrono::milliseconds wait = std::chrono::milliseconds(5000));

  int num_stages() const { return comm_.size(); }
  const std::vector<std::pair<int64_t, int64_t>>& stages() const { return stages_; }
  std::string Describe() const;

 private:
  PipelineDriver(const Model& model, Communicator& comm, PipelineOptions options);

  const Model& model_;
  Communicator& comm_;
  PipelineOptions options_;
  std::vector<std::pair<int64_t, int64_t>> stages_;
  Workspace stage_ws_;
  DriverState state_{"the pipeline", "pipeline parallelism"};
};

// Tells ranks 1..size-1 to exit (RunPipelineWorker returns Ok), whether or not a driver connected
// (a stop is read after the hello, or instead of the next step), and waits for the messages to
// leave, at most `wait`.
Status StopWorkers(Communicator& comm, std::chrono::milliseconds wait);

// Ranks > 0: says hello, then runs its stage of every step rank 0 sends until told to stop.
// Returns Ok on a stop; an error where rank 0 stopped answering or sent something malformed.
Status RunPipelineWorker(const Model& model, Communicator& comm, ThreadPool& pool, PipelineOptions options);

}  // namespace gale::dist
