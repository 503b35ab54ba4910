// The model seam: one abstract Model that the engine, runner, speculation, evaluation,
// quantization and benchmarks see, and the types its Forward speaks (ForwardBatch, Workspace,
// ActivationObserver, KeyChannels, the fixed-sequence KvCache). Each architecture is one file
// under model/arch/ built from the shared blocks in model/blocks.h; LoadModel (model/registry.cc)
// picks it by general.architecture. Nothing here knows an architecture.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "gguf/gguf_file.h"
#include "kernels/kernels.h"
#include "kv/kv_storage.h"
#include "model/hparams.h"
#include "model/weights.h"

namespace gale {

// Sums a row-parallel product's partial rows over a tensor-parallel group, in place, in the
// tree TensorSplit describes: every rank gets the same bits. A failure (a rank gone) is the
// implementation's to keep: the forward finishes on whatever the rows hold and the caller that
// set it (dist/tensor_parallel.h) fails the step.
class PartialSums {
 public:
  virtual ~PartialSums() = default;
  virtual void Sum(float* x, int64_t n) = 0;
};

// One step's tokens, from one or more sequences. Tokens of a sequence appear in position order.
// A recurrent state kept part way through a step (ForwardBatch::state_snapshots).
struct StateSnapshot {
  int32_t after = 0;  // the sequence's token (0-based among its tokens in the batch)
  int32_t slot = -1;
  bool operator==(const StateSnapshot&) const = default;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;      // [num_tokens]
  std::vector<int32_t> positions;   // [num_tokens] position of each token in its sequence
  std::vector<int32_t> seq_idx;     // [num_tokens] index into block_tables; empty: all 0
  std::vector<int32_t> logit_rows;  // tokens whose logits are wanted, in output order; empty: see below
  bool all_logits = false;          // with logit_rows empty: every token (perplexity), else the last
  // Tokens whose hidden state (the final norm's output, no logits) is wanted, in output order:
  // ws.hidden holds them ([num_hidden_rows, dim]).
  std::vector<int32_t> hidden_rows;
  // [num_groups * num_seqs] logical -> physical block ids of each sequence, group-major: the
  // cache's layer groups (KvLayerGroups; usually one) each have a table per sequence. Each must
  // cover every slot in the batch; a windowed group's entries before a token's window may be
  // KvCacheManager::kNoBlock (given back).
  std::vector<std::span<const int32_t>> block_tables;
  // [num_tokens] cache slot of each token in its sequence: its K/V are written there and it
  // attends to slots [0, slot]. Empty: the positions. With KV retention a sequence's slots run
  // behind its positions (evicted tokens' rows were compacted away); RoPE still uses positions.
  // Sliding-window layers in layer groups of their own (KvLayerGroups) always use positions.
  std::vector<int32_t> slots;
  // [num_seqs] each sequence's recurrent-state slot (KvStorage::ReserveStates), for models with
  // linear-attention layers; empty: sequence s uses slot s. A sequence whose first token here is at
  // position 0 starts from a zero state; one at position p continues the slot's state, which must
  // have taken in exactly p tokens (else the step is refused).
  std::vector<int32_t> state_slots;
  int32_t state_slot(int32_t seq) const { return state_slots.empty() ? seq : state_slots[seq]; }
  // [num_seqs] or empty: states kept part way through the step, each in a slot of its own (no
  // sequence's): the state after the sequence's `after`-th token here (0-based, increasing within
  // a list; the slot has then taken in that token's position + 1 tokens). Speculative decoding
  // keeps the states after a decode token and each guess, so that a rejected guess costs no
  // recompute; the prefix cache keeps the state at a prompt's last block boundary.
  std::vector<std::span<const StateSnapshot>> state_snapshots;
  // KV retention's attention tracking, [num_seqs] or empty: for a sequence with an accumulator,
  // each layer l adds the attention probabilities of all its query heads, over its tokens in the
  // batch, to data[l * stride + slot] for every slot they attend to (stride > its last slot).
  struct AttentionAccumulator {
    float* data = nullptr;
    int64_t stride = 0;
  };
  std::vector<AttentionAccumulator> attn_acc;
  // Calibration (gale quantize): when set, sees the input of every linear layer, [num_tokens, dim].
  class ActivationObserver* observer = nullptr;
  // A pipeline stage (dist/pipeline.h): only layers [first_layer, end_layer) run (end_layer < 0:
  // to the last). A stage after the first reads its input rows ([num_tokens, StageWidth()]: the
  // residual stream, and whatever else of the forward's state an architecture hands on) from
  // `input` instead of the embedding; one before the last leaves its output rows in ws.x
  // ([num_tokens, StageWidth()]) and computes no logits or hidden rows. first_layer == end_layer
  // == num_layers: the output head alone on the input rows. Decoders only.
  int32_t first_layer = 0;
  int32_t end_layer = -1;
  const float* input = nullptr;
  // false: the last layer's rows stay in ws.x, no head (a pipeline's last stage: rank 0 computes
  // the head from the rows it wants).
  bool output_head = true;
  // Tensor parallelism: sums the partial rows of each output projection and FFN down product
  // over the ranks (null: one process, whose products are already whole).
  PartialSums* partial_sums = nullptr;
  // The rows whose logits a forward writes, ForwardBatch's defaults resolved: logit_rows, else
  // every token (all_logits), else the last; logit_row(i) is the token of output row i.
  int64_t num_logit_rows() const {
    if (!logit_rows.empty()) return static_cast<int64_t>(logit_rows.size());
    return all_logits ? static_cast<int64_t>(tokens.size()) : 1;
  }
  int32_t logit_row(int64_t i) const {
    if (!logit_rows.empty()) return logit_rows[i];
    return static_cast<int32_t>(all_logits ? i : static_cast<int64_t>(tokens.size()) - 1);
  }
  int32_t slot(size_t i) const { return slots.empty() ? positions[i] : slots[i]; }
  int32_t seq(size_t i) const { return seq_idx.empty() ? 0 : seq_idx[i]; }
};

// The inputs of a layer's linear maps, for calibration: what wq/wk/wv read (the attention norm's
// output), what wo reads (attention's output), what w_gate/w_up read (the FFN norm's output),
// what w_down reads (silu(gate) * up).
enum class LinearInput { kAttnIn = 0, kAttnOut = 1, kFfnIn = 2, kFfnMid = 3 };
inline constexpr int kNumLinearInputs = 4;
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  virtual void Observe(int64_t layer, LinearInput which, const float* x, int64_t num_tokens, int64_t dim) = 0;
  // The keys as they go into the cache (after RoPE, before any per-channel transform),
  // [num_tokens, kv_dim].
  virtual void ObserveKeys(int64_t /*layer*/, const float* /*k*/, int64_t /*num_tokens*/, int64_t /*kv_dim*/) {}
  // A mixture of experts' routing: each token's selection scores over all experts
  // ([num_tokens, num_experts], biased where the model biases its selection) and the experts it
  // chose ([num_tokens, num_used], best first). Tests use it to check that no choice was a near tie.
  virtual void ObserveRouting(int64_t /*layer*/, const float* /*scores*/, int64_t /*num_tokens*/,
                              int64_t /*num_experts*/, const int32_t* /*chosen*/, int64_t /*num_used*/) {}
};

