// DeepSeek-V4 (GGUF architecture "deepseek4", as llama.cpp's converter writes it; the forward
// follows llama.cpp's src/models/deepseek4.cpp and its cache, and DeepSeek's public description):
// - hyper-connections: the residual stream is kHc copies; before each sublayer a mix computed from
//   the normed copies gives the sublayer's input weights (pre), its output's weights per copy
//   (post) and a Sinkhorn-normalized kHc x kHc mix of the copies (comb); the output head collapses
//   the copies the same way.
// - attention: the query through a low rank with a per-head RMSNorm, one shared KV row per token
//   (multi-query, K = V), RoPE on the last rope_dims of both, attention sinks, the output rotated
//   back and projected through a grouped low rank. Each layer sees the raw rows of its last
//   `window` positions and, by its compression ratio: nothing more (0); one compressed row per 128
//   positions, all of them (128); or one per 4 positions from overlapping windows, of which a
//   lightning indexer picks the top-k per query (4).
// - a mixture of experts with sqrt(softplus) scores, a selection bias, one shared expert, a clamped
//   SwiGLU, and the first hash_layer_count layers routed by token id.
// The cache: each model layer uses several of the cache's layers (ModelHParams::kv_windows), all of
// one row width (the head size): the raw rows (windowed), the compressors' per-position state
// (windowed), and its compressed rows packed with other layers' into full cache layers
// (PackedRows). Not done: retention, pipeline or tensor parallelism, int8/int4 caches (refused).
//
// DeepSeek-V4.1 ("deepseek41", the GGUF layout of llama.cpp's later deepseek41 port; the forward
// from that port's description and DeepSeek's, docs/deepseek-v4.md) runs through the same code:
// - single-pass hyper-connections: a sublayer collapses the copies with the pre weights the
//   sublayer before it computed (layer 0: the first copy), and the last FFN's collapses them for
//   the output head (no output_hc_* tensors);
// - shared compressed KV (CSA2): only KV source layers (those with attn_compressor_kv) pool, over
//   disjoint blocks of their ratio (1, 2 or a multiple of 4; no positional bias; no gate at ratio
//   1), and derive the index keys from their normed, unrotated rows (indexer.attn_k); index source
//   layers (indexer.attn_q_b) pick the top-k rows; every later compressed layer reads the last
//   source's rows and keys and reuses the last index source's picks; no per-head query norm;
// - Engram: at its layers, each token's n-grams (2..max) hashed per head into rows of a table read
//   from the mapped file, projected to a key per copy and one shared value, added to each copy
//   through a gate from the normed key and copy. The token history comes from a cache layer;
// - the two-level index (gale's keys attention.indexer.candidate_*; llama.cpp's port leaves it out
//   and caps the context instead): the candidate source layer keeps, per token, the best blocks of
//   its stream's rows (a block scores its best row; the newest row's block is always kept), and
//   the index sources after it pick their top-k inside those blocks only.
#include <tuple>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include "base/profiler.h"
#include "kernels/kernels.h"
#include "model/arch/arch.h"
#include "model/synth.h"
#include "base/rng.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

constexpr int64_t kHc = 4;                   // hyper-connection copies (llama.cpp supports 4 only)
constexpr int64_t kMix = (2 + kHc) * kHc;    // pre, post, comb

// Sublayer weights of one hyper-connection: fn [kMix rows of kHc * dim], base [kMix], scale [3].
struct HcWeights {
  MatrixWeight fn;
  TensorView base, scale;
};

// A compressor: per position kv and gate rows of coff * width, the positional bias ape
// ([ratio] rows of coff * width), the compressed row's norm ([width]). DeepSeek-V4.1: no ape, and
// no gate at ratio 1 (has_gate false: the scores are the kv rows; a softmax over one entry is 1).
struct Compressor {
  MatrixWeight kv, gate;
  TensorView ape, norm;
  int64_t width = 0, coff = 1;
  bool has_gate = true;
};

// DeepSeek-V4.1's Engram at one layer: the table [rows of key_len], the projection of a token's
// (max_ngram - 1) * heads rows to kHc keys and one value ([(kHc + 1) * dim]), the per-copy norms
// of the gate's query (the copy) and key ([kHc rows of dim], f32); the hash's constants.
struct EngramLayer {
  TensorView table, q_norm, k_norm;
  MatrixWeight wkv;
  std::vector<uint64_t> mult, prime, offset;  // [max_ngram], [cols], [cols]
};

// A compressed row of `width` for block b of `ratio` positions is stored in parts over the last 4
// positions of its block, width / 4 elements each, in lane `lane` of cache layer `layer`: a cache
// row (head_dim wide) holds head_dim / part lanes, one per model layer sharing it. So a ratio-4
// layer's rows take width / 4 elements per position (dense, as the model needs them) and a
// ratio-128 layer's a quarter lane, in cache rows of one width. The parts lie in positions the
// writer computes itself whenever the block is complete: a prefix shared from the cache ends on a
// KV block boundary, which for block sizes that are multiples of 4 never falls inside a block's
// last 4 positions (RunForward checks the block size).
// (DeepSeek-V4.1's ratios 1 and 2: over the block's 1 or 2 positions, which a block boundary never
// splits either.)
struct PackedRows {
  static constexpr int64_t kSlots = 4;
  int64_t layer = -1, lane = 0, width = 0, ratio = 0;
  int64_t slots() const { return std::min(ratio, kSlots); }
  int64_t part() const { return width / slots(); }
};

struct Ds4Layer {
  int64_t ratio = 0;
  TensorView attn_norm, ffn_norm, sinks, q_a_norm, kv_norm;
  MatrixWeight wq_a, wq_b, wkv, wo_b;
  std::vector<MatrixWeight> wo_a;  // [groups] each [out_lora_rank rows of heads * head / groups]
  HcWeights hc_attn, hc_ffn;
  Compressor comp_w, idx_comp;     // the rows' (ratio > 0) and the indexer keys' (ratio 4)
  MatrixWeight idx_proj, idx_q_b;  // ratio == 4: the indexer's head weights and queries
  MoeWeights moe;
  std::vector<int32_t> hash_table;  // hash-routed layers: [vocab, num_used] (copied from i32)
  // The cache layers of this model layer: raw rows; the compressors' state (coff rows of kv, then
  // coff of scores); the indexer's state (4); and where its compressed rows and the indexer's
  // compressed keys are packed (PackedRows).
  int64_t kv_raw = -1, kv_state = -1, kv_idx_state = -1;
  PackedRows comp, idx_keys;
  // DeepSeek-V4.1: this layer's roles (compresses, owns index keys, picks rows), the layer whose
  // rows (and keys) it reads and the one whose picks it uses (-1: none, window only); its index
  // keys' projection and norm; its Engram (index into engrams_, -1: none).
  bool kv_source = false, key_owner = false, index_source = false;
  int64_t rows_from = -1, picks_from = -1, engram = -1;
  MatrixWeight idx_k;
  TensorView idx_k_norm;
};

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

class Deepseek4Model final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp);

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override;

  // A pipeline stage hands on, per token: the residual copies and the pre weights the next
  // sublayer collapses them with (V4.1; zeros for V4), [kHc * dim, then kHc]; V4.1 also what later
  // layers read of earlier ones (CarryWidth): the last index source's picks, the candidate
  // source's blocks, and each KV source's row and index key completed at this token, which the
  // stages after it write into their own caches. So a stage may begin at any layer.
  int64_t StageWidth() const override { return kHc * (hp_.dim + 1) + CarryWidth(); }
  int64_t CarryWidth() const {
    if (!v41_) return 0;
    return (1 + idx_top_k_) + (1 + cand_blocks_) + static_cast<int64_t>(sources_.size()) * SourceCarry();
  }
  int64_t SourceCarry() const { return 1 + hp_.head_dim + idx_dim_; }  // flag, row, key

  std::vector<MatrixWeight*> LayerMatrices(int64_t l) override {
    std::vector<MatrixWeight*> all;
    Ds4Layer& w = layers_[l];
    for (MatrixWeight* m : {&w.wq_a, &w.wq_b, &w.wkv, &w.wo_b, &w.hc_attn.fn, &w.hc_ffn.fn}) all.push_back(m);
    for (MatrixWeight& g : w.wo_a) all.push_back(&g);
    if (v41_) {
      if (w.kv_source) all.push_back(&w.comp_w.kv);
      if (w.kv_source && w.comp_w.has_gate) all.push_back(&w.comp_w.gate);
      if (w.key_owner) all.push_back(&w.idx_k);
      if (w.index_source) {
        all.push_back(&w.idx_proj);
        all.push_back(&w.idx_q_b);
      }
      if (w.engram >= 0) all.push_back(&engrams_[w.engram].wkv);
    } else {
      if (w.ratio != 0) {
        all.push_back(&w.comp_w.kv);
        all.push_back(&w.comp_w.gate);
      }
      if (w.ratio == 4) {
        for (MatrixWeight* m : {&w.idx_proj, &w.idx_q_b, &w.idx_comp.kv, &w.idx_comp.gate}) all.push_back(m);
      }
    }
    w.moe.AppendTo(&all);
    if (!v41_ && l == hp_.num_layers - 1) all.push_back(&hc_head_.fn);
    return all;
  }

 private:
  Deepseek4Model() = default;

  // pre_in: the copies' weights to collapse with (V4.1: the previous sublayer's; null: this
  // mix's own); pre_out: where this mix's pre weights go (V4.1; may be null).
  // scratch: room for the normed copies and the mixes (kept across steps by the caller).
  void HcPre(const HcWeights& w, const float* streams, int64_t n, float* x, float* post, float* comb,
             std::vector<float>& scratch, ThreadPool& pool, const float* pre_in = nullptr, float* pre_out = nullptr) const;
  // picks: per token of the batch, the compressed rows the last V4.1 index source picked;
  // candidates: per token, the blocks of rows the candidate source chose (empty: all).
  // Attention's parts: the per-batch inputs, the compressors, the indexer's queries, the rows a
  // token sees, and the heads over them.
  struct AttnInputs {
    std::vector<float> qr, q, kvr, cs, cs_back, iq, iw;
  };
  // A forward's buffers, kept in the workspace across steps (Workspace::ArchBuffers): the
  // residual copies, the sublayers' inputs and outputs, the hyper-connection weights, the
  // attention's inputs, the compressors' state rows, Engram's rows and products.
  struct Buffers {
    std::vector<float> streams, x, in, post, comb, attn, low, gin, gout, pre_next, pre_own, hc_scratch;
    AttnInputs a;
    std::vector<float> sk, sg, emb, kvo;
    std::vector<int32_t> ids;
    std::vector<float> carried;  // V4.1 stages: [n, CarryWidth()] (StageWidth)
  };
  void Project(const Ds4Layer& w, const ForwardBatch& batch, const float* in, int64_t n, AttnInputs& a,
               ThreadPool& pool) const;
  void PoolBlock(const Compressor& c, int64_t state_layer, int64_t ratio, const ForwardBatch& batch,
                 const KvStorage& kv, int32_t seq, int64_t pos, std::vector<float>& scratch, float* row) const;
  void Compress(const Ds4Layer& w, const Compressor& c, int64_t state_layer, const PackedRows& packed,
                const ForwardBatch& batch, KvStorage& kv, const float* in, int64_t n, Buffers& buf,
                ThreadPool& pool) const;
  void IndexerQueries(const Ds4Layer& w, const ForwardBatch& batch, const float* in, int64_t n, AttnInputs& a,
                      ThreadPool& pool) const;
  void ChooseRows(int64_t l, int64_t t, const ForwardBatch& batch, const KvStorage& kv, const AttnInputs& a,
                  const PackedRows& keys_at, std::vector<int64_t>& blocks, std::vector<int64_t>& chosen,
                  std::vector<float>& idx_scores, std::vector<float>& keys) const;
  struct AttendScratch {
    std::vector<float> scores, transposed;
  };
  void AttendRows(const Ds4Layer& w, const float* q, const float* rows, int64_t m, const float* cs_back,
                  AttendScratch& s, float* out) const;
  void Attention(int64_t l, const ForwardBatch& batch, KvStorage& kv, const float* in, int64_t n, float* out,
                 Buffers& buf, ThreadPool& pool, std::vector<std::vector<int64_t>>& picks,
                 std::vector<std::vector<int64_t>>& candidates) const;
  // The forward's ends: the copies and pre weights from the embedding (the first stage) or the
  // stage before (batch.input); a stage before the head hands them on in ws.x (StageWidth); the
  // head's input, the copies collapsed into ws.x.
  // V4.1 stages also carry the picks, the candidate blocks and the sources' new rows and keys
  // (CarryWidth); a stage writes the rows and keys of the sources before it into its cache.
  void EnterStage(const ForwardBatch& batch, ForwardPass& f, const Workspace& ws, Buffers& buf, KvStorage& kv,
                  int64_t n, std::vector<std::vector<int64_t>>& picks,
                  std::vector<std::vector<int64_t>>& candidates) const;
  void HandOn(Workspace& ws, const Buffers& buf, int64_t n, const std::vector<std::vector<int64_t>>& picks,
              const std::vector<std::vector<int64_t>>& candidates) const;
  // Where token t's carried row and key of source layer w go (null: V4, or not a source).
  float* CarriedSource(Buffers& buf, int64_t t, const Ds4Layer& w) const;
  void CollapseForHead(Workspace& ws, Buffers& buf, int64_t n, ThreadPool& pool) const;
  // The grouped low-rank output of buf.attn into buf.x: group g's heads through wo_a[g], the
  // groups' results side by side through wo_b.
  void GroupedOutput(const Ds4Layer& w, int64_t n, Buffers& buf, ThreadPool& pool) const;
  // Loading, in order: the keys (checked; the RoPE and expert setup), each layer's tensors and
  // cache layers (LayerLoader), V4.1's candidate blocks.
  struct LayerLoader;
  Status ReadKeys(const GgufFile& file);
  Status CheckCandidates() const;
  Status LoadEngram(const GgufFile& file, TensorLoader& tensors, const std::function<int64_t(int64_t, int64_t)>& kv_layer);
  // V4.1: each token's id into the history cache layer; Engram at layer l, added to the streams.
  void WriteTokens(const ForwardBatch& batch, KvStorage& kv) const;
  void Engram(int64_t l, const ForwardBatch& batch, const KvStorage& kv, float* streams, int64_t n, Buffers& buf,
              ThreadPool& pool) const;
  // cos/sin of the layer's RoPE at pos ([rope / 2, 2]); compressed: the compression's base and
  // scaling.
  void Angles(bool compressed, int64_t pos, float* cos_sin) const;

  int64_t q_lora_ = 0, window_ = 0, idx_heads_ = 0, idx_dim_ = 0, idx_top_k_ = 0, out_groups_ = 0, out_lora_ = 0;
  int64_t cand_layer_ = -1, cand_blocks_ = 0, cand_bs_ = 0;  // V4.1's candidate blocks (layer -1: none)
  std::vector<int64_t> sources_;      // V4.1: the KV source layers, in order
  std::vector<int64_t> source_of_;    // per layer: its index in sources_, or -1
  int64_t sinkhorn_iters_ = 0, hash_layers_ = 0;
  float compress_base_ = 0.0f, hc_eps_ = 0.0f, corr_low_ = 0.0f, corr_high_ = 0.0f;
  HcWeights hc_head_;
  std::vector<Ds4Layer> layers_;
  bool v41_ = false;
  // Engram (V4.1): heads per n-gram size, row length, largest n-gram, the padding id, the token
  // map (token id -> compressed id), the sites; the history's cache layer (-1: none).
  int64_t eng_heads_ = 0, eng_key_ = 0, eng_ngram_ = 0, tok_layer_ = -1;
  uint64_t eng_pad_ = 0;
  std::vector<uint32_t> eng_map_;
  std::vector<EngramLayer> engrams_;
  std::vector<float> ones_;  // unweighted RMSNorms
};

