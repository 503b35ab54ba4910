// KV retention: which slots each policy keeps, the compaction (rows moved through block tables,
// per layer for heavy hitters), the attention tracking in the forward pass, and the engine end to
// end: a budget at least the sequence's length changes nothing, eviction-heavy workloads with
// preemption and cancellation leak no block, and the number of long sequences running at once at
// a fixed KV memory grows as the budget shrinks.
#include "kv/retention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "../test_util.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/synth.h"

namespace gale {
namespace {

using kernels::KvType;

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

RetentionConfig Policy(RetentionPolicy p, int64_t budget = 8) {
  RetentionConfig c;
  c.policy = p;
  c.budget = budget;
  return c;
}

TEST(RetentionTest, SelectsSlotsPerPolicy) {
  using enum RetentionPolicy;
  // Nothing to drop at or below the budget.
  EXPECT_EQ(SelectSlots(Policy(kWindow), 8, 8, 0, nullptr), Range(0, 8));
  EXPECT_EQ(SelectSlots(Policy(kWindow), 8, 20, 0, nullptr), Range(12, 20));
  EXPECT_EQ(SelectSlots(Policy(kSinkWindow), 8, 20, 0, nullptr), Concat(Range(0, 4), Range(16, 20)));
  // A pinned (shared) prefix is kept and counts towards the budget.
  EXPECT_EQ(SelectSlots(Policy(kWindow), 8, 20, 4, nullptr), Concat(Range(0, 4), Range(16, 20)));
  EXPECT_EQ(SelectSlots(Policy(kSinkWindow), 8, 20, 6, nullptr), Concat(Range(0, 6), Range(18, 20)));
  // Pinned slots alone over the budget: they and the newest slot stay.
  EXPECT_EQ(SelectSlots(Policy(kWindow), 8, 20, 12, nullptr), Concat(Range(0, 12), {19}));
  // Heavy hitters: the 4 newest and the 4 largest scores among the rest (ties: earlier slot).
  std::vector<float> acc(20, 1.0f);
  acc[3] = 9.0f;
  acc[7] = 5.0f;
  acc[15] = 100.0f;
  acc[17] = 100.0f;  // among the recent ones anyway
  acc[10] = 5.0f;
  EXPECT_EQ(SelectSlots(Policy(kHeavyHitter), 8, 20, 0, acc.data()), Concat({3, 7, 10, 15}, Range(16, 20)));
  acc[15] = 0.0f;
  EXPECT_EQ(SelectSlots(Policy(kHeavyHitter), 8, 20, 0, acc.data()), Concat({0, 3, 7, 10}, Range(16, 20)));
  // Pinned 4: 2 recent, 2 heavy from [4, 18): 17 (100) and 7 (5, ties with 10: the earlier).
  EXPECT_EQ(SelectSlots(Policy(kHeavyHitter), 8, 20, 4, acc.data()), Concat(Range(0, 4), {7, 17, 18, 19}));
}

TEST(RetentionTest, ValidatesSettings) {
  using enum RetentionPolicy;
  EXPECT_TRUE(Policy(kNone, 0).Validate().ok());
  EXPECT_FALSE(Policy(kWindow, 0).Validate().ok());  // no budget
  RetentionConfig both = Policy(kWindow, 8);
  both.budget_ratio = 0.5;
  EXPECT_FALSE(both.Validate().ok());
  RetentionConfig ratio = Policy(kHeavyHitter, 0);
  ratio.budget_ratio = 0.25;
  EXPECT_TRUE(ratio.Validate().ok());
  EXPECT_EQ(ratio.BudgetFor(100), 25);
  EXPECT_EQ(ratio.BudgetFor(3), 2);  // the policy's minimum
  ratio.budget_ratio = 1.5;
  EXPECT_FALSE(ratio.Validate().ok());
  EXPECT_FALSE(Policy(kSinkWindow, 4).Validate().ok());  // no room past the 4 sinks
  EXPECT_TRUE(Policy(kSinkWindow, 5).Validate().ok());
  EXPECT_FALSE(ParseRetentionPolicy("h2o").ok());
  EXPECT_EQ(ParseRetentionPolicy("sink-window").value(), kSinkWindow);
}

// Rows as stored (any type) move to the lowest slots through a scattered block table; heavy
// hitters pick per layer from their own accumulator rows, which move along.
TEST(RetentionTest, CompactsRowsPerLayerAndFreesTheTail) {
  for (KvType type : {KvType::kF32, KvType::kInt8}) {
    const int64_t layers = 2, heads = 2, head_dim = 8, bs = 4;
    KvStorage kv(layers, heads, head_dim, 16, bs, type);
    const std::vector<int32_t> table = {9, 2, 14, 5, 0};
    const int64_t n = 20, kv_dim = heads * head_dim;
    auto row = [&](int64_t l, int64_t pos, int64_t i) { return static_cast<float>(l * 1000 + pos * 10 + i % 7); };
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t p = 0; p < n; ++p) {
        std::vector<float> k(kv_dim), v(kv_dim);
        for (int64_t i = 0; i < kv_dim; ++i) {
          k[i] = row(l, p, i);
          v[i] = -row(l, p, i);
        }
        kv.Write(l, table[p / bs], p % bs, k.data(), v.data());
      }
    }
    SeqRetention r(Policy(RetentionPolicy::kHeavyHitter, 8), 8, layers, bs);
    r.Reset(0);
    float* acc = r.Accumulator(n);
    acc[0 * r.stride() + 5] = 10.0f;  // layer 0 favours positions 5, 6, 7, 8
    acc[0 * r.stride() + 6] = 10.0f;
    acc[0 * r.stride() + 7] = 10.0f;
    acc[0 * r.stride() + 8] = 10.0f;
    acc[1 * r.stride() + 1] = 3.0f;   // layer 1: 1, 2, 3 and (tie) 0
    acc[1 * r.stride() + 2] = 3.0f;
    acc[1 * r.stride() + 3] = 3.0f;
    EXPECT_EQ(r.MaybeEvict(kv, table, 11), 11) << "below budget + slack: nothing moves";
    ASSERT_EQ(r.MaybeEvict(kv, table, n), 8);
    EXPECT_EQ(r.num_evicted(), 12);
    const std::vector<std::vector<int32_t>> want = {{5, 6, 7, 8, 16, 17, 18, 19}, {0, 1, 2, 3, 16, 17, 18, 19}};
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t s = 0; s < 8; ++s) {
        std::vector<float> k(kv_dim), v(kv_dim);
        kv.Read(l, table[s / bs], s % bs, k.data(), v.data());
        for (int64_t i = 0; i < kv_dim; ++i) {
          const float w = row(l, want[l][s], i);
          ASSERT_NEAR(k[i], w, std::fabs(w) * 0.01f) << "layer " << l << " slot " << s;
          ASSERT_NEAR(v[i], -w, std::fabs(w) * 0.01f);
        }
      }
    }
    EXPECT_EQ(r.Accumulator(8)[0], 10.0f);             // layer 0's slot 0 now holds position 5
    EXPECT_EQ(r.Accumulator(8)[r.stride() + 1], 3.0f);  // layer 1's slot 1 still position 1
    EXPECT_EQ(r.Accumulator(8)[r.stride() + 8], 0.0f);  // past the kept slots: cleared
  }
}

