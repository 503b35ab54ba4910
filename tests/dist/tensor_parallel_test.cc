// Tensor parallelism over in-process ranks (LocalGroup; tests/dist/mpi_test.sh runs the MPI
// backend under mpirun): a split into slices gives bitwise the same logits with 1, 2 or 4 ranks
// (each dense architecture, packed and not, prefill and decode steps, the engine's workload), and
// agrees with the unsplit model to rounding; what cannot be split is refused with the reason; a
// silent rank, a bad step and an abort end clearly and never hang.
#include "dist/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <latch>
#include <thread>

#include "../test_util.h"
#include "base/rng.h"
#include "dist/communicator.h"
#include "dist/pipeline.h"
#include "model/synth.h"
#include "dist_test_util.h"

namespace gale {
namespace {

// A file and one model per rank loaded from it, each split as its rank.
struct SplitModels {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
  std::vector<std::unique_ptr<Model>> ranks;
};

SynthShape TpShape(const std::string& arch) {
  SynthShape s = test::ArchTestShape(arch);
  s.num_heads = 8;
  s.num_kv_heads = 4;
  return s;
}

SplitModels Split(const SynthShape& shape, GgmlType type, int ranks, int slices, bool pack) {
  SplitModels m;
  const auto bytes = SynthesizeModel(shape, type, 11)->WriteToBytes();
  m.file = GgufFile::FromBytes(bytes).value();
  m.tok = Tokenizer::FromGguf(*m.file).value();
  for (int r = 0; r < ranks; ++r) {
    auto model = LoadModel(*m.file).value();
    const Status s = model->ShardForTensorParallel(TensorSplit{r, ranks, slices});
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (pack) model->PackWeights();
    m.ranks.push_back(std::move(model));
  }
  return m;
}

// Ranks 1..n-1 running RunTensorParallelWorker, each with its own share of the model.
class Workers : public test::WorkerThreads {
 public:
  Workers(const SplitModels& m, dist::TensorParallelOptions options, int skip_rank = -1)
      : WorkerThreads(
            static_cast<int>(m.ranks.size()),
            [&m, options](int r, dist::Communicator& comm) {
              ThreadPool pool(1);
              return dist::RunTensorParallelWorker(*m.ranks[r], comm, pool, options);
            },
            skip_rank) {}
};

// A prefill of three sequences of different lengths, then two decode steps.
std::vector<ForwardBatch> Steps(const std::vector<std::vector<int32_t>>& tables, int64_t vocab) {
  Rng rng(3);
  const std::vector<int64_t> lens = {19, 3, 11};
  std::vector<int64_t> done(lens.size(), 0);
  std::vector<ForwardBatch> steps;
  for (int step = 0; step < 3; ++step) {
    ForwardBatch b;
    for (const auto& t : tables) b.block_tables.emplace_back(t);
    for (size_t s = 0; s < lens.size(); ++s) {
      const int64_t n = step == 0 ? lens[s] : 1;
      for (int64_t i = 0; i < n; ++i) {
        b.tokens.push_back(3 + static_cast<int32_t>(rng.NextU64() % (vocab - 3)));
        b.positions.push_back(static_cast<int32_t>(done[s] + i));
        b.seq_idx.push_back(static_cast<int32_t>(s));
      }
      done[s] += n;
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
    }
    b.hidden_rows = {0, static_cast<int32_t>(b.tokens.size() - 1)};
    steps.push_back(std::move(b));
  }
  return steps;
}

struct StepOutputs {
  std::vector<std::vector<float>> logits, hidden;
};

// The steps' logits and hidden rows: through a driver over m's ranks (one rank: Model::Forward).
StepOutputs RunSteps(const SplitModels& m, kernels::KvType kv_type) {
  const Model& model = *m.ranks[0];
  const ModelHParams& hp = model.hparams();
  const KvLayout layout = model.kv_layout();
  const KvLayerGroups groups = layout.Groups(true);
  KvStorage kv(layout, groups, 256, 4, kv_type, kv_type);
  std::vector<std::vector<int32_t>> tables(groups.num_groups() * 3);
  for (size_t t = 0; t < tables.size(); ++t) {
    for (int32_t i = 0; i < 6; ++i) tables[t].push_back(static_cast<int32_t>(t * 6 + i));
  }
  dist::TensorParallelOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  std::unique_ptr<Workers> w;
  std::unique_ptr<dist::TensorParallelDriver> driver;
  if (m.ranks.size() > 1) {
    w = std::make_unique<Workers>(m, opt);
    auto d = dist::TensorParallelDriver::Connect(model, w->rank0(), opt);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (!d.ok()) return {};
    driver = std::move(d).value();
  }
  ThreadPool pool(2);
  Workspace ws;
  StepOutputs out;
  for (const ForwardBatch& b : Steps(tables, hp.vocab_size)) {
    const Status s = driver ? driver->Forward(b, kv, ws, pool) : model.Forward(b, kv, ws, pool);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out.logits.emplace_back(ws.logits.begin(), ws.logits.begin() + b.logit_rows.size() * hp.vocab_size);
    out.hidden.emplace_back(ws.hidden.begin(), ws.hidden.begin() + b.hidden_rows.size() * hp.dim);
  }
  if (driver) {
    EXPECT_TRUE(driver->Stop().ok());
    w->Join();
    for (const Status& s : w->results()) EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return out;
}

void ExpectBitwise(const StepOutputs& a, const StepOutputs& b) {
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) {
    ASSERT_EQ(a.logits[i].size(), b.logits[i].size());
    EXPECT_EQ(0, std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float))) << "step " << i;
    EXPECT_EQ(0, std::memcmp(a.hidden[i].data(), b.hidden[i].data(), a.hidden[i].size() * sizeof(float))) << "step " << i;
  }
}

