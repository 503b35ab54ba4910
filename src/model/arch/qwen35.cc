// Qwen3.5 / Qwen3.6, dense (GGUF "qwen35") and mixtures of experts ("qwen35moe"), as llama.cpp's
// converter writes them and its graph computes them. Three of every four layers
// (attention.recurrent_layers, else every layer l with (l + 1) % full_attention_interval != 0) are
// Gated DeltaNet linear attention; the others are full attention. Every layer: RmsNorm -> mixer ->
// residual, then post_attention_norm -> FFN -> residual; the FFN is SwiGLU, or (qwen35moe) softmax-
// routed experts plus one shared expert scaled by sigmoid(ffn_gate_inp_shexp . x). See
// docs/qwen35.md.
//
// Full attention: Q's projection gives per head [query, gate] (2 * head_dim rows per head); Q and
// K are RmsNormed per head, rotated by multi-section RoPE (rope.dimension_sections, interleaved:
// pair i's section is i % sum(sections), taken by 3s; for text every section takes the token's
// position except the fourth, which takes 0), attended, multiplied by sigmoid(gate), projected.
//
// Gated DeltaNet (ssm.*: conv_kernel K, state_size S = each head's key and value size,
// group_count key heads, time_step_rank value heads, inner_size = value heads * S): attn_qkv gives
// the mixed q, k, v rows, which go through a causal depthwise convolution over the last K inputs
// (the state keeps K - 1 of them) and SiLU; q and k are L2-normed per head (x / sqrt(|x|^2 + eps));
// value head h reads key head h % group_count. Per token and value head, with the state M
// (S x S, row j = value element j over the key elements):
//   g = softplus(alpha + ssm_dt) * ssm_a (ssm_a = -exp(A_log)), b = sigmoid(beta)
//   M *= exp(g);  d_j = b * (v_j - M_j . k);  M_j += d_j * k;  o_j = M_j . q / sqrt(S)
// then o is RmsNormed per head with ssm_norm, times SiLU(attn_gate x), and projected by ssm_out.
// The recurrence runs token by token in every batch (prefill as decoding), so a sequence's logits
// are the same bits however its tokens are batched. The state of each sequence lives in the
// cache's state slots (KvStorage::ReserveStates): per recurrent layer the convolution's last K - 1
// inputs, then the value heads' matrices.
//
// A multi-token-prediction block (nextn_predict_layers, after the model's layers) is skipped.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/arch/arch.h"
#include "model/blocks.h"
#include "model/synth.h"
#include "model/weights.h"
#include "base/profiler.h"

