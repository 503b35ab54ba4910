// Engine: KV sizing at start-up, validation on the caller's thread, the step loop on its own.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "base/check.h"
#include "base/memory.h"
#include "base/profiler.h"

namespace gale {

uint64_t MemAvailableBytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

const char* SpecMethodName(SpecMethod m) {
  switch (m) {
    case SpecMethod::kOff: return "off";
    case SpecMethod::kNgram: return "ngram";
    case SpecMethod::kDraft: return "draft";
  }
  return "?";
}

StatusOr<SpecMethod> ParseSpecMethod(const std::string& name) {
  if (name == "off") return SpecMethod::kOff;
  if (name == "ngram") return SpecMethod::kNgram;
  if (name == "draft") return SpecMethod::kDraft;
  return InvalidArgument("speculative decoding method '{}' is not one of off, ngram, draft", name);
}

Status SpecConfig::Validate() const {
  if (method == SpecMethod::kOff) return Status::Ok();
  if (num_tokens < 1 || num_tokens > 64) return InvalidArgument("spec tokens must be in [1, 64], got {}", num_tokens);
  if (max_step_tokens < 2) return InvalidArgument("spec max step tokens must be >= 2, got {}", max_step_tokens);
  if (method == SpecMethod::kNgram && (ngram.ngram_min < 1 || ngram.ngram_max < ngram.ngram_min)) {
    return InvalidArgument("n-gram sizes must satisfy 1 <= min <= max, got {}..{}", ngram.ngram_min, ngram.ngram_max);
  }
  if (method == SpecMethod::kDraft && draft == nullptr) return InvalidArgument("--spec draft needs --draft-model");
  return Status::Ok();
}

namespace {

// How long the engine waits idle before giving freed memory back to the system.
constexpr std::chrono::milliseconds kIdleReleaseDelay{100};

// A retention setting, the engine's or a request's: valid, not with a draft model, and on a
// sliding-window model with the cache's layer groups it needs (CheckRetentionGroups).
Status CheckRetention(const RetentionConfig& r, const EngineConfig& config, const ModelHParams& hp,
                      const KvLayerGroups& groups) {
  const SpecConfig& spec = config.spec;
  RETURN_IF_ERROR(r.Validate());
  if (!r.active()) return Status::Ok();
  if (config.forward) {
    return InvalidArgument("KV retention does not run with pipeline or tensor parallelism (it compacts rank 0's cache only)");
  }
  if (spec.method == SpecMethod::kDraft) {
    return InvalidArgument("KV retention does not work with a draft model (its own cache keeps every position)");
  }
  if (hp.recurrent_state_floats > 0) {
    return Unimplemented("KV retention is not supported for {} (its recurrent layers keep one state of every token "
                         "read)", hp.arch);
  }
  if (!hp.kv_windows.empty()) {
    return Unimplemented("KV retention is not supported for {} (its compressed rows are not per position)", hp.arch);
  }
  return CheckRetentionGroups(groups, hp.sliding_window > 0);
}

// Speculation on a model with recurrent layers keeps the state after each guess of a verifying
// request: num_tokens slots for each of up to four requests verifying at once (speculation pays at
// small batches; past four, later requests' guesses wait for free slots).
int64_t SnapshotSlots(const EngineConfig& config) {
  if (config.spec.method == SpecMethod::kOff) return 0;
  return config.spec.num_tokens * std::min<int64_t>(config.sched.max_batch_size, 4);
}

}  // namespace

struct Engine::Live {
  std::shared_ptr<RequestStream> stream;
  std::optional<Detokenizer> detok;
  std::vector<std::string> stop;
  size_t max_stop_bytes = 0;
  std::string matched_stop;  // the stop string that ended it, if one did
  std::string text;        // generated text so far
  size_t emitted = 0;      // bytes of text already pushed to the stream
  int64_t num_prompt_tokens = 0;
  int64_t num_truncated_tokens = 0;
  bool want_logprobs = false;
  int prompt_logprobs = -1;                    // GenerationRequest::prompt_logprobs
  std::vector<TokenLogprobs> prompt_lps;       // computed so far (sent with the first token)
  int64_t num_emitted_tokens = 0;  // generated tokens already streamed
  // Acceptance of this request's guesses: decayed counts with a prior of 1 in 2.
  double spec_hits = 1.0, spec_trials = 2.0;
  // KV retention; reset (pinned prefix, accumulator) at each admission, fresh until then.
  std::optional<SeqRetention> retention;
  bool retention_fresh = true;
  bool embed = false;  // an embedding request: no text, the embedding at the end
  int32_t state_slot = -1;  // recurrent layers' state slot while running (-1: none held)
  std::vector<int32_t> snapshots;  // while verifying: slots for the states after each of its guesses
  // The checkpoint of its state taken last while it decoded: the next one replaces it, so that a
  // long generation holds one checkpoint (its latest state) and not one per block.
  std::optional<BlockHash> decode_checkpoint;
};

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Model& model, const Tokenizer* tokenizer,
                                                 const EngineConfig& config, ThreadPool& pool) {
  RETURN_IF_ERROR(config.sched.Validate());
  RETURN_IF_ERROR(config.spec.Validate());
  if (config.state_checkpoints < -1 || config.state_checkpoints > (int64_t{1} << 20)) {
    return InvalidArgument("state checkpoints must be -1 (automatic) or in [0, 2^20], got {}", config.state_checkpoints);
  }
  const KvLayout layout = model.kv_layout();
  const KvLayerGroups groups = config.KvGroups(layout);
  RETURN_IF_ERROR(CheckRetention(config.retention, config, model.hparams(), groups));
  if (config.block_size < 1 || config.block_size > 4096) {
    return InvalidArgument("block size must be in [1, 4096], got {}", config.block_size);
  }
  if (config.kv_cache_ratio <= 0.0 || config.kv_cache_ratio > 1.0) {
    return InvalidArgument("kv cache ratio must be in (0, 1], got {}", config.kv_cache_ratio);
  }
  const ModelHParams& hp = model.hparams();
  if ((config.kv_type == kernels::KvType::kInt4 && hp.head_dim % 2 != 0) ||
      (config.v_type() == kernels::KvType::kInt4 && hp.value_head() % 2 != 0)) {
    return InvalidArgument("int4 KV cache needs even head sizes, the model's are {} (K) and {} (V)", hp.head_dim,
                           hp.value_head());
  }
  if (!hp.kv_windows.empty() && kernels::KvTypeQuantized(config.kv_type)) {
    return Unimplemented("{}: its cache rows are written in parts (compressed rows packed side by side): f32, f16 or "
                         "bf16 only, not an int8/int4 cache", hp.arch);
  }
  if (hp.kv_latent && config.v_type() != config.kv_type) {
    return InvalidArgument("this model caches one latent row per position (K and V at once): a V type of its own does not apply");
  }
  const uint64_t block_bytes = layout.BytesPerBlock(groups, config.block_size, config.kv_type, config.v_type());
  uint64_t budget = config.kv_cache_memory_bytes;
  if (budget == 0) {
    // Workspace for a full step: activations of max_num_batched_tokens and logits of max_batch_size rows.
    const uint64_t workspace = static_cast<uint64_t>(config.sched.max_num_batched_tokens) *
                                   (5 * hp.dim + hp.kv_dim() + hp.v_dim() + 2 * hp.ffn_dim) * sizeof(float) +
                               static_cast<uint64_t>(config.sched.max_batch_size) * hp.vocab_size * sizeof(float);
    const uint64_t avail = MemAvailableBytes();
    if (avail == 0) return InvalidArgument("cannot read MemAvailable from /proc/meminfo: set --kv-cache-memory");
    budget = avail > workspace ? static_cast<uint64_t>(static_cast<double>(avail - workspace) * config.kv_cache_ratio) : 0;
  }
  // Recurrent layers' states come out of the same budget: a slot per running request (and with
  // speculation the states after guesses, SnapshotSlots), then the prefix cache's checkpoints.
  EngineConfig cfg = config;
  const uint64_t one_state = static_cast<uint64_t>(layout.state_floats) * sizeof(float);
  if (one_state > 0) {
    const int64_t running = config.sched.max_batch_size + SnapshotSlots(config);
    const uint64_t running_bytes = static_cast<uint64_t>(running) * one_state;
    if (budget <= running_bytes) {
      return ResourceExhausted("KV cache memory of {} bytes does not hold the recurrent states of {} requests ({} "
                               "bytes{})", budget, config.sched.max_batch_size, running_bytes,
                               running > config.sched.max_batch_size ? ", with the states after guesses" : "");
    }
    budget -= running_bytes;
    int64_t checkpoints = 0;
    if (cfg.enable_prefix_caching && cfg.state_checkpoints >= 0) {
      checkpoints = cfg.state_checkpoints;
      if (static_cast<uint64_t>(checkpoints) * one_state >= budget) {
        return ResourceExhausted("KV cache memory left after the running requests' recurrent states ({} bytes) does "
                                 "not hold {} state checkpoints of {} bytes and a block", budget, checkpoints, one_state);
      }
    } else if (cfg.enable_prefix_caching) {
      checkpoints = std::min<int64_t>(config.sched.max_batch_size, static_cast<int64_t>(budget / 4 / one_state));
    }
    budget -= static_cast<uint64_t>(checkpoints) * one_state;
    cfg.state_checkpoints = checkpoints;
    if (checkpoints == 0) cfg.enable_prefix_caching = false;
  } else {
    cfg.state_checkpoints = 0;
  }
  int64_t num_blocks = static_cast<int64_t>(budget / block_bytes);
  // More than every running request at its longest could use is never touched: do not reserve it.
  const int64_t seq_cap = config.sched.max_seq_len > 0 ? config.sched.max_seq_len
                                                       : (hp.context_length > 0 ? hp.context_length : 2048);
  const int64_t useful = config.sched.max_batch_size *
                        KvCacheManager::PeakBlocks(groups.window, config.block_size, seq_cap,
                                                   config.sched.max_num_batched_tokens);
  num_blocks = std::min(num_blocks, useful);
  if (num_blocks < 1) {
    return ResourceExhausted("KV cache memory of {} bytes holds no block of {} bytes ({} tokens): give more memory",
                             budget, block_bytes, config.block_size);
  }
  if (num_blocks > (int64_t{1} << 30)) num_blocks = int64_t{1} << 30;
  if (cfg.sched.max_seq_len == 0) cfg.sched.max_seq_len = seq_cap;
  std::unique_ptr<DraftProposer> draft;
  if (cfg.spec.method == SpecMethod::kDraft) {
    // As many blocks as the target: the draft never holds more tokens of a request than it.
    ASSIGN_OR_RETURN(draft, DraftProposer::Create(*cfg.spec.draft, model, num_blocks, cfg.block_size, cfg.kv_type,
                                                    cfg.v_type(), pool));
  }
  return std::unique_ptr<Engine>(new Engine(model, tokenizer, cfg, pool, num_blocks, std::move(draft)));
}