Status Deepseek4Model::ReadKeys(const GgufFile& file) {
  ModelHParams& h = hp_;
  const std::string p = h.arch + ".";
  v41_ = h.arch == "deepseek41";
  // As llama.cpp: nextn_predict_layers without the multi-token-prediction layer's tensors
  // (blk.N.nextn.eh_proj) counts for nothing; every layer runs.
  if (h.num_nextn_layers > 0 && file.FindTensor(fmt::format("blk.{}.nextn.eh_proj.weight", h.num_layers)) == nullptr) {
    h.num_layers += h.num_nextn_layers;
    h.num_nextn_layers = 0;
  }
  q_lora_ = file.GetInt(p + "attention.q_lora_rank", 0);
  window_ = file.GetInt(p + "attention.sliding_window", 0);
  idx_heads_ = file.GetInt(p + "attention.indexer.head_count", 0);
  idx_dim_ = file.GetInt(p + "attention.indexer.key_length", 0);
  idx_top_k_ = file.GetInt(p + "attention.indexer.top_k", 0);
  // V4.1's two-level index (gale's keys; files without them attend as if every block were a
  // candidate, which they are until the rows pass candidate_top_k_blocks x candidate_block_size).
  cand_layer_ = v41_ ? file.GetInt(p + "attention.indexer.candidate_source_layer", -1) : -1;
  cand_blocks_ = file.GetInt(p + "attention.indexer.candidate_top_k_blocks", 0);
  cand_bs_ = file.GetInt(p + "attention.indexer.candidate_block_size", 0);
  out_groups_ = file.GetInt(p + "attention.output_group_count", 0);
  out_lora_ = file.GetInt(p + "attention.output_lora_rank", 0);
  compress_base_ = static_cast<float>(file.GetDouble(p + "attention.compress_rope_freq_base", 0.0));
  const int64_t hc = file.GetInt(p + "hyper_connection.count", 0);
  sinkhorn_iters_ = file.GetInt(p + "hyper_connection.sinkhorn_iterations", 0);
  hc_eps_ = static_cast<float>(file.GetDouble(p + "hyper_connection.epsilon", 0.0));
  hash_layers_ = file.GetInt(p + "hash_layer_count", 0);
  const int64_t head = h.head_dim, rope = h.rope_dims;
  if (hc != kHc || sinkhorn_iters_ < 1 || sinkhorn_iters_ > 1000 || !(hc_eps_ >= 0.0f) || h.num_kv_heads != 1 ||
      h.value_head() != head || rope <= 0 || rope % 2 != 0 || rope > head || q_lora_ <= 0 || window_ <= 0 ||
      out_groups_ <= 0 || h.num_heads % out_groups_ != 0 || out_lora_ <= 0 || hash_layers_ < 0 ||
      hash_layers_ > h.num_layers || !(compress_base_ > 0.0f)) {
    return InvalidArgument("deepseek4: inconsistent file (hyper_connection.count {} = 4?, sinkhorn_iterations {}, "
                           "head_count_kv {} = 1?, key_length {} = value_length {}?, rope dims {}, q_lora_rank {}, "
                           "sliding_window {}, output_group_count {} dividing {} heads, output_lora_rank {}, "
                           "hash_layer_count {}, compress_rope_freq_base {})",
                           hc, sinkhorn_iters_, h.num_kv_heads, head, h.value_head(), rope, q_lora_, window_,
                           out_groups_, h.num_heads, out_lora_, hash_layers_, compress_base_);
  }
  MoeHParams& moe = h.moe;
  if (!moe.enabled() || moe.expert_ffn <= 0 || moe.num_shared != 1) {
    return InvalidArgument("deepseek4: needs experts, expert_feed_forward_length and one shared expert");
  }
  if (moe.gating != ExpertGating::kSqrtSoftplus) {
    return Unimplemented("deepseek4: expert_gating_func {} (DeepSeek-V4 scores by sqrt(softplus), 4)",
                         static_cast<int>(moe.gating));
  }
  moe.shared_ffn = moe.expert_ffn * moe.num_shared;
  // RoPE: normal (adjacent pairs) on the last rope dims. Layers without compression use the
  // file's base and no scaling; the compressed ones (and the indexer, and the compressed rows)
  // the compression base and the file's scaling (YaRN: the correction dims of that base; cos and
  // sin unscaled, as llama.cpp's attention factor cancels YaRN's).
  h.rope_style = RopeStyle::kNormal;
  h.kv_latent = true;
  if (h.rope_freq_scale != 1.0f && h.yarn_ext_factor == 0.0f) {
    return Unimplemented("deepseek4: RoPE scaling other than YaRN is not supported");
  }
  if (h.yarn_ext_factor != 0.0f) {
    std::tie(corr_low_, corr_high_) = YarnCorrDims(rope, compress_base_, h.yarn_orig_ctx, h.yarn_beta_fast, h.yarn_beta_slow);
  }
  return Status::Ok();
}

// One layer's tensors at a time, with the cache layers they take: the raw rows' (windowed), the
// compressors' state, and lanes of packed compressed rows (a new full cache layer whenever the
// last one's lanes are taken).
struct Deepseek4Model::LayerLoader {
  struct Packer {
    int64_t layer = -1, used = 0;
  };

  LayerLoader(Deepseek4Model& d, const GgufFile& file, TensorLoader& tensors)
      : d(d), h(d.hp_), file(file), tensors(tensors) {}

  Deepseek4Model& d;
  ModelHParams& h;
  const GgufFile& file;
  TensorLoader& tensors;
  int64_t kv_layers = 0;
  Packer csa_pack, hca_pack, idx_pack;
  std::map<int64_t, Packer> v41_rows_pack, v41_keys_pack;  // by ratio
  int64_t last_source = -1, last_index = -1;               // V4.1: the last KV and index sources
  const GgufValue* ratios = nullptr;  // Begin
  std::vector<float> clamp_exp, clamp_shexp;

  int64_t KvLayer(int64_t count, int64_t window) {
    const int64_t first = kv_layers;
    for (int64_t i = 0; i < count; ++i) h.kv_windows.push_back(window);
    kv_layers += count;
    return first;
  }

  Status Pack(int64_t width, int64_t ratio, Packer* pk, PackedRows* at) {
    const int64_t head = h.head_dim;
    at->width = width;
    at->ratio = ratio;
    const int64_t part = width % at->slots() == 0 ? at->part() : 0;
    if (part == 0 || head % part != 0) {
      return InvalidArgument("deepseek4: rows of {} (ratio {}) do not pack into cache rows of {}", width, ratio, head);
    }
    const int64_t lanes = head / part;
    if (pk->layer < 0 || pk->used == lanes) {
      pk->layer = KvLayer(1, 0);
      pk->used = 0;
    }
    at->layer = pk->layer;
    at->lane = pk->used++;
    return Status::Ok();
  }

  Status Hc(const std::string& prefix, int64_t mix, int64_t num_scales, HcWeights* w) {
    RETURN_IF_ERROR(tensors.Matrix(prefix + "fn.weight", kHc * h.dim, mix, &w->fn));
    if (w->fn.view.type != GgmlType::kF32) return InvalidArgument("deepseek4: {}fn.weight must be f32", prefix);
    RETURN_IF_ERROR(tensors.Vector(prefix + "base.weight", mix, &w->base));
    return tensors.Vector(prefix + "scale.weight", num_scales, &w->scale);
  }

  Status V4Compressor(const std::string& prefix, int64_t width, int64_t coff, int64_t ratio, Compressor* c) {
    c->width = width;
    c->coff = coff;
    RETURN_IF_ERROR(tensors.Matrix(prefix + "kv.weight", h.dim, coff * width, &c->kv));
    RETURN_IF_ERROR(tensors.Matrix(prefix + "gate.weight", h.dim, coff * width, &c->gate));
    RETURN_IF_ERROR(tensors.Get(prefix + "ape.weight", {coff * width, ratio}, &c->ape));
    if (c->ape.type != GgmlType::kF32) return InvalidArgument("deepseek4: {}ape.weight must be f32", prefix);
    return tensors.Vector(prefix + "norm.weight", width, &c->norm);
  }

  Status IndexerShape() const {
    if (d.idx_heads_ <= 0 || d.idx_dim_ < h.rope_dims || d.idx_dim_ > h.head_dim || d.idx_top_k_ <= 0) {
      return InvalidArgument("{}: the indexer's heads {}, key length {} (in [rope dims {}, head size {}]) "
                             "and top_k {}", h.arch, d.idx_heads_, d.idx_dim_, h.rope_dims, h.head_dim, d.idx_top_k_);
    }
    return Status::Ok();
  }

  Status IndexerQueries(const std::string& b, Ds4Layer& w) {
    RETURN_IF_ERROR(IndexerShape());
    RETURN_IF_ERROR(tensors.Matrix(b + "indexer.proj.weight", h.dim, d.idx_heads_, &w.idx_proj));
    return tensors.Matrix(b + "indexer.attn_q_b.weight", d.q_lora_, d.idx_heads_ * d.idx_dim_, &w.idx_q_b);
  }

  // The experts' clamp: an array per layer or one value; the shared expert's defaults to it.
  StatusOr<std::vector<float>> Clamps(const std::string& key, std::vector<float> fallback) const {
    const GgufValue* v = file.Find(key);
    if (v == nullptr) return fallback;
    std::vector<float> out(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const GgufValue* e = v->array.empty() ? v : l < static_cast<int64_t>(v->array.size()) ? &v->array[l] : nullptr;
      auto f = e != nullptr ? e->AsDouble() : std::nullopt;
      if (!f) return InvalidArgument("deepseek4: {} has no number for layer {}", key, l);
      out[l] = static_cast<float>(*f);
    }
    return out;
  }

  Status Begin();
  Status Layer(int64_t l);
  Status Attention(const std::string& b, Ds4Layer& w);
  Status V41Roles(int64_t l, const std::string& b, Ds4Layer& w);
  Status V4Compressors(const std::string& b, Ds4Layer& w);
  Status Ffn(int64_t l, const std::string& b, Ds4Layer& w);
};

// The keys every layer reads: the ratios (an array of block_count or more values of 0, 4 or 128;
// V4.1: 0, 1, 2 or a multiple of 4) and the experts' clamps.
Status Deepseek4Model::LayerLoader::Begin() {
  const std::string p = h.arch + ".";
  ratios = file.Find(p + "attention.compress_ratios");
  if (ratios == nullptr || static_cast<int64_t>(ratios->array.size()) < h.num_layers) {
    return InvalidArgument("deepseek4: attention.compress_ratios needs a value per layer");
  }
  ASSIGN_OR_RETURN(clamp_exp, Clamps(p + "swiglu_clamp_exp", std::vector<float>(h.num_layers, 0.0f)));
  ASSIGN_OR_RETURN(clamp_shexp, Clamps(p + "swiglu_clamp_shexp", clamp_exp));
  return Status::Ok();
}

Status Deepseek4Model::LayerLoader::Layer(int64_t l) {
  const std::string b = "blk." + std::to_string(l) + ".";
  Ds4Layer& w = d.layers_[l];
  auto r = ratios->array[l].AsInt();
  if (!d.v41_ && (!r || (*r != 0 && *r != 4 && *r != 128))) {
    return InvalidArgument("deepseek4: layer {}'s compression ratio must be 0, 4 or 128", l);
  }
  if (d.v41_ && (!r || *r < 0 || (*r > 2 && *r % 4 != 0))) {
    return InvalidArgument("deepseek41: layer {}'s compression ratio must be 0, 1, 2 or a multiple of 4", l);
  }
  w.ratio = *r;
  RETURN_IF_ERROR(Attention(b, w));
  w.kv_raw = KvLayer(1, d.window_);
  RETURN_IF_ERROR(d.v41_ ? V41Roles(l, b, w) : V4Compressors(b, w));
  return Ffn(l, b, w);
}