// Calibrated per-channel key statistics (gale calibrate-kv, gale quantize --calib), stored in the
// GGUF's metadata so llama.cpp still loads the file: for every layer and KV channel a shift (the
// keys' mean) and a scale. With them a cache stores (k - shift) / scale and attention reads it
// with q * scale: q.k changes by q.shift, the same for every key a query sees, so the softmax is
// unchanged, while the stored keys lose the large, nearly constant channels that make per-token
// int8/int4 scales coarse for all the others (SmoothAttention / KVQuant-style pre-scaling;
// static, so batching, prefix sharing and compaction need nothing new).
inline constexpr char kKeyShiftKey[] = "gale.attention.key_channel_shift";
inline constexpr char kKeyScaleKey[] = "gale.attention.key_channel_scale";
struct KeyChannels {
  std::vector<float> shift;  // [num_layers * kv_dim]
  std::vector<float> scale;  // [num_layers * kv_dim], > 0
  bool empty() const { return shift.empty(); }
};

// The KV layout of a model's hyperparameters (Model::kv_layout).
KvLayout KvLayoutOf(const ModelHParams& hp);

// A KV cache for a fixed set of sequences (`gale run`, `gale bench`, tests): num_seqs sequences of
// capacity_tokens each, sequence s owning its own fixed blocks. The engine instead shares one
// KvStorage among requests through a KvCacheManager.
class KvCache {
 public:
  // v_type: V's type when it differs from type (K's). window_groups: sliding-window layers in
  // layer groups of their own (KvLayerGroups::ForWindows; each group its own blocks), as KV
  // retention on such a model needs; else one group.
  KvCache(const ModelHParams& hp, int64_t capacity_tokens, int64_t num_seqs = 1,
          kernels::KvType type = kernels::KvType::kF32, int64_t block_size = 16,
          std::optional<kernels::KvType> v_type = std::nullopt, bool window_groups = false);
  int64_t capacity_tokens() const { return capacity_tokens_; }
  uint64_t num_bytes() const { return storage_.num_bytes(); }
  KvStorage& storage() { return storage_; }
  // Points the batch's block tables at this cache's sequences.
  void Attach(ForwardBatch& batch) const;

