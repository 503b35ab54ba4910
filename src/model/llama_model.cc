// Llama forward pass: embed, then per layer RMSNorm -> QKV -> RoPE -> cache write -> attention ->
// output projection -> residual, RMSNorm -> SwiGLU MLP -> residual; final norm and lm_head.
#include "model/llama_model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <tuple>

#include <fmt/format.h>

#include "base/check.h"
#include "base/profiler.h"
#include "kernels/kernels.h"

namespace gale {
namespace {

Status ExpectShape(const GgufFile& file, const std::string& name, std::vector<int64_t> shape,
                   TensorView* out) {
  auto t = file.Tensor(name);
  if (!t.ok()) return t.status();
  if (t->shape != shape) {
    std::string want, got;
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : t->shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
    return InvalidArgument("tensor {}: expected shape [{}], got [{}]", name, want, got);
  }
  if (shape.size() == 1 && t->type != GgmlType::kF32) {
    return InvalidArgument("tensor {}: norm weights must be f32, got {}", name, TypeName(static_cast<uint32_t>(t->type)));
  }
  *out = std::move(*t);
  return Status::Ok();
}

void MatMul(const MatrixWeight& w, const float* x, int64_t num_tokens, float* y, ThreadPool& pool) {
  kernels::MatMul(w.view, w.packed.get(), x, num_tokens, y, pool);
}

// Products of one input given as the matrices and their outputs.
struct SameInput {
  kernels::MatMulOutput o[3];
  size_t n = 0;
  SameInput(std::initializer_list<std::pair<const MatrixWeight*, float*>> outs) {
    CHECK(outs.size() <= std::size(o));
    for (const auto& [w, y] : outs) o[n++] = {&w->view, w->packed.get(), y};
  }
  std::span<const kernels::MatMulOutput> span() const { return {o, n}; }
};

void Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}


// KV retention's tracking, after one layer's attention: each tracked token's scores become
// probabilities (a softmax per head), then each sequence's accumulator row for the layer adds
// them up. Every slot sums its tokens and heads in batch order: the result does not depend on
// the thread split.
void AccumulateAttention(const ForwardBatch& batch, Workspace& ws, int64_t layer, int64_t num_heads, ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
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
  pool.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t begin, int64_t end) {
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

}  // namespace

KvCache::KvCache(const LlamaHParams& hp, int64_t capacity_tokens, int64_t num_seqs, kernels::KvType type,
                 int64_t block_size, std::optional<kernels::KvType> v_type)
    : capacity_tokens_(capacity_tokens),
      storage_(hp.num_layers, hp.num_kv_heads, hp.head_dim, num_seqs * ((capacity_tokens + block_size - 1) / block_size),
               block_size, type, v_type.value_or(type)) {
  const int64_t per_seq = (capacity_tokens + block_size - 1) / block_size;
  tables_.resize(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t i = 0; i < per_seq; ++i) tables_[s].push_back(static_cast<int32_t>(s * per_seq + i));
  }
}

void KvCache::Attach(ForwardBatch& batch) const {
  batch.block_tables.clear();
  for (const auto& t : tables_) batch.block_tables.emplace_back(t);
}