// Largest |a - b| over the steps' logits, relative to the largest |b|.
double RelativeDiff(const StepOutputs& a, const StepOutputs& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    for (size_t j = 0; j < a.logits[i].size(); ++j) {
      diff = std::max(diff, static_cast<double>(std::fabs(a.logits[i][j] - b.logits[i][j])));
      scale = std::max(scale, static_cast<double>(std::fabs(b.logits[i][j])));
    }
  }
  return diff / scale;
}

// Every dense architecture, split into 4 slices: one process, 2 ranks and 4 ranks give the same
// bits (and 2 slices over 2 ranks the bits of 2 slices in one process); all close to unsplit.
// With 4 KV heads each slice has its own; with 1 every rank keeps a copy of it.
TEST(TensorParallelTest, RanksGiveOneProcessBitsForTheSameSlices) {
  for (const std::string arch : {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"}) {
    for (const int64_t kv_heads : {4, 1}) {
      SCOPED_TRACE(testing::Message() << arch << ", " << kv_heads << " KV heads");
      SynthShape shape = TpShape(arch);
      shape.num_kv_heads = kv_heads;
      const StepOutputs one4 = RunSteps(Split(shape, GgmlType::kQ8_0, 1, 4, true), kernels::KvType::kF32);
      ASSERT_FALSE(one4.logits.empty());
      // Against the unsplit model in f32 weights (8-bit weights quantize their inputs per block: a
      // last-bit difference there may round one element to its neighbour, a jump of ~1e-3 that
      // depth can carry to the logits).
      const StepOutputs whole = RunSteps(Split(shape, GgmlType::kF32, 1, 1, true), kernels::KvType::kF32);
      const StepOutputs split = RunSteps(Split(shape, GgmlType::kF32, 1, 4, true), kernels::KvType::kF32);
      EXPECT_LT(RelativeDiff(split, whole), 1e-5);
      EXPECT_GT(RelativeDiff(split, whole), 0.0);  // the additions' order does change: the test can tell
      for (int ranks : {2, 4}) {
        SCOPED_TRACE(ranks);
        ExpectBitwise(RunSteps(Split(shape, GgmlType::kQ8_0, ranks, 4, true), kernels::KvType::kF32), one4);
      }
      const StepOutputs one2 = RunSteps(Split(shape, GgmlType::kQ8_0, 1, 2, false), kernels::KvType::kF32);
      ExpectBitwise(RunSteps(Split(shape, GgmlType::kQ8_0, 2, 2, false), kernels::KvType::kF32), one2);
    }
  }
}

// Other weight and cache types: f16 weights with an int8 cache, f32 weights with an f16 cache, and
// q4_K (256-element blocks with their own scales: a wider model, so a slice holds whole blocks).
TEST(TensorParallelTest, OtherTypesSplitTheSameWay) {
  SynthShape wide = TpShape("llama");
  wide.dim = 512;
  wide.ffn_dim = 1024;
  for (auto [type, kv] : {std::pair{GgmlType::kF16, kernels::KvType::kInt8}, std::pair{GgmlType::kF32, kernels::KvType::kF16},
                          std::pair{GgmlType::kQ4_K, kernels::KvType::kF32}}) {
    SCOPED_TRACE(TypeName(static_cast<uint32_t>(type)));
    const SynthShape shape = type == GgmlType::kQ4_K ? wide : TpShape("llama");
    const StepOutputs one = RunSteps(Split(shape, type, 1, 2, true), kv);
    ExpectBitwise(RunSteps(Split(shape, type, 2, 2, true), kv), one);
  }
}

// The engine's workload through 2 ranks is, token for token and log-probability for
// log-probability, one process's with the same 2 slices.
TEST(TensorParallelTest, EngineWorkloadThroughRanksEqualsOneProcess) {
  const SynthShape shape = TpShape("qwen3");
  SplitModels one = Split(shape, GgmlType::kQ8_0, 1, 2, true);
  test::LoadedModel one_loaded{nullptr, std::move(one.ranks[0]), std::move(one.tok)};
  const std::vector<test::Collected> expected = test::RunWorkload(one_loaded, nullptr);
  ASSERT_EQ(expected.size(), 16u);

  SplitModels two = Split(shape, GgmlType::kQ8_0, 2, 2, true);
  dist::TensorParallelOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  Workers w(two, opt);
  auto driver = dist::TensorParallelDriver::Connect(*two.ranks[0], w.rank0(), opt);
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  dist::TensorParallelDriver* d = driver->get();
  test::LoadedModel two_loaded{nullptr, std::move(two.ranks[0]), std::move(two.tok)};
  const std::vector<test::Collected> got = test::RunWorkload(
      two_loaded, [d](const ForwardBatch& b, KvStorage& kv, Workspace& ws, ThreadPool& pool) { return d->Forward(b, kv, ws, pool); });
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].status.ok()) << got[i].status.ToString();
    EXPECT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].logprobs, expected[i].logprobs) << "request " << i;
  }
  ASSERT_TRUE(d->Stop().ok());
}

