#include "dist/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "base/tree_sum.h"
#include "dist/pipeline.h"
#include "dist/step_message.h"

namespace gale::dist {
namespace {

// A worker's all-reduces: its partial rows to rank 0, the sum back (Communicator::AllReduceSum).
// After a failure the rest of the step's sums are skipped (the worker then leaves).
class WorkerSums final : public PartialSums {
 public:
  WorkerSums(Communicator& comm, Wait wait) : comm_(comm), wait_(wait) {}
  void Sum(float* x, int64_t n) override {
    if (!failed_.ok()) return;
    failed_ = comm_.AllReduceSum(std::span<float>(x, static_cast<size_t>(n)), wait_, kTagReduce);
  }
  const Status& failed() const { return failed_; }

 private:
  Communicator& comm_;
  Wait wait_;
  Status failed_;
};

// Rank 0's all-reduces: the ranks' partial rows, added in TreeSum's order, and the sum sent back.
// After a failure (a rank silent past the timeout, or Abort) it still takes every live rank's
// rows and sends them something, so that no rank is left waiting for a sum, nor holding rows
// nobody receives, when the stop comes; a rank that does not answer within `drain` is taken to be
// gone and skipped for the rest of the step. The drain is short: under mpirun a dead rank makes
// mpirun send SIGTERM to the rest and SIGKILL soon after, and the error must reach the clients
// first. (A live rank whose layer takes longer than that is then left waiting for its timeout.)
constexpr std::chrono::milliseconds kDrainWait{250};
class RankZeroSums final : public PartialSums {
 public:
  RankZeroSums(Communicator& comm, Wait wait, std::chrono::milliseconds drain)
      : comm_(comm), wait_(wait), drain_{drain, nullptr}, gone_(static_cast<size_t>(comm.size()), false) {}

  void Sum(float* x, int64_t n) override {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    std::vector<std::vector<uint8_t>> theirs(gone_.size());
    std::vector<float*> parts = {x};
    for (int r = 1; r < comm_.size(); ++r) {
      if (gone_[r]) continue;
      auto m = comm_.Recv(r, kTagReduce, failed_.ok() ? wait_ : drain_);
      if (!m.ok() && failed_.ok() && wait_.cancel != nullptr && wait_.cancel->load()) {
        failed_ = m.status();  // aborted: the rank is most likely alive, take its rows all the same
        m = comm_.Recv(r, kTagReduce, drain_);
      }
      if (!m.ok()) {
        if (failed_.ok()) failed_ = m.status().WithContext(fmt::format("tensor-parallel rank {}", r));
        gone_[r] = true;
        continue;
      }
      if (m->size() != bytes && failed_.ok()) {
        failed_ = DataLoss("tensor-parallel rank {} sent {} bytes of partial sums, expected {}", r, m->size(), bytes);
      }
      theirs[r] = std::move(*m);
      parts.push_back(reinterpret_cast<float*>(theirs[r].data()));
    }
    if (failed_.ok()) TreeSum(parts, static_cast<size_t>(n));
    for (int r = 1; r < comm_.size(); ++r) {
      if (gone_[r]) continue;
      std::vector<uint8_t> sum(bytes);
      std::memcpy(sum.data(), x, bytes);
      if (Status s = comm_.Send(r, kTagReduce, std::move(sum)); !s.ok() && failed_.ok()) failed_ = s;
    }
    // The ranks are waiting for it: see it delivered before computing on. (MPI moves a message
    // past its eager size only while the sender is inside an MPI call; left to the next one, the
    // ranks would wait out rank 0's whole next partial product, and the ranks would take turns.)
    // (Not after a failure: a send to a rank that died would hold every later sum.)
    if (failed_.ok()) failed_ = comm_.Flush(wait_);
  }
  const Status& failed() const { return failed_; }

