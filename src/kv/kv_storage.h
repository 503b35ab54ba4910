// The bytes of the paged KV cache: for every layer, K and V as [num_blocks, block_size,
// num_kv_heads] row segments of one type (f32, f16, bf16, or int8/int4 with an f16 scale per
// position and head: quantized when written, dequantized inside the attention kernel). With
// layer groups (KvLayerGroups) a block id addresses one group's layers only, so the memory is
// [layers_per_block] such arrays and each layer uses its slot's. Owns memory and the conversion
// on write; knows nothing of which request owns which block (that is the block pool and the
// cache manager).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kernels/kernels.h"

namespace gale {

// A block table's entry for a block given back (behind every window of its layer group).
inline constexpr int32_t kNoBlock = -1;

// How a model's layers share the cache's blocks. A physical block holds block_size positions of
// layers_per_block layers: those of one group. Each group has a block table of its own per
// request, so a group of sliding-window layers can give back the blocks its window has passed
// while the full-attention groups keep theirs (vLLM's hybrid allocator: equal-size groups over one
// pool). A model without windows, or with one window for every layer, is one group of all layers.
struct KvLayerGroups {
  int64_t layers_per_block = 0;
  std::vector<int32_t> group_of;  // [num_layers]
  std::vector<int32_t> slot_of;   // [num_layers] the layer's place within its group's blocks
  std::vector<int64_t> window;    // [num_groups] the group's sliding window; 0: full attention

  int64_t num_layers() const { return static_cast<int64_t>(group_of.size()); }
  int64_t num_groups() const { return static_cast<int64_t>(window.size()); }
  bool operator==(const KvLayerGroups&) const = default;
  // Every layer in one group (slot = layer).
  static KvLayerGroups Single(int64_t num_layers, int64_t window = 0);
  // Layers grouped by their window (0: none): groups of min(layers per window value) layers, in
  // layer order within a value, full-attention groups first; the last group of a value may leave
  // slots unused. One distinct value gives Single.
  static KvLayerGroups ForWindows(std::span<const int64_t> layer_windows);
};

// The KV cache a model needs (DESIGN.md's KvLayout; Model::kv_layout()): per layer its sliding
// window (0: full attention); K's and V's head sizes over its KV heads (the same in every layer
// of the architectures so far), or one latent row per position that is both K and V.
struct KvLayout {
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;    // K's
  int64_t v_head_dim = 0;  // V's (head_dim for latent rows)
  bool latent = false;
  std::vector<int64_t> windows;  // [num_layers]

  // Floats of recurrent state per sequence (linear-attention layers' states, whatever the
  // architecture keeps there; 0: none). A cache for such a model has state slots beside its blocks.
  int64_t state_floats = 0;

  int64_t num_layers() const { return static_cast<int64_t>(windows.size()); }
  // Windowed layers in layer groups of their own (KvLayerGroups::ForWindows), or one group.
  KvLayerGroups Groups(bool window_groups) const;
  // Bytes of one block of the groups' layers_per_block layers.
  uint64_t BytesPerBlock(const KvLayerGroups& groups, int64_t block_size, kernels::KvType k_type,
                         kernels::KvType v_type) const;
};

class KvStorage {
 public:
  // The storage of a model's layout, its layers shared out by groups.
  KvStorage(const KvLayout& layout, const KvLayerGroups& groups, int64_t num_blocks, int64_t block_size,
            kernels::KvType k_type, kernels::KvType v_type)
      : KvStorage(layout.num_layers(), layout.num_kv_heads, layout.head_dim, num_blocks, block_size, k_type, v_type,
                  layout.latent, groups, layout.v_head_dim) {}
  // Memory is reserved, not touched: pages are committed as blocks are first written.
  // v_is_k: one row per position that is both K and V (latent attention: the compressed latent
  // with its RoPE part; V's values are its first elements). No V storage; V reads K's rows (of
  // k_type; v_type is not used).
  // groups: how the layers share blocks (default: one group of num_layers). v_head_dim: V's head
  // size where it differs from K's (0: head_dim).
  KvStorage(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
            kernels::KvType k_type, kernels::KvType v_type, bool v_is_k = false,
            std::optional<KvLayerGroups> groups = std::nullopt, int64_t v_head_dim = 0);
  KvStorage(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
            kernels::KvType type)
      : KvStorage(num_layers, num_kv_heads, head_dim, num_blocks, block_size, type, type) {}

  // Bytes one block takes over num_layers layers (a group's layers_per_block), K and V.
  static uint64_t BytesPerBlock(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                kernels::KvType k_type, kernels::KvType v_type, bool v_is_k = false,
                                int64_t v_head_dim = 0);
  static uint64_t BytesPerBlock(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                kernels::KvType type) {
    return BytesPerBlock(num_layers, num_kv_heads, head_dim, block_size, type, type);
  }

