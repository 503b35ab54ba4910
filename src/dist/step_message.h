// What the ranks of one model spread over processes say to each other (dist/pipeline.h,
// dist/tensor_parallel.h): plain little-endian bytes (every rank runs the same binary on the same
// kind of CPU), the start-up hello, and the step plan rank 0 sends every rank each engine step.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "base/status.h"
#include "dist/communicator.h"
#include "kv/kv_storage.h"
#include "model/model.h"

namespace gale::dist {

// Message tags: start-up, step plans (and stops), a pipeline's rows between stages and back to
// rank 0, a tensor-parallel group's all-reduces.
enum Tag : int { kTagHello = 1, kTagStep = 2, kTagHidden = 3, kTagOutput = 4, kTagReduce = 5 };
enum StepKind : uint8_t { kStep = 1, kStop = 2 };

// Little-endian plain bytes (every rank runs the same binary on the same kind of CPU).
class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  template <typename T>
  void PutVector(std::span<const T> v) {
    Put<int64_t>(static_cast<int64_t>(v.size()));
    const size_t at = out_.size();
    out_.resize(at + v.size_bytes());
    if (!v.empty()) std::memcpy(out_.data() + at, v.data(), v.size_bytes());
  }
  void PutString(const std::string& s) { PutVector<char>(std::span<const char>(s.data(), s.size())); }
  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  Status Get(T* v) {
    if (in_.size() - at_ < sizeof(T)) return DataLoss("dist message ends early");
    std::memcpy(v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return Status::Ok();
  }
  template <typename T>
  Status GetVector(std::vector<T>* v) {
    int64_t n = 0;
    RETURN_IF_ERROR(Get(&n));
    if (n < 0 || static_cast<uint64_t>(n) > (in_.size() - at_) / sizeof(T)) {
      return DataLoss("dist message: a vector of {} elements in {} bytes", n, in_.size() - at_);
    }
    v->resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v->data(), in_.data() + at_, static_cast<size_t>(n) * sizeof(T));
    at_ += static_cast<size_t>(n) * sizeof(T);
    return Status::Ok();
  }
  Status GetString(std::string* s) {
    std::vector<char> c;
    RETURN_IF_ERROR(GetVector(&c));
    s->assign(c.begin(), c.end());
    return Status::Ok();
  }
  bool done() const { return at_ == in_.size(); }

 private:
  std::span<const uint8_t> in_;
  size_t at_ = 0;
};

// What a rank says at start-up: enough of the model to catch a rank started on another file or
// split another way.
std::string ModelSignature(const Model& m);
// A worker's hello to rank 0.
Status SayHello(const Model& m, Communicator& comm);
// Rank 0: every other rank's hello, each within `timeout`, and the same signature as m's; errors
// name the rank (`group`: "pipeline", "tensor-parallel").
Status AwaitHellos(const Model& m, Communicator& comm, std::chrono::milliseconds timeout, const char* group);

// The step as every rank needs it: the storage's shape and the batch.
struct StepPlan {
  int64_t num_blocks = 0, block_size = 0;
  uint8_t k_type = 0, v_type = 0, key_channels = 0;
  KvLayerGroups groups;
  int32_t micro_batches = 1;
  std::vector<std::vector<int32_t>> tables;
  ForwardBatch batch;  // its block tables view `tables`
};

std::vector<uint8_t> EncodeStep(const ForwardBatch& b, const KvStorage& kv, int micro_batches);
// Errors on malformed bytes (DataLoss); p->batch's block tables view p->tables.
Status DecodeStep(std::span<const uint8_t> bytes, StepPlan* p);
// The groups a worker's storage needs to be laid out as rank 0's: the same cache layers in each
// (num_layers: the model's KvLayout's, which may hold more cache layers than model layers).
Status CheckGroups(const KvLayerGroups& g, int64_t num_layers);
// A worker's next step: waits for rank 0's next message (as long as it takes: an idle server
// sends none); false where it says stop (the worker's sends flushed, at most flush_wait), else
// the plan decoded and checked, and *kv laid out for it (StorageForStep).
StatusOr<bool> NextStep(const Model& model, Communicator& comm, const Wait& flush_wait, StepPlan* plan,
                        std::unique_ptr<KvStorage>* kv);
// A worker's KV storage for a step: *kv kept where it has the plan's shape, else made anew for
// `layout` (reserved, not touched: only the pages of what the rank computes are ever committed).
Status StorageForStep(const StepPlan& plan, const KvLayout& layout, std::unique_ptr<KvStorage>* kv);

}  // namespace gale::dist
