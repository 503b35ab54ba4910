// The shared blocks of a decoder forward pass, cut from the llama forward: each keeps that
// forward's arithmetic and thread split exactly, so every architecture built from them keeps
// batch invariance.
#include "model/blocks.h"

#include <algorithm>
#include <vector>

#include <cmath>
#include <cstring>
#include <limits>

#include "base/profiler.h"
#include "base/tree_sum.h"
#include "model/weights.h"

namespace gale {
namespace {

void Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// gate = act(gate) * up over rows of width elements, one row per item.
void ActivateRows(GateActivation act, float* gate, const float* up, int64_t rows, int64_t width, ThreadPool& pool) {
  pool.ParallelFor(rows, [&](int64_t begin, int64_t end) {
    float* g = gate + begin * width;
    const float* u = up + begin * width;
    const int64_t n = (end - begin) * width;
    switch (act) {
      case GateActivation::kSilu: kernels::SiluMul(g, u, n); break;
      case GateActivation::kGeluTanh: kernels::GeluTanhMul(g, u, n); break;
      case GateActivation::kSwigluOai:
        // ggml's swiglu_oai, operation for operation (alpha 1.702, limit 7).
        for (int64_t i = 0; i < n; ++i) {
          const float x = std::min(g[i], 7.0f);
          const float y = std::clamp(u[i], -7.0f, 7.0f);
          g[i] = x / (1.0f + std::exp(1.702f * (-x))) * (y + 1.0f);
        }
        break;
    }
  });
}

// DeepSeek-V4's SwiGLU limit, as llama.cpp applies it before swiglu: gate = min(gate, c), up =
// clamp(up, -c, c).
void ClampGateUp(float c, float* gate, float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    gate[i] = std::min(gate[i], c);
    up[i] = std::clamp(up[i], -c, c);
  }
}

const char* ActivationName(GateActivation act, bool moe) {
  switch (act) {
    case GateActivation::kSilu: return moe ? "moe_silu_mul" : "silu_mul";
    case GateActivation::kGeluTanh: return moe ? "moe_gelu_mul" : "gelu_mul";
    case GateActivation::kSwigluOai: return moe ? "moe_swiglu_oai" : "swiglu_oai";
  }
  return "?";
}

// out = softmax(x) over n values as ggml computes it: the exponentials' sum in double, then one
// f32 reciprocal multiplied in. out may be x.
void GgmlSoftmax(const float* x, int64_t n, float* out) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(x[i] - max);
    sum += out[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) out[i] *= inv;
}

}  // namespace

void LatentAttentionWeights::AppendTo(std::vector<MatrixWeight*>* all) {
  for (MatrixWeight* m : {&wq, &wq_a, &wq_b, &wkv_a, &wo}) {
    if (!m->view.shape.empty()) all->push_back(m);
  }
  for (MatrixWeight& m : wk_b) all->push_back(&m);
  for (MatrixWeight& m : wv_b) all->push_back(&m);
}

Status LayerFfn::Load(TensorLoader& tensors, const std::string& b, const ModelHParams& hp, int64_t layer) {
  if (!hp.moe.dense_layer(layer)) return LoadMoeWeights(tensors, b, hp, &moe);
  RETURN_IF_ERROR(tensors.Matrix(b + "ffn_gate.weight", hp.dim, hp.ffn_dim, &gate));
  RETURN_IF_ERROR(tensors.Matrix(b + "ffn_up.weight", hp.dim, hp.ffn_dim, &up));
  return tensors.Matrix(b + "ffn_down.weight", hp.ffn_dim, hp.dim, &down);
}

void LayerFfn::AppendTo(std::vector<MatrixWeight*>* all, const ModelHParams& hp, int64_t layer) {
  if (!hp.moe.dense_layer(layer)) {
    moe.AppendTo(all);
    return;
  }
  for (MatrixWeight* m : {&gate, &up, &down}) all->push_back(m);
}

void MoeWeights::AppendTo(std::vector<MatrixWeight*>* all) {
  all->push_back(&router);
  for (ExpertMatrices& e : experts) {
    for (MatrixWeight* m : {&e.gate, &e.up, &e.down}) all->push_back(m);
  }
  if (has_shared()) {
    for (MatrixWeight* m : {&shared_gate, &shared_up, &shared_down}) all->push_back(m);
  }
}

