// DeepSeek-V4 (model/arch/deepseek4.cc) against llama.cpp's deepseek4 on random-weight files long
// enough for every layer kind to matter (tests/data/llamacpp/deepseek4.gguf, written by
// scripts/make-ggml-reference.sh through tools/ggml_reference.cc's `long` mode: llama.cpp's logits
// at every 8th position of 320 tokens fed one at a time, f32 cache), and its self-consistency:
// a prefill equals token-by-token decoding, the engine's paged cache equals the fixed one, and the
// compressed rows a batch writes equal the ones decoding writes one token at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/synth.h"
#include "../test_util.h"

namespace gale {
namespace {

// The shapes the script writes (its deepseek4 lines; vocab 512, context 1024, f32, seed 7): head
// 128 (llama.cpp asserts on smaller), 64 RoPE dims, the window shorter than the sequence, more
// compressed rows than the indexer's top-k, the first layers hash-routed.
struct Ds4Shape {
  const char* name;
  int64_t dim, layers, heads, head, rope, q_lora, window;
  std::vector<int64_t> ratios;
  int64_t hash_layers, idx_heads, idx_dim, top_k, groups, out_lora, experts, used, expert_ffn;
  float clamp;
};
const std::vector<Ds4Shape>& Shapes() {
  static const std::vector<Ds4Shape> shapes = {
      {"deepseek4", 256, 4, 4, 128, 64, 128, 16, {0, 4, 128, 4}, 2, 16, 128, 4, 2, 64, 8, 2, 64, 10.0f},
      {"deepseek4_b", 128, 5, 2, 128, 64, 64, 24, {4, 128, 4, 0, 128}, 1, 16, 64, 8, 1, 32, 6, 3, 32, 0.3f},
  };
  return shapes;
}

SynthShape ShapeOf(const Ds4Shape& a) {
  SynthShape s;
  s.arch = "deepseek4";
  s.dim = a.dim;
  s.num_layers = a.layers;
  s.num_heads = a.heads;
  s.num_kv_heads = 1;
  s.head_dim = a.head;
  s.rope_dim = a.rope;
  s.q_lora_rank = a.q_lora;
  s.sliding_window = a.window;
  s.compress_ratios = a.ratios;
  s.hash_layers = a.hash_layers;
  s.indexer_heads = a.idx_heads;
  s.indexer_dim = a.idx_dim;
  s.indexer_top_k = a.top_k;
  s.out_groups = a.groups;
  s.out_lora_rank = a.out_lora;
  s.ffn_dim = 256;
  s.num_experts = a.experts;
  s.experts_used = a.used;
  s.expert_ffn = a.expert_ffn;
  s.shared_experts = 1;
  s.swiglu_clamp = a.clamp;
  s.vocab_size = 512;
  s.context_length = 1024;
  return s;
}

std::vector<float> Floats(const GgufTensorInfo& t) {
  std::vector<float> v(t.num_bytes / 4);
  std::memcpy(v.data(), t.data, t.num_bytes);
  return v;
}

std::unique_ptr<GgufFile> Synth(const SynthShape& s) {
  return GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 7)->WriteToBytes()).value();
}

// Every token's logits, fed `chunk` tokens per forward (1: decoding; tokens.size(): one prefill).
std::vector<float> Logits(const Model& m, const std::vector<int32_t>& tokens, size_t chunk) {
  const int64_t vocab = m.hparams().vocab_size;
  KvCache kv(m.hparams(), static_cast<int64_t>(tokens.size()));
  Workspace ws;
  ThreadPool pool(2);
  std::vector<float> out;
  for (size_t at = 0; at < tokens.size(); at += chunk) {
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
  }
  return out;
}

