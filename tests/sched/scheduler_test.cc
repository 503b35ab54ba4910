// Scheduler with a fake runner (no model): the token budget, decode before prefill, chunking,
// preemption of the newest request, admission errors, and long random workloads of
// submit/cancel/finish under tiny KV memory with the invariants checked after every step.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "base/rng.h"

namespace gale {
namespace {

std::unique_ptr<SeqRequest> MakeRequest(int64_t id, int64_t prompt_len, int64_t max_new, std::vector<int32_t> stop = {}) {
  auto r = std::make_unique<SeqRequest>();
  r->id = id;
  for (int64_t i = 0; i < prompt_len; ++i) r->tokens.push_back(static_cast<int32_t>((id * 31 + i) % 100));
  r->max_new_tokens = max_new;
  r->stop_ids = std::move(stop);
  return r;
}

// The fake model: the next token is a hash of the whole sequence so far, so any lost or
// repeated computation after preemption shows as a different output.
int32_t FakeNext(const std::vector<int32_t>& tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : tokens) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(h % 97);
}

// Verifies drafts as the model runner does: output i is the fake model's next token after the
// tokens and the first i drafts; drafts are accepted while they equal it.
RunnerOutput FakeRun(const StepPlan& plan) {
  RunnerOutput out;
  for (const auto& s : plan.seqs) {
    EXPECT_GE(s.num_new_tokens, 1 + s.num_spec);
    EXPECT_EQ(s.start, s.req->num_computed_tokens);
    EXPECT_LE(s.num_spec, static_cast<int64_t>(s.req->spec_tokens.size()));
    std::vector<int32_t> produced;
    if (s.sample) {
      std::vector<int32_t> history = s.req->tokens;
      for (int64_t i = 0; i <= s.num_spec; ++i) {
        produced.push_back(FakeNext(history));
        if (i == s.num_spec || s.req->spec_tokens[i] != produced.back()) break;
        history.push_back(s.req->spec_tokens[i]);
      }
    }
    out.tokens.push_back(std::move(produced));
  }
  return out;
}

// Guesses for every decoding request: 0 to 5 tokens, the true continuation with one wrong token
// at a random place (or none).
void Guess(Scheduler& s, Rng& rng) {
  for (SeqRequest* r : s.running()) {
    r->spec_tokens.clear();
    if (r->num_computed_tokens + 1 != r->num_tokens()) continue;
    const int64_t n = static_cast<int64_t>(rng.NextU64() % 6);
    const int64_t wrong = static_cast<int64_t>(rng.NextU64() % 8);
    std::vector<int32_t> seq = r->tokens;
    for (int64_t i = 0; i < n; ++i) {
      int32_t t = FakeNext(seq);
      if (i == wrong) t = (t + 1) % 97;
      r->spec_tokens.push_back(t);
      seq.push_back(t);
    }
  }
}

// One group fanning out into many requests cannot hold the batch against another group: the
// other group's request is admitted at the next free place, ahead of the group's waiting ones.
// (With FCFS admission, the small request waited for all 256 of the fan-out.)
TEST(SchedulerTest, AdmissionIsFairBetweenGroups) {
  KvCacheManager kv(4096, 4);
  SchedulerConfig cfg;
  cfg.max_batch_size = 8;
  cfg.max_num_batched_tokens = 64;
  Scheduler s(cfg, &kv);
  for (int64_t id = 1; id <= 256; ++id) {
    auto r = MakeRequest(id, 4, 4 + id % 3);
    r->group = 7;
    ASSERT_TRUE(s.Add(std::move(r)).ok());
  }
  int64_t step = 0, small_admitted_at = -1, fan_finished = 0;
  bool small_added = false, small_done = false;
  while (s.HasWork()) {
    if (step == 3) {
      auto r = MakeRequest(1000, 4, 2);
      r->group = 8;
      ASSERT_TRUE(s.Add(std::move(r)).ok());
      small_added = true;
    }
    StepPlan plan = s.Schedule();
    for (const auto& q : plan.seqs) {
      if (q.req->id == 1000 && small_admitted_at < 0) small_admitted_at = step;
    }
    for (const auto& f : s.Update(plan, FakeRun(plan))) {
      if (f->id == 1000) {
        small_done = true;
        EXPECT_LT(fan_finished, 24) << "the small request finished after most of the fan-out";
      } else {
        ++fan_finished;
      }
    }
    ASSERT_EQ(s.CheckInvariants(), "");
    ++step;
  }
  ASSERT_TRUE(small_added && small_done);
  // The batch was full when it arrived; the first request of the fan-out to finish (at most
  // max_new_tokens = 6 steps later) made room for it.
  EXPECT_GE(small_admitted_at, 3);
  EXPECT_LE(small_admitted_at, 3 + 6);
  EXPECT_EQ(fan_finished, 256);
  EXPECT_EQ(kv.num_free_blocks(), 4096);
}

TEST(SchedulerTest, ChunksPrefillWithinTheBudgetAndRunsDecodesFirst) {
  KvCacheManager kv(64, 4);
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 8;
  cfg.prefill_chunk_size = 5;
  Scheduler s(cfg, &kv);
  ASSERT_TRUE(s.Add(MakeRequest(1, 12, 3)).ok());
  ASSERT_TRUE(s.Add(MakeRequest(2, 4, 3)).ok());
  StepPlan p = s.Schedule();  // r1 5 tokens, r2 3 of its 4 (budget 8)
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].num_new_tokens, 5);
  EXPECT_FALSE(p.seqs[0].sample);
  EXPECT_EQ(p.seqs[1].num_new_tokens, 3);
  EXPECT_EQ(p.num_tokens, 8);
  s.Update(p, FakeRun(p));
  p = s.Schedule();  // r1 next 5, r2 its last prompt token -> samples
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].start, 5);
  EXPECT_EQ(p.seqs[0].num_new_tokens, 5);
  EXPECT_EQ(p.seqs[1].num_new_tokens, 1);
  EXPECT_TRUE(p.seqs[1].sample);
  s.Update(p, FakeRun(p));
  p = s.Schedule();  // r1's last 2 prompt tokens, r2 decodes 1
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(p.seqs[0].num_new_tokens, 2);
  EXPECT_TRUE(p.seqs[0].sample);
  EXPECT_EQ(p.seqs[1].num_new_tokens, 1);
  EXPECT_EQ(s.CheckInvariants(), "");
}

