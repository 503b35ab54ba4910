// gale convert and gale synth: the vendored default model is exactly what convert produces;
// bad checkpoints are errors; synthetic models load, tokenize and run for every type.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>
#include <fstream>

#include "../test_util.h"
#include "base/fp16.h"
#include "base/rng.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "runner/generate.h"
#include "convert/llama2c_convert.h"
#include "model/synth.h"
#include "kernels/kernels.h"

namespace gale {
namespace {

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(ConvertTest, VendoredModelIsTheConversionOfTheSharedCheckpoint) {
  GALE_SKIP_UNLESS_FILE(test::SharedDir() + "/models/stories260K.bin");
  auto w = ConvertLlama2c(test::SharedDir() + "/models/stories260K.bin", test::SharedDir() + "/models/tok512.bin");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->WriteToBytes(), ReadBytes(test::SourceDir() + "/models/stories260K.gguf"));
}

// What llama.cpp's own converter wrote for the same checkpoint is what we write: same keys with
// the same value types, the same vocab, the same tensor names, shapes and bytes (llama.cpp also
// writes output.weight as a copy of the tied embedding; we leave it out, which it accepts).
TEST(ConvertTest, MatchesLlamaCppConversion) {
  GALE_SKIP_UNLESS_FILE(test::SharedDir() + "/models/stories260K.bin");
  GALE_SKIP_UNLESS_FILE(test::SharedDir() + "/models/stories260K.llamacpp.gguf");
  auto theirs = GgufFile::Open(test::SharedDir() + "/models/stories260K.llamacpp.gguf");
  auto ours = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf");
  ASSERT_TRUE(theirs.ok() && ours.ok());
  for (const auto& [key, value] : (*theirs)->metadata()) {
    if (key == "tokenizer.ggml.seperator_token_id" || key == "tokenizer.ggml.padding_token_id") continue;
    const GgufValue* mine = (*ours)->Find(key);
    ASSERT_NE(mine, nullptr) << key;
    EXPECT_EQ(mine->type, value.type) << key;
    if (key.rfind("tokenizer.", 0) == 0 || key.find("embedding_length") != std::string::npos ||
        key.find("head_count") != std::string::npos || key.find("block_count") != std::string::npos) {
      EXPECT_TRUE(*mine == value) << key;
    }
  }
  for (const auto& t : (*ours)->tensors()) {
    const GgufTensorInfo* o = (*theirs)->FindTensor(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(o->shape, t.shape) << t.name;
    EXPECT_EQ(o->type_id, t.type_id) << t.name;
    ASSERT_EQ(o->num_bytes, t.num_bytes);
    EXPECT_EQ(std::memcmp(o->data, t.data, t.num_bytes), 0) << t.name;
  }
}

TEST(ConvertTest, TruncatedOrCorruptCheckpointsAreErrors) {
  GALE_SKIP_UNLESS_FILE(test::SharedDir() + "/models/stories260K.bin");
  const std::string tok = test::SharedDir() + "/models/tok512.bin";
  std::vector<uint8_t> model = ReadBytes(test::SharedDir() + "/models/stories260K.bin");
  auto write = [&](const std::vector<uint8_t>& b) {
    const std::string p = test::TempPath("bad_llama2c.bin");
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
    return p;
  };
  auto truncated = model;
  truncated.resize(truncated.size() - 4);
  EXPECT_NE(ConvertLlama2c(write(truncated), tok).status().message().find("header describes"), std::string::npos);
  auto bad = model;
  int32_t zero = 0;
  std::memcpy(bad.data(), &zero, 4);
  EXPECT_NE(ConvertLlama2c(write(bad), tok).status().message().find("implausible"), std::string::npos);
  EXPECT_FALSE(ConvertLlama2c(write({1, 2, 3}), tok).ok());
  EXPECT_EQ(ConvertLlama2c("/nonexistent/x.bin", tok).status().code(), StatusCode::kIoError);
  auto tok_bytes = ReadBytes(tok);
  tok_bytes.resize(100);
  const std::string tp = test::TempPath("bad_tok.bin");
  std::ofstream(tp, std::ios::binary).write(reinterpret_cast<const char*>(tok_bytes.data()), tok_bytes.size());
  EXPECT_NE(ConvertLlama2c(test::SharedDir() + "/models/stories260K.bin", tp).status().message().find("truncated"),
            std::string::npos);
}

TEST(SynthTest, EveryTypeLoadsTokenizesAndRuns) {
  auto shape = NamedSynthShape("tiny");
  ASSERT_TRUE(shape.ok());
  for (const char* type_name : {"f32", "f16", "bf16", "q8_0", "q4_0"}) {
    auto w = SynthesizeModel(*shape, *ParseTypeName(type_name), 7);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const auto bytes = w->WriteToBytes();
    auto f = GgufFile::FromBytes(bytes);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    auto m = LoadModel(**f);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto t = Tokenizer::FromGguf(**f);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const auto prompt = (*t)->Encode("hello world, the quick brown fox");
    EXPECT_EQ((*t)->Decode(prompt), "hello world, the quick brown fox");
    EXPECT_LT(prompt.size(), 20u);  // pieces merge; not one token per byte
    ThreadPool pool(2);
    KvCache kv((*m)->hparams(), 64);
    Workspace ws;
    GenerateOptions go;
    go.max_new_tokens = 8;
    go.sampling.temperature = 0.0f;
    int n = 0;
    auto stats = Generate(**m, prompt, go, kv, ws, pool, [&](int32_t) { return ++n > 0; });
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(n, 8);
    for (int64_t i = 0; i < (*m)->hparams().vocab_size; ++i) ASSERT_TRUE(std::isfinite(ws.logits[i]));
  }
}

TEST(SynthTest, DeterministicAndShapesAreValidated) {
  auto shape = NamedSynthShape("tiny");
  auto a = SynthesizeModel(*shape, GgmlType::kQ4_0, 3)->WriteToBytes();
  auto b = SynthesizeModel(*shape, GgmlType::kQ4_0, 3)->WriteToBytes();
  auto c = SynthesizeModel(*shape, GgmlType::kQ4_0, 4)->WriteToBytes();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_FALSE(NamedSynthShape("7b").ok());
  EXPECT_FALSE(SynthesizeModel(*shape, GgmlType::kQ4_K, 1).ok());
  SynthShape odd = *shape;
  odd.ffn_dim = 100;  // not a multiple of 32
  EXPECT_FALSE(SynthesizeModel(odd, GgmlType::kQ8_0, 1).ok());
  EXPECT_TRUE(SynthesizeModel(odd, GgmlType::kF16, 1).ok());
  auto big = NamedSynthShape("tinyllama-1.1b");
  EXPECT_EQ(big->num_kv_heads, 4);
}

// A model whose matrices are K-quants (a mix of Q2_K, Q3_K, Q4_K, Q5_K and Q6_K) gives bitwise
// the logits of the same model with those matrices dequantized to F32 by the reference decoder.
TEST(ModelLoadTest, KQuantModelEqualsItsF32Dequantization) {
  const SynthShape shape = test::SmallGqaShape(300);
  auto base = SynthesizeModel(shape, GgmlType::kF32, 5);
  ASSERT_TRUE(base.ok());
  const auto base_bytes = base->WriteToBytes();
  auto f = GgufFile::FromBytes(base_bytes);
  ASSERT_TRUE(f.ok());
  GgufWriter kq, deq;
  for (const auto& [k, v] : (*f)->metadata()) {
    kq.SetValue(k, v);
    deq.SetValue(k, v);
  }
  Rng rng(9);
  int n = 0;
  for (const auto& t : (*f)->tensors()) {
    std::vector<uint8_t> data(t.data, t.data + t.num_bytes);
    if (t.shape.size() != 2 || t.name == "token_embd.weight") {
      ASSERT_TRUE(kq.AddTensor(t.name, t.type_id, t.shape, data).ok());
      ASSERT_TRUE(deq.AddTensor(t.name, t.type_id, t.shape, data).ok());
      continue;
    }
    const GgmlType types[] = {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                              GgmlType::kQ6_K};
    const GgmlType kt = types[n++ % 5];
    const int64_t elems = t.shape[0] * t.shape[1];
    std::vector<uint8_t> blocks(RowBytes(kt, t.shape[0]) * t.shape[1]);
    for (auto& b : blocks) b = static_cast<uint8_t>(rng.NextU64());
    const int64_t bb = TypeTraits(kt).block_bytes;
    for (int64_t i = 0; i < elems / kQK_K; ++i) {  // sane super-block scales
      const uint16_t d = Fp32ToFp16(0.004f), dmin = Fp32ToFp16(0.002f);
      uint8_t* blk = blocks.data() + i * bb;
      if (kt == GgmlType::kQ6_K) {
        std::memcpy(blk + 208, &d, 2);
      } else if (kt == GgmlType::kQ3_K) {
        std::memcpy(blk + 108, &d, 2);
      } else if (kt == GgmlType::kQ2_K) {
        std::memcpy(blk + 80, &d, 2);
        std::memcpy(blk + 82, &dmin, 2);
      } else {
        std::memcpy(blk, &d, 2);
        std::memcpy(blk + 2, &dmin, 2);
      }
    }
    std::vector<float> f32(elems);
    DequantizeRowRef(kt, blocks.data(), f32.data(), elems);
    std::vector<uint8_t> f32_bytes(elems * 4);
    std::memcpy(f32_bytes.data(), f32.data(), f32_bytes.size());
    ASSERT_TRUE(kq.AddTensor(t.name, static_cast<uint32_t>(kt), t.shape, blocks).ok());
    ASSERT_TRUE(deq.AddTensor(t.name, 0, t.shape, f32_bytes).ok());
  }
  const auto kq_bytes = kq.WriteToBytes();
  const auto deq_bytes = deq.WriteToBytes();
  auto fk = GgufFile::FromBytes(kq_bytes);
  auto fd = GgufFile::FromBytes(deq_bytes);
  ASSERT_TRUE(fk.ok() && fd.ok());
  // The ISAs whose K-quant products dequantize each row to f32 (AVX2's take int8 activations, as
  // llama.cpp's do, and are checked against the reference in kernels_test).
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx512}) {
    if (kernels::GetKernelTable(isa) == nullptr) continue;
    kernels::SetActiveIsa(isa);  // before loading: weights are packed for the active ISA
    auto mk = LoadModel(**fk);
    auto md = LoadModel(**fd);
    ASSERT_TRUE(mk.ok()) << mk.status().ToString();
    ASSERT_TRUE(md.ok());
    ThreadPool pool(2);
    ForwardBatch b;
    b.tokens = {1, 50, 60, 70};
    b.positions = {0, 1, 2, 3};
    b.all_logits = true;
    KvCache kv1((*mk)->hparams(), 8), kv2((*md)->hparams(), 8);
    Workspace w1, w2;
    ASSERT_TRUE((*mk)->Forward(b, kv1, w1, pool).ok());
    ASSERT_TRUE((*md)->Forward(b, kv2, w2, pool).ok());
    for (int64_t i = 0; i < 4 * 300; ++i) {
      ASSERT_TRUE(std::isfinite(w1.logits[i]));
      ASSERT_EQ(F32Bits(w1.logits[i]), F32Bits(w2.logits[i])) << kernels::IsaName(isa) << " " << i;
    }
  }
  kernels::SetActiveIsa(kernels::BestIsa());
}