Status LoadMoeWeights(TensorLoader& tensors, const std::string& b, const ModelHParams& hp, MoeWeights* w) {
  const MoeHParams& moe = hp.moe;
  const int64_t num = moe.num_experts, ffn = moe.expert_ffn, dim = hp.dim;
  RETURN_IF_ERROR(tensors.Matrix(b + "ffn_gate_inp.weight", dim, num, &w->router));
  if (tensors.Has(b + "ffn_gate_inp.bias")) RETURN_IF_ERROR(tensors.Vector(b + "ffn_gate_inp.bias", num, &w->router_bias));
  if (tensors.Has(b + "exp_probs_b.bias")) RETURN_IF_ERROR(tensors.Vector(b + "exp_probs_b.bias", num, &w->selection_bias));
  w->experts.resize(num);
  auto split = [&](const std::string& name, int64_t in, int64_t out, MatrixWeight ExpertMatrices::*which) -> Status {
    std::vector<MatrixWeight> parts;
    RETURN_IF_ERROR(tensors.StackedMatrices(name, in, out, num, &parts));
    for (int64_t e = 0; e < num; ++e) (w->experts[e].*which).view = parts[e].view;
    return Status::Ok();
  };
  if (tensors.Has(b + "ffn_gate_up_exps.weight")) {
    // Fused (llama.cpp's ffn_gate_up_exps): each expert's 2 * width rows, the gate's first, then
    // up's; read as two row ranges of the one tensor, no copy.
    std::vector<MatrixWeight> parts;
    RETURN_IF_ERROR(tensors.StackedMatrices(b + "ffn_gate_up_exps.weight", dim, 2 * ffn, num, &parts));
    for (int64_t e = 0; e < num; ++e) {
      const TensorView& v = parts[e].view;
      const uint64_t half = v.num_bytes / 2;
      w->experts[e].gate.view = TensorView{v.type, {dim, ffn}, v.data, half};
      w->experts[e].up.view = TensorView{v.type, {dim, ffn}, v.data + half, half};
    }
  } else {
    RETURN_IF_ERROR(split(b + "ffn_gate_exps.weight", dim, ffn, &ExpertMatrices::gate));
    RETURN_IF_ERROR(split(b + "ffn_up_exps.weight", dim, ffn, &ExpertMatrices::up));
  }
  RETURN_IF_ERROR(split(b + "ffn_down_exps.weight", ffn, dim, &ExpertMatrices::down));
  // Expert biases (gpt-oss): [width, experts] f32, expert e's in row e; fused, the gate's and
  // up's in one [2 * width, experts] tensor, each row the gate's width then up's.
  // biases(name, row, offset, which): expert e's `which` = row e of `name` (of `row` floats) + offset.
  auto biases = [&](const char* name, int64_t row, int64_t offset, const float* ExpertMatrices::*which) -> Status {
    TensorView v;
    RETURN_IF_ERROR(tensors.Get(b + name, {row, num}, &v));
    if (v.type != GgmlType::kF32) return InvalidArgument("tensor {}{} must be f32", b, name);
    for (int64_t e = 0; e < num; ++e) w->experts[e].*which = Floats(v) + e * row + offset;
    return Status::Ok();
  };
  if (tensors.Has(b + "ffn_gate_up_exps.bias")) {
    RETURN_IF_ERROR(biases("ffn_gate_up_exps.bias", 2 * ffn, 0, &ExpertMatrices::gate_bias));
    RETURN_IF_ERROR(biases("ffn_gate_up_exps.bias", 2 * ffn, ffn, &ExpertMatrices::up_bias));
    RETURN_IF_ERROR(biases("ffn_down_exps.bias", dim, 0, &ExpertMatrices::down_bias));
  } else if (tensors.Has(b + "ffn_gate_exps.bias") || tensors.Has(b + "ffn_up_exps.bias") ||
             tensors.Has(b + "ffn_down_exps.bias")) {
    RETURN_IF_ERROR(biases("ffn_gate_exps.bias", ffn, 0, &ExpertMatrices::gate_bias));
    RETURN_IF_ERROR(biases("ffn_up_exps.bias", ffn, 0, &ExpertMatrices::up_bias));
    RETURN_IF_ERROR(biases("ffn_down_exps.bias", dim, 0, &ExpertMatrices::down_bias));
  }
  if (moe.num_shared > 0) {
    const int64_t shared = moe.shared_ffn > 0 ? moe.shared_ffn : ffn * moe.num_shared;
    RETURN_IF_ERROR(tensors.Matrix(b + "ffn_gate_shexp.weight", dim, shared, &w->shared_gate));
    RETURN_IF_ERROR(tensors.Matrix(b + "ffn_up_shexp.weight", dim, shared, &w->shared_up));
    RETURN_IF_ERROR(tensors.Matrix(b + "ffn_down_shexp.weight", shared, dim, &w->shared_down));
    if (tensors.Has(b + "ffn_gate_inp_shexp.weight")) {
      RETURN_IF_ERROR(tensors.Vector(b + "ffn_gate_inp_shexp.weight", dim, &w->shared_expert_gate));
    }
  }
  return Status::Ok();
}

void RouteToken(const MoeHParams& moe, float* scores, const float* selection_bias, int32_t* chosen, float* weight,
                float* scratch, const int32_t* fixed) {
  const int64_t num = moe.num_experts, k = moe.num_used;
  float* probs = scratch;
  // The gating's probabilities, as ggml computes them.
  switch (moe.gating) {
    case ExpertGating::kSoftmax:
      GgmlSoftmax(scores, num, probs);
      break;
    case ExpertGating::kSigmoid:
      for (int64_t e = 0; e < num; ++e) probs[e] = 1.0f / (1.0f + std::exp(-scores[e]));
      break;
    case ExpertGating::kSoftmaxWeight:
      for (int64_t e = 0; e < num; ++e) probs[e] = scores[e];
      break;
    case ExpertGating::kSqrtSoftplus:  // ggml's softplus: x itself past 20
      for (int64_t e = 0; e < num; ++e) {
        const float x = scores[e];
        probs[e] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
      }
      break;
  }
  if (fixed != nullptr) {
    for (int64_t i = 0; i < k; ++i) {
      chosen[i] = fixed[i];
      weight[i] = probs[fixed[i]];
    }
    for (int64_t e = 0; e < num; ++e) scores[e] = probs[e];
  } else {
    for (int64_t e = 0; e < num; ++e) scores[e] = probs[e] + (selection_bias != nullptr ? selection_bias[e] : 0.0f);
    // Candidates: every expert, or those of the groups whose two best scores sum highest.
    float* candidate = scratch + num;  // selection score, or -inf where its group is out
    for (int64_t e = 0; e < num; ++e) candidate[e] = scores[e];
    const float kOut = -std::numeric_limits<float>::infinity();
    if (moe.num_groups > 1) {
      const int64_t per = num / moe.num_groups;
      std::vector<float> group_score(moe.num_groups);
      for (int64_t g = 0; g < moe.num_groups; ++g) {
        float best = kOut, second = kOut;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          if (scores[e] > best) {
            second = best;
            best = scores[e];
          } else if (scores[e] > second) {
            second = scores[e];
          }
        }
        group_score[g] = per > 1 ? best + second : best;
      }
      std::vector<uint8_t> keep(moe.num_groups, 0);
      for (int64_t i = 0; i < moe.groups_used; ++i) {
        int64_t at = -1;
        for (int64_t g = 0; g < moe.num_groups; ++g) {
          if (!keep[g] && (at < 0 || group_score[g] > group_score[at])) at = g;
        }
        if (at >= 0) keep[at] = 1;
      }
      for (int64_t e = 0; e < num; ++e) {
        if (!keep[e / per]) candidate[e] = kOut;
      }
    }
    float* taken = scratch + 2 * num;  // 1 once chosen
    for (int64_t e = 0; e < num; ++e) taken[e] = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      int64_t at = -1;
      for (int64_t e = 0; e < num; ++e) {
        if (taken[e] == 0.0f && (at < 0 || candidate[e] > candidate[at])) at = e;
      }
      chosen[i] = static_cast<int32_t>(at);
      taken[at] = 1.0f;
      weight[i] = probs[at];
    }
  }
  if (moe.gating == ExpertGating::kSoftmaxWeight) GgmlSoftmax(weight, k, weight);
  if (moe.norm_weights) {
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) sum += weight[i];
    sum = std::max(sum, 6.103515625e-5f);  // llama.cpp's clamp: f16's smallest normal
    for (int64_t i = 0; i < k; ++i) weight[i] /= sum;
  }
  if (moe.weights_scale != 1.0f) {
    for (int64_t i = 0; i < k; ++i) weight[i] *= moe.weights_scale;
  }
}

