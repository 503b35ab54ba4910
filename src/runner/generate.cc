// The generate loop and its timing.
#include "runner/generate.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "base/profiler.h"

namespace gale {

StatusOr<GenerateStats> Generate(const Model& model, const std::vector<int32_t>& prompt,
                                 const GenerateOptions& opts, KvCache& kv, Workspace& ws, ThreadPool& pool,
                                 const std::function<bool(int32_t)>& on_token) {
  using Clock = std::chrono::steady_clock;
  if (prompt.empty()) return InvalidArgument("the prompt has no tokens (not even BOS)");
  const int64_t needed = static_cast<int64_t>(prompt.size()) + opts.max_new_tokens;
  if (needed > kv.capacity_tokens()) {
    return InvalidArgument("prompt of {} tokens + {} new tokens exceeds the context of {} tokens",
                           prompt.size(), opts.max_new_tokens, kv.capacity_tokens());
  }
  RETURN_IF_ERROR(opts.sampling.Validate());
  GenerateStats stats;
  stats.num_prompt_tokens = static_cast<int64_t>(prompt.size());
  Sampler sampler(opts.sampling);
  std::vector<int32_t> history = prompt;
  const int64_t vocab = model.hparams().vocab_size;

  ForwardBatch batch;
  batch.tokens = prompt;
  batch.positions.resize(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) batch.positions[i] = static_cast<int32_t>(i);
  auto t0 = Clock::now();
  {
    ProfileSpan span("prefill", "step", static_cast<int64_t>(prompt.size()));
    RETURN_IF_ERROR(model.Forward(batch, kv, ws, pool));
  }
  auto t1 = Clock::now();
  stats.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  for (int64_t i = 0; i < opts.max_new_tokens; ++i) {
    int32_t next;
    {
      ProfileSpan span("sample", "cpu");
      next = sampler.Sample(std::span<float>(ws.logits.data(), vocab), history);
    }
    history.push_back(next);
    ++stats.num_generated;
    bool keep_going;
    {
      ProfileSpan span("detokenize_emit", "cpu");
      keep_going = on_token(next);
    }
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), next) != opts.stop_ids.end()) {
      stats.stopped_on_token = true;
      break;
    }
    if (!keep_going || i + 1 == opts.max_new_tokens) break;
    batch.tokens.assign(1, next);
    batch.positions.assign(1, static_cast<int32_t>(history.size() - 1));
    ProfileSpan span("decode", "step", 1);
    RETURN_IF_ERROR(model.Forward(batch, kv, ws, pool));
  }
  stats.generate_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return stats;
}

}  // namespace gale