TEST(SchedulerTest, DecodesComeBeforeNewPrefills) {
  KvCacheManager kv(64, 4);
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 4;
  Scheduler s(cfg, &kv);
  ASSERT_TRUE(s.Add(MakeRequest(1, 2, 10)).ok());
  ASSERT_TRUE(s.Add(MakeRequest(2, 2, 10)).ok());
  ASSERT_TRUE(s.Add(MakeRequest(3, 6, 10)).ok());
  StepPlan p = s.Schedule();  // 2 + 2 = budget
  EXPECT_EQ(p.seqs.size(), 2u);
  s.Update(p, FakeRun(p));
  p = s.Schedule();  // decodes 1 + 1, then 2 tokens of r3's prompt
  ASSERT_EQ(p.seqs.size(), 3u);
  EXPECT_EQ(p.seqs[0].req->id, 1);
  EXPECT_EQ(p.seqs[1].req->id, 2);
  EXPECT_EQ(p.seqs[2].req->id, 3);
  EXPECT_EQ(p.seqs[2].num_new_tokens, 2);
}

TEST(SchedulerTest, RespectsMaxBatchSize) {
  KvCacheManager kv(64, 4);
  SchedulerConfig cfg;
  cfg.max_batch_size = 2;
  Scheduler s(cfg, &kv);
  for (int id = 1; id <= 3; ++id) ASSERT_TRUE(s.Add(MakeRequest(id, 3, 2)).ok());
  StepPlan p = s.Schedule();
  EXPECT_EQ(p.seqs.size(), 2u);
  EXPECT_EQ(s.num_waiting(), 1);
}

