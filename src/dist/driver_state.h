// What a driver on rank 0 (dist/pipeline.h, dist/tensor_parallel.h) shares between the engine's
// thread, which runs the steps, and any other (a signal handler's thread, which aborts them): a
// failure that sticks, an abort with its reason, a stop.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "base/status.h"
#include "model/model.h"

namespace gale::dist {

class DriverState {
 public:
  // group: "the pipeline"; kind: "pipeline parallelism" (for the errors).
  DriverState(std::string group, std::string kind) : group_(std::move(group)), kind_(std::move(kind)) {}

  // Ok where a step may run: nothing failed, nothing aborted or stopped, and the batch asks for
  // nothing that reads every layer or head in one process (KV retention's tracking, calibration).
  Status CheckStep(const ForwardBatch& batch) {
    if (!failed_.ok()) return failed_;
    if (aborted_.load()) return Fail(Unavailable("{} was stopped", group_));
    if (stopped_) return Unavailable("{} was stopped", group_);
    for (const auto& a : batch.attn_acc) {
      if (a.data != nullptr) return Unimplemented("KV retention does not run with {}", kind_);
    }
    if (batch.observer != nullptr) return Unimplemented("calibration does not run with {}", kind_);
    if (batch.tokens.empty()) return InvalidArgument("empty batch");
    return Status::Ok();
  }
  // Makes a step in flight, and every later one, fail at once with `why` (any thread).
  void Abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (abort_reason_.empty()) abort_reason_ = why;
    }
    aborted_.store(true);
  }
  // s (or the abort's reason, where one came first) becomes the failure of this step and every
  // later one.
  Status Fail(Status s) {
    if (failed_.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = abort_reason_.empty() ? s : Unavailable("{}", abort_reason_);
    }
    aborted_.store(true);
    return failed_;
  }
  // The flag a wait gives up on (Wait::cancel).
  const std::atomic<bool>* cancel() const { return &aborted_; }
  // True the first time: the caller then tells the ranks to stop.
  bool MarkStopped() { return !std::exchange(stopped_, true); }

 private:
  const std::string group_, kind_;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::string abort_reason_;
  Status failed_;
  bool stopped_ = false;
};

}  // namespace gale::dist