void MatMul(const MatrixWeight& w, const float* x, int64_t num_tokens, float* y, ThreadPool& pool) {
  if (w.parts.empty()) {
    kernels::MatMul(w.view, w.packed.get(), x, num_tokens, y, pool);
    return;
  }
  // A tensor-parallel rank's slices: each part's product over its columns of x, then their sum.
  const int64_t k = static_cast<int64_t>(w.parts.size());
  const int64_t in = w.parts[0].view.shape[0], out = w.parts[0].view.shape[1];
  thread_local std::vector<float> xs, ys;
  Grow(xs, num_tokens * in);
  Grow(ys, (k - 1) * num_tokens * out);
  std::vector<float*> sums(k);
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t t = 0; t < num_tokens; ++t) std::memcpy(xs.data() + t * in, x + (t * k + p) * in, in * sizeof(float));
    sums[p] = p == 0 ? y : ys.data() + (p - 1) * num_tokens * out;
    kernels::MatMul(w.parts[p].view, w.parts[p].packed.get(), xs.data(), num_tokens, sums[p], pool);
  }
  TreeSum(sums, static_cast<size_t>(num_tokens * out));
}

Status ShardDense(DenseMatrices& m, const TensorSharder& sharder, int64_t layer) {
  const std::string b = "blk." + std::to_string(layer) + " ";
  RETURN_IF_ERROR(sharder.Rows(&m.wq, b + "attention Q"));
  RETURN_IF_ERROR(sharder.KvRows(&m.wk, b + "attention K"));
  RETURN_IF_ERROR(sharder.KvRows(&m.wv, b + "attention V"));
  RETURN_IF_ERROR(sharder.Columns(&m.wo, b + "attention output"));
  RETURN_IF_ERROR(sharder.Rows(&m.w_gate, b + "FFN gate"));
  RETURN_IF_ERROR(sharder.Rows(&m.w_up, b + "FFN up"));
  return sharder.Columns(&m.w_down, b + "FFN down");
}

ForwardPass::ForwardPass(const ModelHParams& hp, const ForwardBatch& batch, KvStorage& kv, Workspace& ws,
                         ThreadPool& pool, const float* freq_factors)
    : hp_(hp), batch_(batch), kv_(kv), ws_(ws), pool_(pool), n_(static_cast<int64_t>(batch.tokens.size())),
      first_layer_(batch.first_layer), end_layer_(batch.end_layer < 0 ? hp.num_layers : batch.end_layer) {
  const int64_t n = n_;
  const int64_t dim = hp.dim, q_dim = hp.q_dim(), kv_dim = hp.kv_dim(), ffn = hp.ffn_dim;
  Grow(ws.x, n * dim);
  Grow(ws.xb, n * std::max({dim, q_dim, hp.attn_out_dim()}));
  Grow(ws.xb2, n * dim);
  Grow(ws.q, n * q_dim);
  Grow(ws.k, n * kv_dim);
  Grow(ws.v, n * hp.v_dim());
  Grow(ws.hb, n * ffn);
  Grow(ws.hb2, n * ffn);
  Grow(ws.rope, n * hp.rope_dims);
  for (int64_t t = 0; t < n; ++t) {
    float* cos_sin = ws.rope.data() + t * hp.rope_dims;
    if (hp.yarn_ext_factor != 0.0f) {
      kernels::RopeAnglesYarn(static_cast<int>(hp.rope_dims), batch.positions[t], hp.rope_freq_base, hp.rope_freq_scale,
                              hp.yarn_ext_factor, hp.yarn_corr_low, hp.yarn_corr_high, cos_sin, freq_factors);
    } else {
      kernels::RopeAngles(static_cast<int>(hp.rope_dims), batch.positions[t], hp.rope_freq_base, hp.rope_freq_scale,
                          cos_sin, freq_factors);
    }
    if (hp.rope_attn_factor != 1.0f) {
      for (int64_t i = 0; i < hp.rope_dims; ++i) cos_sin[i] *= hp.rope_attn_factor;
    }
  }
  if (hp.rope_freq_base_swa > 0.0f) {
    // The windowed layers' own base: scaled as the others (YaRN's correction dims at that base),
    // or not at all; cos and sin times the attention factor either way, as llama.cpp.
    Grow(ws.rope_swa, n * hp.rope_dims);
    for (int64_t t = 0; t < n; ++t) {
      float* cos_sin = ws.rope_swa.data() + t * hp.rope_dims;
      if (hp.rope_swa_scaled && hp.yarn_ext_factor != 0.0f) {
        kernels::RopeAnglesYarn(static_cast<int>(hp.rope_dims), batch.positions[t], hp.rope_freq_base_swa,
                                hp.rope_freq_scale, hp.yarn_ext_factor, hp.yarn_corr_low_swa, hp.yarn_corr_high_swa,
                                cos_sin, nullptr);
      } else {
        kernels::RopeAngles(static_cast<int>(hp.rope_dims), batch.positions[t], hp.rope_freq_base_swa,
                            hp.rope_swa_scaled ? hp.rope_freq_scale : 1.0f, cos_sin);
      }
      const float attn = hp.rope_swa_scaled ? hp.rope_attn_factor : hp.rope_attn_factor_file;
      if (attn != 1.0f) {
        for (int64_t i = 0; i < hp.rope_dims; ++i) cos_sin[i] *= attn;
      }
    }
  }
  // Each layer group's tables (ForwardBatch::block_tables is group-major), n per group.
  const int64_t num_groups = kv.num_groups();
  const int64_t num_seqs = static_cast<int64_t>(batch.block_tables.size()) / num_groups;
  ws.tables.resize(num_groups * n);
  for (int64_t g = 0; g < num_groups; ++g) {
    for (int64_t t = 0; t < n; ++t) ws.tables[g * n + t] = batch.block_tables[g * num_seqs + batch.seq(t)].data();
  }
  ws.kv_slots.resize(n);
  for (int64_t t = 0; t < n; ++t) ws.kv_slots[t] = batch.slot(t);
  if (!hp.causal) {
    std::vector<int32_t> last(num_seqs, 0);
    for (int64_t t = 0; t < n; ++t) last[batch.seq(t)] = std::max(last[batch.seq(t)], ws.kv_slots[t]);
    seq_end_slots_.resize(n);
    for (int64_t t = 0; t < n; ++t) seq_end_slots_[t] = last[batch.seq(t)];
  }
  for (int64_t t = 0; t < n; ++t) kv_positions_ += (hp.causal ? ws.kv_slots[t] : seq_end_slots_[t]) + 1;
  // Tokens whose attention is tracked get rows for their scores.
  ws.score_rows.assign(n, nullptr);
  if (!batch.attn_acc.empty()) {
    size_t total = 0;
    std::vector<size_t> offset(n, 0);
    for (int64_t t = 0; t < n; ++t) {
      if (batch.attn_acc[batch.seq(t)].data == nullptr) continue;
      offset[t] = total;
      total += static_cast<size_t>(hp.num_heads) * (ws.kv_slots[t] + 1);
      tracking_ = true;
    }
    Grow(ws.scores, total);
    for (int64_t t = 0; t < n; ++t) {
      if (batch.attn_acc[batch.seq(t)].data != nullptr) ws.score_rows[t] = ws.scores.data() + offset[t];
    }
  }
}

