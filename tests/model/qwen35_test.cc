// Qwen3.5 (model/arch/qwen35.cc: Gated DeltaNet hybrids) against llama.cpp's qwen35 on
// random-weight files (tests/data/llamacpp/qwen35.gguf, written by scripts/make-ggml-reference.sh
// through tools/ggml_reference.cc's `long` mode: llama.cpp's logits at every 8th position of 200
// tokens fed one at a time, f32 cache), a mutation of each distinctive part, and its
// self-consistency: a prefill (whole, or in chunks of any size) is bitwise token-by-token
// decoding, a sequence's logits do not depend on its batch mates, the engine gives what the fixed
// cache gives, and a step that does not continue a state slot's tokens is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/synth.h"
#include "../test_util.h"

namespace gale {
namespace {

// The script's qwen35 lines (vocab 512, context 256, f32, seed 7).
struct Q35Shape {
  const char* name;
  const char* arch;
  int64_t dim, layers, heads, kv_heads, head_dim, ffn, ssm_k, ssm_v, ssm_state, interval;
  std::vector<int32_t> sections;  // empty: the writer's
  std::vector<bool> recurrent = {};  // attention.recurrent_layers; empty: by the interval
  int64_t experts = 0, used = 0, expert_ffn = 0;  // qwen35moe
};

const std::vector<Q35Shape>& Shapes() {
  static const std::vector<Q35Shape> shapes = {
      // Two value heads per key head; layers 0-2 recurrent, 3 attention.
      {"qwen35", "qwen35", 128, 4, 4, 2, 64, 256, 0, 0, 0, 0, {}},
      // Odd heads, three value heads on one key head, attention every third layer.
      {"qwen35_odd", "qwen35", 96, 6, 3, 1, 48, 192, 1, 3, 24, 3, {}},
      // Sections leaving pairs in the fourth (unrotated for text).
      {"qwen35_sections", "qwen35", 128, 4, 4, 2, 64, 256, 0, 0, 0, 0, {0, 1, 1, 0}},
      // The layers' kinds as a list: attention at layers 1 and 3.
      {"qwen35_recurrent", "qwen35", 128, 4, 4, 2, 64, 256, 0, 0, 0, 0, {}, {true, false, true, false}},
      // The mixture: routed experts and the gated shared one (of --ffn).
      {"qwen35moe", "qwen35moe", 128, 4, 4, 2, 64, 96, 0, 0, 0, 0, {}, {}, 8, 2, 64},
      {"qwen35moe_odd", "qwen35moe", 96, 6, 3, 1, 48, 64, 1, 3, 24, 3, {}, {}, 6, 3, 32},
  };
  return shapes;
}

SynthShape ShapeOf(const Q35Shape& a) {
  SynthShape s;
  s.arch = a.arch;
  s.num_experts = a.experts, s.experts_used = a.used, s.expert_ffn = a.expert_ffn;
  s.dim = a.dim, s.num_layers = a.layers, s.num_heads = a.heads, s.num_kv_heads = a.kv_heads;
  s.head_dim = a.head_dim, s.ffn_dim = a.ffn, s.vocab_size = 512, s.context_length = 256;
  s.ssm_k_heads = a.ssm_k, s.ssm_v_heads = a.ssm_v, s.ssm_state = a.ssm_state, s.full_attention_interval = a.interval;
  if (!a.sections.empty()) s.keys.push_back({"rope.dimension_sections", GgufValue::I32Array(a.sections)});
  if (!a.recurrent.empty()) {
    std::vector<GgufValue> kinds;
    for (bool r : a.recurrent) kinds.push_back(GgufValue::Bool(r));
    s.keys.push_back({"attention.recurrent_layers", GgufValue::Array(GgufValueType::kBool, kinds)});
  }
  return s;
}

std::unique_ptr<GgufFile> Synth(const SynthShape& s) {
  return GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 7)->WriteToBytes()).value();
}

std::vector<float> Floats(const GgufTensorInfo& t) {
  std::vector<float> v(t.num_bytes / 4);
  std::memcpy(v.data(), t.data, t.num_bytes);
  return v;
}

