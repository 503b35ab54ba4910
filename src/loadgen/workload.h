// What a load test sends and when: length distributions (fixed, uniform, lognormal, Zipf-like),
// arrival processes (Poisson, or gamma with a burstiness shape, as vLLM's benchmark does), prompt
// texts of a given length with optional shared prefixes, and trace files to replay.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/rng.h"
#include "base/status.h"

namespace gale::loadgen {

// "fixed:N", "uniform:A-B", "lognormal:MEDIAN,SIGMA" (clamped to [1, 32768]), "zipf:A-B,S"
// (P(n) proportional to n^-S on [A, B]).
class LengthDist {
 public:
  static StatusOr<LengthDist> Parse(const std::string& spec);
  int64_t Sample(Rng& rng) const;
  const std::string& spec() const { return spec_; }

 private:
  enum class Kind { kFixed, kUniform, kLognormal, kZipf } kind_ = Kind::kFixed;
  std::string spec_;
  int64_t a_ = 1, b_ = 1;
  double x_ = 0.0, y_ = 0.0;
  std::vector<double> cdf_;  // zipf: cumulative over [a, b]
};

// Inter-arrival times of an open-loop load: gamma with shape k and mean 1/rate (k = 1 is Poisson;
// k < 1 burstier, k > 1 more regular).
class Arrivals {
 public:
  Arrivals(double rate_per_s, double burstiness, uint64_t seed) : rate_(rate_per_s), k_(burstiness), rng_(seed) {}
  double NextGapSeconds();

 private:
  double Gamma(double shape);
  double Normal();
  double rate_, k_;
  Rng rng_;
};

// A prompt of about n_words words (about one token each in English vocabularies), the first
// prefix_words of them taken from a shared text when prefix_group >= 0.
std::string MakePrompt(Rng& rng, int64_t n_words, int64_t prefix_words, int prefix_group);

// One line of a trace: {"timestamp": seconds (or ms with "timestamp_ms"), "prompt": text or
// "input_length": N, "output_length": N}.
struct TraceEntry {
  double at_s = 0.0;
  std::string prompt;
  int64_t input_length = 0;
  int64_t output_length = 0;
};
StatusOr<std::vector<TraceEntry>> ReadTrace(const std::string& path);

}  // namespace gale::loadgen