void ForwardPass::Embed(const TensorView& token_embd, float scale) {
  if (first_layer_ > 0) {  // a later pipeline stage: the residual stream as the one before left it
    std::memcpy(ws_.x.data(), batch_.input, static_cast<size_t>(n_ * hp_.dim) * sizeof(float));
    return;
  }
  ProfileSpan span("embed", "op", n_);
  kernels::GetRows(token_embd, batch_.tokens.data(), n_, ws_.x.data());
  if (scale != 1.0f) {
    for (int64_t i = 0; i < n_ * hp_.dim; ++i) ws_.x[i] *= scale;
  }
}

// RmsNorm then products of the normalized rows; fused into the activations' quantization where
// all products read quantized activations (then the span of the products includes the norm),
// except under calibration, which observes the normalized rows.
void ForwardPass::NormedProducts(int64_t l, const float* norm_w, const SameInput& outs, LinearInput which,
                                 const char* name) {
  const int64_t n = n_;
  int64_t weight_bytes = 0;
  for (const kernels::MatMulOutput& o : outs.span()) weight_bytes += static_cast<int64_t>(o.w->num_bytes);
  if (batch_.observer == nullptr && kernels::ReadQuantizedActivations(outs.span())) {
    ProfileSpan span(name, "op", n, weight_bytes, l);
    kernels::MatMulSameInputNormed(outs.span(), {ws_.x.data(), norm_w, hp_.rms_eps}, n, pool_);
    return;
  }
  ProfileSpan span("rms_norm", "op", n, 0, l);
  NormRows(l, norm_w, which);
  span.Next(name, n, weight_bytes, l);
  kernels::MatMulSameInput(outs.span(), ws_.xb.data(), n, pool_);
}

void ForwardPass::NormRows(int64_t l, const float* norm_w, LinearInput which) {
  const int64_t n = n_, dim = hp_.dim;
  pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      kernels::RmsNorm(ws_.x.data() + t * dim, norm_w, dim, hp_.rms_eps, ws_.xb.data() + t * dim);
    }
  }, /*min_items_per_thread=*/8);
  if (batch_.observer) batch_.observer->Observe(l, which, ws_.xb.data(), n, dim);
}

void ForwardPass::Products(int64_t l, const float* x, int64_t in, const SameInput& outs, LinearInput which,
                           const char* name) {
  if (batch_.observer) batch_.observer->Observe(l, which, x, n_, in);
  int64_t weight_bytes = 0;
  for (const kernels::MatMulOutput& o : outs.span()) weight_bytes += static_cast<int64_t>(o.w->num_bytes);
  ProfileSpan span(name, "op", n_, weight_bytes, l);
  kernels::MatMulSameInput(outs.span(), x, n_, pool_);
}

void ForwardPass::AddBias(float* y, const TensorView& bias, int64_t width) {
  const float* b = reinterpret_cast<const float*>(bias.data);
  for (int64_t t = 0; t < n_; ++t) {
    float* row = y + t * width;
    for (int64_t i = 0; i < width; ++i) row[i] += b[i];
  }
}

void ForwardPass::HeadNorm(float* x, int64_t num_heads, const TensorView& w, const char* name, int64_t l) {
  ProfileSpan span(name, "op", n_, 0, l);
  const float* weight = reinterpret_cast<const float*>(w.data);
  const int64_t head_dim = hp_.head_dim;
  pool_.ParallelFor(n_ * num_heads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      kernels::RmsNorm(x + r * head_dim, weight, head_dim, hp_.rms_eps, x + r * head_dim);
    }
  }, /*min_items_per_thread=*/16);
}

void ForwardPass::Attention(int64_t l, const KeyChannels* key_channels, const float* sinks) {
  const int64_t n = n_, q_dim = hp_.q_dim(), kv_dim = hp_.kv_dim(), head_dim = hp_.head_dim;
  const int64_t block_size = kv_.block_size();
  const int64_t group = hp_.num_heads / hp_.num_kv_heads;
  const bool use_key_channels = key_channels != nullptr && kv_.key_channels() && !key_channels->empty();
  // The span chain rope_kv_write .. attention ends before the output projection's own span.
  ProfileSpan span("rope_kv_write", "op", n, 0, l);
  // One token per item: its rotation, key transform and cache write do not depend on the split.
  const float* shift = use_key_channels ? key_channels->shift.data() + l * kv_dim : nullptr;
  const float* kscale = use_key_channels ? key_channels->scale.data() + l * kv_dim : nullptr;
  auto rope_apply = hp_.rope_style == RopeStyle::kNeox ? kernels::RopeApplyNeox : kernels::RopeApply;
  const int64_t window = hp_.LayerWindow(l);
  const float* angles = window > 0 && hp_.rope_freq_base_swa > 0.0f ? ws_.rope_swa.data() : ws_.rope.data();
  // A windowed layer group's tables index positions, a full group's cache slots (they differ
  // under KV retention, which compacts only the full groups); only full layers are tracked.
  const bool positional = kv_.groups().window[kv_.groups().group_of[l]] > 0;
  const int32_t* slots = positional ? batch_.positions.data() : ws_.kv_slots.data();
  const bool track = tracking_ && window == 0;
  auto rope = [&](int64_t t) {
    const float* cos_sin = angles + t * hp_.rope_dims;
    float* q = ws_.q.data() + t * q_dim;
    if (hp_.rope_style != RopeStyle::kNone) {
      rope_apply(q, static_cast<int>(hp_.num_heads), static_cast<int>(head_dim), static_cast<int>(hp_.rope_dims), cos_sin);
      rope_apply(ws_.k.data() + t * kv_dim, static_cast<int>(hp_.num_kv_heads), static_cast<int>(head_dim),
                 static_cast<int>(hp_.rope_dims), cos_sin);
    }
    if (hp_.query_scale != 1.0f) {
      for (int64_t i = 0; i < q_dim; ++i) q[i] *= hp_.query_scale;
    }
  };
  auto store = [&](int64_t t) {
    float* k = ws_.k.data() + t * kv_dim;
    if (shift != nullptr) {
      float* q = ws_.q.data() + t * q_dim;
      for (int64_t c = 0; c < kv_dim; ++c) k[c] = (k[c] - shift[c]) / kscale[c];
      for (int64_t h = 0; h < hp_.num_heads; ++h) {
        const float* s = kscale + (h / group) * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) q[h * head_dim + d] *= s[d];
      }
    }
    const int64_t pos = slots[t];
    kv_.Write(l, Tables(l)[t][pos / block_size], pos % block_size, k, ws_.v.data() + t * hp_.v_dim());
  };
  if (batch_.observer != nullptr) {  // calibration sees the keys between the two
    for (int64_t t = 0; t < n; ++t) rope(t);
    batch_.observer->ObserveKeys(l, ws_.k.data(), n, kv_dim);
    for (int64_t t = 0; t < n; ++t) store(t);
  } else {
    pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        rope(t);
        store(t);
      }
    }, /*min_items_per_thread=*/4);
  }
  span.Next("attention", n, kv_positions_ * 2 * kv_.row_bytes(), l);
  // Causal: each token reads slots [0, its own]; an encoder's read every slot of its sequence
  // (all written above: Model::Forward checked that the batch holds its sequences whole).
  const int32_t* ends = hp_.causal ? slots : seq_end_slots_.data();
  kernels::Attention(ws_.q.data(), n, ends, Tables(l), kv_.Layer(l),
                     static_cast<int>(hp_.num_heads), static_cast<int>(hp_.num_kv_heads), static_cast<int>(head_dim),
                     ws_.xb.data(), pool_, track ? ws_.score_rows.data() : nullptr, window, sinks,
                     hp_.attn_softcap, static_cast<int>(hp_.value_head()));
  if (track) {
    span.Next("attention_track", n, 0, l);
    AccumulateAttention(l);
  }
}