// Every token's logits, fed in chunks of these sizes in turn (1: decoding).
std::vector<float> Logits(const Model& m, const std::vector<int32_t>& tokens, std::vector<size_t> chunks) {
  const int64_t vocab = m.hparams().vocab_size;
  KvCache kv(m.hparams(), static_cast<int64_t>(tokens.size()));
  Workspace ws;
  ThreadPool pool(2);
  std::vector<float> out;
  size_t c = 0;
  for (size_t at = 0; at < tokens.size();) {
    const size_t chunk = chunks[c++ % chunks.size()];
    ForwardBatch b;
    for (size_t i = at; i < std::min(tokens.size(), at + chunk); ++i) {
      b.tokens.push_back(tokens[i]);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    b.all_logits = true;
    const Status s = m.Forward(b, kv, ws, pool);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return {};
    out.insert(out.end(), ws.logits.begin(), ws.logits.begin() + b.tokens.size() * vocab);
    at += b.tokens.size();
  }
  return out;
}

// Largest |got - want| over want's rows (positions 7, 15, ...), and how many rows agree on the
// greedy token.
std::pair<double, int> Against(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  double max_diff = 0.0;
  int same = 0;
  const int64_t rows = static_cast<int64_t>(want.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = got.data() + (r * 8 + 7) * vocab;
    const float* w = want.data() + r * vocab;
    for (int64_t i = 0; i < vocab; ++i) max_diff = std::max(max_diff, std::fabs(static_cast<double>(g[i]) - w[i]));
    same += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
  }
  return {max_diff, same};
}

struct Reference {
  std::unique_ptr<GgufFile> file;
  std::vector<int32_t> tokens;
};

const Reference& Ref() {
  static const Reference ref = [] {
    Reference r;
    auto f = GgufFile::Open(test::SourceDir() + "/tests/data/llamacpp/qwen35.gguf");
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    r.file = std::move(*f);
    for (const GgufValue& v : r.file->Find("tokens")->array) r.tokens.push_back(static_cast<int32_t>(*v.AsInt()));
    return r;
  }();
  return ref;
}

TEST(Qwen35Test, GivesLlamaCppLogits) {
  const Reference& ref = Ref();
  ASSERT_EQ(ref.tokens.size(), 200u);
  for (const Q35Shape& a : Shapes()) {
    SCOPED_TRACE(a.name);
    const GgufTensorInfo* t = ref.file->FindTensor(a.name);
    const GgufTensorInfo* tb = ref.file->FindTensor(std::string(a.name) + ".batch");
    ASSERT_NE(t, nullptr) << "qwen35.gguf predates this shape: run scripts/make-ggml-reference.sh";
    ASSERT_NE(tb, nullptr);
    const std::vector<float> want = Floats(*t), want_batch = Floats(*tb);
    auto file = Synth(ShapeOf(a));
    auto m = LoadModel(*file);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_TRUE((*m)->load_warnings().empty());
    (*m)->PackWeights(nullptr);
    const std::vector<float> got = Logits(**m, ref.tokens, {1});
    ASSERT_EQ(got.size(), ref.tokens.size() * 512);
    const auto [diff, same] = Against(got, want, 512);
    double own = 0.0;  // llama.cpp's prefill against its own decoding: f32 reordering's scale
    for (size_t i = 0; i < want.size(); ++i) own = std::max<double>(own, std::fabs(want[i] - want_batch[i]));
    std::printf("%s: max |diff| against llama.cpp %.2e, greedy %d/%zu; llama.cpp's prefill against its decoding %.2e\n",
                a.name, diff, same, want.size() / 512, own);
    EXPECT_LT(diff, 1e-4);
    EXPECT_EQ(same, static_cast<int>(want.size() / 512));
  }
}

// Each distinctive part, changed, moves the logits far past the agreement above: the file's keys
// (RoPE sections, the norms' epsilon), and weights that switch a part off (every layer's decay,
// the convolution's earlier taps, the per-token write strength beta).
TEST(Qwen35Test, MutationsAreCaught) {
  const Reference& ref = Ref();
  struct Mutation {
    const char* what;
    std::vector<std::pair<std::string, GgufValue>> keys;
    const char* tensor = nullptr;  // every layer's tensor of this name ...
    std::function<void(float* x, int64_t n)> change = nullptr;  // ... changed so
    size_t shape = 0;  // of Shapes()
  };
  const std::vector<Mutation> mutations = {
      {"rope sections", {{"rope.dimension_sections", GgufValue::I32Array({0, 1, 1, 0})}}},
      {"rms eps", {{"attention.layer_norm_rms_epsilon", GgufValue::F32(0.5f)}}},
      {"no decay", {}, "ssm_a", [](float* x, int64_t n) { std::fill(x, x + n, 0.0f); }},
      {"no earlier conv taps", {}, "ssm_conv1d.weight",
       [](float* x, int64_t n) {
         for (int64_t i = 0; i < n; ++i) x[i] = i % 4 == 3 ? x[i] : 0.0f;
       }},
      {"beta 1/2", {}, "ssm_beta.weight", [](float* x, int64_t n) { std::fill(x, x + n, 0.0f); }},
      {"shared expert's gate 1/2", {}, "ffn_gate_inp_shexp.weight", [](float* x, int64_t n) { std::fill(x, x + n, 0.0f); }, 4},
  };
  for (const Mutation& mu : mutations) {
    const std::vector<float> want = Floats(*ref.file->FindTensor(Shapes()[mu.shape].name));
    SynthShape s = ShapeOf(Shapes()[mu.shape]);
    s.keys = mu.keys;
    auto file = Synth(s);
    if (mu.tensor != nullptr) {
      for (int64_t l = 0; l < s.num_layers; ++l) {
        const GgufTensorInfo* t = file->FindTensor("blk." + std::to_string(l) + "." + mu.tensor);
        if (t == nullptr) continue;  // an attention layer
        mu.change(reinterpret_cast<float*>(const_cast<uint8_t*>(t->data)), static_cast<int64_t>(t->num_bytes / 4));
      }
    }
    auto m = LoadModel(*file);
    ASSERT_TRUE(m.ok()) << mu.what << ": " << m.status().ToString();
    const auto [diff, same] = Against(Logits(**m, ref.tokens, {1}), want, 512);
    std::printf("  mutation '%s': max |diff| %.2e\n", mu.what, diff);
    EXPECT_GT(diff, 50e-5) << mu.what;  // 50 times the agreement with llama.cpp
  }
}

// Prefill in one batch or in chunks of any size is bitwise decoding one token at a time.
TEST(Qwen35Test, PrefillEqualsDecoding) {
  const Reference& ref = Ref();
  for (const Q35Shape& a : Shapes()) {
    SCOPED_TRACE(a.name);
    auto file = Synth(ShapeOf(a));
    auto m = LoadModel(*file).value();
    m->PackWeights(nullptr);
    const std::vector<float> decoded = Logits(*m, ref.tokens, {1});
    EXPECT_EQ(Logits(*m, ref.tokens, {200}), decoded);
    EXPECT_EQ(Logits(*m, ref.tokens, {7, 64, 1, 33}), decoded);
  }
}

// Two sequences in one batch (interleaved chunks) give each its own logits: states do not mix.
TEST(Qwen35Test, SequencesDoNotShareState) {
  const Reference& ref = Ref();
  auto file = Synth(ShapeOf(Shapes()[1]));
  auto m = LoadModel(*file).value();
  const std::vector<int32_t> a(ref.tokens.begin(), ref.tokens.begin() + 40);
  std::vector<int32_t> b(ref.tokens.begin() + 100, ref.tokens.begin() + 140);
  const std::vector<float> alone_a = Logits(*m, a, {1}), alone_b = Logits(*m, b, {1});
  KvCache kv(m->hparams(), 64, /*num_seqs=*/2);
  Workspace ws;
  ThreadPool pool(2);
  std::vector<float> got_a, got_b;
  for (int at = 0; at < 40; at += 10) {
    ForwardBatch batch;
    for (int s = 0; s < 2; ++s) {
      for (int i = at; i < at + 10; ++i) {
        batch.tokens.push_back((s == 0 ? a : b)[i]);
        batch.positions.push_back(i);
        batch.seq_idx.push_back(s);
      }
    }
    batch.all_logits = true;
    ASSERT_TRUE(m->Forward(batch, kv, ws, pool).ok());
    got_a.insert(got_a.end(), ws.logits.begin(), ws.logits.begin() + 10 * 512);
    got_b.insert(got_b.end(), ws.logits.begin() + 10 * 512, ws.logits.begin() + 20 * 512);
  }
  EXPECT_EQ(got_a, alone_a);
  EXPECT_EQ(got_b, alone_b);
}

// Snapshots: a step can leave the state after each of a sequence's first tokens in slots of their
// own (bitwise what decoding to there gives), and a later step continues from one of them;
// snapshot lists that overlap the batch's slots or outrun its tokens are refused.
TEST(Qwen35Test, StepsLeaveSnapshotsOfTheState) {
  const Reference& ref = Ref();
  auto file = Synth(ShapeOf(Shapes()[1]));
  auto m = LoadModel(*file).value();
  KvCache kv(m->hparams(), 64, /*num_seqs=*/6);
  Workspace ws;
  ThreadPool pool(2);
  KvStorage& st = kv.storage();
  const int64_t floats = st.state_floats();
  auto step = [&](int32_t slot, int first, int count, std::vector<StateSnapshot> snaps = {}) {
    ForwardBatch b;
    for (int i = first; i < first + count; ++i) {
      b.tokens.push_back(ref.tokens[i]);
      b.positions.push_back(i);
    }
    // The cache's six sequences: only the first has tokens here.
    b.state_slots.assign(6, slot);
    if (!snaps.empty()) {
      b.state_snapshots.assign(6, {});
      b.state_snapshots[0] = snaps;
    }
    return m->Forward(b, kv, ws, pool);
  };
  auto state = [&](int32_t slot) { return std::vector<float>(st.State(slot), st.State(slot) + floats); };
  // Slot 0 one token at a time to 20, keeping the states after 17, 18 and 19 tokens.
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(step(0, i, 1).ok());
    if (i >= 16 && i < 19) want.push_back(state(0));
  }
  const std::vector<float> logits_after_17(ws.logits.begin(), ws.logits.begin() + 512);
  // Slot 1: 16 tokens, then four in one step with snapshots after the first three.
  ASSERT_TRUE(step(1, 0, 16).ok());
  ASSERT_TRUE(step(1, 16, 4, {{0, 2}, {1, 3}, {2, 4}}).ok());
  EXPECT_EQ(state(1), state(0));
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(state(2 + j), want[j]) << "snapshot " << j;
    EXPECT_EQ(st.state_tokens(2 + j), 17 + j);
  }
  // One snapshot inside a longer chunk (a prompt's checkpoint): slot 5 after 18 of 20 tokens.
  ASSERT_TRUE(step(1, 0, 20, {{17, 5}}).ok());
  EXPECT_EQ(state(5), want[1]);
  EXPECT_EQ(state(1), state(0));
  // Going on from the snapshot after 17 tokens.
  ASSERT_TRUE(step(2, 17, 3).ok());
  EXPECT_EQ(state(2), state(0));
  EXPECT_EQ(std::vector<float>(ws.logits.begin(), ws.logits.begin() + 512), logits_after_17);
  EXPECT_FALSE(step(5, 0, 2, {{0, 5}}).ok()) << "the sequence's own slot";
  EXPECT_FALSE(step(5, 0, 2, {{0, 3}, {1, 3}}).ok()) << "one slot twice";
  EXPECT_FALSE(step(5, 0, 2, {{1, 3}, {0, 4}}).ok()) << "not increasing";
  EXPECT_FALSE(step(5, 0, 2, {{2, 3}}).ok()) << "after a token the step does not have";
  EXPECT_FALSE(step(5, 0, 2, {{0, 9}}).ok()) << "no such slot";
}

