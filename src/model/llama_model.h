// The llama architecture: weights as views into the GGUF mapping, and one Forward over a batch of
// tokens of one sequence with a contiguous KV cache (the paged cache comes with kv/). Activations
// are f32. All numerics go through kernels/.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "gguf/gguf_file.h"
#include "kernels/kernels.h"
#include "model/hparams.h"

namespace gale {

// One step's tokens, from one or more sequences. Tokens of a sequence appear in position order.
struct ForwardBatch {
  std::vector<int32_t> tokens;      // [num_tokens]
  std::vector<int32_t> positions;   // [num_tokens] position of each token in its sequence
  std::vector<int32_t> seq_idx;     // [num_tokens] index of the token's KV cache; empty: all 0
  std::vector<int32_t> logit_rows;  // tokens whose logits are wanted, in output order; empty: see below
  bool all_logits = false;          // with logit_rows empty: every token (perplexity), else the last
};

// KV cache of one sequence, contiguous: position p of layer l is row p of that layer's block.
class KvCache {
 public:
  KvCache(const LlamaHParams& hp, int64_t capacity_tokens);
  int64_t capacity_tokens() const { return capacity_tokens_; }
  float* K(int64_t layer_idx) { return k_.data() + layer_idx * layer_stride_; }
  float* V(int64_t layer_idx) { return v_.data() + layer_idx * layer_stride_; }
  uint64_t num_bytes() const { return 2 * k_.size() * sizeof(float); }

 private:
  int64_t capacity_tokens_;
  int64_t layer_stride_;   // capacity_tokens * kv_dim
  std::vector<float> k_;   // [num_layers, capacity_tokens, kv_dim]
  std::vector<float> v_;   // [num_layers, capacity_tokens, kv_dim]
};

// Scratch activations, grown to the largest batch seen; reused across steps.
struct Workspace {
  std::vector<float> x;       // [num_tokens, dim] residual stream
  std::vector<float> xb;      // [num_tokens, dim] normed input / attention output
  std::vector<float> xb2;     // [num_tokens, dim] projection output
  std::vector<float> q;       // [num_tokens, dim]
  std::vector<float> k;       // [num_tokens, kv_dim]
  std::vector<float> v;       // [num_tokens, kv_dim]
  std::vector<float> hb;      // [num_tokens, ffn_dim]
  std::vector<float> hb2;     // [num_tokens, ffn_dim]
  std::vector<float> logits;  // [num_logit_rows, vocab_size]
  std::vector<const float*> k_rows, v_rows;  // [num_tokens] per-token cache bases of one layer
  std::vector<float> rope;    // [num_tokens, rope_dims] cos/sin pairs per token
};

// A weight matrix: its view into the file, and optionally a copy packed for the active ISA.
struct MatrixWeight {
  TensorView view;
  std::unique_ptr<kernels::PackedWeights> packed;
};

struct LlamaLayerWeights {
  TensorView attn_norm, ffn_norm;
  MatrixWeight wq, wk, wv, wo, w_gate, w_up, w_down;
};

class LlamaModel {
 public:
  // The GgufFile must outlive the model: weights are views into its mapping.
  static StatusOr<std::unique_ptr<LlamaModel>> Load(const GgufFile& file);

  const LlamaHParams& hparams() const { return hp_; }
  bool tied_output() const { return tied_output_; }
  uint64_t weight_bytes() const { return weight_bytes_; }

  // Lays the matrices out again for the active kernel ISA where it has a faster layout (costs a
  // copy of those weights in memory). Forward uses the packed copy only while that ISA is active.
  void PackWeights();
  uint64_t packed_bytes() const;

  // Runs one batch of one sequence; tokens are written to the cache at their positions.
  // On return ws.logits holds [1 or num_tokens, vocab_size]. Errors on out-of-range ids/positions.
  Status Forward(const ForwardBatch& batch, KvCache& kv, Workspace& ws, ThreadPool& pool) const;
  // Several sequences in one step: token i uses caches[batch.seq_idx[i]]. Logit rows follow
  // batch.logit_rows.
  Status Forward(const ForwardBatch& batch, std::span<KvCache* const> caches, Workspace& ws, ThreadPool& pool) const;

 private:
  LlamaModel() = default;

  LlamaHParams hp_;
  TensorView token_embd_;
  TensorView output_norm_;
  MatrixWeight output_;
  bool tied_output_ = false;
  std::vector<LlamaLayerWeights> layers_;
  uint64_t weight_bytes_ = 0;
};

}  // namespace gale