 private:
  int64_t capacity_tokens_;
  KvStorage storage_;
  std::vector<std::vector<int32_t>> tables_;  // [num_groups * num_seqs][blocks per sequence], group-major
};

// Scratch activations, grown to the largest batch seen; reused across steps.
struct Workspace {
  std::vector<float> x;       // [num_tokens, dim] residual stream
  std::vector<float> xb;      // [num_tokens, max(dim, q_dim)] normed input / attention output
  std::vector<float> xb2;     // [num_tokens, dim] projection output
  std::vector<float> q;       // [num_tokens, q_dim]
  std::vector<float> k;       // [num_tokens, kv_dim]
  std::vector<float> v;       // [num_tokens, kv_dim]
  std::vector<float> hb;      // [num_tokens, ffn_dim]
  std::vector<float> hb2;     // [num_tokens, ffn_dim]
  std::vector<float> logits;  // [num_logit_rows, vocab_size]
  std::vector<float> hidden;  // [num_hidden_rows, dim] (ForwardBatch::hidden_rows)
  std::vector<const int32_t*> tables;  // [num_groups, num_tokens] block table of each token's sequence
  std::vector<float> rope;    // [num_tokens, rope_dims] cos/sin pairs per token
  std::vector<float> rope_swa;  // the same for windowed layers with their own RoPE base
  std::vector<int32_t> kv_slots;  // [num_tokens] each token's cache slot
  std::vector<float> scores;  // attention scores of tracked tokens, [num_heads, slot + 1] each
  std::vector<float*> score_rows;  // [num_tokens] a tracked token's scores, else null
  // Mixture of experts: router logits [num_tokens, num_experts]; each token's chosen experts and
  // their weights [num_tokens, num_used], and the row of its products in the grouped buffers;
  // the routed rows grouped by expert [num_tokens * num_used, dim], their hidden rows
  // [.., expert_ffn] (two) and outputs [.., dim].
  std::vector<float> moe_logits;
  std::vector<int32_t> moe_chosen, moe_row;
  std::vector<float> moe_weight;
  std::vector<float> moe_x, moe_h, moe_h2, moe_y;
  // Latent attention: the query products [num_tokens, heads * (nope + rope)], the low-rank query
  // [num_tokens, q_lora_rank], the latent-and-RoPE rows [num_tokens, kv_lora_rank + rope], rows
  // gathered per head [heads * num_tokens, max(nope, kv_lora_rank)] and their products
  // [heads * num_tokens, max(kv_lora_rank, v_head)], the heads' values [num_tokens, heads * v_head].
  std::vector<float> mla_q, mla_qa, mla_kv, mla_in, mla_out, mla_v;
  // Tokens routed to each expert over the steps since the counters were last read (gale bench
  // --profile's load balance), [num_layers * num_experts]; empty unless a caller sized it.
  std::vector<int64_t> expert_tokens;

  // An architecture's own buffers (a struct of its choosing), kept across steps as the ones above
  // are: a prefill's buffers run to tens of MB, and a fresh allocation of that size is mapped,
  // faulted in and zeroed again at every step. Owned by one model; another model's call starts anew.
  template <typename T>
  T& ArchBuffers(const void* owner) {
    if (arch_owner_ != owner || arch_buffers_ == nullptr) {
      arch_buffers_ = std::make_shared<T>();
      arch_owner_ = owner;
    }
    return *static_cast<T*>(arch_buffers_.get());
  }

