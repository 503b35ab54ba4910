// Shared CLI helpers: default model path, ISA selection, model loading, engine flags.
#include "tools/cli_common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "kernels/kernels.h"

namespace gale {

std::string DefaultModelPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    std::string dir(buf, n);
    dir = dir.substr(0, dir.find_last_of('/'));
    for (const char* rel : {"/models/stories260K.gguf", "/../models/stories260K.gguf"}) {
      const std::string p = dir + rel;
      if (access(p.c_str(), R_OK) == 0) return p;
    }
  }
  return GALE_DEFAULT_MODEL;
}

Status SelectIsa(const std::string& name) {
  if (name.empty()) return Status::Ok();
  const auto isa = kernels::ParseIsa(name);
  if (!isa) return InvalidArgument("--isa '{}' is not one of scalar, avx2, avx512", name);
  if (kernels::GetKernelTable(*isa) == nullptr) return InvalidArgument("this CPU cannot run --isa {}", name);
  kernels::SetActiveIsa(*isa);
  return Status::Ok();
}

StatusOr<LoadedModel> LoadModel(const std::string& path_flag, const LoadOptions& load) {
  LoadedModel m;
  m.path = path_flag.empty() ? DefaultModelPath() : path_flag;
  m.copied = load.CopyToMemory(m.path);
  auto file = GgufFile::Open(m.path, m.copied);
  if (!file.ok()) return file.status();
  m.file = std::move(file).value();
  auto model = LoadModel(*m.file);
  if (!model.ok()) return model.status().WithContext(m.path);
  m.model = std::move(model).value();
  for (const std::string& w : m.model->load_warnings()) std::fprintf(stderr, "warning: %s: %s\n", m.path.c_str(), w.c_str());
  if (load.split.on()) {
    if (Status s = m.model->ShardForTensorParallel(load.split); !s.ok()) return s.WithContext(m.path);
  }
  if (load.Pack(m.path)) {
    const auto [first_layer, end_layer] =
        dist::StageLayers(m.model->hparams().num_layers, std::max(1, load.num_stages))[std::max(0, load.stage)];
    // A pipeline computes the output layer on rank 0 (dist/pipeline.h).
    m.model->PackWeights(load.keep_packed_sources ? nullptr : m.file.get(), first_layer, end_layer,
                         /*with_output=*/load.stage == 0);
  } else if (!load.no_pack) {
    std::fprintf(stderr, "note: %s is larger than 80%% of the available memory: weights run from the mapped file, unpacked\n",
                 m.path.c_str());
  }
  if (load.mlock) {  // as llama.cpp's --mlock: a refusal is a warning, the model runs unlocked
    auto file_bytes = m.file->LockPages();
    auto packed_bytes = file_bytes.ok() ? m.model->LockPackedWeights() : StatusOr<uint64_t>(file_bytes.status());
    if (!packed_bytes.ok()) {
      std::fprintf(stderr, "warning: --mlock: %s\n", packed_bytes.status().message().c_str());
    } else {
      std::fprintf(stderr, "locked %.1f MiB of weights in memory (%.1f MiB packed, %.1f MiB of the file)\n",
                   (*file_bytes + *packed_bytes) / 1048576.0, *packed_bytes / 1048576.0, *file_bytes / 1048576.0);
    }
  }
  auto tok = Tokenizer::FromGguf(*m.file);
  if (!tok.ok()) return tok.status().WithContext(m.path);
  m.tok = std::move(tok).value();
  if (m.tok->vocab_size() != m.model->hparams().vocab_size) {
    return InvalidArgument("{}: tokenizer has {} tokens but the embedding has {} rows", m.path, m.tok->vocab_size(),
                           m.model->hparams().vocab_size);
  }
  return m;
}

StatusOr<LoadedModel> LoadTextModel(const std::string& path, const LoadOptions& load) {
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(path, load));
  if (!m.model->hparams().causal) {
    return InvalidArgument("{} is an encoder ({}): it computes embeddings (gale serve's /v1/embeddings), not text",
                           m.path, m.model->hparams().arch);
  }
  return m;
}