// A step must continue the tokens its state slot has taken in (no gaps, no going back) and the
// slots must exist and not be shared.
TEST(Qwen35Test, RefusesStepsThatDoNotContinueTheState) {
  auto file = Synth(ShapeOf(Shapes()[0]));
  auto m = LoadModel(*file).value();
  KvCache kv(m->hparams(), 64, 2);
  Workspace ws;
  ThreadPool pool(2);
  auto run = [&](std::vector<int32_t> positions, std::vector<int32_t> seqs = {}, std::vector<int32_t> slots = {}) {
    ForwardBatch b;
    for (size_t i = 0; i < positions.size(); ++i) b.tokens.push_back(5);
    b.positions = positions;
    b.seq_idx = seqs;
    b.state_slots = slots;
    return m->Forward(b, kv, ws, pool);
  };
  EXPECT_TRUE(run({0, 1, 2}).ok());
  EXPECT_FALSE(run({5}).ok()) << "a gap";
  EXPECT_FALSE(run({1}).ok()) << "going back";
  EXPECT_TRUE(run({0}).ok()) << "a new sequence at 0 starts afresh";
  EXPECT_TRUE(run({1, 2}).ok());
  EXPECT_FALSE(run({3, 5}).ok()) << "not consecutive";
  EXPECT_FALSE(run({0, 0}, {0, 1}, {1, 1}).ok()) << "one slot for two sequences";
  EXPECT_FALSE(run({0}, {}, {2}).ok()) << "no such slot";
  EXPECT_TRUE(run({0, 0}, {0, 1}, {1, 0}).ok());
}