Engine::Engine(const Model& model, const Tokenizer* tokenizer, const EngineConfig& config, ThreadPool& pool,
               int64_t num_blocks, std::unique_ptr<DraftProposer> draft)
    : model_(model),
      tokenizer_(tokenizer),
      config_(config),
      num_blocks_(num_blocks),
      storage_(model.kv_layout(), config.KvGroups(model.kv_layout()), num_blocks, config.block_size, config.kv_type,
               config.v_type()),
      kv_(static_cast<int32_t>(num_blocks), config.block_size, config.enable_prefix_caching, storage_.groups().window),
      sched_(config.sched, &kv_),
      runner_(model, storage_, pool),
      draft_(std::move(draft)) {
  if (config.key_channels) storage_.set_key_channels(*config.key_channels);
  if (model.kv_layout().state_floats > 0) {
    // Slots: the running requests' and their states after guesses (one pool), then checkpoints.
    num_snapshot_slots_ = SnapshotSlots(config);
    const int64_t first_checkpoint = config.sched.max_batch_size + num_snapshot_slots_;
    storage_.ReserveStates(first_checkpoint + config.state_checkpoints, model.kv_layout().state_floats);
    for (int32_t s = static_cast<int32_t>(first_checkpoint) - 1; s >= 0; --s) free_state_slots_.push_back(s);
    checkpoints_ = StateCheckpoints(first_checkpoint, config.state_checkpoints);
    if (config.state_checkpoints > 0) {
      // A hit resumes from the state at its end (CheckpointPrompts, AfterStepStates).
      kv_.set_resumable([this](const BlockHash& h) { return checkpoints_.Contains(h); });
    }
  }
  if (config.forward) runner_.set_forward(config.forward);
  max_request_tokens_ = sched_.max_request_tokens();
  kv_capacity_ = kv_.capacity_tokens(config.sched.max_num_batched_tokens, /*retaining=*/true);
  kv_bytes_ = storage_.num_bytes();
  if (config.kv_prefault) prefault_seconds_ = storage_.Prefault();
  if (config.kv_events) kv_.set_record_events(true);
  stats_.num_free_blocks = num_blocks;
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  queue_.Shutdown();
  if (thread_.joinable()) thread_.join();
}

