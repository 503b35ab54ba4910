// The shared blocks of a decoder forward pass, cut from the llama forward: each keeps that
// forward's arithmetic and thread split exactly, so every architecture built from them keeps
// batch invariance.
#include "model/blocks.h"

#include <algorithm>
#include <vector>

#include "base/profiler.h"

namespace gale {
namespace {

void Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

void MatMul(const MatrixWeight& w, const float* x, int64_t num_tokens, float* y, ThreadPool& pool) {
  kernels::MatMul(w.view, w.packed.get(), x, num_tokens, y, pool);
}

ForwardPass::ForwardPass(const ModelHParams& hp, const ForwardBatch& batch, KvStorage& kv, Workspace& ws,
                         ThreadPool& pool, const float* freq_factors)
    : hp_(hp), batch_(batch), kv_(kv), ws_(ws), pool_(pool), n_(static_cast<int64_t>(batch.tokens.size())) {
  const int64_t n = n_;
  const int64_t dim = hp.dim, q_dim = hp.q_dim(), kv_dim = hp.kv_dim(), ffn = hp.ffn_dim;
  Grow(ws.x, n * dim);
  Grow(ws.xb, n * std::max(dim, q_dim));
  Grow(ws.xb2, n * dim);
  Grow(ws.q, n * q_dim);
  Grow(ws.k, n * kv_dim);
  Grow(ws.v, n * kv_dim);
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
    Grow(ws.rope_swa, n * hp.rope_dims);
    for (int64_t t = 0; t < n; ++t) {
      kernels::RopeAngles(static_cast<int>(hp.rope_dims), batch.positions[t], hp.rope_freq_base_swa, 1.0f,
                          ws.rope_swa.data() + t * hp.rope_dims);
    }
  }
  ws.tables.resize(n);
  for (int64_t t = 0; t < n; ++t) ws.tables[t] = batch.block_tables[batch.seq(t)].data();
  ws.kv_slots.resize(n);
  for (int64_t t = 0; t < n; ++t) ws.kv_slots[t] = batch.slot(t);
  for (int64_t t = 0; t < n; ++t) kv_positions_ += ws.kv_slots[t] + 1;
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
  const int64_t n = n_, dim = hp_.dim;
  int64_t weight_bytes = 0;
  for (const kernels::MatMulOutput& o : outs.span()) weight_bytes += static_cast<int64_t>(o.w->num_bytes);
  if (batch_.observer == nullptr && kernels::ReadQuantizedActivations(outs.span())) {
    ProfileSpan span(name, "op", n, weight_bytes, l);
    kernels::MatMulSameInputNormed(outs.span(), {ws_.x.data(), norm_w, hp_.rms_eps}, n, pool_);
    return;
  }
  ProfileSpan span("rms_norm", "op", n, 0, l);
  pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      kernels::RmsNorm(ws_.x.data() + t * dim, norm_w, dim, hp_.rms_eps, ws_.xb.data() + t * dim);
    }
  }, /*min_items_per_thread=*/8);
  if (batch_.observer) batch_.observer->Observe(l, which, ws_.xb.data(), n, dim);
  span.Next(name, n, weight_bytes, l);
  kernels::MatMulSameInput(outs.span(), ws_.xb.data(), n, pool_);
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