// The norms, the low-rank query, the shared KV row, the grouped output and the hyper-connections.
Status Deepseek4Model::LayerLoader::Attention(const std::string& b, Ds4Layer& w) {
  const int64_t dim = h.dim, heads = h.num_heads, head = h.head_dim, gdim = heads * head / d.out_groups_;
  RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", dim, &w.attn_norm));
  RETURN_IF_ERROR(tensors.Vector(b + "attn_sinks.weight", heads, &w.sinks));
  RETURN_IF_ERROR(tensors.Matrix(b + "attn_q_a.weight", dim, d.q_lora_, &w.wq_a));
  RETURN_IF_ERROR(tensors.Vector(b + "attn_q_a_norm.weight", d.q_lora_, &w.q_a_norm));
  RETURN_IF_ERROR(tensors.Matrix(b + "attn_q_b.weight", d.q_lora_, heads * head, &w.wq_b));
  RETURN_IF_ERROR(tensors.Matrix(b + "attn_kv.weight", dim, head, &w.wkv));
  RETURN_IF_ERROR(tensors.Vector(b + "attn_kv_a_norm.weight", head, &w.kv_norm));
  w.wo_a.resize(d.out_groups_);
  std::vector<std::pair<int64_t, MatrixWeight*>> groups;
  for (MatrixWeight& g : w.wo_a) groups.emplace_back(d.out_lora_, &g);
  RETURN_IF_ERROR(tensors.SplitMatrix(b + "attn_output_a.weight", gdim, groups));
  RETURN_IF_ERROR(tensors.Matrix(b + "attn_output_b.weight", d.out_groups_ * d.out_lora_, dim, &w.wo_b));
  RETURN_IF_ERROR(Hc(b + "hc_attn_", kMix, 3, &w.hc_attn));
  return Hc(b + "hc_ffn_", kMix, 3, &w.hc_ffn);
}

// V4.1: the roles follow from the tensors a layer carries (as llama.cpp's port reads them).
Status Deepseek4Model::LayerLoader::V41Roles(int64_t l, const std::string& b, Ds4Layer& w) {
  const int64_t dim = h.dim, head = h.head_dim;
  const std::string cp = b + "attn_compressor_";
  w.kv_source = tensors.Has(cp + "kv.weight");
  w.key_owner = tensors.Has(b + "indexer.attn_k.weight");
  w.index_source = tensors.Has(b + "indexer.attn_q_b.weight");
  if ((w.kv_source || w.key_owner || w.index_source) && w.ratio == 0) {
    return InvalidArgument("deepseek41: layer {} has a compressor or indexer but compression ratio 0", l);
  }
  if (w.key_owner && !w.kv_source) {
    return InvalidArgument("deepseek41: layer {} has indexer.attn_k but no compressor to derive keys from", l);
  }
  if (w.kv_source) {
    Compressor& c = w.comp_w;
    c.width = head;
    c.has_gate = tensors.Has(cp + "gate.weight");
    if (!c.has_gate && w.ratio != 1) {
      return InvalidArgument("deepseek41: layer {} pools {} positions per row but has no {}gate.weight", l, w.ratio, cp);
    }
    RETURN_IF_ERROR(tensors.Matrix(cp + "kv.weight", dim, head, &c.kv));
    if (c.has_gate) RETURN_IF_ERROR(tensors.Matrix(cp + "gate.weight", dim, head, &c.gate));
    RETURN_IF_ERROR(tensors.Vector(cp + "norm.weight", head, &c.norm));
    w.kv_state = KvLayer(2, w.ratio);
    RETURN_IF_ERROR(Pack(head, w.ratio, &v41_rows_pack[w.ratio], &w.comp));
  }
  if (w.key_owner) {
    RETURN_IF_ERROR(IndexerShape());
    RETURN_IF_ERROR(tensors.Matrix(b + "indexer.attn_k.weight", head, d.idx_dim_, &w.idx_k));
    RETURN_IF_ERROR(tensors.Vector(b + "indexer.k_norm.weight", d.idx_dim_, &w.idx_k_norm));
    RETURN_IF_ERROR(Pack(d.idx_dim_, w.ratio, &v41_keys_pack[w.ratio], &w.idx_keys));
  }
  if (w.index_source) RETURN_IF_ERROR(IndexerQueries(b, w));
  // A compressed layer reads the last source's rows and keys and the last index source's
  // picks, all of one stream: the rows stand for the positions of its own ratio.
  if (w.kv_source) last_source = l;
  if (w.index_source) last_index = l;
  if (w.ratio == 0) return Status::Ok();
  if (last_source < 0 || last_index < 0 || !d.layers_[last_source].key_owner) {
    return InvalidArgument("deepseek41: layer {} reads compressed rows, index keys and picks before a layer "
                           "(with attn_compressor_kv, indexer.attn_k, indexer.attn_q_b) makes them", l);
  }
  w.rows_from = last_source;
  w.picks_from = last_index;
  if (d.layers_[last_source].ratio != w.ratio || d.layers_[last_index].rows_from != last_source) {
    return InvalidArgument("deepseek41: layer {} (ratio {}) reads layer {}'s rows (ratio {}) with layer {}'s picks",
                           l, w.ratio, last_source, d.layers_[last_source].ratio, last_index);
  }
  return Status::Ok();
}

// V4: a compressor at ratios 4 and 128, and at 4 the lightning indexer with its own compressor.
Status Deepseek4Model::LayerLoader::V4Compressors(const std::string& b, Ds4Layer& w) {
  const int64_t head = h.head_dim;
  if (w.ratio == 0) return Status::Ok();
  const int64_t coff = w.ratio == 4 ? 2 : 1;
  RETURN_IF_ERROR(V4Compressor(b + "attn_compressor_", head, coff, w.ratio, &w.comp_w));
  // A block of ratio positions completes at its last one and reads its own positions (and,
  // overlapping, the block before): coff * ratio positions of state.
  w.kv_state = KvLayer(2 * coff, coff * w.ratio);
  RETURN_IF_ERROR(Pack(head, w.ratio, w.ratio == 4 ? &csa_pack : &hca_pack, &w.comp));
  if (w.ratio != 4) return Status::Ok();
  RETURN_IF_ERROR(IndexerQueries(b, w));
  RETURN_IF_ERROR(V4Compressor(b + "indexer_compressor_", d.idx_dim_, 2, w.ratio, &w.idx_comp));
  w.kv_idx_state = KvLayer(4, 2 * w.ratio);
  return Pack(d.idx_dim_, w.ratio, &idx_pack, &w.idx_keys);
}

// The experts, and the first hash_layer_count layers' routing table.
Status Deepseek4Model::LayerLoader::Ffn(int64_t l, const std::string& b, Ds4Layer& w) {
  const MoeHParams& moe = h.moe;
  RETURN_IF_ERROR(tensors.Vector(b + "ffn_norm.weight", h.dim, &w.ffn_norm));
  RETURN_IF_ERROR(LoadMoeWeights(tensors, b, h, &w.moe));
  w.moe.clamp = clamp_exp[l];
  w.moe.shared_clamp = clamp_shexp[l];
  if (l >= d.hash_layers_) {
    if (w.moe.selection_bias.data == nullptr) {
      return InvalidArgument("deepseek4: layer {} (routed by its router) has no {}exp_probs_b.bias", l, b);
    }
    return Status::Ok();
  }
  if (w.moe.selection_bias.data != nullptr) return InvalidArgument("deepseek4: hash-routed layer {} has exp_probs_b", l);
  // An index table (ggml's i32, type 26), not a weight: read as it is.
  const std::string name = b + "ffn_gate_tid2eid.weight";
  const GgufTensorInfo* table = file.FindTensor(name);
  if (table == nullptr || table->type_id != 26 || table->shape != std::vector<int64_t>{moe.num_used, h.vocab_size}) {
    return InvalidArgument("deepseek4: {} must be i32 [{}, {}]", name, moe.num_used, h.vocab_size);
  }
  tensors.MarkUsed(name);
  w.hash_table.resize(static_cast<size_t>(moe.num_used * h.vocab_size));
  std::memcpy(w.hash_table.data(), table->data, w.hash_table.size() * sizeof(int32_t));
  for (int32_t e : w.hash_table) {
    if (e < 0 || e >= moe.num_experts) return InvalidArgument("deepseek4: {} names expert {}", name, e);
  }
  w.moe.token_experts = w.hash_table.data();
  w.moe.token_experts_vocab = h.vocab_size;
  return Status::Ok();
}