uint64_t Engine::activation_bytes() const {
  const Workspace& ws = runner_.workspace();
  uint64_t total = 0;
  for (const auto* v : {&ws.x, &ws.xb, &ws.xb2, &ws.q, &ws.k, &ws.v, &ws.hb, &ws.hb2, &ws.logits}) {
    total += v->capacity() * sizeof(float);
  }
  return total;
}

std::string Engine::Describe() const {
  const ModelHParams& hp = model_.hparams();
  std::string latent;
  if (storage_.num_state_slots() > 0) {
    // Recurrent layers (Qwen3.5): the cache holds the attention layers; the states sit beside it.
    latent = fmt::format(" (attention on {} of {} layers; recurrent-state slots of {:.3g} MiB: {} for running "
                         "requests{}, {} checkpoints for the prefix cache)", hp.kv_num_layers(), hp.num_layers,
                         static_cast<double>(storage_.state_floats()) * sizeof(float) / 1048576.0,
                         config_.sched.max_batch_size,
                         num_snapshot_slots_ > 0 ? fmt::format(", {} for states after guesses", num_snapshot_slots_)
                                                 : "",
                         checkpoints_.capacity());
  } else if (!hp.kv_windows.empty()) {
    // Several cache layers per model layer (DeepSeek-V4): the bytes a token adds past the windows
    // (the full layers') against one full row per layer and position.
    const int64_t full = std::count(hp.kv_windows.begin(), hp.kv_windows.end(), 0);
    const double row = static_cast<double>(kernels::KvHeadBytes(config_.kv_type, hp.head_dim));
    latent = fmt::format(" (compressed attention: {} cache layers, {} of them full: {:.0f} bytes per token past the "
                         "windows, 1/{:.1f} of one {}-wide row per layer)",
                         hp.kv_windows.size(), full, row * full, static_cast<double>(hp.num_layers) / full, hp.head_dim);
  } else if (hp.kv_latent) {
    // Bytes per token of the latent rows against the same model's multi-head cache (K of nope +
    // rope and V of v_head per head) in the same type.
    const double row = static_cast<double>(kernels::KvHeadBytes(config_.kv_type, hp.head_dim)) * hp.num_layers;
    const double mha = static_cast<double>(hp.num_layers) * hp.num_heads *
                       (kernels::KvHeadBytes(config_.kv_type, hp.mla.nope_dim + hp.rope_dims) +
                        kernels::KvHeadBytes(config_.kv_type, hp.mla.v_head_dim));
    latent = fmt::format(" (latent rows: {:.0f} bytes per token, 1/{:.0f} of the {:.0f} of multi-head attention)", row,
                         mha / row, mha);
  }
  const KvLayerGroups& groups = storage_.groups();
  std::string blocks = fmt::format("{} blocks of {} tokens = {} tokens", num_blocks_, config_.block_size,
                                   num_blocks_ * config_.block_size);
  if (groups.num_groups() > 1 || groups.window[0] > 0) {
    const int64_t windowed = std::count_if(groups.window.begin(), groups.window.end(), [](int64_t w) { return w > 0; });
    blocks = fmt::format("{} blocks of {} tokens x {} layers, {} layer groups ({} windowed: blocks behind the window "
                         "go back to the pool)", num_blocks_, config_.block_size, groups.layers_per_block,
                         groups.num_groups(), windowed);
  }
  return fmt::format(
      "KV cache: {}, {:.1f} MiB {}{}{}{}; up to {} tokens per request, {} at once; "
      "prefix caching {}; speculative decoding {}{}{}",
      blocks, kv_bytes_ / 1048576.0,
      config_.v_type() == config_.kv_type
          ? std::string(kernels::KvTypeName(config_.kv_type))
          : fmt::format("K {} / V {}", kernels::KvTypeName(config_.kv_type), kernels::KvTypeName(config_.v_type())),
      key_channels_active() ? " (keys per channel, calibrated)" : "", latent,
      prefault_seconds_ >= 0 ? fmt::format(" (committed at start in {:.2f} s)", prefault_seconds_) : "",
      max_request_tokens_, config_.sched.max_batch_size,
      config_.enable_prefix_caching ? "on" : storage_.num_state_slots() > 0 ? "off (no recurrent-state checkpoints)" : "off",
      SpecMethodName(config_.spec.method),
      config_.spec.method == SpecMethod::kOff
          ? std::string()
          : fmt::format(" (up to {} tokens per request, off above {} tokens per step{})", config_.spec.num_tokens,
                        config_.spec.max_step_tokens,
                        draft_ ? fmt::format(", draft KV {:.1f} MiB", draft_->kv_bytes() / 1048576.0) : ""),
      !config_.retention.active()
          ? std::string()
          : fmt::format("; KV retention {} ({}{})", RetentionPolicyName(config_.retention.policy),
                        config_.retention.budget > 0 ? fmt::format("{} tokens", config_.retention.budget)
                                                     : fmt::format("{:g} of each request", config_.retention.budget_ratio),
                        config_.retention.policy == RetentionPolicy::kSinkWindow
                            ? fmt::format(", {} sinks", config_.retention.sink_tokens) : ""));
}

std::string Engine::DescribeSpec() const {
  if (config_.spec.method == SpecMethod::kOff) return "";
  const int64_t drafts = stats_.spec_num_drafts, guesses = stats_.spec_num_draft_tokens;
  const int64_t accepted = stats_.spec_num_accepted_tokens;
  return fmt::format("speculative decoding ({}): {} of {} guessed tokens accepted ({:.1f}%), {:.2f} tokens per verifying step",
                     SpecMethodName(config_.spec.method), accepted, guesses,
                     guesses > 0 ? 100.0 * accepted / guesses : 0.0,
                     drafts > 0 ? 1.0 + static_cast<double>(accepted) / drafts : 0.0);
}