TEST(ModelLoadTest, WrongShapesAndMissingTensorsAreClearErrors) {
  auto shape = NamedSynthShape("tiny");
  auto w = SynthesizeModel(*shape, GgmlType::kF32, 1);
  auto bytes = w->WriteToBytes();
  auto f = GgufFile::FromBytes(bytes);
  // Rebuild without one tensor and with one reshaped.
  GgufWriter missing, reshaped;
  for (const auto& [k, v] : (*f)->metadata()) {
    missing.SetValue(k, v);
    reshaped.SetValue(k, v);
  }
  for (const auto& t : (*f)->tensors()) {
    std::vector<uint8_t> data(t.data, t.data + t.num_bytes);
    if (t.name != "blk.1.ffn_up.weight") {
      ASSERT_TRUE(missing.AddTensor(t.name, t.type_id, t.shape, data).ok());
    }
    auto s = t.shape;
    if (t.name == "blk.0.attn_k.weight") std::swap(s[0], s[1]);
    ASSERT_TRUE(reshaped.AddTensor(t.name, t.type_id, s, data).ok());
  }
  auto mb = missing.WriteToBytes();
  auto m = LoadModel(**GgufFile::FromBytes(mb));
  EXPECT_NE(m.status().message().find("blk.1.ffn_up.weight"), std::string::npos) << m.status().message();
  auto rb = reshaped.WriteToBytes();
  auto r = LoadModel(**GgufFile::FromBytes(rb));
  EXPECT_NE(r.status().message().find("blk.0.attn_k.weight: expected shape"), std::string::npos) << r.status().message();
}