TEST(SchedulerTest, PreemptsTheNewestAndRecomputesIt) {
  KvCacheManager kv(4, 2);  // 8 slots
  SchedulerConfig cfg;
  Scheduler s(cfg, &kv);
  ASSERT_TRUE(s.Add(MakeRequest(1, 3, 4)).ok());  // needs up to 7 slots = 4 blocks
  ASSERT_TRUE(s.Add(MakeRequest(2, 3, 4)).ok());
  StepPlan p = s.Schedule();  // both prefill: 2 blocks each, pool full
  ASSERT_EQ(p.seqs.size(), 2u);
  s.Update(p, FakeRun(p));
  p = s.Schedule();  // r1 decodes at position 3 (fits block 2); r2 too
  s.Update(p, FakeRun(p));
  p = s.Schedule();  // r1 needs a third block: r2 is preempted
  ASSERT_EQ(p.preempted, std::vector<int64_t>{2});
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].req->id, 1);
  EXPECT_EQ(s.num_waiting(), 1);
  EXPECT_EQ(s.CheckInvariants(), "");
  int steps = 0;
  std::map<int64_t, std::vector<int32_t>> outputs;
  auto finished = s.Update(p, FakeRun(p));
  while (true) {
    for (auto& f : finished) outputs[f->id] = f->tokens;
    if (!s.HasWork()) break;
    p = s.Schedule();
    ASSERT_FALSE(p.empty());
    ASSERT_EQ(s.CheckInvariants(), "");
    finished = s.Update(p, FakeRun(p));
    ASSERT_LT(++steps, 100);
  }
  EXPECT_GE(s.num_preemptions(), 1);
  EXPECT_EQ(kv.num_free_blocks(), 4);
  // Recomputation gives the same tokens as an uninterrupted run.
  for (int64_t id : {1, 2}) {
    std::vector<int32_t> want = MakeRequest(id, 3, 4)->tokens;
    for (int i = 0; i < 4; ++i) want.push_back(FakeNext(want));
    EXPECT_EQ(outputs[id], want) << id;
  }
}

TEST(SchedulerTest, RejectsRequestsThatCanNeverFit) {
  KvCacheManager kv(4, 4);  // 16 slots
  SchedulerConfig cfg;
  cfg.max_seq_len = 12;
  Scheduler s(cfg, &kv);
  EXPECT_EQ(s.max_request_tokens(), 12);
  EXPECT_TRUE(s.Add(MakeRequest(1, 8, 4)).ok());
  const Status st = s.Add(MakeRequest(2, 8, 5));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exceeds the limit of 12"), std::string::npos) << st.ToString();
  EXPECT_FALSE(s.Add(MakeRequest(3, 0, 5)).ok());
  EXPECT_FALSE(s.Add(MakeRequest(4, 3, 0)).ok());
  KvCacheManager small(2, 4);  // all KV memory is 8 slots
  Scheduler s2(SchedulerConfig{}, &small);
  EXPECT_FALSE(s2.Add(MakeRequest(5, 6, 3)).ok());
}

TEST(SchedulerTest, StopsOnStopIdsAndAbortFreesBlocks) {
  KvCacheManager kv(16, 4);
  Scheduler s(SchedulerConfig{}, &kv);
  auto r = MakeRequest(1, 3, 50);
  std::vector<int32_t> t = r->tokens;
  const int32_t first = FakeNext(t);
  r->stop_ids = {first};
  ASSERT_TRUE(s.Add(std::move(r)).ok());
  ASSERT_TRUE(s.Add(MakeRequest(2, 3, 50)).ok());
  StepPlan p = s.Schedule();
  auto done = s.Update(p, FakeRun(p));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->finish_reason, FinishReason::kEos);
  EXPECT_EQ(done[0]->num_generated(), 1);
  auto aborted = s.Abort(2, FinishReason::kCancelled);
  ASSERT_NE(aborted, nullptr);
  EXPECT_EQ(aborted->finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(s.Abort(2, FinishReason::kCancelled), nullptr);
  EXPECT_FALSE(s.HasWork());
  EXPECT_EQ(kv.num_free_blocks(), 16);
}

// Random arrivals, cancels, chunk sizes, budgets and tiny memory. After every step: invariants,
// budget and batch size respected. At the end: every request finished with the tokens an
// uninterrupted run gives, every block free, and no request waited unboundedly.
// What the engine does after a step for requests with a KV budget (the scheduler only counts):
// at budget + one block, drop slots down to the budget (never the pinned prefix).
int64_t EmulateEvictions(Scheduler& s, KvCacheManager& kv) {
  int64_t evicted = 0;
  for (SeqRequest* r : s.running()) {
    if (!r->retains() || r->num_slots() < std::max(r->kv_budget, r->num_pinned_slots + 1) + kv.block_size()) continue;
    const int64_t keep = std::max(r->kv_budget, r->num_pinned_slots + 1);
    evicted += r->num_slots() - keep;
    r->num_evicted += r->num_slots() - keep;
    kv.TrimSlots(r->id, keep, r->num_computed_tokens);  // windowed groups keep their positions
  }
  return evicted;
}

