// Server metrics in Prometheus text format, named like vLLM's (prefix `gale:`): request outcomes,
// token counters, latency histograms (time to first token, time per output token, end to end),
// and the engine's gauges (running, waiting, KV usage, prefix cache, preemptions). The families
// vLLM has are also written under its own names (`vllm:...{model_name="..."}`), so routers and
// autoscalers that read vLLM read gale. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/api.h"

namespace gale::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void Observe(double v);
  // labels: "" or `key="value"` pairs added to every sample.
  void Render(const std::string& name, const std::string& help, const std::string& labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1] non-cumulative
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // outcome: "stop", "length", "abort", "error", "rejected"
  void RequestDone(const std::string& outcome, int64_t prompt_tokens, int64_t generation_tokens, double ttft_s,
                   double e2e_s);
  // Token counters, moved as the engine produces (not only when requests end).
  void Tokens(int64_t prompt_tokens, int64_t generation_tokens);
  void HttpResponse(int status);
  std::string Render(const Engine* engine, const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> outcomes_;
  std::map<int, uint64_t> http_status_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace gale::server