// The engine (continuous batching, chunked prefill, preemption) gives the fixed cache's greedy
// tokens for several requests at once.
TEST(Qwen35Test, EngineGivesTheFixedCachesTokens) {
  auto file = Synth(ShapeOf(Shapes()[1]));
  auto m = LoadModel(*file).value();
  m->PackWeights(nullptr);
  const Reference& ref = Ref();
  ThreadPool pool(2);
  // Greedy continuation with the fixed cache.
  auto greedy = [&](std::vector<int32_t> tokens, int n) {
    KvCache kv(m->hparams(), 256);
    Workspace ws;
    std::vector<int32_t> out;
    int64_t pos = 0;
    std::vector<int32_t> feed = tokens;
    for (int step = 0; step < n; ++step) {
      ForwardBatch b;
      for (int32_t t : feed) {
        b.tokens.push_back(t);
        b.positions.push_back(static_cast<int32_t>(pos++));
      }
      EXPECT_TRUE(m->Forward(b, kv, ws, pool).ok());
      const int32_t next = static_cast<int32_t>(std::max_element(ws.logits.begin(), ws.logits.begin() + 512) - ws.logits.begin());
      out.push_back(next);
      feed = {next};
    }
    return out;
  };
  std::vector<std::vector<int32_t>> prompts;
  for (int r = 0; r < 5; ++r) prompts.emplace_back(ref.tokens.begin() + 10 * r, ref.tokens.begin() + 10 * r + 30 + 7 * r);
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(greedy(p, 12));
  // Room for everything; then for three requests' states and 7 f32 blocks of 16 tokens, so that
  // requests are preempted (their states released, computed again from the first token).
  const int64_t state_bytes = m->kv_layout().state_floats * 4;
  for (const int64_t memory : {int64_t{64} << 20, 3 * state_bytes + 7 * 16 * 2 * 2 * 48 * 4}) {
    SCOPED_TRACE(memory);
    EngineConfig cfg;
    cfg.kv_cache_memory_bytes = static_cast<uint64_t>(memory);
    cfg.kv_type = kernels::KvType::kF32;
    cfg.sched.max_batch_size = 3;
    cfg.sched.prefill_chunk_size = 24;  // prompts in chunks
    auto engine = Engine::Create(*m, nullptr, cfg, pool);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    const std::string described = (*engine)->Describe();
    std::printf("%s\n", described.c_str());
    EXPECT_NE(described.find("3 for running requests"), std::string::npos) << described;
    // With room, checkpoints for the prefix cache (as many as run at once); too little: none.
    if (memory > (int64_t{1} << 20)) {
      EXPECT_NE(described.find("3 checkpoints for the prefix cache"), std::string::npos) << described;
      EXPECT_NE(described.find("prefix caching on"), std::string::npos) << described;
    } else {
      EXPECT_NE(described.find("prefix caching off (no recurrent-state checkpoints)"), std::string::npos) << described;
    }
    // All submitted before the first step: they run together.
    std::vector<decltype((*engine)->Submit(GenerationRequest()))> streams;
    for (const auto& p : prompts) {
      GenerationRequest req;
      req.prompt = p;
      req.max_tokens = 12;
      req.sampling.temperature = 0.0f;
      streams.push_back((*engine)->Submit(req));
      ASSERT_TRUE(streams.back().ok()) << streams.back().status().ToString();
    }
    for (size_t r = 0; r < prompts.size(); ++r) {
      std::vector<int32_t> got;
      StreamUpdate u;
      while ((*streams[r])->Next(&u)) {
        got.insert(got.end(), u.token_ids.begin(), u.token_ids.end());
        if (u.finished) {
          EXPECT_TRUE(u.status.ok()) << u.status.ToString();
        }
      }
      EXPECT_EQ(got, want[r]) << "request " << r;
    }
    if (memory < (int64_t{1} << 20)) {
      EXPECT_GT((*engine)->stats().num_preemptions.load(), 0) << "nothing was preempted";
    }
    // Every block and state slot free again.
    EXPECT_EQ((*engine)->stats().num_free_blocks.load(), (*engine)->num_blocks());
    EXPECT_EQ((*engine)->stats().num_free_state_slots.load(), 3);
  }
  // Retention drops positions a recurrent state has taken in: refused.
  EngineConfig retain;
  retain.kv_cache_memory_bytes = 64 << 20;
  retain.retention.policy = RetentionPolicy::kSinkWindow;
  retain.retention.budget = 64;
  EXPECT_EQ(Engine::Create(*m, nullptr, retain, pool).status().code(), StatusCode::kUnimplemented);
}