// The calibrated key statistics, if the file has them: both arrays or neither, [num_layers *
// kv_dim] finite f32 each, scales > 0.
static StatusOr<KeyChannels> ReadKeyChannels(const GgufFile& file, const LlamaHParams& hp) {
  const GgufValue* shift = file.Find(kKeyShiftKey);
  const GgufValue* scale = file.Find(kKeyScaleKey);
  KeyChannels kc;
  if (shift == nullptr && scale == nullptr) return kc;
  const size_t n = static_cast<size_t>(hp.num_layers * hp.kv_dim());
  for (auto [key, v, out] : {std::tuple{kKeyShiftKey, shift, &kc.shift}, std::tuple{kKeyScaleKey, scale, &kc.scale}}) {
    if (v == nullptr) return InvalidArgument("metadata has {} without {}", shift ? kKeyShiftKey : kKeyScaleKey, key);
    if (!v->IsArrayOf(GgufValueType::kFloat32) || v->array.size() != n) {
      return InvalidArgument("metadata {}: expected an array of {} float32 (layers x KV channels)", key, n);
    }
    for (const GgufValue& e : v->array) {
      const float f = static_cast<float>(e.AsDouble().value_or(0.0));
      if (!std::isfinite(f) || (out == &kc.scale && !(f > 0.0f))) {
        return InvalidArgument("metadata {}: value {} is not {}", key, f, out == &kc.scale ? "a positive number" : "finite");
      }
      out->push_back(f);
    }
  }
  return kc;
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const GgufFile& file) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  ASSIGN_OR_RETURN(m->hp_, ReadLlamaHParams(file));
  LlamaHParams& hp = m->hp_;

  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return NotFound("tensor token_embd.weight not found");
  if (embd->shape.size() != 2 || embd->shape[0] != hp.dim) {
    return InvalidArgument("tensor token_embd.weight: expected shape [{}, vocab]", hp.dim);
  }
  hp.vocab_size = embd->shape[1];
  if (hp.vocab_size <= 0 || hp.vocab_size > (1 << 24)) return InvalidArgument("vocab size {} out of range", hp.vocab_size);

  RETURN_IF_ERROR(ExpectShape(file, "token_embd.weight", {hp.dim, hp.vocab_size}, &m->token_embd_));
  RETURN_IF_ERROR(ExpectShape(file, "output_norm.weight", {hp.dim}, &m->output_norm_));
  if (file.FindTensor("output.weight") != nullptr) {
    RETURN_IF_ERROR(ExpectShape(file, "output.weight", {hp.dim, hp.vocab_size}, &m->output_.view));
  } else {
    m->output_.view = m->token_embd_;
    m->tied_output_ = true;
  }
  const int64_t kv_dim = hp.kv_dim();
  m->layers_.resize(hp.num_layers);
  for (int64_t l = 0; l < hp.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LlamaLayerWeights& w = m->layers_[l];
    RETURN_IF_ERROR(ExpectShape(file, b + "attn_norm.weight", {hp.dim}, &w.attn_norm));
    RETURN_IF_ERROR(ExpectShape(file, b + "attn_q.weight", {hp.dim, hp.dim}, &w.wq.view));
    RETURN_IF_ERROR(ExpectShape(file, b + "attn_k.weight", {hp.dim, kv_dim}, &w.wk.view));
    RETURN_IF_ERROR(ExpectShape(file, b + "attn_v.weight", {hp.dim, kv_dim}, &w.wv.view));
    RETURN_IF_ERROR(ExpectShape(file, b + "attn_output.weight", {hp.dim, hp.dim}, &w.wo.view));
    RETURN_IF_ERROR(ExpectShape(file, b + "ffn_norm.weight", {hp.dim}, &w.ffn_norm));
    RETURN_IF_ERROR(ExpectShape(file, b + "ffn_gate.weight", {hp.dim, hp.ffn_dim}, &w.w_gate.view));
    RETURN_IF_ERROR(ExpectShape(file, b + "ffn_up.weight", {hp.dim, hp.ffn_dim}, &w.w_up.view));
    RETURN_IF_ERROR(ExpectShape(file, b + "ffn_down.weight", {hp.ffn_dim, hp.dim}, &w.w_down.view));
  }
  // Llama 3.1-3.3's frequency scaling: llama.cpp's converter stores it as per-frequency divisors.
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    TensorView f;
    RETURN_IF_ERROR(ExpectShape(file, "rope_freqs.weight", {hp.rope_dims / 2}, &f));
    if (f.type != GgmlType::kF32) return InvalidArgument("tensor rope_freqs.weight: expected f32");
    m->rope_freq_factors_.resize(static_cast<size_t>(hp.rope_dims / 2));
    std::memcpy(m->rope_freq_factors_.data(), f.data, m->rope_freq_factors_.size() * sizeof(float));
    for (float v : m->rope_freq_factors_) {
      if (!(v > 0.0f) || !std::isfinite(v)) return InvalidArgument("tensor rope_freqs.weight: factor {} is not positive", v);
    }
  }
  // Every tensor is used or named: a file with more (another architecture's, a newer feature's)
  // must not run silently without it.
  {
    std::vector<std::string> unused;
    for (const auto& t : file.tensors()) {
      const std::string& n = t.name;
      if (n == "token_embd.weight" || n == "output_norm.weight" || n == "output.weight" || n == "rope_freqs.weight") continue;
      bool known = false;
      if (n.rfind("blk.", 0) == 0) {
        const size_t dot = n.find('.', 4);
        const std::string rest = dot == std::string::npos ? "" : n.substr(dot + 1);
        for (const char* k : {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                              "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}) {
          known = known || rest == k;
        }
        int64_t layer = -1;
        try {
          layer = std::stoll(n.substr(4, dot - 4));
        } catch (...) {
        }
        known = known && layer >= 0 && layer < hp.num_layers;
      }
      if (!known) unused.push_back(n);
    }
    if (!unused.empty()) {
      m->load_warnings_.push_back(fmt::format("{} tensor(s) of the file are not used by gale's llama architecture "
                                              "(first: '{}'): the output may differ from the model's",
                                              unused.size(), unused[0]));
    }
  }
  for (const auto& t : file.tensors()) m->weight_bytes_ += t.num_bytes;
  ASSIGN_OR_RETURN(m->key_channels_, ReadKeyChannels(file, hp));
  return m;
}

