// KV cache quantization (int8 / int4 with an f16 scale per position and head): what it holds and
// what it costs. Capacity at the same KV memory against f16 (from the engine's own sizing), and
// perplexity, KL divergence and top-1 agreement on the default model against f16 KV (gale eval's
// teacher forcing over a text sampled from the model).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "../test_util.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "tools/eval.h"
#include "tools/synth.h"

namespace gale {
namespace {

using kernels::KvType;

// Engine start-up sizes the cache: at the same memory, int8 holds >= 1.9x and int4 >= 3.5x the
// tokens of f16 for 64-wide heads (the f16 scale costs 2 bytes per head and position).
TEST(KvQuantTest, HoldsMoreTokensInTheSameMemory) {
  SynthShape shape;
  shape.dim = 128;
  shape.num_layers = 2;
  shape.num_heads = 2;
  shape.num_kv_heads = 2;
  shape.ffn_dim = 256;
  shape.vocab_size = 512;
  const auto bytes = SynthesizeLlama(shape, GgmlType::kF32, 3)->WriteToBytes();
  auto file = GgufFile::FromBytes(bytes).value();
  auto model = LlamaModel::Load(*file).value();
  ThreadPool pool(1);
  auto tokens = [&](KvType type, std::optional<KvType> v = std::nullopt) {
    EngineConfig cfg;
    cfg.kv_type = type;
    cfg.v_kv_type = v;
    cfg.kv_cache_memory_bytes = 4 << 20;
    cfg.sched.max_seq_len = 1 << 20;  // no cap from "what requests could use"
    auto e = Engine::Create(*model, nullptr, cfg, pool);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    std::printf("%s\n", (*e)->Describe().c_str());
    return (*e)->num_blocks() * cfg.block_size;
  };
  const double f16 = static_cast<double>(tokens(KvType::kF16));
  const double int8 = static_cast<double>(tokens(KvType::kInt8)), int4 = static_cast<double>(tokens(KvType::kInt4));
  const double mixed = static_cast<double>(tokens(KvType::kInt8, KvType::kInt4));
  EXPECT_GE(mixed / f16, 2.5);  // K int8 + V int4: 66 + 34 bytes per head and position against 256
  std::printf("tokens in 4 MiB: f16 %.0f, int8 %.0f (%.2fx), int4 %.0f (%.2fx)\n", f16, int8, int8 / f16, int4, int4 / f16);
  EXPECT_GE(int8 / f16, 1.9);
  EXPECT_GE(int4 / f16, 3.5);
}

// Perplexity within 0.5% of f16 for int8 (the bar) and a bound for int4 measured here;
// KL divergence and top-1 agreement of the next-token distributions against f16.
TEST(KvQuantTest, PerplexityAndKlOnTheDefaultModel) {
  auto file = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  auto model = LlamaModel::Load(*file).value();
  auto tok = Tokenizer::FromGguf(*file).value();
  // A text sampled from the model at temperature 1 (seeded), as long as its context allows.
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.kv_type = KvType::kF32;
  cfg.kv_cache_memory_bytes = 16 << 20;
  auto engine = Engine::Create(*model, tok.get(), cfg, pool).value();
  GenerationRequest r;
  r.prompt = {tok->bos_id()};
  r.max_tokens = 500;
  r.sampling.temperature = 1.0f;
  r.sampling.top_k = 0;
  r.sampling.top_p = 1.0f;
  r.sampling.min_p = 0.0f;
  r.sampling.seed = 2026;
  auto stream = engine->Submit(r).value();
  std::vector<int32_t> text = r.prompt;
  StreamUpdate u;
  while (stream->Next(&u)) text.insert(text.end(), u.token_ids.begin(), u.token_ids.end());
  ASSERT_EQ(text.size(), 501u);

  ThreadPool eval_pool(2);
  auto score = [&](KvType type, std::optional<KvType> v) {
    PplOptions o;
    o.kv_type = type;
    o.v_kv_type = v;
    return EvaluatePerplexity(*model, text, o, /*keep_logprobs=*/true, eval_pool).value();
  };
  const PplResult base = score(KvType::kF16, std::nullopt);
  // K int8 with V int4 is the last row (index 4): values tolerate 4 bits, keys do not.
  const std::vector<KvType> ks = {KvType::kF32, KvType::kBF16, KvType::kInt8, KvType::kInt4, KvType::kInt8};
  for (size_t row = 0; row < ks.size(); ++row) {
    const KvType type = ks[row];
    const bool mixed = row == 4;
    const PplResult s = score(type, mixed ? std::optional<KvType>(KvType::kInt4) : std::nullopt);
    const KlResult kl = CompareLogprobs(base, s).value();
    const double rel = s.ppl() / base.ppl() - 1.0;
    std::printf("%s%s KV vs f16: perplexity %.4f vs %.4f (%+.3f%%), mean KL %.2e, max KL %.2e, top-1 agreement %.1f%%\n",
                kernels::KvTypeName(type), mixed ? " / V int4" : "", s.ppl(), base.ppl(), 100.0 * rel, kl.mean, kl.max,
                100.0 * kl.top1_agreement);
    if (mixed) {  // measured: -0.27%, KL 5.6e-3, 96.4% top-1
      EXPECT_LT(std::fabs(rel), 0.01);
      EXPECT_LT(kl.mean, 0.01);
    } else if (type == KvType::kInt8) {  // measured: +0.21%, KL 2.5e-3, 97.6% top-1
      EXPECT_LT(std::fabs(rel), 0.005);
      EXPECT_LT(kl.mean, 5e-3);
      EXPECT_GT(kl.top1_agreement, 0.95);
    }
    // int4 with one scale per 8-wide head and position is not usable on this model (measured:
    // perplexity 2.5x, top-1 agreement 58%); this bound only guards against it getting worse.
    if (type == KvType::kInt4) EXPECT_LT(rel, 2.0);
  }
}

}  // namespace
}  // namespace gale
