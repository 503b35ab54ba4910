// KV storage: large zeroed allocations (anonymous pages, committed on first write) and the
// conversion of rows as they are stored.
#include "kv/kv_storage.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "base/check.h"

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

// Commits [p, p + bytes) of an anonymous mapping: MADV_POPULATE_WRITE (Linux 5.14) faults the
// pages in without touching them from user space; older kernels get a write of zero per page.
void Populate(uint8_t* p, uint64_t bytes) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  uint8_t* base = p - kHeaderBytes;  // the mapping's start: page aligned
  if (madvise(base, bytes + kHeaderBytes, MADV_POPULATE_WRITE) == 0) return;
  for (uint64_t i = 0; i < bytes; i += 4096) reinterpret_cast<volatile uint8_t*>(p)[i] = 0;
}

}  // namespace

KvLayerGroups KvLayerGroups::Single(int64_t num_layers, int64_t window) {
  KvLayerGroups g;
  g.layers_per_block = num_layers;
  g.group_of.assign(num_layers, 0);
  for (int64_t l = 0; l < num_layers; ++l) g.slot_of.push_back(static_cast<int32_t>(l));
  g.window = {window};
  return g;
}

KvLayerGroups KvLayerGroups::ForWindows(std::span<const int64_t> layer_windows) {
  const int64_t n = static_cast<int64_t>(layer_windows.size());
  std::vector<int64_t> values(layer_windows.begin(), layer_windows.end());
  std::sort(values.begin(), values.end());  // 0 (full attention) first
  values.erase(std::unique(values.begin(), values.end()), values.end());
  if (values.size() <= 1) return Single(n, values.empty() ? 0 : values[0]);
  int64_t size = n;
  for (int64_t v : values) size = std::min<int64_t>(size, std::count(layer_windows.begin(), layer_windows.end(), v));
  KvLayerGroups g;
  g.layers_per_block = size;
  g.group_of.assign(n, -1);
  g.slot_of.assign(n, -1);
  for (int64_t v : values) {
    int32_t slot = static_cast<int32_t>(size);
    for (int64_t l = 0; l < n; ++l) {
      if (layer_windows[l] != v) continue;
      if (slot == size) {
        g.window.push_back(v);
        slot = 0;
      }
      g.group_of[l] = static_cast<int32_t>(g.window.size() - 1);
      g.slot_of[l] = slot++;
    }
  }
  return g;
}

KvLayerGroups KvLayout::Groups(bool window_groups) const {
  return window_groups ? KvLayerGroups::ForWindows(windows) : KvLayerGroups::Single(num_layers());
}

uint64_t KvLayout::BytesPerBlock(const KvLayerGroups& groups, int64_t block_size, kernels::KvType k_type,
                                 kernels::KvType v_type) const {
  return KvStorage::BytesPerBlock(groups.layers_per_block, num_kv_heads, head_dim, block_size, k_type, v_type, latent,
                                  v_head_dim);
}