template <typename Self>
auto LlamaModel::MatricesOf(Self& self) -> std::vector<decltype(&self.output_)> {
  std::vector<decltype(&self.output_)> all;
  for (auto& l : self.layers_) {
    for (auto* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) all.push_back(w);
  }
  all.push_back(&self.output_);
  return all;
}

uint64_t LlamaModel::packed_bytes() const {
  uint64_t total = 0;
  for (const MatrixWeight* w : MatricesOf(*this)) {
    if (w->packed) {
      const int64_t groups = (w->packed->num_rows + kernels::kPackedRowGroup - 1) / kernels::kPackedRowGroup;
      total += static_cast<uint64_t>(w->packed->group_bytes * groups);
    }
  }
  return total;
}

void LlamaModel::PackWeights(GgufFile* release_sources) {
  const std::vector<MatrixWeight*> all = MatricesOf(*this);
  for (const MatrixWeight* w : all) {
    if (w->view.data == nullptr) return;  // released by an earlier call: keep the packed copies
  }
  // One buffer for all, each matrix 64-byte aligned in it.
  std::vector<int64_t> offset(all.size());
  int64_t total = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    offset[i] = total;
    total += (kernels::PackedBytesForActiveIsa(all[i]->view) + 63) / 64 * 64;
  }
  for (MatrixWeight* w : all) w->packed.reset();
  packed_buffer_.reset();
  if (total == 0) return;
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t alloc = (static_cast<size_t>(total) + kHuge - 1) / kHuge * kHuge;
  void* mem = std::aligned_alloc(kHuge, alloc);  // 2 MiB aligned: transparent huge pages can back it
  CHECK(mem != nullptr);
  madvise(mem, alloc, MADV_HUGEPAGE);
  packed_buffer_ = std::unique_ptr<uint8_t, void (*)(void*)>(static_cast<uint8_t*>(mem), std::free);
  for (size_t i = 0; i < all.size(); ++i) {
    MatrixWeight& w = *all[i];
    w.packed = kernels::PackForActiveIsa(w.view, packed_buffer_.get() + offset[i]);
    const bool shared_with_embedding = &w == &output_ && tied_output_;  // the embedding lookup reads it
    if (w.packed && release_sources != nullptr && !shared_with_embedding) {
      released_bytes_ += release_sources->ReleasePages(w.view.data, w.view.num_bytes);
      w.view.data = nullptr;  // nothing may read it again
    }
  }
}

Status LlamaModel::Forward(const ForwardBatch& batch, KvCache& kv, Workspace& ws, ThreadPool& pool) const {
  ForwardBatch b = batch;
  kv.Attach(b);
  return Forward(b, kv.storage(), ws, pool);
}

