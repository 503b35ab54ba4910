// KV cache quantization (int8 / int4 with an f16 scale per position and head): what it holds and
// what it costs. Capacity at the same KV memory against f16 (from the engine's own sizing),
// perplexity, KL divergence and top-1 agreement on the default model against f16 KV (teacher
// forcing over a text sampled from the model), and the engine's exactness workloads (preemption,
// prefix sharing, speculative decoding) with quantized KV.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "../test_util.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
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

struct Scores {
  double nll = 0.0;     // mean negative log-likelihood per token
  std::vector<std::vector<double>> logprobs;  // [token][vocab]
};

Scores TeacherForce(const LlamaModel& model, const std::vector<int32_t>& tokens, KvType type,
                    std::optional<KvType> v_type = std::nullopt) {
  ThreadPool pool(2);
  KvCache kv(model.hparams(), static_cast<int64_t>(tokens.size()), 1, type, 16, v_type);
  Workspace ws;
  ForwardBatch b;
  b.tokens.assign(tokens.begin(), tokens.end() - 1);
  for (size_t i = 0; i + 1 < tokens.size(); ++i) b.positions.push_back(static_cast<int32_t>(i));
  b.all_logits = true;
  EXPECT_TRUE(model.Forward(b, kv, ws, pool).ok());
  const int64_t vocab = model.hparams().vocab_size;
  Scores s;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const float* l = ws.logits.data() + i * vocab;
    double max = l[0];
    for (int64_t j = 1; j < vocab; ++j) max = std::max<double>(max, l[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(l[j] - max);
    std::vector<double> lp(vocab);
    for (int64_t j = 0; j < vocab; ++j) lp[j] = l[j] - max - std::log(sum);
    s.nll -= lp[tokens[i + 1]];
    s.logprobs.push_back(std::move(lp));
  }
  s.nll /= static_cast<double>(tokens.size() - 1);
  return s;
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

  const Scores base = TeacherForce(*model, text, KvType::kF16);
  // K int8 with V int4 is the last row (index 4): values tolerate 4 bits, keys do not.
  const std::vector<KvType> ks = {KvType::kF32, KvType::kBF16, KvType::kInt8, KvType::kInt4, KvType::kInt8};
  for (size_t row = 0; row < ks.size(); ++row) {
    const KvType type = ks[row];
    const bool mixed = row == 4;
    const Scores s = TeacherForce(*model, text, type, mixed ? std::optional<KvType>(KvType::kInt4) : std::nullopt);
    double kl = 0.0, max_kl = 0.0;
    int64_t agree = 0;
    for (size_t i = 0; i < s.logprobs.size(); ++i) {
      double k = 0.0;
      size_t top_a = 0, top_b = 0;
      for (size_t j = 0; j < s.logprobs[i].size(); ++j) {
        k += std::exp(base.logprobs[i][j]) * (base.logprobs[i][j] - s.logprobs[i][j]);
        if (base.logprobs[i][j] > base.logprobs[i][top_a]) top_a = j;
        if (s.logprobs[i][j] > s.logprobs[i][top_b]) top_b = j;
      }
      kl += k;
      max_kl = std::max(max_kl, k);
      agree += top_a == top_b;
    }
    kl /= static_cast<double>(s.logprobs.size());
    const double ppl = std::exp(s.nll), base_ppl = std::exp(base.nll);
    const double rel = ppl / base_ppl - 1.0;
    std::printf("%s%s KV vs f16: perplexity %.4f vs %.4f (%+.3f%%), mean KL %.2e, max KL %.2e, top-1 agreement %.1f%%\n",
                kernels::KvTypeName(type), mixed ? " / V int4" : "", ppl, base_ppl, 100.0 * rel, kl, max_kl,
                100.0 * static_cast<double>(agree) / static_cast<double>(s.logprobs.size()));
    if (mixed) {  // measured: -0.27%, KL 5.6e-3, 96.4% top-1
      EXPECT_LT(std::fabs(rel), 0.01);
      EXPECT_LT(kl, 0.01);
    } else if (type == KvType::kInt8) {  // measured: +0.21%, KL 2.5e-3, 97.6% top-1
      EXPECT_LT(std::fabs(rel), 0.005);
      EXPECT_LT(kl, 5e-3);
      EXPECT_GT(agree, static_cast<int64_t>(0.95 * s.logprobs.size()));
    }
    // int4 with one scale per 8-wide head and position is not usable on this model (measured:
    // perplexity 2.5x, top-1 agreement 58%); this bound only guards against it getting worse.
    if (type == KvType::kInt4) EXPECT_LT(rel, 2.0);
  }
}

}  // namespace
}  // namespace gale