std::string Engine::DescribeSpecCosts() const {
  // The fit is engine-thread state: read it while the engine is idle (the header says so).
  return fmt::format("decode step cost fit: {:.0f} us + {:.1f} us per token{}", spec_cost_.fixed_seconds() * 1e6,
                     spec_cost_.per_token_seconds() * 1e6,
                     draft_ ? fmt::format(", draft {:.1f} us per guess", spec_cost_.draft_seconds_per_guess() * 1e6) : "");
}

StatusOr<std::shared_ptr<RequestStream>> Engine::Submit(GenerationRequest req) {
  if (req.prompt.empty()) return InvalidArgument("the prompt has no tokens");
  const int64_t vocab = model_.hparams().vocab_size;
  for (int32_t t : req.prompt) {
    if (t < 0 || t >= vocab) return InvalidArgument("prompt token id {} outside the vocabulary [0, {})", t, vocab);
  }
  for (int32_t t : req.stop_ids) {
    if (t < 0 || t >= vocab) return InvalidArgument("stop token id {} outside the vocabulary [0, {})", t, vocab);
  }
  if (!model_.hparams().causal) {
    // An encoder (BERT): embeddings only, each prompt computed whole in one step.
    if (req.pooling == Pooling::kNone) {
      return InvalidArgument("this model is an encoder ({}): it computes embeddings, not text", model_.hparams().arch);
    }
    const int64_t most = std::min({config_.sched.prefill_chunk_size, config_.sched.max_num_batched_tokens,
                                   model_.hparams().context_length});
    if (static_cast<int64_t>(req.prompt.size()) > most) {
      return InvalidArgument("the input has {} tokens; this encoder reads at most {} at once (its {} positions, the "
                             "step's token budget and the prefill chunk)", req.prompt.size(), most,
                             model_.hparams().context_length);
    }
  }
  if (req.pooling != Pooling::kNone) {
    if (req.grammar || req.top_logprobs >= 0 || req.prompt_logprobs >= 0 || (req.retention && req.retention->active())) {
      return InvalidArgument("an embedding request takes no grammar, log-probabilities or KV retention");
    }
    req.max_tokens = 1;  // the step that finishes the prompt samples one token, never shown
    req.sampling = SamplingParams();
    req.sampling.temperature = 0.0f;
    req.stop.clear();
    req.stop_ids.clear();
    req.retention = RetentionConfig();
  }
  RETURN_IF_ERROR(req.sampling.Validate());
  for (const auto& [t, bias] : req.sampling.logit_bias) {
    if (t >= vocab) return InvalidArgument("logit_bias token id {} outside the vocabulary [0, {})", t, vocab);
  }
  if (req.grammar && tokenizer_ != nullptr && req.grammar->trie().vocab_size() != tokenizer_->vocab_size()) {
    return InvalidArgument("the grammar was built for a vocabulary of {} tokens, the model's has {}",
                           req.grammar->trie().vocab_size(), tokenizer_->vocab_size());
  }
  if (!req.stop.empty() && tokenizer_ == nullptr) return InvalidArgument("stop strings need a tokenizer");
  for (const auto& s : req.stop) {
    if (s.empty()) return InvalidArgument("a stop string is empty");
  }
  if (req.max_tokens < 0) return InvalidArgument("max_tokens must be >= 0, got {}", req.max_tokens);
  if (req.top_logprobs < -1 || req.top_logprobs > 20) {
    return InvalidArgument("top_logprobs must be in [0, 20], got {}", req.top_logprobs);
  }
  if (req.prompt_logprobs < -1 || req.prompt_logprobs > 20) {
    return InvalidArgument("prompt_logprobs must be in [0, 20], got {}", req.prompt_logprobs);
  }
  if (!req.retention) req.retention = config_.retention;
  RetentionConfig& ret = *req.retention;
  RETURN_IF_ERROR(CheckRetention(ret, config_, model_.hparams(), storage_.groups()));
  // With retention a request is bounded by max_seq_len, not by KV memory.
  const int64_t limit = ret.active() ? config_.sched.max_seq_len : max_request_tokens_;
  int64_t prompt_len = static_cast<int64_t>(req.prompt.size());
  if (req.max_tokens == 0) {
    if (prompt_len >= limit) {
      return InvalidArgument("prompt of {} tokens leaves no room for output within the limit of {} tokens per request",
                             prompt_len, limit);
    }
    req.max_tokens = limit - prompt_len;
  }
  int64_t num_truncated = 0;
  if (prompt_len + req.max_tokens > limit) {
    if (!req.truncate) {
      return InvalidArgument("prompt of {} tokens + max_tokens {} exceeds the limit of {} tokens per request "
                             "(max_seq_len and KV memory); shorten it, lower max_tokens, or ask for truncation",
                             prompt_len, req.max_tokens, limit);
    }
    const int64_t keep = limit - req.max_tokens;
    if (keep < 2) {
      return InvalidArgument("max_tokens {} leaves fewer than 2 prompt tokens within the limit of {}", req.max_tokens, limit);
    }
    // Keep the head (instructions, BOS) and the tail (the question), drop the middle.
    const int64_t head = keep / 2, tail = keep - head;
    num_truncated = prompt_len - keep;
    req.prompt.erase(req.prompt.begin() + head, req.prompt.end() - tail);
    prompt_len = keep;
  }
  if (ret.active()) {
    ret.budget = ret.BudgetFor(prompt_len + req.max_tokens);
    ret.budget_ratio = 0.0;
    if (ret.budget + config_.block_size > kv_capacity_) {
      return InvalidArgument("a KV budget of {} tokens (+ one block) exceeds all KV memory ({} tokens)", ret.budget,
                             kv_capacity_);
    }
  }
  const int64_t id = next_id_++;
  auto stream = std::make_shared<RequestStream>(id);
  if (!queue_.Submit(PendingRequest{id, std::move(req), stream, num_truncated})) {
    return Unavailable("the engine is stopping");
  }
  return stream;
}

void Engine::Cancel(int64_t request_id) { queue_.Cancel(request_id); }

