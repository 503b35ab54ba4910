#include "dist/pipeline.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "dist/step_message.h"

namespace gale::dist {
namespace {

// A stage's message to the next: its status, then residual rows ([rows, dim] floats: all the
// micro-batch's tokens, or from the last stage the rows rank 0's head needs); none after an error.
std::vector<uint8_t> EncodeRows(const Status& s, std::span<const float> rows) {
  Writer w;
  w.Put<int32_t>(static_cast<int32_t>(s.code()));
  w.PutString(s.message());
  w.PutVector<float>(rows);
  return w.Take();
}

struct Rows {
  Status status;
  std::vector<float> x;  // [rows, dim]
};
StatusOr<Rows> DecodeRows(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  int32_t code = 0;
  std::string message;
  Rows rows;
  RETURN_IF_ERROR(r.Get(&code));
  RETURN_IF_ERROR(r.GetString(&message));
  RETURN_IF_ERROR(r.GetVector(&rows.x));
  if (!r.done()) return DataLoss("pipeline rows message has trailing bytes");
  if (code < 0 || code > static_cast<int32_t>(StatusCode::kUnavailable)) return DataLoss("pipeline status code {}", code);
  if (code != 0) rows.status = Status(static_cast<StatusCode>(code), message);
  return rows;
}

// The rows of a micro-batch the head needs (its logit and hidden rows), ascending, once each.
std::vector<int32_t> HeadRows(const ForwardBatch& b) {
  std::vector<int32_t> rows = b.logit_rows;
  rows.insert(rows.end(), b.hidden_rows.begin(), b.hidden_rows.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// The output head alone over `rows` of b, whose last-layer rows are `input` ([rows, dim]).
ForwardBatch HeadBatch(const ForwardBatch& b, const std::vector<int32_t>& rows, int32_t num_layers, const float* input) {
  ForwardBatch h;
  auto index = [&rows](int32_t row) {
    return static_cast<int32_t>(std::lower_bound(rows.begin(), rows.end(), row) - rows.begin());
  };
  for (int32_t r : rows) {
    h.tokens.push_back(b.tokens[r]);
    h.positions.push_back(b.positions[r]);
    if (!b.seq_idx.empty()) h.seq_idx.push_back(b.seq_idx[r]);
    if (!b.slots.empty()) h.slots.push_back(b.slots[r]);
  }
  for (int32_t r : b.logit_rows) h.logit_rows.push_back(index(r));
  for (int32_t r : b.hidden_rows) h.hidden_rows.push_back(index(r));
  h.block_tables = b.block_tables;
  h.first_layer = num_layers;
  h.end_layer = num_layers;
  h.input = input;
  return h;
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> StageLayers(int64_t num_layers, int num_stages) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t first = 0;
  for (int s = 0; s < num_stages; ++s) {
    const int64_t n = num_layers / num_stages + (s < num_layers % num_stages ? 1 : 0);
    out.emplace_back(first, first + n);
    first += n;
  }
  return out;
}

std::vector<MicroBatch> SplitMicroBatches(const ForwardBatch& batch, int64_t num_groups, int max_parts) {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  // The wanted rows, explicit (ForwardBatch's defaults resolved).
  std::vector<int32_t> logit_rows(static_cast<size_t>(batch.num_logit_rows()));
  for (size_t i = 0; i < logit_rows.size(); ++i) logit_rows[i] = batch.logit_row(static_cast<int64_t>(i));
  // Sequence boundaries: where seq_idx steps up by one; anything else is one part.
  const int64_t num_seqs = static_cast<int64_t>(batch.block_tables.size()) / std::max<int64_t>(1, num_groups);
  std::vector<int64_t> seq_start;  // first token of each sequence
  bool grouped = num_seqs >= 1 && !batch.tokens.empty();
  for (int64_t i = 0; i < n && grouped; ++i) {
    const int32_t s = batch.seq(i);
    if (i == 0 ? s != 0 : (s != batch.seq(i - 1) && s != batch.seq(i - 1) + 1)) grouped = false;
    if (i == 0 || s != batch.seq(i - 1)) seq_start.push_back(i);
  }
  if (grouped && static_cast<int64_t>(seq_start.size()) != num_seqs) grouped = false;
  const int parts = grouped ? static_cast<int>(std::clamp<int64_t>(max_parts, 1, num_seqs)) : 1;
  // Cut points at sequence starts, each part about n / parts tokens.
  std::vector<int64_t> cut_seq = {0};  // first sequence of each part
  for (int p = 1; p < parts; ++p) {
    const int64_t target = n * p / parts;
    int64_t s = cut_seq.back() + 1;
    while (s < num_seqs - (parts - p) && seq_start[s] < target) ++s;
    cut_seq.push_back(s);
  }
  cut_seq.push_back(grouped ? num_seqs : 1);
  std::vector<MicroBatch> out;
  for (int p = 0; p < parts; ++p) {
    MicroBatch mb;
    const int64_t s0 = cut_seq[p], s1 = cut_seq[p + 1];
    const int64_t t0 = grouped ? seq_start[s0] : 0;
    const int64_t t1 = grouped ? (s1 < num_seqs ? seq_start[s1] : n) : n;
    mb.first_token = t0;
    ForwardBatch& b = mb.batch;
    b.tokens.assign(batch.tokens.begin() + t0, batch.tokens.begin() + t1);
    b.positions.assign(batch.positions.begin() + t0, batch.positions.begin() + t1);
    if (!batch.seq_idx.empty()) {
      for (int64_t i = t0; i < t1; ++i) b.seq_idx.push_back(static_cast<int32_t>(batch.seq_idx[i] - (grouped ? s0 : 0)));
    }
    if (!batch.slots.empty()) b.slots.assign(batch.slots.begin() + t0, batch.slots.begin() + t1);
    const int64_t seqs_here = grouped ? s1 - s0 : num_seqs;
    for (int64_t g = 0; g < num_groups; ++g) {
      for (int64_t s = 0; s < seqs_here; ++s) {
        b.block_tables.push_back(batch.block_tables[g * num_seqs + (grouped ? s0 : 0) + s]);
      }
    }
    for (size_t i = 0; i < logit_rows.size(); ++i) {
      if (logit_rows[i] >= t0 && logit_rows[i] < t1) {
        b.logit_rows.push_back(static_cast<int32_t>(logit_rows[i] - t0));
        mb.logit_out.push_back(static_cast<int32_t>(i));
      }
    }
    if (b.logit_rows.empty()) {  // Forward computes at least one row: the last, not wanted
      b.logit_rows.push_back(static_cast<int32_t>(t1 - t0 - 1));
      mb.logit_out.push_back(-1);
    }
    for (size_t i = 0; i < batch.hidden_rows.size(); ++i) {
      if (batch.hidden_rows[i] >= t0 && batch.hidden_rows[i] < t1) {
        b.hidden_rows.push_back(static_cast<int32_t>(batch.hidden_rows[i] - t0));
        mb.hidden_out.push_back(static_cast<int32_t>(i));
      }
    }
    out.push_back(std::move(mb));
  }
  return out;
}

PipelineDriver::PipelineDriver(const Model& model, Communicator& comm, PipelineOptions options)
    : model_(model), comm_(comm), options_(options), stages_(StageLayers(model.hparams().num_layers, comm.size())) {
  if (options_.micro_batches <= 0) options_.micro_batches = comm.size();
}

PipelineDriver::~PipelineDriver() = default;

StatusOr<std::unique_ptr<PipelineDriver>> PipelineDriver::Connect(const Model& model, Communicator& comm,
                                                                  PipelineOptions options) {
  if (comm.rank() != 0) return InvalidArgument("the pipeline's driver is rank 0, this is rank {}", comm.rank());
  if (comm.size() > model.hparams().num_layers) {
    return InvalidArgument("{} pipeline stages for a model of {} layers", comm.size(), model.hparams().num_layers);
  }
  if (!model.hparams().causal) return InvalidArgument("an encoder runs in one process (no pipeline stages)");
  if (model.hparams().recurrent_state_floats > 0) {
    return Unimplemented("{}: pipeline stages of a model with recurrent layers are not supported yet (the stages would "
                         "need their state slots)", model.hparams().arch);
  }
  RETURN_IF_ERROR(AwaitHellos(model, comm, options.timeout, "pipeline"));
  return std::unique_ptr<PipelineDriver>(new PipelineDriver(model, comm, options));
}

std::string PipelineDriver::Describe() const {
  std::string ranges;
  for (size_t s = 0; s < stages_.size(); ++s) {
    ranges += fmt::format("{}layers {}-{} on rank {}", s ? ", " : "", stages_[s].first, stages_[s].second - 1, s);
  }
  return fmt::format("pipeline parallel: {} stages ({}), up to {} micro-batches per step", stages_.size(), ranges,
                     options_.micro_batches);
}

Status PipelineDriver::Forward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) {
  RETURN_IF_ERROR(state_.CheckStep(batch));
  const ModelHParams& hp = model_.hparams();
  const int64_t width = model_.StageWidth();
  const int last = comm_.size() - 1;
  const Wait wait{options_.timeout, state_.cancel()};

  std::vector<MicroBatch> mbs = SplitMicroBatches(batch, kv.num_groups(), options_.micro_batches);
  const std::vector<uint8_t> step = EncodeStep(batch, kv, options_.micro_batches);
  for (int r = 1; r <= last; ++r) {
    if (Status s = comm_.Send(r, kTagStep, step); !s.ok()) return state_.Fail(s);
  }
  // Stage 0 of every micro-batch, each handed on as soon as it is done.
  Status first_error;
  for (MicroBatch& mb : mbs) {
    ForwardBatch sub = mb.batch;
    sub.end_layer = static_cast<int32_t>(stages_[0].second);
    Status s = first_error.ok() ? model_.Forward(sub, kv, stage_ws_, pool) : first_error;
    const int64_t rows = static_cast<int64_t>(sub.tokens.size()) * width;
    std::vector<uint8_t> msg = s.ok() ? EncodeRows(s, std::span<const float>(stage_ws_.x.data(), rows)) : EncodeRows(s, {});
    if (first_error.ok() && !s.ok()) first_error = s;
    if (Status sent = comm_.Send(1, kTagHidden, std::move(msg)); !sent.ok()) return state_.Fail(sent);
  }
  // The last stage's rows, into the step's order.
  const int64_t vocab = hp.vocab_size, dim = hp.dim;
  size_t num_logits = 0;  // the step's wanted rows, as SplitMicroBatches resolved them
  for (const MicroBatch& mb : mbs) {
    num_logits += static_cast<size_t>(std::count_if(mb.logit_out.begin(), mb.logit_out.end(), [](int32_t o) { return o >= 0; }));
  }
  if (ws.logits.size() < num_logits * vocab) ws.logits.resize(num_logits * vocab);
  if (ws.hidden.size() < batch.hidden_rows.size() * dim) ws.hidden.resize(batch.hidden_rows.size() * dim);
  for (const MicroBatch& mb : mbs) {
    auto msg = comm_.Recv(last, kTagOutput, wait);
    if (!msg.ok()) return state_.Fail(msg.status().WithContext(fmt::format("pipeline stage {}", last)));
    auto rows = DecodeRows(*msg);
    if (!rows.ok()) return state_.Fail(rows.status());
    if (!rows->status.ok()) {
      if (first_error.ok()) first_error = rows->status;
      continue;
    }
    const std::vector<int32_t> head_rows = HeadRows(mb.batch);
    if (rows->x.size() != head_rows.size() * width) {
      return state_.Fail(DataLoss("pipeline stage {} sent {} floats for {} rows of {}", last, rows->x.size(), head_rows.size(), width));
    }
    // The head on rank 0: the same kernels on the same rows as one process.
    const ForwardBatch head = HeadBatch(mb.batch, head_rows, static_cast<int32_t>(hp.num_layers), rows->x.data());
    if (Status s = model_.Forward(head, kv, stage_ws_, pool); !s.ok()) {
      if (first_error.ok()) first_error = s;
      continue;
    }
    for (size_t i = 0; i < mb.logit_out.size(); ++i) {
      if (mb.logit_out[i] < 0) continue;
      std::memcpy(ws.logits.data() + mb.logit_out[i] * vocab, stage_ws_.logits.data() + i * vocab, vocab * sizeof(float));
    }
    for (size_t i = 0; i < mb.hidden_out.size(); ++i) {
      std::memcpy(ws.hidden.data() + mb.hidden_out[i] * dim, stage_ws_.hidden.data() + i * dim, dim * sizeof(float));
    }
  }
  return first_error;
}

Status PipelineDriver::Stop(std::chrono::milliseconds wait) {
  if (!state_.MarkStopped()) return Status::Ok();
  return StopWorkers(comm_, wait);
}

Status StopWorkers(Communicator& comm, std::chrono::milliseconds wait) {
  for (int r = 1; r < comm.size(); ++r) RETURN_IF_ERROR(comm.Send(r, kTagStep, {kStop}));
  return comm.Flush(Wait{wait, nullptr});
}

Status RunPipelineWorker(const Model& model, Communicator& comm, ThreadPool& pool, PipelineOptions options) {
  const int rank = comm.rank(), last = comm.size() - 1;
  if (rank == 0) return InvalidArgument("rank 0 drives the pipeline");
  const ModelHParams& hp = model.hparams();
  if (comm.size() > hp.num_layers) return InvalidArgument("{} pipeline stages for {} layers", comm.size(), hp.num_layers);
  if (hp.recurrent_state_floats > 0) {
    return Unimplemented("{}: pipeline stages of a model with recurrent layers are not supported yet", hp.arch);
  }
  const auto [first_layer, end_layer] = StageLayers(hp.num_layers, comm.size())[rank];
  const int64_t width = model.StageWidth();
  RETURN_IF_ERROR(SayHello(model, comm));
  std::unique_ptr<KvStorage> kv;
  Workspace ws;
  const Wait stage_wait{options.timeout, nullptr};
  for (;;) {
    StepPlan plan;
    ASSIGN_OR_RETURN(const bool step, NextStep(model, comm, stage_wait, &plan, &kv));
    if (!step) return Status::Ok();
    for (const MicroBatch& mb : SplitMicroBatches(plan.batch, kv->num_groups(), plan.micro_batches)) {
      ASSIGN_OR_RETURN(std::vector<uint8_t> in, comm.Recv(rank - 1, kTagHidden, stage_wait));
      ASSIGN_OR_RETURN(Rows rows, DecodeRows(in));
      const int64_t n = static_cast<int64_t>(mb.batch.tokens.size());
      Status s = rows.status;
      if (s.ok() && static_cast<int64_t>(rows.x.size()) != n * width) {
        s = DataLoss("pipeline stage {} got {} floats for {} tokens", rank, rows.x.size(), n);
      }
      if (s.ok()) {
        ForwardBatch sub = mb.batch;
        sub.first_layer = static_cast<int32_t>(first_layer);
        sub.end_layer = static_cast<int32_t>(end_layer);
        sub.output_head = false;  // rank 0 computes the head from the rows the last stage sends
        sub.input = rows.x.data();
        s = model.Forward(sub, *kv, ws, pool).WithContext(fmt::format("pipeline stage {}", rank));
      }
      std::vector<uint8_t> out;
      if (!s.ok()) {
        out = EncodeRows(s, {});
      } else if (rank == last) {  // the rows rank 0's head needs
        std::vector<float> head;
        for (int32_t r : HeadRows(mb.batch)) head.insert(head.end(), ws.x.begin() + r * width, ws.x.begin() + (r + 1) * width);
        out = EncodeRows(s, head);
      } else {
        out = EncodeRows(s, std::span<const float>(ws.x.data(), n * width));
      }
      RETURN_IF_ERROR(comm.Send(rank == last ? 0 : rank + 1, rank == last ? kTagOutput : kTagHidden, std::move(out)));
    }
  }
}

}  // namespace gale::dist
