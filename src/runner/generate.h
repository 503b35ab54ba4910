// Single-sequence generation: prefill the prompt in one batch, then decode token by token with
// the sampler until N tokens, an end-of-generation token, or the caller says stop. The batched
// engine (sched/, engine/) runs every request of the tools and the server; tests use this loop as
// the single-sequence reference the engine must agree with.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "runner/sampler.h"

namespace gale {

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after producing one of these
};

struct GenerateStats {
  int64_t num_prompt_tokens = 0;
  int64_t num_generated = 0;
  double prompt_seconds = 0.0;
  double generate_seconds = 0.0;  // decode steps after the first token
  bool stopped_on_token = false;
};

// on_token returns false to stop early. The KV cache must hold prompt + max_new_tokens.
StatusOr<GenerateStats> Generate(const Model& model, const std::vector<int32_t>& prompt,
                                 const GenerateOptions& opts, KvCache& kv, Workspace& ws, ThreadPool& pool,
                                 const std::function<bool(int32_t)>& on_token);

}  // namespace gale