namespace gale {
namespace {

struct Qwen35Layer {
  bool recurrent = false;
  int64_t index = 0;  // among its kind: the KV layer of an attention layer, the state of a recurrent one
  TensorView attn_norm, post_norm;
  // Full attention.
  MatrixWeight wq, wk, wv, wo;  // wq: [num_heads * 2 * head_dim] rows (query, gate per head)
  TensorView q_norm, k_norm;
  // Gated DeltaNet.
  MatrixWeight wqkv, wgate, wbeta, walpha, wout;
  TensorView conv, dt_bias, a, ssm_norm;
  std::vector<float> conv_t;  // the convolution's taps as [K, conv_dim] (the file's is [conv_dim, K])
  LayerFfn ffn;  // SwiGLU (qwen35) or the mixture (qwen35moe)
};

// Gated DeltaNet's sizes.
struct DeltaNetShape {
  int64_t conv_kernel = 0, head = 0, k_heads = 0, v_heads = 0;
  int64_t key_dim() const { return k_heads * head; }
  int64_t value_dim() const { return v_heads * head; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  // One layer's state: the convolution's last K - 1 inputs, then the value heads' S x S matrices.
  int64_t conv_floats() const { return (conv_kernel - 1) * conv_dim(); }
  int64_t state_floats() const { return conv_floats() + v_heads * head * head; }
};

// The forward's own scratch (Workspace::ArchBuffers).
struct Qwen35Buffers {
  std::vector<float> qg;         // [n, num_heads * 2 * head_dim] query and gate rows
  std::vector<float> gate;       // [n, q_dim]
  std::vector<float> mixed;      // [n, conv_dim] attn_qkv's rows (the convolution's inputs)
  std::vector<float> conv_out;   // [n, conv_dim] the convolution's outputs after SiLU (q, k L2-normed)
  std::vector<float> z;          // [n, value_dim] attn_gate's rows, then ssm_out's input
  std::vector<float> beta, alpha;  // [n, v_heads]
  std::vector<float> core;       // [n, value_dim] the recurrence's outputs
  std::vector<float> seq_rows, seq_out;  // one sequence's rows of conv_out and core, gathered
  std::vector<float> decay, write;       // [v_heads, tokens of one sequence] exp(g) and beta
  std::vector<float> ones;               // [conv_dim] of 1 (SiLU alone through SiluMul)
  std::vector<float> conv_keep;          // [K - 1, conv_dim] the convolution's next state
  std::vector<float> out;        // [n, dim]
};

inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) acc[i & 7] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // as ggml's

class Qwen35Model final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp, bool moe) {
    std::unique_ptr<Qwen35Model> m(new Qwen35Model());
    m->hp_ = std::move(hp);
    ModelHParams& h = m->hp_;
    h.rope_style = RopeStyle::kNeox;
    if (moe) {
      // llama.cpp's graph: softmax routing, the top k renormalized (and scaled by
      // expert_weights_scale), one shared expert of expert_shared_feed_forward_length (default
      // feed_forward_length) gated by sigmoid(ffn_gate_inp_shexp . x).
      MoeHParams& e = h.moe;
      if (!e.enabled()) return InvalidArgument("{}: the file has no {}.expert_count", h.arch, h.arch);
      if (e.num_groups > 0 || e.leading_dense > 0) {
        return Unimplemented("{}: expert groups and dense leading layers are not part of this architecture", h.arch);
      }
      if (e.num_shared > 1) return Unimplemented("{}: {} shared experts (the architecture has one)", h.arch, e.num_shared);
      if (e.expert_ffn == 0) e.expert_ffn = h.ffn_dim / e.num_used;
      e.gating = ExpertGating::kSoftmax;
      e.norm_weights = true;
      e.num_shared = 1;
      if (e.shared_ffn == 0) e.shared_ffn = h.ffn_dim;
    }
    const std::string p = h.arch + ".";
    DeltaNetShape& d = m->dn_;
    ASSIGN_OR_RETURN(d.conv_kernel, file.GetInt(p + "ssm.conv_kernel"));
    ASSIGN_OR_RETURN(const int64_t inner, file.GetInt(p + "ssm.inner_size"));
    ASSIGN_OR_RETURN(d.head, file.GetInt(p + "ssm.state_size"));
    ASSIGN_OR_RETURN(d.v_heads, file.GetInt(p + "ssm.time_step_rank"));
    ASSIGN_OR_RETURN(d.k_heads, file.GetInt(p + "ssm.group_count"));
    if (d.conv_kernel < 1 || d.conv_kernel > 64 || d.head < 1 || d.head > 4096 || d.v_heads < 1 || d.v_heads > 4096 ||
        d.k_heads < 1 || d.v_heads % d.k_heads != 0) {
      return InvalidArgument("{}: ssm.conv_kernel {}, state_size {}, time_step_rank {}, group_count {}: the kernel in "
                             "[1, 64], heads and sizes in [1, 4096], the value heads a multiple of the key heads", h.arch,
                             d.conv_kernel, d.head, d.v_heads, d.k_heads);
    }
    if (inner != d.v_heads * d.head) {
      return InvalidArgument("{}: ssm.inner_size {} is not time_step_rank {} x state_size {} (value heads of the key "
                             "heads' size)", h.arch, inner, d.v_heads, d.head);
    }
    RETURN_IF_ERROR(m->ReadLayerKinds(file));
    RETURN_IF_ERROR(m->ReadSections(file));
    if (h.value_head() != h.head_dim) return InvalidArgument("{}: attention.value_length must equal key_length", h.arch);
    int64_t attention_layers = 0, recurrent_layers = 0;
    for (bool r : m->recurrent_) (r ? recurrent_layers : attention_layers)++;
    if (attention_layers == 0) {
      return Unimplemented("{}: every layer is recurrent; a model without a full-attention layer is not supported",
                           h.arch);
    }
    h.kv_windows.assign(static_cast<size_t>(attention_layers), 0);
    h.recurrent_state_floats = recurrent_layers * d.state_floats();

    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    m->layers_.resize(h.num_layers);
    int64_t next_attention = 0, next_recurrent = 0;
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      Qwen35Layer& w = m->layers_[l];
      w.recurrent = m->recurrent_[l];
      w.index = w.recurrent ? next_recurrent++ : next_attention++;
      RETURN_IF_ERROR(tensors.Vector(b + "attn_norm.weight", h.dim, &w.attn_norm));
      RETURN_IF_ERROR(tensors.Vector(b + "post_attention_norm.weight", h.dim, &w.post_norm));
      if (w.recurrent) {
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_qkv.weight", h.dim, d.conv_dim(), &w.wqkv));
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_gate.weight", h.dim, d.value_dim(), &w.wgate));
        RETURN_IF_ERROR(tensors.Matrix(b + "ssm_beta.weight", h.dim, d.v_heads, &w.wbeta));
        RETURN_IF_ERROR(tensors.Matrix(b + "ssm_alpha.weight", h.dim, d.v_heads, &w.walpha));
        RETURN_IF_ERROR(tensors.Get(b + "ssm_conv1d.weight", {d.conv_kernel, d.conv_dim()}, &w.conv));
        if (w.conv.type != GgmlType::kF32) return InvalidArgument("{}ssm_conv1d.weight must be f32", b);
        w.conv_t.resize(static_cast<size_t>(d.conv_kernel * d.conv_dim()));
        for (int64_t c = 0; c < d.conv_dim(); ++c) {
          for (int64_t j = 0; j < d.conv_kernel; ++j) w.conv_t[j * d.conv_dim() + c] = Floats(w.conv)[c * d.conv_kernel + j];
        }
        RETURN_IF_ERROR(tensors.Vector(b + "ssm_dt.bias", d.v_heads, &w.dt_bias));
        RETURN_IF_ERROR(tensors.Vector(b + "ssm_a", d.v_heads, &w.a));
        RETURN_IF_ERROR(tensors.Vector(b + "ssm_norm.weight", d.head, &w.ssm_norm));
        RETURN_IF_ERROR(tensors.Matrix(b + "ssm_out.weight", d.value_dim(), h.dim, &w.wout));
      } else {
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, 2 * h.q_dim(), &w.wq));
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.v_dim(), &w.wv));
        RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.q_dim(), h.dim, &w.wo));
        RETURN_IF_ERROR(tensors.Vector(b + "attn_q_norm.weight", h.head_dim, &w.q_norm));
        RETURN_IF_ERROR(tensors.Vector(b + "attn_k_norm.weight", h.head_dim, &w.k_norm));
      }
      RETURN_IF_ERROR(w.ffn.Load(tensors, b, h, l));
      if (moe && w.ffn.moe.shared_expert_gate.data == nullptr) {
        return InvalidArgument("{}: {}ffn_gate_inp_shexp.weight is missing", h.arch, b);
      }
    }
    m->FinishLoad(tensors);
    return std::unique_ptr<Model>(std::move(m));
  }

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override {
    ForwardPass f(hp_, batch, kv, ws, pool, /*freq_factors=*/nullptr);
    UnrotatedSections(ws, f.num_tokens());
    Qwen35Buffers& buf = ws.ArchBuffers<Qwen35Buffers>(this);
    f.Embed(token_embd_);
    for (int64_t l = f.first_layer(); l < f.end_layer(); ++l) {
      const Qwen35Layer& w = layers_[l];
      if (w.recurrent) {
        DeltaNet(f, batch, kv, pool, buf, l, w);
      } else {
        GatedAttention(f, buf, l, w);
      }
      f.Ffn(l, Floats(w.post_norm), w.ffn);
    }
    f.OutputHead(output_norm_, output_);
    return Status::Ok();
  }

  std::vector<MatrixWeight*> LayerMatrices(int64_t layer) override {
    Qwen35Layer& w = layers_[layer];
    std::vector<MatrixWeight*> all = w.recurrent ? std::vector<MatrixWeight*>{&w.wqkv, &w.wgate, &w.wbeta, &w.walpha, &w.wout}
                                                 : std::vector<MatrixWeight*>{&w.wq, &w.wk, &w.wv, &w.wo};
    w.ffn.AppendTo(&all, hp_, layer);
    return all;
  }

 private:
  Qwen35Model() = default;

  // Which layers are recurrent: attention.recurrent_layers (a bool per layer of the file), else
  // full_attention_interval (default 4), as llama.cpp reads them.
  Status ReadLayerKinds(const GgufFile& file) {
    const std::string key = hp_.arch + ".attention.recurrent_layers";
    if (const GgufValue* v = file.Find(key); v != nullptr) return ReadLayerFlags(*v, key, hp_.num_layers, &recurrent_);
    recurrent_.assign(static_cast<size_t>(hp_.num_layers), 0);
    const int64_t interval = file.GetInt(hp_.arch + ".full_attention_interval", 4);
    if (interval < 1) return InvalidArgument("metadata key '{}.full_attention_interval' must be >= 1", hp_.arch);
    for (int64_t l = 0; l < hp_.num_layers; ++l) recurrent_[l] = (l + 1) % interval != 0;
    return Status::Ok();
  }

  // rope.dimension_sections: four section sizes (in rotated pairs). For text the first three take
  // the token's position and the fourth 0: the pairs that fall in the fourth are not rotated.
  Status ReadSections(const GgufFile& file) {
    const std::string key = hp_.arch + ".rope.dimension_sections";
    const GgufValue* v = file.Find(key);
    if (v == nullptr) return InvalidArgument("{}: the file has no {}", hp_.arch, key);
    if (v->type != GgufValueType::kArray || v->array.size() < 4) return InvalidArgument("metadata key '{}' needs 4 sizes", key);
    int64_t s[4];
    for (int i = 0; i < 4; ++i) {
      const std::optional<int64_t> x = v->array[i].AsInt();
      if (!x || *x < 0) return InvalidArgument("metadata key '{}' holds a size that is not >= 0", key);
      s[i] = *x;
    }
    const int64_t total = s[0] + s[1] + s[2] + s[3];
    if (s[0] + s[1] + s[2] == 0 || total > hp_.rope_dims / 2) {
      return InvalidArgument("metadata key '{}': sections of {} pairs for {} rotated dims (and one of the first three "
                             "> 0)", key, total, hp_.rope_dims);
    }
    for (int64_t i = 0; i < hp_.rope_dims / 2; ++i) {
      const int64_t sector = i % total;
      const bool positioned = (sector % 3 == 0 && sector < 3 * s[0]) || (sector % 3 == 1 && sector < 3 * s[1]) ||
                              (sector % 3 == 2 && sector < 3 * s[2]);
      if (!positioned) unrotated_.push_back(i);
    }
    return Status::Ok();
  }

  // The pairs of the fourth section rotate by position 0: cos 1, sin 0.
  void UnrotatedSections(Workspace& ws, int64_t n) const {
    if (unrotated_.empty()) return;
    for (int64_t t = 0; t < n; ++t) {
      float* cs = ws.rope.data() + t * hp_.rope_dims;
      for (int64_t i : unrotated_) cs[2 * i] = 1.0f, cs[2 * i + 1] = 0.0f;
    }
  }

  void GatedAttention(ForwardPass& f, Qwen35Buffers& buf, int64_t l, const Qwen35Layer& w) const {
    Workspace& ws = f.ws();
    const int64_t n = f.num_tokens(), hd = hp_.head_dim, q_dim = hp_.q_dim();
    buf.qg.resize(static_cast<size_t>(n * 2 * q_dim));
    buf.gate.resize(static_cast<size_t>(n * q_dim));
    f.NormedProducts(l, Floats(w.attn_norm), {{&w.wq, buf.qg.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                     LinearInput::kAttnIn, "matmul_qkv");
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < hp_.num_heads; ++h) {
        const float* src = buf.qg.data() + (t * hp_.num_heads + h) * 2 * hd;
        std::memcpy(ws.q.data() + t * q_dim + h * hd, src, static_cast<size_t>(hd) * sizeof(float));
        std::memcpy(buf.gate.data() + t * q_dim + h * hd, src + hd, static_cast<size_t>(hd) * sizeof(float));
      }
    }
    f.HeadNorm(ws.q.data(), hp_.num_heads, w.q_norm, "q_norm", l);
    f.HeadNorm(ws.k.data(), hp_.num_kv_heads, w.k_norm, "k_norm", l);
    f.Attention(w.index, nullptr);
    for (int64_t i = 0; i < n * q_dim; ++i) ws.xb[i] *= 1.0f / (1.0f + std::exp(-buf.gate[i]));
    f.OutputProjection(l, w.wo);
  }

  void DeltaNet(ForwardPass& f, const ForwardBatch& batch, KvStorage& kv, ThreadPool& pool, Qwen35Buffers& buf,
                int64_t l, const Qwen35Layer& w) const {
    Workspace& ws = f.ws();
    const DeltaNetShape& d = dn_;
    const int64_t n = f.num_tokens(), conv_dim = d.conv_dim(), value_dim = d.value_dim(), S = d.head;
    buf.mixed.resize(static_cast<size_t>(n * conv_dim));
    buf.conv_out.resize(static_cast<size_t>(n * conv_dim));
    buf.z.resize(static_cast<size_t>(n * value_dim));
    buf.beta.resize(static_cast<size_t>(n * d.v_heads));
    buf.alpha.resize(static_cast<size_t>(n * d.v_heads));
    buf.core.resize(static_cast<size_t>(n * value_dim));
    buf.out.resize(static_cast<size_t>(n * hp_.dim));
    if (buf.ones.size() != static_cast<size_t>(conv_dim)) buf.ones.assign(static_cast<size_t>(conv_dim), 1.0f);
    f.NormedProducts(l, Floats(w.attn_norm), {{&w.wqkv, buf.mixed.data()}, {&w.wgate, buf.z.data()},
                     {&w.wbeta, buf.beta.data()}}, LinearInput::kAttnIn, "matmul_qkvz");
    f.NormedProducts(l, Floats(w.attn_norm), {{&w.walpha, buf.alpha.data()}}, LinearInput::kAttnIn, "matmul_alpha");
    ProfileSpan span("delta_net", "op", n, 0, l);
    // Each sequence's tokens of this batch, in order (Model::Forward checked they are consecutive).
    std::vector<std::vector<int64_t>> seq_tokens;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t s = batch.seq(static_cast<size_t>(t));
      if (static_cast<size_t>(s) >= seq_tokens.size()) seq_tokens.resize(static_cast<size_t>(s) + 1);
      seq_tokens[s].push_back(t);
    }
    const float* dt = Floats(w.dt_bias);
    const float* a = Floats(w.a);
    const float eps = hp_.rms_eps, scale = 1.0f / std::sqrt(static_cast<float>(S));
    const int64_t K = d.conv_kernel;
    for (size_t s = 0; s < seq_tokens.size(); ++s) {
      const std::vector<int64_t>& toks = seq_tokens[s];
      if (toks.empty()) continue;
      float* state = kv.State(batch.state_slot(static_cast<int32_t>(s))) + w.index * d.state_floats();
      float* conv_state = state;                 // [K - 1, conv_dim], oldest first
      float* ssm = state + d.conv_floats();      // [v_heads, S (value), S (key)]
      const bool fresh = batch.positions[toks[0]] == 0;
      if (fresh) std::memset(state, 0, static_cast<size_t>(d.state_floats()) * sizeof(float));
      const int64_t m = static_cast<int64_t>(toks.size());
      // The convolution token by token (each output the sum over the K taps in order, then SiLU),
      // channels in parallel; the inputs before the batch's are the state's, which then keeps the
      // last K - 1.
      span.Next("delta_conv", m, 0, l);
      auto input = [&](int64_t p) -> const float* {
        return p >= 0 ? buf.mixed.data() + toks[p] * conv_dim : conv_state + (K - 1 + p) * conv_dim;
      };
      pool.ParallelFor(conv_dim, [&](int64_t c0, int64_t c1) {
        for (int64_t i = 0; i < m; ++i) {
          float* out = buf.conv_out.data() + toks[i] * conv_dim;
          std::fill(out + c0, out + c1, 0.0f);
          for (int64_t j = 0; j < K; ++j) {
            const float* x = input(i - (K - 1) + j);
            const float* wj = w.conv_t.data() + j * conv_dim;
            for (int64_t c = c0; c < c1; ++c) out[c] += x[c] * wj[c];
          }
          kernels::SiluMul(out + c0, buf.ones.data() + c0, c1 - c0);
        }
      }, /*min_items_per_thread=*/256);
      // Snapshots (a verifying step's states after each of its first tokens): the convolution's
      // inputs up to that token.
      const std::span<const StateSnapshot> snaps =
          batch.state_snapshots.empty() ? std::span<const StateSnapshot>() : batch.state_snapshots[s];
      auto snapshot = [&](size_t j) { return kv.State(snaps[j].slot) + w.index * d.state_floats(); };
      for (size_t j = 0; j < snaps.size(); ++j) {
        for (int64_t x = 0; x < K - 1; ++x) {
          std::memcpy(snapshot(j) + x * conv_dim, input(snaps[j].after - (K - 2) + x),
                      static_cast<size_t>(conv_dim) * sizeof(float));
        }
      }
      buf.conv_keep.resize(static_cast<size_t>((K - 1) * conv_dim));
      for (int64_t j = 0; j < K - 1; ++j) {
        std::memcpy(buf.conv_keep.data() + j * conv_dim, input(m - (K - 1) + j), static_cast<size_t>(conv_dim) * sizeof(float));
      }
      std::memcpy(conv_state, buf.conv_keep.data(), buf.conv_keep.size() * sizeof(float));
      span.Next("delta_rule", m, 0, l);
      // q and k L2-normed per key head.
      pool.ParallelFor(m, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          float* row = buf.conv_out.data() + toks[i] * conv_dim;
          for (int64_t h = 0; h < 2 * d.k_heads; ++h) {
            float* x = row + h * S;
            const float inv = 1.0f / std::sqrt(Dot(x, x, S) + eps);
            for (int64_t e = 0; e < S; ++e) x[e] *= inv;
          }
        }
      });
      // The recurrence, value head by value head, on the sequence's rows (gathered when the batch
      // interleaves its tokens with other sequences').
      const bool contiguous = toks.back() - toks.front() == m - 1;
      const float* rows = buf.conv_out.data() + toks.front() * conv_dim;
      float* outs = buf.core.data() + toks.front() * value_dim;
      if (!contiguous) {
        buf.seq_rows.resize(static_cast<size_t>(m * conv_dim));
        buf.seq_out.resize(static_cast<size_t>(m * value_dim));
        for (int64_t i = 0; i < m; ++i) {
          std::memcpy(buf.seq_rows.data() + i * conv_dim, buf.conv_out.data() + toks[i] * conv_dim,
                      static_cast<size_t>(conv_dim) * sizeof(float));
        }
        rows = buf.seq_rows.data();
        outs = buf.seq_out.data();
      }
      buf.decay.resize(static_cast<size_t>(d.v_heads * m));
      buf.write.resize(static_cast<size_t>(d.v_heads * m));
      for (int64_t h = 0; h < d.v_heads; ++h) {
        for (int64_t i = 0; i < m; ++i) {
          const int64_t t = toks[i];
          buf.decay[h * m + i] = std::exp(Softplus(buf.alpha[t * d.v_heads + h] + dt[h]) * a[h]);
          buf.write[h * m + i] = 1.0f / (1.0f + std::exp(-buf.beta[t * d.v_heads + h]));
        }
      }
      pool.ParallelFor(d.v_heads, [&](int64_t h0, int64_t h1) {
        for (int64_t h = h0; h < h1; ++h) {
          const int64_t kh = h % d.k_heads;
          kernels::DeltaRuleTokens in;
          in.n = m;
          in.q = rows + kh * S;
          in.k = rows + d.key_dim() + kh * S;
          in.v = rows + 2 * d.key_dim() + h * S;
          in.stride = conv_dim;
          in.decay = buf.decay.data() + h * m;
          in.beta = buf.write.data() + h * m;
          in.scale = scale;
          in.out = outs + h * S;
          in.out_stride = value_dim;
          // A row's arithmetic does not depend on how many tokens a call takes: the tokens up to
          // each snapshot go in a call of their own, the head's matrix copied after it.
          int64_t done = 0;
          for (size_t j = 0; j < snaps.size(); ++j) {
            kernels::DeltaRuleTokens part = in;
            part.n = snaps[j].after + 1 - done;
            part.q += done * in.stride, part.k += done * in.stride, part.v += done * in.stride;
            part.decay += done, part.beta += done, part.out += done * in.out_stride;
            kernels::DeltaRule(ssm + h * S * S, S, part);
            std::memcpy(snapshot(j) + d.conv_floats() + h * S * S, ssm + h * S * S,
                        static_cast<size_t>(S * S) * sizeof(float));
            done = snaps[j].after + 1;
          }
          if (done == m) continue;
          in.n = m - done;
          in.q += done * in.stride, in.k += done * in.stride, in.v += done * in.stride;
          in.decay += done, in.beta += done, in.out += done * in.out_stride;
          kernels::DeltaRule(ssm + h * S * S, S, in);
        }
      }, /*min_items_per_thread=*/1);
      if (!contiguous) {
        for (int64_t i = 0; i < m; ++i) {
          std::memcpy(buf.core.data() + toks[i] * value_dim, buf.seq_out.data() + i * value_dim,
                      static_cast<size_t>(value_dim) * sizeof(float));
        }
      }
    }
    // RmsNorm per value head with ssm_norm, times SiLU(z) (into z, ssm_out's input).
    span.Next("delta_norm", n, 0, l);
    const float* norm_w = Floats(w.ssm_norm);
    pool.ParallelFor(n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t h = 0; h < d.v_heads; ++h) {
          float* o = buf.core.data() + t * value_dim + h * S;
          kernels::RmsNorm(o, norm_w, S, eps, o);
          kernels::SiluMul(buf.z.data() + t * value_dim + h * S, o, S);
        }
      }
    });
    span.Next("matmul_ssm_out", n, WeightBytes(w.wout), l);
    MatMul(w.wout, buf.z.data(), n, buf.out.data(), pool);
    for (int64_t i = 0; i < n * hp_.dim; ++i) ws.x[i] += buf.out[i];
  }

  DeltaNetShape dn_;
  std::vector<uint8_t> recurrent_;  // [num_layers] Gated DeltaNet (1) or full attention (0)
  std::vector<int64_t> unrotated_;  // RoPE pairs in the fourth section
  std::vector<Qwen35Layer> layers_;
};