Status LlamaModel::Forward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  if (n == 0) return InvalidArgument("empty batch");
  if (batch.positions.size() != batch.tokens.size()) return InvalidArgument("batch: tokens and positions differ in length");
  if (!batch.seq_idx.empty() && batch.seq_idx.size() != batch.tokens.size()) {
    return InvalidArgument("batch: tokens and seq_idx differ in length");
  }
  if (kv.num_layers() != hp_.num_layers || kv.kv_dim() != hp_.kv_dim()) {
    return InvalidArgument("KV storage is for {} layers x {}, the model has {} x {}", kv.num_layers(), kv.kv_dim(),
                           hp_.num_layers, hp_.kv_dim());
  }
  if (!batch.slots.empty() && batch.slots.size() != batch.tokens.size()) {
    return InvalidArgument("batch: tokens and slots differ in length");
  }
  if (!batch.attn_acc.empty() && batch.attn_acc.size() != batch.block_tables.size()) {
    return InvalidArgument("batch: {} attention accumulators for {} sequences", batch.attn_acc.size(),
                           batch.block_tables.size());
  }
  const int64_t block_size = kv.block_size();
  for (int64_t i = 0; i < n; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= hp_.vocab_size) {
      return InvalidArgument("token id {} out of range [0, {})", batch.tokens[i], hp_.vocab_size);
    }
    const int32_t s = batch.seq(i);
    if (s < 0 || static_cast<size_t>(s) >= batch.block_tables.size()) {
      return InvalidArgument("seq_idx {} has no block table", s);
    }
    const auto& table = batch.block_tables[s];
    if (batch.positions[i] < 0) return InvalidArgument("negative position {}", batch.positions[i]);
    const int64_t slot = batch.slot(i);
    if (slot < 0 || slot / block_size >= static_cast<int64_t>(table.size())) {
      return InvalidArgument("slot {} outside the {} tokens of sequence {}'s blocks", slot,
                             static_cast<int64_t>(table.size()) * block_size, s);
    }
    if (!batch.attn_acc.empty() && batch.attn_acc[s].data != nullptr && slot >= batch.attn_acc[s].stride) {
      return InvalidArgument("slot {} outside sequence {}'s attention accumulator of {}", slot, s,
                             batch.attn_acc[s].stride);
    }
  }
  for (const auto& table : batch.block_tables) {
    for (int32_t b : table) {
      if (b < 0 || b >= kv.num_blocks()) return InvalidArgument("block id {} outside the {} KV blocks", b, kv.num_blocks());
    }
  }
  for (int32_t row : batch.logit_rows) {
    if (row < 0 || row >= n) return InvalidArgument("logit row {} outside the batch of {}", row, n);
  }
  const int64_t dim = hp_.dim, kv_dim = hp_.kv_dim(), ffn = hp_.ffn_dim;
  Grow(ws.x, n * dim);
  Grow(ws.xb, n * dim);
  Grow(ws.xb2, n * dim);
  Grow(ws.q, n * dim);
  Grow(ws.k, n * kv_dim);
  Grow(ws.v, n * kv_dim);
  Grow(ws.hb, n * ffn);
  Grow(ws.hb2, n * ffn);

  {
    ProfileSpan span("embed", "op", n);
    kernels::GetRows(token_embd_, batch.tokens.data(), n, ws.x.data());
  }
  Grow(ws.rope, n * hp_.rope_dims);
  for (int64_t t = 0; t < n; ++t) {
    kernels::RopeAngles(static_cast<int>(hp_.rope_dims), batch.positions[t], hp_.rope_freq_base, hp_.rope_freq_scale,
                        ws.rope.data() + t * hp_.rope_dims,
                        rope_freq_factors_.empty() ? nullptr : rope_freq_factors_.data());
  }
  ws.tables.resize(n);
  for (int64_t t = 0; t < n; ++t) ws.tables[t] = batch.block_tables[batch.seq(t)].data();
  ws.kv_slots.resize(n);
  for (int64_t t = 0; t < n; ++t) ws.kv_slots[t] = batch.slot(t);
  int64_t kv_positions = 0;  // cache rows attention reads per layer, for the profile's bytes
  for (int64_t t = 0; t < n; ++t) kv_positions += ws.kv_slots[t] + 1;
  // Tokens whose attention is tracked get rows for their scores.
  const int64_t num_heads = hp_.num_heads;
  bool tracking = false;
  ws.score_rows.assign(n, nullptr);
  if (!batch.attn_acc.empty()) {
    size_t total = 0;
    std::vector<size_t> offset(n, 0);
    for (int64_t t = 0; t < n; ++t) {
      if (batch.attn_acc[batch.seq(t)].data == nullptr) continue;
      offset[t] = total;
      total += static_cast<size_t>(num_heads) * (ws.kv_slots[t] + 1);
      tracking = true;
    }
    Grow(ws.scores, total);
    for (int64_t t = 0; t < n; ++t) {
      if (batch.attn_acc[batch.seq(t)].data != nullptr) ws.score_rows[t] = ws.scores.data() + offset[t];
    }
  }
  auto bytes = [](const MatrixWeight& w) { return static_cast<int64_t>(w.view.num_bytes); };
  const bool key_channels = kv.key_channels() && !key_channels_.empty();
  const int64_t group = hp_.num_heads / hp_.num_kv_heads;

  for (int64_t l = 0; l < hp_.num_layers; ++l) {
    const LlamaLayerWeights& w = layers_[l];
    const float* attn_norm = reinterpret_cast<const float*>(w.attn_norm.data);
    // RmsNorm then products of the normalized rows; fused into the activations' quantization
    // where all products read quantized activations (then the span of the products includes
    // the norm), except under calibration, which observes the normalized rows.
    auto normed_products = [&](const float* norm_w, const SameInput& outs, LinearInput which, const char* name,
                               int64_t weight_bytes) {
      if (batch.observer == nullptr && kernels::ReadQuantizedActivations(outs.span())) {
        ProfileSpan span(name, "op", n, weight_bytes, l);
        kernels::MatMulSameInputNormed(outs.span(), {ws.x.data(), norm_w, hp_.rms_eps}, n, pool);
        return;
      }
      ProfileSpan span("rms_norm", "op", n, 0, l);
      pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          kernels::RmsNorm(ws.x.data() + t * dim, norm_w, dim, hp_.rms_eps, ws.xb.data() + t * dim);
        }
      }, /*min_items_per_thread=*/8);
      if (batch.observer) batch.observer->Observe(l, which, ws.xb.data(), n, dim);
      span.Next(name, n, weight_bytes, l);
      kernels::MatMulSameInput(outs.span(), ws.xb.data(), n, pool);
    };
    normed_products(attn_norm, {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                    LinearInput::kAttnIn, "matmul_qkv", bytes(w.wq) + bytes(w.wk) + bytes(w.wv));
    {  // the span chain rope_kv_write .. matmul_o ends before the next norm's own spans
      ProfileSpan span("rope_kv_write", "op", n, 0, l);
      // One token per item: its rotation, key transform and cache write do not depend on the split.
      const float* shift = key_channels ? key_channels_.shift.data() + l * kv_dim : nullptr;
      const float* kscale = key_channels ? key_channels_.scale.data() + l * kv_dim : nullptr;
      auto rope = [&](int64_t t) {
        const float* cos_sin = ws.rope.data() + t * hp_.rope_dims;
        kernels::RopeApply(ws.q.data() + t * dim, static_cast<int>(hp_.num_heads), static_cast<int>(hp_.head_dim),
                           static_cast<int>(hp_.rope_dims), cos_sin);
        kernels::RopeApply(ws.k.data() + t * kv_dim, static_cast<int>(hp_.num_kv_heads), static_cast<int>(hp_.head_dim),
                           static_cast<int>(hp_.rope_dims), cos_sin);
      };
      auto store = [&](int64_t t) {
        float* k = ws.k.data() + t * kv_dim;
        if (shift != nullptr) {
          float* q = ws.q.data() + t * dim;
          for (int64_t c = 0; c < kv_dim; ++c) k[c] = (k[c] - shift[c]) / kscale[c];
          for (int64_t h = 0; h < hp_.num_heads; ++h) {
            const float* s = kscale + (h / group) * hp_.head_dim;
            for (int64_t d = 0; d < hp_.head_dim; ++d) q[h * hp_.head_dim + d] *= s[d];
          }
        }
        const int64_t pos = ws.kv_slots[t];
        const auto& table = batch.block_tables[batch.seq(t)];
        kv.Write(l, table[pos / block_size], pos % block_size, k, ws.v.data() + t * kv_dim);
      };
      if (batch.observer != nullptr) {  // calibration sees the keys between the two
        for (int64_t t = 0; t < n; ++t) rope(t);
        batch.observer->ObserveKeys(l, ws.k.data(), n, kv_dim);
        for (int64_t t = 0; t < n; ++t) store(t);
      } else {
        pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            rope(t);
            store(t);
          }
        }, /*min_items_per_thread=*/4);
      }
      span.Next("attention", n, kv_positions * 2 * kv.row_bytes(), l);
      kernels::Attention(ws.q.data(), n, ws.kv_slots.data(), ws.tables.data(), kv.Layer(l),
                         static_cast<int>(hp_.num_heads), static_cast<int>(hp_.num_kv_heads),
                         static_cast<int>(hp_.head_dim), ws.xb.data(), pool, tracking ? ws.score_rows.data() : nullptr);
      if (tracking) {
        span.Next("attention_track", n, 0, l);
        AccumulateAttention(batch, ws, l, num_heads, pool);
      }
      if (batch.observer) batch.observer->Observe(l, LinearInput::kAttnOut, ws.xb.data(), n, dim);
      span.Next("matmul_o", n, bytes(w.wo), l);
      MatMul(w.wo, ws.xb.data(), n, ws.xb2.data(), pool);
      for (int64_t i = 0; i < n * dim; ++i) ws.x[i] += ws.xb2[i];
    }

    const float* ffn_norm = reinterpret_cast<const float*>(w.ffn_norm.data);
    normed_products(ffn_norm, {{&w.w_gate, ws.hb.data()}, {&w.w_up, ws.hb2.data()}}, LinearInput::kFfnIn,
                    "matmul_gate_up", bytes(w.w_gate) + bytes(w.w_up));
    ProfileSpan span("silu_mul", "op", n, 0, l);
    // One token row per item: an element's arithmetic does not depend on the split.
    pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
      kernels::SiluMul(ws.hb.data() + begin * ffn, ws.hb2.data() + begin * ffn, (end - begin) * ffn);
    });
    if (batch.observer) batch.observer->Observe(l, LinearInput::kFfnMid, ws.hb.data(), n, ffn);
    span.Next("matmul_down", n, bytes(w.w_down), l);
    MatMul(w.w_down, ws.hb.data(), n, ws.xb2.data(), pool);
    for (int64_t i = 0; i < n * dim; ++i) ws.x[i] += ws.xb2[i];
  }

  // Final norm and lm_head only for the rows whose logits are wanted.
  auto out_row = [&](int64_t i) -> int64_t {
    if (!batch.logit_rows.empty()) return batch.logit_rows[i];
    return batch.all_logits ? i : n - 1;
  };
  const int64_t num_out = !batch.logit_rows.empty() ? static_cast<int64_t>(batch.logit_rows.size())
                                                     : (batch.all_logits ? n : 1);
  const float* out_norm = reinterpret_cast<const float*>(output_norm_.data);
  ProfileSpan span("output_norm", "op", num_out);
  for (int64_t t = 0; t < num_out; ++t) {
    kernels::RmsNorm(ws.x.data() + out_row(t) * dim, out_norm, dim, hp_.rms_eps, ws.xb.data() + t * dim);
  }
  Grow(ws.logits, num_out * hp_.vocab_size);
  span.Next("lm_head", num_out, static_cast<int64_t>(output_.view.num_bytes));
  MatMul(output_, ws.xb.data(), num_out, ws.logits.data(), pool);
  return Status::Ok();
}

}  // namespace gale