void Engine::Admit(PendingRequest& p) {
  auto r = std::make_unique<SeqRequest>();
  r->id = p.id;
  r->tokens = std::move(p.request.prompt);
  r->max_new_tokens = p.request.max_tokens;
  r->stop_ids = p.request.stop_ids;
  r->cache_salt = p.request.cache_salt;
  r->group = p.request.group != 0 ? p.request.group : -p.id;
  r->no_cached_prefix = p.request.prompt_logprobs >= 0 || p.request.pooling != Pooling::kNone;
  r->whole_prompt = !model_.hparams().causal;
  const std::vector<int32_t> stop_ids = r->stop_ids;
  auto live = std::make_unique<Live>();
  if (p.request.retention && p.request.retention->active()) {
    r->kv_budget = p.request.retention->budget;
    live->retention.emplace(*p.request.retention, r->kv_budget, model_.hparams().num_layers, config_.block_size);
  }
  live->stream = p.stream;
  live->num_prompt_tokens = r->num_tokens();
  live->num_truncated_tokens = p.num_truncated_tokens;
  live->stop = std::move(p.request.stop);
  for (const auto& s : live->stop) live->max_stop_bytes = std::max(live->max_stop_bytes, s.size());
  if (tokenizer_ != nullptr) live->detok.emplace(*tokenizer_, /*at_start=*/false, p.request.render_special);
  if (Status s = sched_.Add(std::move(r)); !s.ok()) {
    // Submit checked the same limits; this is a bug, but the request gets an answer.
    StreamUpdate u;
    u.finished = true;
    u.finish_reason = FinishReason::kError;
    u.status = s;
    p.stream->Push(std::move(u));
    return;
  }
  runner_.AddRequest(p.id, p.request.sampling, p.request.top_logprobs, std::move(p.request.grammar), stop_ids,
                     p.request.pooling);
  live->embed = p.request.pooling != Pooling::kNone;
  live->want_logprobs = p.request.top_logprobs >= 0;
  live->prompt_logprobs = p.request.prompt_logprobs;
  live_[p.id] = std::move(live);
}

bool Engine::EmitToken(Live& l, int32_t token, const TokenLogprobs* logprobs) {
  ++l.num_emitted_tokens;
  StreamUpdate u;
  u.token_ids.push_back(token);
  if (l.want_logprobs && logprobs != nullptr) u.logprobs.push_back(*logprobs);
  if (l.num_emitted_tokens == 1) u.prompt_logprobs = std::move(l.prompt_lps);
  u.num_prompt_tokens = l.num_prompt_tokens;
  u.num_truncated_tokens = l.num_truncated_tokens;
  bool stopped = false;
  if (l.detok) {
    const size_t before = l.text.size();
    l.text += l.detok->Push(token);
    if (!l.stop.empty()) {
      // A stop string can end in the new text and start up to max_stop_bytes - 1 before it.
      const size_t from = before >= l.max_stop_bytes ? before - l.max_stop_bytes + 1 : 0;
      size_t cut = std::string::npos;
      for (const auto& s : l.stop) {
        const size_t at = l.text.find(s, from);
        if (at != std::string::npos && at < cut) cut = at, l.matched_stop = s;
      }
      if (cut != std::string::npos) {
        l.text.resize(cut);
        stopped = true;
      }
    }
    // Hold back what could still be the start of a stop string, and never split a UTF-8 character.
    size_t safe = l.text.size();
    if (!stopped && l.max_stop_bytes > 1) safe = safe >= l.max_stop_bytes - 1 ? safe - (l.max_stop_bytes - 1) : 0;
    while (safe > l.emitted && safe < l.text.size() && (static_cast<uint8_t>(l.text[safe]) & 0xC0) == 0x80) --safe;
    if (safe > l.emitted) {
      u.text = l.text.substr(l.emitted, safe - l.emitted);
      l.emitted = safe;
    }
  }
  l.stream->Push(std::move(u));
  return stopped;
}

void Engine::ReleaseStateSlot(Live& l) {
  ReleaseSnapshots(l);
  if (l.state_slot < 0) return;
  free_state_slots_.push_back(l.state_slot);
  l.state_slot = -1;
}

void Engine::ReleaseSnapshots(Live& l) {
  for (int32_t slot : l.snapshots) free_state_slots_.push_back(slot);
  snapshot_slots_held_ -= static_cast<int64_t>(l.snapshots.size());
  l.snapshots.clear();
}

void Engine::TakeSnapshots() {
  if (num_snapshot_slots_ == 0) return;
  for (SeqRequest* r : sched_.running()) {
    Live& l = *live_.at(r->id);
    ReleaseSnapshots(l);  // none held between steps; a failed step's are given back here
    const int64_t k = std::min(static_cast<int64_t>(r->spec_tokens.size()), num_snapshot_slots_ - snapshot_slots_held_);
    r->spec_tokens.resize(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) {
      l.snapshots.push_back(free_state_slots_.back());
      free_state_slots_.pop_back();
    }
    snapshot_slots_held_ += k;
  }
}

void Engine::AfterStepStates(const StepPlan& plan, const RunnerOutput& out) {
  if (storage_.num_state_slots() == 0) return;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    SeqRequest& r = *s.req;
    Live& l = *live_.at(r.id);
    if (l.state_slot < 0) continue;
    const int64_t accepted = static_cast<int64_t>(out.tokens[i].size()) - 1;
    if (s.num_spec > 0 && accepted < s.num_spec && r.finish_reason == FinishReason::kNone) {
      // The state took in every guess: go on from the snapshot after the last accepted token (the
      // slots trade places; the old one goes back with the other snapshots).
      std::swap(l.state_slot, l.snapshots[static_cast<size_t>(accepted)]);
      ++stats_.spec_state_rollbacks;
    }
    ReleaseSnapshots(l);
    // Not a state that took in a rejected guess (of a request that finished in this step).
    const int64_t taken = storage_.state_tokens(l.state_slot);
    if (checkpoints_.capacity() == 0 || taken <= 0 || taken != r.num_computed_tokens ||
        taken % config_.block_size != 0) {
      continue;
    }
    const BlockHash h = kv_.PrefixHash(r.tokens, taken / config_.block_size, r.cache_salt);
    const bool decoding = taken > r.num_prompt_tokens;
    if (decoding && l.decode_checkpoint && !(*l.decode_checkpoint == h)) checkpoints_.Drop(*l.decode_checkpoint);
    if (const std::optional<int64_t> to = checkpoints_.Save(h)) storage_.CopyState(l.state_slot, *to);
    if (decoding) l.decode_checkpoint = h;
  }
}