// gale synth: Qwen3.5's keys and tensors at the shape's sizes (defaults as SynthShape says: the
// real models' proportions). A --key attention.recurrent_layers decides which layers get which
// tensors, as it decides for the loader.
Status SynthCheckQwen35(const SynthShape& s) {
  if (s.arch == "qwen35" && s.num_experts > 0) return InvalidArgument("synth: qwen35 is dense (qwen35moe has the experts)");
  if (s.arch == "qwen35moe" && s.num_experts == 0) return InvalidArgument("synth: qwen35moe needs experts (--experts, --experts-used)");
  if (s.ssm_state > 0 && (s.ssm_v_heads % std::max<int64_t>(1, s.ssm_k_heads) != 0)) {
    return InvalidArgument("synth: qwen35: --ssm-v-heads must be a multiple of --ssm-k-heads");
  }
  return Status::Ok();
}

Status SynthWriteQwen35(SynthWriter& w) {
  const SynthShape& s = w.s;
  const std::string& p = w.p;
  DeltaNetShape d;
  d.conv_kernel = s.ssm_conv > 0 ? s.ssm_conv : 4;
  d.head = s.ssm_state > 0 ? s.ssm_state : w.head_dim / 2;
  d.k_heads = s.ssm_k_heads > 0 ? s.ssm_k_heads : s.num_kv_heads;
  d.v_heads = s.ssm_v_heads > 0 ? s.ssm_v_heads : 2 * d.k_heads;
  const int64_t rope_dims = s.rope_dim > 0 ? s.rope_dim : w.head_dim / 4;
  const int64_t interval = s.full_attention_interval > 0 ? s.full_attention_interval : 4;
  w.w.SetF32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.w.SetF32(p + "rope.freq_base", 10000000.0f);
  w.w.SetU32(p + "rope.dimension_count", static_cast<uint32_t>(rope_dims));
  // Qwen3.5's [11, 11, 10, 0] of 32 pairs, scaled to the shape's.
  const int64_t pairs = rope_dims / 2, s0 = (pairs * 11 + 16) / 32, s1 = (pairs * 11 + 16) / 32;
  w.w.SetValue(p + "rope.dimension_sections",
               GgufValue::I32Array({static_cast<int32_t>(s0), static_cast<int32_t>(s1),
                                    static_cast<int32_t>(pairs - s0 - s1), 0}));
  w.w.SetU32(p + "full_attention_interval", static_cast<uint32_t>(interval));
  w.w.SetU32(p + "ssm.conv_kernel", static_cast<uint32_t>(d.conv_kernel));
  w.w.SetU32(p + "ssm.state_size", static_cast<uint32_t>(d.head));
  w.w.SetU32(p + "ssm.group_count", static_cast<uint32_t>(d.k_heads));
  w.w.SetU32(p + "ssm.time_step_rank", static_cast<uint32_t>(d.v_heads));
  w.w.SetU32(p + "ssm.inner_size", static_cast<uint32_t>(d.value_dim()));
  std::vector<bool> recurrent;
  for (int64_t l = 0; l < s.num_layers; ++l) recurrent.push_back((l + 1) % interval != 0);
  for (const auto& [key, v] : s.keys) {
    if (key != "attention.recurrent_layers" || v.type != GgufValueType::kArray) continue;
    for (size_t l = 0; l < recurrent.size() && l < v.array.size(); ++l) recurrent[l] = v.array[l].AsBool().value_or(false);
  }
  RETURN_IF_ERROR(w.Ones("output_norm.weight", s.dim));
  RETURN_IF_ERROR(w.Matrix("output.weight", s.dim, s.vocab_size, w.type));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    RETURN_IF_ERROR(w.Vector(b + "attn_norm.weight", s.dim, 1.0f, 0.3f));
    RETURN_IF_ERROR(w.Vector(b + "post_attention_norm.weight", s.dim, 1.0f, 0.3f));
    if (recurrent[l]) {
      RETURN_IF_ERROR(w.Matrix(b + "attn_qkv.weight", s.dim, d.conv_dim(), w.type));
      RETURN_IF_ERROR(w.Matrix(b + "attn_gate.weight", s.dim, d.value_dim(), w.type));
      RETURN_IF_ERROR(w.Matrix(b + "ssm_beta.weight", s.dim, d.v_heads, w.type));
      RETURN_IF_ERROR(w.Matrix(b + "ssm_alpha.weight", s.dim, d.v_heads, w.type));
      // Kernel taps around 1 / K; the decay's bias and -exp(A_log) as trained models have them
      // (decays from about 0.5 to 0.99 per token).
      RETURN_IF_ERROR(w.Vector(b + "ssm_conv1d.weight", d.conv_kernel, 0.0f, 0.6f, d.conv_dim()));
      RETURN_IF_ERROR(w.Vector(b + "ssm_dt.bias", d.v_heads, 0.0f, 1.0f));
      RETURN_IF_ERROR(w.Vector(b + "ssm_a", d.v_heads, -0.3f, 0.25f));
      RETURN_IF_ERROR(w.Vector(b + "ssm_norm.weight", d.head, 1.0f, 0.3f));
      RETURN_IF_ERROR(w.Matrix(b + "ssm_out.weight", d.value_dim(), s.dim, w.type));
    } else {
      RETURN_IF_ERROR(w.Matrix(b + "attn_q.weight", s.dim, 2 * w.q_dim, w.type));
      RETURN_IF_ERROR(w.Matrix(b + "attn_k.weight", s.dim, w.kv_dim, w.type));
      RETURN_IF_ERROR(w.Matrix(b + "attn_v.weight", s.dim, w.v_dim, w.type));
      RETURN_IF_ERROR(w.Vector(b + "attn_q_norm.weight", w.head_dim, 1.0f, 0.3f));
      RETURN_IF_ERROR(w.Vector(b + "attn_k_norm.weight", w.head_dim, 1.0f, 0.3f));
      RETURN_IF_ERROR(w.Matrix(b + "attn_output.weight", w.q_dim, s.dim, w.type));
    }
    if (s.num_experts > 0) {
      // Routed experts of expert_ffn, one shared expert of ffn_dim behind its sigmoid gate.
      RETURN_IF_ERROR(w.Router(b));
      RETURN_IF_ERROR(w.Experts(b));
      RETURN_IF_ERROR(w.Vector(b + "ffn_gate_inp_shexp.weight", s.dim, 0.0f, 0.1f));
      RETURN_IF_ERROR(w.GatedFfn(b, s.ffn_dim, "_shexp"));
    } else {
      RETURN_IF_ERROR(w.GatedFfn(b, s.ffn_dim));
    }
  }
  if (s.num_experts > 0) {
    w.w.SetU32(p + "expert_feed_forward_length", static_cast<uint32_t>(w.expert_ffn));
    w.w.SetU32(p + "expert_shared_feed_forward_length", static_cast<uint32_t>(s.ffn_dim));
  }
  return Status::Ok();
}

