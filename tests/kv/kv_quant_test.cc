// KV cache quantization (int8 / int4 with an f16 scale per position and head): what it holds and
// what it costs. Capacity at the same KV memory against f16 (from the engine's own sizing), and
// perplexity, KL divergence and top-1 agreement on the default model against f16 KV (gale eval's
// teacher forcing over a text sampled from the model).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "../test_util.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "quant/calibration.h"
#include "eval/eval.h"
#include "model/synth.h"

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
  const auto bytes = SynthesizeModel(shape, GgmlType::kF32, 3)->WriteToBytes();
  auto file = GgufFile::FromBytes(bytes).value();
  auto model = LoadModel(*file).value();
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
  auto model = LoadModel(*file).value();
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
    // perplexity +136%, KL 0.89, top-1 agreement 57.8%); the bounds are those with a margin of
    // about a fifth, so a change for the worse shows.
    if (type == KvType::kInt4) {
      EXPECT_LT(rel, 1.6);
      EXPECT_LT(kl.mean, 1.1);
      EXPECT_GT(kl.top1_agreement, 0.5);
    }
  }
}

// The file's bytes with every tensor and key as they were, plus the key transform's metadata (or
// the given raw values in place of it).
std::vector<uint8_t> WithMetadata(const GgufFile& in, const std::vector<std::pair<std::string, GgufValue>>& extra) {
  GgufWriter w;
  for (const auto& [key, value] : in.metadata()) w.SetValue(key, value);
  for (const auto& [key, value] : extra) w.SetValue(key, value);
  for (const GgufTensorInfo& t : in.tensors()) {
    EXPECT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
  }
  return w.WriteToBytes();
}
std::vector<uint8_t> WithKeyChannels(const GgufFile& in, const KeyChannels& kc) {
  return WithMetadata(in, {{kKeyShiftKey, GgufValue::F32Array(kc.shift)}, {kKeyScaleKey, GgufValue::F32Array(kc.scale)}});
}

// Any shift and scale leave attention's output as it was (q.k moves by q.shift for every key of a
// query; q * scale undoes 1 / scale): f32 KV with the transform forced on gives the same
// next-token distributions; the stored keys are the transformed ones.
TEST(KvQuantTest, KeyChannelTransformLeavesAttentionUnchanged) {
  auto file = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  auto model = LoadModel(*file).value();
  auto tok = Tokenizer::FromGguf(*file).value();
  const ModelHParams& hp = model->hparams();
  KeyChannels kc;
  Rng rng(7);
  for (int64_t i = 0; i < hp.num_layers * hp.kv_dim(); ++i) {
    kc.shift.push_back(rng.Uniform(-5.0f, 5.0f));
    kc.scale.push_back(rng.Uniform(0.25f, 3.25f));
  }
  const auto bytes = WithKeyChannels(*file, kc);
  auto file2 = GgufFile::FromBytes(bytes).value();
  auto model2 = LoadModel(*file2).value();
  ASSERT_EQ(model2->key_channels().shift, kc.shift);
  ASSERT_EQ(model2->key_channels().scale, kc.scale);

  const std::vector<int32_t> text = tok->Encode(test::ReadFile(test::SourceDir() + "/eval/stories260K-sampled.txt"));
  ThreadPool pool(2);
  PplOptions o;
  o.ctx = 256;
  const PplResult base = EvaluatePerplexity(*model, text, o, true, pool).value();
  o.key_channels = true;
  const PplResult moved = EvaluatePerplexity(*model2, text, o, true, pool).value();
  const KlResult kl = CompareLogprobs(base, moved).value();
  std::printf("f32 KV, random key shift/scale: KL %.2e, top-1 %.2f%%\n", kl.mean, 100 * kl.top1_agreement);
  EXPECT_LT(kl.max, 1e-6);
  EXPECT_NEAR(moved.ppl(), base.ppl(), 1e-4 * base.ppl());

  // What the cache holds: one token's key, raw (transform off) and transformed.
  auto key_of = [&](bool on) {
    KvCache kv(hp, 4);
    kv.storage().set_key_channels(on);
    ForwardBatch b;
    b.tokens = {tok->bos_id(), 100};
    b.positions = {0, 1};
    Workspace ws;
    EXPECT_TRUE(model2->Forward(b, kv, ws, pool).ok());
    std::vector<float> k(hp.kv_dim()), v(hp.kv_dim());
    kv.storage().Read(/*layer=*/1, 0, 1, k.data(), v.data());
    return k;
  };
  const std::vector<float> raw = key_of(false), stored = key_of(true);
  for (int64_t c = 0; c < hp.kv_dim(); ++c) {
    EXPECT_NEAR(stored[c], (raw[c] - kc.shift[hp.kv_dim() + c]) / kc.scale[hp.kv_dim() + c], 1e-4f) << c;
  }
  // Off by default for f32 keys, on by default for int8/int4.
  EXPECT_FALSE(KvStorage(1, 1, 8, 1, 16, KvType::kF32).key_channels());
  EXPECT_TRUE(KvStorage(1, 1, 8, 1, 16, KvType::kInt4, KvType::kF16).key_channels());
  EXPECT_FALSE(KvStorage(1, 1, 8, 1, 16, KvType::kF16, KvType::kInt4).key_channels());
}

