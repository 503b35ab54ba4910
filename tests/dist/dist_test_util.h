// What the distributed tests share: worker ranks on threads of one process, and the engine
// workload they run through their drivers and through one process (chunked prefill, preemption,
// the prefix cache, seeded sampling, log-probabilities).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "base/rng.h"
#include "dist/communicator.h"
#include "dist/pipeline.h"
#include "engine/engine.h"

namespace gale::test {

// Ranks 1..n-1 of a LocalGroup, each running work(rank, its communicator) on its own thread (a
// skipped rank never runs: it is silent); on destruction rank 0 tells them to stop (a stop after
// the driver's is never read) and they are joined.
class WorkerThreads {
 public:
  using Work = std::function<Status(int rank, dist::Communicator& comm)>;
  WorkerThreads(int n, Work work, int skip_rank = -1) : comms_(dist::LocalGroup(n)) {
    for (int r = 1; r < n; ++r) {
      if (r == skip_rank) continue;
      threads_.emplace_back([this, work, r] {
        const Status s = work(r, *comms_[r]);
        std::lock_guard<std::mutex> lock(mu_);
        results_.push_back(s);
      });
    }
  }
  ~WorkerThreads() {
    (void)dist::StopWorkers(*comms_[0], std::chrono::milliseconds(1000));
    Join();
  }
  void Join() {
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  dist::Communicator& rank0() { return *comms_[0]; }
  std::vector<Status> results() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }

 private:
  std::vector<std::unique_ptr<dist::Communicator>> comms_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::vector<Status> results_;
};

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason reason = FinishReason::kNone;
  Status status;
};

inline Collected Collect(RequestStream& s) {
  Collected c;
  StreamUpdate u;
  while (s.Next(&u)) {
    c.tokens.insert(c.tokens.end(), u.token_ids.begin(), u.token_ids.end());
    for (const auto& lp : u.logprobs) c.logprobs.push_back(lp.logprob);
    if (u.finished) {
      c.reason = u.finish_reason;
      c.status = u.status;
    }
  }
  return c;
}

inline std::vector<Collected> RunWorkload(const LoadedModel& m, const std::function<Status(const ForwardBatch&, KvStorage&,
                                                                                   Workspace&, ThreadPool&)>& forward) {
  EngineConfig cfg;
  cfg.sched.max_batch_size = 16;
  cfg.sched.max_num_batched_tokens = 24;
  cfg.sched.prefill_chunk_size = 7;
  cfg.block_size = 4;
  const ModelHParams& hp = m.model->hparams();
  cfg.kv_cache_memory_bytes = 40 * KvStorage::BytesPerBlock(hp.num_layers, hp.num_kv_heads, hp.head_dim, 4,
                                                            kernels::KvType::kF16);
  cfg.forward = forward;
  ThreadPool pool(2);
  auto engine = Engine::Create(*m.model, m.tok.get(), cfg, pool);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return {};
  Rng rng(9);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 16; ++i) {
    GenerationRequest r;
    r.prompt.push_back(m.tok->bos_id());
    // Half share a 20-token prefix (the prefix cache), lengths up to 60.
    Rng prefix(77);
    const int64_t len = 1 + static_cast<int64_t>(rng.NextU64() % 60);
    for (int64_t j = 0; j < len; ++j) {
      Rng& src = (i % 2 == 0 && j < 20) ? prefix : rng;
      r.prompt.push_back(3 + static_cast<int32_t>(src.NextU64() % (hp.vocab_size - 3)));
    }
    r.max_tokens = 1 + static_cast<int64_t>(rng.NextU64() % 30);
    r.sampling.temperature = i % 3 == 0 ? 0.0f : 0.8f;
    r.sampling.seed = 500 + i;
    r.top_logprobs = 0;
    auto s = (*engine)->Submit(r);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) streams.push_back(*s);
  }
  std::vector<Collected> out;
  for (auto& s : streams) out.push_back(Collect(*s));
  EXPECT_GT((*engine)->stats().num_preemptions.load(), 0);
  return out;
}

}  // namespace gale::test
