#include "runner/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "../test_util.h"

namespace gale {
namespace {

SamplingParams Plain(float temperature, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

std::vector<double> Softmax(const std::vector<float>& l, float temp) {
  std::vector<double> p(l.size());
  double max = *std::max_element(l.begin(), l.end()), sum = 0;
  for (size_t i = 0; i < l.size(); ++i) sum += p[i] = std::exp((l[i] - max) / temp);
  for (double& x : p) x /= sum;
  return p;
}

TEST(SamplerTest, GreedyPicksArgmax) {
  Sampler s(Plain(0.0f));
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 2.9f};
  EXPECT_EQ(s.Sample(l, {}), 1);
}

// At temperature 1 with no truncation the histogram of 200k draws matches the softmax. Pearson's
// chi-square over 8 categories has 7 degrees of freedom; 24.32 is its 99.9% quantile, so a correct
// sampler fails this for 1 seed in 1000, and a sampler off by even 1% of mass on one token fails
// (that adds about 200000 * 0.01^2 / p ~ 20-200 to the statistic). The seed is fixed: no flakes.
TEST(SamplerTest, TemperatureOneHistogramMatchesSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.2f, -0.3f};
  for (float temp : {1.0f, 0.7f}) {
    Sampler s(Plain(temp, 12345));
    const int n = 200000;
    std::vector<int> counts(logits.size());
    for (int i = 0; i < n; ++i) {
      std::vector<float> l = logits;
      counts[s.Sample(l, {})]++;
    }
    const auto p = Softmax(logits, temp);
    double chi2 = 0;
    for (size_t i = 0; i < p.size(); ++i) chi2 += std::pow(counts[i] - n * p[i], 2) / (n * p[i]);
    EXPECT_LT(chi2, 24.32) << "temperature " << temp;
  }
}

TEST(SamplerTest, TopKNeverPicksOutsideTheK) {
  const auto logits = test::RandomFloats(1000, 9, -5.0f, 5.0f);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const std::set<int> allowed(order.begin(), order.begin() + 5);
  SamplingParams p = Plain(2.0f, 3);
  p.top_k = 5;
  Sampler s(p);
  std::set<int> seen;
  for (int i = 0; i < 5000; ++i) {
    std::vector<float> l = logits;
    const int id = s.Sample(l, {});
    ASSERT_TRUE(allowed.count(id)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 5u);  // and every allowed token does come up at temperature 2
}

TEST(SamplerTest, TopPNeverPicksOutsideTheNucleus) {
  const auto logits = test::RandomFloats(200, 4, -3.0f, 3.0f);
  const float temp = 0.8f, top_p = 0.6f;
  const auto probs = Softmax(logits, temp);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
  std::set<int> nucleus;
  double cum = 0;
  for (int id : order) {
    nucleus.insert(id);
    cum += probs[id];
    if (cum >= top_p) break;
  }
  SamplingParams p = Plain(temp, 5);
  p.top_p = top_p;
  Sampler s(p);
  for (int i = 0; i < 5000; ++i) {
    std::vector<float> l = logits;
    ASSERT_TRUE(nucleus.count(s.Sample(l, {})));
  }
  EXPECT_EQ(s.last_candidates().size(), nucleus.size());
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  std::vector<float> logits = {5.0f, 4.0f, 1.0f, 0.0f};  // p ratios to max: 1, .37, .018, .0067
  SamplingParams p = Plain(1.0f, 8);
  p.min_p = 0.1f;
  Sampler s(p);
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> l = logits;
    ASSERT_LT(s.Sample(l, {}), 2);
  }
}

TEST(SamplerTest, SameSeedSameSequence) {
  const auto logits = test::RandomFloats(50, 1);
  Sampler a(Plain(1.0f, 99)), b(Plain(1.0f, 99)), c(Plain(1.0f, 100));
  std::vector<int> sa, sb, sc;
  for (int i = 0; i < 100; ++i) {
    std::vector<float> l1 = logits, l2 = logits, l3 = logits;
    sa.push_back(a.Sample(l1, {}));
    sb.push_back(b.Sample(l2, {}));
    sc.push_back(c.Sample(l3, {}));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(SamplerTest, Penalties) {
  SamplingParams p = Plain(0.0f);
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {4.0f, -1.0f, 3.0f};
  const std::vector<int32_t> history = {0, 1, 0};
  EXPECT_EQ(s.Sample(l, history), 2);  // 4 / 2 = 2 < 3
  EXPECT_EQ(l[0], 2.0f);
  EXPECT_EQ(l[1], -2.0f);  // negative logits are multiplied

  SamplingParams q = Plain(0.0f);
  q.presence_penalty = 0.5f;
  q.frequency_penalty = 0.25f;
  Sampler t(q);
  std::vector<float> m = {4.0f, 1.0f, 3.5f};
  EXPECT_EQ(t.Sample(m, history), 2);
  EXPECT_FLOAT_EQ(m[0], 4.0f - 0.5f - 2 * 0.25f);
  EXPECT_FLOAT_EQ(m[1], 1.0f - 0.5f - 0.25f);

  SamplingParams w = Plain(0.0f);
  w.repeat_penalty = 2.0f;
  w.repeat_last_n = 1;  // only the last token (0) is penalized
  Sampler u(w);
  std::vector<float> n = {4.0f, 3.0f, 0.0f};
  u.Sample(n, std::vector<int32_t>{1, 0});
  EXPECT_EQ(n[0], 2.0f);
  EXPECT_EQ(n[1], 3.0f);
}

TEST(SamplerTest, ValidateRejectsOutOfRange) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_FALSE(p.Validate().ok());
  p = SamplingParams();
  p.temperature = -1.0f;
  EXPECT_FALSE(p.Validate().ok());
  p = SamplingParams();
  p.temperature = NAN;
  EXPECT_FALSE(p.Validate().ok());
  EXPECT_TRUE(SamplingParams().Validate().ok());
}

}  // namespace
}  // namespace gale
