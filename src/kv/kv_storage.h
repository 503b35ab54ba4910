// The bytes of the paged KV cache: for every layer, K and V as [num_blocks, block_size, kv_dim]
// elements of one type (f32, f16 or bf16). Owns memory and the element conversion on write; knows
// nothing of which request owns which block (that is the block pool and the cache manager).
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/kernels.h"

namespace gale {

class KvStorage {
 public:
  // Memory is reserved, not touched: pages are committed as blocks are first written.
  KvStorage(int64_t num_layers, int64_t kv_dim, int64_t num_blocks, int64_t block_size, kernels::KvType type);

  // Bytes one block takes over all layers, K and V.
  static uint64_t BytesPerBlock(int64_t num_layers, int64_t kv_dim, int64_t block_size, kernels::KvType type);

  int64_t num_layers() const { return num_layers_; }
  int64_t kv_dim() const { return kv_dim_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  kernels::KvType type() const { return type_; }
  uint64_t num_bytes() const { return 2 * static_cast<uint64_t>(layer_bytes_) * num_layers_; }

  // The layer as the attention kernel reads it.
  kernels::KvLayer Layer(int64_t layer_idx) const;
  // Stores one position's K and V rows ([kv_dim] f32 each), converted to the storage type.
  void Write(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, const float* k, const float* v);
  // Reads one position's K or V row back as f32 (tests, debugging).
  void Read(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, float* k, float* v) const;

 private:
  uint8_t* Row(const std::unique_ptr<uint8_t, void (*)(void*)>& base, int64_t layer_idx, int32_t block_id,
               int64_t offset_in_block) const;

  int64_t num_layers_, kv_dim_, num_blocks_, block_size_;
  kernels::KvType type_;
  int64_t row_bytes_;    // kv_dim * element bytes
  int64_t layer_bytes_;  // num_blocks * block_size * row_bytes
  std::unique_ptr<uint8_t, void (*)(void*)> k_{nullptr, nullptr};  // [num_layers, num_blocks, block_size, kv_dim]
  std::unique_ptr<uint8_t, void (*)(void*)> v_{nullptr, nullptr};  // same
};

}  // namespace gale