// Speculative decoding on a hybrid model: long greedy and seeded continuations with n-gram
// guesses every step give plain decoding's tokens and log-probabilities, bitwise; a repeated
// prompt hits the prefix cache at its checkpoint. The layers' outputs are scaled down so that a
// token's logits follow mostly from the token itself: the continuations fall into loops and
// guesses are accepted in part and in whole (a random model's rarely are), while the states still
// move every logit.
TEST(Qwen35Test, EngineSpeculationAndPrefixCacheAreExact) {
  SynthShape shape = ShapeOf(Shapes()[1]);
  auto file = Synth(shape);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    for (const char* name : {"ssm_out.weight", "attn_output.weight", "ffn_down.weight"}) {
      const GgufTensorInfo* t = file->FindTensor("blk." + std::to_string(l) + "." + name);
      if (t == nullptr) continue;
      float* x = reinterpret_cast<float*>(const_cast<uint8_t*>(t->data));
      for (size_t i = 0; i < t->num_bytes / 4; ++i) x[i] *= 0.01f;
    }
  }
  auto m = LoadModel(*file).value();
  m->PackWeights(nullptr);
  const Reference& ref = Ref();
  ThreadPool pool(2);
  std::vector<GenerationRequest> reqs;
  for (int r = 0; r < 4; ++r) {
    GenerationRequest req;
    req.prompt.assign(ref.tokens.begin() + 5 * r, ref.tokens.begin() + 5 * r + 40 + 9 * r);
    req.max_tokens = 120;
    req.sampling.temperature = r % 2 == 0 ? 0.0f : 0.8f;
    req.sampling.seed = 17 + r;
    req.top_logprobs = 2;
    reqs.push_back(req);
  }
  reqs.push_back(reqs[0]);  // a repeat: its prompt from the cache
  auto run = [&](const SpecConfig& spec, bool cache, EngineStats* stats_out) {
    EngineConfig cfg;
    cfg.kv_cache_memory_bytes = 64 << 20;
    cfg.kv_type = kernels::KvType::kF32;
    cfg.sched.max_batch_size = 4;
    cfg.sched.prefill_chunk_size = 24;
    cfg.enable_prefix_caching = cache;
    cfg.state_checkpoints = cache ? 12 : 0;
    cfg.spec = spec;
    auto engine = Engine::Create(*m, nullptr, cfg, pool);
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    // Per request its tokens, then each token's log-probability and its top two's (bits).
    std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> out;
    for (const auto& req : reqs) {
      // One at a time: the repeat comes after the first finished.
      auto stream = (*engine)->Submit(req);
      EXPECT_TRUE(stream.ok());
      auto& [tokens, lps] = out.emplace_back();
      StreamUpdate u;
      while ((*stream)->Next(&u)) {
        tokens.insert(tokens.end(), u.token_ids.begin(), u.token_ids.end());
        for (const TokenLogprobs& lp : u.logprobs) {
          lps.push_back(lp.logprob);
          for (const auto& [t, p] : lp.top) lps.push_back(p);
        }
        if (u.finished) {
          EXPECT_TRUE(u.status.ok()) << u.status.ToString();
        }
      }
      EXPECT_EQ(lps.size(), 3 * tokens.size());
    }
    const EngineStats& st = (*engine)->stats();
    EXPECT_EQ(st.num_free_state_slots.load(), (*engine)->num_working_state_slots());
    EXPECT_EQ(st.num_free_blocks.load(), (*engine)->num_blocks());
    if (stats_out != nullptr) {
      stats_out->spec_num_draft_tokens = st.spec_num_draft_tokens.load();
      stats_out->spec_num_accepted_tokens = st.spec_num_accepted_tokens.load();
      stats_out->spec_state_rollbacks = st.spec_state_rollbacks.load();
      stats_out->prefix_cache_hit_tokens = st.prefix_cache_hit_tokens.load();
      stats_out->state_checkpoints_saved = st.state_checkpoints_saved.load();
    }
    if (spec.method != SpecMethod::kOff) std::printf("%s\n", (*engine)->DescribeSpec().c_str());
    return out;
  };
  const auto plain = run(SpecConfig{}, /*cache=*/false, nullptr);
  SpecConfig ngram;
  ngram.method = SpecMethod::kNgram;
  ngram.num_tokens = 4;
  ngram.always = true;
  EngineStats st;
  const auto spec = run(ngram, /*cache=*/true, &st);
  for (size_t r = 0; r < reqs.size(); ++r) {
    EXPECT_EQ(spec[r].first, plain[r].first) << "request " << r;
    EXPECT_EQ(spec[r].second, plain[r].second) << "request " << r;
  }
  EXPECT_EQ(plain[4], plain[0]);
  std::printf("guesses %lld, accepted %lld, rollbacks %lld, prefix-cache hit tokens %lld, checkpoints saved %lld\n",
              static_cast<long long>(st.spec_num_draft_tokens.load()),
              static_cast<long long>(st.spec_num_accepted_tokens.load()),
              static_cast<long long>(st.spec_state_rollbacks.load()),
              static_cast<long long>(st.prefix_cache_hit_tokens.load()),
              static_cast<long long>(st.state_checkpoints_saved.load()));
  EXPECT_GT(st.spec_num_accepted_tokens.load(), 20);
  EXPECT_GT(st.spec_state_rollbacks.load(), 5);
  EXPECT_GT(st.spec_num_draft_tokens.load() - st.spec_num_accepted_tokens.load(), 5);
  // The repeat found its prompt but the last token, less what the last boundary leaves.
  EXPECT_EQ(st.prefix_cache_hit_tokens.load(), (static_cast<int64_t>(reqs[0].prompt.size()) - 1) / 16 * 16);
}