// Every block a step's tokens read is in their tables: from the window's first slot of the
// chunk's first token (0 in a full group) to its last slot.
void ExpectStepBlocksHeld(const StepPlan& plan, const KvCacheManager& kv) {
  for (const auto& s : plan.seqs) {
    for (int64_t g = 0; g < kv.num_groups(); ++g) {
      const auto table = kv.BlockTable(s.req->id, g);
      const int64_t w = kv.group_windows()[g];
      // Full groups index slots, windowed groups positions (they differ after evictions).
      const int64_t first = w > 0 ? s.req->num_computed_tokens : s.req->num_slots();
      const int64_t last = first + s.num_new_tokens - 1;
      ASSERT_GT(static_cast<int64_t>(table.size()), last / kv.block_size());
      const int64_t from = w > 0 ? std::max<int64_t>(0, first + 1 - w) : 0;
      for (int64_t b = from / kv.block_size(); b <= last / kv.block_size(); ++b) {
        ASSERT_NE(table[b], KvCacheManager::kNoBlock) << "request " << s.req->id << " group " << g << " block " << b;
      }
    }
  }
}

void RandomWorkloads(bool prefix_caching, bool spec = false, bool retention = false, bool windows = false) {
  int64_t total_evicted = 0;
  int64_t total_preemptions = 0, total_cancels = 0, total_finished = 0, total_hits = 0;
  int64_t total_proposed = 0, total_accepted = 0, total_released = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Rng rng(seed);
    const int32_t num_blocks = 3 + static_cast<int32_t>(rng.NextU64() % 12);
    const int64_t block_size = 1 + static_cast<int64_t>(rng.NextU64() % 5);
    // Windowed layer groups: a full group and one or two with windows of 1 to 12.
    std::vector<int64_t> group_windows = {0};
    if (windows) {
      for (int i = 0, n = 1 + static_cast<int>(rng.NextU64() % 2); i < n; ++i) {
        group_windows.push_back(1 + static_cast<int64_t>(rng.NextU64() % 12));
      }
    }
    KvCacheManager kv(windows ? num_blocks * 3 : num_blocks, block_size, prefix_caching, group_windows);
    // Prompts start with one of a few shared prefixes, so the cache has something to find.
    std::vector<std::vector<int32_t>> prefixes(3);
    for (auto& p : prefixes) {
      const int64_t len = static_cast<int64_t>(rng.NextU64() % 12);
      for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(rng.NextU64() % 100));
    }
    SchedulerConfig cfg;
    cfg.max_num_batched_tokens = 1 + static_cast<int64_t>(rng.NextU64() % 16);
    cfg.prefill_chunk_size = 1 + static_cast<int64_t>(rng.NextU64() % 8);
    cfg.max_batch_size = 1 + static_cast<int64_t>(rng.NextU64() % 6);
    Scheduler s(cfg, &kv);
    const int64_t limit = s.max_request_tokens();
    std::map<int64_t, std::vector<int32_t>> expected;
    std::map<int64_t, std::unique_ptr<SeqRequest>> done;
    int64_t next_id = 1, num_submitted = 0, step = 0;
    const int64_t num_requests = 30;
    while (num_submitted < num_requests || s.HasWork()) {
      // Arrivals: a few per step.
      while (num_submitted < num_requests && rng.NextU64() % 3 == 0) {
        const int64_t prompt = 1 + static_cast<int64_t>(rng.NextU64() % std::max<int64_t>(1, limit - 1));
        // With a KV budget a request may be longer than all KV memory.
        const bool retains = retention && rng.NextU64() % 2 == 0;
        const int64_t max_new = 1 + static_cast<int64_t>(rng.NextU64() % std::max<int64_t>(1, (retains ? 3 * limit : limit) - prompt));
        auto r = MakeRequest(next_id, prompt, max_new, {static_cast<int32_t>(rng.NextU64() % 97)});
        if (retains) r->kv_budget = 1 + static_cast<int64_t>(rng.NextU64() % static_cast<uint64_t>(limit));
        const auto& prefix = prefixes[rng.NextU64() % prefixes.size()];
        for (size_t i = 0; i < prefix.size() && i < r->tokens.size(); ++i) r->tokens[i] = prefix[i];
        std::vector<int32_t> want = r->tokens;
        for (int64_t i = 0; i < max_new; ++i) {
          want.push_back(FakeNext(want));
          if (want.back() == r->stop_ids[0]) break;
        }
        expected[next_id] = want;
        const bool fits = retains ? r->kv_budget + block_size <= s.retaining_capacity() : prompt + max_new <= limit;
        ASSERT_EQ(s.Add(std::move(r)).ok(), fits);
        if (!fits) expected.erase(next_id);
        ++next_id;
        ++num_submitted;
      }
      // Cancels: rarely, a random earlier id.
      if (next_id > 1 && rng.NextU64() % 25 == 0) {
        const int64_t id = 1 + static_cast<int64_t>(rng.NextU64() % (next_id - 1));
        if (auto r = s.Abort(id, FinishReason::kCancelled)) {
          expected.erase(id);
          ASSERT_EQ(r->finish_reason, FinishReason::kCancelled);
          ++total_cancels;
        }
      }
      if (!s.HasWork()) continue;
      if (spec) Guess(s, rng);
      StepPlan p = s.Schedule();
      ASSERT_FALSE(p.empty()) << "seed " << seed << " step " << step << ": work but nothing scheduled";
      ASSERT_LE(p.num_tokens, cfg.max_num_batched_tokens);
      ASSERT_LE(s.num_running(), cfg.max_batch_size);
      ASSERT_EQ(s.CheckInvariants(), "") << "seed " << seed << " step " << step;
      ExpectStepBlocksHeld(p, kv);
      for (auto& f : s.Update(p, FakeRun(p))) done[f->id] = std::move(f);
      ASSERT_EQ(s.CheckInvariants(), "") << "seed " << seed << " step " << step;
      if (retention) {
        total_evicted += EmulateEvictions(s, kv);
        ASSERT_EQ(s.CheckInvariants(), "") << "seed " << seed << " step " << step;
      }
      ASSERT_LT(++step, 20000) << "seed " << seed << ": no progress";
    }
    EXPECT_EQ(kv.num_free_blocks(), kv.pool().num_blocks()) << "seed " << seed;
    total_released += kv.num_window_released();
    total_preemptions += s.num_preemptions();
    total_finished += static_cast<int64_t>(done.size());
    total_hits += kv.num_hit_tokens();
    total_proposed += s.num_spec_proposed();
    total_accepted += s.num_spec_accepted();
    for (const auto& [id, want] : expected) {
      ASSERT_TRUE(done.count(id)) << "seed " << seed << " request " << id << " never finished";
      EXPECT_EQ(done[id]->tokens, want) << "seed " << seed << " request " << id;
    }
  }
  // The workloads must actually exercise preemption, cancellation and (when on) cache hits.
  std::printf("prefix cache %s, spec %s: finished %lld, preemptions %lld, cancels %lld, hit tokens %lld, "
              "guesses %lld, accepted %lld\n",
              prefix_caching ? "on" : "off", spec ? "on" : "off", static_cast<long long>(total_finished),
              static_cast<long long>(total_preemptions), static_cast<long long>(total_cancels),
              static_cast<long long>(total_hits), static_cast<long long>(total_proposed),
              static_cast<long long>(total_accepted));
  if (windows) {
    std::printf("blocks given back behind windows %lld\n", static_cast<long long>(total_released));
    EXPECT_GT(total_released, 1000);
  }
  if (retention) {
    std::printf("evicted %lld\n", static_cast<long long>(total_evicted));
    EXPECT_GT(total_evicted, 10000);
  }
  if (spec) {
    EXPECT_GT(total_accepted, 1000);
    EXPECT_GT(total_proposed - total_accepted, 1000) << "rejections must be exercised too";
  }
  EXPECT_GT(total_preemptions, 100);
  EXPECT_GT(total_cancels, 10);
  if (prefix_caching) {
    EXPECT_GT(total_hits, 1000);
  } else {
    EXPECT_EQ(total_hits, 0);
  }
}

