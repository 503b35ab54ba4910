// Runs a load test: the phases of a plan (closed-loop concurrency, open-loop arrivals, bursts,
// trace replay) against one target, each request on its own thread with a blocking streaming
// client, with a live progress line on stderr and each phase's summary on stdout.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "loadgen/client.h"
#include "loadgen/report.h"
#include "loadgen/workload.h"

namespace gale::loadgen {

struct Plan {
  std::string label;
  double load = 0.0;
  enum class Kind { kClosed, kOpen, kTrace } kind = Kind::kClosed;
  int64_t concurrency = 1;
  double rate = 0.0;  // open loop; <= 0 with kOpen: all at once (burst)
};

struct LoadConfig {
  Target target;
  std::string model, endpoint = "completions";
  std::vector<Plan> plans;
  int64_t requests = 100;       // per phase
  double duration = 60.0;       // seconds per phase at most
  double timeout = 60.0;
  double speed = 1.0;           // trace replay
  double burstiness = 1.0;
  int64_t max_in_flight = 1024;
  LengthDist in_len, out_len;
  int64_t prefix_groups = 0, prefix_words = 0;
  std::vector<TraceEntry> trace;
  Slo slo;
  uint64_t seed = 1;
  bool ignore_eos = true;
};

struct LoadResult {
  std::vector<Phase> phases;
  std::vector<nlohmann::json> summaries;
};

LoadResult RunLoad(const LoadConfig& cfg);
// results.json (config, summaries, every request) and report.html in dir.
Status WriteReports(const std::string& dir, const std::string& title, const LoadConfig& cfg, const LoadResult& result);

}  // namespace gale::loadgen