// The candidate source picks blocks of its stream's rows; the index sources after it pick only
// inside them, so they must read the same stream (and the blocks hold top_k rows).
Status Deepseek4Model::CheckCandidates() const {
  if (cand_layer_ < 0) return Status::Ok();
  const int64_t n = hp_.num_layers;
  if (cand_layer_ >= n || !layers_[cand_layer_].index_source || cand_blocks_ < 1 || cand_bs_ < 1 ||
      cand_blocks_ * cand_bs_ - (cand_bs_ - 1) < idx_top_k_) {
    return InvalidArgument("deepseek41: the candidate source layer {} must be an index source, and {} candidate "
                           "blocks of {} must hold the indexer's top {}", cand_layer_, cand_blocks_, cand_bs_,
                           idx_top_k_);
  }
  for (int64_t l = cand_layer_ + 1; l < n; ++l) {
    if (layers_[l].index_source && layers_[l].rows_from != layers_[cand_layer_].rows_from) {
      return InvalidArgument("deepseek41: index source {} reads layer {}'s rows, the candidate source {} layer {}'s",
                             l, layers_[l].rows_from, cand_layer_, layers_[cand_layer_].rows_from);
    }
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Model>> Deepseek4Model::Load(const GgufFile& file, ModelHParams hp) {
  std::unique_ptr<Deepseek4Model> m(new Deepseek4Model());
  m->hp_ = std::move(hp);
  Deepseek4Model& d = *m;
  RETURN_IF_ERROR(d.ReadKeys(file));
  TensorLoader tensors(file);
  LayerLoader loader(d, file, tensors);
  RETURN_IF_ERROR(loader.Begin());
  RETURN_IF_ERROR(m->LoadCommon(file, tensors));
  if (m->tied_output()) return InvalidArgument("deepseek4: the file has no output.weight");
  if (!d.v41_) RETURN_IF_ERROR(loader.Hc("output_hc_", kHc, 1, &d.hc_head_));
  d.layers_.resize(d.hp_.num_layers);
  RETURN_IF_ERROR(d.LoadEngram(file, tensors, [&](int64_t count, int64_t window) { return loader.KvLayer(count, window); }));
  for (int64_t l = 0; l < d.hp_.num_layers; ++l) RETURN_IF_ERROR(loader.Layer(l));
  RETURN_IF_ERROR(d.CheckCandidates());
  d.source_of_.assign(static_cast<size_t>(d.hp_.num_layers), -1);
  for (int64_t l = 0; l < d.hp_.num_layers && d.v41_; ++l) {
    if (d.layers_[l].kv_source) {
      d.source_of_[l] = static_cast<int64_t>(d.sources_.size());
      d.sources_.push_back(l);
    }
  }
  d.ones_.assign(static_cast<size_t>(std::max({kHc * d.hp_.dim, d.hp_.head_dim, d.idx_dim_})), 1.0f);
  m->FinishLoad(tensors);
  return std::unique_ptr<Model>(std::move(m));
}

void Deepseek4Model::Angles(bool compressed, int64_t pos, float* cos_sin) const {
  const int rope = static_cast<int>(hp_.rope_dims);
  if (!compressed) {
    kernels::RopeAngles(rope, pos, hp_.rope_freq_base, 1.0f, cos_sin);
  } else if (hp_.yarn_ext_factor != 0.0f) {
    kernels::RopeAnglesYarn(rope, pos, compress_base_, hp_.rope_freq_scale, hp_.yarn_ext_factor, corr_low_, corr_high_,
                            cos_sin);
  } else {
    kernels::RopeAngles(rope, pos, compress_base_, hp_.rope_freq_scale, cos_sin);
  }
}

// DeepSeek-V4.1's Engram keys (llama.cpp's deepseek41 names): engram.layer_ids, head_count,
// key_length, max_ngram_size, pad_id, multipliers [sites * max_ngram], primes and offsets [sites *
// cols] (u64), token_map [>= vocab] (u32); per site blk.N.engram_embd (the table, left in the mapped
// file: only the rows a token hashes to are read), engram_wkv, engram_q, engram_k.
Status Deepseek4Model::LoadEngram(const GgufFile& file, TensorLoader& tensors,
                                  const std::function<int64_t(int64_t, int64_t)>& kv_layer) {
  const ModelHParams& h = hp_;
  const std::string p = h.arch + ".engram.";
  const GgufValue* ids = file.Find(p + "layer_ids");
  if (!v41_ || ids == nullptr) return Status::Ok();
  eng_heads_ = file.GetInt(p + "head_count", 0);
  eng_key_ = file.GetInt(p + "key_length", 0);
  eng_ngram_ = file.GetInt(p + "max_ngram_size", 0);
  const int64_t pad = file.GetInt(p + "pad_id", -1);
  const int64_t sites = static_cast<int64_t>(ids->array.size());
  if (eng_heads_ <= 0 || eng_heads_ > 64 || eng_key_ <= 0 || eng_ngram_ < 2 || eng_ngram_ > 8 || pad < 0 || sites == 0) {
    return InvalidArgument("deepseek41: engram head_count {} (1..64), key_length {}, max_ngram_size {} (2..8), pad_id {}, "
                           "{} layer ids", eng_heads_, eng_key_, eng_ngram_, pad, sites);
  }
  eng_pad_ = static_cast<uint64_t>(pad);
  const int64_t cols = (eng_ngram_ - 1) * eng_heads_;
  auto integers = [&](const std::string& key, int64_t count, std::vector<uint64_t>* out) -> Status {
    const GgufValue* v = file.Find(p + key);
    if (v == nullptr || v->type != GgufValueType::kArray || (count >= 0 && static_cast<int64_t>(v->array.size()) != count)) {
      return InvalidArgument("deepseek41: {}{} must be an array of {} integers", p, key, count);
    }
    for (const GgufValue& e : v->array) {
      if (e.type == GgufValueType::kUint64) {
        out->push_back(e.bits);
      } else if (auto i = e.AsInt(); i && *i >= 0) {
        out->push_back(static_cast<uint64_t>(*i));
      } else {
        return InvalidArgument("deepseek41: {}{} holds a value that is not a non-negative integer", p, key);
      }
    }
    return Status::Ok();
  };
  std::vector<uint64_t> mult, prime, offset, map;
  RETURN_IF_ERROR(integers("multipliers", sites * eng_ngram_, &mult));
  RETURN_IF_ERROR(integers("primes", sites * cols, &prime));
  RETURN_IF_ERROR(integers("offsets", sites * cols, &offset));
  RETURN_IF_ERROR(integers("token_map", -1, &map));
  if (static_cast<int64_t>(map.size()) < h.vocab_size) {
    return InvalidArgument("deepseek41: {}token_map has {} entries for {} tokens", p, map.size(), h.vocab_size);
  }
  for (uint64_t v : map) eng_map_.push_back(static_cast<uint32_t>(std::min<uint64_t>(v, UINT32_MAX)));
  engrams_.resize(static_cast<size_t>(sites));
  for (int64_t e = 0; e < sites; ++e) {
    const auto l = ids->array[e].AsInt();
    if (!l || *l < 0 || *l >= h.num_layers || layers_[*l].engram >= 0) {
      return InvalidArgument("deepseek41: {}layer_ids[{}] is not a layer below {} listed once", p, e, h.num_layers);
    }
    EngramLayer& g = engrams_[e];
    g.mult.assign(mult.begin() + e * eng_ngram_, mult.begin() + (e + 1) * eng_ngram_);
    g.prime.assign(prime.begin() + e * cols, prime.begin() + (e + 1) * cols);
    g.offset.assign(offset.begin() + e * cols, offset.begin() + (e + 1) * cols);
    const std::string b = "blk." + std::to_string(*l) + ".";
    const GgufTensorInfo* table = file.FindTensor(b + "engram_embd.weight");
    if (table == nullptr || table->shape.size() != 2 || table->shape[0] != eng_key_) {
      return InvalidArgument("deepseek41: {}engram_embd.weight must be [{}, rows]", b, eng_key_);
    }
    const int64_t rows = table->shape[1];
    for (int64_t c = 0; c < cols; ++c) {
      // The hash's row is offset + (value % prime): the bucket must lie inside the table.
      // (Compared without adding: a hostile offset near 2^64 would wrap the sum past the check.)
      const uint64_t limit = static_cast<uint64_t>(std::min<int64_t>(rows, INT32_MAX));
      if (g.prime[c] == 0 || g.offset[c] >= limit || g.prime[c] > limit - g.offset[c]) {
        return InvalidArgument("deepseek41: {}engram bucket {} (offset {}, prime {}) is not inside the table's {} rows",
                               b, c, g.offset[c], g.prime[c], rows);
      }
    }
    RETURN_IF_ERROR(tensors.Get(b + "engram_embd.weight", {eng_key_, rows}, &g.table));
    RETURN_IF_ERROR(tensors.Matrix(b + "engram_wkv.weight", cols * eng_key_, (kHc + 1) * h.dim, &g.wkv));
    RETURN_IF_ERROR(tensors.Get(b + "engram_q.weight", {h.dim, kHc}, &g.q_norm));
    RETURN_IF_ERROR(tensors.Get(b + "engram_k.weight", {h.dim, kHc}, &g.k_norm));
    if (g.q_norm.type != GgmlType::kF32 || g.k_norm.type != GgmlType::kF32) {
      return InvalidArgument("deepseek41: {}engram_q/engram_k must be f32", b);
    }
    layers_[*l].engram = e;
  }
  tok_layer_ = kv_layer(1, eng_ngram_);
  return Status::Ok();
}

// One hyper-connection's mix for n tokens: streams [n, kHc, dim] -> x [n, dim] (the sublayer's
// input), post [n, kHc], comb [n, kHc (dst), kHc (src)] as llama.cpp's build_hc_pre computes them.
void Deepseek4Model::HcPre(const HcWeights& w, const float* streams, int64_t n, float* x, float* post, float* comb,
                           std::vector<float>& scratch, ThreadPool& pool, const float* pre_in, float* pre_out) const {
  const int64_t dim = hp_.dim, flat = kHc * dim, mix = w.fn.view.shape[1];
  scratch.resize(static_cast<size_t>(n * (flat + mix)));
  const std::span<float> normed(scratch.data(), static_cast<size_t>(n * flat));
  const std::span<float> mixes(scratch.data() + n * flat, static_cast<size_t>(n * mix));
  pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      kernels::RmsNorm(streams + t * flat, ones_.data(), flat, hp_.rms_eps, normed.data() + t * flat);
    }
  }, /*min_items_per_thread=*/4);
  MatMul(w.fn, normed.data(), n, mixes.data(), pool);
  const float* base = reinterpret_cast<const float*>(w.base.data);
  const float* scale = reinterpret_cast<const float*>(w.scale.data);
  const float eps = hc_eps_;
  for (int64_t t = 0; t < n; ++t) {
    const float* m = mixes.data() + t * mix;
    float pre[kHc];
    for (int64_t i = 0; i < kHc; ++i) pre[i] = Sigmoid(m[i] * scale[0] + base[i]) + eps;
    if (pre_out != nullptr) std::memcpy(pre_out + t * kHc, pre, sizeof(pre));
    if (pre_in != nullptr) std::memcpy(pre, pre_in + t * kHc, sizeof(pre));
    if (post != nullptr) {
      for (int64_t i = 0; i < kHc; ++i) post[t * kHc + i] = 2.0f * Sigmoid(m[kHc + i] * scale[1] + base[kHc + i]);
      // comb[dst + kHc * src]: softmax over dst for each src, + eps, then Sinkhorn: columns (each
      // dst's sum over src) to 1, then iters - 1 times rows (each src's sum over dst), columns.
      float* c = comb + t * kHc * kHc;
      for (int64_t i = 0; i < kHc * kHc; ++i) c[i] = m[2 * kHc + i] * scale[2] + base[2 * kHc + i];
      for (int64_t src = 0; src < kHc; ++src) {
        float* col = c + src * kHc;
        float top = col[0];
        for (int64_t dst = 1; dst < kHc; ++dst) top = std::max(top, col[dst]);
        double sum = 0.0;
        for (int64_t dst = 0; dst < kHc; ++dst) sum += col[dst] = std::exp(col[dst] - top);
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t dst = 0; dst < kHc; ++dst) col[dst] = col[dst] * inv + eps;
      }
      // Divides each of kHc groups of entries, group i at c[i * group + j * step], by (their
      // sum + eps): group 1 / step kHc normalizes each dst over src, group kHc / step 1 each src.
      auto normalize = [&](int64_t group, int64_t step) {
        for (int64_t i = 0; i < kHc; ++i) {
          float sum = 0.0f;
          for (int64_t j = 0; j < kHc; ++j) sum += c[i * group + j * step];
          sum += eps;
          for (int64_t j = 0; j < kHc; ++j) c[i * group + j * step] /= sum;
        }
      };
      auto norm_dst = [&] { normalize(1, kHc); };
      auto norm_src = [&] { normalize(kHc, 1); };
      norm_dst();
      for (int64_t it = 1; it < sinkhorn_iters_; ++it) {
        norm_src();
        norm_dst();
      }
    }
    float* out = x + t * dim;
    const float* s = streams + t * flat;
    for (int64_t i = 0; i < dim; ++i) out[i] = s[i] * pre[0];
    for (int64_t h = 1; h < kHc; ++h) {
      for (int64_t i = 0; i < dim; ++i) out[i] += s[h * dim + i] * pre[h];
    }
  }
}

// streams[dst] = y * post[dst] + sum over src of streams[src] * comb[dst, src] (llama.cpp's order).
void HcPost(const float* y, const float* post, const float* comb, int64_t n, int64_t dim, float* streams) {
  std::vector<float> old(static_cast<size_t>(kHc * dim));
  for (int64_t t = 0; t < n; ++t) {
    float* s = streams + t * kHc * dim;
    std::memcpy(old.data(), s, old.size() * sizeof(float));
    const float* c = comb + t * kHc * kHc;
    for (int64_t dst = 0; dst < kHc; ++dst) {
      float* o = s + dst * dim;
      const float p = post[t * kHc + dst];
      for (int64_t i = 0; i < dim; ++i) o[i] = y[t * dim + i] * p;
      for (int64_t src = 0; src < kHc; ++src) {
        const float w = c[dst + kHc * src];
        for (int64_t i = 0; i < dim; ++i) o[i] += old[src * dim + i] * w;
      }
    }
  }
}

// The cache's row of cache layer `layer` at `pos` of sequence `seq` (positions index every group:
// retention is refused for this architecture).
struct RowAt {
  int32_t block;
  int64_t offset;
};
RowAt Locate(const ForwardBatch& batch, const KvStorage& kv, int64_t layer, int32_t seq, int64_t pos) {
  const int64_t num_seqs = static_cast<int64_t>(batch.block_tables.size()) / kv.num_groups();
  const auto& table = batch.block_tables[kv.groups().group_of[layer] * num_seqs + seq];
  const int64_t bs = kv.block_size();
  CHECK(pos / bs < static_cast<int64_t>(table.size()));
  const int32_t block = table[pos / bs];
  CHECK(block != kNoBlock);
  return {block, pos % bs};
}

void WriteRow(KvStorage& kv, const ForwardBatch& batch, int64_t layer, int32_t seq, int64_t pos, const float* row,
              int64_t width) {
  const RowAt at = Locate(batch, kv, layer, seq, pos);
  kv.WriteK(layer, at.block, at.offset, 0, width, row);
}

void ReadRow(const KvStorage& kv, const ForwardBatch& batch, int64_t layer, int32_t seq, int64_t pos, float* row,
             int64_t width) {
  const RowAt at = Locate(batch, kv, layer, seq, pos);
  kv.ReadK(layer, at.block, at.offset, 0, width, row);
}

// Compressed row b (PackedRows): its parts over the last slots() positions of its block; fn(at,
// first element in the cache row, first element in the row) for each.
template <typename Fn>
void ForEachPart(const KvStorage& kv, const ForwardBatch& batch, const PackedRows& p, int32_t seq, int64_t b, Fn fn) {
  const int64_t end = (b + 1) * p.ratio, part = p.part();
  for (int64_t j = 0; j < p.slots(); ++j) fn(Locate(batch, kv, p.layer, seq, end - p.slots() + j), p.lane * part, j * part);
}

void WritePacked(KvStorage& kv, const ForwardBatch& batch, const PackedRows& p, int32_t seq, int64_t b, const float* row) {
  ForEachPart(kv, batch, p, seq, b, [&](RowAt at, int64_t first, int64_t i) {
    kv.WriteK(p.layer, at.block, at.offset, first, p.part(), row + i);
  });
}

void ReadPacked(const KvStorage& kv, const ForwardBatch& batch, const PackedRows& p, int32_t seq, int64_t b, float* row) {
  ForEachPart(kv, batch, p, seq, b, [&](RowAt at, int64_t first, int64_t i) {
    kv.ReadK(p.layer, at.block, at.offset, first, p.part(), row + i);
  });
}

// Token ids in the history layer as four 8-bit pieces: exact in every float cache type.
void Deepseek4Model::WriteTokens(const ForwardBatch& batch, KvStorage& kv) const {
  for (size_t t = 0; t < batch.tokens.size(); ++t) {
    const uint32_t id = static_cast<uint32_t>(batch.tokens[t]);
    const float row[4] = {static_cast<float>(id & 255), static_cast<float>((id >> 8) & 255),
                          static_cast<float>((id >> 16) & 255), static_cast<float>(id >> 24)};
    WriteRow(kv, batch, tok_layer_, batch.seq(t), batch.positions[t], row, 4);
  }
}