// stories260K, or a test-sized random-weight model of another architecture (test::ArchTestShape).
struct TestModel {
  explicit TestModel(const std::string& arch = "stories") {
    if (arch == "stories") {
      file = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
    } else {
      file = GgufFile::FromBytes(SynthesizeModel(test::ArchTestShape(arch), GgmlType::kF32, 3)->WriteToBytes()).value();
    }
    model = LoadModel(*file).value();
    tok = Tokenizer::FromGguf(*file).value();
  }
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
};

// KV memory of n blocks of the engine's layer groups (with sliding-window layers a block holds
// one group's layers), and for windowed models as many more as their windowed groups hold.
uint64_t BlocksBytes(const TestModel& m, const EngineConfig& cfg, int64_t n, KvType type) {
  const ModelHParams& hp = m.model->hparams();
  const KvLayerGroups groups = cfg.KvGroups(m.model->kv_layout());
  const int64_t windowed = static_cast<int64_t>(std::count_if(groups.window.begin(), groups.window.end(),
                                                               [](int64_t w) { return w > 0; })) *
                           ((hp.sliding_window - 1 + cfg.sched.max_num_batched_tokens) / cfg.block_size + 2);
  return (n + windowed) * KvStorage::BytesPerBlock(groups.layers_per_block, hp.num_kv_heads, hp.head_dim, cfg.block_size,
                                                   type, type, hp.kv_latent, hp.value_head());
}