  int64_t num_layers() const { return num_layers_; }
  const KvLayerGroups& groups() const { return groups_; }
  int64_t num_groups() const { return groups_.num_groups(); }
  int64_t kv_dim() const { return num_kv_heads_ * head_dim_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t v_head_dim() const { return v_head_dim_; }
  int64_t v_dim() const { return num_kv_heads_ * v_head_dim_; }
  // Bytes of one position's K and V rows together (all KV heads).
  int64_t row_bytes() const { return k_row_bytes_ + (v_is_k_ ? 0 : v_row_bytes_); }
  bool v_is_k() const { return v_is_k_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  kernels::KvType k_type() const { return k_type_; }
  kernels::KvType v_type() const { return v_type_; }
  // K and V's bytes, and the recurrent states'.
  uint64_t num_bytes() const {
    return static_cast<uint64_t>(k_layer_bytes_ + v_layer_bytes_) * groups_.layers_per_block +
           static_cast<uint64_t>(num_state_slots_ * state_floats_) * sizeof(float);
  }

  // Whether keys are stored in the model's calibrated per-channel form ((k - shift) / scale, with
  // queries times scale: attention's softmax is unchanged) when the model has the statistics
  // (Model::key_channels). Default: for int8/int4 keys, whose per-token scales suffer most
  // from a few large channels. Set before the first write; every row of a cache must agree.
  bool key_channels() const { return key_channels_; }
  static bool KeyChannelsByDefault(kernels::KvType k_type) { return kernels::KvTypeQuantized(k_type); }
  void set_key_channels(bool on) { key_channels_ = on; }

  // Commits every page of the cache now (it is reserved, and otherwise committed as blocks are
  // first written): the whole budget becomes resident at once and no step pays a page fault
  // later. Call before the first write (the contents stay zero). Returns the seconds it took.
  double Prefault();

  // Recurrent state (KvLayout::state_floats): num_slots slots of `floats` f32 each, one per
  // running sequence, reserved (pages committed as first written). A slot also records how many of
  // its sequence's tokens its state has taken in, so that a step continuing elsewhere (a prefix
  // cache hit, a rolled-back draft) is refused instead of computed on the wrong state.
  void ReserveStates(int64_t num_slots, int64_t floats);
  int64_t num_state_slots() const { return num_state_slots_; }
  int64_t state_floats() const { return state_floats_; }
  float* State(int64_t slot) { return states_.get() == nullptr ? nullptr : reinterpret_cast<float*>(states_.get()) + slot * state_floats_; }
  // Tokens slot `slot`'s state has taken in; -1: unknown (a forward failed part way).
  int64_t state_tokens(int64_t slot) const { return state_tokens_[slot]; }
  void set_state_tokens(int64_t slot, int64_t n) { state_tokens_[slot] = n; }
  // Makes slot `to` a copy of slot `from` (its state and its token count): a checkpoint taken or
  // restored.
  void CopyState(int64_t from, int64_t to);

  // The layer as the attention kernel reads it.
  kernels::KvLayer Layer(int64_t layer_idx) const;
  // Stores one position's K and V rows ([kv_dim] and [v_dim] f32), converted to the storage type (v is
  // ignored, and may be null, when V is K).
  void Write(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, const float* k, const float* v);
  // Copies one position's K and V rows (as stored, scales included) to another slot of the layer
  // (KV retention's compaction).
  void CopyRow(int64_t layer_idx, int32_t src_block, int64_t src_offset, int32_t dst_block, int64_t dst_offset);
  // Reads one position's K and V rows back as f32 (tests, debugging).
  void Read(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, float* k, float* v) const;
  // Elements [first, first + count) of one position's K row, written from / read into f32. Float
  // K types only (f32, f16, bf16: no per-head scale ties an element to its neighbours);
  // DeepSeek-V4 packs parts of several rows into one.
  void WriteK(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, int64_t first, int64_t count,
              const float* x);
  void ReadK(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, int64_t first, int64_t count,
             float* x) const;

 private:
  static void WriteRow(const float* x, int64_t num_kv_heads, int64_t head_dim, kernels::KvType type, uint8_t* dst);

  int64_t num_layers_, num_kv_heads_, head_dim_, num_blocks_, block_size_;
  KvLayerGroups groups_;
  int64_t v_head_dim_;
  kernels::KvType k_type_, v_type_;
  bool key_channels_;
  bool v_is_k_ = false;
  int64_t k_row_bytes_, v_row_bytes_;      // num_kv_heads * KvHeadBytes(type, K's / V's head size)
  int64_t k_layer_bytes_, v_layer_bytes_;  // num_blocks * block_size * row bytes
  // [layers_per_block, num_blocks, block_size, row_bytes]: layer l at slot_of[l]
  std::unique_ptr<uint8_t, void (*)(void*)> k_{nullptr, nullptr};
  std::unique_ptr<uint8_t, void (*)(void*)> v_{nullptr, nullptr};  // same; null when V is K
  int64_t num_state_slots_ = 0, state_floats_ = 0;
  std::unique_ptr<uint8_t, void (*)(void*)> states_{nullptr, nullptr};  // [num_state_slots, state_floats]
  std::vector<int64_t> state_tokens_;
};

}  // namespace gale