// Engram (as llama.cpp's deepseek41 port computes it): for n = 2..max_ngram, the token and its
// n - 1 predecessors (token_map'd; pad_id from the sequence's start on) hashed as
// rolling_n = (c_0 * m_0) ^ ... ^ (c_(n-1) * m_(n-1)) (u64), head h's row offset + rolling_n %
// prime; the rows side by side through engram_wkv: kHc keys and one value; copy c gains value *
// sigmoid(sgn(s) sqrt(max(|s|, 1e-6))), s = (RmsNorm(key_c) * k_c) . (RmsNorm(copy c) * q_c) /
// sqrt(dim).
void Deepseek4Model::Engram(int64_t l, const ForwardBatch& batch, const KvStorage& kv, float* streams, int64_t n,
                            Buffers& buf, ThreadPool& pool) const {
  const EngramLayer& g = engrams_[layers_[l].engram];
  const int64_t cols = (eng_ngram_ - 1) * eng_heads_, dim = hp_.dim;
  auto mapped = [&](int64_t id) -> uint64_t {
    return id < 0 || id >= static_cast<int64_t>(eng_map_.size()) ? eng_pad_ : eng_map_[id];
  };
  std::vector<int32_t>& ids = buf.ids;
  ids.resize(static_cast<size_t>(n * cols));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = batch.positions[t];
    uint64_t ctx[8];
    ctx[0] = mapped(batch.tokens[t]);
    for (int64_t s = 1; s < eng_ngram_; ++s) {
      if (pos - s < 0) {
        ctx[s] = eng_pad_;
        continue;
      }
      float row[4];
      ReadRow(kv, batch, tok_layer_, batch.seq(t), pos - s, row, 4);
      int64_t id = 0;
      for (int k = 0; k < 4; ++k) id |= static_cast<int64_t>(row[k]) << (8 * k);
      ctx[s] = mapped(id);
    }
    uint64_t rolling = ctx[0] * g.mult[0];
    for (int64_t s = 1; s < eng_ngram_; ++s) {
      rolling ^= ctx[s] * g.mult[s];
      for (int64_t h = 0; h < eng_heads_; ++h) {
        const int64_t b = (s - 1) * eng_heads_ + h;
        ids[t * cols + b] = static_cast<int32_t>(rolling % g.prime[b] + g.offset[b]);
      }
    }
  }
  std::vector<float>& emb = buf.emb;
  std::vector<float>& kvo = buf.kvo;
  emb.resize(static_cast<size_t>(n * cols * eng_key_));
  kvo.resize(static_cast<size_t>(n * (kHc + 1) * dim));
  ProfileSpan span("ds4_engram_rows", "op", n, 0, l);
  kernels::GetRows(g.table, ids.data(), n * cols, emb.data());
  span.Next("ds4_engram_wkv", n, 0, l);
  MatMul(g.wkv, emb.data(), n, kvo.data(), pool);
  span.Next("ds4_engram_gate", n, 0, l);
  const float* qw = reinterpret_cast<const float*>(g.q_norm.data);
  const float* kw = reinterpret_cast<const float*>(g.k_norm.data);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
    std::vector<float> k(static_cast<size_t>(dim)), q(static_cast<size_t>(dim));
    for (int64_t t = begin; t < end; ++t) {
      const float* value = kvo.data() + (t * (kHc + 1) + kHc) * dim;
      for (int64_t c = 0; c < kHc; ++c) {
        float* copy = streams + (t * kHc + c) * dim;
        kernels::RmsNorm(kvo.data() + (t * (kHc + 1) + c) * dim, kw + c * dim, dim, hp_.rms_eps, k.data());
        kernels::RmsNorm(copy, qw + c * dim, dim, hp_.rms_eps, q.data());
        float s = 0.0f;
        for (int64_t i = 0; i < dim; ++i) s += k[i] * q[i];
        s *= scale;
        const float mag = std::sqrt(std::max(std::fabs(s), 1e-6f));
        const float gate = Sigmoid(s > 0.0f ? mag : s < 0.0f ? -mag : 0.0f);
        for (int64_t i = 0; i < dim; ++i) copy[i] += value[i] * gate;
      }
    }
  }, /*min_items_per_thread=*/1);
}

// RoPE (normal mode) on the last `rope` dims of each of num_rows rows of `width` in x.
void RopeTail(float* x, int64_t num_rows, int64_t width, int64_t rope, const float* cos_sin) {
  kernels::RopeApply(x + (width - rope), static_cast<int>(num_rows), static_cast<int>(width), static_cast<int>(rope),
                     cos_sin);
}

// Queries: wq_b(RmsNorm(wq_a x) * q_a_norm), each head RMS-normed (V4, not V4.1), RoPE on the
// tail; the shared KV row, normed and rotated; each token's angles (cs_back: sin negated, to
// rotate the output back).
void Deepseek4Model::Project(const Ds4Layer& w, const ForwardBatch& batch, const float* in, int64_t n,
                             AttnInputs& a, ThreadPool& pool) const {
  const int64_t head = hp_.head_dim, heads = hp_.num_heads, rope = hp_.rope_dims;
  a.qr.resize(static_cast<size_t>(n * q_lora_));
  a.q.resize(static_cast<size_t>(n * heads * head));
  a.kvr.resize(static_cast<size_t>(n * head));
  a.cs.resize(static_cast<size_t>(n * rope));
  a.cs_back.resize(a.cs.size());
  MatMul(w.wq_a, in, n, a.qr.data(), pool);
  for (int64_t t = 0; t < n; ++t) {
    kernels::RmsNorm(a.qr.data() + t * q_lora_, reinterpret_cast<const float*>(w.q_a_norm.data), q_lora_, hp_.rms_eps,
                     a.qr.data() + t * q_lora_);
  }
  MatMul(w.wq_b, a.qr.data(), n, a.q.data(), pool);
  MatMul(w.wkv, in, n, a.kvr.data(), pool);
  for (int64_t t = 0; t < n; ++t) {
    float* cs = a.cs.data() + t * rope;
    Angles(w.ratio != 0, batch.positions[t], cs);
    for (int64_t i = 0; i < rope; ++i) a.cs_back[t * rope + i] = i % 2 == 0 ? cs[i] : -cs[i];
    float* qt = a.q.data() + t * heads * head;
    for (int64_t h = 0; h < heads && !v41_; ++h) kernels::RmsNorm(qt + h * head, ones_.data(), head, hp_.rms_eps, qt + h * head);
    RopeTail(qt, heads, head, rope, cs);
    float* k = a.kvr.data() + t * head;
    kernels::RmsNorm(k, reinterpret_cast<const float*>(w.kv_norm.data), head, hp_.rms_eps, k);
    RopeTail(k, 1, head, rope, cs);
  }
}

// Block b (positions [ratio b, ratio b + ratio)) completes at its last position `pos`. Channel i
// pools over the block's positions (their part coff - 1 of kv and scores) and, overlapping
// (coff 2), the previous block's (part 0; none before block 0) by a softmax of the scores; then
// RmsNorm * norm. `scratch`: room for coff * ratio rows of values and of scores, and their weights.
void Deepseek4Model::PoolBlock(const Compressor& c, int64_t state_layer, int64_t ratio, const ForwardBatch& batch,
                               const KvStorage& kv, int32_t seq, int64_t pos, std::vector<float>& scratch,
                               float* row) const {
  const int64_t window = c.coff * ratio, start = pos + 1 - ratio;
  float* vals = scratch.data();
  float* scores = vals + window * c.width;
  float* ex = scores + window * c.width;
  int64_t m = 0;  // entries pooled: (block before) then this block
  for (int64_t part = 0; part < c.coff; ++part) {
    const int64_t from = start - (c.coff - 1 - part) * ratio;
    if (from < 0) continue;
    for (int64_t j = 0; j < ratio; ++j, ++m) {
      ReadRow(kv, batch, state_layer + part, seq, from + j, vals + m * c.width, c.width);
      ReadRow(kv, batch, state_layer + c.coff + part, seq, from + j, scores + m * c.width, c.width);
    }
  }
  for (int64_t i = 0; i < c.width; ++i) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < m; ++e) top = std::max(top, scores[e * c.width + i]);
    double sum = 0.0;
    float acc = 0.0f;
    for (int64_t e = 0; e < m; ++e) sum += ex[e] = std::exp(scores[e * c.width + i] - top);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t e = 0; e < m; ++e) acc += vals[e * c.width + i] * (ex[e] * inv);
    row[i] = acc;
  }
  kernels::RmsNorm(row, reinterpret_cast<const float*>(c.norm.data), c.width, hp_.rms_eps, row);
}

// The compressors' state per position: kv rows and scores (+ the positional bias of pos % ratio),
// then every block completed in this batch compressed from the cache's state rows and rotated to
// the block's first position. V4.1: no positional bias, and at ratio 1 no gate (the scores are the
// kv rows); a key owner also derives the index keys of the batch's new rows (normed, not yet
// rotated) in one product.
void Deepseek4Model::Compress(const Ds4Layer& w, const Compressor& c, int64_t state_layer, const PackedRows& packed,
                              const ForwardBatch& batch, KvStorage& kv, const float* in, int64_t n, Buffers& buf,
                              ThreadPool& pool) const {
  const int64_t ratio = w.ratio, rope = hp_.rope_dims, cw = c.coff * c.width;
  std::vector<float>& sk = buf.sk;
  std::vector<float>& sg = buf.sg;
  sk.resize(static_cast<size_t>(n * cw));
  sg.resize(static_cast<size_t>(n * cw));
  MatMul(c.kv, in, n, sk.data(), pool);
  if (c.has_gate) {
    MatMul(c.gate, in, n, sg.data(), pool);
  } else {
    sg = sk;
  }
  const float* ape = reinterpret_cast<const float*>(c.ape.data);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = batch.positions[t];
    float* g = sg.data() + t * cw;
    for (int64_t i = 0; i < cw && ape != nullptr; ++i) g[i] += ape[(pos % ratio) * cw + i];
    for (int64_t j = 0; j < c.coff; ++j) {
      WriteRow(kv, batch, state_layer + j, batch.seq(t), pos, sk.data() + t * cw + j * c.width, c.width);
      WriteRow(kv, batch, state_layer + c.coff + j, batch.seq(t), pos, g + j * c.width, c.width);
    }
  }
  std::vector<float> scratch(static_cast<size_t>(c.coff * ratio * (2 * c.width + 1)));
  std::vector<float> row(static_cast<size_t>(c.width)), angles(static_cast<size_t>(rope));
  const bool keys = v41_ && w.key_owner;
  std::vector<float> key_rows;  // keys: the new rows before their rotation
  std::vector<int64_t> key_of;  // keys: the batch token that completed each
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = batch.positions[t];
    if ((pos + 1) % ratio != 0) continue;
    PoolBlock(c, state_layer, ratio, batch, kv, batch.seq(t), pos, scratch, row.data());
    Angles(true, pos + 1 - ratio, angles.data());
    if (keys) {
      key_rows.insert(key_rows.end(), row.begin(), row.end());
      key_of.push_back(t);
    }
    RopeTail(row.data(), 1, c.width, rope, angles.data());
    WritePacked(kv, batch, packed, batch.seq(t), pos / ratio, row.data());
    if (float* at = CarriedSource(buf, t, w); at != nullptr) {
      at[0] = 1.0f;
      std::copy(row.begin(), row.end(), at + 1);
    }
  }
  if (key_of.empty()) return;
  const int64_t nk = static_cast<int64_t>(key_of.size());
  std::vector<float> ikeys(static_cast<size_t>(nk * idx_dim_));
  MatMul(w.idx_k, key_rows.data(), nk, ikeys.data(), pool);
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t pos = batch.positions[key_of[j]];
    float* k = ikeys.data() + j * idx_dim_;
    kernels::RmsNorm(k, reinterpret_cast<const float*>(w.idx_k_norm.data), idx_dim_, hp_.rms_eps, k);
    Angles(true, pos + 1 - ratio, angles.data());
    RopeTail(k, 1, idx_dim_, rope, angles.data());
    WritePacked(kv, batch, w.idx_keys, batch.seq(key_of[j]), pos / ratio, k);
    if (float* at = CarriedSource(buf, key_of[j], w); at != nullptr) std::copy(k, k + idx_dim_, at + 1 + hp_.head_dim);
  }
}

// The indexer's queries and head weights: RoPE'd like the compressed rows. NOTE: llama.cpp also
// multiplies the indexer's queries and keys by one orthonormal Hadamard matrix (for its quantized
// indexer cache); q . k is unchanged by it, so it is left out here.
void Deepseek4Model::IndexerQueries(const Ds4Layer& w, const ForwardBatch& batch, const float* in, int64_t n,
                                    AttnInputs& a, ThreadPool& pool) const {
  const int64_t rope = hp_.rope_dims;
  a.iq.resize(static_cast<size_t>(n * idx_heads_ * idx_dim_));
  a.iw.resize(static_cast<size_t>(n * idx_heads_));
  MatMul(w.idx_q_b, a.qr.data(), n, a.iq.data(), pool);
  MatMul(w.idx_proj, in, n, a.iw.data(), pool);
  const float scale = 1.0f / std::sqrt(static_cast<float>(idx_dim_ * idx_heads_));
  std::vector<float> angles(static_cast<size_t>(rope));
  for (int64_t t = 0; t < n; ++t) {
    Angles(true, batch.positions[t], angles.data());
    RopeTail(a.iq.data() + t * idx_heads_ * idx_dim_, idx_heads_, idx_dim_, rope, angles.data());
    for (int64_t h = 0; h < idx_heads_; ++h) a.iw[t * idx_heads_ + h] *= scale;
  }
}

