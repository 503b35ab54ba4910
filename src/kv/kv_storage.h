// The bytes of the paged KV cache: for every layer, K and V as [num_blocks, block_size,
// num_kv_heads] row segments of one type (f32, f16, bf16, or int8/int4 with an f16 scale per
// position and head: quantized when written, dequantized inside the attention kernel). Owns
// memory and the conversion on write; knows nothing of which request owns which block (that is
// the block pool and the cache manager).
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/kernels.h"

namespace gale {

class KvStorage {
 public:
  // Memory is reserved, not touched: pages are committed as blocks are first written.
  // v_is_k: one row per position that is both K and V (latent attention: the compressed latent
  // with its RoPE part; V's values are its first elements). No V storage; V reads K's rows (of
  // k_type; v_type is not used).
  KvStorage(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
            kernels::KvType k_type, kernels::KvType v_type, bool v_is_k = false);
  KvStorage(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
            kernels::KvType type)
      : KvStorage(num_layers, num_kv_heads, head_dim, num_blocks, block_size, type, type) {}

  // Bytes one block takes over all layers, K and V.
  static uint64_t BytesPerBlock(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                kernels::KvType k_type, kernels::KvType v_type, bool v_is_k = false);
  static uint64_t BytesPerBlock(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                kernels::KvType type) {
    return BytesPerBlock(num_layers, num_kv_heads, head_dim, block_size, type, type);
  }

  int64_t num_layers() const { return num_layers_; }
  int64_t kv_dim() const { return num_kv_heads_ * head_dim_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  // Bytes of one position's K and V rows together (all KV heads).
  int64_t row_bytes() const { return k_row_bytes_ + (v_is_k_ ? 0 : v_row_bytes_); }
  bool v_is_k() const { return v_is_k_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  kernels::KvType k_type() const { return k_type_; }
  kernels::KvType v_type() const { return v_type_; }
  uint64_t num_bytes() const { return static_cast<uint64_t>(k_layer_bytes_ + v_layer_bytes_) * num_layers_; }

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

  // The layer as the attention kernel reads it.
  kernels::KvLayer Layer(int64_t layer_idx) const;
  // Stores one position's K and V rows ([kv_dim] f32 each), converted to the storage type (v is
  // ignored, and may be null, when V is K).
  void Write(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, const float* k, const float* v);
  // Copies one position's K and V rows (as stored, scales included) to another slot of the layer
  // (KV retention's compaction).
  void CopyRow(int64_t layer_idx, int32_t src_block, int64_t src_offset, int32_t dst_block, int64_t dst_offset);
  // Reads one position's K and V rows back as f32 (tests, debugging).
  void Read(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, float* k, float* v) const;

 private:
  static void WriteRow(const float* x, int64_t num_kv_heads, int64_t head_dim, kernels::KvType type, uint8_t* dst);

  int64_t num_layers_, num_kv_heads_, head_dim_, num_blocks_, block_size_;
  kernels::KvType k_type_, v_type_;
  bool key_channels_;
  bool v_is_k_ = false;
  int64_t k_row_bytes_, v_row_bytes_;      // num_kv_heads * KvHeadBytes(type, head_dim)
  int64_t k_layer_bytes_, v_layer_bytes_;  // num_blocks * block_size * row bytes
  std::unique_ptr<uint8_t, void (*)(void*)> k_{nullptr, nullptr};  // [num_layers, num_blocks, block_size, row_bytes]
  std::unique_ptr<uint8_t, void (*)(void*)> v_{nullptr, nullptr};  // same; null when V is K
};

}  // namespace gale