void ForwardPass::OutputProjection(int64_t l, const MatrixWeight& wo, const TensorView* post_norm,
                                   const TensorView* bias) {
  const int64_t n = n_;
  if (batch_.observer) batch_.observer->Observe(l, LinearInput::kAttnOut, ws_.xb.data(), n, hp_.attn_out_dim());
  ProfileSpan span("matmul_o", "op", n, WeightBytes(wo), l);
  MatMul(wo, ws_.xb.data(), n, ws_.xb2.data(), pool_);
  SumPartials(l);
  if (bias != nullptr) AddBias(ws_.xb2.data(), *bias, hp_.dim);
  Residual(l, post_norm);
}

void ForwardPass::Residual(int64_t l, const TensorView* post_norm) {
  const int64_t n = n_, dim = hp_.dim;
  if (post_norm != nullptr) {
    ProfileSpan span("post_norm", "op", n, 0, l);
    const float* w = reinterpret_cast<const float*>(post_norm->data);
    pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) kernels::RmsNorm(ws_.xb2.data() + t * dim, w, dim, hp_.rms_eps, ws_.xb2.data() + t * dim);
    }, /*min_items_per_thread=*/8);
  }
  if (replace_residual_) {
    std::memcpy(ws_.x.data(), ws_.xb2.data(), n * dim * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n * dim; ++i) ws_.x[i] += ws_.xb2[i];
}

void ForwardPass::GatedFfn(int64_t l, const float* norm_w, const MatrixWeight& gate, const MatrixWeight& up,
                           const MatrixWeight& down, GateActivation act, const TensorView* post_norm) {
  const int64_t n = n_, ffn = hp_.ffn_dim;
  NormedProducts(l, norm_w, {{&gate, ws_.hb.data()}, {&up, ws_.hb2.data()}}, LinearInput::kFfnIn, "matmul_gate_up");
  {
    ProfileSpan span(ActivationName(act, false), "op", n, 0, l);
    // One token row per item: an element's arithmetic does not depend on the split.
    ActivateRows(act, ws_.hb.data(), ws_.hb2.data(), n, ffn, pool_);
    if (batch_.observer) batch_.observer->Observe(l, LinearInput::kFfnMid, ws_.hb.data(), n, ffn);
    span.Next("matmul_down", n, WeightBytes(down), l);
    MatMul(down, ws_.hb.data(), n, ws_.xb2.data(), pool_);
  }
  SumPartials(l);
  Residual(l, post_norm);
}

void ForwardPass::SumPartials(int64_t l) {
  if (batch_.partial_sums == nullptr) return;
  ProfileSpan span("all_reduce", "op", n_, 0, l);
  batch_.partial_sums->Sum(ws_.xb2.data(), n_ * hp_.dim);
}

// Routing, one token per item: each token's k experts and their weights (ws_.moe_chosen,
// ws_.moe_weight).
void ForwardPass::MoeRoute(int64_t l, const MoeWeights& w, ProfileSpan& span) {
  const MoeHParams& moe = hp_.moe;
  const int64_t n = n_, num = moe.num_experts, k = moe.num_used;
  span.Next("moe_router", n, WeightBytes(w.router), l);
  Grow(ws_.moe_logits, n * num);
  ws_.moe_chosen.resize(n * k);
  ws_.moe_weight.resize(n * k);
  MatMul(w.router, ws_.xb.data(), n, ws_.moe_logits.data(), pool_);
  if (w.router_bias.data != nullptr) AddBias(ws_.moe_logits.data(), w.router_bias, num);
  const float* selection_bias = w.selection_bias.data != nullptr ? Floats(w.selection_bias) : nullptr;
  span.Next("moe_route", n, 0, l);
  pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < static_cast<size_t>(3 * num)) scratch.resize(3 * num);
    for (int64_t t = begin; t < end; ++t) {
      const int32_t* fixed = nullptr;
      if (w.token_experts != nullptr) {
        const int32_t token = batch_.tokens[t];
        CHECK(token >= 0 && token < w.token_experts_vocab);
        fixed = w.token_experts + static_cast<int64_t>(token) * k;
      }
      RouteToken(moe, ws_.moe_logits.data() + t * num, selection_bias, ws_.moe_chosen.data() + t * k,
                 ws_.moe_weight.data() + t * k, scratch.data(), fixed);
    }
  }, /*min_items_per_thread=*/16);
  if (batch_.observer) batch_.observer->ObserveRouting(l, ws_.moe_logits.data(), n, num, ws_.moe_chosen.data(), k);
}

