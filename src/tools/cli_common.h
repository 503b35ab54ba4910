// Pieces every model-running subcommand shares: where the default model is, --isa, loading a
// model with its tokenizer, and the engine's flags (KV cache and scheduler limits).
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/file.h"
#include "base/status.h"
#include "dist/communicator.h"
#include "dist/pipeline.h"
#include "dist/tensor_parallel.h"
#include "engine/api.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "tools/commands.h"

namespace gale {

// The bundled stories260K: next to the binary, else the source tree it was built from.
std::string DefaultModelPath();

// Activates the kernels named by --isa ("" = keep the best for this CPU).
Status SelectIsa(const std::string& isa);

struct LoadedModel {
  std::string path;
  bool copied = false;  // read into memory rather than mapped
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
};
// Opens the file (path "" = the default model), loads the model with packed weights and its
// tokenizer, and checks that the two agree on the vocabulary.
StatusOr<LoadedModel> LoadModel(const std::string& path, const LoadOptions& load);
// The same for commands that generate or score text: an encoder (BERT) is refused with a pointer
// to /v1/embeddings.
StatusOr<LoadedModel> LoadTextModel(const std::string& path, const LoadOptions& load);


// A KV cache type flag's value ("f32" ... "int4"); the error names the flag.
StatusOr<kernels::KvType> ParseKvTypeFlag(const char* flag, const std::string& name);

// --kv-key-channels: "auto" (nullopt), "on", "off".
StatusOr<std::optional<bool>> ParseKeyChannelsFlag(const std::string& value);
inline constexpr char kKeyChannelsHelp[] =
    "the model's calibrated per-channel key transform (gale calibrate-kv): auto (for int8/int4 keys) | on | off";

// "1073741824", "512M", "2G", "1.5GiB" -> bytes.
StatusOr<uint64_t> ParseBytes(const std::string& text);

// KV retention flags: --kv-retention none|window|sink-window|heavy-hitter, --kv-budget TOKENS or
// --kv-budget-ratio R (ratio_help says of what), --kv-sink-tokens N. Shared by the engine's
// commands and gale eval.
struct RetentionFlags {
  std::string policy = "none";
  RetentionConfig config;
  void Register(CLI::App& app, const char* ratio_help);
  // Errors for an unknown policy, a budget without a policy, or what RetentionConfig::Validate refuses.
  StatusOr<RetentionConfig> Resolve() const;
  // "none", or e.g. "heavy-hitter 0.25" / "window 64".
  std::string Describe() const;
};

// Engine flags as vLLM names them: --block-size, --kv-cache-memory, --kv-cache-ratio, --kv-type,
// --max-num-batched-tokens, --max-batch-size, --prefill-chunk-size, --max-seq-len, --no-prefix-cache,
// --state-checkpoints.
// Speculative decoding: --spec off|ngram|draft, --spec-tokens, --draft-model, --spec-ngram-min/max,
// --spec-max-step-tokens. KV retention: --kv-retention, --kv-budget or --kv-budget-ratio,
// --kv-sink-tokens.
struct EngineOptions {
  EngineConfig config;
  std::string kv_cache_memory, kv_type = "f16", k_type, v_type, key_channels = "auto";
  bool no_prefix_cache = false;
  bool no_window_groups = false;
  std::string spec = "off", draft_model;
  RetentionFlags retention;
  std::unique_ptr<LoadedModel> draft;  // loaded by Resolve for --spec draft
  void Register(CLI::App& app);
  // Checks the flags and loads the draft model (once); the config points at it.
  StatusOr<EngineConfig> Resolve();
};

// One model over several processes from the command line: `mpirun -np N gale serve|batch
// --pipeline-parallel N` (layer ranges per rank) or `--tensor-parallel N` (heads and FFN width per
// rank; `--tensor-parallel-slices P` fixes the split, also in one process, so that results are the
// same bits with any rank count dividing P into powers of two). Every rank runs the same command
// line; rank 0 runs the command, ranks 1..N-1 run their share of every step (dist::
// RunPipelineWorker, dist::RunTensorParallelWorker) until rank 0 is done.
struct ParallelFlags {
  int stages = 1;
  int micro_batches = 0;
  int tensor_ranks = 1;
  int tensor_slices = 0;  // 0: tensor_ranks
  double timeout_s = 300;
  void Register(CLI::App& app);
  int ranks() const { return std::max(stages, tensor_ranks); }
  int slices() const { return tensor_slices > 0 ? tensor_slices : tensor_ranks; }
  bool on() const { return ranks() > 1; }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)); }
  dist::PipelineOptions pipeline_options() const;
  dist::TensorParallelOptions tensor_options() const;
};
struct ParallelRank {
  dist::Communicator* comm = nullptr;  // null in one process
  std::optional<int> exit_code;        // set on ranks > 0: their work is done, return it
};
// Checks the flags and sets *load's share of the model (its stage, or its tensor split, which a
// single process with --tensor-parallel-slices also gets). With more than one rank: starts MPI and
// checks the world has that many; on ranks > 0 loads the model (its share only), runs its part of
// every step until rank 0 says stop and sets exit_code (SIGTERM and SIGINT are ignored there:
// rank 0 ends them).
StatusOr<ParallelRank> StartParallelRank(const ParallelFlags& flags, const std::string& model, LoadOptions* load,
                                         int threads, const char* command);
// Rank 0's end, whatever way the command leaves: on destruction (declare it before the engine, so
// the engine goes first) tells the other ranks to exit and ends MPI; where they do not take the
// stop within a few seconds (a rank is gone), MPI is left for the launcher to end.
class ParallelGuard {
 public:
  explicit ParallelGuard(dist::Communicator* comm) : comm_(comm) {}
  ~ParallelGuard();
  ParallelGuard(const ParallelGuard&) = delete;
  ParallelGuard& operator=(const ParallelGuard&) = delete;
  // Waits for the other ranks and routes the engine's forward through the pipeline or the
  // tensor-parallel group.
  Status Connect(const ParallelFlags& flags, const Model& model, EngineConfig* cfg);
  bool connected() const { return pipeline_ != nullptr || tensor_ != nullptr; }
  // Makes the step in flight and every later one fail at once with `why` (a signal handler's thread).
  void Abort(const std::string& why);

 private:
  dist::Communicator* comm_;
  std::unique_ptr<dist::PipelineDriver> pipeline_;
  std::unique_ptr<dist::TensorParallelDriver> tensor_;
};

}  // namespace gale