// Malformed statistics are refused at load with the key named.
TEST(KvQuantTest, BadKeyChannelMetadataIsRefused) {
  auto file = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  const size_t n = 5 * 32;  // layers x KV channels
  const GgufValue ok = GgufValue::F32Array(std::vector<float>(n, 1.0f));
  std::vector<float> neg(n, 1.0f);
  neg[17] = -1.0f;
  std::vector<float> nan(n, 0.0f);
  nan[3] = NAN;
  const std::vector<std::pair<std::vector<std::pair<std::string, GgufValue>>, std::string>> cases = {
      {{{kKeyShiftKey, ok}}, "without"},
      {{{kKeyShiftKey, ok}, {kKeyScaleKey, GgufValue::F32Array(std::vector<float>(n - 1, 1.0f))}}, "expected an array of 160"},
      {{{kKeyShiftKey, ok}, {kKeyScaleKey, GgufValue::I32Array(std::vector<int32_t>(n, 1))}}, "expected an array"},
      {{{kKeyShiftKey, ok}, {kKeyScaleKey, GgufValue::F32Array(neg)}}, "positive"},
      {{{kKeyShiftKey, GgufValue::F32Array(nan)}, {kKeyScaleKey, ok}}, "finite"},
  };
  for (const auto& [extra, want] : cases) {
    const auto bytes = WithMetadata(*file, extra);
    auto f = GgufFile::FromBytes(bytes).value();
    auto m = LoadModel(*f);
    ASSERT_FALSE(m.ok()) << want;
    EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status().ToString();
  }
}

// Calibrated on the shipped calibration stories, measured on the (disjoint) eval text against f32
// KV: the per-channel key transform cuts int8's KL divergence and makes int4 keys usable.
TEST(KvQuantTest, CalibratedKeyChannelsCutTheError) {
  auto file = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  auto model = LoadModel(*file).value();
  auto tok = Tokenizer::FromGguf(*file).value();
  ThreadPool pool(2);
  const auto samples = ParseCalibration(test::ReadFile(test::SourceDir() + "/eval/stories260K-calib.jsonl"), true,
                                        *tok, CalibrationOptions{}).value();
  EXPECT_EQ(samples.size(), 16u);
  const ActivationStats stats = CollectActivationStats(*model, samples, 1, pool).value();
  const KeyChannels kc = KeyChannelsFromStats(stats, model->hparams());
  ASSERT_EQ(kc.shift.size(), 160u);
  const auto bytes = WithKeyChannels(*file, kc);
  auto file2 = GgufFile::FromBytes(bytes).value();
  auto model2 = LoadModel(*file2).value();

  const std::vector<int32_t> text = tok->Encode(test::ReadFile(test::SourceDir() + "/eval/stories260K-sampled.txt"));
  const PplResult base = EvaluatePerplexity(*model, text, PplOptions{}, true, pool).value();
  auto kl_of = [&](KvType k, bool channels) {
    PplOptions o;
    o.kv_type = k;
    o.v_kv_type = KvType::kF16;
    const PplResult r = EvaluatePerplexity(channels ? *model2 : *model, text, o, true, pool).value();
    const KlResult kl = CompareLogprobs(base, r).value();
    std::printf("K %s%s: ppl %.4f (f32 %.4f), KL %.5f, top-1 %.2f%%\n", kernels::KvTypeName(k),
                channels ? " per channel" : "", r.ppl(), base.ppl(), kl.mean, 100 * kl.top1_agreement);
    if (channels) {  // measured: int8 +0.22%, int4 +23.0%
      EXPECT_LT(std::fabs(r.ppl() / base.ppl() - 1.0), k == KvType::kInt8 ? 0.005 : 0.27);
    }
    return kl.mean;
  };
  // Measured: int8 KL 0.0019 -> 0.00044, int4 0.87 -> 0.19.
  EXPECT_LT(kl_of(KvType::kInt8, true), 0.5 * kl_of(KvType::kInt8, false));
  const double int4 = kl_of(KvType::kInt4, true);
  EXPECT_LT(int4, 0.3 * kl_of(KvType::kInt4, false));
  EXPECT_LT(int4, 0.23);  // measured 0.192
}

}  // namespace
}  // namespace gale