void ForwardPass::Attention(int64_t l, const KeyChannels* key_channels) {
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
  auto rope = [&](int64_t t) {
    const float* cos_sin = angles + t * hp_.rope_dims;
    float* q = ws_.q.data() + t * q_dim;
    rope_apply(q, static_cast<int>(hp_.num_heads), static_cast<int>(head_dim), static_cast<int>(hp_.rope_dims), cos_sin);
    rope_apply(ws_.k.data() + t * kv_dim, static_cast<int>(hp_.num_kv_heads), static_cast<int>(head_dim),
               static_cast<int>(hp_.rope_dims), cos_sin);
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
    const int64_t pos = ws_.kv_slots[t];
    const auto& table = batch_.block_tables[batch_.seq(t)];
    kv_.Write(l, table[pos / block_size], pos % block_size, k, ws_.v.data() + t * kv_dim);
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
  kernels::Attention(ws_.q.data(), n, ws_.kv_slots.data(), ws_.tables.data(), kv_.Layer(l),
                     static_cast<int>(hp_.num_heads), static_cast<int>(hp_.num_kv_heads), static_cast<int>(head_dim),
                     ws_.xb.data(), pool_, tracking_ ? ws_.score_rows.data() : nullptr, window);
  if (tracking_) {
    span.Next("attention_track", n, 0, l);
    AccumulateAttention(l);
  }
}

void ForwardPass::OutputProjection(int64_t l, const MatrixWeight& wo, const TensorView* post_norm) {
  const int64_t n = n_;
  if (batch_.observer) batch_.observer->Observe(l, LinearInput::kAttnOut, ws_.xb.data(), n, hp_.q_dim());
  ProfileSpan span("matmul_o", "op", n, WeightBytes(wo), l);
  MatMul(wo, ws_.xb.data(), n, ws_.xb2.data(), pool_);
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
  for (int64_t i = 0; i < n * dim; ++i) ws_.x[i] += ws_.xb2[i];
}

void ForwardPass::GatedFfn(int64_t l, const float* norm_w, const MatrixWeight& gate, const MatrixWeight& up,
                           const MatrixWeight& down, GateActivation act, const TensorView* post_norm) {
  const int64_t n = n_, ffn = hp_.ffn_dim;
  NormedProducts(l, norm_w, {{&gate, ws_.hb.data()}, {&up, ws_.hb2.data()}}, LinearInput::kFfnIn, "matmul_gate_up");
  {
    ProfileSpan span(act == GateActivation::kSilu ? "silu_mul" : "gelu_mul", "op", n, 0, l);
    // One token row per item: an element's arithmetic does not depend on the split.
    pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
      if (act == GateActivation::kSilu) {
        kernels::SiluMul(ws_.hb.data() + begin * ffn, ws_.hb2.data() + begin * ffn, (end - begin) * ffn);
      } else {
        kernels::GeluTanhMul(ws_.hb.data() + begin * ffn, ws_.hb2.data() + begin * ffn, (end - begin) * ffn);
      }
    });
    if (batch_.observer) batch_.observer->Observe(l, LinearInput::kFfnMid, ws_.hb.data(), n, ffn);
    span.Next("matmul_down", n, WeightBytes(down), l);
    MatMul(down, ws_.hb.data(), n, ws_.xb2.data(), pool_);
  }
  Residual(l, post_norm);
}

// Final norm and lm_head only for the rows whose logits are wanted.
void ForwardPass::OutputHead(const TensorView& output_norm, const MatrixWeight& output) {
  const int64_t n = n_, dim = hp_.dim;
  auto out_row = [&](int64_t i) -> int64_t {
    if (!batch_.logit_rows.empty()) return batch_.logit_rows[i];
    return batch_.all_logits ? i : n - 1;
  };
  const int64_t num_out = !batch_.logit_rows.empty() ? static_cast<int64_t>(batch_.logit_rows.size())
                                                      : (batch_.all_logits ? n : 1);
  const float* out_norm = reinterpret_cast<const float*>(output_norm.data);
  ProfileSpan span("output_norm", "op", num_out);
  for (int64_t t = 0; t < num_out; ++t) {
    kernels::RmsNorm(ws_.x.data() + out_row(t) * dim, out_norm, dim, hp_.rms_eps, ws_.xb.data() + t * dim);
  }
  const int64_t num_hidden = static_cast<int64_t>(batch_.hidden_rows.size());
  if (num_hidden > 0) {
    Grow(ws_.hidden, num_hidden * dim);
    for (int64_t t = 0; t < num_hidden; ++t) {
      kernels::RmsNorm(ws_.x.data() + batch_.hidden_rows[t] * dim, out_norm, dim, hp_.rms_eps, ws_.hidden.data() + t * dim);
    }
  }
  Grow(ws_.logits, num_out * hp_.vocab_size);
  span.Next("lm_head", num_out, WeightBytes(output));
  MatMul(output, ws_.xb.data(), num_out, ws_.logits.data(), pool_);
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