 private:
  std::shared_ptr<void> arch_buffers_;
  const void* arch_owner_ = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelHParams& hparams() const { return hp_; }
  // The KV cache it needs: per layer the window, K's and V's head sizes, or latent rows.
  KvLayout kv_layout() const { return KvLayoutOf(hp_); }
  bool tied_output() const { return tied_output_; }
  // What Load found questionable but not fatal (tensors it does not use), for the caller to show.
  const std::vector<std::string>& load_warnings() const { return load_warnings_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Empty unless the file carries calibrated key statistics.
  const KeyChannels& key_channels() const { return key_channels_; }

  // Keeps only this rank's share of every layer (TensorSplit) and makes the hyperparameters its
  // own: heads, KV heads and FFN width are the rank's (the KV layout too). Before PackWeights.
  // Errors where the architecture has no dense split (mixtures of experts, latent attention,
  // encoders, attention sinks), where heads, KV heads or FFN width do not divide into the slices,
  // or where a column block would cut a quantization block.
  Status ShardForTensorParallel(const TensorSplit& split);
  const TensorSplit& tensor_split() const { return split_; }
  // The vocabulary rows [first, first + count) this model's output head computes: all of them,
  // or a tensor-parallel rank's share (ranks splitting the head by rows where the vocabulary
  // divides among them; ForwardPass::OutputHead then writes [rows, count] logits).
  std::pair<int64_t, int64_t> head_rows() const { return {head_first_, head_count_ > 0 ? head_count_ : hp_.vocab_size}; }

  // Lays the matrices out again for the active kernel ISA where it has a faster layout (costs a
  // copy of those weights in memory). Forward uses the packed copy only while that ISA is active.
  // All packed matrices share one buffer (huge-page backed where the OS allows). With
  // release_sources (the file the model was loaded from), each packed matrix's pages in the
  // file are given back to the OS as soon as it is packed, so those weights are resident once
  // instead of twice, also at the peak. They then run only while the packing ISA is active
  // (another ISA fails loudly, and PackWeights does nothing more); the embedding table, and the
  // output layer when tied to it, stay.
  // first_layer/end_layer: a pipeline stage packs its own layers only (end_layer < 0: to the
  // last), and the output layer where with_output (a pipeline computes it on rank 0).
  void PackWeights(GgufFile* release_sources = nullptr, int64_t first_layer = 0, int64_t end_layer = -1,
                   bool with_output = true);
  uint64_t packed_bytes() const;
  uint64_t released_bytes() const { return released_bytes_; }
  // mlock of the packed copies' buffer (`--mlock`, with GgufFile::LockPages for what the file
  // still holds); the bytes locked, or an error naming the limit.
  StatusOr<uint64_t> LockPackedWeights();

  // Pipeline stages (dist/pipeline.h): the floats per token one stage hands the next (the
  // residual stream's dim, or more where the architecture carries more state from layer to
  // layer: whatever a later layer reads of an earlier one's work, since another process holds
  // that layer's cache).
  virtual int64_t StageWidth() const { return hp_.dim; }

  // Runs one batch: each token's K/V are written to its sequence's blocks at its slot (its
  // position unless batch.slots says otherwise), then attention reads them back through the
  // block tables. On return ws.logits holds the rows named by logit_rows
  // ([num_logit_rows, vocab_size]). Errors on out-of-range ids, positions or blocks.
  Status Forward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const;
  // The same over a fixed-sequence cache (copies the batch to attach the cache's block tables).
  Status Forward(const ForwardBatch& batch, KvCache& kv, Workspace& ws, ThreadPool& pool) const;

 protected:
  Model() = default;
  // The architecture's forward, on a batch Forward has checked against the cache and the model.
  virtual Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const = 0;
  // Every matrix layer `layer` multiplies by, for packing.
  virtual std::vector<MatrixWeight*> LayerMatrices(int64_t layer) = 0;
  // Cuts layer `layer` for a tensor-parallel rank (ShardForTensorParallel, before hp_ becomes
  // the rank's): architectures with a dense split implement it (ShardDense in model/blocks.h).
  virtual Status ShardLayer(int64_t layer, const class TensorSharder& sharder);
  // Those of layers [first_layer, end_layer), and the output layer where with_output and the
  // model has one; a matrix kept as parts (MatrixWeight::parts) is its parts.
  std::vector<MatrixWeight*> Matrices(int64_t first_layer, int64_t end_layer, bool with_output);
  std::vector<MatrixWeight*> Matrices() { return Matrices(0, hp_.num_layers, true); }
  // Reads the token embedding, the final norm, the output layer (or ties it to the embedding)
  // and the calibrated key statistics; sets hp_.vocab_size. For every architecture's Load.
  Status LoadCommon(const GgufFile& file, class TensorLoader& tensors);
  // After an architecture has read its tensors: every tensor of the file it did not use is named
  // in a load warning (a file with more, another architecture's or a newer feature's, must not
  // run silently without them).
  void FinishLoad(const TensorLoader& tensors);

  ModelHParams hp_;
  TensorView token_embd_;   // [vocab_size, dim]
  TensorView output_norm_;  // [dim]
  MatrixWeight output_;     // [vocab_size, dim]
  bool tied_output_ = false;
  std::vector<std::string> load_warnings_;
  uint64_t weight_bytes_ = 0;
  KeyChannels key_channels_;
  TensorSplit split_;
  int64_t head_first_ = 0, head_count_ = 0;  // head_rows(); count 0: the whole vocabulary
  std::vector<std::unique_ptr<uint8_t[]>> shard_bytes_;  // column blocks copied for tensor parallelism

 private:
  uint64_t released_bytes_ = 0;
  std::unique_ptr<uint8_t, void (*)(void*)> packed_buffer_{nullptr, nullptr};
  size_t packed_alloc_ = 0;  // packed_buffer_'s size
};

// The model of the file's general.architecture (model/registry.cc lists them). The GgufFile must
// outlive the model: weights are views into its mapping.
StatusOr<std::unique_ptr<Model>> LoadModel(const GgufFile& file);
// The architectures LoadModel knows, as GGUF names them.
std::vector<std::string> SupportedArchitectures();

}  // namespace gale
