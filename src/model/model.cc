// What every architecture shares: the fixed-sequence cache, the calibrated key statistics, the
// common tensors, weight packing, and the checks of a batch before an architecture runs it.
#include "model/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include <fmt/format.h>

#include "base/check.h"

#include "model/sharding.h"
#include "model/weights.h"

namespace gale {

KvLayout KvLayoutOf(const ModelHParams& hp) {
  KvLayout l;
  l.num_kv_heads = hp.num_kv_heads;
  l.head_dim = hp.head_dim;
  l.v_head_dim = hp.value_head();
  l.latent = hp.kv_latent;
  for (int64_t i = 0; i < hp.kv_num_layers(); ++i) l.windows.push_back(hp.KvLayerWindow(i));
  l.state_floats = hp.recurrent_state_floats;
  return l;
}

namespace {
// A fixed cache's storage: every group's blocks for each sequence's capacity.
KvStorage FixedStorage(const ModelHParams& hp, int64_t blocks_per_seq, int64_t num_seqs, kernels::KvType k_type,
                       int64_t block_size, kernels::KvType v_type, bool window_groups) {
  const KvLayout layout = KvLayoutOf(hp);
  const KvLayerGroups groups = layout.Groups(window_groups);
  return KvStorage(layout, groups, groups.num_groups() * num_seqs * blocks_per_seq, block_size, k_type, v_type);
}
}  // namespace

KvCache::KvCache(const ModelHParams& hp, int64_t capacity_tokens, int64_t num_seqs, kernels::KvType type,
                 int64_t block_size, std::optional<kernels::KvType> v_type, bool window_groups)
    : capacity_tokens_(capacity_tokens),
      storage_(FixedStorage(hp, (capacity_tokens + block_size - 1) / block_size, num_seqs, type, block_size,
                            v_type.value_or(type), window_groups)) {
  const int64_t per_seq = (capacity_tokens + block_size - 1) / block_size;
  storage_.ReserveStates(num_seqs, hp.recurrent_state_floats);  // sequence s in slot s
  tables_.resize(storage_.num_groups() * num_seqs);
  for (size_t t = 0; t < tables_.size(); ++t) {
    for (int64_t i = 0; i < per_seq; ++i) tables_[t].push_back(static_cast<int32_t>(static_cast<int64_t>(t) * per_seq + i));
  }
}

void KvCache::Attach(ForwardBatch& batch) const {
  batch.block_tables.clear();
  for (const auto& t : tables_) batch.block_tables.emplace_back(t);
}

// The calibrated key statistics, if the file has them: both arrays or neither, [num_layers *
// kv_dim] finite f32 each, scales > 0.
static StatusOr<KeyChannels> ReadKeyChannels(const GgufFile& file, const ModelHParams& hp) {
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

Status Model::LoadCommon(const GgufFile& file, TensorLoader& tensors) {
  ModelHParams& hp = hp_;
  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return NotFound("tensor token_embd.weight not found");
  if (embd->shape.size() != 2 || embd->shape[0] != hp.dim) {
    return InvalidArgument("tensor token_embd.weight: expected shape [{}, vocab]", hp.dim);
  }
  hp.vocab_size = embd->shape[1];
  if (hp.vocab_size <= 0 || hp.vocab_size > (1 << 24)) return InvalidArgument("vocab size {} out of range", hp.vocab_size);
  RETURN_IF_ERROR(tensors.Get("token_embd.weight", {hp.dim, hp.vocab_size}, &token_embd_));
  if (hp.causal) {  // an encoder (BERT) has no final norm and no language-model head
    RETURN_IF_ERROR(tensors.Vector("output_norm.weight", hp.dim, &output_norm_));
    if (tensors.Has("output.weight")) {
      RETURN_IF_ERROR(tensors.Matrix("output.weight", hp.dim, hp.vocab_size, &output_));
    } else {
      output_.view = token_embd_;
      tied_output_ = true;
    }
  }
  for (const auto& t : file.tensors()) weight_bytes_ += t.num_bytes;
  ASSIGN_OR_RETURN(key_channels_, ReadKeyChannels(file, hp));
  return Status::Ok();
}

void Model::FinishLoad(const TensorLoader& tensors) {
  std::vector<std::string> unused = tensors.Unused();
  // The multi-token-prediction layers (nextn_predict_layers, after the model's layers): present
  // by design, not run.
  std::erase_if(unused, [&](const std::string& name) {
    for (int64_t l = hp_.num_layers; l < hp_.num_layers + hp_.num_nextn_layers; ++l) {
      if (name.starts_with("blk." + std::to_string(l) + ".")) return true;
    }
    return false;
  });
  if (!unused.empty()) {
    load_warnings_.push_back(fmt::format("{} tensor(s) of the file are not used by gale's {} architecture "
                                         "(first: '{}'): the output may differ from the model's",
                                         unused.size(), hp_.arch, unused[0]));
  }
}

uint64_t Model::packed_bytes() const {
  uint64_t total = 0;
  for (const MatrixWeight* w : const_cast<Model*>(this)->Matrices()) {
    if (w->packed) {
      const int64_t groups = (w->packed->num_rows + kernels::kPackedRowGroup - 1) / kernels::kPackedRowGroup;
      total += static_cast<uint64_t>(w->packed->group_bytes * groups);
    }
  }
  return total;
}

std::vector<MatrixWeight*> Model::Matrices(int64_t first_layer, int64_t end_layer, bool with_output) {
  std::vector<MatrixWeight*> all;
  for (int64_t l = first_layer; l < end_layer; ++l) {
    for (MatrixWeight* w : LayerMatrices(l)) {
      if (w->parts.empty()) {
        all.push_back(w);
      } else {
        for (MatrixWeight& p : w->parts) all.push_back(&p);
      }
    }
  }
  if (with_output && !output_.view.shape.empty()) all.push_back(&output_);
  return all;
}

void Model::PackWeights(GgufFile* release_sources, int64_t first_layer, int64_t end_layer, bool with_output) {
  if (end_layer < 0) end_layer = hp_.num_layers;
  CHECK(0 <= first_layer && first_layer < end_layer && end_layer <= hp_.num_layers);
  const std::vector<MatrixWeight*> all = Matrices(first_layer, end_layer, with_output);
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
  packed_alloc_ = alloc;
  for (size_t i = 0; i < all.size(); ++i) {
    MatrixWeight& w = *all[i];
    w.packed = kernels::PackForActiveIsa(w.view, packed_buffer_.get() + offset[i]);
    const bool shared_with_embedding = &w == &output_ && tied_output_;  // the embedding lookup reads it
    auto owned = std::find_if(shard_bytes_.begin(), shard_bytes_.end(),
                              [&w](const std::unique_ptr<uint8_t[]>& b) { return b.get() == w.view.data; });
    if (w.packed && release_sources != nullptr && owned != shard_bytes_.end()) {
      owned->reset();  // a tensor-parallel column block's copy: the packed copy replaces it
      w.view.data = nullptr;
    } else if (w.packed && release_sources != nullptr && !shared_with_embedding) {
      released_bytes_ += release_sources->ReleasePages(w.view.data, w.view.num_bytes);
      w.view.data = nullptr;  // nothing may read it again
    }
  }
}

Status Model::ShardLayer(int64_t /*layer*/, const TensorSharder& /*sharder*/) {
  return Unimplemented("tensor parallelism does not split gale's {} architecture yet (it splits llama, qwen2, qwen3, "
                       "phi3, gemma2 and gemma3)", hp_.arch);
}

Status Model::ShardForTensorParallel(const TensorSplit& split) {
  if (split.ranks < 1 || split.rank < 0 || split.rank >= split.ranks || split.slices < split.ranks ||
      split.slices % split.ranks != 0) {
    return InvalidArgument("tensor parallelism: {} slices over {} ranks (the slices must be a multiple of the ranks)",
                           split.slices, split.ranks);
  }
  const int k = split.num_slices();
  if ((k & (k - 1)) != 0) {
    return InvalidArgument("tensor parallelism: {} slices per rank; it must be a power of two (the fixed order of "
                           "the sums needs it)", k);
  }
  if (split_.on()) return Internal("the model is already split for tensor parallelism");
  if (!split.on()) return Status::Ok();
  for (MatrixWeight* w : Matrices()) {
    if (w->packed) return Internal("tensor parallelism: the model must be split before its weights are packed");
  }
  if (!hp_.causal) return Unimplemented("tensor parallelism: an encoder ({}) runs in one process", hp_.arch);
  if (hp_.moe.enabled() || hp_.mla.enabled() || hp_.kv_latent) {
    return Unimplemented("tensor parallelism splits dense attention and FFNs; {}'s {} is not split yet", hp_.arch,
                         hp_.mla.enabled() || hp_.kv_latent ? "latent attention" : "mixture of experts");
  }
  const int64_t s = split.slices;
  ASSIGN_OR_RETURN(const TensorSharder::HeadRange kv, TensorSharder::KvHeads(split, hp_.num_heads, hp_.num_kv_heads));
  if (hp_.ffn_dim % s != 0) {
    return InvalidArgument("tensor parallelism: an FFN of {} does not divide into {} slices", hp_.ffn_dim, s);
  }
  const TensorSharder sharder(split, hp_.num_kv_heads, kv, &shard_bytes_);
  for (int64_t l = 0; l < hp_.num_layers; ++l) RETURN_IF_ERROR(ShardLayer(l, sharder));
  const int64_t kv_dim = hp_.kv_dim();
  for (std::vector<float>* v : {&key_channels_.shift, &key_channels_.scale}) {
    if (v->empty()) continue;
    std::vector<float> mine;
    for (int64_t l = 0; l < hp_.num_layers; ++l) {
      const auto row = v->begin() + l * kv_dim + kv.first * hp_.head_dim;
      mine.insert(mine.end(), row, row + kv.count * hp_.head_dim);
    }
    *v = std::move(mine);
  }
  // The output head by vocabulary rows, one share per rank (each logit is one row's product:
  // the same bits however the rows are shared out); whole on every rank where they do not divide.
  if (!output_.view.shape.empty() && hp_.vocab_size % split.ranks == 0 && split.ranks > 1) {
    RETURN_IF_ERROR(sharder.KeepRows(&output_, split.rank, 1, split.ranks, "the output layer"));
    head_count_ = hp_.vocab_size / split.ranks;
    head_first_ = head_count_ * split.rank;
  }
  hp_.num_heads = hp_.num_heads / s * k;
  hp_.num_kv_heads = kv.count;
  hp_.ffn_dim = hp_.ffn_dim / s * k;
  split_ = split;
  return Status::Ok();
}

StatusOr<uint64_t> Model::LockPackedWeights() {
  if (packed_buffer_ == nullptr) return uint64_t{0};
  if (mlock(packed_buffer_.get(), packed_alloc_) != 0) {
    return ResourceExhausted("mlock of the {} bytes of packed weights failed: {} (raise the locked-memory limit, `ulimit -l`)",
                             packed_alloc_, std::strerror(errno));
  }
  return static_cast<uint64_t>(packed_alloc_);
}

Status Model::Forward(const ForwardBatch& batch, KvCache& kv, Workspace& ws, ThreadPool& pool) const {
  ForwardBatch b = batch;
  kv.Attach(b);
  return Forward(b, kv.storage(), ws, pool);
}

Status Model::Forward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  if (n == 0) return InvalidArgument("empty batch");
  if (batch.positions.size() != batch.tokens.size()) return InvalidArgument("batch: tokens and positions differ in length");
  if (!batch.seq_idx.empty() && batch.seq_idx.size() != batch.tokens.size()) {
    return InvalidArgument("batch: tokens and seq_idx differ in length");
  }
  const int64_t end_layer = batch.end_layer < 0 ? hp_.num_layers : batch.end_layer;
  // first == end only for the head alone (a pipeline's rank 0 computing logits from the last stage's rows).
  if (batch.first_layer < 0 || batch.first_layer > end_layer || end_layer > hp_.num_layers ||
      (batch.first_layer == end_layer && end_layer != hp_.num_layers)) {
    return InvalidArgument("batch: layers [{}, {}) outside the model's {}", batch.first_layer, end_layer, hp_.num_layers);
  }
  if (batch.first_layer > 0 && batch.input == nullptr) {
    return InvalidArgument("batch: a stage from layer {} needs its input rows", batch.first_layer);
  }
  if ((batch.first_layer > 0 || end_layer < hp_.num_layers) && !hp_.causal) {
    return InvalidArgument("an encoder runs all its layers in one stage");
  }
  if (kv.num_layers() != hp_.kv_num_layers() || kv.kv_dim() != hp_.kv_dim() || kv.v_dim() != hp_.v_dim()) {
    return InvalidArgument("KV storage is for {} layers x {} (K) / {} (V), the model has {} x {} / {}", kv.num_layers(),
                           kv.kv_dim(), kv.v_dim(), hp_.kv_num_layers(), hp_.kv_dim(), hp_.v_dim());
  }
  for (int64_t l = 0; l < hp_.kv_num_layers(); ++l) {
    // A layer reads no further back than its group gives blocks back.
    const int64_t group_window = kv.groups().window[kv.groups().group_of[l]];
    const int64_t window = hp_.KvLayerWindow(l);
    if (group_window > 0 && (window == 0 || window > group_window)) {
      return InvalidArgument("KV layer group of layer {} gives back blocks behind {} positions, its window is {}", l,
                             group_window, window);
    }
  }
  if (!batch.slots.empty() && batch.slots.size() != batch.tokens.size()) {
    return InvalidArgument("batch: tokens and slots differ in length");
  }
  if (!hp_.kv_windows.empty() || hp_.recurrent_state_floats > 0) {
    bool retention = false;
    for (const auto& a : batch.attn_acc) retention = retention || a.data != nullptr;
    for (size_t i = 0; i < batch.slots.size() && !retention; ++i) retention = batch.slots[i] != batch.positions[i];
    if (retention) return Unimplemented("{}: KV retention is not supported for this architecture", hp_.arch);
  }
  if (hp_.sliding_window > 0) {
    // KV retention (slots behind positions, attention tracking) leaves windowed layers alone only
    // where they sit in layer groups of their own, which index positions.
    bool retention = false;
    for (const auto& a : batch.attn_acc) retention = retention || a.data != nullptr;
    for (size_t i = 0; i < batch.slots.size() && !retention; ++i) retention = batch.slots[i] != batch.positions[i];
    for (int64_t l = 0; l < hp_.num_layers && retention; ++l) {
      if (hp_.LayerWindow(l) > 0 && kv.groups().window[kv.groups().group_of[l]] == 0) {
        return InvalidArgument("KV retention needs the sliding-window layers in layer groups of their own (layer {} "
                               "shares blocks with full-attention layers)", l);
      }
    }
  }
  const int64_t num_groups = kv.num_groups();
  if (batch.block_tables.empty() || batch.block_tables.size() % num_groups != 0) {
    return InvalidArgument("batch: {} block tables for a cache of {} layer groups", batch.block_tables.size(), num_groups);
  }
  const int64_t num_seqs = static_cast<int64_t>(batch.block_tables.size()) / num_groups;
  if (!batch.attn_acc.empty() && static_cast<int64_t>(batch.attn_acc.size()) != num_seqs) {
    return InvalidArgument("batch: {} attention accumulators for {} sequences", batch.attn_acc.size(), num_seqs);
  }
  const int64_t block_size = kv.block_size();
  for (int64_t i = 0; i < n; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= hp_.vocab_size) {
      return InvalidArgument("token id {} out of range [0, {})", batch.tokens[i], hp_.vocab_size);
    }
    const int32_t s = batch.seq(i);
    if (s < 0 || s >= num_seqs) return InvalidArgument("seq_idx {} has no block table", s);
    if (batch.positions[i] < 0) return InvalidArgument("negative position {}", batch.positions[i]);
    for (int64_t g = 0; g < num_groups; ++g) {
      const auto& table = batch.block_tables[g * num_seqs + s];
      // Windowed groups index positions, full groups cache slots (see ForwardBatch::slots).
      const int64_t slot = kv.groups().window[g] > 0 ? batch.positions[i] : batch.slot(i);
      if (slot < 0 || slot / block_size >= static_cast<int64_t>(table.size())) {
        return InvalidArgument("slot {} outside the {} tokens of sequence {}'s blocks", slot,
                               static_cast<int64_t>(table.size()) * block_size, s);
      }
      // Every block the token reads is there: from its window's first slot (0 without one) on
      // (given-back entries are a prefix of the table: checked below).
      const int64_t window = kv.groups().window[g];
      const int64_t first = window > 0 ? std::max<int64_t>(0, slot + 1 - window) : 0;
      if (table[first / block_size] == kNoBlock) {
        return InvalidArgument("slot {} of sequence {} reads slot {}, whose block was given back", slot, s, first);
      }
    }
    if (!batch.attn_acc.empty() && batch.attn_acc[s].data != nullptr && batch.slot(i) >= batch.attn_acc[s].stride) {
      return InvalidArgument("slot {} outside sequence {}'s attention accumulator of {}", batch.slot(i), s,
                             batch.attn_acc[s].stride);
    }
  }
  for (const auto& table : batch.block_tables) {
    bool given_back = true;  // so far only kNoBlock entries
    for (int32_t b : table) {
      if (b == kNoBlock && given_back) continue;
      given_back = false;
      if (b < 0 || b >= kv.num_blocks()) return InvalidArgument("block id {} outside the {} KV blocks", b, kv.num_blocks());
    }
  }
  for (int32_t row : batch.logit_rows) {
    if (row < 0 || row >= n) return InvalidArgument("logit row {} outside the batch of {}", row, n);
  }
  for (int32_t row : batch.hidden_rows) {
    if (row < 0 || row >= n) return InvalidArgument("hidden row {} outside the batch of {}", row, n);
  }
  if (!hp_.causal) {
    // An encoder's tokens attend to their whole sequence: each sequence in the batch must be all
    // of it, positions 0, 1, ... in order, within the position embeddings.
    if (!batch.slots.empty() || !batch.attn_acc.empty()) return InvalidArgument("an encoder takes no cache slots or retention");
    std::vector<int32_t> next(num_seqs, 0);
    for (int64_t i = 0; i < n; ++i) {
      if (batch.positions[i] != next[batch.seq(i)]++) {
        return InvalidArgument("an encoder computes each sequence whole: position {} of sequence {} is out of order "
                               "or continues an earlier batch", batch.positions[i], batch.seq(i));
      }
      if (batch.positions[i] >= hp_.context_length) {
        return InvalidArgument("position {} is past the encoder's {} positions", batch.positions[i], hp_.context_length);
      }
    }
  }
  if (hp_.recurrent_state_floats == 0) return RunForward(batch, kv, ws, pool);
  // Recurrent layers: each sequence's tokens continue its state slot's, in order.
  if (kv.state_floats() != hp_.recurrent_state_floats) {
    return InvalidArgument("KV storage keeps {} floats of recurrent state per sequence, the model {}", kv.state_floats(),
                           hp_.recurrent_state_floats);
  }
  if (!batch.state_slots.empty() && static_cast<int64_t>(batch.state_slots.size()) != num_seqs) {
    return InvalidArgument("batch: {} state slots for {} sequences", batch.state_slots.size(), num_seqs);
  }
  std::vector<int64_t> next(num_seqs, -1);  // the position each sequence's next token must have
  std::vector<int64_t> first_pos(num_seqs, -1);  // and of its first here
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = batch.seq(i);
    const int32_t slot = batch.state_slot(s);
    if (slot < 0 || slot >= kv.num_state_slots()) {
      return InvalidArgument("state slot {} outside the cache's {}", slot, kv.num_state_slots());
    }
    if (next[s] < 0) {
      first_pos[s] = batch.positions[i];
      if (batch.positions[i] != 0 && batch.positions[i] != kv.state_tokens(slot)) {
        return InvalidArgument("sequence {} continues at position {}, but its recurrent state (slot {}) has taken in {} "
                               "tokens", s, batch.positions[i], slot, kv.state_tokens(slot));
      }
    } else if (batch.positions[i] != next[s]) {
      return InvalidArgument("sequence {}'s tokens must be consecutive for recurrent layers: position {} after {}", s,
                             batch.positions[i], next[s] - 1);
    }
    next[s] = batch.positions[i] + 1;
  }
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t t = s + 1; t < num_seqs && next[s] >= 0; ++t) {
      if (next[t] >= 0 && batch.state_slot(static_cast<int32_t>(s)) == batch.state_slot(static_cast<int32_t>(t))) {
        return InvalidArgument("sequences {} and {} share state slot {}", s, t, batch.state_slot(static_cast<int32_t>(s)));
      }
    }
  }
  // Snapshots: slots of their own (no sequence's, no other snapshot's), after tokens of the step
  // (a sequence's are consecutive: next - first_pos of them).
  if (!batch.state_snapshots.empty()) {
    if (static_cast<int64_t>(batch.state_snapshots.size()) != num_seqs) {
      return InvalidArgument("batch: {} state snapshot lists for {} sequences", batch.state_snapshots.size(), num_seqs);
    }
    std::vector<char> taken(static_cast<size_t>(kv.num_state_slots()), 0);
    for (int64_t s = 0; s < num_seqs; ++s) {
      if (next[s] >= 0) taken[batch.state_slot(static_cast<int32_t>(s))] = 1;
    }
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t count = next[s] - first_pos[s];
      int64_t last = -1;
      for (const StateSnapshot& snap : batch.state_snapshots[s]) {
        if (snap.after <= last || snap.after >= count) {
          return InvalidArgument("sequence {}: a state snapshot after its token {} (of {}, increasing)", s, snap.after,
                                 count);
        }
        last = snap.after;
        if (snap.slot < 0 || snap.slot >= kv.num_state_slots() || taken[snap.slot]) {
          return InvalidArgument("state snapshot slot {}: outside the cache's {} or in use by the batch", snap.slot,
                                 kv.num_state_slots());
        }
        taken[snap.slot] = 1;
      }
    }
  }
  auto for_each_snapshot = [&](auto fn) {
    for (int64_t s = 0; s < static_cast<int64_t>(batch.state_snapshots.size()); ++s) {
      for (const StateSnapshot& snap : batch.state_snapshots[s]) fn(snap.slot, first_pos[s] + snap.after + 1);
    }
  };
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (next[s] >= 0) kv.set_state_tokens(batch.state_slot(static_cast<int32_t>(s)), -1);
  }
  for_each_snapshot([&](int32_t slot, int64_t) { kv.set_state_tokens(slot, -1); });
  RETURN_IF_ERROR(RunForward(batch, kv, ws, pool));
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (next[s] >= 0) kv.set_state_tokens(batch.state_slot(static_cast<int32_t>(s)), next[s]);
  }
  for_each_snapshot([&](int32_t slot, int64_t tokens) { kv.set_state_tokens(slot, tokens); });
  return Status::Ok();
}

}  // namespace gale