Status ShardStatus(const SynthShape& shape, GgmlType type, TensorSplit split) {
  auto synth = SynthesizeModel(shape, type, 11);
  if (!synth.ok()) return synth.status();
  auto file = GgufFile::FromBytes(synth->WriteToBytes());
  if (!file.ok()) return file.status();
  auto model = LoadModel(**file);
  if (!model.ok()) return model.status();
  return (*model)->ShardForTensorParallel(split);
}

void ExpectRefused(const Status& s, const std::string& why) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(why), std::string::npos) << s.ToString();
}

TEST(TensorParallelTest, WhatCannotBeSplitIsRefusedWithTheReason) {
  ExpectRefused(ShardStatus(test::ArchTestShape("qwen3moe"), GgmlType::kQ8_0, {0, 2, 2}), "mixture of experts");
  ExpectRefused(ShardStatus(test::ArchTestShape("deepseek2"), GgmlType::kQ8_0, {0, 2, 2}), "latent attention");
  SynthShape bert = test::ArchTestShape("bert");
  bert.num_kv_heads = bert.num_heads;
  ExpectRefused(ShardStatus(bert, GgmlType::kF32, {0, 2, 2}), "encoder");
  // Four heads over eight slices; three KV heads for six heads over two slices (neither split nor
  // copied whole); attention output rows of 256 in q4_K's 256-element blocks over two slices.
  ExpectRefused(ShardStatus(test::ArchTestShape("llama"), GgmlType::kQ8_0, {0, 8, 8}), "do not divide");
  SynthShape three = TpShape("llama");
  three.num_heads = 6;
  three.num_kv_heads = 3;
  three.head_dim = 32;
  ExpectRefused(ShardStatus(three, GgmlType::kQ8_0, {0, 2, 2}), "do not divide");
  SynthShape wide = TpShape("llama");
  wide.dim = 256;
  wide.ffn_dim = 512;
  ExpectRefused(ShardStatus(wide, GgmlType::kQ4_K, {0, 2, 2}), "256-element blocks");
  ExpectRefused(ShardStatus(TpShape("llama"), GgmlType::kQ8_0, {0, 2, 3}), "multiple of the ranks");
  ExpectRefused(ShardStatus(TpShape("llama"), GgmlType::kQ8_0, {0, 1, 3}), "power of two");
  EXPECT_TRUE(ShardStatus(TpShape("llama"), GgmlType::kQ8_0, {1, 2, 4}).ok());
}

