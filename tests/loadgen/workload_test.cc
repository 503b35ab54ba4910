// Load generator pieces: length distributions, the arrival process against its distribution
// (Kolmogorov-Smirnov for Poisson; mean and variance for bursty gamma), percentiles, the knee.
#include "loadgen/workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "loadgen/report.h"

namespace gale::loadgen {
namespace {

TEST(LoadgenTest, LengthDistributions) {
  Rng rng(3);
  auto fixed = LengthDist::Parse("fixed:7");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->Sample(rng), 7);
  auto uni = LengthDist::Parse("uniform:10-20");
  ASSERT_TRUE(uni.ok());
  int64_t lo = 100, hi = 0;
  for (int i = 0; i < 2000; ++i) {
    const int64_t v = uni->Sample(rng);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_EQ(lo, 10);
  EXPECT_EQ(hi, 20);
  auto logn = LengthDist::Parse("lognormal:100,0.8");
  ASSERT_TRUE(logn.ok());
  std::vector<double> v;
  for (int i = 0; i < 20000; ++i) v.push_back(static_cast<double>(logn->Sample(rng)));
  EXPECT_NEAR(Percentile(v, 0.5), 100.0, 4.0);       // the median
  EXPECT_GT(Percentile(v, 0.99), 500.0);             // long tail: e^(0.8 * 2.33) * 100 = 645
  auto zipf = LengthDist::Parse("zipf:1-1000,1.2");
  ASSERT_TRUE(zipf.ok());
  int ones = 0, big = 0;
  for (int i = 0; i < 10000; ++i) {
    const int64_t x = zipf->Sample(rng);
    ones += x == 1;
    big += x > 100;
  }
  // P(1) = 1 / sum_{n <= 1000} n^-1.2 = 0.231; P(> 100) = 0.169.
  EXPECT_NEAR(ones, 2300, 250);
  EXPECT_NEAR(big, 1690, 250);
  for (const char* bad : {"fixed:0", "uniform:5-2", "lognormal:x", "pareto:3", "uniform:1"}) {
    EXPECT_FALSE(LengthDist::Parse(bad).ok()) << bad;
  }
}

// Poisson arrivals: inter-arrival times are exponential with mean 1/rate. KS statistic below the
// 1% critical value 1.63 / sqrt(n).
TEST(LoadgenTest, PoissonArrivalsAreExponential) {
  const double rate = 5.0;
  Arrivals a(rate, 1.0, 11);
  std::vector<double> gaps;
  const int n = 20000;
  for (int i = 0; i < n; ++i) gaps.push_back(a.NextGapSeconds());
  std::sort(gaps.begin(), gaps.end());
  double d = 0.0;
  for (int i = 0; i < n; ++i) {
    const double cdf = 1.0 - std::exp(-rate * gaps[i]);
    d = std::max({d, std::fabs(cdf - static_cast<double>(i) / n), std::fabs(cdf - static_cast<double>(i + 1) / n)});
  }
  EXPECT_LT(d, 1.63 / std::sqrt(static_cast<double>(n))) << "KS statistic " << d;
}

// Gamma arrivals with shape k: mean 1/rate, variance 1/(k rate^2) (k < 1 is burstier).
TEST(LoadgenTest, GammaArrivalsHaveTheRightMeanAndVariance) {
  for (double k : {0.25, 0.5, 2.0, 8.0}) {
    const double rate = 4.0;
    Arrivals a(rate, k, 5);
    const int n = 50000;
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < n; ++i) {
      const double g = a.NextGapSeconds();
      sum += g;
      sq += g * g;
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    EXPECT_NEAR(mean, 1.0 / rate, 0.03 / rate) << "k " << k;
    EXPECT_NEAR(var, 1.0 / (k * rate * rate), 0.1 / (k * rate * rate)) << "k " << k;
  }
}

TEST(LoadgenTest, PercentilesAndKnee) {
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4, 5}, 0.5), 3.0);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4, 5}, 0.25), 2.0);
  EXPECT_DOUBLE_EQ(Percentile({10}, 0.99), 10.0);
  EXPECT_TRUE(std::isnan(Percentile({}, 0.5)));
  auto step = [](double load, double tput, double p99) {
    nlohmann::json s;
    s["load"] = load;
    s["output_token_throughput"] = tput;
    s["ttft_s"]["p99"] = p99;
    return s;
  };
  EXPECT_EQ(Knee({step(1, 100, 0.1), step(2, 190, 0.1), step(4, 200, 0.12), step(8, 205, 0.5)}), 2.0);
  EXPECT_EQ(Knee({step(1, 100, 0.1), step(2, 190, 0.5)}), 1.0);  // latency blew up
}

TEST(LoadgenTest, PromptsShareTheirPrefixGroup) {
  Rng a(1), b(2);
  const std::string p1 = MakePrompt(a, 20, 10, 3), p2 = MakePrompt(b, 20, 10, 3), p3 = MakePrompt(b, 20, 10, 4);
  auto words = [](const std::string& s, int n) {
    size_t at = 0;
    for (int i = 0; i < n; ++i) at = s.find(' ', at + 1);
    return s.substr(0, at);
  };
  EXPECT_EQ(words(p1, 10), words(p2, 10));
  EXPECT_NE(words(p1, 10), words(p3, 10));
  EXPECT_NE(p1, p2);
}

}  // namespace
}  // namespace gale::loadgen

namespace gale::loadgen {
namespace {

// The server's counters around a phase: parsed from Prometheus text, differenced, and turned into
// the speculative decoding and prefix cache figures the report prints.
TEST(LoadgenTest, ServerCountersFromMetrics) {
  const std::string before_text =
      "# HELP gale:spec_decode_num_drafts_total x\n# TYPE gale:spec_decode_num_drafts_total counter\n"
      "gale:spec_decode_num_drafts_total 10\ngale:spec_decode_num_draft_tokens_total 40\n"
      "gale:spec_decode_num_accepted_tokens_total 20\ngale:prefix_cache_queries_total 100\n"
      "gale:prefix_cache_hits_total 50\ngale:request_success_total{finished_reason=\"stop\"} 3\nnot a sample\n";
  const std::string after_text =
      "gale:spec_decode_num_drafts_total 30\ngale:spec_decode_num_draft_tokens_total 140\n"
      "gale:spec_decode_num_accepted_tokens_total 70\ngale:prefix_cache_queries_total 300\n"
      "gale:prefix_cache_hits_total 200\ngale:num_preemptions_total 2\n";
  const auto before = ParsePrometheus(before_text), after = ParsePrometheus(after_text);
  EXPECT_EQ(before.at("gale:request_success_total{finished_reason=\"stop\"}"), 3.0);
  EXPECT_EQ(before.count("not a"), 0u);
  const nlohmann::json c = ServerCounters(before, after);
  EXPECT_DOUBLE_EQ(c["spec_draft_tokens"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(c["spec_acceptance_rate"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(c["spec_mean_tokens_per_verify"].get<double>(), 1.0 + 50.0 / 20.0);
  EXPECT_DOUBLE_EQ(c["prefix_cache_hit_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(c["preemptions"].get<double>(), 2.0);
  // Another server's metrics: nothing to say.
  EXPECT_TRUE(ServerCounters({}, ParsePrometheus("http_requests_total 5\n")).empty());
}

}  // namespace
}  // namespace gale::loadgen