StatusOr<uint64_t> ParseBytes(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !(v >= 0) || !std::isfinite(v)) return InvalidArgument("'{}' is not a size in bytes", text);
  std::string unit(end);
  if (unit.size() > 1 && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() > 1 && (unit.back() == 'i')) unit.pop_back();
  double mult = 1;
  if (unit.empty()) mult = 1;
  else if (unit == "K" || unit == "k") mult = 1024.0;
  else if (unit == "M" || unit == "m") mult = 1048576.0;
  else if (unit == "G" || unit == "g") mult = 1073741824.0;
  else if (unit == "T" || unit == "t") mult = 1099511627776.0;
  else return InvalidArgument("'{}': unknown unit (use K, M, G or T)", text);
  return static_cast<uint64_t>(v * mult);
}

void LoadOptions::Register(CLI::App& app) {
  auto* m = app.add_flag("--mmap", force_mmap, "map the model file (no copy; slower streaming of float weights)");
  auto* c = app.add_flag("--no-mmap", force_copy, "read the model into huge-page memory");
  m->excludes(c);
  app.add_flag("--no-pack", no_pack,
               "run weights in the file's layout (no packed copy; the default for files larger than 80% of free memory)");
  app.add_flag("--mlock", mlock,
               "lock the weights in memory (never paged out or evicted; needs `ulimit -l` to allow it, else a warning)");
}