TEST(SchedulerTest, RandomWorkloadsUnderTinyMemory) { RandomWorkloads(/*prefix_caching=*/false); }

// The same workloads with the prefix cache: identical outputs, the cache gives way under memory
// pressure (everything that fits without it finishes with it), and no block leaks.
TEST(SchedulerTest, RandomWorkloadsWithPrefixCaching) { RandomWorkloads(/*prefix_caching=*/true); }

// Speculative guesses (right, wrong, cut short by the budget or the length limit) with preemption
// and the prefix cache: outputs are still the fake model's, slots of rejected guesses go back to
// the pool, and the invariants hold after every step.
TEST(SchedulerTest, RandomWorkloadsWithSpeculativeGuesses) {
  RandomWorkloads(/*prefix_caching=*/true, /*spec=*/true);
}

// Layer groups with sliding windows (a full group and one or two windowed ones): every block a
// step reads is held, blocks behind the windows go back, prefix hits take only the last window's
// blocks, preemption and rejected guesses leave the tables whole, and no block leaks.
TEST(SchedulerTest, RandomWorkloadsWithWindowedLayerGroups) {
  RandomWorkloads(/*prefix_caching=*/true, /*spec=*/true, /*retention=*/false, /*windows=*/true);
}

// The same with KV budgets among the requests: evictions trim the full group's slots while the
// windowed groups keep covering positions (and give back what their windows passed).
TEST(SchedulerTest, RandomWorkloadsWithWindowedLayerGroupsAndKvRetention) {
  RandomWorkloads(/*prefix_caching=*/true, /*spec=*/true, /*retention=*/true, /*windows=*/true);
}