struct Compare {
  double max_diff = 0.0, rmse = 0.0;
  int same_greedy = 0, rows = 0;
};
// got: every position's logits; want: [rows, vocab] at positions 7, 15, ...
Compare Against(const std::vector<float>& got, const std::vector<float>& want, int64_t vocab) {
  Compare c;
  c.rows = static_cast<int>(want.size() / vocab);
  double sq = 0.0;
  for (int r = 0; r < c.rows; ++r) {
    const float* g = got.data() + (static_cast<int64_t>(r) * 8 + 7) * vocab;
    const float* w = want.data() + static_cast<int64_t>(r) * vocab;
    for (int64_t i = 0; i < vocab; ++i) {
      const double d = std::fabs(static_cast<double>(g[i]) - w[i]);
      c.max_diff = std::max(c.max_diff, d);
      sq += d * d;
    }
    if (std::getenv("GALE_DS4_ROWS") != nullptr) {
      double m = 0.0;
      for (int64_t i = 0; i < vocab; ++i) m = std::max(m, std::fabs(static_cast<double>(g[i]) - w[i]));
      std::printf("  position %d: max |diff| %.2e\n", r * 8 + 7, m);
    }
    c.same_greedy += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
  }
  c.rmse = std::sqrt(sq / static_cast<double>(c.rows * vocab));
  return c;
}

