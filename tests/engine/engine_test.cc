// The engine end to end on real and synthetic models: 32 requests of random lengths run
// concurrently with small chunks and a KV budget small enough to force preemption give token
// for token what each gives alone (greedy and seeded sampling; f32 and f16 KV); every block is
// free afterwards. Plus the request paths: validation errors, truncation, stop strings, cancel,
// and shutdown with requests in flight.
#include "engine/engine.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <optional>

#include "../test_util.h"
#include "base/rng.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "grammar/compiler.h"
#include "runner/generate.h"
#include "model/synth.h"

namespace gale {
namespace {

using TestModel = test::LoadedModel;

TestModel Stories() {
  TestModel m;
  m.file = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  m.model = LoadModel(*m.file).value();
  m.tok = Tokenizer::FromGguf(*m.file).value();
  return m;
}

TestModel Synthetic(GgmlType type = GgmlType::kQ8_0, const std::string& arch = "llama") {
  return test::SynthModel(test::ArchTestShape(arch), type);
}

// The default model with a per-channel key transform in its metadata (random: attention's
// output does not depend on it, only how well int8/int4 keys keep it).
TestModel StoriesWithKeyChannels() {
  const TestModel s = Stories();
  GgufWriter w;
  for (const auto& [key, value] : s.file->metadata()) w.SetValue(key, value);
  KeyChannels kc;
  Rng rng(5);
  for (int64_t i = 0; i < s.model->hparams().num_layers * s.model->hparams().kv_dim(); ++i) {
    kc.shift.push_back(rng.Uniform(-3.0f, 3.0f));
    kc.scale.push_back(rng.Uniform(0.5f, 2.0f));
  }
  w.SetValue(kKeyShiftKey, GgufValue::F32Array(kc.shift));
  w.SetValue(kKeyScaleKey, GgufValue::F32Array(kc.scale));
  for (const GgufTensorInfo& t : s.file->tensors()) {
    EXPECT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
  }
  TestModel m;
  m.file = GgufFile::FromBytes(w.WriteToBytes()).value();
  m.model = LoadModel(*m.file).value();
  m.tok = Tokenizer::FromGguf(*m.file).value();
  return m;
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  Status status;
  int64_t num_prompt_tokens = 0, num_truncated_tokens = 0;
  std::vector<TokenLogprobs> logprobs;  // when the request asked for them
  std::vector<TokenLogprobs> prompt_logprobs;
  std::string stop_string;
};

Result Collect(RequestStream& s) {
  Result r;
  StreamUpdate u;
  while (s.Next(&u)) {
    r.tokens.insert(r.tokens.end(), u.token_ids.begin(), u.token_ids.end());
    r.logprobs.insert(r.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    r.prompt_logprobs.insert(r.prompt_logprobs.end(), u.prompt_logprobs.begin(), u.prompt_logprobs.end());
    r.text += u.text;
    r.num_prompt_tokens = u.num_prompt_tokens;
    r.num_truncated_tokens = u.num_truncated_tokens;
    if (u.finished) {
      r.reason = u.finish_reason;
      r.status = u.status;
      r.stop_string = u.stop_string;
    }
  }
  return r;
}

std::vector<GenerationRequest> RandomRequests(const TestModel& m, int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<GenerationRequest> reqs;
  const int32_t vocab = static_cast<int32_t>(m.model->hparams().vocab_size);
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.prompt.push_back(m.tok->bos_id());
    const int64_t len = 1 + static_cast<int64_t>(rng.NextU64() % 60);
    for (int64_t j = 0; j < len; ++j) r.prompt.push_back(3 + static_cast<int32_t>(rng.NextU64() % (vocab - 3)));
    r.max_tokens = 1 + static_cast<int64_t>(rng.NextU64() % 40);
    if (i % 2 == 0) {
      r.sampling.temperature = 0.0f;
    } else {
      r.sampling.temperature = 0.9f;
      r.sampling.seed = 1000 + i;
    }
    r.stop_ids = {m.tok->eos_id()};
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Runs each request alone through an engine with max_batch_size 1, no prefix cache, and every
// layer keeping every block (no windowed layer groups).
std::vector<Result> RunAlone(const TestModel& m, const std::vector<GenerationRequest>& reqs, kernels::KvType type,
                             std::optional<kernels::KvType> v_type = std::nullopt) {
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.sched.max_batch_size = 1;
  cfg.enable_prefix_caching = false;
  cfg.kv_window_groups = false;
  cfg.kv_cache_memory_bytes = 64ull << 20;
  cfg.kv_type = type;
  cfg.v_kv_type = v_type;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  std::vector<Result> out;
  for (const auto& r : reqs) {
    auto s = (*engine)->Submit(r);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    out.push_back(Collect(**s));
  }
  return out;
}

struct SpecCounts {
  int64_t guessed = 0, accepted = 0;
  int64_t rollbacks = 0;  // recurrent states taken back to before rejected guesses
};

// Returns the speculative decoding counters (zero when spec is off).
SpecCounts ExpectConcurrentEqualsAlone(const TestModel& m, kernels::KvType type, bool shared_prefixes = false,
                                       const SpecConfig& spec = {},
                                       std::optional<kernels::KvType> v_type = std::nullopt,
                                       std::shared_ptr<const grammar::CompiledGrammar> grammar = nullptr) {
  auto reqs = RandomRequests(m, 32, 42);
  for (auto& r : reqs) r.grammar = grammar;
  if (shared_prefixes) {
    // System-prompt-like prefixes of 9 to 45 tokens in front of every prompt.
    Rng rng(7);
    std::vector<std::vector<int32_t>> prefixes(3);
    const int32_t vocab = static_cast<int32_t>(m.model->hparams().vocab_size);
    for (auto& p : prefixes) {
      const int64_t len = 9 + static_cast<int64_t>(rng.NextU64() % 37);
      for (int64_t i = 0; i < len; ++i) p.push_back(3 + static_cast<int32_t>(rng.NextU64() % (vocab - 3)));
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      const auto& p = prefixes[i % prefixes.size()];
      reqs[i].prompt.insert(reqs[i].prompt.begin() + 1, p.begin(), p.end());
      reqs[i].prompt.resize(std::min<size_t>(reqs[i].prompt.size(), 100));
    }
  }
  const std::vector<Result> alone = RunAlone(m, reqs, type, v_type);
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.sched.max_batch_size = 32;
  cfg.sched.max_num_batched_tokens = 24;
  cfg.sched.prefill_chunk_size = 7;
  cfg.block_size = 4;
  const auto& hp = m.model->hparams();
  // 40 blocks = 160 tokens: the longest request (100 + 40) fits alone, 32 at once cannot. With
  // sliding-window layer groups a block holds fewer layers, and a request holds a full group's
  // blocks plus each windowed group's window: as many blocks as the longest needs, at least 40;
  // with windows on every layer (no full group) twice the longest's.
  const KvLayerGroups groups = cfg.KvGroups(m.model->kv_layout());
  const int64_t longest = KvCacheManager::PeakBlocks(groups.window, cfg.block_size, 140, cfg.sched.max_num_batched_tokens);
  const int64_t num_blocks = groups.window[0] > 0 ? 2 * longest : std::max<int64_t>(40, longest);
  cfg.kv_cache_memory_bytes =
      num_blocks * KvStorage::BytesPerBlock(groups.layers_per_block, hp.num_kv_heads, hp.head_dim, cfg.block_size, type,
                                            v_type.value_or(type), hp.kv_latent, hp.value_head());
  cfg.kv_type = type;
  cfg.v_kv_type = v_type;
  cfg.enable_prefix_caching = shared_prefixes;
  cfg.spec = spec;
  const int64_t state_floats = m.model->kv_layout().state_floats;
  if (state_floats > 0) {
    // Recurrent layers (qwen35): a state per running request, one per guess for up to four verifying
    // requests, and 12 checkpoints for the prefix cache (fewer than the prefixes' block
    // boundaries: some are reused).
    cfg.state_checkpoints = shared_prefixes ? 12 : 0;
    const int64_t snapshots = spec.method != SpecMethod::kOff ? 4 * spec.num_tokens : 0;
    const int64_t slots = cfg.sched.max_batch_size + snapshots + cfg.state_checkpoints;
    cfg.kv_cache_memory_bytes += static_cast<uint64_t>(slots * state_floats) * sizeof(float);
  }
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return {};
  EXPECT_EQ((*engine)->num_blocks(), num_blocks);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& r : reqs) {
    auto s = (*engine)->Submit(r);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return {};
    streams.push_back(*s);
  }
  int64_t num_generated = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Result got = Collect(*streams[i]);
    EXPECT_EQ(got.tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(got.text, alone[i].text) << "request " << i;
    EXPECT_EQ(got.reason, alone[i].reason) << "request " << i;
    EXPECT_TRUE(got.reason == FinishReason::kLength || got.reason == FinishReason::kEos ||
                (grammar && got.reason == FinishReason::kStop));
    num_generated += static_cast<int64_t>(got.tokens.size());
  }
  const EngineStats& st = (*engine)->stats();
  EXPECT_GT(st.num_preemptions.load(), 0) << "the KV budget should have forced preemption";
  EXPECT_EQ(st.num_free_blocks.load(), num_blocks) << "every block is free after all requests finish";
  // Windows of 8 bind in every request: windowed groups gave blocks back while requests ran.
  if (groups.window.back() > 0) {
    EXPECT_GT(st.window_released_blocks.load(), 0);
  }
  EXPECT_EQ(st.num_generated_tokens.load(), num_generated);
  if (state_floats > 0) {
    EXPECT_EQ(st.num_free_state_slots.load(), (*engine)->num_working_state_slots()) << "every state slot is free";
    if (shared_prefixes) {
      EXPECT_GT(st.state_checkpoints_saved.load(), 0);
    }
  }
  std::printf("%s: %lld steps, %lld preemptions, most blocks in use %lld of %lld (%lld given back behind windows), "
              "prefix-cache hit tokens %lld\n",
              kernels::KvTypeName(type), static_cast<long long>(st.num_steps.load()),
              static_cast<long long>(st.num_preemptions.load()), static_cast<long long>(st.max_used_blocks.load()),
              static_cast<long long>(num_blocks), static_cast<long long>(st.window_released_blocks.load()),
              static_cast<long long>(st.prefix_cache_hit_tokens.load()));
  if (shared_prefixes) {
    // With a window on every layer (mistral) only the blocks still inside a window can be shared,
    // and how many are depends on how the engine's steps interleave with the submissions:
    // measured 72 to a few hundred under load. Elsewhere 900 and more.
    EXPECT_GT(st.prefix_cache_hit_tokens.load(), groups.window[0] > 0 ? 0 : 200);
  }
  if (spec.method != SpecMethod::kOff) std::printf("%s\n", (*engine)->DescribeSpec().c_str());
  return {st.spec_num_draft_tokens.load(), st.spec_num_accepted_tokens.load(), st.spec_state_rollbacks.load()};
}

// Prompts sharing system-prompt prefixes, the prefix cache on, memory tight: each request still
// gets exactly what it gets alone with no cache, and every block is free afterwards.
TEST(EngineTest, PrefixCacheKeepsOutputsExact) {
  const TestModel m = Stories();
  ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32, /*shared_prefixes=*/true);
  const TestModel s = Synthetic();
  ExpectConcurrentEqualsAlone(s, kernels::KvType::kF16, /*shared_prefixes=*/true);
}

TEST(EngineTest, ConcurrentEqualsAloneOnStories260K) {
  const TestModel m = Stories();
  ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32);
}

TEST(EngineTest, ConcurrentEqualsAloneOnSyntheticQ8_0WithF16Kv) {
  const TestModel m = Synthetic();
  ExpectConcurrentEqualsAlone(m, kernels::KvType::kF16);
}

// The exactness workload on each architecture (llama's is above): concurrent = alone, with
// chunked prefill, preemption and the prefix cache; every block free afterwards. gemma3's windows
// (8 positions) bind in every request: a cached prefix and a recomputation after preemption give
// the same windows as a fresh run. The mixtures (qwen3moe, Mixtral-style llama, deepseek2, glm4moe): a
// token's experts' products do not depend on which other tokens of the step share its experts;
// deepseek2's latent rows page, cache and recompute like K and V; llama-v16's V rows are half
// the width of its K rows; deepseek4's windows (8), compressor state and packed compressed rows
// (ratio 4 with the indexer's top 3, ratio 128 in the longer requests) page, cache and recompute;
// deepseek41's shared rows, index keys and Engram's token history too.
TEST(EngineTest, ConcurrentEqualsAloneOnEachArchitecture) {
  for (const char* arch : {"qwen2", "qwen3", "phi3", "gemma2", "gemma3", "mistral", "qwen3moe", "mixtral", "deepseek2",
                           "glm4moe", "gpt-oss", "llama-v16", "deepseek4", "deepseek41"}) {
    SCOPED_TRACE(arch);
    const TestModel m = Synthetic(GgmlType::kQ8_0, arch);
    ExpectConcurrentEqualsAlone(m, kernels::KvType::kF16, /*shared_prefixes=*/true);
    const TestModel f = Synthetic(GgmlType::kF32, arch);
    ExpectConcurrentEqualsAlone(f, kernels::KvType::kF32);
  }
  // deepseek4 with speculation: the rows a rejected guess wrote (raw, compressor state, a packed
  // compressed row it completed) are written again by the token accepted at its position.
  SpecConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.always = true;
  const SpecCounts c = ExpectConcurrentEqualsAlone(Synthetic(GgmlType::kQ8_0, "deepseek4"), kernels::KvType::kBF16,
                                                   /*shared_prefixes=*/true, ngram);
  EXPECT_GT(c.guessed, 0);
  const SpecCounts c41 = ExpectConcurrentEqualsAlone(Synthetic(GgmlType::kQ8_0, "deepseek41"), kernels::KvType::kBF16,
                                                     /*shared_prefixes=*/true, ngram);
  EXPECT_GT(c41.guessed, 0);
}

// Hybrid models (qwen35, qwen35moe: Gated DeltaNet layers keeping a recurrent state per
// sequence, and full attention): alone = batched = chunked = preempted = cached = speculated,
// token for token, every block and state slot free afterwards. A cache hit resumes from the state
// checkpointed at the hit's end; a verification whose guesses were rejected goes on from the
// state kept after its last accepted token.
TEST(EngineTest, HybridRecurrentModelsKeepOutputsExact) {
  for (const char* arch : {"qwen35", "qwen35moe"}) {
    SCOPED_TRACE(arch);
    ExpectConcurrentEqualsAlone(Synthetic(GgmlType::kQ8_0, arch), kernels::KvType::kF16, /*shared_prefixes=*/true);
    ExpectConcurrentEqualsAlone(Synthetic(GgmlType::kF32, arch), kernels::KvType::kF32);
  }
  const TestModel m = Synthetic(GgmlType::kQ8_0, "qwen35");
  SpecConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.num_tokens = 4;
  ngram.always = true;
  SpecCounts c = ExpectConcurrentEqualsAlone(m, kernels::KvType::kF16, /*shared_prefixes=*/true, ngram);
  EXPECT_GT(c.guessed, 20);  // few: the random model's outputs rarely repeat (accepted: Qwen35Test)
  EXPECT_GT(c.rollbacks, 0);
  // A draft model of attention layers only, sharing the vocabulary: most guesses rejected.
  auto file = GgufFile::FromBytes(
      SynthesizeModel(test::TinyDraftShape(m.model->hparams().vocab_size), GgmlType::kF32, 5)->WriteToBytes()).value();
  auto draft = LoadModel(*file).value();
  SpecConfig d;
  d.method = SpecMethod::kDraft;
  d.num_tokens = 3;
  d.always = true;
  d.draft = draft.get();
  c = ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32, /*shared_prefixes=*/false, d);
  EXPECT_GT(c.rollbacks, 50);
  // A draft with recurrent layers cannot step back: refused.
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 64ull << 20;
  cfg.spec = d;
  cfg.spec.draft = m.model.get();
  EXPECT_EQ(Engine::Create(*m.model, m.tok.get(), cfg, pool).status().code(), StatusCode::kUnimplemented);
}