// A tensor the llama architecture does not use (another architecture's, a layer past the count)
// is named in a load warning; a bad rope_freqs tensor is an error. Nothing is silently ignored.
TEST(ModelLoadTest, UnusedTensorsAreNamedAndBadRopeFreqsRefused) {
  auto shape = NamedSynthShape("tiny");
  auto bytes = SynthesizeModel(*shape, GgmlType::kF32, 1)->WriteToBytes();
  auto f = GgufFile::FromBytes(bytes).value();
  EXPECT_TRUE(LoadModel(*f).value()->load_warnings().empty());
  auto with_extra = [&](const std::string& name, std::vector<int64_t> tshape, float value) {
    GgufWriter w;
    for (const auto& [k, v] : f->metadata()) w.SetValue(k, v);
    for (const auto& t : f->tensors()) {
      EXPECT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
    }
    int64_t n = 1;
    for (int64_t d : tshape) n *= d;
    std::vector<float> v(static_cast<size_t>(n), value);
    std::vector<uint8_t> data(v.size() * 4);
    std::memcpy(data.data(), v.data(), data.size());
    EXPECT_TRUE(w.AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), tshape, data).ok());
    return w.WriteToBytes();
  };
  for (const char* name : {"blk.0.attn_q_norm.weight", "blk.9.attn_norm.weight", "output.bias"}) {
    const auto b = with_extra(name, {4}, 1.0f);
    auto m = LoadModel(**GgufFile::FromBytes(b));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ((*m)->load_warnings().size(), 1u) << name;
    EXPECT_NE((*m)->load_warnings()[0].find(name), std::string::npos) << (*m)->load_warnings()[0];
  }
  const int64_t half = (*shape).dim / (*shape).num_heads / 2;
  const auto ok = with_extra("rope_freqs.weight", {half}, 2.0f);
  auto m = LoadModel(**GgufFile::FromBytes(ok));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE((*m)->load_warnings().empty());
  const auto wrong = with_extra("rope_freqs.weight", {half + 1}, 2.0f);
  EXPECT_NE(LoadModel(**GgufFile::FromBytes(wrong)).status().message().find("rope_freqs.weight"), std::string::npos);
  const auto zero = with_extra("rope_freqs.weight", {half}, 0.0f);
  EXPECT_NE(LoadModel(**GgufFile::FromBytes(zero)).status().message().find("not positive"), std::string::npos);
}

}  // namespace
}  // namespace gale
