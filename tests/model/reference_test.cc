// stories260K against llama2.c's run.c (../shared/models/stories260K.reference.json): prompt
// tokens, greedy continuations and logits after the prompt, from three GGUF files (the vendored
// one, one converted now by gale, and llama.cpp's conversion), on every kernel ISA this CPU has.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "base/fp16.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "runner/generate.h"
#include "convert/llama2c_convert.h"

namespace gale {
namespace {

using nlohmann::json;

const json& Reference() {
  static const json ref = [] {
    std::ifstream f(test::SharedDir() + "/models/stories260K.reference.json");
    EXPECT_TRUE(f.good()) << "missing " << test::SharedDir() << "/models/stories260K.reference.json";
    return json::parse(f);
  }();
  return ref;
}

// Deletes the converted file when the test process exits.
struct TempFile {
  std::string path;
  ~TempFile() {
    if (!path.empty()) std::remove(path.c_str());
  }
};

std::string ConvertedNow() {
  static TempFile file;
  static const std::string path = [] {
    // One file per process: ctest runs the tests of this suite in parallel processes, and one
    // rewriting the file while another has it mapped fails both.
    const std::string out =
        (std::filesystem::temp_directory_path() / fmt::format("gale_ref_stories260K.{}.gguf", getpid())).string();
    auto w = ConvertLlama2c(test::SharedDir() + "/models/stories260K.bin", test::SharedDir() + "/models/tok512.bin");
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_TRUE(w->WriteFile(out).ok());
    file.path = out;
    return out;
  }();
  return path;
}

struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
};

Loaded Load(const std::string& path) {
  Loaded l;
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  l.file = std::move(*f);
  auto m = LoadModel(*l.file);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  l.model = std::move(*m);
  auto t = Tokenizer::FromGguf(*l.file);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  l.tok = std::move(*t);
  return l;
}

class ReferenceTest : public ::testing::TestWithParam<std::tuple<std::string, kernels::Isa>> {
 protected:
  void SetUp() override {
    const kernels::Isa isa = std::get<1>(GetParam());
    if (kernels::GetKernelTable(isa) == nullptr) GTEST_SKIP() << "this CPU has no " << kernels::IsaName(isa);
    kernels::SetActiveIsa(isa);
    const std::string& which = std::get<0>(GetParam());
    GALE_SKIP_UNLESS_FILE(test::SharedDir() + "/models/stories260K.reference.json");
    if (which != "vendored") GALE_SKIP_UNLESS_FILE(test::SharedDir() + "/models/stories260K.bin");
    if (which == "llamacpp") GALE_SKIP_UNLESS_FILE(test::SharedDir() + "/models/stories260K.llamacpp.gguf");
    path_ = which == "vendored"   ? test::SourceDir() + "/models/stories260K.gguf"
            : which == "llamacpp" ? test::SharedDir() + "/models/stories260K.llamacpp.gguf"
                                  : ConvertedNow();
    m_ = Load(path_);
  }
  void TearDown() override { kernels::SetActiveIsa(kernels::BestIsa()); }

  std::string path_;
  Loaded m_;
};

TEST_P(ReferenceTest, PromptTokensGreedyTokensAndLogits) {
  ThreadPool pool(2);
  const ModelHParams& hp = m_.model->hparams();
  ASSERT_EQ(hp.vocab_size, 512);
  for (const json& c : Reference()["cases"]) {
    const std::string prompt = c["prompt"];
    SCOPED_TRACE("prompt '" + prompt + "' from " + path_);
    const std::vector<int32_t> tokens = m_.tok->Encode(prompt);
    EXPECT_EQ(tokens, c["prompt_tokens"].get<std::vector<int32_t>>());

    KvCache kv(hp, 512);
    Workspace ws;
    GenerateOptions go;
    go.max_new_tokens = c["n_new_tokens"].get<int64_t>();
    go.sampling.temperature = 0.0f;
    go.stop_ids = {1};  // run.c stops when BOS is sampled
    std::vector<int32_t> generated;
    std::vector<float> first_logits;
    auto stats = Generate(*m_.model, tokens, go, kv, ws, pool, [&](int32_t id) {
      if (generated.empty()) first_logits.assign(ws.logits.begin(), ws.logits.begin() + hp.vocab_size);
      generated.push_back(id);
      return true;
    });
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(generated, c["tokens"].get<std::vector<int32_t>>());

    const auto want = c["logits_after_prompt"].get<std::vector<float>>();
    ASSERT_EQ(want.size(), first_logits.size());
    float max_diff = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) max_diff = std::max(max_diff, std::fabs(want[i] - first_logits[i]));
    EXPECT_LE(max_diff, 1e-5f) << "max |logit - run.c logit|";
    std::printf("%s %s max_diff %.3g\n", path_.c_str(), kernels::IsaName(kernels::Active().isa), max_diff);

    Detokenizer detok(*m_.tok, prompt.empty());
    std::string text;
    for (int32_t id : generated) text += detok.Push(id);
    text += detok.Flush();
    EXPECT_EQ(text, c["completion_text"].get<std::string>());
  }
}

