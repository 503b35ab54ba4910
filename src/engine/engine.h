// The engine: one thread that owns the scheduler, the KV cache and the model runner, and steps
// them as long as there is work: drain the request queue, Schedule, run the model once for every
// scheduled chunk, Update, stream results. Any thread may Submit and Cancel; results arrive on
// each request's RequestStream. `gale batch`, `gale run` and the server all go through it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/request_queue.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_storage.h"
#include "kv/state_checkpoints.h"
#include "kv/retention.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "runner/model_runner.h"
#include "sched/scheduler.h"
#include "spec/cost_model.h"
#include "spec/draft.h"
#include "spec/ngram.h"

namespace gale {

enum class SpecMethod { kOff, kNgram, kDraft };
const char* SpecMethodName(SpecMethod m);  // "off", "ngram", "draft"
StatusOr<SpecMethod> ParseSpecMethod(const std::string& name);

// Speculative decoding: each decoding request gets up to num_tokens guesses per step (from prompt
// lookup or a draft model), verified in the step's one forward pass. Outputs are the same as
// without it, token for token, greedy or seeded. How many guesses a request gets each step
// follows its own acceptance rate and the engine's measured step costs (SpecCostModel): none
// where they would slow decoding down (large batches, or models too small to be bound by reading
// their weights).
struct SpecConfig {
  SpecMethod method = SpecMethod::kOff;
  int64_t num_tokens = 5;            // most guesses per request per step
  NgramParams ngram;
  const Model* draft = nullptr;  // for kDraft; must outlive the engine
  // Hard cap: guesses are handed out (oldest request first) only while the step's decode tokens
  // plus guesses stay within this many.
  int64_t max_step_tokens = 64;
  // Guess num_tokens every step whatever the cost model says (tests, measurements).
  bool always = false;
  Status Validate() const;
};

struct EngineConfig {
  SchedulerConfig sched;
  int64_t block_size = 16;              // tokens per KV block
  uint64_t kv_cache_memory_bytes = 0;   // KV memory; 0: kv_cache_ratio of the memory available
  double kv_cache_ratio = 0.5;          // share of MemAvailable (read at start-up, after weights load)
  kernels::KvType kv_type = kernels::KvType::kF16;  // K's (and V's) type; as llama.cpp: half of f32
  std::optional<kernels::KvType> v_kv_type;          // V's when it differs (e.g. K int8, V int4)
  kernels::KvType v_type() const { return v_kv_type.value_or(kv_type); }
  // The model's calibrated per-channel key transform (Model::key_channels): nullopt uses it
  // for int8/int4 keys when the model has it; true/false force it on/off.
  std::optional<bool> key_channels;
  bool enable_prefix_caching = true;     // reuse the K/V of full blocks whose tokens match
  // Models with recurrent layers (Qwen3.5): states kept at block-aligned prefixes for the prefix
  // cache to resume from (StateCheckpoints). -1: as many as requests run at once, within a
  // quarter of the KV memory left after the running requests' states; 0: the prefix cache is off
  // for such a model.
  int64_t state_checkpoints = -1;
  // Commit the KV cache's memory at start-up (KvStorage::Prefault), as llama.cpp and vLLM hold
  // theirs, instead of page by page as blocks are first written.
  bool kv_prefault = false;
  // Sliding-window layers in block groups of their own (KvLayerGroups), whose blocks behind the
  // window go back to the pool while a request runs; off: every layer keeps every block.
  bool kv_window_groups = true;
  KvLayerGroups KvGroups(const KvLayout& layout) const { return layout.Groups(kv_window_groups); }
  SpecConfig spec;
  // KV retention for requests that do not choose their own (off by default). A request with a
  // budget may be longer than KV memory (up to max_seq_len); not with a draft model.
  RetentionConfig retention;
  // KV-cache events (blocks the prefix cache stored and evicted; see KvCacheEvent): when set,
  // called on the engine thread after every step that had some, in order. Must not block.
  std::function<void(std::vector<KvCacheEvent>)> kv_events;
  // Runs each step's forward in place of Model::Forward, as it does (the batch over the engine's
  // KV storage): rank 0 of a pipeline or a tensor-parallel group (dist/pipeline.h,
  // dist/tensor_parallel.h). Null: Model::Forward. KV retention is refused with it.
  std::function<Status(const ForwardBatch&, KvStorage&, Workspace&, ThreadPool&)> forward;
};

// Counters for summaries and /metrics; read from any thread.
struct EngineStats {
  std::atomic<int64_t> num_steps{0};
  std::atomic<int64_t> num_step_tokens{0};        // tokens computed, prefill + decode (incl. recompute)
  std::atomic<int64_t> num_generated_tokens{0};
  std::atomic<int64_t> num_preemptions{0};
  std::atomic<int64_t> num_free_blocks{0};
  std::atomic<int64_t> num_free_state_slots{0};  // recurrent layers' state slots no request holds
  std::atomic<int64_t> num_running{0};
  std::atomic<int64_t> num_waiting{0};
  std::atomic<int64_t> wasted_slots{0};           // unfilled tails of last blocks, now
  std::atomic<int64_t> max_wasted_slots{0};
  std::atomic<int64_t> max_used_blocks{0};
  std::atomic<int64_t> window_released_blocks{0};  // given back behind sliding windows (KvLayerGroups)
  std::atomic<int64_t> prefix_cache_lookups{0};      // requests admitted with the cache on
  std::atomic<int64_t> prefix_cache_query_tokens{0}; // their prompt tokens
  std::atomic<int64_t> prefix_cache_hit_tokens{0};   // of which found in the cache
  std::atomic<int64_t> prefix_cache_blocks{0};       // blocks findable now
  std::atomic<int64_t> prefix_cache_evictions{0};
  std::atomic<int64_t> spec_num_drafts{0};          // verifications of one request's guesses
  std::atomic<int64_t> spec_num_draft_tokens{0};    // guesses verified
  std::atomic<int64_t> spec_num_accepted_tokens{0}; // of which accepted
  // Recurrent layers: verifications whose rejected guesses the state had taken in (it went on from
  // the snapshot after the last accepted token), and checkpoints of states saved.
  std::atomic<int64_t> spec_state_rollbacks{0};
  std::atomic<int64_t> state_checkpoints_saved{0};
  std::atomic<int64_t> kv_evicted_tokens{0};        // positions KV retention dropped from the cache
  std::atomic<int64_t> kv_evictions{0};             // compactions that dropped them
  std::atomic<int64_t> max_running{0};              // most requests running in one step
  std::atomic<int64_t> running_step_sum{0};         // requests running, summed over steps
};

class Engine {
 public:
  // tokenizer may be null (then stop strings are refused and no text is produced).
  static StatusOr<std::unique_ptr<Engine>> Create(const Model& model, const Tokenizer* tokenizer,
                                                  const EngineConfig& config, ThreadPool& pool);
  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Errors (nothing queued) for an empty prompt, ids outside the
  // vocabulary, bad sampling parameters, a bad KV retention setting, or a request that can never
  // fit (unless truncate).
  StatusOr<std::shared_ptr<RequestStream>> Submit(GenerationRequest request);
  // The request ends at the next step (finish reason cancelled); its blocks are freed.
  void Cancel(int64_t request_id);
  // Stops the engine thread: requests in flight finish as cancelled, and every later Submit fails
  // (kUnavailable) while the object stays valid for other threads (Cancel, stats) until it is
  // destroyed. Once; the destructor calls it. Not from the engine's own callbacks.
  void Shutdown();
  // Holds the engine thread between two steps (returns once it holds) and lets it go on: what is
  // submitted or cancelled meanwhile reaches the engine at one step boundary. For tests that must
  // not depend on how threads interleave.
  void Pause() { queue_.Pause(); }
  void Resume() { queue_.Resume(); }