// KV memory one request holds at its peak: one prompt of prompt_len (chunks of 512), then 16
// tokens, scheduled as the engine does (its cache accounting, no forward), in blocks of 16.
uint64_t PeakKvBytes(const KvLayerGroups& groups, int64_t num_kv_heads, int64_t head_dim, int64_t prompt_len) {
  KvCacheManager kv(1 << 16, 16, /*enable_prefix_caching=*/true, groups.window);
  Scheduler sched(SchedulerConfig{}, &kv);
  auto r = std::make_unique<SeqRequest>();
  r->id = 1;
  r->tokens.assign(prompt_len, 7);
  r->max_new_tokens = 16;
  EXPECT_TRUE(sched.Add(std::move(r)).ok());
  int64_t peak = 0;
  while (sched.HasWork()) {
    const StepPlan plan = sched.Schedule();
    EXPECT_FALSE(plan.empty());
    if (plan.empty()) break;
    peak = std::max(peak, kv.HeldBlocks(1));
    RunnerOutput out;
    for (const auto& seq : plan.seqs) out.tokens.push_back(seq.sample ? std::vector<int32_t>{8} : std::vector<int32_t>{});
    sched.Update(plan, out);
  }
  EXPECT_EQ(kv.num_free_blocks(), 1 << 16);
  return static_cast<uint64_t>(peak) *
         KvStorage::BytesPerBlock(groups.layers_per_block, num_kv_heads, head_dim, 16, kernels::KvType::kF16);
}