std::vector<SynthShape> SynthShapesQwen35() {
  SynthShape s;  // Qwen3.5-4B
  s.name = "qwen3.5-4b", s.arch = "qwen35";
  s.dim = 2560, s.num_layers = 32, s.num_heads = 16, s.num_kv_heads = 4, s.head_dim = 256, s.ffn_dim = 9216;
  s.vocab_size = 248320, s.context_length = 262144, s.rope_dim = 64;
  s.ssm_conv = 4, s.ssm_state = 128, s.ssm_k_heads = 16, s.ssm_v_heads = 32;
  return {s};
}

std::vector<SynthShape> SynthShapesQwen35Moe() {
  SynthShape s;  // Qwen3.5-35B-A3B's shapes, 8 of its 40 layers
  s.name = "qwen3.5-35b-a3b", s.arch = "qwen35moe";
  s.dim = 2048, s.num_layers = 8, s.num_heads = 16, s.num_kv_heads = 2, s.head_dim = 256, s.ffn_dim = 512;
  s.vocab_size = 248320, s.context_length = 262144, s.rope_dim = 64;
  s.ssm_conv = 4, s.ssm_state = 128, s.ssm_k_heads = 16, s.ssm_v_heads = 32;
  s.num_experts = 256, s.experts_used = 8, s.expert_ffn = 512;
  return {s};
}

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadQwen35(const GgufFile& file, ModelHParams hp) {
  return Qwen35Model::Load(file, std::move(hp), /*moe=*/false);
}
StatusOr<std::unique_ptr<Model>> LoadQwen35Moe(const GgufFile& file, ModelHParams hp) {
  return Qwen35Model::Load(file, std::move(hp), /*moe=*/true);
}

const ArchSpec kQwen35Arch = {.name = "qwen35",
                              .load = LoadQwen35,
                              .synth_check = SynthCheckQwen35,
                              .synth_write = SynthWriteQwen35,
                              .synth_shapes = SynthShapesQwen35,
                              .hf = &kQwen35HfFamily};
const ArchSpec kQwen35MoeArch = {.name = "qwen35moe",
                                 .load = LoadQwen35Moe,
                                 .experts = true,
                                 .synth_check = SynthCheckQwen35,
                                 .synth_write = SynthWriteQwen35,
                                 .synth_shapes = SynthShapesQwen35Moe,
                                 .hf = &kQwen35HfFamily};

}  // namespace gale