void Engine::Finish(const SeqRequest& r, FinishReason reason, const Status& status, bool request_error) {
  auto it = live_.find(r.id);
  if (it == live_.end()) return;
  Live& l = *it->second;
  StreamUpdate u;
  u.finished = true;
  u.finish_reason = reason;
  u.status = status;
  u.request_error = request_error;
  u.num_prompt_tokens = l.num_prompt_tokens;
  u.num_truncated_tokens = l.num_truncated_tokens;
  u.num_cached_tokens = std::max<int64_t>(0, r.num_cached_tokens);
  u.num_evicted_tokens = r.num_evicted;
  u.kv_budget = r.kv_budget;
  if (reason == FinishReason::kStop) u.stop_string = l.matched_stop;
  if (l.embed) {
    u.embedding = runner_.Embedding(r.id);
    if (reason == FinishReason::kLength) u.finish_reason = FinishReason::kStop;  // the prompt is all there was to do
  }
  if (l.detok && reason != FinishReason::kStop && !l.embed) l.text += l.detok->Flush();
  if (l.text.size() > l.emitted) u.text = l.text.substr(l.emitted);
  l.stream->Push(std::move(u));
  runner_.RemoveRequest(r.id);
  if (draft_) draft_->Release(r.id);
  ReleaseStateSlot(l);
  live_.erase(it);
}

// Takes what was submitted and cancelled (waiting for it when there is no work); false once the
// queue has closed, every request in flight then cancelled.
bool Engine::TakeRequests(StepBuffers& b) {
  b.submitted.clear();
  b.cancelled.clear();
  if (!sched_.HasWork() && !b.idle_released && !queue_.WaitFor(kIdleReleaseDelay)) {
    // Idle a while: what the finished requests freed goes back to the system (a burst's memory
    // must not stay with an idle server). Not at every idle moment: malloc_trim walks every
    // arena, holding each one's lock, and under a stream of short requests the engine thread
    // would spend its time there while the next request waits.
    ReleaseFreeMemory();
    b.idle_released = true;
  }
  const bool open = queue_.Drain(/*wait=*/!sched_.HasWork(), &b.submitted, &b.cancelled);
  for (auto& p : b.submitted) Admit(p);
  for (int64_t id : b.cancelled) {
    if (auto r = sched_.Abort(id, FinishReason::kCancelled)) {
      PublishStats();
      Finish(*r, FinishReason::kCancelled, Status::Ok());
    }
  }
  if (open) return true;
  std::vector<int64_t> ids;
  for (const auto& [id, l] : live_) ids.push_back(id);
  for (int64_t id : ids) {
    if (auto r = sched_.Abort(id, FinishReason::kCancelled)) Finish(*r, FinishReason::kCancelled, Status::Ok());
  }
  return false;
}

// The runner's view of the plan's chunks (drafts after a request's tokens, retention's slots and
// attention accumulators); true when any wants prompt logprobs.
bool Engine::BuildSeqs(const StepPlan& plan, StepBuffers& b) {
  bool any_prompt_logprobs = false;
  b.seqs.clear();
  b.spec_inputs.resize(plan.seqs.size());
  b.snapshots.assign(plan.seqs.size(), {});
  b.new_checkpoints.clear();
  b.checkpoint_slots.clear();
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    std::span<const int32_t> tokens = s.req->tokens;
    if (s.num_spec > 0) {
      // The chunk's drafts follow the request's tokens.
      b.spec_inputs[i].assign(s.req->tokens.begin(), s.req->tokens.end());
      b.spec_inputs[i].insert(b.spec_inputs[i].end(), s.req->spec_tokens.begin(), s.req->spec_tokens.begin() + s.num_spec);
      tokens = b.spec_inputs[i];
    }
    b.seqs.push_back({s.req->id, tokens, s.start, s.num_new_tokens, kv_.BlockTable(s.req->id), s.sample, s.num_spec});
    Live& l = *live_.at(s.req->id);
    RunnerSeq& q = b.seqs.back();
    if (storage_.num_state_slots() > 0) {
      // Held from the first chunk until the request finishes or is preempted (it then starts
      // again from its first token, as its blocks do); never more running than slots.
      if (l.state_slot < 0) {
        CHECK(!free_state_slots_.empty());  // never more running than slots
        l.state_slot = free_state_slots_.back();
        free_state_slots_.pop_back();
        if (s.start > 0) {
          // A prefix-cache hit (admission starts nowhere else): it ends at a checkpoint.
          const std::optional<int64_t> from =
              checkpoints_.Find(kv_.PrefixHash(s.req->tokens, s.start / config_.block_size, s.req->cache_salt));
          CHECK(from.has_value() && storage_.state_tokens(*from) == s.start);
          storage_.CopyState(*from, l.state_slot);
        }
      }
      q.state_slot = l.state_slot;
      // A verifying request keeps the states after its decode token and each guess but the last.
      for (int64_t j = 0; j < s.num_spec; ++j) {
        b.snapshots[i].push_back({static_cast<int32_t>(j), l.snapshots[static_cast<size_t>(j)]});
      }
    }
    q.num_prompt = s.req->num_prompt_tokens;
    if (kv_.num_groups() > 1) q.group_tables = kv_.BlockTables(s.req->id);
    q.prompt_logprobs = l.prompt_logprobs;
    any_prompt_logprobs = any_prompt_logprobs || l.prompt_logprobs >= 0;
    if (l.retention) {
      if (l.retention_fresh) {
        l.retention->Reset(s.req->num_pinned_slots);
        l.retention_fresh = false;
      }
      q.slot_start = s.start - s.req->num_evicted;
      q.attn_acc = l.retention->Accumulator(q.slot_start + q.num_new);
      q.attn_acc_stride = l.retention->stride();
    }
  }
  if (checkpoints_.capacity() > 0) CheckpointPrompts(plan, b);
  for (size_t i = 0; i < plan.seqs.size(); ++i) b.seqs[i].state_snapshots = b.snapshots[i];
  return any_prompt_logprobs;
}