// Gemma 3's layer pattern (26 layers, every sixth global) with windows of 64: a 1024-token
// prompt gives the same tokens with windowed layer groups (blocks behind the windows go back to
// the pool as the prompt's chunks advance) as with every block kept, in a fraction of the memory.
// Then the gemma3-1b shape (1 KV head of 256, windows of 512, f16) at 8K context, as the engine
// schedules it: the KV one sequence holds with and without window groups.
TEST(EngineTest, WindowedLayerGroupsHoldAFractionOfTheKv) {
  SynthShape shape = test::ArchTestShape("gemma3");
  shape.num_layers = 26;
  shape.sliding_window = 64;
  shape.context_length = 2048;
  TestModel m;
  const auto bytes = SynthesizeModel(shape, GgmlType::kQ8_0, 11)->WriteToBytes();
  m.file = GgufFile::FromBytes(bytes).value();
  m.model = LoadModel(*m.file).value();
  m.tok = Tokenizer::FromGguf(*m.file).value();
  const auto& hp = m.model->hparams();
  GenerationRequest req;
  Rng rng(3);
  req.prompt.push_back(m.tok->bos_id());
  for (int i = 1; i < 1024; ++i) req.prompt.push_back(3 + static_cast<int32_t>(rng.NextU64() % 2000));
  req.max_tokens = 8;
  req.sampling.temperature = 0.0f;
  std::vector<int32_t> tokens[2];
  uint64_t held[2];
  for (int grouped = 0; grouped < 2; ++grouped) {
    ThreadPool pool(2);
    EngineConfig cfg;
    cfg.sched.max_batch_size = 1;
    cfg.sched.prefill_chunk_size = 64;
    cfg.sched.max_num_batched_tokens = 64;
    cfg.kv_cache_memory_bytes = 64ull << 20;
    cfg.kv_window_groups = grouped == 1;
    auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    auto stream = (*engine)->Submit(req);
    ASSERT_TRUE(stream.ok());
    const Result got = Collect(**stream);
    ASSERT_TRUE(got.status.ok()) << got.status.ToString();
    tokens[grouped] = got.tokens;
    const KvLayerGroups groups = cfg.KvGroups(m.model->kv_layout());
    held[grouped] = (*engine)->stats().max_used_blocks.load() *
                    KvStorage::BytesPerBlock(groups.layers_per_block, hp.num_kv_heads, hp.head_dim, cfg.block_size,
                                             cfg.kv_type);
    EXPECT_EQ((*engine)->stats().num_free_blocks.load(), (*engine)->num_blocks());
    if (grouped == 1) std::printf("%s\n", (*engine)->Describe().c_str());
  }
  EXPECT_EQ(tokens[1], tokens[0]);
  // Every block: 26 layers x 1032 positions. Groups: 4 global layers x 1032, and 24 windowed
  // slots x at most (63 + 64) / 16 + 1 = 8 blocks (a window and a step).
  std::printf("1024-token prompt, windows of 64: %.2f MiB held with every block, %.2f MiB with window groups (%.2fx)\n",
              held[0] / 1048576.0, held[1] / 1048576.0, static_cast<double>(held[0]) / held[1]);
  EXPECT_GT(static_cast<double>(held[0]) / held[1], 3.0);

  std::vector<int64_t> windows(26, 512);
  for (int64_t l = 5; l < 26; l += 6) windows[l] = 0;
  const uint64_t all = PeakKvBytes(KvLayerGroups::Single(26), 1, 256, 8192);
  const uint64_t grouped = PeakKvBytes(KvLayerGroups::ForWindows(windows), 1, 256, 8192);
  std::printf("gemma3-1b shape, 8K prompt + 16 tokens, f16: %.1f MB per sequence with every block, %.1f MB with "
              "window groups (%.2fx)\n", all / 1e6, grouped / 1e6, static_cast<double>(all) / grouped);
  EXPECT_EQ(all, uint64_t{26} * 8208 / 16 * 16 * 2 * 256 * 2);  // 26 layers x 513 blocks x K and V
  EXPECT_GT(static_cast<double>(all) / grouped, 3.5);
}