// Groups the routed rows by expert (experts in id order, each one's tokens in batch order): row
// moe_row[t * k + j] of the grouped buffers is token t's j-th choice. Returns where each expert's
// rows start ([num + 1]); the rows are gathered into ws_.moe_x.
std::vector<int64_t> ForwardPass::MoeGather(int64_t l, ProfileSpan& span) {
  const MoeHParams& moe = hp_.moe;
  const int64_t dim = hp_.dim, num = moe.num_experts, k = moe.num_used, ffn = moe.expert_ffn, rows = n_ * k;
  std::vector<int64_t> first(num + 1, 0);
  for (int64_t i = 0; i < rows; ++i) ++first[ws_.moe_chosen[i] + 1];
  for (int64_t e = 0; e < num; ++e) first[e + 1] += first[e];
  if (!ws_.expert_tokens.empty() && static_cast<int64_t>(ws_.expert_tokens.size()) >= (l + 1) * num) {
    for (int64_t e = 0; e < num; ++e) ws_.expert_tokens[l * num + e] += first[e + 1] - first[e];
  }
  ws_.moe_row.resize(rows);
  {
    std::vector<int64_t> next(first.begin(), first.end() - 1);
    for (int64_t i = 0; i < rows; ++i) ws_.moe_row[i] = static_cast<int32_t>(next[ws_.moe_chosen[i]]++);
  }
  span.Next("moe_gather", rows, 0, l);
  Grow(ws_.moe_x, rows * dim);
  Grow(ws_.moe_h, rows * ffn);
  Grow(ws_.moe_h2, rows * ffn);
  Grow(ws_.moe_y, rows * dim);
  pool_.ParallelFor(rows, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(ws_.moe_x.data() + static_cast<int64_t>(ws_.moe_row[i]) * dim, ws_.xb.data() + (i / k) * dim,
                  dim * sizeof(float));
    }
  }, /*min_items_per_thread=*/64);
  return first;
}

// The active experts' products, each over its rows only (into ws_.moe_y), with their biases
// (gpt-oss: each grouped row takes its expert's; one row per item).
void ForwardPass::MoeExperts(int64_t l, const MoeWeights& w, GateActivation act, const std::vector<int64_t>& first,
                             ProfileSpan& span) {
  const MoeHParams& moe = hp_.moe;
  const int64_t dim = hp_.dim, num = moe.num_experts, ffn = moe.expert_ffn, rows = n_ * moe.num_used;
  std::vector<kernels::GroupedProduct> products;
  products.reserve(2 * num);
  int64_t active_bytes = 0;
  for (int64_t e = 0; e < num; ++e) {
    const int64_t count = first[e + 1] - first[e];
    if (count == 0) continue;
    const ExpertMatrices& x = w.experts[e];
    products.push_back({{&x.gate.view, x.gate.packed.get(), ws_.moe_h.data() + first[e] * ffn}, first[e], count});
    products.push_back({{&x.up.view, x.up.packed.get(), ws_.moe_h2.data() + first[e] * ffn}, first[e], count});
    active_bytes += static_cast<int64_t>(x.gate.view.num_bytes + x.up.view.num_bytes);
  }
  span.Next("moe_gate_up", rows, active_bytes, l);
  kernels::MatMulGrouped(products, ws_.moe_x.data(), rows, pool_);
  const bool biased = w.experts[0].gate_bias != nullptr;
  std::vector<int32_t> row_expert;
  if (biased) {
    row_expert.resize(rows);
    for (int64_t e = 0; e < num; ++e) {
      for (int64_t r = first[e]; r < first[e + 1]; ++r) row_expert[r] = static_cast<int32_t>(e);
    }
    pool_.ParallelFor(rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const ExpertMatrices& x = w.experts[row_expert[r]];
        float* g = ws_.moe_h.data() + r * ffn;
        float* u = ws_.moe_h2.data() + r * ffn;
        for (int64_t i = 0; i < ffn; ++i) {
          g[i] += x.gate_bias[i];
          u[i] += x.up_bias[i];
        }
      }
    }, /*min_items_per_thread=*/16);
  }
  span.Next(ActivationName(act, true), rows, 0, l);
  if (w.clamp > 1e-6f) ClampGateUp(w.clamp, ws_.moe_h.data(), ws_.moe_h2.data(), rows * ffn);
  ActivateRows(act, ws_.moe_h.data(), ws_.moe_h2.data(), rows, ffn, pool_);
  products.clear();
  active_bytes = 0;
  for (int64_t e = 0; e < num; ++e) {
    const int64_t count = first[e + 1] - first[e];
    if (count == 0) continue;
    const MatrixWeight& down = w.experts[e].down;
    products.push_back({{&down.view, down.packed.get(), ws_.moe_y.data() + first[e] * dim}, first[e], count});
    active_bytes += static_cast<int64_t>(down.view.num_bytes);
  }
  span.Next("moe_down", rows, active_bytes, l);
  kernels::MatMulGrouped(products, ws_.moe_h.data(), rows, pool_);
  if (biased) {
    pool_.ParallelFor(rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* bias = w.experts[row_expert[r]].down_bias;
        float* y = ws_.moe_y.data() + r * dim;
        for (int64_t i = 0; i < dim; ++i) y[i] += bias[i];
      }
    }, /*min_items_per_thread=*/16);
  }
}

// The shared experts: a dense FFN of the same normed rows, into ws_.xb2.
void ForwardPass::MoeShared(int64_t l, const MoeWeights& w, GateActivation act, ProfileSpan& span) {
  const int64_t n = n_, shared = w.shared_gate.view.shape[1];
  Grow(ws_.hb, n * shared);
  Grow(ws_.hb2, n * shared);
  span.Next("shexp_gate_up", n, WeightBytes(w.shared_gate) + WeightBytes(w.shared_up), l);
  const SameInput gate_up{{&w.shared_gate, ws_.hb.data()}, {&w.shared_up, ws_.hb2.data()}};
  kernels::MatMulSameInput(gate_up.span(), ws_.xb.data(), n, pool_);
  if (w.shared_clamp > 1e-6f) ClampGateUp(w.shared_clamp, ws_.hb.data(), ws_.hb2.data(), n * shared);
  ActivateRows(act, ws_.hb.data(), ws_.hb2.data(), n, shared, pool_);
  span.Next("shexp_down", n, WeightBytes(w.shared_down), l);
  MatMul(w.shared_down, ws_.hb.data(), n, ws_.xb2.data(), pool_);
  if (w.shared_expert_gate.data != nullptr) {
    const float* g = Floats(w.shared_expert_gate);
    const int64_t dim = hp_.dim;
    pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* x = ws_.xb.data() + t * dim;
        float dot = 0.0f;
        for (int64_t i = 0; i < dim; ++i) dot += g[i] * x[i];
        const float s = 1.0f / (1.0f + std::exp(-dot));
        float* y = ws_.xb2.data() + t * dim;
        for (int64_t i = 0; i < dim; ++i) y[i] *= s;
      }
    }, /*min_items_per_thread=*/4);
  }
}

