// Accuracy measurement: perplexity of a text under a model (sliding windows of ctx tokens moved by
// stride, every token scored once with as much context as the window gives, as Hugging Face's
// perplexity recipe), optionally keeping each scored position's log-probabilities so that a
// second model (a quantized one, or the same with a quantized KV cache) can be compared with it:
// KL divergence per token (mean, median, 99th percentile, max, as llama.cpp's perplexity tool
// reports) and top-1 agreement.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/kernels.h"
#include "kv/retention.h"
#include "model/model.h"

namespace gale {

struct PplOptions {
  int64_t ctx = 0;     // window length; 0: the model's context (capped at the text)
  int64_t stride = 0;  // window step; 0: ctx / 2; at most ctx - 1 (windows overlap by a token)
  kernels::KvType kv_type = kernels::KvType::kF32;  // K's (and V's) type
  std::optional<kernels::KvType> v_kv_type;         // V's when it differs
  std::optional<bool> key_channels;                 // KvStorage::key_channels; nullopt: its default
  // KV retention: each window streams through the cache `chunk` tokens at a time (as decoding
  // with a prefill chunk would), evicting down to the budget (a ratio is of ctx) whenever it
  // reaches budget + chunk. Without it each window is one forward pass.
  RetentionConfig retention;
  int64_t chunk = 16;
};

struct PplResult {
  int64_t num_scored = 0;  // tokens whose log-probability was summed (all but the first)
  double nll = 0.0;        // mean negative log-likelihood per scored token (nats)
  double ppl() const;
  int64_t vocab = 0;
  std::vector<int32_t> tokens;  // the text's tokens
  std::vector<float> logprobs;  // [num_scored, vocab] when asked for, else empty
  int64_t kv_budget = 0;        // with retention: the budget used, and positions evicted
  int64_t num_evicted = 0;
};

// tokens: the whole text (with BOS if the model wants one). Errors for fewer than 2 tokens, bad
// ctx/stride, or ids outside the vocabulary.
StatusOr<PplResult> EvaluatePerplexity(const Model& model, const std::vector<int32_t>& tokens,
                                       const PplOptions& options, bool keep_logprobs, ThreadPool& pool);

// The log-probabilities file: "GALEPPL1", u32 vocab, u64 num_scored, u64 num_tokens, the token
// ids (i32), then [num_scored, vocab] f32.
Status SaveLogprobs(const std::string& path, const PplResult& r);
StatusOr<PplResult> LoadLogprobs(const std::string& path);

struct KlResult {
  double mean = 0, median = 0, p99 = 0, max = 0;  // KL(base || this) per token, nats
  double top1_agreement = 0;                     // share of tokens with the same most likely token
  double base_ppl = 0;
};
// Errors unless both scored the same tokens with the same vocabulary.
StatusOr<KlResult> CompareLogprobs(const PplResult& base, const PplResult& r);

}  // namespace gale

namespace gale {

// End-to-end task comparison: greedy outputs of a model against a base model's on the same
// prompts. A task file is JSONL, one task per line:
//   {"id": ..., "category": "short" | "long" | "structured" | "multi-turn" | any,
//    "prompt": "...", "max_tokens": N, "json_prefix": "..."}            (single turn)
//   {"id": ..., "category": "multi-turn", "turns": ["...", "..."], "max_tokens": N}
// Structured tasks check that json_prefix + output parses as JSON. Multi-turn tasks replay the
// conversation with the base's replies as history (both models see the same context each turn),
// rendered by the model's chat template, or as "User: ...\nAssistant:" lines when it has none.
struct EvalTask {
  std::string id, category;
  std::vector<std::string> turns;  // one for single-turn tasks
  int64_t max_tokens = 64;
  std::string json_prefix;
  bool structured() const { return category == "structured"; }
};
// Parses the file; errors name the line. An empty file or one without tasks is an error.
StatusOr<std::vector<EvalTask>> ParseTasks(const std::string& text);

struct TaskOutcome {
  std::vector<int32_t> base, got;  // generated tokens (all turns, concatenated)
  std::string base_text, got_text;
  bool exact = false;
  int64_t first_divergence = 0;  // index of the first differing token (= length when equal)
  bool base_parses = false, got_parses = false;
};

struct CategoryScore {
  std::string category;
  int64_t tasks = 0, exact = 0;
  double mean_first_divergence = 0;  // tokens
  double token_agreement = 0;        // share of base tokens matched before the first divergence
  int64_t base_parses = 0, no_longer_parse = 0;  // structured tasks
};
std::vector<CategoryScore> ScoreTasks(const std::vector<EvalTask>& tasks, const std::vector<TaskOutcome>& outcomes);

}  // namespace gale