// Requests with a KV budget among the others, some longer than all KV memory, with evictions after
// every step (as the engine does), guesses, the prefix cache and preemption: outputs are still
// the fake model's (it reads tokens, not the cache), slot counts and blocks agree after every
// step, and every block is free at the end.
TEST(SchedulerTest, RandomWorkloadsWithKvRetention) {
  RandomWorkloads(/*prefix_caching=*/true, /*spec=*/true, /*retention=*/true);
}

TEST(SchedulerTest, VerifiesGuessesWithinTheBudgetAndReleasesRejectedSlots) {
  KvCacheManager kv(16, 4);
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 6;
  Scheduler s(cfg, &kv);
  ASSERT_TRUE(s.Add(MakeRequest(1, 3, 20)).ok());
  StepPlan p = s.Schedule();
  s.Update(p, FakeRun(p));  // prefill + first token: 4 tokens, 3 computed
  SeqRequest* r = s.running()[0];
  ASSERT_EQ(r->num_tokens(), 4);
  // Three right guesses, then a wrong one, then one more: the budget of 6 takes the decode
  // token and 5 guesses; 3 are accepted, the 4th is rejected and replaced.
  std::vector<int32_t> seq = r->tokens;
  for (int i = 0; i < 6; ++i) {
    int32_t t = FakeNext(seq);
    if (i == 3) t = (t + 1) % 97;
    r->spec_tokens.push_back(t);
    seq.push_back(t);
  }
  p = s.Schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].num_spec, 5);
  EXPECT_EQ(p.seqs[0].num_new_tokens, 6);
  EXPECT_EQ(kv.BlockTable(1).size(), 3u);  // positions 0..8
  s.Update(p, FakeRun(p));
  EXPECT_EQ(r->num_tokens(), 8);           // 4 + 3 accepted + 1 sampled
  EXPECT_EQ(r->num_computed_tokens, 7);
  EXPECT_TRUE(r->spec_tokens.empty());
  EXPECT_EQ(kv.BlockTable(1).size(), 2u);  // the block of rejected positions went back
  EXPECT_EQ(s.num_spec_proposed(), 5);
  EXPECT_EQ(s.num_spec_accepted(), 3);
  EXPECT_EQ(s.CheckInvariants(), "");
  // Guesses never run past max_new_tokens: with 1 of 3 generated, one guess fits.
  KvCacheManager kv2(16, 4);
  Scheduler s2(cfg, &kv2);
  ASSERT_TRUE(s2.Add(MakeRequest(2, 3, 3)).ok());
  p = s2.Schedule();
  s2.Update(p, FakeRun(p));
  s2.running()[0]->spec_tokens.assign(5, 0);
  p = s2.Schedule();
  EXPECT_EQ(p.seqs[0].num_spec, 1);
  s2.Update(p, FakeRun(p));
  EXPECT_LE(kv2.BlockTable(2).size(), 2u);
}

}  // namespace
}  // namespace gale