// Speculative decoding changes no output, greedy or seeded: every request of the exactness
// workload (small chunks, preemption, prefix cache) gives what it gives alone without it.
TEST(EngineTest, SpeculativeDecodingKeepsOutputsExact) {
  const TestModel m = Stories();
  SpecConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.num_tokens = 4;
  ngram.always = true;  // guess every step: the point is to verify many guesses
  SpecCounts a = ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32, /*shared_prefixes=*/true, ngram);
  SpecCounts b = ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32, /*shared_prefixes=*/false, ngram);
  EXPECT_GT(a.accepted + b.accepted, 10);
  EXPECT_GT(a.guessed + b.guessed - a.accepted - b.accepted, 100);
  // With windowed layer groups (gemma3's windows of 8): rejected guesses' slots are trimmed from
  // tables whose heads the windows gave back.
  const TestModel g = Synthetic(GgmlType::kF32, "gemma3");
  const SpecCounts w = ExpectConcurrentEqualsAlone(g, kernels::KvType::kF32, /*shared_prefixes=*/true, ngram);
  EXPECT_GT(w.guessed, 100);
  // The model as its own draft: greedy guesses all accepted, sampled ones often not.
  SpecConfig d;
  d.method = SpecMethod::kDraft;
  d.num_tokens = 3;
  d.always = true;
  d.draft = m.model.get();
  a = ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32, /*shared_prefixes=*/true, d);
  EXPECT_GT(a.accepted, 200);
  EXPECT_GT(a.guessed - a.accepted, 50);
  // A draft that shares only the vocabulary: almost every guess rejected.
  const auto bytes = SynthesizeModel(test::TinyDraftShape(m.model->hparams().vocab_size), GgmlType::kF32, 5)->WriteToBytes();
  auto file = GgufFile::FromBytes(bytes).value();
  auto unrelated = LoadModel(*file).value();
  d.draft = unrelated.get();
  a = ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32, /*shared_prefixes=*/false, d);
  EXPECT_GT(a.guessed - a.accepted, 200);
  // A Q4_0 copy of a Q8_0 model (f16 KV, GQA) as its draft.
  const TestModel target = Synthetic(GgmlType::kQ8_0), copy = Synthetic(GgmlType::kQ4_0);
  d.draft = copy.model.get();
  d.num_tokens = 5;
  a = ExpectConcurrentEqualsAlone(target, kernels::KvType::kF16, /*shared_prefixes=*/false, d);
  EXPECT_GT(a.accepted, 20);
}

// Grammar-constrained requests under the exactness workload (preemption, chunked prefill, prefix
// caching, speculative guesses cut by the grammar): each gets what it gets alone. Outputs that
// finish are JSON with the schema's fields.
TEST(EngineTest, GrammarConstrainedOutputsAreExactAndValid) {
  const TestModel m = Stories();
  grammar::GrammarCompiler compiler(MakeTokenTrie(*m.tok));
  const char* schema = R"({"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]},
      "count": {"type": "integer", "minimum": 0, "maximum": 20}, "ok": {"type": "boolean"}},
      "required": ["mood", "count", "ok"]})";
  auto g = compiler.Compile({grammar::Constraint::Kind::kJsonSchema, schema, ""});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32, /*shared_prefixes=*/true, {}, std::nullopt, *g);
  SpecConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.num_tokens = 4;
  ngram.always = true;
  ExpectConcurrentEqualsAlone(m, kernels::KvType::kF32, /*shared_prefixes=*/false, ngram, std::nullopt, *g);

  auto reqs = RandomRequests(m, 12, 9);
  for (auto& r : reqs) {
    r.grammar = *g;
    r.max_tokens = 400;
  }
  const std::vector<Result> out = RunAlone(m, reqs, kernels::KvType::kF32);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(out[i].reason == FinishReason::kStop || out[i].reason == FinishReason::kEos) << i << ": " << out[i].text;
    const auto j = nlohmann::json::parse(out[i].text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << out[i].text;
    EXPECT_TRUE(j["mood"] == "happy" || j["mood"] == "sad") << out[i].text;
    EXPECT_TRUE(j["count"].is_number_integer() && j["count"] >= 0 && j["count"] <= 20) << out[i].text;
    EXPECT_TRUE(j["ok"].is_boolean()) << out[i].text;
  }
}