// A bad step (a block id past the cache) fails alone with its reason on every rank; the next runs.
TEST(TensorParallelTest, ABadStepFailsAloneWithItsReason) {
  const SplitModels m = Split(TpShape("llama"), GgmlType::kQ8_0, 2, 2, false);
  dist::TensorParallelOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  Workers w(m, opt);
  auto driver = dist::TensorParallelDriver::Connect(*m.ranks[0], w.rank0(), opt);
  ASSERT_TRUE(driver.ok());
  KvStorage kv(m.ranks[0]->kv_layout(), KvLayerGroups::Single(2), 8, 4, kernels::KvType::kF32, kernels::KvType::kF32);
  Workspace ws;
  ThreadPool pool(1);
  const std::vector<int32_t> good = {0, 1}, bad = {0, 99};
  ForwardBatch b;
  for (int i = 0; i < 6; ++i) {
    b.tokens.push_back(5 + i);
    b.positions.push_back(i);
  }
  b.block_tables.emplace_back(bad);
  Status s = (*driver)->Forward(b, kv, ws, pool);
  EXPECT_NE(s.message().find("block id 99"), std::string::npos) << s.ToString();
  b.block_tables = {good};
  s = (*driver)->Forward(b, kv, ws, pool);
  EXPECT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE((*driver)->Stop().ok());
  w.Join();
  for (const Status& r : w.results()) EXPECT_TRUE(r.ok()) << r.ToString();
}

