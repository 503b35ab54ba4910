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

// top-p and min-p over a vocabulary large enough that the sampler's buckets matter (logits over
// ~14 nats: hundreds of buckets, several tokens in the one where the nucleus ends, exact ties
// among them): the tokens it draws from are exactly the sorted definition's (largest first, ties
// by id, prefix reaching top_p, then min-p), and their histogram matches the renormalized
// probabilities (chi-square over 8 groups of about equal mass, 7 degrees of freedom, 24.32 = the
// 99.9% quantile; fixed seeds).
TEST(SamplerTest, NucleusOverALargeVocabularyMatchesTheSortedDefinition) {
  auto logits = test::RandomFloats(4000, 21, -6.0f, 6.0f);
  for (int i = 0; i < 40; ++i) logits[i * 97] = 8.0f + 0.01f * static_cast<float>(i % 7);  // peaks, with ties
  for (int i = 0; i < 30; ++i) logits[3 + i * 131] = 1.25f;                                  // a tie in the body
  struct Case {
    float top_p, min_p;
  };
  for (const Case c : {Case{0.9f, 0.0f}, Case{0.5f, 0.0f}, Case{0.97f, 0.001f}, Case{1.0f, 0.02f}}) {
    // The definition, with the sampler's weights (float expf of the difference to the max).
    const float max = *std::max_element(logits.begin(), logits.end());
    std::vector<int> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    std::vector<double> w(logits.size());
    double z = 0;
    for (size_t i = 0; i < logits.size(); ++i) z += w[i] = std::exp(logits[i] - max);
    std::vector<int> kept;
    double cum = 0;
    for (int id : order) {
      if (cum >= static_cast<double>(c.top_p) * z) break;
      cum += w[id];
      kept.push_back(id);
    }
    std::erase_if(kept, [&](int id) { return w[id] < c.min_p; });
    const std::set<int> want(kept.begin(), kept.end());
    double kept_mass = 0;
    for (int id : kept) kept_mass += w[id];

    SamplingParams p = Plain(1.0f, 77);
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    Sampler s(p);
    std::vector<float> l = logits;
    s.Sample(l, {});
    std::set<int> got;
    for (const auto& [id, prob] : s.last_candidates()) got.insert(id);
    ASSERT_EQ(got, want) << "top_p " << c.top_p << " min_p " << c.min_p;
    // Groups of about equal mass along the sorted order.
    std::vector<int> group(logits.size(), -1);
    std::vector<double> expect(8, 0.0);
    double run = 0;
    for (int id : kept) {
      const int g = std::min(7, static_cast<int>(8 * run / kept_mass));
      group[id] = g;
      expect[g] += w[id] / kept_mass;
      run += w[id];
    }
    const int n = 30000;
    std::vector<int> counts(8, 0);
    for (int i = 0; i < n; ++i) {
      l = logits;
      const int id = s.Sample(l, {});
      ASSERT_GE(group[id], 0) << "drew " << id << ", outside the nucleus";
      counts[group[id]]++;
    }
    double chi2 = 0;
    for (int g = 0; g < 8; ++g) {
      if (expect[g] > 0) chi2 += std::pow(counts[g] - n * expect[g], 2) / (n * expect[g]);
    }
    EXPECT_LT(chi2, 24.32) << "top_p " << c.top_p << " min_p " << c.min_p;
  }
}

// Rows a broken model could produce never crash a sampler nor yield a NaN token: NaN logits count
// as -inf, and a row without a finite largest logit (all NaN or -inf, or a +inf) gets its argmax.
TEST(SamplerTest, NonFiniteLogitsAreSafe) {
  std::vector<float> base = test::RandomFloats(3000, 5, -3.0f, 3.0f);
  for (int i = 0; i < 3000; i += 7) base[i] = NAN;
  base[11] = -INFINITY;
  struct Case {
    int top_k;
    float top_p, min_p;
  };
  for (const Case c : {Case{0, 1.0f, 0.0f}, Case{0, 0.9f, 0.0f}, Case{0, 1.0f, 0.05f}, Case{40, 0.95f, 0.05f}}) {
    SamplingParams p = Plain(1.3f, 3);
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    Sampler s(p);
    for (int i = 0; i < 200; ++i) {
      std::vector<float> l = base;
      const int id = s.Sample(l, {});
      ASSERT_TRUE(id >= 0 && id < 3000 && id % 7 != 0 && id != 11) << id;
    }
    std::vector<float> all_nan(100, NAN), all_neg(100, -INFINITY), pos_inf = test::RandomFloats(100, 6);
    pos_inf[42] = INFINITY;
    EXPECT_EQ(s.Sample(all_nan, {}), 0);
    EXPECT_EQ(s.Sample(all_neg, {}), 0);
    EXPECT_EQ(s.Sample(pos_inf, {}), 42);
  }
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