// More prompts passing their checkpoint boundary in one step than there are checkpoints: each
// gets what it gets alone, and a repeat finds the one checkpoint left.
TEST(Qwen35Test, FewCheckpointsForManyPromptsInAStep) {
  auto file = Synth(ShapeOf(Shapes()[1]));
  auto m = LoadModel(*file).value();
  const Reference& ref = Ref();
  ThreadPool pool(2);
  auto run = [&](int64_t checkpoints, int repeats) {
    EngineConfig cfg;
    cfg.kv_cache_memory_bytes = 64 << 20;
    cfg.kv_type = kernels::KvType::kF32;
    cfg.sched.max_batch_size = 4;
    cfg.sched.prefill_chunk_size = 24;  // the second chunk of each 40-token prompt holds its boundary (32)
    cfg.enable_prefix_caching = checkpoints > 0;
    cfg.state_checkpoints = checkpoints;
    auto engine = Engine::Create(*m, nullptr, cfg, pool);
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    std::vector<std::vector<int32_t>> out;
    for (int round = 0; round < repeats; ++round) {
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (int r = 0; r < 4; ++r) {
        GenerationRequest req;
        req.prompt.assign(ref.tokens.begin() + 7 * r, ref.tokens.begin() + 7 * r + 40);
        req.max_tokens = 6;
        req.sampling.temperature = 0.0f;
        streams.push_back(*(*engine)->Submit(req));
      }
      for (auto& st : streams) {
        std::vector<int32_t> got;
        StreamUpdate u;
        while (st->Next(&u)) {
          got.insert(got.end(), u.token_ids.begin(), u.token_ids.end());
          if (u.finished) {
            EXPECT_TRUE(u.status.ok()) << u.status.ToString();
          }
        }
        out.push_back(got);
      }
    }
    if (checkpoints > 0) {
      EXPECT_GT((*engine)->stats().prefix_cache_hit_tokens.load(), 0);
    }
    return out;
  };
  const auto plain = run(0, 1);
  const auto cached = run(1, 2);
  for (size_t i = 0; i < cached.size(); ++i) EXPECT_EQ(cached[i], plain[i % 4]) << i;
}

}  // namespace
}  // namespace gale