// A prompt chunk that passes the last block boundary a repeat of its prompt can resume from
// ((prompt - 1) / block_size blocks) keeps the state there as a checkpoint, part way through the
// step (a chunk that ends there is checkpointed after it). After the restores of BuildSeqs: a
// checkpoint given up here for room was not one of theirs.
void Engine::CheckpointPrompts(const StepPlan& plan, StepBuffers& b) {
  const int64_t block = config_.block_size;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    const SeqRequest& r = *s.req;
    const int64_t boundary = (r.num_prompt_tokens - 1) / block * block;
    if (live_.at(r.id)->state_slot < 0 || boundary <= s.start || boundary >= s.start + s.num_new_tokens) continue;
    const BlockHash h = kv_.PrefixHash(r.tokens, boundary / block, r.cache_salt);
    // Not a slot this step fills already (with fewer checkpoints than such prompts, the later
    // ones go without).
    const std::optional<int64_t> slot = checkpoints_.Save(h, b.checkpoint_slots);
    if (!slot) continue;
    b.checkpoint_slots.push_back(*slot);
    b.snapshots[i].push_back({static_cast<int32_t>(boundary - 1 - s.start), static_cast<int32_t>(*slot)});
    b.new_checkpoints.push_back(h);
  }
}

Status Engine::RunStep(const StepPlan& plan, StepBuffers& b, bool any_prompt_logprobs) {
  // A step with any prompt chunk counts as prefill in the profile, one of decodes only as decode.
  bool decode_only = true;
  for (const ScheduledSeq& q : plan.seqs) decode_only = decode_only && q.num_new_tokens == 1 + q.num_spec && q.sample;
  ProfileSpan span(decode_only ? "decode" : "prefill", "step", plan.num_tokens);
  const auto t0 = std::chrono::steady_clock::now();
  Status st = runner_.Execute(b.seqs, &b.out.tokens, &b.logprobs, any_prompt_logprobs ? &b.prompt_logprobs : nullptr);
  // The fit is of decode steps: a prompt chunk's tokens cost less each (one weight read for many).
  if (decode_only && config_.spec.method != SpecMethod::kOff) {
    spec_cost_.AddStep(plan.num_tokens, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return st;
}

// Kept in order; a chunk computed again after preemption adds only what is new.
void Engine::KeepPromptLogprobs(const StepPlan& plan, const std::vector<PromptLogprobs>& prompt_logprobs) {
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Live& l = *live_.at(plan.seqs[i].req->id);
    const PromptLogprobs& p = prompt_logprobs[i];
    if (l.num_emitted_tokens > 0) continue;  // sent already (this is a recomputation)
    for (size_t e = 0; e < p.entries.size(); ++e) {
      if (p.first + static_cast<int64_t>(e) == static_cast<int64_t>(l.prompt_lps.size())) l.prompt_lps.push_back(p.entries[e]);
    }
  }
}

// Streams the new tokens (those Update kept: up to a stop token or the length limit); a stop
// string or a complete grammar ends its request here, a grammar error fails it (into b.failed).
void Engine::StreamStep(const StepPlan& plan, std::vector<std::unique_ptr<SeqRequest>>& finished, StepBuffers& b) {
  auto take = [&](int64_t id, FinishReason reason) -> std::unique_ptr<SeqRequest> {
    auto it = std::find_if(finished.begin(), finished.end(), [id](const auto& f) { return f->id == id; });
    if (it == finished.end()) return sched_.Abort(id, reason);
    std::unique_ptr<SeqRequest> owned = std::move(*it);
    finished.erase(it);
    return owned;
  };
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!plan.seqs[i].sample) continue;
    const SeqRequest& r = *plan.seqs[i].req;  // still alive: running, or owned by `finished`
    Live& l = *live_.at(r.id);
    const ModelRunner::GrammarState gs = runner_.grammar_state(r.id);
    if (!gs.status.ok()) {
      // No token could continue the grammar: the request ends with that error, the placeholder
      // token unseen.
      if (auto owned = take(r.id, FinishReason::kError)) b.failed.emplace_back(std::move(owned), gs.status);
      continue;
    }
    const int64_t first = l.num_emitted_tokens;
    if (l.embed) continue;  // its one sampled token is not output
    for (int64_t g = first; g < r.num_generated(); ++g) {
      ++stats_.num_generated_tokens;
      const size_t j = static_cast<size_t>(g - first);
      if (!EmitToken(l, r.tokens[r.num_prompt_tokens + g], j < b.logprobs[i].size() ? &b.logprobs[i][j] : nullptr)) continue;
      const int64_t id = r.id;
      auto it = std::find_if(finished.begin(), finished.end(), [id](const auto& f) { return f->id == id; });
      if (it != finished.end()) {
        (*it)->finish_reason = FinishReason::kStop;
      } else if (auto a = sched_.Abort(id, FinishReason::kStop)) {
        finished.push_back(std::move(a));
      }
      break;
    }
    if (gs.done) {
      // The grammar is complete and nothing may follow: the output is whole (Abort finds
      // nothing when the request finished already).
      if (auto a = sched_.Abort(r.id, FinishReason::kStop)) finished.push_back(std::move(a));
    }
  }
}

void Engine::Loop() {
  StepBuffers b;
  while (true) {
    if (!TakeRequests(b)) return;
    if (!sched_.HasWork()) continue;
    if (Status ps = Propose(); !ps.ok()) {
      // The draft model failed: its guesses are dropped, target decoding carries on.
      for (SeqRequest* r : sched_.running()) r->spec_tokens.clear();
    }
    TakeSnapshots();
    const StepPlan plan = sched_.Schedule();
    stats_.num_preemptions += static_cast<int64_t>(plan.preempted.size());
    if (draft_) {
      for (int64_t id : plan.preempted) draft_->Release(id);
    }
    for (int64_t id : plan.preempted) {
      live_.at(id)->retention_fresh = true;
      ReleaseStateSlot(*live_.at(id));
    }
    if (plan.empty()) continue;
    b.idle_released = false;
    const bool any_prompt_logprobs = BuildSeqs(plan, b);
    if (Status st = RunStep(plan, b, any_prompt_logprobs); !st.ok()) {
      // The model refused the batch: fail its requests (never the engine); the checkpoints it was
      // to fill hold nothing.
      for (const BlockHash& h : b.new_checkpoints) checkpoints_.Drop(h);
      for (const ScheduledSeq& s : plan.seqs) {
        if (auto r = sched_.Abort(s.req->id, FinishReason::kError)) Finish(*r, FinishReason::kError, st);
      }
      PublishStats();
      continue;
    }
    if (any_prompt_logprobs) KeepPromptLogprobs(plan, b.prompt_logprobs);
    ++stats_.num_steps;
    stats_.num_step_tokens += plan.num_tokens;
    stats_.running_step_sum += static_cast<int64_t>(plan.seqs.size());
    stats_.max_running = std::max<int64_t>(stats_.max_running, static_cast<int64_t>(plan.seqs.size()));
    auto finished = sched_.Update(plan, b.out);
    AfterSpecStep(plan, b.out);
    AfterStepStates(plan, b.out);
    StreamStep(plan, finished, b);
    Evict();
    // Counters first: a client that sees its request finish sees its blocks (and state slot) free.
    auto release = [&](int64_t id) {
      if (auto it = live_.find(id); it != live_.end()) ReleaseStateSlot(*it->second);
    };
    for (const auto& r : finished) release(r->id);
    for (const auto& [r, status] : b.failed) release(r->id);
    PublishStats();
    for (const auto& r : finished) Finish(*r, r->finish_reason, Status::Ok());
    for (const auto& [r, status] : b.failed) Finish(*r, FinishReason::kError, status, /*request_error=*/true);
    b.failed.clear();
  }
}