// Each token's weighted sum of its experts' outputs, best first (then + the shared experts'),
// in the order llama.cpp adds them; one token per item.
void ForwardPass::MoeCombine(bool shared) {
  const int64_t dim = hp_.dim, k = hp_.moe.num_used;
  pool_.ParallelFor(n_, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> acc;
    if (acc.size() < static_cast<size_t>(dim)) acc.resize(dim);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const float wt = ws_.moe_weight[t * k + j];
        const float* y = ws_.moe_y.data() + static_cast<int64_t>(ws_.moe_row[t * k + j]) * dim;
        if (j == 0) {
          for (int64_t i = 0; i < dim; ++i) acc[i] = y[i] * wt;
        } else {
          for (int64_t i = 0; i < dim; ++i) acc[i] += y[i] * wt;
        }
      }
      float* out = ws_.xb2.data() + t * dim;
      if (shared) {
        for (int64_t i = 0; i < dim; ++i) out[i] = acc[i] + out[i];
      } else {
        std::memcpy(out, acc.data(), dim * sizeof(float));
      }
    }
  }, /*min_items_per_thread=*/4);
}

void ForwardPass::MoeFfn(int64_t l, const float* norm_w, const MoeWeights& w, GateActivation act,
                         const TensorView* post_norm) {
  ProfileSpan span("rms_norm", "op", n_, 0, l);
  NormRows(l, norm_w, LinearInput::kFfnIn);
  MoeRoute(l, w, span);
  const std::vector<int64_t> first = MoeGather(l, span);
  MoeExperts(l, w, act, first, span);
  if (w.has_shared()) MoeShared(l, w, act, span);
  span.Next("moe_combine", n_, 0, l);
  MoeCombine(w.has_shared());
  Residual(l, post_norm);
}

void ForwardPass::LatentAttention(int64_t l, const float* norm_w, const LatentAttentionWeights& w) {
  const MlaHParams& mla = hp_.mla;
  const int64_t n = n_, heads = hp_.num_heads, rope = hp_.rope_dims, nope = mla.nope_dim, kvr = mla.kv_lora_rank;
  const int64_t qk = nope + rope, row = kvr + rope, vh = mla.v_head_dim;
  CHECK(hp_.head_dim == row && hp_.num_kv_heads == 1);
  Grow(ws_.mla_q, n * heads * qk);
  Grow(ws_.mla_kv, n * row);
  Grow(ws_.mla_in, heads * n * std::max(nope, kvr));
  Grow(ws_.mla_out, heads * n * std::max(kvr, vh));
  Grow(ws_.mla_v, n * heads * vh);
  if (mla.q_lora_rank > 0) {
    Grow(ws_.mla_qa, n * mla.q_lora_rank);
    NormedProducts(l, norm_w, {{&w.wq_a, ws_.mla_qa.data()}, {&w.wkv_a, ws_.mla_kv.data()}}, LinearInput::kAttnIn,
                   "matmul_q_a_kv_a");
    ProfileSpan span("q_a_norm", "op", n, 0, l);
    const float* qw = Floats(w.q_a_norm);
    for (int64_t t = 0; t < n; ++t) {
      float* x = ws_.mla_qa.data() + t * mla.q_lora_rank;
      kernels::RmsNorm(x, qw, mla.q_lora_rank, hp_.rms_eps, x);
    }
    span.Next("matmul_q_b", n, WeightBytes(w.wq_b), l);
    MatMul(w.wq_b, ws_.mla_qa.data(), n, ws_.mla_q.data(), pool_);
  } else {
    NormedProducts(l, norm_w, {{&w.wq, ws_.mla_q.data()}, {&w.wkv_a, ws_.mla_kv.data()}}, LinearInput::kAttnIn,
                   "matmul_q_kv_a");
  }
  // The latent's norm and RoPE on q_pe and k_pe; one token per item.
  ProfileSpan span("rope_kv_write", "op", n, 0, l);
  auto rope_apply = hp_.rope_style == RopeStyle::kNeox ? kernels::RopeApplyNeox : kernels::RopeApply;
  const float* kv_norm = Floats(w.kv_a_norm);
  pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos_sin = ws_.rope.data() + t * rope;
      float* kv = ws_.mla_kv.data() + t * row;
      kernels::RmsNorm(kv, kv_norm, kvr, hp_.rms_eps, kv);
      rope_apply(kv + kvr, 1, static_cast<int>(rope), static_cast<int>(rope), cos_sin);
      rope_apply(ws_.mla_q.data() + t * heads * qk + nope, static_cast<int>(heads), static_cast<int>(qk),
                 static_cast<int>(rope), cos_sin);
      const int64_t slot = ws_.kv_slots[t];
      kv_.Write(l, Tables(l)[t][slot / kv_.block_size()], slot % kv_.block_size(), kv, nullptr);
    }
  }, /*min_items_per_thread=*/4);
  // Absorption: head h's q_nope rows gathered (row h * n + t) and multiplied by wk_b(h).
  span.Next("mla_absorb", n * heads, 0, l);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(ws_.mla_in.data() + (h * n + t) * nope, ws_.mla_q.data() + t * heads * qk + h * qk, nope * sizeof(float));
    }
  }
  std::vector<kernels::GroupedProduct> products(heads);
  for (int64_t h = 0; h < heads; ++h) {
    products[h] = {{&w.wk_b[h].view, w.wk_b[h].packed.get(), ws_.mla_out.data() + h * n * kvr}, h * n, n};
  }
  kernels::MatMulGrouped(products, ws_.mla_in.data(), heads * n, pool_);
  // The queries: [absorbed, q_pe] per head, times the query scale.
  const float qs = hp_.query_scale;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* q = ws_.q.data() + (t * heads + h) * row;
      const float* a = ws_.mla_out.data() + (h * n + t) * kvr;
      const float* pe = ws_.mla_q.data() + t * heads * qk + h * qk + nope;
      for (int64_t i = 0; i < kvr; ++i) q[i] = a[i] * qs;
      for (int64_t i = 0; i < rope; ++i) q[kvr + i] = pe[i] * qs;
    }
  }
  span.Next("attention", n, kv_positions_ * kv_.row_bytes(), l);
  // Causal: each token reads slots [0, its own]; an encoder's read every slot of its sequence
  // (all written above: Model::Forward checked that the batch holds its sequences whole).
  const int32_t* ends = hp_.causal ? ws_.kv_slots.data() : seq_end_slots_.data();
  kernels::Attention(ws_.q.data(), n, ends, Tables(l), kv_.Layer(l), static_cast<int>(heads), 1,
                     static_cast<int>(row), ws_.xb.data(), pool_, tracking_ ? ws_.score_rows.data() : nullptr, 0);
  if (tracking_) {
    span.Next("attention_track", n, 0, l);
    AccumulateAttention(l);
  }
  // Each head's latent output (its first kv_lora_rank values) through wv_b(h).
  span.Next("mla_values", n * heads, 0, l);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(ws_.mla_in.data() + (h * n + t) * kvr, ws_.xb.data() + (t * heads + h) * row, kvr * sizeof(float));
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    products[h] = {{&w.wv_b[h].view, w.wv_b[h].packed.get(), ws_.mla_out.data() + h * n * vh}, h * n, n};
  }
  kernels::MatMulGrouped(products, ws_.mla_in.data(), heads * n, pool_);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(ws_.mla_v.data() + (t * heads + h) * vh, ws_.mla_out.data() + (h * n + t) * vh, vh * sizeof(float));
    }
  }
  if (batch_.observer) batch_.observer->Observe(l, LinearInput::kAttnOut, ws_.mla_v.data(), n, heads * vh);
  span.Next("matmul_o", n, WeightBytes(w.wo), l);
  MatMul(w.wo, ws_.mla_v.data(), n, ws_.xb2.data(), pool_);
  Residual(l, nullptr);
}