  const EngineConfig& config() const { return config_; }
  int64_t num_blocks() const { return num_blocks_; }
  // Models with recurrent layers: state slots for running requests and the states after their
  // guesses (every one free when the engine is idle: EngineStats::num_free_state_slots).
  int64_t num_working_state_slots() const { return config_.sched.max_batch_size + num_snapshot_slots_; }
  int64_t max_request_tokens() const { return max_request_tokens_; }
  uint64_t kv_bytes() const { return kv_bytes_; }
  const EngineStats& stats() const { return stats_; }
  // Bytes of the model runner's activation buffers (read while the engine is idle).
  uint64_t activation_bytes() const;
  // One line on the KV cache: blocks, tokens, bytes, type.
  std::string Describe() const;
  // Whether the cache stores keys in the model's calibrated per-channel form.
  bool key_channels_active() const {
    return storage_.key_channels() && !model_.key_channels().empty() && !model_.hparams().kv_latent;  // latent rows: none
  }
  // One line on speculative decoding so far: guesses accepted, tokens per verifying step; "" when off.
  std::string DescribeSpec() const;
  // The step-cost fit speculation decides by (read only while the engine is idle).
  std::string DescribeSpecCosts() const;

 private:
  struct Live;  // engine-thread state of a request in flight
  Engine(const Model& model, const Tokenizer* tokenizer, const EngineConfig& config, ThreadPool& pool,
         int64_t num_blocks, std::unique_ptr<DraftProposer> draft);
  // The engine thread's loop; its per-step buffers (reused) and steps.
  struct StepBuffers {
    std::vector<PendingRequest> submitted;
    std::vector<int64_t> cancelled;
    std::vector<RunnerSeq> seqs;
    std::vector<std::vector<int32_t>> spec_inputs;  // [seq] tokens followed by drafts
    RunnerOutput out;
    std::vector<std::vector<TokenLogprobs>> logprobs;
    std::vector<PromptLogprobs> prompt_logprobs;
    std::vector<std::pair<std::unique_ptr<SeqRequest>, Status>> failed;  // grammar errors of a step
    // Recurrent states kept part way through the step, per plan entry, and the checkpoints they
    // fill (forgotten if the step fails).
    std::vector<std::vector<StateSnapshot>> snapshots;
    std::vector<BlockHash> new_checkpoints;
    std::vector<int64_t> checkpoint_slots;  // their slots
    bool idle_released = true;  // memory given back since the last step
  };
  void Loop();
  bool TakeRequests(StepBuffers& b);
  bool BuildSeqs(const StepPlan& plan, StepBuffers& b);
  void CheckpointPrompts(const StepPlan& plan, StepBuffers& b);
  Status RunStep(const StepPlan& plan, StepBuffers& b, bool any_prompt_logprobs);
  void KeepPromptLogprobs(const StepPlan& plan, const std::vector<PromptLogprobs>& prompt_logprobs);
  void StreamStep(const StepPlan& plan, std::vector<std::unique_ptr<SeqRequest>>& finished, StepBuffers& b);
  void Admit(PendingRequest& p);
  // Appends a generated token's text to the stream; true when a stop string ended the request.
  bool EmitToken(Live& l, int32_t token, const TokenLogprobs* logprobs);
  void Finish(const SeqRequest& r, FinishReason reason, const Status& status, bool request_error = false);
  void ReleaseStateSlot(Live& l);
  // Recurrent states after a step: a verifying request whose state took in rejected guesses takes
  // the snapshot after its last accepted token; a state that has taken in a whole number of
  // blocks is checkpointed for the prefix cache.
  void AfterStepStates(const StepPlan& plan, const RunnerOutput& out);
  // Gives a verifying request's snapshot slots back.
  void ReleaseSnapshots(Live& l);
  // Models with recurrent layers: a snapshot slot per guess, as far as the pool holds (the
  // guesses past that are dropped).
  void TakeSnapshots();
  void PublishStats();
  // After a step: KV retention compacts the requests that reached their budget plus a block.
  void Evict();
  // Sets the spec_tokens of decoding requests for the next Schedule.
  Status Propose();
  // After a step: updates each verifying request's acceptance rate.
  void AfterSpecStep(const StepPlan& plan, const RunnerOutput& out);

