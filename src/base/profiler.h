// Profiler: records spans (name, category, start, duration, tokens, bytes) from the threads that
// drive the model and the client, for a Chrome trace-event file (opens in Perfetto) and a summary by op kind.
// Off unless a tool installs one with SetProfiler(); a disabled span costs one pointer test.
// NOTE: one process-wide pointer rather than a parameter threaded through every call: spans sit
// in kernels-adjacent code that should not grow an argument for a diagnostic.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"

namespace gale {

struct TraceEvent {
  const char* name;      // static string
  const char* category;  // "op", "step", "cpu"
  int64_t start_ns;
  int64_t duration_ns;
  int64_t layer;         // -1 when not a per-layer op
  int64_t tokens;
  int64_t bytes;         // bytes of weights (or KV) the op read
};

class Profiler {
 public:
  Profiler();
  // Thread-safe: the engine thread and the client thread both record.
  void Add(const TraceEvent& e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
  }
  int64_t NowNs() const;
  const std::vector<TraceEvent>& events() const { return events_; }  // once recording threads are done

  Status WriteChromeTrace(const std::string& path) const;
  // Time per op kind, step kinds (prefill/decode) and CPU-side work, as text.
  std::string Summary() const;

 private:
  std::chrono::steady_clock::time_point origin_;
  std::mutex mu_;
  std::vector<TraceEvent> events_;
};

void SetProfiler(Profiler* p);  // nullptr disables
Profiler* GetProfiler();

// RAII span: records on destruction when a profiler is installed. Next() closes the current
// span and opens another, for a sequence of ops in one scope.
class ProfileSpan {
 public:
  ProfileSpan(const char* name, const char* category, int64_t tokens = 0, int64_t bytes = 0, int64_t layer = -1)
      : p_(GetProfiler()) {
    Start(name, category, tokens, bytes, layer);
  }
  ~ProfileSpan() { End(); }
  void Next(const char* name, int64_t tokens = 0, int64_t bytes = 0, int64_t layer = -1) {
    End();
    Start(name, e_.category, tokens, bytes, layer);
  }
  ProfileSpan(const ProfileSpan&) = delete;
  ProfileSpan& operator=(const ProfileSpan&) = delete;

 private:
  void Start(const char* name, const char* category, int64_t tokens, int64_t bytes, int64_t layer) {
    if (p_ != nullptr) e_ = {name, category, p_->NowNs(), 0, layer, tokens, bytes};
  }
  void End() {
    if (p_ != nullptr) {
      e_.duration_ns = p_->NowNs() - e_.start_ns;
      p_->Add(e_);
    }
  }

  Profiler* p_;
  TraceEvent e_{};
};

}  // namespace gale