namespace {

// A number from a one-line file (cgroup limits); nullopt when absent or not a number ("max").
std::optional<double> ReadNumber(const std::string& path) {
  std::ifstream f(path);
  double v = 0.0;
  if (!(f >> v)) return std::nullopt;
  return v;
}

// What this process's memory cgroup still allows (limit - usage), or nullopt without a limit:
// cgroup v2 (memory.max, memory.current) or v1 (memory.limit_in_bytes, memory.usage_in_bytes;
// both count the page cache, so a mapped model larger than the limit pages as on a small machine).
std::optional<double> CgroupHeadroom() {
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::optional<double> limit, usage;
    if (controllers.empty()) {  // v2
      limit = ReadNumber("/sys/fs/cgroup" + path + "/memory.max");
      usage = ReadNumber("/sys/fs/cgroup" + path + "/memory.current");
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {  // v1
      limit = ReadNumber("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
      usage = ReadNumber("/sys/fs/cgroup/memory" + path + "/memory.usage_in_bytes");
    }
    // v1 reports "no limit" as a huge number (LONG_MAX rounded to pages).
    if (limit && usage && *limit < 1e18) return std::max(0.0, *limit - *usage);
  }
  return std::nullopt;
}

// The file's size over the memory available to this process (MemAvailable, or the memory
// cgroup's headroom where that is less), or 0 when unknown.
double ShareOfAvailableMemory(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return 0.0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  long long kb = 0;
  double available = 0.0;
  while (meminfo >> key >> kb) {
    if (key == "MemAvailable:") {
      available = static_cast<double>(kb) * 1024.0;
      break;
    }
    meminfo.ignore(256, '\n');
  }
  if (const auto headroom = CgroupHeadroom(); headroom && (available == 0.0 || *headroom < available)) {
    available = *headroom;
  }
  return available > 0.0 ? static_cast<double>(st.st_size) / available : 0.0;
}

}  // namespace

bool LoadOptions::CopyToMemory(const std::string& path) const {
  if (force_mmap) return false;
  if (force_copy) return true;
  const double share = ShareOfAvailableMemory(path);
  return share > 0.0 && share < 0.4;
}

bool LoadOptions::Pack(const std::string& path) const { return !no_pack && ShareOfAvailableMemory(path) <= 0.8; }

void EngineOptions::Register(CLI::App& app) {
  SchedulerConfig& s = config.sched;
  app.add_option("--block-size", config.block_size, "tokens per KV cache block")->capture_default_str();
  app.add_option("--kv-cache-memory", kv_cache_memory, "KV cache size, e.g. 2G (default: --kv-cache-ratio)");
  app.add_option("--kv-cache-ratio", config.kv_cache_ratio,
                 "share of the memory available after loading the model that the KV cache may take")
      ->capture_default_str();
  app.add_option("--kv-type,--kv-cache-dtype", kv_type,
                 "KV cache element type: f32 | f16 | bf16 | int8 | int4 (int8/int4: an f16 scale per position and head)")
      ->capture_default_str();
  app.add_option("--k-cache-dtype", k_type, "K's type when it differs from --kv-type");
  app.add_option("--v-cache-dtype", v_type, "V's type when it differs from --kv-type (e.g. --kv-type int8 --v-cache-dtype int4)");
  app.add_option("--kv-key-channels", key_channels, kKeyChannelsHelp)->capture_default_str();
  app.add_option("--max-num-batched-tokens", s.max_num_batched_tokens, "token budget of one engine step")
      ->capture_default_str();
  app.add_option("--max-batch-size", s.max_batch_size, "most requests running at once")->capture_default_str();
  app.add_option("--prefill-chunk-size", s.prefill_chunk_size, "most prompt tokens of one request per step")
      ->capture_default_str();
  app.add_option("--max-seq-len", s.max_seq_len, "most tokens (prompt + output) per request (0 = the model's context)")
      ->capture_default_str();
  app.add_flag("--no-prefix-cache", no_prefix_cache, "do not reuse the KV of prompt prefixes seen before");
  app.add_option("--state-checkpoints", config.state_checkpoints,
                 "models with recurrent layers (Qwen3.5): states kept at block-aligned prefixes for the prefix cache "
                 "to resume from (-1: as many as --max-batch-size, within a quarter of the KV memory; 0: no prefix "
                 "cache for such a model)")
      ->capture_default_str();
  app.add_flag("--no-kv-window-groups", no_window_groups,
               "keep every block of sliding-window layers (by default they sit in layer groups of their own whose "
               "blocks behind the window go back to the pool)");
  app.add_flag("--kv-prefault", config.kv_prefault,
               "commit the whole KV cache's memory at start-up (slower start, all of it resident at once) instead of "
               "as blocks are first written, so no step waits on page faults");
  SpecConfig& sp = config.spec;
  app.add_option("--spec", spec, "speculative decoding: off | ngram (prompt lookup) | draft (--draft-model)")
      ->capture_default_str();
  app.add_option("--spec-tokens", sp.num_tokens, "most guessed tokens per request per step (adapts below it)")
      ->capture_default_str();
  app.add_option("--draft-model", draft_model, "GGUF of a smaller model with the same vocabulary, for --spec draft");
  app.add_option("--spec-ngram-min", sp.ngram.ngram_min, "shortest suffix prompt lookup matches")->capture_default_str();
  app.add_option("--spec-ngram-max", sp.ngram.ngram_max, "longest suffix prompt lookup matches")->capture_default_str();
  app.add_option("--spec-max-step-tokens", sp.max_step_tokens,
                 "guesses only while a step's decode tokens plus guesses stay within this (off at large batch)")
      ->capture_default_str();
  app.add_flag("--spec-always", sp.always, "guess --spec-tokens every step, even where the step-cost model says it slows decoding");
  retention.Register(app, "KV retention: positions kept as a share of each request's length (prompt + max_tokens)");
}

void RetentionFlags::Register(CLI::App& app, const char* ratio_help) {
  app.add_option("--kv-retention", policy,
                 "lossy KV retention per sequence: none | window | sink-window | heavy-hitter (needs --kv-budget or "
                 "--kv-budget-ratio)")
      ->capture_default_str();
  app.add_option("--kv-budget", config.budget, "KV retention: positions each sequence keeps in the cache (tokens)");
  app.add_option("--kv-budget-ratio", config.budget_ratio, ratio_help);
  app.add_option("--kv-sink-tokens", config.sink_tokens, "KV retention sink-window: first positions always kept")
      ->capture_default_str();
}

StatusOr<RetentionConfig> RetentionFlags::Resolve() const {
  RetentionConfig c = config;
  ASSIGN_OR_RETURN(c.policy, ParseRetentionPolicy(policy));
  if (!c.active() && (c.budget != 0 || c.budget_ratio != 0.0)) {
    return InvalidArgument("--kv-budget and --kv-budget-ratio need --kv-retention window|sink-window|heavy-hitter");
  }
  if (Status st = c.Validate(); !st.ok()) return st.WithContext("--kv-retention");
  return c;
}

std::string RetentionFlags::Describe() const {
  if (policy == "none") return policy;
  return config.budget > 0 ? fmt::format("{} {}", policy, config.budget) : fmt::format("{} {:g}", policy, config.budget_ratio);
}

StatusOr<kernels::KvType> ParseKvTypeFlag(const char* flag, const std::string& name) {
  const auto t = kernels::ParseKvType(name);
  if (!t) return InvalidArgument("{} '{}' is not one of f32, f16, bf16, int8, int4", flag, name);
  return *t;
}

StatusOr<std::optional<bool>> ParseKeyChannelsFlag(const std::string& value) {
  if (value == "auto") return std::optional<bool>();
  if (value == "on") return std::optional<bool>(true);
  if (value == "off") return std::optional<bool>(false);
  return InvalidArgument("--kv-key-channels '{}' is not one of auto, on, off", value);
}

StatusOr<EngineConfig> EngineOptions::Resolve() {
  EngineConfig c = config;
  if (!kv_cache_memory.empty()) {
    auto b = ParseBytes(kv_cache_memory);
    if (!b.ok()) return b.status().WithContext("--kv-cache-memory");
    if (*b == 0) return InvalidArgument("--kv-cache-memory must be more than 0");
    c.kv_cache_memory_bytes = *b;
  }
  ASSIGN_OR_RETURN(c.kv_type, ParseKvTypeFlag("--kv-type", kv_type));
  kernels::KvType v = c.kv_type;
  if (!v_type.empty()) {
    ASSIGN_OR_RETURN(v, ParseKvTypeFlag("--v-cache-dtype", v_type));
  }
  if (!k_type.empty()) {
    ASSIGN_OR_RETURN(c.kv_type, ParseKvTypeFlag("--k-cache-dtype", k_type));
  }
  if (v != c.kv_type) c.v_kv_type = v;
  ASSIGN_OR_RETURN(c.key_channels, ParseKeyChannelsFlag(key_channels));
  c.enable_prefix_caching = !no_prefix_cache;
  c.kv_window_groups = !no_window_groups;
  RETURN_IF_ERROR(c.sched.Validate());
  ASSIGN_OR_RETURN(c.spec.method, ParseSpecMethod(spec));
  if (!draft_model.empty() && c.spec.method != SpecMethod::kDraft) {
    return InvalidArgument("--draft-model is used only with --spec draft");
  }
  if (c.spec.method == SpecMethod::kDraft) {
    if (draft_model.empty()) return InvalidArgument("--spec draft needs --draft-model FILE");
    if (!draft) {
      auto m = LoadModel(draft_model, LoadOptions{});
      if (!m.ok()) return m.status().WithContext("--draft-model");
      draft = std::make_unique<LoadedModel>(std::move(*m));
    }
    c.spec.draft = draft->model.get();
  }
  RETURN_IF_ERROR(c.spec.Validate());
  ASSIGN_OR_RETURN(c.retention, retention.Resolve());
  return c;
}

}  // namespace gale