TEST_P(ReferenceTest, TeacherForcedPerplexity) {
  const json& r = Reference()["teacher_forced_perplexity"];
  const auto tokens = r["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(m_.tok->Encode(r["sentence"].get<std::string>()), tokens);
  ThreadPool pool(2);
  KvCache kv(m_.model->hparams(), 64);
  Workspace ws;
  ForwardBatch b;
  b.tokens.assign(tokens.begin(), tokens.end() - 1);
  for (size_t i = 0; i + 1 < tokens.size(); ++i) b.positions.push_back(static_cast<int32_t>(i));
  b.all_logits = true;
  ASSERT_TRUE(m_.model->Forward(b, kv, ws, pool).ok());
  const int64_t vocab = m_.model->hparams().vocab_size;
  double nll = 0.0;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const float* l = ws.logits.data() + i * vocab;
    double max = l[0];
    for (int64_t j = 1; j < vocab; ++j) max = std::max<double>(max, l[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(l[j] - max);
    nll += -(l[tokens[i + 1]] - max - std::log(sum));
  }
  EXPECT_NEAR(nll, r["nll_sum"].get<double>(), 1e-3);
}

// The logits of the last prompt position are bitwise the same whether the prompt is fed as one
// batch, token by token, or in uneven chunks (batch invariance).
TEST_P(ReferenceTest, PrefillChunkingIsBitwiseInvariant) {
  const std::vector<int32_t> tokens = m_.tok->Encode("Once upon a time there was a big dog named Max");
  ThreadPool pool(2), one(1);
  auto run = [&](const std::vector<size_t>& chunks, ThreadPool& p) {
    KvCache kv(m_.model->hparams(), 64);
    Workspace ws;
    size_t at = 0;
    for (size_t n : chunks) {
      ForwardBatch b;
      for (size_t i = at; i < at + n; ++i) {
        b.tokens.push_back(tokens[i]);
        b.positions.push_back(static_cast<int32_t>(i));
      }
      EXPECT_TRUE(m_.model->Forward(b, kv, ws, p).ok());
      at += n;
    }
    return std::vector<float>(ws.logits.begin(), ws.logits.begin() + m_.model->hparams().vocab_size);
  };
  const auto whole = run({tokens.size()}, pool);
  const auto single = run(std::vector<size_t>(tokens.size(), 1), one);
  const auto uneven = run({3, 1, tokens.size() - 4}, pool);
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_EQ(F32Bits(whole[i]), F32Bits(single[i])) << i;
    ASSERT_EQ(F32Bits(whole[i]), F32Bits(uneven[i])) << i;
  }
}

// Sequences batched into one forward get bitwise the logits they get alone.
TEST_P(ReferenceTest, MultiSequenceBatchIsBitwiseInvariant) {
  const std::vector<std::vector<int32_t>> prompts = {m_.tok->Encode("Once upon a time"), m_.tok->Encode("The dog ran"),
                                                     m_.tok->Encode("Lily and Tom went to the park to play")};
  const int64_t vocab = m_.model->hparams().vocab_size;
  ThreadPool pool(2);
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) {
    KvCache kv(m_.model->hparams(), 64);
    Workspace ws;
    ForwardBatch b;
    b.tokens = p;
    for (size_t i = 0; i < p.size(); ++i) b.positions.push_back(static_cast<int32_t>(i));
    ASSERT_TRUE(m_.model->Forward(b, kv, ws, pool).ok());
    alone.emplace_back(ws.logits.begin(), ws.logits.begin() + vocab);
  }
  KvCache caches(m_.model->hparams(), 64, static_cast<int64_t>(prompts.size()));
  ForwardBatch b;
  for (size_t s = 0; s < prompts.size(); ++s) {
    for (size_t i = 0; i < prompts[s].size(); ++i) {
      b.tokens.push_back(prompts[s][i]);
      b.positions.push_back(static_cast<int32_t>(i));
      b.seq_idx.push_back(static_cast<int32_t>(s));
    }
    b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
  }
  Workspace ws;
  ASSERT_TRUE(m_.model->Forward(b, caches, ws, pool).ok());
  for (size_t s = 0; s < prompts.size(); ++s) {
    for (int64_t i = 0; i < vocab; ++i) ASSERT_EQ(F32Bits(ws.logits[s * vocab + i]), F32Bits(alone[s][i])) << s;
  }
  ForwardBatch bad = b;
  bad.seq_idx[0] = 7;
  EXPECT_FALSE(m_.model->Forward(bad, caches, ws, pool).ok());
}

INSTANTIATE_TEST_SUITE_P(
    AllFilesAllIsas, ReferenceTest,
    ::testing::Combine(::testing::Values("vendored", "converted", "llamacpp"),
                       ::testing::Values(kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + kernels::IsaName(std::get<1>(info.param));
    });

}  // namespace
}  // namespace gale
