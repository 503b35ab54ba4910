// Speculative decoding pieces: prompt lookup proposals, and the runner's verification rule on the
// default model. The rule must leave the output distribution exactly the target's: over many
// seeds, the first token produced when a draft is verified follows the target's next-token
// distribution (chi-square), and the token after an accepted draft follows the distribution
// conditioned on it; seed by seed it is the very token one-at-a-time sampling gives.
#include "spec/ngram.h"

#include "spec/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "../test_util.h"
#include "gguf/gguf_file.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "runner/model_runner.h"

namespace gale {
namespace {

TEST(NgramTest, ProposesWhatFollowedTheLatestLongestMatch) {
  NgramParams p;
  p.ngram_min = 1;
  p.ngram_max = 3;
  // Suffix [7 8 9] occurred at 1 (followed by 4 5) and at 6 (followed by 1 2): the latest wins.
  const std::vector<int32_t> t = {0, 7, 8, 9, 4, 5, 7, 8, 9, 1, 2, 3, 7, 8, 9};
  EXPECT_EQ(ProposeNgram(t, 2, p), (std::vector<int32_t>{1, 2}));
  // Past the end the text since the match repeats: [1 2 3 7 8 9] again.
  EXPECT_EQ(ProposeNgram(t, 8, p), (std::vector<int32_t>{1, 2, 3, 7, 8, 9, 1, 2}));
  EXPECT_TRUE(ProposeNgram(t, 0, p).empty());
  // No earlier occurrence of any suffix.
  EXPECT_TRUE(ProposeNgram(std::vector<int32_t>{1, 2, 3, 4}, 3, p).empty());
  EXPECT_TRUE(ProposeNgram(std::vector<int32_t>{5}, 3, p).empty());
  // A longer suffix is preferred to a later, shorter one: [2 3] matches at 1; [3] alone at 4.
  const std::vector<int32_t> u = {1, 2, 3, 6, 3, 7, 2, 3};
  EXPECT_EQ(ProposeNgram(u, 1, p), (std::vector<int32_t>{6}));
  // min 2: a single-token match no longer counts.
  p.ngram_min = 2;
  EXPECT_TRUE(ProposeNgram(std::vector<int32_t>{4, 1, 5, 1}, 2, p).empty());
  // Inside a loop the guess runs on around it.
  p.ngram_min = 1;
  EXPECT_EQ(ProposeNgram(std::vector<int32_t>{3, 3, 3, 3, 3}, 3, p), (std::vector<int32_t>{3, 3, 3}));
  EXPECT_EQ(ProposeNgram(std::vector<int32_t>{5, 1, 2, 1, 2, 1, 2}, 4, p), (std::vector<int32_t>{1, 2, 1, 2}));
}

TEST(SpecCostModelTest, GuessesWhereStepsAreBoundByReadingWeights) {
  SpecCostModel cost;
  EXPECT_FALSE(cost.ready());
  // Until it has a fit it explores: all guesses on every other step, none on the others.
  {
    SpecCostModel fresh;
    const int64_t first = fresh.Guesses(0.1, 1, 6);
    fresh.AddStep(1, 1e-3);
    EXPECT_EQ(first + fresh.Guesses(0.1, 1, 6), 6);
  }
  // Weight-bound steps: 2 ms each plus 20 us per token.
  for (int i = 0; i < 40; ++i) cost.AddStep(1 + i % 5, 2e-3 + 20e-6 * (1 + i % 5));
  ASSERT_TRUE(cost.ready());
  EXPECT_NEAR(cost.fixed_seconds(), 2e-3, 1e-6);
  EXPECT_NEAR(cost.per_token_seconds(), 20e-6, 1e-8);
  EXPECT_EQ(cost.Guesses(0.7, 1, 6), 6);
  EXPECT_EQ(cost.Guesses(0.1, 1, 6), 6);  // cheap enough even for poor guesses
  EXPECT_EQ(cost.Guesses(0.7, 400, 6), 0);  // at a batch of 400 the tokens cost most of the step
  // A draft model costing 1 ms per guess: only good guessers get any.
  for (int i = 0; i < 40; ++i) cost.AddDraft(4, 4e-3);
  EXPECT_EQ(cost.Guesses(0.2, 1, 6), 0);
  EXPECT_GT(cost.Guesses(0.9, 1, 6), 2);

  // Arithmetic-bound steps (a model that lives in cache): each token costs as much as the step.
  SpecCostModel small;
  for (int i = 0; i < 40; ++i) small.AddStep(1 + i % 5, 10e-6 + 100e-6 * (1 + i % 5));
  EXPECT_EQ(small.Guesses(0.5, 1, 6), 0);
  EXPECT_EQ(small.Guesses(0.95, 1, 6), 2);  // almost sure guesses still pay, a couple of them
  // After a long run of equal steps the fit is forgotten and guessing is explored again.
  for (int i = 0; i < 2000; ++i) small.AddStep(1, 110e-6);
  EXPECT_FALSE(small.ready());
  const int64_t first = small.Guesses(0.1, 1, 6);
  small.AddStep(1, 110e-6);
  EXPECT_EQ(first + small.Guesses(0.1, 1, 6), 6);
}

// Upper 0.1% point of chi-square with df degrees of freedom (Wilson-Hilferty above 2).
double ChiSquareCritical(int df) {
  if (df == 1) return 10.828;
  if (df == 2) return 13.816;
  const double z = 3.090232, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Chi-square statistic of counts against probabilities; bins with expected count under 5 are
// pooled with the rest of the vocabulary.
void ExpectFollows(const std::map<int32_t, int>& counts, const std::vector<std::pair<int32_t, float>>& top, int n,
                   const char* what) {
  double stat = 0.0, other_p = 1.0;
  int df = 0, other_count = n;
  for (const auto& [tok, logprob] : top) {
    const double p = std::exp(static_cast<double>(logprob));
    if (p * n < 5.0) continue;
    const int c = counts.count(tok) ? counts.at(tok) : 0;
    stat += (c - p * n) * (c - p * n) / (p * n);
    other_p -= p;
    other_count -= c;
    ++df;
  }
  if (other_p * n >= 5.0) {
    stat += (other_count - other_p * n) * (other_count - other_p * n) / (other_p * n);
  } else {
    EXPECT_LE(other_count, 10) << what;
    --df;
  }
  ASSERT_GE(df, 1) << what << ": the distribution should spread over more than one token";
  std::printf("%s: chi-square %.1f with %d degrees of freedom (0.1%% critical value %.1f)\n", what, stat, df,
              ChiSquareCritical(df));
  EXPECT_LT(stat, ChiSquareCritical(df)) << what;
}

TEST(SpecVerifyTest, KeepsTheTargetDistributionOnTheDefaultModel) {
  auto file = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  auto model = LoadModel(*file).value();
  auto tok = Tokenizer::FromGguf(*file).value();
  ThreadPool pool(1);
  const auto& hp = model->hparams();
  KvStorage storage(hp.num_layers, hp.num_kv_heads, hp.head_dim, 8, 16, kernels::KvType::kF32);
  KvCacheManager kv(8, 16);
  ModelRunner runner(*model, storage, pool);
  std::vector<int32_t> prompt = tok->Encode("Once upon a time, there was a little");
  prompt.insert(prompt.begin(), tok->bos_id());
  const int64_t len = static_cast<int64_t>(prompt.size());
  const std::span<const int32_t> table = *kv.AllocateSlots(1, len + 2);
  std::vector<std::vector<int32_t>> out;
  std::vector<std::vector<TokenLogprobs>> lps;
  // The prompt but its last token, once; every verification below recomputes positions len-1, len.
  const RunnerSeq prefill{0, prompt, 0, len - 1, table, false};
  ASSERT_TRUE(runner.Execute(std::span(&prefill, 1), &out).ok());

  SamplingParams sp;
  sp.temperature = 1.0f;  // no truncation: the sampled distribution is the softmax of the logits
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  // The target's next-token distribution (top 20 log-probabilities) after the prompt, and after
  // the prompt and a draft d.
  auto distribution = [&](std::span<const int32_t> tokens) {
    runner.AddRequest(-1, sp, 20);
    const RunnerSeq q{-1, tokens, len - 1, static_cast<int64_t>(tokens.size()) - (len - 1), table, true};
    EXPECT_TRUE(runner.Execute(std::span(&q, 1), &out, &lps).ok());
    runner.RemoveRequest(-1);
    return lps[0][0].top;
  };
  const auto p0 = distribution(prompt);
  ASSERT_GE(p0.size(), 5u);
  // Drafts: the most likely token, one of middling probability, one the target never picks.
  const std::vector<int32_t> drafts = {p0[0].first, p0[3].first, tok->eos_id()};
  const int n = 3000;
  for (int32_t d : drafts) {
    std::vector<int32_t> with_draft = prompt;
    with_draft.push_back(d);
    const auto p1 = distribution(with_draft);
    std::map<int32_t, int> first, after_accept;
    int accepted = 0;
    for (int seed = 1; seed <= n; ++seed) {
      sp.seed = static_cast<uint64_t>(seed);
      // One token at a time, no draft.
      runner.AddRequest(seed, sp);
      const RunnerSeq plain{seed, prompt, len - 1, 1, table, true};
      ASSERT_TRUE(runner.Execute(std::span(&plain, 1), &out).ok());
      const int32_t expect = out[0][0];
      // The same seed verifying d.
      runner.AddRequest(seed, sp);
      const RunnerSeq spec{seed, with_draft, len - 1, 2, table, true, /*num_spec=*/1};
      ASSERT_TRUE(runner.Execute(std::span(&spec, 1), &out).ok());
      runner.RemoveRequest(seed);
      ASSERT_EQ(out[0][0], expect) << "seed " << seed << ": verification drew a different token";
      ASSERT_EQ(out[0].size(), out[0][0] == d ? 2u : 1u);
      ++first[out[0][0]];
      if (out[0].size() == 2) {
        ++accepted;
        ++after_accept[out[0][1]];
      }
    }
    const std::string name = "draft " + std::to_string(d);
    ExpectFollows(first, p0, n, (name + ", first token").c_str());
    // Acceptance rate is p(d).
    double pd = 0.0;
    for (const auto& [t, lp] : p0) pd += t == d ? std::exp(lp) : 0.0;
    const double sd = std::sqrt(n * pd * (1 - pd)) + 1.0;
    EXPECT_NEAR(accepted, n * pd, 4 * sd) << name;
    if (accepted >= 500) ExpectFollows(after_accept, p1, accepted, (name + ", token after it").c_str());
  }
}

}  // namespace
}  // namespace gale