// A grammar no token can follow (the vocabulary cannot spell it) ends its request with an error
// naming it; the engine carries on.
TEST(EngineTest, AGrammarTheVocabularyCannotFollowFailsOnlyItsRequest) {
  const TestModel m = Stories();
  grammar::GrammarCompiler compiler(MakeTokenTrie(*m.tok));
  // After "a", an empty class: nothing can follow, and the grammar cannot end either.
  auto g = compiler.Compile({grammar::Constraint::Kind::kGbnf, "root ::= \"a\" []", ""});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
  GenerationRequest bad = RandomRequests(m, 1, 3)[0];
  bad.grammar = *g;
  bad.max_tokens = 10;
  GenerationRequest fine = RandomRequests(m, 1, 4)[0];
  auto a = engine->Submit(bad).value();
  auto b = engine->Submit(fine).value();
  const Result ra = Collect(*a), rb = Collect(*b);
  EXPECT_EQ(ra.reason, FinishReason::kError);
  EXPECT_NE(ra.status.message().find("no token"), std::string::npos) << ra.status.ToString();
  EXPECT_EQ(ra.text, "a");
  EXPECT_NE(rb.reason, FinishReason::kError);
  EXPECT_EQ(engine->stats().num_free_blocks.load(), engine->num_blocks());
}

// The pooled, normalized final-norm output of a whole prompt in one forward pass.
std::vector<float> DirectEmbedding(const TestModel& m, const std::vector<int32_t>& prompt, Pooling pooling) {
  ThreadPool pool(1);
  KvCache cache(m.model->hparams(), static_cast<int64_t>(prompt.size()) + 16);
  ForwardBatch b;
  b.tokens = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) {
    b.positions.push_back(static_cast<int32_t>(i));
    b.hidden_rows.push_back(static_cast<int32_t>(i));
  }
  Workspace ws;
  EXPECT_TRUE(m.model->Forward(b, cache, ws, pool).ok());
  const int64_t dim = m.model->hparams().dim, n = static_cast<int64_t>(prompt.size());
  std::vector<double> v(dim, 0.0);
  for (int64_t t = 0; t < n; ++t) {
    if ((pooling == Pooling::kCls && t != 0) || (pooling == Pooling::kLast && t != n - 1)) continue;
    for (int64_t d = 0; d < dim; ++d) v[d] += ws.hidden[t * dim + d];
  }
  double norm = 0.0;
  for (double& x : v) {
    if (pooling == Pooling::kMean) x /= static_cast<double>(n);
    norm += x * x;
  }
  std::vector<float> out(dim);
  for (int64_t d = 0; d < dim; ++d) out[d] = static_cast<float>(v[d] / std::sqrt(norm));
  return out;
}

// Embedding requests among generating ones, with chunked prefill, preemption and the prefix cache
// on: each gets the pooled hidden states of its whole prompt computed in one pass (to float
// rounding of the pooling sums: the same rows, the same order), and the generating requests get
// what they get alone.
TEST(EngineTest, EmbeddingRequestsPoolTheirPromptExactly) {
  const TestModel m = Stories();
  auto reqs = RandomRequests(m, 24, 17);
  const std::vector<Result> alone = RunAlone(m, reqs, kernels::KvType::kF32);
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.sched.max_num_batched_tokens = 24;
  cfg.sched.prefill_chunk_size = 7;
  cfg.block_size = 4;
  const auto& hp = m.model->hparams();
  cfg.kv_cache_memory_bytes = 40 * KvStorage::BytesPerBlock(hp.num_layers, hp.num_kv_heads, hp.head_dim, cfg.block_size,
                                                            kernels::KvType::kF32, kernels::KvType::kF32);
  cfg.kv_type = kernels::KvType::kF32;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
  std::vector<std::shared_ptr<RequestStream>> gens, embeds;
  std::vector<GenerationRequest> embed_reqs;
  for (size_t i = 0; i < reqs.size(); ++i) {
    gens.push_back(engine->Submit(reqs[i]).value());
    GenerationRequest e;
    e.prompt = reqs[i].prompt;
    e.pooling = i % 3 == 0 ? Pooling::kMean : i % 3 == 1 ? Pooling::kCls : Pooling::kLast;
    embed_reqs.push_back(e);
    embeds.push_back(engine->Submit(e).value());
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Result g = Collect(*gens[i]);
    EXPECT_EQ(g.tokens, alone[i].tokens) << i;
    StreamUpdate u, last;
    std::string text;
    while (embeds[i]->Next(&u)) {
      text += u.text;
      if (u.finished) last = u;
    }
    EXPECT_EQ(last.finish_reason, FinishReason::kStop) << last.status.ToString();
    EXPECT_TRUE(text.empty());
    const std::vector<float> want = DirectEmbedding(m, embed_reqs[i].prompt, embed_reqs[i].pooling);
    ASSERT_EQ(last.embedding.size(), want.size());
    double norm = 0.0;
    for (size_t d = 0; d < want.size(); ++d) {
      EXPECT_NEAR(last.embedding[d], want[d], 1e-6) << "request " << i << " dim " << d;
      norm += last.embedding[d] * last.embedding[d];
    }
    EXPECT_NEAR(norm, 1.0, 1e-5);
  }
  EXPECT_GT(engine->stats().num_preemptions.load(), 0);
  EXPECT_EQ(engine->stats().num_free_blocks.load(), 40);
  GenerationRequest bad;
  bad.prompt = reqs[0].prompt;
  bad.pooling = Pooling::kMean;
  bad.top_logprobs = 2;
  EXPECT_FALSE(engine->Submit(bad).ok());
}