void ForwardPass::Ffn(int64_t l, const float* norm_w, const LayerFfn& w) {
  if (hp_.moe.dense_layer(l)) {
    GatedFfn(l, norm_w, w.gate, w.up, w.down);
  } else {
    MoeFfn(l, norm_w, w.moe);
  }
}

// Final norm and lm_head only for the rows whose logits are wanted.
void ForwardPass::OutputHead(const TensorView& output_norm, const MatrixWeight& output) {
  if (end_layer_ < hp_.num_layers || !batch_.output_head) return;  // a pipeline stage: ws.x is the output
  const int64_t dim = hp_.dim;
  const int64_t num_out = batch_.num_logit_rows();
  const float* out_norm = reinterpret_cast<const float*>(output_norm.data);
  ProfileSpan span("output_norm", "op", num_out);
  for (int64_t t = 0; t < num_out; ++t) {
    kernels::RmsNorm(ws_.x.data() + batch_.logit_row(t) * dim, out_norm, dim, hp_.rms_eps, ws_.xb.data() + t * dim);
  }
  const int64_t num_hidden = static_cast<int64_t>(batch_.hidden_rows.size());
  if (num_hidden > 0) {
    Grow(ws_.hidden, num_hidden * dim);
    for (int64_t t = 0; t < num_hidden; ++t) {
      kernels::RmsNorm(ws_.x.data() + batch_.hidden_rows[t] * dim, out_norm, dim, hp_.rms_eps, ws_.hidden.data() + t * dim);
    }
  }
  const int64_t width = output.view.shape[1];  // the vocabulary, or a tensor-parallel rank's share
  Grow(ws_.logits, num_out * width);
  span.Next("lm_head", num_out, WeightBytes(output));
  MatMul(output, ws_.xb.data(), num_out, ws_.logits.data(), pool_);
  if (hp_.final_softcap > 0.0f) {  // Gemma 2, as ggml: times 1 / cap, tanh, times cap
    const float cap = hp_.final_softcap, inv = 1.0f / cap;
    for (int64_t i = 0; i < num_out * width; ++i) ws_.logits[i] = cap * std::tanh(ws_.logits[i] * inv);
  }
}

void ForwardPass::EncoderOutput() {
  const int64_t dim = hp_.dim;
  const int64_t num_hidden = static_cast<int64_t>(batch_.hidden_rows.size());
  Grow(ws_.hidden, num_hidden * dim);
  for (int64_t t = 0; t < num_hidden; ++t) {
    std::memcpy(ws_.hidden.data() + t * dim, ws_.x.data() + batch_.hidden_rows[t] * dim, dim * sizeof(float));
  }
  const int64_t num_out = batch_.num_logit_rows();
  Grow(ws_.logits, num_out * hp_.vocab_size);
  std::fill(ws_.logits.begin(), ws_.logits.begin() + num_out * hp_.vocab_size, 0.0f);
}

void ForwardPass::LayerNormRows(float* x, const TensorView& w, const TensorView& b, const char* name, int64_t layer) {
  ProfileSpan span(name, "op", n_, 0, layer);
  const int64_t dim = hp_.dim;
  const float* wf = reinterpret_cast<const float*>(w.data);
  const float* bf = reinterpret_cast<const float*>(b.data);
  pool_.ParallelFor(n_, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) kernels::LayerNorm(x + t * dim, wf, bf, dim, hp_.norm_eps, x + t * dim);
  }, /*min_items_per_thread=*/8);
}

// KV retention's tracking, after one layer's attention: each tracked token's scores become
// probabilities (a softmax per head), then each sequence's accumulator row for the layer adds
// them up. Every slot sums its tokens and heads in batch order: the result does not depend on
// the thread split.
void ForwardPass::AccumulateAttention(int64_t layer) {
  const ForwardBatch& batch = batch_;
  Workspace& ws = ws_;
  const int64_t n = n_, num_heads = hp_.num_heads;
  pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = ws.score_rows[t];
      if (row == nullptr) continue;
      const int64_t len = ws.kv_slots[t] + 1;
      for (int64_t h = 0; h < num_heads; ++h, row += len) kernels::Softmax(row, len);
    }
  });
  // Work items: slot ranges of tracked sequences.
  constexpr int64_t kChunk = 256;
  struct Item {
    int32_t seq;
    int64_t begin, end;
  };
  std::vector<Item> items;
  for (size_t s = 0; s < batch.attn_acc.size(); ++s) {
    if (batch.attn_acc[s].data == nullptr) continue;
    int64_t max_len = 0;
    for (int64_t t = 0; t < n; ++t) {
      if (batch.seq(t) == static_cast<int32_t>(s)) max_len = std::max<int64_t>(max_len, ws.kv_slots[t] + 1);
    }
    for (int64_t b = 0; b < max_len; b += kChunk) items.push_back({static_cast<int32_t>(s), b, std::min(b + kChunk, max_len)});
  }
  pool_.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Item& it = items[i];
      const ForwardBatch::AttentionAccumulator& a = batch.attn_acc[it.seq];
      float* acc = a.data + layer * a.stride;
      for (int64_t t = 0; t < n; ++t) {
        if (batch.seq(t) != it.seq) continue;
        const int64_t len = ws.kv_slots[t] + 1;
        const int64_t stop = std::min(it.end, len);
        if (stop <= it.begin) continue;
        for (int64_t h = 0; h < num_heads; ++h) {
          kernels::Axpy(1.0f, ws.score_rows[t] + h * len + it.begin, acc + it.begin, stop - it.begin);
        }
      }
    }
  });
}

}  // namespace gale