// The tests of the forward's tracking and of the engine with retention, on each architecture.
class RetentionArchTest : public ::testing::TestWithParam<std::string> {};

// The forward pass's tracking: asking for it changes no logit bit, and each layer's accumulator
// receives one unit of probability per query head and tracked token.
TEST_P(RetentionArchTest, ForwardTracksAttentionWithoutChangingLogits) {
  TestModel m(GetParam());
  const ModelHParams& hp = m.model->hparams();
  ThreadPool pool(2);
  std::vector<int32_t> tokens = {1};
  for (int i = 0; i < 40; ++i) tokens.push_back(3 + (i * 37) % 400);
  auto run = [&](bool track, std::vector<float>* acc) {
    // Windowed layers in layer groups of their own (as the engine has them): not tracked.
    KvCache kv(hp, 64, 1, KvType::kF32, 16, std::nullopt, /*window_groups=*/true);
    Workspace ws;
    ForwardBatch b;
    b.tokens = tokens;
    b.positions = Range(0, static_cast<int32_t>(tokens.size()));
    b.all_logits = true;
    if (track) {
      acc->assign(hp.num_layers * 64, 0.0f);
      b.attn_acc = {{acc->data(), 64}};
    }
    EXPECT_TRUE(m.model->Forward(b, kv, ws, pool).ok());
    return std::vector<float>(ws.logits.begin(), ws.logits.begin() + tokens.size() * hp.vocab_size);
  };
  std::vector<float> acc;
  const auto plain = run(false, nullptr);
  const auto tracked = run(true, &acc);
  ASSERT_EQ(plain.size(), tracked.size());
  for (size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(plain[i]), std::bit_cast<uint32_t>(tracked[i]));
  for (int64_t l = 0; l < hp.num_layers; ++l) {
    double sum = 0.0;
    for (int64_t s = 0; s < 64; ++s) sum += acc[l * 64 + s];
    if (hp.LayerWindow(l) > 0) {
      EXPECT_EQ(sum, 0.0) << "windowed layer " << l << " is not tracked";
      continue;
    }
    EXPECT_NEAR(sum, static_cast<double>(hp.num_heads * tokens.size()), 1e-3) << "layer " << l;
    EXPECT_EQ(acc[l * 64 + tokens.size()], 0.0f) << "nothing past the last slot";
    // Slot 0 is attended by every token (the first one only to it): an attention sink.
    EXPECT_GE(acc[l * 64], static_cast<float>(hp.num_heads));
  }
}

std::vector<int32_t> Generate(Engine& e, GenerationRequest r, int64_t* evicted = nullptr) {
  auto s = e.Submit(std::move(r));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return {};
  std::vector<int32_t> out;
  StreamUpdate u;
  while ((*s)->Next(&u)) {
    out.insert(out.end(), u.token_ids.begin(), u.token_ids.end());
    if (u.finished) {
      EXPECT_TRUE(u.finish_reason == FinishReason::kLength || u.finish_reason == FinishReason::kEos)
          << FinishReasonName(u.finish_reason) << " " << u.status.ToString();
      if (evicted != nullptr) *evicted = u.num_evicted_tokens;
    }
  }
  return out;
}