// Quantized KV (int8, int4) under the exactness workload: preemption, prefix sharing and
// speculative decoding change no output (every write of a position quantizes the same values the
// same way), and every block is free afterwards.
TEST(EngineTest, QuantizedKvKeepsOutputsExact) {
  const TestModel m = Stories();
  ExpectConcurrentEqualsAlone(m, kernels::KvType::kInt8, /*shared_prefixes=*/true);
  SpecConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.always = true;
  ExpectConcurrentEqualsAlone(m, kernels::KvType::kInt4, /*shared_prefixes=*/false, ngram);
  const TestModel s = Synthetic();
  ExpectConcurrentEqualsAlone(s, kernels::KvType::kInt8, /*shared_prefixes=*/false);
  ExpectConcurrentEqualsAlone(s, kernels::KvType::kInt4, /*shared_prefixes=*/true);
  ExpectConcurrentEqualsAlone(s, kernels::KvType::kInt8, /*shared_prefixes=*/true, {}, kernels::KvType::kInt4);
  // deepseek2's latent rows quantized (int8, int4; one scale per row), with speculation.
  const TestModel d = Synthetic(GgmlType::kQ8_0, "deepseek2");
  ExpectConcurrentEqualsAlone(d, kernels::KvType::kInt8, /*shared_prefixes=*/true, ngram);
  ExpectConcurrentEqualsAlone(d, kernels::KvType::kInt4, /*shared_prefixes=*/true);
}

// Keys stored in the model's per-channel form: the same workload stays exact (the transform is
// per token, fixed), and the engine says it uses it only for quantized keys unless told.
TEST(EngineTest, KeyChannelsKeepOutputsExact) {
  const TestModel m = StoriesWithKeyChannels();
  SpecConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.always = true;
  ExpectConcurrentEqualsAlone(m, kernels::KvType::kInt4, /*shared_prefixes=*/true, ngram);
  ThreadPool pool(1);
  auto active = [&](kernels::KvType k, std::optional<bool> on) {
    EngineConfig cfg;
    cfg.kv_type = k;
    cfg.key_channels = on;
    cfg.kv_cache_memory_bytes = 1 << 20;
    auto e = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
    EXPECT_EQ(e->Describe().find("keys per channel") != std::string::npos, e->key_channels_active());
    return e->key_channels_active();
  };
  EXPECT_TRUE(active(kernels::KvType::kInt8, std::nullopt));
  EXPECT_FALSE(active(kernels::KvType::kF16, std::nullopt));
  EXPECT_TRUE(active(kernels::KvType::kF16, true));
  EXPECT_FALSE(active(kernels::KvType::kInt4, false));
}

TEST(EngineTest, SpeculativeDecodingRejectsBadSettings) {
  const TestModel m = Stories();
  ThreadPool pool(1);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 1 << 20;
  cfg.spec.method = SpecMethod::kDraft;
  EXPECT_NE(Engine::Create(*m.model, m.tok.get(), cfg, pool).status().message().find("--draft-model"), std::string::npos);
  const TestModel other = Synthetic();  // vocabulary of 2048, not 512
  cfg.spec.draft = other.model.get();
  EXPECT_NE(Engine::Create(*m.model, m.tok.get(), cfg, pool).status().message().find("vocabulary"), std::string::npos);
  cfg.spec.method = SpecMethod::kNgram;
  cfg.spec.num_tokens = 0;
  EXPECT_FALSE(Engine::Create(*m.model, m.tok.get(), cfg, pool).ok());
  EXPECT_FALSE(ParseSpecMethod("eagle").ok());
}

// The engine gives what the single-sequence Generate loop gives (greedy, stories260K).
TEST(EngineTest, MatchesTheGenerateLoop) {
  const TestModel m = Stories();
  ThreadPool pool(2);
  const std::vector<int32_t> prompt = m.tok->Encode("Once upon a time");
  GenerateOptions go;
  go.max_new_tokens = 50;
  go.sampling.temperature = 0.0f;
  KvCache kv(m.model->hparams(), 128);
  Workspace ws;
  std::vector<int32_t> want;
  ASSERT_TRUE(Generate(*m.model, prompt, go, kv, ws, pool, [&](int32_t id) {
                want.push_back(id);
                return true;
              }).ok());
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt = prompt;
  r.max_tokens = 50;
  r.sampling.temperature = 0.0f;
  EXPECT_EQ(Collect(**(*engine)->Submit(r)).tokens, want);
}

// Log-probabilities of the raw model distribution: greedy picks the most likely token, so its
// logprob is the first alternative's; alternatives come most likely first; all are <= 0; and the
// probabilities of all tokens sum to 1 (checked through the full top list).
TEST(EngineTest, ReportsLogprobs) {
  const TestModel m = Stories();
  ThreadPool pool(1);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt = m.tok->Encode("Once upon a time");
  r.max_tokens = 6;
  r.sampling.temperature = 0.0f;
  r.top_logprobs = static_cast<int>(m.model->hparams().vocab_size);
  EXPECT_FALSE((*engine)->Submit(r).ok());  // more than 20 alternatives
  r.top_logprobs = 20;
  auto s = (*engine)->Submit(r);
  ASSERT_TRUE(s.ok());
  const Result got = Collect(**s);
  const std::vector<int32_t>& ids = got.tokens;
  const std::vector<TokenLogprobs>& lps = got.logprobs;
  ASSERT_EQ(ids.size(), 6u);
  ASSERT_EQ(lps.size(), 6u);
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(lps[i].top.size(), 20u);
    EXPECT_EQ(lps[i].top[0].first, ids[i]);
    EXPECT_FLOAT_EQ(lps[i].top[0].second, lps[i].logprob);
    double mass = 0.0;
    for (size_t k = 0; k < lps[i].top.size(); ++k) {
      EXPECT_LE(lps[i].top[k].second, 0.0f);
      if (k > 0) {
        EXPECT_LE(lps[i].top[k].second, lps[i].top[k - 1].second);
      }
      mass += std::exp(lps[i].top[k].second);
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
    EXPECT_GT(mass, 0.3);  // a small model is confident in its top 20
  }
  // Without asking, none are sent.
  r.top_logprobs = -1;
  auto plain = (*engine)->Submit(r);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(Collect(**plain).logprobs.empty());
}