double KvStorage::Prefault() {
  const auto start = std::chrono::steady_clock::now();
  Populate(k_.get(), static_cast<uint64_t>(k_layer_bytes_) * groups_.layers_per_block);
  if (!v_is_k_) Populate(v_.get(), static_cast<uint64_t>(v_layer_bytes_) * groups_.layers_per_block);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void KvStorage::ReserveStates(int64_t num_slots, int64_t floats) {
  num_state_slots_ = num_slots;
  state_floats_ = floats;
  states_ = num_slots > 0 && floats > 0 ? AllocZeroed(static_cast<uint64_t>(num_slots * floats) * sizeof(float))
                                        : std::unique_ptr<uint8_t, void (*)(void*)>{nullptr, nullptr};
  state_tokens_.assign(static_cast<size_t>(num_slots), 0);
}

void KvStorage::CopyState(int64_t from, int64_t to) {
  CHECK(from >= 0 && from < num_state_slots_ && to >= 0 && to < num_state_slots_);
  if (from == to) return;
  std::memcpy(State(to), State(from), static_cast<size_t>(state_floats_) * sizeof(float));
  state_tokens_[to] = state_tokens_[from];
}

KvStorage::KvStorage(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                     int64_t block_size, kernels::KvType k_type, kernels::KvType v_type, bool v_is_k,
                     std::optional<KvLayerGroups> groups, int64_t v_head_dim)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      num_blocks_(num_blocks),
      block_size_(block_size),
      groups_(groups ? std::move(*groups) : KvLayerGroups::Single(num_layers)),
      v_head_dim_(v_head_dim > 0 ? v_head_dim : head_dim),
      k_type_(k_type),
      v_type_(v_is_k ? k_type : v_type),
      key_channels_(KeyChannelsByDefault(k_type)),
      v_is_k_(v_is_k) {
  CHECK(num_layers > 0 && num_kv_heads > 0 && head_dim > 0 && num_blocks > 0 && block_size > 0);
  CHECK(groups_.num_layers() == num_layers && groups_.layers_per_block > 0 && groups_.num_groups() > 0);
  CHECK(k_type != kernels::KvType::kInt4 || head_dim % 2 == 0);
  CHECK(v_type_ != kernels::KvType::kInt4 || v_head_dim_ % 2 == 0);
  CHECK(!v_is_k || v_head_dim_ == head_dim);
  k_row_bytes_ = num_kv_heads * kernels::KvHeadBytes(k_type, head_dim);
  v_row_bytes_ = num_kv_heads * kernels::KvHeadBytes(v_type_, v_head_dim_);
  k_layer_bytes_ = num_blocks * block_size * k_row_bytes_;
  v_layer_bytes_ = v_is_k ? 0 : num_blocks * block_size * v_row_bytes_;
  k_ = AllocZeroed(static_cast<uint64_t>(k_layer_bytes_) * groups_.layers_per_block);
  if (!v_is_k) v_ = AllocZeroed(static_cast<uint64_t>(v_layer_bytes_) * groups_.layers_per_block);
}

uint64_t KvStorage::BytesPerBlock(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                  kernels::KvType k_type, kernels::KvType v_type, bool v_is_k,
                                  int64_t v_head_dim) {
  const int64_t v_head = v_head_dim > 0 ? v_head_dim : head_dim;
  return static_cast<uint64_t>(num_layers * block_size * num_kv_heads) *
         static_cast<uint64_t>(kernels::KvHeadBytes(k_type, head_dim) + (v_is_k ? 0 : kernels::KvHeadBytes(v_type, v_head)));
}

kernels::KvLayer KvStorage::Layer(int64_t layer_idx) const {
  const int64_t s = groups_.slot_of[layer_idx];
  const uint8_t* k = k_.get() + s * k_layer_bytes_;
  return {k, v_is_k_ ? k : v_.get() + s * v_layer_bytes_, block_size_, k_type_, v_type_};
}

void KvStorage::WriteRow(const float* x, int64_t num_kv_heads, int64_t head_dim, kernels::KvType type, uint8_t* dst) {
  if (!kernels::KvTypeQuantized(type)) {  // no per-head scales: the row converts in one go
    kernels::StoreKvHead(x, num_kv_heads * head_dim, type, dst);
    return;
  }
  const int64_t seg = kernels::KvHeadBytes(type, head_dim);
  for (int64_t h = 0; h < num_kv_heads; ++h) kernels::StoreKvHead(x + h * head_dim, head_dim, type, dst + h * seg);
}

void KvStorage::Write(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, const float* k, const float* v) {
  DCHECK(layer_idx >= 0 && layer_idx < num_layers_ && block_id >= 0 && block_id < num_blocks_);
  DCHECK(offset_in_block >= 0 && offset_in_block < block_size_);
  const int64_t slot = static_cast<int64_t>(block_id) * block_size_ + offset_in_block;
  const int64_t s = groups_.slot_of[layer_idx];
  WriteRow(k, num_kv_heads_, head_dim_, k_type_, k_.get() + s * k_layer_bytes_ + slot * k_row_bytes_);
  if (v_is_k_) return;
  WriteRow(v, num_kv_heads_, v_head_dim_, v_type_, v_.get() + s * v_layer_bytes_ + slot * v_row_bytes_);
}

void KvStorage::WriteK(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, int64_t first, int64_t count,
                       const float* x) {
  CHECK(!kernels::KvTypeQuantized(k_type_));
  DCHECK(layer_idx >= 0 && layer_idx < num_layers_ && block_id >= 0 && block_id < num_blocks_);
  DCHECK(offset_in_block >= 0 && offset_in_block < block_size_ && first >= 0 && first + count <= kv_dim());
  const int64_t slot = static_cast<int64_t>(block_id) * block_size_ + offset_in_block;
  const int64_t elt = kernels::KvHeadBytes(k_type_, 1);
  kernels::StoreKvHead(x, count, k_type_, k_.get() + groups_.slot_of[layer_idx] * k_layer_bytes_ + slot * k_row_bytes_ + first * elt);
}

void KvStorage::ReadK(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, int64_t first, int64_t count,
                      float* x) const {
  CHECK(!kernels::KvTypeQuantized(k_type_));
  DCHECK(layer_idx >= 0 && layer_idx < num_layers_ && block_id >= 0 && block_id < num_blocks_);
  DCHECK(offset_in_block >= 0 && offset_in_block < block_size_ && first >= 0 && first + count <= kv_dim());
  const int64_t slot = static_cast<int64_t>(block_id) * block_size_ + offset_in_block;
  const int64_t elt = kernels::KvHeadBytes(k_type_, 1);
  kernels::LoadKvHead(k_.get() + groups_.slot_of[layer_idx] * k_layer_bytes_ + slot * k_row_bytes_ + first * elt, count,
                      k_type_, x);
}

void KvStorage::CopyRow(int64_t layer_idx, int32_t src_block, int64_t src_offset, int32_t dst_block,
                        int64_t dst_offset) {
  DCHECK(layer_idx >= 0 && layer_idx < num_layers_);
  DCHECK(src_block >= 0 && src_block < num_blocks_ && dst_block >= 0 && dst_block < num_blocks_);
  const int64_t src = static_cast<int64_t>(src_block) * block_size_ + src_offset;
  const int64_t dst = static_cast<int64_t>(dst_block) * block_size_ + dst_offset;
  const int64_t s = groups_.slot_of[layer_idx];
  uint8_t* k = k_.get() + s * k_layer_bytes_;
  std::memmove(k + dst * k_row_bytes_, k + src * k_row_bytes_, static_cast<size_t>(k_row_bytes_));
  if (v_is_k_) return;
  uint8_t* v = v_.get() + s * v_layer_bytes_;
  std::memmove(v + dst * v_row_bytes_, v + src * v_row_bytes_, static_cast<size_t>(v_row_bytes_));
}

void KvStorage::Read(int64_t layer_idx, int32_t block_id, int64_t offset_in_block, float* k, float* v) const {
  const int64_t slot = static_cast<int64_t>(block_id) * block_size_ + offset_in_block;
  const int64_t s = groups_.slot_of[layer_idx];
  const uint8_t* ks = k_.get() + s * k_layer_bytes_ + slot * k_row_bytes_;
  const uint8_t* vs = v_is_k_ ? ks : v_.get() + s * v_layer_bytes_ + slot * v_row_bytes_;
  const int64_t kseg = kernels::KvHeadBytes(k_type_, head_dim_), vseg = kernels::KvHeadBytes(v_type_, v_head_dim_);
  for (int64_t h = 0; h < num_kv_heads_; ++h) {
    kernels::LoadKvHead(ks + h * kseg, head_dim_, k_type_, k + h * head_dim_);
    kernels::LoadKvHead(vs + h * vseg, v_head_dim_, v_type_, v + h * v_head_dim_);
  }
}

}  // namespace gale