namespace gale {

void ParallelFlags::Register(CLI::App& app) {
  app.add_option("--pipeline-parallel,--pipeline-parallel-size,--pp", stages,
                 "split the model's layers over N processes started by mpirun -np N (or srun); rank 0 serves")
      ->capture_default_str();
  app.add_option("--pipeline-micro-batches", micro_batches,
                 "most micro-batches per step that follow each other through the stages (0: the number of stages)")
      ->capture_default_str();
  app.add_option("--tensor-parallel,--tensor-parallel-size,--tp", tensor_ranks,
                 "split every layer's heads and FFN width over N processes started by mpirun -np N; rank 0 serves")
      ->capture_default_str();
  app.add_option("--tensor-parallel-slices", tensor_slices,
                 "cut the heads and FFN width into this many slices (default: the ranks; a multiple of them): the "
                 "same slices give the same bits with any rank count, one process included")
      ->capture_default_str();
  app.add_option("--pipeline-timeout,--parallel-timeout", timeout_s,
                 "seconds another rank may stay silent before its step fails and the group is taken to be broken")
      ->capture_default_str();
}

dist::PipelineOptions ParallelFlags::pipeline_options() const {
  dist::PipelineOptions o;
  o.micro_batches = micro_batches;
  o.timeout = timeout();
  return o;
}

dist::TensorParallelOptions ParallelFlags::tensor_options() const {
  dist::TensorParallelOptions o;
  o.timeout = timeout();
  return o;
}

StatusOr<ParallelRank> StartParallelRank(const ParallelFlags& flags, const std::string& model, LoadOptions* load,
                                         int threads, const char* command) {
  ParallelRank out;
  if (flags.stages < 1 || flags.stages > 1024) return InvalidArgument("--pipeline-parallel must be in [1, 1024]");
  if (flags.tensor_ranks < 1 || flags.tensor_ranks > 1024) return InvalidArgument("--tensor-parallel must be in [1, 1024]");
  if (flags.tensor_slices < 0 || flags.tensor_slices > 1024) {
    return InvalidArgument("--tensor-parallel-slices must be in [0, 1024]");
  }
  if (flags.stages > 1 && (flags.tensor_ranks > 1 || flags.tensor_slices > 1)) {
    return InvalidArgument("--pipeline-parallel and --tensor-parallel do not combine yet: choose one");
  }
  if (flags.micro_batches < 0) return InvalidArgument("--pipeline-micro-batches must be >= 0");
  if (!(flags.timeout_s > 0)) return InvalidArgument("--pipeline-timeout must be > 0");
  if (flags.slices() > 1 && flags.slices() % flags.tensor_ranks != 0) {
    return InvalidArgument("--tensor-parallel-slices {} is not a multiple of --tensor-parallel {}", flags.slices(),
                           flags.tensor_ranks);
  }
  load->split = TensorSplit{0, flags.tensor_ranks, flags.slices()};
  if (!flags.on()) return out;
  ASSIGN_OR_RETURN(dist::Communicator * comm, dist::MpiWorld());
  const char* flag = flags.stages > 1 ? "--pipeline-parallel" : "--tensor-parallel";
  if (comm->size() != flags.ranks()) {
    return InvalidArgument("{} {} under an MPI world of {} processes (start it with mpirun -np {})", flag, flags.ranks(),
                           comm->size(), flags.ranks());
  }
  if (flags.stages > 1) {
    load->stage = comm->rank();
    load->num_stages = comm->size();
  } else {
    load->split.rank = comm->rank();
  }
  out.comm = comm;
  if (comm->rank() == 0) return out;
  // A worker: rank 0 decides when it ends.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto loaded = LoadModel(model, *load);
  Status s = loaded.status();
  if (loaded.ok()) {
    ThreadPool pool(threads);
    s = flags.stages > 1 ? dist::RunPipelineWorker(*loaded->model, *comm, pool, flags.pipeline_options())
                         : dist::RunTensorParallelWorker(*loaded->model, *comm, pool, flags.tensor_options());
  }
  if (!s.ok()) {
    std::fprintf(stderr, "gale %s: rank %d: %s\n", command, comm->rank(), s.ToString().c_str());
    out.exit_code = 1;  // MPI is left as it is: the launcher ends the job
    return out;
  }
  dist::MpiFinalize();
  out.exit_code = 0;
  return out;
}

Status ParallelGuard::Connect(const ParallelFlags& flags, const Model& model, EngineConfig* cfg) {
  if (comm_ == nullptr) return Status::Ok();
  auto route = [cfg](auto* d) {  // the engine's forward through driver d
    cfg->forward = [d](const ForwardBatch& b, KvStorage& kv, Workspace& ws, ThreadPool& pool) {
      return d->Forward(b, kv, ws, pool);
    };
    std::fprintf(stderr, "%s\n", d->Describe().c_str());
  };
  if (flags.stages > 1) {
    ASSIGN_OR_RETURN(pipeline_, dist::PipelineDriver::Connect(model, *comm_, flags.pipeline_options()));
    route(pipeline_.get());
  } else {
    ASSIGN_OR_RETURN(tensor_, dist::TensorParallelDriver::Connect(model, *comm_, flags.tensor_options()));
    route(tensor_.get());
  }
  return Status::Ok();
}

void ParallelGuard::Abort(const std::string& why) {
  if (pipeline_ != nullptr) pipeline_->Abort(why);
  if (tensor_ != nullptr) tensor_->Abort(why);
}

ParallelGuard::~ParallelGuard() {
  if (comm_ == nullptr) return;
  const auto wait = std::chrono::milliseconds(5000);
  const Status s = pipeline_ != nullptr ? pipeline_->Stop(wait)
                   : tensor_ != nullptr ? tensor_->Stop(wait)
                                        : dist::StopWorkers(*comm_, wait);
  if (!s.ok()) {
    std::fprintf(stderr, "the other ranks did not take the stop: %s\n", s.ToString().c_str());
    return;
  }
  dist::MpiFinalize();
}

}  // namespace gale