TEST(EngineTest, RejectsBadRequestsWithClearErrors) {
  const TestModel m = Stories();
  ThreadPool pool(1);
  EngineConfig cfg;
  cfg.sched.max_seq_len = 64;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  EXPECT_EQ(e.max_request_tokens(), 64);
  GenerationRequest r;
  EXPECT_NE(e.Submit(r).status().message().find("no tokens"), std::string::npos);
  r.prompt = {1, 100000};
  EXPECT_NE(e.Submit(r).status().message().find("outside the vocabulary"), std::string::npos);
  r.prompt.assign(60, 5);
  r.max_tokens = 10;
  const Status too_long = e.Submit(r).status();
  EXPECT_NE(too_long.message().find("exceeds the limit of 64"), std::string::npos) << too_long.ToString();
  r.max_tokens = 0;  // all that fits: 4 tokens
  auto fits = e.Submit(r);
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(Collect(**fits).tokens.size(), 4u);
  r.prompt.assign(64, 5);
  EXPECT_FALSE(e.Submit(r).ok());
  r.prompt = {1, 5};
  r.sampling.temperature = -1.0f;
  EXPECT_FALSE(e.Submit(r).ok());
  EngineConfig bad;
  bad.sched.max_batch_size = 0;
  EXPECT_FALSE(Engine::Create(*m.model, nullptr, bad, pool).ok());
  bad = EngineConfig();
  bad.kv_cache_memory_bytes = 10;  // less than one block
  const auto none = Engine::Create(*m.model, nullptr, bad, pool);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("holds no block"), std::string::npos);
}

TEST(EngineTest, TruncatesTheMiddleWhenAsked) {
  const TestModel m = Stories();
  ThreadPool pool(1);
  EngineConfig cfg;
  cfg.sched.max_seq_len = 32;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  for (int i = 0; i < 50; ++i) r.prompt.push_back(10 + i);
  r.max_tokens = 8;
  r.truncate = true;
  r.sampling.temperature = 0.0f;
  const Result got = Collect(**(*engine)->Submit(r));
  EXPECT_EQ(got.num_prompt_tokens, 24);
  EXPECT_EQ(got.num_truncated_tokens, 26);
  EXPECT_EQ(got.tokens.size(), 8u);
  // The same as submitting head + tail directly.
  GenerationRequest cut = r;
  cut.truncate = false;
  cut.prompt.assign(r.prompt.begin(), r.prompt.begin() + 12);
  cut.prompt.insert(cut.prompt.end(), r.prompt.end() - 12, r.prompt.end());
  EXPECT_EQ(Collect(**(*engine)->Submit(cut)).tokens, got.tokens);
}

// Updates the reader has not taken yet are merged: the final one's facts (the stop string, a
// request's own error, an embedding) survive the merge.
TEST(EngineTest, MergedUpdatesKeepTheFinalOnesFacts) {
  RequestStream s(1);
  StreamUpdate first;
  first.token_ids = {5};
  first.text = "a";
  s.Push(std::move(first));
  StreamUpdate last;
  last.token_ids = {6};
  last.text = "b";
  last.finished = true;
  last.finish_reason = FinishReason::kError;
  last.request_error = true;
  last.stop_string = "zz";
  last.embedding = {1.0f};
  s.Push(std::move(last));
  StreamUpdate u;
  ASSERT_TRUE(s.TryNext(&u));
  EXPECT_EQ(u.token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(u.text, "ab");
  EXPECT_TRUE(u.finished);
  EXPECT_TRUE(u.request_error);
  EXPECT_EQ(u.stop_string, "zz");
  EXPECT_EQ(u.embedding, std::vector<float>{1.0f});
}

TEST(EngineTest, StopStringsCutTheText) {
  const TestModel m = Stories();
  ThreadPool pool(1);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt = m.tok->Encode("Once upon a time");
  r.max_tokens = 60;
  r.sampling.temperature = 0.0f;
  const Result full = Collect(**(*engine)->Submit(r));
  ASSERT_GT(full.text.size(), 20u);
  // Stop at the first occurrence of a word in the middle of the full text.
  const size_t at = full.text.find(' ', 10);
  ASSERT_NE(at, std::string::npos);
  const std::string stop = full.text.substr(at, 4);
  r.stop = {"never-appears-here", stop};
  const Result cut = Collect(**(*engine)->Submit(r));
  EXPECT_EQ(cut.reason, FinishReason::kStop);
  EXPECT_EQ(cut.stop_string, stop);  // which one ended it (Anthropic's stop_sequence)
  EXPECT_EQ(full.stop_string, "");
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_LT(cut.tokens.size(), full.tokens.size());
  EXPECT_EQ(std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + cut.tokens.size()), cut.tokens);
}

// Several tokens per step (the model as its own draft: greedy guesses all accepted) stream the
// same log-probabilities, and a stop string met inside an accepted run cuts text and tokens
// where one-at-a-time decoding does.
TEST(EngineTest, SpeculativeDecodingKeepsLogprobsAndStopStrings) {
  const TestModel m = Stories();
  ThreadPool pool(1);
  auto run = [&](bool spec, const GenerationRequest& r, int64_t* accepted) {
    EngineConfig cfg;
    cfg.kv_cache_memory_bytes = 16ull << 20;
    if (spec) {
      cfg.spec.method = SpecMethod::kDraft;
      cfg.spec.draft = m.model.get();
      cfg.spec.num_tokens = 6;
      cfg.spec.always = true;
    }
    auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
    EXPECT_TRUE(engine.ok());
    auto s = (*engine)->Submit(r);
    EXPECT_TRUE(s.ok());
    const Result out = Collect(**s);
    *accepted = (*engine)->stats().spec_num_accepted_tokens.load();
    return out;
  };
  GenerationRequest r;
  r.prompt = m.tok->Encode("Once upon a time");
  r.max_tokens = 60;
  r.sampling.temperature = 0.0f;
  r.top_logprobs = 3;
  int64_t accepted = 0;
  const Result full = run(false, r, &accepted);
  const Result fast = run(true, r, &accepted);
  const std::vector<TokenLogprobs>& want_lp = full.logprobs;
  const std::vector<TokenLogprobs>& got_lp = fast.logprobs;
  EXPECT_GT(accepted, 40);
  EXPECT_EQ(fast.tokens, full.tokens);
  EXPECT_EQ(fast.text, full.text);
  ASSERT_EQ(got_lp.size(), want_lp.size());
  for (size_t i = 0; i < got_lp.size(); ++i) {
    EXPECT_EQ(got_lp[i].logprob, want_lp[i].logprob) << i;
    EXPECT_EQ(got_lp[i].top, want_lp[i].top) << i;
  }
  // Stops at a few places in the text, each inside some accepted run.
  r.top_logprobs = -1;
  for (size_t from : {12, 40, 90}) {
    const size_t at = full.text.find(' ', from);
    ASSERT_NE(at, std::string::npos);
    r.stop = {full.text.substr(at, 4)};
    const Result one = run(false, r, &accepted);
    const Result many = run(true, r, &accepted);
    EXPECT_EQ(many.reason, FinishReason::kStop);
    EXPECT_EQ(many.text, one.text);
    EXPECT_EQ(many.tokens, one.tokens);
  }
}

