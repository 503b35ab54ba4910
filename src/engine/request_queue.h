// Where the engine thread meets every other thread, and the only place with locks (DESIGN.md):
// the queue of submitted and cancelled requests, and each request's stream of results. Client
// threads (CLI, HTTP handlers) push requests and read streams; the engine thread drains the queue
// between steps and pushes results. Nothing here knows about models or scheduling.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "grammar/matcher.h"
#include "kv/retention.h"
#include "runner/model_runner.h"
#include "runner/sampler.h"
#include "sched/scheduler.h"

namespace gale {

// What a client asks for. Token ids are already validated against the vocabulary.
struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;             // 0: as many as fit in the per-request limit
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;      // end-of-generation tokens (EOS, EOT); empty: none
  std::vector<std::string> stop;      // stop strings (need the engine to have a tokenizer)
  bool truncate = false;              // too long: drop the middle of the prompt instead of failing
  std::string cache_salt;             // only requests with the same salt share cached prefixes
  int top_logprobs = -1;              // -1: none; k >= 0: each token's log-probability and k alternatives
  // -1: none; k >= 0: the prompt's log-probabilities too (StreamUpdate::prompt_logprobs), with k
  // alternatives. Such a request computes its whole prompt (it takes nothing from the prefix cache).
  int prompt_logprobs = -1;
  std::optional<RetentionConfig> retention;  // KV retention for this request; unset: the engine's
  // The output must follow this grammar (built over the engine's tokenizer's vocabulary); the
  // request's stop tokens are allowed only where the grammar may end, and the request finishes
  // (reason stop) once nothing can follow.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // An embedding request: the prompt is computed (all of it: nothing from the prefix cache) and
  // its hidden states pooled this way; the final update carries the L2-normalized embedding and
  // no text. Sampling, stops, logprobs and retention do not apply.
  Pooling pooling = Pooling::kNone;
  // Control tokens appear in the text as their names (gpt-oss's channel markers, for the server
  // to parse); stop tokens still end the text without appearing.
  bool render_special = false;
  // Requests of one group (> 0: e.g. the choices and prompts of one API request) share the batch
  // fairly with other groups (sched/scheduler.h); 0: a group of its own.
  int64_t group = 0;
};

// Results since the last read, merged. The last update has finished = true.
struct StreamUpdate {
  std::vector<int32_t> token_ids;  // newly generated
  std::vector<TokenLogprobs> logprobs;  // [token_ids] when the request asked for them
  // With the first generated token, when the request asked for them: [prompt tokens - 1], entry i
  // token i + 1's log-probability given the tokens before it.
  std::vector<TokenLogprobs> prompt_logprobs;
  std::string text;                // their text; a stop string and what follows are cut
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Status status;                   // the error when finish_reason == kError
  // The error is the request's own (its output constraint could not be followed), not the
  // server's: a client error.
  bool request_error = false;
  int64_t num_prompt_tokens = 0;   // after truncation
  int64_t num_truncated_tokens = 0;
  int64_t num_cached_tokens = 0;   // prompt tokens whose K/V came from the prefix cache (final update)
  int64_t num_evicted_tokens = 0;  // positions KV retention dropped from the cache (final update)
  int64_t kv_budget = 0;           // the request's KV budget in tokens, 0 without retention (final update)
  std::vector<float> embedding;    // an embedding request's (final update)
  std::string stop_string;         // the stop string that ended it (final update; "" for none)
};

class RequestStream {
 public:
  explicit RequestStream(int64_t id) : id_(id) {}
  int64_t id() const { return id_; }

  // Client side: blocks until there is something new (or the deadline passes: returns false with
  // nothing taken). Returns false once the final update has been taken.
  bool Next(StreamUpdate* out);
  bool NextUntil(std::chrono::steady_clock::time_point deadline, StreamUpdate* out);
  // Non-blocking: takes what is pending, if anything.
  bool TryNext(StreamUpdate* out);
  // For asynchronous clients (the HTTP server): called after every Push, on the engine thread and
  // without the lock held; it must only schedule work (post to an executor), never block. Set it
  // before the engine can push, or check TryNext once after setting it.
  void SetNotify(std::function<void()> notify);
  // Engine side: appends to what the client has not read yet.
  void Push(StreamUpdate update);

  // When the stream was created, and when its first token was pushed (time to first token).
  std::chrono::steady_clock::time_point created_at() const { return created_at_; }
  std::optional<std::chrono::steady_clock::time_point> first_token_at();

 private:
  const int64_t id_;
  const std::chrono::steady_clock::time_point created_at_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first_token_at_;  // under mu_
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> notify_;  // under mu_
  bool has_pending_ = false;
  bool done_ = false;  // the final update was taken
  StreamUpdate pending_;
};

struct PendingRequest {
  int64_t id;
  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  int64_t num_truncated_tokens = 0;  // dropped from the middle of the prompt at submission
};

class RequestQueue {
 public:
  // False (nothing queued) once shut down: no engine thread would ever take it.
  bool Submit(PendingRequest req);
  void Cancel(int64_t id);
  void Shutdown();

  // Engine side: takes everything queued. With wait = true, blocks until something arrives or
  // shutdown; while paused, blocks until resumed (or shutdown) whatever wait says. Returns false
  // once shut down (what was queued is still returned).
  bool Drain(bool wait, std::vector<PendingRequest>* submitted, std::vector<int64_t>* cancelled);

  // Engine side: waits up to `timeout` for something to drain (or shutdown, or a pause); true when
  // it came.
  bool WaitFor(std::chrono::milliseconds timeout);

  // Holds the engine between two steps: returns once the engine thread waits in Drain, so
  // whatever is submitted or cancelled before Resume reaches it together, at one step boundary
  // (deterministic tests of races: cancel versus finish, a burst of submissions).
  void Pause();
  void Resume();

 private:
  std::mutex mu_;
  std::condition_variable cv_;        // the engine waits on it
  std::condition_variable paused_cv_;  // Pause waits on it for the engine to hold
  bool paused_ = false;
  bool holding_ = false;               // the engine thread is waiting because of paused_
  std::vector<PendingRequest> submitted_;
  std::vector<int64_t> cancelled_;
  bool shutdown_ = false;
};

}  // namespace gale