// A rank that never answers: start-up gives up naming it; one silent mid-step fails the step
// within the timeout and every later one at once; Abort ends a step in flight, and the live ranks
// still finish it and take the stop.
TEST(TensorParallelTest, ASilentRankOrAnAbortEndsClearly) {
  const SplitModels m = Split(TpShape("llama"), GgmlType::kQ8_0, 2, 2, false);
  dist::TensorParallelOptions opt;
  opt.timeout = std::chrono::milliseconds(300);
  {
    Workers w(m, opt, /*skip_rank=*/1);
    auto driver = dist::TensorParallelDriver::Connect(*m.ranks[0], w.rank0(), opt);
    ASSERT_FALSE(driver.ok());
    EXPECT_NE(driver.status().message().find("rank 1"), std::string::npos) << driver.status().ToString();
  }
  KvStorage kv(m.ranks[0]->kv_layout(), KvLayerGroups::Single(2), 64, 4, kernels::KvType::kF32, kernels::KvType::kF32);
  std::vector<int32_t> table(64);
  for (int i = 0; i < 64; ++i) table[i] = i;
  ForwardBatch b;
  for (int i = 0; i < 200; ++i) {
    b.tokens.push_back(5 + i % 50);
    b.positions.push_back(i);
  }
  b.block_tables.emplace_back(table);
  ThreadPool pool(1);
  Workspace ws;
  {
    // Rank 1 says hello, then is gone before the step (told to stop).
    Workers w(m, opt);
    auto driver = dist::TensorParallelDriver::Connect(*m.ranks[0], w.rank0(), opt);
    ASSERT_TRUE(driver.ok()) << driver.status().ToString();
    (void)dist::StopWorkers(w.rank0(), std::chrono::milliseconds(1000));
    w.Join();
    const auto start = std::chrono::steady_clock::now();
    Status s = (*driver)->Forward(b, kv, ws, pool);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    s = (*driver)->Forward(b, kv, ws, pool);
    EXPECT_FALSE(s.ok());
  }
  {
    // Aborted before a step: the step fails at once with the reason, and Stop still ends the live
    // ranks cleanly.
    Workers w(m, opt);
    auto driver = dist::TensorParallelDriver::Connect(*m.ranks[0], w.rank0(), opt);
    ASSERT_TRUE(driver.ok());
    (*driver)->Abort("the server is stopping");
    Status s = (*driver)->Forward(b, kv, ws, pool);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("the server is stopping"), std::string::npos) << s.ToString();
    EXPECT_FALSE((*driver)->Forward(b, kv, ws, pool).ok());
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE((*driver)->Stop().ok());
    w.Join();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    for (const Status& r : w.results()) EXPECT_TRUE(r.ok()) << r.ToString();
  }
  {
    // Aborted while a step waits on a rank that is gone: the wait ends with the reason, long
    // before the timeout (the abort lands just before the step or during it: the same answer).
    dist::TensorParallelOptions slow = opt;
    slow.timeout = std::chrono::milliseconds(20000);
    Workers w(m, slow);
    auto driver = dist::TensorParallelDriver::Connect(*m.ranks[0], w.rank0(), slow);
    ASSERT_TRUE(driver.ok());
    (void)dist::StopWorkers(w.rank0(), std::chrono::milliseconds(1000));
    w.Join();
    std::latch stepping(1);
    std::thread aborter([&] {
      stepping.wait();
      (*driver)->Abort("the server is stopping");
    });
    const auto start = std::chrono::steady_clock::now();
    stepping.count_down();
    Status s = (*driver)->Forward(b, kv, ws, pool);
    aborter.join();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("the server is stopping"), std::string::npos) << s.ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    EXPECT_FALSE((*driver)->Forward(b, kv, ws, pool).ok());
  }
}

// A rank split differently (or loaded from another file) is refused at start-up.
TEST(TensorParallelTest, AnotherSplitIsRefused) {
  const SplitModels m = Split(TpShape("llama"), GgmlType::kQ8_0, 2, 2, false);
  const SplitModels other = Split(TpShape("llama"), GgmlType::kQ8_0, 2, 4, false);
  dist::TensorParallelOptions opt;
  opt.timeout = std::chrono::milliseconds(5000);
  auto comms = dist::LocalGroup(2);
  std::thread worker([&] {
    ThreadPool pool(1);
    (void)dist::RunTensorParallelWorker(*other.ranks[1], *comms[1], pool, opt);
  });
  auto driver = dist::TensorParallelDriver::Connect(*m.ranks[0], *comms[0], opt);
  ASSERT_FALSE(driver.ok());
  EXPECT_NE(driver.status().message().find("different model or split"), std::string::npos) << driver.status().ToString();
  (void)dist::StopWorkers(*comms[0], std::chrono::milliseconds(1000));
  worker.join();
}

}  // namespace
}  // namespace gale
