// Pipeline parallelism over in-process ranks (LocalGroup; the MPI backend runs the same code under
// mpirun in tests/dist/mpi_test.sh): a step's logits through 2-4 stages and 1-4 micro-batches
// are bitwise one process's; the engine's exactness workload through stages gives what one
// process gives; a stage's error, a rank that stops answering, an abort and a rank with another
// model each fail clearly and never hang. Plus the collectives' fixed order.
#include "dist/pipeline.h"

#include <gtest/gtest.h>

#include <cstring>
#include <latch>
#include <thread>

#include "../test_util.h"
#include "dist_test_util.h"
#include "base/rng.h"
#include "dist/communicator.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "model/synth.h"

namespace gale {
namespace {

using TestModel = test::LoadedModel;
using test::Collected;
using test::RunWorkload;

TestModel Synthetic(const std::string& arch, int64_t num_layers, GgmlType type = GgmlType::kQ8_0) {
  SynthShape shape = test::ArchTestShape(arch);
  shape.num_layers = std::max(shape.num_layers, num_layers);
  return test::SynthModel(shape, type);
}

// Ranks 1..n-1 running RunPipelineWorker, the last one on other_model where given.
class Workers : public test::WorkerThreads {
 public:
  Workers(const Model& model, int n, dist::PipelineOptions options, int skip_rank = -1,
          const Model* other_model = nullptr)
      : WorkerThreads(
            n,
            [&model, n, options, other_model](int r, dist::Communicator& comm) {
              ThreadPool pool(1);
              const Model& m = (other_model != nullptr && r == n - 1) ? *other_model : model;
              return dist::RunPipelineWorker(m, comm, pool, options);
            },
            skip_rank) {}
};

TEST(PipelineTest, StageLayersCoverEveryLayerOnce) {
  EXPECT_EQ(dist::StageLayers(8, 2), (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 8}}));
  EXPECT_EQ(dist::StageLayers(7, 3), (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ(dist::StageLayers(4, 4), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
}

TEST(PipelineTest, MicroBatchesCutAtSequencesAndMapTheirRows) {
  ForwardBatch b;
  // Three sequences of 5, 1 and 4 tokens; logits wanted for the last of each and one prompt row.
  const std::vector<int32_t> lens = {5, 1, 4};
  std::vector<std::vector<int32_t>> tables = {{0, 1}, {2}, {3, 4}};
  for (int32_t s = 0; s < 3; ++s) {
    for (int32_t p = 0; p < lens[s]; ++p) {
      b.tokens.push_back(7 + p);
      b.positions.push_back(p);
      b.seq_idx.push_back(s);
    }
    b.block_tables.emplace_back(tables[s]);
  }
  b.logit_rows = {4, 2, 5, 9};
  b.hidden_rows = {6};
  const auto mbs = dist::SplitMicroBatches(b, 1, 2);
  ASSERT_EQ(mbs.size(), 2u);
  EXPECT_EQ(mbs[0].batch.tokens.size(), 5u);  // sequence 0 alone: the cut nearest half the tokens
  EXPECT_EQ(mbs[0].logit_out, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(mbs[0].batch.logit_rows, (std::vector<int32_t>{4, 2}));
  EXPECT_EQ(mbs[1].first_token, 5);
  EXPECT_EQ(mbs[1].batch.seq_idx, (std::vector<int32_t>{0, 1, 1, 1, 1}));
  EXPECT_EQ(mbs[1].batch.logit_rows, (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(mbs[1].logit_out, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(mbs[1].batch.hidden_rows, (std::vector<int32_t>{1}));
  EXPECT_EQ(mbs[1].hidden_out, (std::vector<int32_t>{0}));
  ASSERT_EQ(mbs[1].batch.block_tables.size(), 2u);
  EXPECT_EQ(mbs[1].batch.block_tables[1].data(), tables[2].data());
  // More parts than sequences: one per sequence; a part that wants no logits computes its last row.
  b.logit_rows = {4};
  const auto three = dist::SplitMicroBatches(b, 1, 8);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[1].logit_out, (std::vector<int32_t>{-1}));
  // Tokens not grouped by sequence: one part.
  std::swap(b.seq_idx[0], b.seq_idx[6]);
  EXPECT_EQ(dist::SplitMicroBatches(b, 1, 3).size(), 1u);
}

// Prefill of three sequences of different lengths, then two decode steps, each step's logits
// bitwise those of Model::Forward in one process over its own cache.
void ExpectStepsEqualOneProcess(const TestModel& m, int num_stages, int micro_batches, kernels::KvType kv_type) {
  SCOPED_TRACE(testing::Message() << num_stages << " stages, " << micro_batches << " micro-batches, KV "
                                  << kernels::KvTypeName(kv_type));
  const Model& model = *m.model;
  const ModelHParams& hp = model.hparams();
  dist::PipelineOptions opt;
  opt.micro_batches = micro_batches;
  opt.timeout = std::chrono::milliseconds(20000);
  Workers w(model, num_stages, opt);
  auto driver = dist::PipelineDriver::Connect(model, w.rank0(), opt);
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  const KvLayout layout = model.kv_layout();
  const KvLayerGroups groups = layout.Groups(true);
  const int64_t block_size = 4, num_blocks = 1024;
  KvStorage kv_pipe(layout, groups, num_blocks, block_size, kv_type, kv_type);
  KvStorage kv_one(layout, groups, num_blocks, block_size, kv_type, kv_type);
  ThreadPool pool(2);
  Workspace ws_pipe, ws_one;
  // Each sequence owns six blocks in every group (groups share the pool: disjoint ids).
  const int64_t num_groups = groups.num_groups();
  const std::vector<int64_t> lens = {19, 3, 11};
  std::vector<std::vector<int32_t>> tables(num_groups * lens.size());
  for (int64_t g = 0; g < num_groups; ++g) {
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int32_t i = 0; i < 6; ++i) tables[g * lens.size() + s].push_back(static_cast<int32_t>((g * 3 + s) * 6 + i));
    }
  }
  Rng rng(3);
  std::vector<int64_t> done(lens.size(), 0);
  for (int step = 0; step < 3; ++step) {
    ForwardBatch b;
    for (auto& t : tables) b.block_tables.emplace_back(t);
    for (size_t s = 0; s < lens.size(); ++s) {
      const int64_t n = step == 0 ? lens[s] : 1;
      for (int64_t i = 0; i < n; ++i) {
        b.tokens.push_back(3 + static_cast<int32_t>(rng.NextU64() % (hp.vocab_size - 3)));
        b.positions.push_back(static_cast<int32_t>(done[s] + i));
        b.seq_idx.push_back(static_cast<int32_t>(s));
      }
      done[s] += n;
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      if (step == 0) b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - n));  // a prompt row too
    }
    b.hidden_rows = {0, static_cast<int32_t>(b.tokens.size() - 1)};
    const Status one = model.Forward(b, kv_one, ws_one, pool);
    ASSERT_TRUE(one.ok()) << one.ToString();
    const Status s = (*driver)->Forward(b, kv_pipe, ws_pipe, pool);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const size_t num_logits = b.logit_rows.size() * hp.vocab_size, num_hidden = b.hidden_rows.size() * hp.dim;
    EXPECT_EQ(0, std::memcmp(ws_one.logits.data(), ws_pipe.logits.data(), num_logits * sizeof(float))) << "step " << step;
    EXPECT_EQ(0, std::memcmp(ws_one.hidden.data(), ws_pipe.hidden.data(), num_hidden * sizeof(float))) << "step " << step;
  }
  ASSERT_TRUE((*driver)->Stop().ok());
  w.Join();
  for (const Status& s : w.results()) EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(PipelineTest, StepsThroughStagesEqualOneProcessBitwise) {
  const TestModel llama = Synthetic("llama", 4);
  for (int stages : {2, 3, 4}) {
    for (int micro : {1, 2, 3}) ExpectStepsEqualOneProcess(llama, stages, micro, kernels::KvType::kF16);
  }
  // Sliding windows in layer groups of their own; a mixture with a latent cache; int8 KV.
  const TestModel gemma = Synthetic("gemma3", 6, GgmlType::kF32);
  ExpectStepsEqualOneProcess(gemma, 3, 2, kernels::KvType::kF32);
  const TestModel ds = Synthetic("deepseek2", 3);
  ExpectStepsEqualOneProcess(ds, 3, 3, kernels::KvType::kF16);
  ExpectStepsEqualOneProcess(llama, 2, 2, kernels::KvType::kInt8);
  // DeepSeek-V4: the hyper-connection copies cross the stages; V4.1: their pre weights too, the
  // picks, and the compressed rows and index keys of sources read by layers on later stages.
  const TestModel v4 = Synthetic("deepseek4", 3);
  ExpectStepsEqualOneProcess(v4, 3, 2, kernels::KvType::kF16);
  const TestModel v41 = Synthetic("deepseek41", 4);
  ExpectStepsEqualOneProcess(v41, 2, 2, kernels::KvType::kF32);
  ExpectStepsEqualOneProcess(v41, 3, 1, kernels::KvType::kF16);
  ExpectStepsEqualOneProcess(v41, 4, 2, kernels::KvType::kF16);
  // The two-level index across stages: layer 3 picks candidate blocks that index source 5 (on
  // the next stage) scores inside; sources 1 and 3, each read by a layer on the next stage.
  SynthShape cand = test::ArchTestShape("deepseek41");
  cand.num_layers = 6;
  cand.compress_ratios = {0, 1, 1, 2, 2, 2};
  cand.index_source_layers = {1, 3, 5};
  cand.engram_layers = {0, 3};
  cand.candidate_layer = 3;
  cand.candidate_blocks = 2;
  cand.candidate_block_size = 2;
  const TestModel v41c = test::SynthModel(cand, GgmlType::kQ8_0);
  ExpectStepsEqualOneProcess(v41c, 3, 2, kernels::KvType::kF16);
  ExpectStepsEqualOneProcess(v41c, 6, 1, kernels::KvType::kF32);
}

// The engine's workload (chunked prefill, preemption, the prefix cache, seeded sampling) through
// 2 and 4 stages gives token for token, log-probability for log-probability, what one process gives.
TEST(PipelineTest, EngineWorkloadThroughStagesEqualsOneProcess) {
  const TestModel m = Synthetic("qwen3", 4);
  const std::vector<Collected> one = RunWorkload(m, nullptr);
  ASSERT_EQ(one.size(), 16u);
  for (int stages : {2, 4}) {
    SCOPED_TRACE(stages);
    dist::PipelineOptions opt;
    opt.timeout = std::chrono::milliseconds(20000);
    Workers w(*m.model, stages, opt);
    auto driver = dist::PipelineDriver::Connect(*m.model, w.rank0(), opt);
    ASSERT_TRUE(driver.ok()) << driver.status().ToString();
    dist::PipelineDriver* d = driver->get();
    const std::vector<Collected> piped = RunWorkload(
        m, [d](const ForwardBatch& b, KvStorage& kv, Workspace& ws, ThreadPool& pool) { return d->Forward(b, kv, ws, pool); });
    ASSERT_EQ(piped.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_TRUE(piped[i].status.ok()) << piped[i].status.ToString();
      EXPECT_EQ(piped[i].tokens, one[i].tokens) << "request " << i;
      EXPECT_EQ(piped[i].logprobs, one[i].logprobs) << "request " << i;
      EXPECT_EQ(piped[i].reason, one[i].reason) << "request " << i;
    }
    ASSERT_TRUE(d->Stop().ok());
  }
}

TEST(PipelineTest, RetentionIsRefusedWithStages) {
  const TestModel m = Synthetic("llama", 2);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 1 << 20;
  cfg.forward = [](const ForwardBatch&, KvStorage&, Workspace&, ThreadPool&) { return Status::Ok(); };
  cfg.retention.policy = RetentionPolicy::kWindow;
  cfg.retention.budget = 64;
  ThreadPool pool(1);
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("pipeline"), std::string::npos) << engine.status().ToString();
}

ForwardBatch OneSequence(const std::vector<int32_t>& table, int n) {
  ForwardBatch b;
  for (int i = 0; i < n; ++i) {
    b.tokens.push_back(5 + i);
    b.positions.push_back(i);
  }
  b.block_tables.emplace_back(table);
  return b;
}

// A step a stage refuses (a block id past the cache) fails with the reason, every rank stays in
// step, and the next good step runs.
TEST(PipelineTest, ABadStepFailsAloneWithItsReason) {
  const TestModel m = Synthetic("llama", 2);
  dist::PipelineOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  Workers w(*m.model, 2, opt);
  auto driver = dist::PipelineDriver::Connect(*m.model, w.rank0(), opt);
  ASSERT_TRUE(driver.ok());
  KvStorage kv(m.model->kv_layout(), KvLayerGroups::Single(2), 8, 4, kernels::KvType::kF32, kernels::KvType::kF32);
  Workspace ws;
  ThreadPool pool(1);
  const std::vector<int32_t> good = {0, 1}, bad = {0, 99};
  ForwardBatch b = OneSequence(bad, 6);
  Status s = (*driver)->Forward(b, kv, ws, pool);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("block id 99"), std::string::npos) << s.ToString();
  b = OneSequence(good, 6);
  s = (*driver)->Forward(b, kv, ws, pool);
  EXPECT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE((*driver)->Stop().ok());
}

// A rank that never answers: start-up gives up after the timeout naming it; a rank that stops
// mid-run fails the step within the timeout, and every later step at once; Abort ends a wait.
TEST(PipelineTest, ASilentRankFailsClearlyAndNeverHangs) {
  const TestModel m = Synthetic("llama", 2);
  dist::PipelineOptions opt;
  opt.timeout = std::chrono::milliseconds(300);
  {
    Workers w(*m.model, 2, opt, /*skip_rank=*/1);
    auto driver = dist::PipelineDriver::Connect(*m.model, w.rank0(), opt);
    ASSERT_FALSE(driver.ok());
    EXPECT_EQ(driver.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(driver.status().message().find("rank 1"), std::string::npos) << driver.status().ToString();
  }
  KvStorage kv(m.model->kv_layout(), KvLayerGroups::Single(2), 8, 4, kernels::KvType::kF32, kernels::KvType::kF32);
  Workspace ws;
  ThreadPool pool(1);
  const std::vector<int32_t> table = {0, 1};
  {
    // Rank 1 runs one step, then is told to stop behind the driver's back (as if it died).
    Workers real(*m.model, 2, opt);
    auto driver = dist::PipelineDriver::Connect(*m.model, real.rank0(), opt);
    ASSERT_TRUE(driver.ok());
    ForwardBatch b = OneSequence(table, 4);
    ASSERT_TRUE((*driver)->Forward(b, kv, ws, pool).ok());
    // Stop the worker behind the driver's back: it exits, and the next step has nobody to run it.
    {
      ASSERT_TRUE(dist::StopWorkers(real.rank0(), std::chrono::milliseconds(1000)).ok());
      real.Join();
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status s = (*driver)->Forward(b, kv, ws, pool);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    s = (*driver)->Forward(b, kv, ws, pool);  // at once, the same reason
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  }
  {
    opt.timeout = std::chrono::milliseconds(60000);
    Workers real(*m.model, 2, opt);
    auto driver = dist::PipelineDriver::Connect(*m.model, real.rank0(), opt);
    ASSERT_TRUE(driver.ok());
    ASSERT_TRUE(dist::StopWorkers(real.rank0(), std::chrono::milliseconds(1000)).ok());
    real.Join();
    // The abort lands just before the step or while it waits on the gone rank: the same answer,
    // long before the timeout.
    std::latch stepping(1);
    std::thread aborter([&] {
      stepping.wait();
      (*driver)->Abort("SIGTERM: stopping");
    });
    const auto t0 = std::chrono::steady_clock::now();
    ForwardBatch b = OneSequence(table, 4);
    stepping.count_down();
    Status s = (*driver)->Forward(b, kv, ws, pool);
    aborter.join();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("SIGTERM"), std::string::npos) << s.ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  }
}

TEST(PipelineTest, ARankWithAnotherModelIsRefusedAtStartUp) {
  const TestModel m = Synthetic("llama", 2), other = Synthetic("llama", 3);
  dist::PipelineOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  Workers w(*m.model, 2, opt, -1, other.model.get());
  auto driver = dist::PipelineDriver::Connect(*m.model, w.rank0(), opt);
  ASSERT_FALSE(driver.ok());
  EXPECT_NE(driver.status().message().find("different model"), std::string::npos) << driver.status().ToString();
}

// The all-reduce adds in pairs on rank 0, (x0 + x1) + (x2 + x3), and hands every rank those bits.
TEST(PipelineTest, AllReduceSumsInAFixedTreeOnEveryRank) {
  const int n = 4;
  auto comms = dist::LocalGroup(n);
  std::vector<std::vector<float>> x(n);
  for (int r = 0; r < n; ++r) x[r] = test::RandomFloats(257, 10 + r, -1e4f, 1e4f);
  std::vector<float> expected(x[0].size());
  bool differs_from_rank_order = false;
  for (size_t i = 0; i < expected.size(); ++i) {
    expected[i] = (x[0][i] + x[1][i]) + (x[2][i] + x[3][i]);
    differs_from_rank_order |= expected[i] != ((x[0][i] + x[1][i]) + x[2][i]) + x[3][i];
  }
  ASSERT_TRUE(differs_from_rank_order);  // the data tells the two orders apart
  std::vector<std::thread> threads;
  std::vector<Status> st(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { st[r] = comms[r]->AllReduceSum(x[r], dist::Wait{std::chrono::milliseconds(10000)}); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(st[r].ok()) << st[r].ToString();
    EXPECT_EQ(0, std::memcmp(x[r].data(), expected.data(), expected.size() * sizeof(float))) << "rank " << r;
  }
}

}  // namespace
}  // namespace gale