// Prompt log-probabilities (echo with logprobs): one per prompt token after the first, each the
// log-probability decoding gives that token at that place (bitwise: the same row of the same
// computation), whole even when the prompt is in the prefix cache or computed in small chunks,
// and not repeated when a preempted request computes its prompt again.
TEST(EngineTest, PromptLogprobsEqualDecodingsAndSurviveCachingAndPreemption) {
  const TestModel m = Stories();
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  cfg.sched.prefill_chunk_size = 7;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool).value();
  GenerationRequest g;
  g.prompt = m.tok->Encode("Once upon a time there was a little dog named Max who liked to run");
  g.max_tokens = 12;
  g.sampling.temperature = 0.0f;
  g.top_logprobs = 2;
  const Result decoded = Collect(*engine->Submit(g).value());
  ASSERT_EQ(decoded.logprobs.size(), 12u);
  GenerationRequest p = g;
  p.prompt.insert(p.prompt.end(), decoded.tokens.begin(), decoded.tokens.end() - 1);  // the 11 first
  p.max_tokens = 1;
  p.prompt_logprobs = 2;
  const size_t n0 = g.prompt.size();
  for (int run = 0; run < 2; ++run) {  // the second finds the whole prompt in the prefix cache
    const Result r = Collect(*engine->Submit(p).value());
    ASSERT_EQ(r.prompt_logprobs.size(), p.prompt.size() - 1) << "run " << run;
    for (size_t i = 0; i < 11; ++i) {
      EXPECT_EQ(r.prompt_logprobs[n0 - 1 + i].logprob, decoded.logprobs[i].logprob) << i;
      EXPECT_EQ(r.prompt_logprobs[n0 - 1 + i].top, decoded.logprobs[i].top) << i;
    }
    EXPECT_EQ(r.logprobs[0].logprob, decoded.logprobs[11].logprob);
  }
  EXPECT_EQ(engine->stats().num_free_blocks.load(), engine->num_blocks());

  // Under preemption (30 blocks of 4 tokens, 8 requests of ~30 prompt + 40 output tokens each):
  // the same entries, once each, for every request.
  EngineConfig tiny = cfg;
  tiny.block_size = 4;
  tiny.sched.max_num_batched_tokens = 24;
  const auto& hp = m.model->hparams();
  tiny.kv_cache_memory_bytes =
      30 * KvStorage::BytesPerBlock(hp.num_layers, hp.num_kv_heads, hp.head_dim, tiny.block_size, tiny.kv_type);
  auto small = Engine::Create(*m.model, m.tok.get(), tiny, pool).value();
  std::vector<std::shared_ptr<RequestStream>> streams;
  small->Pause();  // all at once: they preempt each other
  for (int i = 0; i < 8; ++i) {
    GenerationRequest q = p;
    q.prompt.resize(p.prompt.size() - static_cast<size_t>(i % 3));
    q.max_tokens = 40;
    streams.push_back(small->Submit(q).value());
  }
  small->Resume();
  for (int i = 0; i < 8; ++i) {
    const Result r = Collect(*streams[i]);
    ASSERT_EQ(r.prompt_logprobs.size(), p.prompt.size() - static_cast<size_t>(i % 3) - 1) << "request " << i;
    for (size_t k = 0; k < 11 - static_cast<size_t>(i % 3); ++k) {
      EXPECT_EQ(r.prompt_logprobs[n0 - 1 + k].logprob, decoded.logprobs[k].logprob) << "request " << i << " " << k;
    }
  }
  EXPECT_GT(small->stats().num_preemptions.load(), 0) << "the test did not preempt";
  EXPECT_EQ(small->stats().num_free_blocks.load(), small->num_blocks());
}

TEST(EngineTest, CancelAndShutdownFinishRequestsAndFreeBlocks) {
  const TestModel m = Stories();
  ThreadPool pool(1);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  std::shared_ptr<RequestStream> survivor;
  {
    auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
    ASSERT_TRUE(engine.ok());
    GenerationRequest r;
    r.prompt = m.tok->Encode("Once upon a time");
    r.max_tokens = 200;
    r.sampling.temperature = 0.0f;
    auto s = *(*engine)->Submit(r);
    StreamUpdate u;
    ASSERT_TRUE(s->Next(&u));  // it is running
    // Held between two steps, so the cancel lands before it can finish its 200 tokens (without
    // the pause, a fast machine could finish first and the test flaked).
    (*engine)->Pause();
    (*engine)->Cancel(s->id());
    (*engine)->Resume();
    const Result rest = Collect(*s);
    EXPECT_EQ(rest.reason, FinishReason::kCancelled);
    EXPECT_LT(rest.tokens.size(), 199u);
    // Blocks come back at the next step; run one more request to see the counters settle.
    r.max_tokens = 2;
    EXPECT_EQ(Collect(**(*engine)->Submit(r)).reason, FinishReason::kLength);
    EXPECT_EQ((*engine)->stats().num_free_blocks.load(), (*engine)->num_blocks());
    r.max_tokens = 400;
    survivor = *(*engine)->Submit(r);
  }  // engine destroyed with the request in flight
  const Result last = Collect(*survivor);
  EXPECT_EQ(last.reason, FinishReason::kCancelled);
}

// Shutdown (a server's on SIGTERM, before its HTTP threads are stopped): the request in flight
// ends cancelled, a later Submit fails with kUnavailable instead of queueing into nothing, and
// the object stays usable for Cancel and its counters until it is destroyed.
TEST(EngineTest, ShutdownEndsRequestsAndRefusesNewOnes) {
  const TestModel m = Stories();
  ThreadPool pool(1);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 16ull << 20;
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt = m.tok->Encode("Once upon a time");
  r.max_tokens = 400;
  auto s = *(*engine)->Submit(r);
  StreamUpdate u;
  ASSERT_TRUE(s->Next(&u));
  (*engine)->Shutdown();
  EXPECT_EQ(Collect(*s).reason, FinishReason::kCancelled);
  auto late = (*engine)->Submit(r);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kUnavailable) << late.status().ToString();
  (*engine)->Cancel(s->id());  // harmless
  EXPECT_GE((*engine)->stats().num_free_blocks.load(), 0);
  (*engine)->Shutdown();  // again: nothing happens
}

}  // namespace
}  // namespace gale