// The compressed rows token t of layer l sees (into chosen). V4.1's two-level index: the index
// sources after the candidate source score only the rows of the blocks it chose for this token
// (blocks); the candidate source chooses them (when its rows make more blocks than it keeps) from
// its own scores: each block's best row, the block of the newest row always kept. An index source
// (V4: ratio 4) keeps the indexer's top_k: score(c) = sum over heads of relu(q_h . k_c) * w_h.
void Deepseek4Model::ChooseRows(int64_t l, int64_t t, const ForwardBatch& batch, const KvStorage& kv,
                                const AttnInputs& a, const PackedRows& keys_at, std::vector<int64_t>& blocks,
                                std::vector<int64_t>& chosen, std::vector<float>& idx_scores,
                                std::vector<float>& keys) const {
  const Ds4Layer& w = layers_[l];
  const int64_t pos = batch.positions[t];
  const int64_t visible = (pos + 1) / w.ratio;
  const bool picks_rows = v41_ ? w.index_source : w.ratio == 4;
  const bool filtered = w.index_source && cand_layer_ >= 0 && l > cand_layer_ && !blocks.empty();
  const int64_t num_blocks = cand_bs_ > 0 ? (visible + cand_bs_ - 1) / cand_bs_ : 0;
  const bool choose_blocks = w.index_source && l == cand_layer_ && num_blocks > cand_blocks_;
  if (filtered) {
    for (int64_t b : blocks) {
      for (int64_t c = b * cand_bs_; c < std::min(visible, (b + 1) * cand_bs_); ++c) chosen.push_back(c);
    }
  } else {
    for (int64_t c = 0; c < visible; ++c) chosen.push_back(c);
  }
  if (!picks_rows || (static_cast<int64_t>(chosen.size()) <= idx_top_k_ && !choose_blocks)) return;
  // The candidates' keys as a matrix, every head's dot products with them as one product.
  const int64_t nc = static_cast<int64_t>(chosen.size());
  idx_scores.resize(static_cast<size_t>(visible));
  keys.resize(static_cast<size_t>(nc * idx_dim_ + idx_heads_ * nc));
  float* dots = keys.data() + nc * idx_dim_;
  for (int64_t j = 0; j < nc; ++j) ReadPacked(kv, batch, keys_at, batch.seq(t), chosen[j], keys.data() + j * idx_dim_);
  kernels::Active().gemm_float[kernels::kSlotF32](reinterpret_cast<const uint8_t*>(keys.data()), idx_dim_ * 4, nc,
                                                  a.iq.data() + t * idx_heads_ * idx_dim_, idx_dim_, idx_heads_, dots, nc);
  for (int64_t j = 0; j < nc; ++j) {
    float s = 0.0f;
    for (int64_t h = 0; h < idx_heads_; ++h) s += std::max(dots[h * nc + j], 0.0f) * a.iw[t * idx_heads_ + h];
    idx_scores[chosen[j]] = s;
  }
  if (choose_blocks) {
    std::vector<float> best(static_cast<size_t>(num_blocks), -std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < visible; ++c) best[c / cand_bs_] = std::max(best[c / cand_bs_], idx_scores[c]);
    best[(visible - 1) / cand_bs_] = std::numeric_limits<float>::infinity();
    blocks.resize(static_cast<size_t>(num_blocks));
    for (int64_t b = 0; b < num_blocks; ++b) blocks[b] = b;
    std::stable_sort(blocks.begin(), blocks.end(), [&](int64_t x, int64_t y) { return best[x] > best[y]; });
    blocks.resize(static_cast<size_t>(cand_blocks_));
    std::sort(blocks.begin(), blocks.end());
  }
  if (static_cast<int64_t>(chosen.size()) > idx_top_k_) {
    std::stable_sort(chosen.begin(), chosen.end(), [&](int64_t x, int64_t y) { return idx_scores[x] > idx_scores[y]; });
    chosen.resize(static_cast<size_t>(idx_top_k_));
    std::sort(chosen.begin(), chosen.end());
  }
}

// Each head of token t over m rows (K = V) and its sink, the output rotated back. As two matrix
// products on the f32 GEMM kernel: the scores of every head at once (the rows as the matrix, the
// heads as its inputs), a softmax per head, then the weighted sum (the rows transposed as the
// matrix, each head's weights as its input). A token's result depends only on its own rows and
// query (the kernel's sums do not depend on how many inputs it takes), so a prefill gives what
// decoding one token at a time gives.
void Deepseek4Model::AttendRows(const Ds4Layer& w, const float* q, const float* rows, int64_t m, const float* cs_back,
                                AttendScratch& s, float* out) const {
  const int64_t head = hp_.head_dim, heads = hp_.num_heads;
  const kernels::KernelTable& kt = kernels::Active();
  const kernels::GemmFloatFn gemm = kt.gemm_float[kernels::kSlotF32];
  const float* sinks = reinterpret_cast<const float*>(w.sinks.data);
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(head));
  s.scores.resize(static_cast<size_t>(heads * m));
  s.transposed.resize(static_cast<size_t>(head * m));
  gemm(reinterpret_cast<const uint8_t*>(rows), head * 4, m, q, head, heads, s.scores.data(), m);
  for (int64_t h = 0; h < heads; ++h) {
    float* sc = s.scores.data() + h * m;
    float top = sinks[h];
    for (int64_t j = 0; j < m; ++j) {
      sc[j] *= kq_scale;
      top = std::max(top, sc[j]);
    }
    kt.exp_shifted(sc, top, sc, m);
    double sum = std::exp(static_cast<double>(sinks[h] - top));
    for (int64_t j = 0; j < m; ++j) sum += sc[j];
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < m; ++j) sc[j] *= inv;
  }
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t i = 0; i < head; ++i) s.transposed[i * m + j] = rows[j * head + i];
  }
  gemm(reinterpret_cast<const uint8_t*>(s.transposed.data()), m * 4, head, s.scores.data(), m, heads, out, head);
  RopeTail(out, heads, head, hp_.rope_dims, cs_back);
}

void Deepseek4Model::Attention(int64_t l, const ForwardBatch& batch, KvStorage& kv, const float* in, int64_t n,
                               float* out, Buffers& buf, ThreadPool& pool, std::vector<std::vector<int64_t>>& picks,
                               std::vector<std::vector<int64_t>>& candidates) const {
  const Ds4Layer& w = layers_[l];
  const int64_t head = hp_.head_dim, heads = hp_.num_heads, rope = hp_.rope_dims;
  const bool compressed = w.ratio != 0;
  AttnInputs& a = buf.a;
  ProfileSpan span("ds4_project", "op", n, 0, l);
  Project(w, batch, in, n, a, pool);
  for (int64_t t = 0; t < n; ++t) WriteRow(kv, batch, w.kv_raw, batch.seq(t), batch.positions[t], a.kvr.data() + t * head, head);
  span.Next("ds4_compress", n, 0, l);
  if (v41_) {
    if (w.kv_source) Compress(w, w.comp_w, w.kv_state, w.comp, batch, kv, in, n, buf, pool);
  } else {
    if (compressed) Compress(w, w.comp_w, w.kv_state, w.comp, batch, kv, in, n, buf, pool);
    if (w.ratio == 4) Compress(w, w.idx_comp, w.kv_idx_state, w.idx_keys, batch, kv, in, n, buf, pool);
  }
  // Where this layer's compressed rows and index keys are (V4.1: its source's), whether it picks
  // rows itself (V4: ratio 4 with more rows than top_k; V4.1: an index source).
  const PackedRows& rows_at = v41_ && compressed ? layers_[w.rows_from].comp : w.comp;
  const PackedRows& keys_at = v41_ && compressed ? layers_[w.rows_from].idx_keys : w.idx_keys;
  span.Next("ds4_indexer_q", n, 0, l);
  if (v41_ ? w.index_source : w.ratio == 4) IndexerQueries(w, batch, in, n, a, pool);
  span.Next("ds4_attend", n, 0, l);

  // Attention, one token per item: the raw rows of its window, then the compressed rows it sees
  // (V4.1 layers that do not pick: the last index source's picks).
  pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
    std::vector<float> rows, idx_scores, key;  // per thread, reused across its tokens
    AttendScratch scratch;
    std::vector<int64_t> chosen;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t pos = batch.positions[t];
      const int32_t seq = batch.seq(t);
      const int64_t first = std::max<int64_t>(0, pos - window_ + 1);
      chosen.clear();
      if (v41_ && compressed && !w.index_source) {
        chosen = picks[t];
      } else if (compressed) {
        ChooseRows(l, t, batch, kv, a, keys_at, candidates[t], chosen, idx_scores, key);
        if (v41_) picks[t] = chosen;
      }
      const int64_t num_raw = pos - first + 1, m = num_raw + static_cast<int64_t>(chosen.size());
      rows.resize(static_cast<size_t>(m * head));
      for (int64_t j = 0; j < num_raw; ++j) ReadRow(kv, batch, w.kv_raw, seq, first + j, rows.data() + j * head, head);
      for (size_t j = 0; j < chosen.size(); ++j) ReadPacked(kv, batch, rows_at, seq, chosen[j], rows.data() + (num_raw + j) * head);
      AttendRows(w, a.q.data() + t * heads * head, rows.data(), m, a.cs_back.data() + t * rope, scratch, out + t * heads * head);
    }
  }, /*min_items_per_thread=*/1);
}

float* Deepseek4Model::CarriedSource(Buffers& buf, int64_t t, const Ds4Layer& w) const {
  const int64_t src = v41_ ? source_of_[&w - layers_.data()] : -1;
  if (src < 0) return nullptr;
  const int64_t head = (1 + idx_top_k_) + (1 + cand_blocks_);
  return buf.carried.data() + t * CarryWidth() + head + src * SourceCarry();
}

void Deepseek4Model::EnterStage(const ForwardBatch& batch, ForwardPass& f, const Workspace& ws, Buffers& buf,
                                KvStorage& kv, int64_t n, std::vector<std::vector<int64_t>>& picks,
                                std::vector<std::vector<int64_t>>& candidates) const {
  const int64_t dim = hp_.dim, carry = CarryWidth();
  buf.streams.resize(static_cast<size_t>(n * kHc * dim));  // [n, kHc, dim]
  // V4.1: the pre weights the next sublayer collapses with (layer 0's attention: the first copy).
  buf.pre_next.assign(static_cast<size_t>(n * kHc), 0.0f);
  buf.carried.assign(static_cast<size_t>(n * carry), 0.0f);
  if (batch.first_layer == 0) {
    f.Embed(token_embd_);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < kHc; ++h) {
        std::memcpy(buf.streams.data() + (t * kHc + h) * dim, ws.x.data() + t * dim, dim * sizeof(float));
      }
      buf.pre_next[t * kHc] = 1.0f;
    }
    return;
  }
  for (int64_t t = 0; t < n; ++t) {
    const float* row = batch.input + t * StageWidth();
    std::memcpy(buf.streams.data() + t * kHc * dim, row, kHc * dim * sizeof(float));
    std::memcpy(buf.pre_next.data() + t * kHc, row + kHc * dim, kHc * sizeof(float));
    if (carry == 0) continue;
    const float* in = row + kHc * (dim + 1);
    std::copy(in, in + carry, buf.carried.data() + t * carry);
    // The picks and candidate blocks: a count, then the indices (exact in f32).
    picks[t].assign(in + 1, in + 1 + static_cast<int64_t>(in[0]));
    const float* cand = in + 1 + idx_top_k_;
    candidates[t].assign(cand + 1, cand + 1 + static_cast<int64_t>(cand[0]));
    // The earlier stages' sources' new rows and keys, into this stage's cache (not for the head
    // alone, on rank 0: no layer of it reads them).
    for (int64_t l : sources_) {
      if (l >= batch.first_layer || batch.first_layer == hp_.num_layers) break;
      const Ds4Layer& w = layers_[l];
      const float* at = CarriedSource(buf, t, w);
      if (at[0] == 0.0f) continue;
      const int64_t b = batch.positions[t] / w.ratio;
      WritePacked(kv, batch, w.comp, batch.seq(t), b, at + 1);
      if (w.key_owner) WritePacked(kv, batch, w.idx_keys, batch.seq(t), b, at + 1 + hp_.head_dim);
    }
  }
}

void Deepseek4Model::HandOn(Workspace& ws, const Buffers& buf, int64_t n, const std::vector<std::vector<int64_t>>& picks,
                            const std::vector<std::vector<int64_t>>& candidates) const {
  const int64_t dim = hp_.dim, carry = CarryWidth();
  ws.x.resize(static_cast<size_t>(n * StageWidth()));
  for (int64_t t = 0; t < n; ++t) {
    float* row = ws.x.data() + t * StageWidth();
    std::memcpy(row, buf.streams.data() + t * kHc * dim, kHc * dim * sizeof(float));
    std::memcpy(row + kHc * dim, buf.pre_next.data() + t * kHc, kHc * sizeof(float));
    if (carry == 0) continue;
    float* out = row + kHc * (dim + 1);
    std::copy(buf.carried.begin() + t * carry, buf.carried.begin() + (t + 1) * carry, out);
    out[0] = static_cast<float>(picks[t].size());
    std::copy(picks[t].begin(), picks[t].end(), out + 1);
    float* cand = out + 1 + idx_top_k_;
    cand[0] = static_cast<float>(candidates[t].size());
    std::copy(candidates[t].begin(), candidates[t].end(), cand + 1);
  }
}

void Deepseek4Model::CollapseForHead(Workspace& ws, Buffers& buf, int64_t n, ThreadPool& pool) const {
  const int64_t dim = hp_.dim;
  if (!v41_) {
    HcPre(hc_head_, buf.streams.data(), n, ws.x.data(), nullptr, nullptr, buf.hc_scratch, pool);
    return;
  }
  // V4.1: the last FFN's pre weights collapse the copies.
  for (int64_t t = 0; t < n; ++t) {
    float* o = ws.x.data() + t * dim;
    const float* s = buf.streams.data() + t * kHc * dim;
    const float* pre = buf.pre_next.data() + t * kHc;
    for (int64_t i = 0; i < dim; ++i) o[i] = s[i] * pre[0];
    for (int64_t h = 1; h < kHc; ++h) {
      for (int64_t i = 0; i < dim; ++i) o[i] += s[h * dim + i] * pre[h];
    }
  }
}

void Deepseek4Model::GroupedOutput(const Ds4Layer& w, int64_t n, Buffers& buf, ThreadPool& pool) const {
  const int64_t width = hp_.num_heads * hp_.head_dim, gdim = width / out_groups_;
  buf.gin.resize(static_cast<size_t>(n * gdim));
  buf.gout.resize(static_cast<size_t>(n * out_lora_));
  buf.low.resize(static_cast<size_t>(n * out_groups_ * out_lora_));
  for (int64_t g = 0; g < out_groups_; ++g) {
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(buf.gin.data() + t * gdim, buf.attn.data() + t * width + g * gdim, gdim * sizeof(float));
    }
    MatMul(w.wo_a[g], buf.gin.data(), n, buf.gout.data(), pool);
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(buf.low.data() + (t * out_groups_ + g) * out_lora_, buf.gout.data() + t * out_lora_,
                  out_lora_ * sizeof(float));
    }
  }
  MatMul(w.wo_b, buf.low.data(), n, buf.x.data(), pool);
}