std::vector<GenerationRequest> Requests(const TestModel& m, int n, int64_t max_prompt, int64_t max_new, uint64_t seed) {
  Rng rng(seed);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.prompt.push_back(m.tok->bos_id());
    const int64_t len = 1 + static_cast<int64_t>(rng.NextU64() % max_prompt);
    for (int64_t j = 0; j < len; ++j) r.prompt.push_back(3 + static_cast<int32_t>(rng.NextU64() % 500));
    r.max_tokens = 1 + static_cast<int64_t>(rng.NextU64() % max_new);
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    r.sampling.seed = 500 + i;
    r.stop_ids = {m.tok->eos_id()};
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Concurrent requests under tight memory (preemption, small chunks, prefix cache on), each with a
// budget at least its length: token for token what they give with no retention, every policy.
TEST_P(RetentionArchTest, BudgetAtLeastTheLengthChangesNothing) {
  TestModel m(GetParam());
  ThreadPool pool(2);
  const auto reqs = Requests(m, 24, 50, 40, 3);
  EngineConfig cfg;
  cfg.sched.max_num_batched_tokens = 24;
  cfg.sched.prefill_chunk_size = 7;
  cfg.block_size = 4;
  cfg.kv_cache_memory_bytes = BlocksBytes(m, cfg, 40, KvType::kF32);
  cfg.kv_type = KvType::kF32;
  std::vector<std::vector<int32_t>> want;
  {
    auto e = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
    for (const auto& r : reqs) want.push_back(Generate(*e, r));
  }
  for (RetentionPolicy p : {RetentionPolicy::kWindow, RetentionPolicy::kSinkWindow, RetentionPolicy::kHeavyHitter}) {
    auto e = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (auto r : reqs) {
      r.retention = Policy(p, 92);  // >= the longest request (51 + 40)
      streams.push_back(e->Submit(std::move(r)).value());
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      std::vector<int32_t> got;
      StreamUpdate u;
      while (streams[i]->Next(&u)) {
        got.insert(got.end(), u.token_ids.begin(), u.token_ids.end());
        if (u.finished) {
          EXPECT_EQ(u.num_evicted_tokens, 0);
          EXPECT_EQ(u.kv_budget, 92);
        }
      }
      EXPECT_EQ(got, want[i]) << RetentionPolicyName(p) << " request " << i;
    }
    EXPECT_GT(e->stats().num_preemptions.load(), 0);
    EXPECT_EQ(e->stats().kv_evicted_tokens.load(), 0);
    EXPECT_EQ(e->stats().num_free_blocks.load(), e->num_blocks());
  }
}

// Long requests with small budgets (every policy, some by ratio), memory for a few at once,
// prompt lookup guessing, prefix sharing, preemption and cancellations: all finish, the evictions
// are reported, and every block is free afterwards.
TEST_P(RetentionArchTest, EvictionHeavyWorkloadsLeakNoBlock) {
  TestModel m(GetParam());
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.sched.max_num_batched_tokens = 40;
  cfg.sched.prefill_chunk_size = 16;
  cfg.block_size = 8;
  cfg.spec.method = SpecMethod::kNgram;
  cfg.spec.always = true;
  cfg.kv_cache_memory_bytes = BlocksBytes(m, cfg, 30, KvType::kF16);
  auto e = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
  auto reqs = Requests(m, 30, 120, 300, 9);
  const std::vector<int32_t> shared = {9, 99, 199, 299, 399, 499, 19, 29, 39, 49, 59, 69, 79, 89, 109, 119, 129};
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerationRequest r = reqs[i];
    if (i % 3 == 0) r.prompt.insert(r.prompt.begin() + 1, shared.begin(), shared.end());
    r.stop_ids.clear();
    RetentionConfig rc;
    rc.policy = static_cast<RetentionPolicy>(1 + i % 3);
    if (i % 4 == 0) {
      rc.budget_ratio = 0.2;
    } else {
      rc.budget = 6 + static_cast<int64_t>(i * 7 % 60);
    }
    r.retention = rc;
    streams.push_back(e->Submit(std::move(r)).value());
    if (i % 7 == 3) e->Cancel(streams.back()->id());
  }
  int64_t evicted = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    StreamUpdate u;
    int64_t n = 0;
    while (streams[i]->Next(&u)) {
      n += static_cast<int64_t>(u.token_ids.size());
      if (!u.finished) continue;
      EXPECT_TRUE(u.finish_reason == FinishReason::kLength || u.finish_reason == FinishReason::kCancelled)
          << u.status.ToString();
      if (u.finish_reason == FinishReason::kLength) {
        EXPECT_EQ(n, reqs[i].max_tokens);
      }
      evicted += u.num_evicted_tokens;
    }
  }
  const EngineStats& st = e->stats();
  std::printf("evicted %lld tokens in %lld compactions, %lld preemptions, %lld guesses accepted\n",
              static_cast<long long>(st.kv_evicted_tokens.load()), static_cast<long long>(st.kv_evictions.load()),
              static_cast<long long>(st.num_preemptions.load()), static_cast<long long>(st.spec_num_accepted_tokens.load()));
  EXPECT_GT(evicted, 2000);
  EXPECT_GE(st.kv_evicted_tokens.load(), evicted);
  EXPECT_GT(st.num_preemptions.load(), 0);
  EXPECT_EQ(st.num_free_blocks.load(), e->num_blocks());
}