TEST(Deepseek4Test, GivesLlamaCppLogits) {
  auto ref = GgufFile::Open(test::SourceDir() + "/tests/data/llamacpp/deepseek4.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::vector<int32_t> tokens;
  for (const GgufValue& v : (*ref)->Find("tokens")->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  ASSERT_EQ(tokens.size(), 320u);
  for (const Ds4Shape& a : Shapes()) {
    SCOPED_TRACE(a.name);
    const GgufTensorInfo* t = (*ref)->FindTensor(a.name);
    const GgufTensorInfo* tb = (*ref)->FindTensor(std::string(a.name) + ".batch");
    ASSERT_NE(t, nullptr) << "deepseek4.gguf predates this shape: run scripts/make-ggml-reference.sh";
    ASSERT_NE(tb, nullptr);
    const std::vector<float> want = Floats(*t), want_batch = Floats(*tb);
    auto file = Synth(ShapeOf(a));
    auto m = LoadModel(*file);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    (*m)->PackWeights(nullptr);
    const std::vector<float> got = Logits(**m, tokens, 1);
    ASSERT_EQ(got.size(), tokens.size() * 512);
    const Compare c = Against(got, want, 512);
    // llama.cpp's own prefill beside its own decoding: the scale of f32 reordering here.
    std::vector<float> batch_rows;
    for (int r = 0; r < c.rows; ++r) batch_rows.insert(batch_rows.end(), want_batch.begin() + r * 512, want_batch.begin() + (r + 1) * 512);
    double own = 0.0;
    for (size_t i = 0; i < want.size(); ++i) own = std::max<double>(own, std::fabs(want[i] - want_batch[i]));
    std::printf("%s: max |diff| against llama.cpp %.2e (rmse %.2e), greedy %d/%d; llama.cpp's prefill against its "
                "decoding %.2e\n", a.name, c.max_diff, c.rmse, c.same_greedy, c.rows, own);
    // f32 throughout; the engines add up to 512 products per output in other orders through 4-5
    // layers of attention, pooling and experts: measured 1.5e-5 to 2.9e-5 on logits up to ~5.
    EXPECT_LT(c.max_diff, 1e-4);
    EXPECT_EQ(c.same_greedy, c.rows);
    // Mutations, each far: every compressed row attended (no indexer), a window past the
    // sequence.
    Ds4Shape all_rows = a, wide = a;
    all_rows.top_k = 100000;
    wide.window = 100000;
    for (const auto& [what, shape] : {std::pair<const char*, Ds4Shape>{"no indexer", all_rows}, {"no window", wide}}) {
      auto mf = Synth(ShapeOf(shape));
      auto mm = LoadModel(*mf).value();
      const Compare mc = Against(Logits(*mm, tokens, 1), want, 512);
      std::printf("  mutation '%s': max |diff| %.2e\n", what, mc.max_diff);
      EXPECT_GT(mc.max_diff, 50 * c.max_diff) << what;
    }
  }
}

// Self-consistency without an oracle: the tokens in one prefill, in chunks of 7 (blocks completing
// mid-chunk, chunks straddling windows) and one at a time give the same logits.
TEST(Deepseek4Test, PrefillEqualsDecoding) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(1 + (i * 7919 + 13) % 511);
  for (const Ds4Shape& a : Shapes()) {
    SCOPED_TRACE(a.name);
    auto file = Synth(ShapeOf(a));
    auto m = LoadModel(*file).value();
    m->PackWeights(nullptr);
    const std::vector<float> one = Logits(*m, tokens, 1);
    const std::vector<float> chunks = Logits(*m, tokens, 7);
    const std::vector<float> all = Logits(*m, tokens, tokens.size());
    ASSERT_EQ(one.size(), all.size());
    double d7 = 0.0, dall = 0.0;
    for (size_t i = 0; i < one.size(); ++i) {
      d7 = std::max<double>(d7, std::fabs(one[i] - chunks[i]));
      dall = std::max<double>(dall, std::fabs(one[i] - all[i]));
    }
    std::printf("%s: one prefill against decoding: max |diff| %.2e; chunks of 7: %.2e\n", a.name, dall, d7);
    EXPECT_EQ(one, all);
    EXPECT_EQ(one, chunks);
  }
}

// The engine's paged cache (blocks of 16, windows given back, chunked prefill, a prefix shared
// from the cache by a second request) against the fixed cache: greedy generation through the
// engine picks, at every step, the argmax of the fixed cache's logits over the same tokens; an
// int8 cache is refused with the reason.
TEST(Deepseek4Test, PagedEngineEqualsTheFixedCache) {
  const Ds4Shape& a = Shapes()[0];
  auto file = Synth(ShapeOf(a));
  auto m = LoadModel(*file).value();
  m->PackWeights(nullptr);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 270; ++i) prompt.push_back(1 + (i * 131 + 7) % 511);
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 64ull << 20;
  cfg.kv_type = kernels::KvType::kF32;
  cfg.sched.prefill_chunk_size = 48;
  cfg.enable_prefix_caching = true;
  auto engine = Engine::Create(*m, nullptr, cfg, pool);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::printf("%s\n", (*engine)->Describe().c_str());
  auto generate = [&](const std::vector<int32_t>& p, int64_t* cached) {
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = 40;
    r.sampling.temperature = 0.0f;
    auto st = (*engine)->Submit(r);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    std::vector<int32_t> out;
    StreamUpdate u;
    while ((*st)->Next(&u)) {
      out.insert(out.end(), u.token_ids.begin(), u.token_ids.end());
      if (u.finished) {
        EXPECT_TRUE(u.status.ok()) << u.status.ToString();
        *cached = u.num_cached_tokens;
      }
    }
    return out;
  };
  int64_t cached = 0;
  const std::vector<int32_t> first = generate(prompt, &cached);
  ASSERT_EQ(first.size(), 40u);
  // The same prompt again: its full blocks come from the prefix cache.
  const std::vector<int32_t> second = generate(prompt, &cached);
  EXPECT_GE(cached, 256);
  EXPECT_EQ(first, second);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), first.begin(), first.end());
  const std::vector<float> logits = Logits(*m, all, 1);
  for (size_t i = 0; i < first.size(); ++i) {
    const float* row = logits.data() + (prompt.size() - 1 + i) * 512;
    EXPECT_EQ(std::max_element(row, row + 512) - row, first[i]) << "token " << i;
  }
  cfg.kv_type = kernels::KvType::kInt8;
  auto int8 = Engine::Create(*m, nullptr, cfg, pool);
  ASSERT_FALSE(int8.ok());
  EXPECT_NE(int8.status().message().find("int8/int4"), std::string::npos) << int8.status().ToString();
}

}  // namespace
}  // namespace gale