  const Model& model_;
  const Tokenizer* tokenizer_;
  EngineConfig config_;
  int64_t kv_capacity_ = 0;  // the most slots of a request with a KV budget all KV memory holds
  int64_t num_blocks_;
  int64_t max_request_tokens_;
  uint64_t kv_bytes_;
  double prefault_seconds_ = -1;  // KvStorage::Prefault's time; < 0 when not prefaulted
  // Engine thread only:
  KvStorage storage_;
  KvCacheManager kv_;
  Scheduler sched_;
  ModelRunner runner_;
  std::unordered_map<int64_t, std::unique_ptr<Live>> live_;
  std::vector<int32_t> free_state_slots_;  // recurrent layers' state slots no running request holds
  // With speculation: slots for verifying requests' states after each guess (TakeSnapshots hands
  // them out, AfterStepStates takes them back), and how many are handed out now.
  int64_t num_snapshot_slots_ = 0, snapshot_slots_held_ = 0;
  StateCheckpoints checkpoints_{0, 0};
  std::unique_ptr<DraftProposer> draft_;
  SpecCostModel spec_cost_;
  std::vector<DraftProposer::Job> draft_jobs_;
  std::vector<SeqRequest*> draft_reqs_;
  std::vector<std::vector<int32_t>> draft_out_;
  // Shared:
  RequestQueue queue_;
  EngineStats stats_;
  std::atomic<int64_t> next_id_{1};
  std::thread thread_;
};

// Bytes of MemAvailable in /proc/meminfo, 0 when unknown.
uint64_t MemAvailableBytes();

}  // namespace gale