Status Engine::Propose() {
  if (config_.spec.method == SpecMethod::kOff) return Status::Ok();
  const std::vector<SeqRequest*> running = sched_.running();
  int64_t decoding = 0;
  for (SeqRequest* r : running) {
    r->spec_tokens.clear();
    // The draft's K/V past what the target holds may be of rejected or never verified guesses.
    if (draft_) draft_->Rollback(r->id, r->num_computed_tokens);
    if (r->num_computed_tokens + 1 == r->num_tokens()) ++decoding;  // its decode token
  }
  int64_t step_tokens = decoding;
  draft_jobs_.clear();
  draft_reqs_.clear();
  for (SeqRequest* r : running) {
    if (r->num_computed_tokens + 1 != r->num_tokens()) continue;  // still in prefill
    Live& l = *live_.at(r->id);
    // Room left before max_tokens and within the step cap; then what the cost model says pays.
    const int64_t room = std::min({config_.spec.num_tokens, config_.spec.max_step_tokens - step_tokens,
                                   r->max_new_tokens - r->num_generated() - 1});
    const int64_t k = config_.spec.always ? room : spec_cost_.Guesses(l.spec_hits / l.spec_trials, step_tokens, room);
    if (k < 1) {
      // Not worth it now: drift back towards the prior, so the request is tried again later.
      l.spec_hits = l.spec_hits * 0.98 + 0.02;
      l.spec_trials = l.spec_trials * 0.98 + 0.04;
      continue;
    }
    if (config_.spec.method == SpecMethod::kNgram) {
      r->spec_tokens = ProposeNgram(r->tokens, k, config_.spec.ngram);
      r->spec_tokens.resize(runner_.GrammarAllowedPrefix(r->id, r->spec_tokens));
      step_tokens += static_cast<int64_t>(r->spec_tokens.size());
    } else {
      draft_jobs_.push_back({r->id, r->tokens, k});
      draft_reqs_.push_back(r);
      step_tokens += k;
    }
  }
  if (draft_jobs_.empty()) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(draft_->Propose(draft_jobs_, &draft_out_));
  int64_t guesses = 0;
  for (size_t i = 0; i < draft_reqs_.size(); ++i) {
    guesses += static_cast<int64_t>(draft_out_[i].size());
    draft_reqs_[i]->spec_tokens = std::move(draft_out_[i]);
    draft_reqs_[i]->spec_tokens.resize(runner_.GrammarAllowedPrefix(draft_reqs_[i]->id, draft_reqs_[i]->spec_tokens));
  }
  spec_cost_.AddDraft(guesses, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

void Engine::AfterSpecStep(const StepPlan& plan, const RunnerOutput& out) {
  if (config_.spec.method == SpecMethod::kOff) return;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& s = plan.seqs[i];
    if (s.num_spec == 0) continue;
    const int64_t accepted = static_cast<int64_t>(out.tokens[i].size()) - 1;
    // Guesses are tried in order until one fails: `accepted` successes in min(accepted + 1, k) trials.
    Live& l = *live_.at(s.req->id);
    l.spec_hits = l.spec_hits * 0.9 + static_cast<double>(accepted);
    l.spec_trials = l.spec_trials * 0.9 + static_cast<double>(std::min(accepted + 1, s.num_spec));
  }
}

void Engine::Evict() {
  for (SeqRequest* r : sched_.running()) {
    Live& l = *live_.at(r->id);
    if (!l.retention || l.retention_fresh) continue;
    const int64_t slots = r->num_slots();
    const int64_t kept = l.retention->MaybeEvict(storage_, kv_.BlockTables(r->id), slots);
    if (kept == slots) continue;
    kv_.TrimSlots(r->id, kept, r->num_computed_tokens);
    r->num_evicted += slots - kept;
    stats_.kv_evicted_tokens += slots - kept;
    ++stats_.kv_evictions;
  }
}

void Engine::PublishStats() {
  const int64_t used = num_blocks_ - kv_.num_free_blocks();
  stats_.num_free_blocks = kv_.num_free_blocks();
  stats_.num_free_state_slots = static_cast<int64_t>(free_state_slots_.size());
  stats_.state_checkpoints_saved = checkpoints_.num_saved();
  stats_.window_released_blocks = kv_.num_window_released();
  stats_.num_running = sched_.num_running();
  stats_.num_waiting = sched_.num_waiting();
  const int64_t wasted = kv_.WastedSlots();  // walks every block table: once per step
  stats_.wasted_slots = wasted;
  stats_.max_wasted_slots = std::max<int64_t>(stats_.max_wasted_slots, wasted);
  stats_.max_used_blocks = std::max<int64_t>(stats_.max_used_blocks, used);
  stats_.prefix_cache_lookups = kv_.num_lookups();
  stats_.prefix_cache_query_tokens = kv_.num_lookup_tokens();
  stats_.prefix_cache_hit_tokens = kv_.num_hit_tokens();
  stats_.prefix_cache_blocks = kv_.pool().num_cached();
  stats_.prefix_cache_evictions = kv_.pool().num_evictions();
  stats_.spec_num_drafts = sched_.num_spec_verifications();
  stats_.spec_num_draft_tokens = sched_.num_spec_proposed();
  stats_.spec_num_accepted_tokens = sched_.num_spec_accepted();
  if (config_.kv_events) {
    std::vector<KvCacheEvent> events = kv_.TakeEvents();
    if (!events.empty()) config_.kv_events(std::move(events));
  }
}

}  // namespace gale