// Retention on a sliding-window model compacts the full-attention layers' slots only; the
// windowed layers (in layer groups of their own) keep indexing positions. Gemma 2's layer 0 is
// windowed: its output for tokens computed after a compaction (layer 1's input, seen through the
// calibration observer) is bitwise what it is without retention, while the logits move (layer 1
// lost the evicted positions). Read through compacted slots, layer 0's window would see other rows.
TEST(RetentionTest, WindowedLayersKeepTheirPositionsWhileFullLayersCompact) {
  TestModel m("gemma2");
  const ModelHParams& hp = m.model->hparams();
  ASSERT_GT(hp.LayerWindow(0), 0);
  ASSERT_EQ(hp.LayerWindow(1), 0);
  struct Layer1Input : ActivationObserver {
    std::vector<float> rows;
    void Observe(int64_t layer, LinearInput which, const float* x, int64_t n, int64_t dim) override {
      if (layer == 1 && which == LinearInput::kAttnIn) rows.assign(x, x + n * dim);
    }
  };
  ThreadPool pool(2);
  const std::vector<int32_t> tokens = Concat(Range(3, 23), Range(40, 50));  // 20 then 10
  auto run = [&](bool compact, std::vector<float>* logits) {
    KvCache kv(hp, 32, 1, KvType::kF32, 4, std::nullopt, /*window_groups=*/true);
    Workspace ws;
    Layer1Input seen;
    ForwardBatch first;
    kv.Attach(first);
    first.tokens.assign(tokens.begin(), tokens.begin() + 20);
    first.positions = Range(0, 20);
    EXPECT_TRUE(m.model->Forward(first, kv.storage(), ws, pool).ok());
    int64_t slots = 20;
    if (compact) {  // the window policy down to the last 10 slots
      SeqRetention keep(Policy(RetentionPolicy::kWindow, 10), 10, hp.num_layers, 4);
      keep.Reset(0);
      slots = keep.MaybeEvict(kv.storage(), first.block_tables, 20);
      EXPECT_EQ(slots, 10);
    }
    ForwardBatch second;
    kv.Attach(second);
    second.tokens.assign(tokens.begin() + 20, tokens.end());
    second.positions = Range(20, 30);
    second.slots = Range(static_cast<int32_t>(slots), static_cast<int32_t>(slots) + 10);
    second.all_logits = true;
    second.observer = &seen;
    const Status st = m.model->Forward(second, kv.storage(), ws, pool);
    EXPECT_TRUE(st.ok()) << st.ToString();
    logits->assign(ws.logits.begin(), ws.logits.begin() + 10 * hp.vocab_size);
    return seen.rows;
  };
  std::vector<float> full_logits, compact_logits;
  const auto full = run(false, &full_logits), compacted = run(true, &compact_logits);
  ASSERT_EQ(full.size(), static_cast<size_t>(10 * hp.dim));
  ASSERT_EQ(compacted.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(full[i]), std::bit_cast<uint32_t>(compacted[i]));
  EXPECT_NE(full_logits, compact_logits);
  // One group for every layer: retention with slots behind positions is refused, clearly.
  KvCache single(hp, 32, 1, KvType::kF32, 4);
  Workspace ws;
  ForwardBatch b;
  b.tokens = {5, 6};
  b.positions = {20, 21};
  b.slots = {10, 11};
  const Status st = m.model->Forward(b, single, ws, pool);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layer groups"), std::string::npos) << st.message();
}

