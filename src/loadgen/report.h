// Load-test results: percentiles and the summary people read (throughput, TTFT / TPOT / ITL / E2E
// at mean, p50, p90, p99, p99.9, timeout and error rates, goodput under SLOs), the JSON with every
// request's timings, and a self-contained HTML report with SVG charts.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/client.h"

namespace gale::loadgen {

struct Slo {
  double ttft_s = -1.0, tpot_s = -1.0, e2e_s = -1.0;  // < 0: no objective
};

struct Phase {
  std::string label;          // "concurrency 8", "rate 4/s", "burst 64", ...
  double load = 0.0;          // the x value of ramp charts (concurrency or rate)
  std::vector<RequestResult> results;
  double wall_s = 0.0;
};

// q in [0, 1], linear interpolation; NaN for no values.
double Percentile(std::vector<double> v, double q);

nlohmann::json Summarize(const Phase& phase, const Slo& slo);
// What gale's counters say about a phase, from /metrics scraped before and after it: generated
// tokens, speculative decoding (guesses, accepted, acceptance rate, mean tokens per verifying
// step) and prefix cache hits. Empty object when the counters are absent.
nlohmann::json ServerCounters(const std::map<std::string, double>& before, const std::map<std::string, double>& after);
std::string SummaryText(const nlohmann::json& summary);
// The load of the knee: the last phase before throughput gains under 10% for the next step, or
// p99 TTFT more than doubles; -1 without at least two phases.
double Knee(const std::vector<nlohmann::json>& summaries);
std::string HtmlReport(const std::string& title, const std::vector<Phase>& phases,
                       const std::vector<nlohmann::json>& summaries);

}  // namespace gale::loadgen