 private:
  Communicator& comm_;
  Wait wait_, drain_;
  std::vector<bool> gone_;
  Status failed_;
};

}  // namespace

TensorParallelDriver::TensorParallelDriver(const Model& model, Communicator& comm, TensorParallelOptions options)
    : model_(model), comm_(comm), options_(options) {}

TensorParallelDriver::~TensorParallelDriver() = default;

StatusOr<std::unique_ptr<TensorParallelDriver>> TensorParallelDriver::Connect(const Model& model, Communicator& comm,
                                                                              TensorParallelOptions options) {
  if (comm.rank() != 0) return InvalidArgument("the tensor-parallel driver is rank 0, this is rank {}", comm.rank());
  const TensorSplit& split = model.tensor_split();
  if (split.rank != 0 || split.ranks != comm.size()) {
    return InvalidArgument("the model is split as rank {} of {}, the group has {} ranks", split.rank, split.ranks,
                           comm.size());
  }
  RETURN_IF_ERROR(AwaitHellos(model, comm, options.timeout, "tensor-parallel"));
  return std::unique_ptr<TensorParallelDriver>(new TensorParallelDriver(model, comm, options));
}

std::string TensorParallelDriver::Describe() const {
  const TensorSplit& s = model_.tensor_split();
  const ModelHParams& hp = model_.hparams();
  return fmt::format("tensor parallel: {} ranks, {} slices; each rank {} heads, {} KV heads, FFN {} of every layer",
                     s.ranks, s.slices, hp.num_heads, hp.num_kv_heads, hp.ffn_dim);
}

Status TensorParallelDriver::Forward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) {
  RETURN_IF_ERROR(state_.CheckStep(batch));
  const std::vector<uint8_t> step = EncodeStep(batch, kv, /*micro_batches=*/1);
  for (int r = 1; r < comm_.size(); ++r) {
    if (Status s = comm_.Send(r, kTagStep, step); !s.ok()) return state_.Fail(s);
  }
  RankZeroSums sums(comm_, Wait{options_.timeout, state_.cancel()}, std::min(options_.timeout, kDrainWait));
  ForwardBatch b = batch;
  b.partial_sums = &sums;
  // Every rank checks the same batch against the same shapes: one that fails here fails on all
  // of them before any sum, and the next step goes on.
  Status s = model_.Forward(b, kv, ws, pool);
  if (!sums.failed().ok()) return state_.Fail(sums.failed());
  if (!s.ok()) return s;
  if (model_.head_rows().second == model_.hparams().vocab_size) return Status::Ok();
  // The head by vocabulary rows: every rank's logits for its rows, side by side. Rank 0's own
  // [rows, share] spread out in place first (last row first: no row is overwritten before it moves).
  const int64_t rows = batch.num_logit_rows(), vocab = model_.hparams().vocab_size, share = model_.head_rows().second;
  if (ws.logits.size() < static_cast<size_t>(rows * vocab)) ws.logits.resize(rows * vocab);
  for (int64_t i = rows - 1; i > 0; --i) {
    std::memmove(ws.logits.data() + i * vocab, ws.logits.data() + i * share, share * sizeof(float));
  }
  for (int r = 1; r < comm_.size(); ++r) {
    auto m = comm_.Recv(r, kTagOutput, Wait{options_.timeout, state_.cancel()});
    if (!m.ok()) return state_.Fail(m.status().WithContext(fmt::format("tensor-parallel rank {}", r)));
    if (m->size() != static_cast<size_t>(rows * share) * sizeof(float)) {
      return state_.Fail(DataLoss("tensor-parallel rank {} sent {} bytes of logits, expected {}", r, m->size(),
                                  rows * share * sizeof(float)));
    }
    const float* part = reinterpret_cast<const float*>(m->data());
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(ws.logits.data() + i * vocab + r * share, part + i * share, share * sizeof(float));
    }
  }
  return Status::Ok();
}

Status TensorParallelDriver::Stop(std::chrono::milliseconds wait) {
  if (!state_.MarkStopped()) return Status::Ok();
  return StopWorkers(comm_, wait);
}

Status RunTensorParallelWorker(const Model& model, Communicator& comm, ThreadPool& pool, TensorParallelOptions options) {
  const int rank = comm.rank();
  if (rank == 0) return InvalidArgument("rank 0 drives the tensor-parallel group");
  const TensorSplit& split = model.tensor_split();
  if (split.rank != rank || split.ranks != comm.size()) {
    return InvalidArgument("the model is split as rank {} of {}, this is rank {} of {}", split.rank, split.ranks, rank,
                           comm.size());
  }
  RETURN_IF_ERROR(SayHello(model, comm));
  std::unique_ptr<KvStorage> kv;
  Workspace ws;
  const Wait sum_wait{options.timeout, nullptr};
  for (;;) {
    StepPlan plan;
    ASSIGN_OR_RETURN(const bool step, NextStep(model, comm, sum_wait, &plan, &kv));
    if (!step) return Status::Ok();
    WorkerSums sums(comm, sum_wait);
    ForwardBatch b = plan.batch;
    // The head's share of the vocabulary where it is split by rows; else rank 0 computes it all.
    const bool head = model.head_rows().second != model.hparams().vocab_size;
    b.output_head = head;
    b.partial_sums = &sums;
    // A batch that fails its checks fails them on rank 0 too, before any sum: nothing to do.
    const Status s = model.Forward(b, *kv, ws, pool);
    if (!sums.failed().ok()) return sums.failed().WithContext(fmt::format("tensor-parallel rank {}", rank));
    if (head && s.ok()) {
      const size_t n = static_cast<size_t>(b.num_logit_rows() * model.head_rows().second);
      std::vector<uint8_t> logits(n * sizeof(float));
      std::memcpy(logits.data(), ws.logits.data(), logits.size());
      RETURN_IF_ERROR(comm.Send(0, kTagOutput, std::move(logits)));
    }
  }
}

}  // namespace gale::dist
