// KV storage: large zeroed allocations (anonymous pages, committed on first write) and the
// conversion of rows as they are stored.
#include "kv/kv_storage.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "base/check.h"
#include "base/fp16.h"

namespace gale {
namespace {

// The mapping length is kept in front of the data (a page, so the data stays page aligned).
constexpr uint64_t kHeaderBytes = 4096;

// Anonymous memory: zero pages committed on first write. Transparent huge pages where the
// kernel allows them (madvise mode): a first write into a block then faults in 2 MiB at once
// instead of 4 KiB, which otherwise costs more than the cache write itself.
void FreeMapped(void* p) {
  if (p == nullptr) return;
  const uint64_t bytes = *reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(p) - kHeaderBytes);
  munmap(static_cast<uint8_t*>(p) - kHeaderBytes, bytes);
}

std::unique_ptr<uint8_t, void (*)(void*)> AllocZeroed(uint64_t bytes) {
  const uint64_t total = bytes + kHeaderBytes;
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  madvise(m, total, MADV_HUGEPAGE);
  *static_cast<uint64_t*>(m) = total;
  return {static_cast<uint8_t*>(m) + kHeaderBytes, FreeMapped};
}

}  // namespace

KvStorage::KvStorage(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                     int64_t block_size, kernels::KvType type)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      num_blocks_(num_blocks),
      block_size_(block_size),
      type_(type) {
  CHECK(num_layers > 0 && num_kv_heads > 0 && head_dim > 0 && num_blocks > 0 && block_size > 0);
  CHECK(type != kernels::KvType::kInt4 || head_dim % 2 == 0);
  row_bytes_ = num_kv_heads * kernels::KvHeadBytes(type, head_dim);
  layer_bytes_ = num_blocks * block_size * row_bytes_;
  k_ = AllocZeroed(static_cast<uint64_t>(layer_bytes_) * num_layers);
  v_ = AllocZeroed(static_cast<uint64_t>(layer_bytes_) * num_layers);
}

uint64_t KvStorage::BytesPerBlock(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                  kernels::KvType type) {
  return 2ull * num_layers * block_size * num_kv_heads * kernels::KvHeadBytes(type, head_dim);
}

kernels::KvLayer KvStorage::Layer(int64_t layer_idx) const {
  return {k_.get() + layer_idx * layer_bytes_, v_.get() + layer_idx * layer_bytes_, block_size_, type_};
}

uint8_t* KvStorage::Row(const std::unique_ptr<uint8_t, void (*)(void*)>& base, int64_t layer_idx, int32_t block_id,
                        int64_t offset_in_block) const {
  DCHECK(layer_idx >= 0 && layer_idx < num_layers_ && block_id >= 0 && block_id < num_blocks_);
  DCHECK(offset_in_block >= 0 && offset_in_block < block_size_);
  return base.get() + layer_idx * layer_bytes_ + (static_cast<int64_t>(block_id) * block_size_ + offset_in_block) * row_bytes_;
}

void KvStorage::Write(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, const float* k, const float* v) {
  uint8_t* kd = Row(k_, layer_idx, block_id, offset_in_block);
  uint8_t* vd = Row(v_, layer_idx, block_id, offset_in_block);
  const int64_t kv_dim = num_kv_heads_ * head_dim_;
  switch (type_) {
    case kernels::KvType::kF32:
      std::memcpy(kd, k, row_bytes_);
      std::memcpy(vd, v, row_bytes_);
      return;
    case kernels::KvType::kF16:  // no per-head scales: the row converts in one go
      kernels::Active().to_f16(k, reinterpret_cast<uint16_t*>(kd), kv_dim);
      kernels::Active().to_f16(v, reinterpret_cast<uint16_t*>(vd), kv_dim);
      return;
    case kernels::KvType::kBF16:
      kernels::Active().to_bf16(k, reinterpret_cast<uint16_t*>(kd), kv_dim);
      kernels::Active().to_bf16(v, reinterpret_cast<uint16_t*>(vd), kv_dim);
      return;
    case kernels::KvType::kInt8:
    case kernels::KvType::kInt4: {
      const int64_t seg = kernels::KvHeadBytes(type_, head_dim_);
      for (int64_t h = 0; h < num_kv_heads_; ++h) {
        kernels::StoreKvHead(k + h * head_dim_, head_dim_, type_, kd + h * seg);
        kernels::StoreKvHead(v + h * head_dim_, head_dim_, type_, vd + h * seg);
      }
      return;
    }
  }
}

void KvStorage::Read(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, float* k, float* v) const {
  const uint8_t* ks = Row(k_, layer_idx, block_id, offset_in_block);
  const uint8_t* vs = Row(v_, layer_idx, block_id, offset_in_block);
  const int64_t seg = kernels::KvHeadBytes(type_, head_dim_);
  for (int64_t h = 0; h < num_kv_heads_; ++h) {
    kernels::LoadKvHead(ks + h * seg, head_dim_, type_, k + h * head_dim_);
    kernels::LoadKvHead(vs + h * seg, head_dim_, type_, v + h * head_dim_);
  }
}

}  // namespace gale