// A request with a small budget that shares a cached prefix with others evicts around it, never
// in it: a later request with the same prefix, served from the cache, gives what the first gave.
TEST(RetentionTest, SharedPrefixBlocksAreNeverModified) {
  TestModel m;
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.block_size = 8;
  cfg.kv_cache_memory_bytes = 8 << 20;
  auto e = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
  GenerationRequest base;
  base.prompt.push_back(m.tok->bos_id());
  for (int i = 0; i < 40; ++i) base.prompt.push_back(3 + (i * 53) % 500);
  base.max_tokens = 60;
  const std::vector<int32_t> first = Generate(*e, base);
  GenerationRequest evicting = base;
  evicting.max_tokens = 300;
  evicting.retention = Policy(RetentionPolicy::kHeavyHitter, 48);  // the 40 cached prompt tokens are 32 pinned
  int64_t evicted = 0;
  Generate(*e, evicting, &evicted);
  EXPECT_GT(evicted, 200);
  EXPECT_EQ(Generate(*e, base), first);
  EXPECT_GE(e->stats().prefix_cache_hit_tokens.load(), 2 * 32);
  EXPECT_EQ(e->stats().num_free_blocks.load(), e->num_blocks());
}

// At a fixed KV memory, long sequences (prompt 32 + 400 generated) run at once in proportion to
// how few blocks each holds: budget + one block.
TEST(RetentionTest, ConcurrentSequencesGrowAsTheBudgetShrinks) {
  TestModel m;
  ThreadPool pool(2);
  const ModelHParams& hp = m.model->hparams();
  auto run = [&](int64_t budget) {
    EngineConfig cfg;
    cfg.sched.max_batch_size = 64;
    cfg.sched.max_num_batched_tokens = 256;
    cfg.sched.prefill_chunk_size = 16;
    cfg.block_size = 16;
    cfg.kv_cache_memory_bytes =
        54 * KvStorage::BytesPerBlock(hp.num_layers, hp.num_kv_heads, hp.head_dim, cfg.block_size, KvType::kF16, KvType::kF16, hp.kv_latent);
    if (budget > 0) cfg.retention = Policy(RetentionPolicy::kSinkWindow, budget);
    auto e = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
    std::vector<std::shared_ptr<RequestStream>> streams;
    // All 32 reach the engine at one step boundary: the steps (and so the ratios below) are the
    // same on every run, whatever the threads do.
    e->Pause();
    for (int i = 0; i < 32; ++i) {
      GenerationRequest r;
      for (int j = 0; j < 32; ++j) r.prompt.push_back(3 + (i * 131 + j * 17) % 500);
      r.max_tokens = 400;
      streams.push_back(e->Submit(std::move(r)).value());
    }
    e->Resume();
    for (auto& s : streams) {
      StreamUpdate u;
      while (s->Next(&u)) {
      }
    }
    const EngineStats& st = e->stats();
    EXPECT_EQ(st.num_free_blocks.load(), 54);
    const double mean = static_cast<double>(st.running_step_sum.load()) / static_cast<double>(st.num_steps.load());
    // Decoding sequences per step: each gives one token a step (recomputation after preemption gives none).
    const double per_step = static_cast<double>(st.num_generated_tokens.load()) / static_cast<double>(st.num_steps.load());
    std::printf("budget %lld: %.2f tokens per step, mean %.1f running, most %lld, %lld preemptions, %lld steps\n",
                static_cast<long long>(budget), per_step, mean, static_cast<long long>(st.max_running.load()),
                static_cast<long long>(st.num_preemptions.load()), static_cast<long long>(st.num_steps.load()));
    return per_step;
  };
  const double none = run(0), b128 = run(128), b64 = run(64), b32 = run(32);
  // Blocks per sequence: without retention ~16 on average (32 + 200 tokens, growing to 27); with
  // a budget, budget + one block: 9, 5, 3, so 54 blocks hold 6, 10.8, 18 of them.
  EXPECT_GT(b128, 1.6 * none);
  EXPECT_GT(b64, 1.3 * b128);
  EXPECT_GT(b32, 1.6 * b64);
  EXPECT_GT(b128, 0.7 * 54 / 9);
  EXPECT_GT(b64, 0.7 * 54 / 5);
  EXPECT_GT(b32, 0.7 * 54 / 3);
}

INSTANTIATE_TEST_SUITE_P(Architectures, RetentionArchTest,
                         ::testing::Values("stories", "qwen2", "qwen3", "phi3", "qwen3moe", "deepseek2", "glm4moe", "gemma2",
                                           "gemma3", "gpt-oss"),
                         [](const auto& info) {
                           std::string name = info.param;  // test names take no '-'
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace gale