Status Deepseek4Model::RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const {
  if (kv.kv_dim() != hp_.head_dim || !kv.v_is_k()) {
    return InvalidArgument("deepseek4: the cache's rows are {} wide, the head is {}", kv.kv_dim(), hp_.head_dim);
  }
  if (kernels::KvTypeQuantized(kv.k_type())) {
    return Unimplemented("deepseek4: the cache holds parts of rows: f32, f16 or bf16 only, not an int8/int4 cache");
  }
  if (kv.block_size() % PackedRows::kSlots != 0) {
    return InvalidArgument("deepseek4: KV block size {}: its compressed rows need a multiple of {}", kv.block_size(),
                           PackedRows::kSlots);
  }
  ForwardPass f(hp_, batch, kv, ws, pool, /*freq_factors=*/nullptr);
  f.set_replace_residual(true);
  const int64_t n = f.num_tokens(), dim = hp_.dim;
  // A pipeline stage runs layers [first, end) (EnterStage, HandOn).
  const int64_t first = batch.first_layer, end = batch.end_layer < 0 ? hp_.num_layers : batch.end_layer;
  Buffers& buf = ws.ArchBuffers<Buffers>(this);
  // V4.1: the picks of the last index source, the candidate source's blocks.
  std::vector<std::vector<int64_t>> picks(static_cast<size_t>(n)), candidates(static_cast<size_t>(n));
  EnterStage(batch, f, ws, buf, kv, n, picks, candidates);
  float* streams = buf.streams.data();
  float* pre_next = buf.pre_next.data();
  buf.x.resize(static_cast<size_t>(n * dim));
  buf.in.resize(static_cast<size_t>(n * dim));
  buf.post.resize(static_cast<size_t>(n * kHc));
  buf.comb.resize(static_cast<size_t>(n * kHc * kHc));
  buf.attn.resize(static_cast<size_t>(n * hp_.num_heads * hp_.head_dim));
  buf.pre_own.resize(static_cast<size_t>(n * kHc));  // V4.1: this sublayer's pre weights
  float *x = buf.x.data(), *in = buf.in.data(), *post = buf.post.data(), *comb = buf.comb.data();
  float* pre_own = buf.pre_own.data();
  if (tok_layer_ >= 0 && first < end) WriteTokens(batch, kv);
  for (int64_t l = first; l < end; ++l) {
    const Ds4Layer& w = layers_[l];
    std::optional<ProfileSpan> span(std::in_place, "ds4_engram", "op", n, 0, l);
    if (w.engram >= 0) Engram(l, batch, kv, streams, n, buf, pool);
    span->Next("ds4_hc", n, 0, l);
    HcPre(w.hc_attn, streams, n, x, post, comb, buf.hc_scratch, pool, v41_ ? pre_next : nullptr, v41_ ? pre_own : nullptr);
    for (int64_t t = 0; t < n; ++t) {
      kernels::RmsNorm(x + t * dim, reinterpret_cast<const float*>(w.attn_norm.data), dim, hp_.rms_eps, in + t * dim);
    }
    span.reset();
    Attention(l, batch, kv, in, n, buf.attn.data(), buf, pool, picks, candidates);
    span.emplace("ds4_out", "op", n, 0, l);
    GroupedOutput(w, n, buf, pool);
    span->Next("ds4_hc", n, 0, l);
    HcPost(x, post, comb, n, dim, streams);
    HcPre(w.hc_ffn, streams, n, ws.x.data(), post, comb, buf.hc_scratch, pool, v41_ ? pre_own : nullptr, v41_ ? pre_next : nullptr);
    span.reset();
    f.MoeFfn(l, reinterpret_cast<const float*>(w.ffn_norm.data), w.moe);  // ws.x = the FFN's output
    span.emplace("ds4_hc", "op", n, 0, l);
    HcPost(ws.x.data(), post, comb, n, dim, streams);
  }
  if (end < hp_.num_layers || !batch.output_head) {  // a stage before the head
    HandOn(ws, buf, n, picks, candidates);
    return Status::Ok();
  }
  CollapseForHead(ws, buf, n, pool);
  f.OutputHead(output_norm_, output_);
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadDeepseek4(const GgufFile& file, ModelHParams hp) {
  return Deepseek4Model::Load(file, std::move(hp));
}


namespace {

constexpr uint32_t kGgmlTypeI32 = 26;  // ggml's GGML_TYPE_I32 (an index table, not a weight type)

// gale synth: DeepSeek-V4 (one KV head; q_lora_rank, rope_dim, head_dim and sliding_window as for
// the others): per layer the compression ratio (0 window only, 4 with the lightning indexer, 128;
// shorter lists repeat their last value), the first hash_layers layers routed by token id, the
// indexer's heads, head size and top-k, the grouped low-rank output, hc_count residual copies and
// the experts' SwiGLU clamp. DeepSeek-V4.1 adds the KV and index source layers, the two-level
// index and Engram (its constants as llama.cpp's deepseek41 port reads them).
Status SynthCheck(const SynthShape& s) {
  const bool ds41 = s.arch == "deepseek41";
  if (s.q_lora_rank <= 0 || s.rope_dim <= 0 || s.rope_dim % 2 != 0 || s.head_dim < s.rope_dim ||
      s.num_kv_heads != 1 || s.sliding_window <= 0 || s.indexer_heads <= 0 || s.indexer_dim < s.rope_dim ||
      s.indexer_top_k <= 0 || s.out_groups <= 0 || s.num_heads % s.out_groups != 0 || s.out_lora_rank <= 0 ||
      s.hc_count != 4 || s.hash_layers < 0 || s.hash_layers > s.num_layers || s.shared_experts != 1) {
    return InvalidArgument("synth: deepseek4 needs --q-lora-rank, an even --rope-dim, --head-dim >= it, one KV head, a "
                           "--window, the indexer's --indexer-heads/--indexer-dim/--indexer-top-k, --out-groups dividing the "
                           "heads, --out-lora-rank, one shared expert");
  }
  for (int64_t r : s.compress_ratios) {
    if (!ds41 && r != 0 && r != 4 && r != 128) return InvalidArgument("synth: deepseek4 compression ratios are 0, 4 or 128, not {}", r);
    if (ds41 && (r < 0 || (r > 2 && r % 4 != 0))) {
      return InvalidArgument("synth: deepseek41 compression ratios are 0, 1, 2 or multiples of 4, not {}", r);
    }
  }
  if (ds41 && !s.engram_layers.empty() &&
      (s.engram_heads <= 0 || s.engram_dim <= 0 || s.engram_ngram < 2 || s.engram_ngram > 8 || s.engram_rows <= 0)) {
    return InvalidArgument("synth: deepseek41's Engram needs --engram-heads, --engram-dim, --engram-ngram (2..8), --engram-rows");
  }
  if (s.num_experts == 0) return InvalidArgument("synth: {} needs experts (--experts, --experts-used)", s.arch);
  return Status::Ok();
}

// The synthetic file's parts: the keys, V4.1's roles and Engram constants, each layer's tensors.
class Ds4Synth {
 public:
  explicit Ds4Synth(SynthWriter& w) : w_(w), s_(w.s), p_(w.p), ds41_(w.s.arch == "deepseek41") {}

  Status Write() {
    if (ds41_ && !s_.engram_layers.empty() && s_.engram_dim % TypeTraits(w_.type).block_size != 0) {
      return InvalidArgument("synth: --engram-dim {} is not a multiple of {}'s block of {}", s_.engram_dim,
                             TypeTraits(w_.type).name, TypeTraits(w_.type).block_size);
    }
    WriteKeys();
    if (ds41_) WriteV41Roles();
    const int64_t hc = s_.hc_count;
    RETURN_IF_ERROR(w_.Vector("output_norm.weight", s_.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(w_.Matrix("output.weight", s_.dim, s_.vocab_size, w_.type));
    if (!ds41_) {  // V4.1 collapses with the last FFN's mix
      RETURN_IF_ERROR(w_.Matrix("output_hc_fn.weight", hc * s_.dim, hc, GgmlType::kF32));
      RETURN_IF_ERROR(w_.Vector("output_hc_base.weight", hc, 0.0f, 0.5f));
      RETURN_IF_ERROR(w_.Vector("output_hc_scale.weight", 1, 0.5f, 0.2f));
    }
    for (int64_t l = 0; l < s_.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      RETURN_IF_ERROR(Attention(b));
      RETURN_IF_ERROR(ds41_ ? V41Layer(l, b) : V4Compressors(l, b));
      RETURN_IF_ERROR(Ffn(l, b));
    }
    return Status::Ok();
  }

 private:
  // Shorter lists of ratios repeat their last value.
  int64_t RatioOf(int64_t l) const {
    if (s_.compress_ratios.empty()) return 0;
    return s_.compress_ratios[std::min<size_t>(static_cast<size_t>(l), s_.compress_ratios.size() - 1)];
  }

  // DeepSeek-V4's keys (as llama.cpp's loader reads them): per-layer compression ratios, the
  // indexer, the grouped low-rank output, hyper-connections, hash routing, sqrt-softplus scores.
  void WriteKeys() {
    GgufWriter& out = w_.w;
    out.SetU32(p_ + "rope.dimension_count", static_cast<uint32_t>(s_.rope_dim));
    out.SetF32(p_ + "attention.layer_norm_rms_epsilon", 1e-6f);
    out.SetU32(p_ + "expert_feed_forward_length", static_cast<uint32_t>(w_.expert_ffn));
    out.SetU32(p_ + "attention.q_lora_rank", static_cast<uint32_t>(s_.q_lora_rank));
    out.SetU32(p_ + "attention.sliding_window", static_cast<uint32_t>(s_.sliding_window));
    out.SetU32(p_ + "expert_shared_count", static_cast<uint32_t>(s_.shared_experts));
    out.SetF32(p_ + "expert_weights_scale", 1.5f);
    out.SetBool(p_ + "expert_weights_norm", true);
    out.SetU32(p_ + "expert_gating_func", 4);  // sqrt(softplus)
    std::vector<float> clamp(s_.num_layers, s_.swiglu_clamp);
    out.SetValue(p_ + "swiglu_clamp_exp", GgufValue::F32Array(clamp));
    out.SetU32(p_ + "attention.indexer.head_count", static_cast<uint32_t>(s_.indexer_heads));
    out.SetU32(p_ + "attention.indexer.key_length", static_cast<uint32_t>(s_.indexer_dim));
    out.SetU32(p_ + "attention.indexer.top_k", static_cast<uint32_t>(s_.indexer_top_k));
    if (ds41_ && s_.candidate_layer >= 0) {
      out.SetU32(p_ + "attention.indexer.candidate_source_layer", static_cast<uint32_t>(s_.candidate_layer));
      out.SetU32(p_ + "attention.indexer.candidate_top_k_blocks", static_cast<uint32_t>(s_.candidate_blocks));
      out.SetU32(p_ + "attention.indexer.candidate_block_size", static_cast<uint32_t>(s_.candidate_block_size));
    }
    out.SetU32(p_ + "attention.output_group_count", static_cast<uint32_t>(s_.out_groups));
    out.SetU32(p_ + "attention.output_lora_rank", static_cast<uint32_t>(s_.out_lora_rank));
    out.SetF32(p_ + "attention.compress_rope_freq_base", 160000.0f);
    out.SetU32(p_ + "hyper_connection.count", static_cast<uint32_t>(s_.hc_count));
    out.SetU32(p_ + "hyper_connection.sinkhorn_iterations", 20);
    out.SetF32(p_ + "hyper_connection.epsilon", 1e-6f);
    out.SetU32(p_ + "hash_layer_count", static_cast<uint32_t>(s_.hash_layers));
    std::vector<int32_t> ratios(s_.num_layers);
    for (int64_t l = 0; l < s_.num_layers; ++l) ratios[l] = static_cast<int32_t>(RatioOf(l));
    out.SetValue(p_ + "attention.compress_ratios", GgufValue::I32Array(ratios));
  }

  // DeepSeek-V4.1's roles and Engram constants (as llama.cpp's deepseek41 port reads them): the
  // multipliers odd, each head's bucket a distinct prime from about engram_rows up, the buckets of
  // a layer's table side by side; the token map folds the top quarter of the vocab onto the rest.
  void WriteV41Roles() {
    sources_ = s_.kv_source_layers;
    if (sources_.empty()) {
      for (int64_t l = 0; l < s_.num_layers; ++l) {
        if (RatioOf(l) != 0 && (l == 0 || RatioOf(l - 1) != RatioOf(l))) sources_.push_back(l);
      }
    }
    pickers_ = s_.index_source_layers.empty() ? sources_ : s_.index_source_layers;
    if (s_.engram_layers.empty()) return;
    const int64_t cols = (s_.engram_ngram - 1) * s_.engram_heads;
    auto is_prime = [](uint64_t v) {
      if (v < 2) return false;
      for (uint64_t d = 2; d * d <= v; ++d) {
        if (v % d == 0) return false;
      }
      return true;
    };
    std::vector<GgufValue> ids, mult, primes, offsets, map;
    uint64_t candidate = static_cast<uint64_t>(s_.engram_rows);
    Rng rng(w_.seed() ^ 0x5eed5eedull);
    for (int64_t e = 0; e < static_cast<int64_t>(s_.engram_layers.size()); ++e) {
      ids.push_back(GgufValue::U32(static_cast<uint32_t>(s_.engram_layers[e])));
      for (int64_t k = 0; k < s_.engram_ngram; ++k) {
        mult.push_back(GgufValue::U64(2 * static_cast<uint64_t>(rng.Uniform(0.0f, 1.0f) * (1 << 20)) + 1));
      }
      uint64_t offset = 0;
      eng_primes_.emplace_back();
      for (int64_t c = 0; c < cols; ++c) {
        do ++candidate; while (!is_prime(candidate));
        primes.push_back(GgufValue::U64(candidate));
        offsets.push_back(GgufValue::U64(offset));
        eng_primes_.back().push_back(candidate);
        offset += candidate;
      }
    }
    const int64_t folded = std::max<int64_t>(3, s_.vocab_size - s_.vocab_size / 4);
    for (int64_t t = 0; t < s_.vocab_size; ++t) map.push_back(GgufValue::U32(static_cast<uint32_t>(t % folded)));
    GgufWriter& out = w_.w;
    out.SetValue(p_ + "engram.layer_ids", GgufValue::Array(GgufValueType::kUint32, std::move(ids)));
    out.SetU32(p_ + "engram.head_count", static_cast<uint32_t>(s_.engram_heads));
    out.SetU32(p_ + "engram.key_length", static_cast<uint32_t>(s_.engram_dim));
    out.SetU32(p_ + "engram.max_ngram_size", static_cast<uint32_t>(s_.engram_ngram));
    out.SetU32(p_ + "engram.pad_id", 2);
    out.SetValue(p_ + "engram.multipliers", GgufValue::Array(GgufValueType::kUint64, std::move(mult)));
    out.SetValue(p_ + "engram.primes", GgufValue::Array(GgufValueType::kUint64, std::move(primes)));
    out.SetValue(p_ + "engram.offsets", GgufValue::Array(GgufValueType::kUint64, std::move(offsets)));
    out.SetValue(p_ + "engram.token_map", GgufValue::Array(GgufValueType::kUint32, std::move(map)));
  }

  Status Attention(const std::string& b) {
    const int64_t hc = s_.hc_count, mix = (2 + hc) * hc, qk = w_.head_dim;
    RETURN_IF_ERROR(w_.Vector(b + "attn_norm.weight", s_.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(w_.Vector(b + "attn_sinks.weight", s_.num_heads, 0.0f, 2.0f));
    RETURN_IF_ERROR(w_.Matrix(b + "attn_q_a.weight", s_.dim, s_.q_lora_rank, w_.type));
    RETURN_IF_ERROR(w_.Vector(b + "attn_q_a_norm.weight", s_.q_lora_rank, 1.0f, 0.5f));
    RETURN_IF_ERROR(w_.Matrix(b + "attn_q_b.weight", s_.q_lora_rank, s_.num_heads * qk, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "attn_kv.weight", s_.dim, qk, w_.type));
    RETURN_IF_ERROR(w_.Vector(b + "attn_kv_a_norm.weight", qk, 1.0f, 0.5f));
    // f32: llama.cpp's CPU backend (the prebuilt release the tests compare with) runs its
    // grouped product of this matrix on f32 only (q8_0 and f16 fail its scheduler's assert).
    // (V4.1, which that llama.cpp cannot run: the file's w.type.)
    RETURN_IF_ERROR(w_.Matrix(b + "attn_output_a.weight", s_.num_heads * qk / s_.out_groups,
                              s_.out_lora_rank * s_.out_groups, ds41_ ? w_.type : GgmlType::kF32));
    RETURN_IF_ERROR(w_.Matrix(b + "attn_output_b.weight", s_.out_groups * s_.out_lora_rank, s_.dim, w_.type));
    for (const char* sub : {"attn", "ffn"}) {
      RETURN_IF_ERROR(w_.Matrix(b + "hc_" + sub + "_fn.weight", hc * s_.dim, mix, GgmlType::kF32));
      RETURN_IF_ERROR(w_.Vector(b + "hc_" + sub + "_base.weight", mix, 0.0f, 0.5f));
      RETURN_IF_ERROR(w_.Vector(b + "hc_" + sub + "_scale.weight", 3, 0.5f, 0.2f));
    }
    return Status::Ok();
  }

  Status V41Layer(int64_t l, const std::string& b) {
    const int64_t ratio = RatioOf(l), qk = w_.head_dim, hc = s_.hc_count;
    auto listed = [](const std::vector<int64_t>& v, int64_t l) { return std::find(v.begin(), v.end(), l) != v.end(); };
    if (listed(sources_, l) && ratio != 0) {  // a KV source: compressor and index keys
      RETURN_IF_ERROR(w_.Matrix(b + "attn_compressor_kv.weight", s_.dim, qk, w_.type));
      if (ratio != 1) RETURN_IF_ERROR(w_.Matrix(b + "attn_compressor_gate.weight", s_.dim, qk, w_.type));
      RETURN_IF_ERROR(w_.Vector(b + "attn_compressor_norm.weight", qk, 1.0f, 0.5f));
      RETURN_IF_ERROR(w_.Matrix(b + "indexer.attn_k.weight", qk, s_.indexer_dim, w_.type));
      RETURN_IF_ERROR(w_.Vector(b + "indexer.k_norm.weight", s_.indexer_dim, 1.0f, 0.5f));
    }
    if (listed(pickers_, l) && ratio != 0) {
      RETURN_IF_ERROR(w_.Matrix(b + "indexer.proj.weight", s_.dim, s_.indexer_heads, w_.type));
      RETURN_IF_ERROR(w_.Matrix(b + "indexer.attn_q_b.weight", s_.q_lora_rank, s_.indexer_heads * s_.indexer_dim, w_.type));
    }
    const auto site = std::find(s_.engram_layers.begin(), s_.engram_layers.end(), l);
    if (site == s_.engram_layers.end()) return Status::Ok();
    const std::vector<uint64_t>& pr = eng_primes_[site - s_.engram_layers.begin()];
    int64_t rows = 0;
    for (uint64_t v : pr) rows += static_cast<int64_t>(v);
    const int64_t cols = (s_.engram_ngram - 1) * s_.engram_heads;
    RETURN_IF_ERROR(w_.Matrix(b + "engram_embd.weight", s_.engram_dim, rows, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "engram_wkv.weight", cols * s_.engram_dim, (hc + 1) * s_.dim, w_.type));
    RETURN_IF_ERROR(w_.Vector(b + "engram_q.weight", s_.dim, 1.0f, 0.5f, hc));
    return w_.Vector(b + "engram_k.weight", s_.dim, 1.0f, 0.5f, hc);
  }

  Status V4Compressors(int64_t l, const std::string& b) {
    const int64_t ratio = RatioOf(l), qk = w_.head_dim;
    if (ratio == 0) return Status::Ok();
    const int64_t coff = ratio == 4 ? 2 : 1;
    RETURN_IF_ERROR(w_.Matrix(b + "attn_compressor_kv.weight", s_.dim, coff * qk, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "attn_compressor_gate.weight", s_.dim, coff * qk, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "attn_compressor_ape.weight", coff * qk, ratio, GgmlType::kF32));
    RETURN_IF_ERROR(w_.Vector(b + "attn_compressor_norm.weight", qk, 1.0f, 0.5f));
    if (ratio != 4) return Status::Ok();
    RETURN_IF_ERROR(w_.Matrix(b + "indexer.proj.weight", s_.dim, s_.indexer_heads, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "indexer.attn_q_b.weight", s_.q_lora_rank, s_.indexer_heads * s_.indexer_dim, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "indexer_compressor_kv.weight", s_.dim, 2 * s_.indexer_dim, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "indexer_compressor_gate.weight", s_.dim, 2 * s_.indexer_dim, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "indexer_compressor_ape.weight", 2 * s_.indexer_dim, ratio, GgmlType::kF32));
    return w_.Vector(b + "indexer_compressor_norm.weight", s_.indexer_dim, 1.0f, 0.5f);
  }

  Status Ffn(int64_t l, const std::string& b) {
    RETURN_IF_ERROR(w_.Vector(b + "ffn_norm.weight", s_.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(w_.Matrix(b + "ffn_gate_inp.weight", s_.dim, s_.num_experts, GgmlType::kF32));
    if (l < s_.hash_layers) {
      // [num_used, vocab] i32: token t's experts, distinct, from a per-layer stride.
      std::vector<int32_t> ids(static_cast<size_t>(s_.experts_used * s_.vocab_size));
      for (int64_t t = 0; t < s_.vocab_size; ++t) {
        for (int64_t k = 0; k < s_.experts_used; ++k) {
          ids[t * s_.experts_used + k] = static_cast<int32_t>((t * (2 * l + 3) + k) % s_.num_experts);
        }
      }
      std::vector<uint8_t> bytes(ids.size() * 4);
      std::memcpy(bytes.data(), ids.data(), bytes.size());
      RETURN_IF_ERROR(w_.w.AddTensor(b + "ffn_gate_tid2eid.weight", kGgmlTypeI32, {s_.experts_used, s_.vocab_size},
                                     std::move(bytes)));
    } else {
      RETURN_IF_ERROR(w_.Vector(b + "exp_probs_b.bias", s_.num_experts, 0.0f, 0.1f));
    }
    RETURN_IF_ERROR(w_.Matrix(b + "ffn_gate_exps.weight", s_.dim, w_.expert_ffn, w_.expert_type, s_.num_experts));
    RETURN_IF_ERROR(w_.Matrix(b + "ffn_up_exps.weight", s_.dim, w_.expert_ffn, w_.expert_type, s_.num_experts));
    RETURN_IF_ERROR(w_.Matrix(b + "ffn_down_exps.weight", w_.expert_ffn, s_.dim, w_.expert_type, s_.num_experts));
    RETURN_IF_ERROR(w_.Matrix(b + "ffn_gate_shexp.weight", s_.dim, w_.expert_ffn, w_.type));
    RETURN_IF_ERROR(w_.Matrix(b + "ffn_up_shexp.weight", s_.dim, w_.expert_ffn, w_.type));
    return w_.Matrix(b + "ffn_down_shexp.weight", w_.expert_ffn, s_.dim, w_.type);
  }

  SynthWriter& w_;
  const SynthShape& s_;
  const std::string& p_;
  const bool ds41_;
  std::vector<int64_t> sources_, pickers_;     // V4.1: KV and index source layers
  std::vector<std::vector<uint64_t>> eng_primes_;  // V4.1: per Engram site, its buckets' primes
};

Status SynthWrite(SynthWriter& w) { return Ds4Synth(w).Write(); }

std::vector<SynthShape> SynthShapesV4() {
  // DeepSeek-V4-Flash's per-layer shapes (its config as llama.cpp reads it), 3 of its 43 layers:
  // a window-only layer, a ratio-4 layer with the indexer, a ratio-128 layer; the first routed
  // by token id. Experts MXFP4 (the release stores them as FP4).
  SynthShape s;
  s.name = "deepseek-v4-flash", s.arch = "deepseek4";
  s.dim = 4096; s.num_layers = 3; s.num_heads = 64; s.num_kv_heads = 1; s.head_dim = 512; s.rope_dim = 64;
  s.q_lora_rank = 1024; s.sliding_window = 128; s.compress_ratios = {0, 4, 128}; s.hash_layers = 1;
  s.indexer_heads = 64; s.indexer_dim = 128; s.indexer_top_k = 512; s.out_groups = 8; s.out_lora_rank = 1024;
  s.ffn_dim = 2048; s.num_experts = 256; s.experts_used = 6; s.expert_ffn = 2048; s.shared_experts = 1;
  s.swiglu_clamp = 10.0f; s.vocab_size = 129280; s.context_length = 65536;
  s.expert_type = GgmlType::kMXFP4;
  return {s};
}

std::vector<SynthShape> SynthShapesV41() {
  // DeepSeek-V4.1-Flash's per-layer shapes (its reference config), 2 of its 40 layers: a
  // window-only layer with Engram (as its layer 1) and a ratio-2 KV and index source with Engram
  // (as its layer 14). Engram: 8 heads of 256 per n-gram size up to 4, as the release; tables of
  // about 4M rows per layer instead of 384M (a token reads 24 rows either way). Experts MXFP4.
  SynthShape s;
  s.name = "deepseek-v4.1-flash", s.arch = "deepseek41";
  s.dim = 5120; s.num_layers = 2; s.num_heads = 64; s.num_kv_heads = 1; s.head_dim = 512; s.rope_dim = 64;
  s.q_lora_rank = 1280; s.sliding_window = 128; s.compress_ratios = {0, 2};
  s.indexer_heads = 32; s.indexer_dim = 128; s.indexer_top_k = 512; s.out_groups = 8; s.out_lora_rank = 1024;
  s.engram_layers = {0, 1}; s.engram_heads = 8; s.engram_dim = 256; s.engram_ngram = 4; s.engram_rows = 170000;
  s.ffn_dim = 2304; s.num_experts = 384; s.experts_used = 6; s.expert_ffn = 2304; s.shared_experts = 1;
  s.swiglu_clamp = 10.0f; s.vocab_size = 129280; s.context_length = 65536;
  s.expert_type = GgmlType::kMXFP4;
  return {s};
}

// gale quantize: what stays as the converters write it (f32): the hyper-connection mixes, the
// compressors' position biases, V4.1's Engram gate norms ([dim, 4] RMSNorm weights, not a
// matrix); the Engram table and projection are quantized like any matrix (the release stores
// them as Q8_0).
const char* KeepUnquantized(const GgufTensorInfo& t) {
  if (t.name.find("hc_") != std::string::npos && t.name.ends_with("_fn.weight")) return "hyper-connection mix";
  if (t.name.ends_with("_ape.weight")) return "compressor position bias";
  if (t.name.ends_with("engram_q.weight") || t.name.ends_with("engram_k.weight")) return "engram gate norm";
  return "";
}

}  // namespace

const ArchSpec kDeepseek4Arch = {.name = "deepseek4",
                                 .load = LoadDeepseek4,
                                 .experts = true,
                                 .latent_attention = true,
                                 .synth_check = SynthCheck,
                                 .synth_write = SynthWrite,
                                 .synth_shapes = SynthShapesV4,
                                 .keep_unquantized = KeepUnquantized,
                                 .hf = &kDeepseek4HfFamily};
const ArchSpec kDeepseek41Arch = {.name = "deepseek41",
                                  .load = LoadDeepseek4,
                                  .experts = true,
                                  .latent_attention = true,
                                  .synth_check = SynthCheck,
                                  .synth_write = SynthWrite,
                                  .synth_shapes = SynthShapesV41,
                                  .keep_unquantized = KeepUnquantized,
                                  .hf = &kDeepseek4HfFamily};

}  // namespace gale
