#include "model/sharding.h"

#include <cstring>

#include <fmt/format.h>

namespace gale {

StatusOr<TensorSharder::HeadRange> TensorSharder::KvHeads(const TensorSplit& split, int64_t heads, int64_t kv_heads) {
  const int64_t s = split.slices;
  if (heads % s != 0 || kv_heads <= 0 || heads % kv_heads != 0 || (kv_heads % s != 0 && s % kv_heads != 0)) {
    return InvalidArgument("tensor parallelism: {} heads and {} KV heads do not divide into {} slices", heads, kv_heads,
                           s);
  }
  const int64_t group = heads / kv_heads;  // query heads per KV head
  const int64_t q0 = heads / s * split.first_slice(), nq = heads / s * split.num_slices();
  HeadRange kv{q0 / group, (q0 + nq + group - 1) / group - q0 / group};
  // The rank's query heads must read its KV heads as one process's read theirs: whole groups, or
  // part of one.
  if (nq % kv.count != 0 || (nq / kv.count != group && kv.count != 1)) {
    return InvalidArgument("tensor parallelism: rank {}'s {} query heads from head {} do not map onto whole KV heads "
                           "({} per KV head)", split.rank, nq, q0, group);
  }
  return kv;
}

Status TensorSharder::KeepRows(MatrixWeight* w, int64_t first, int64_t count, int64_t total,
                               const std::string& what) const {
  if (w->view.shape.size() != 2) return InvalidArgument("tensor parallelism: {} is not a matrix", what);
  const int64_t rows = w->view.shape[1], row_bytes = w->view.RowBytes();
  if (rows % total != 0) {
    return InvalidArgument("tensor parallelism: {} has {} rows, not a multiple of {}", what, rows, total);
  }
  const int64_t per = rows / total;
  w->view.data += first * per * row_bytes;
  w->view.shape[1] = count * per;
  w->view.num_bytes = static_cast<uint64_t>(count * per * row_bytes);
  return Status::Ok();
}

Status TensorSharder::KeepElements(TensorView* v, int64_t first, int64_t count, int64_t total,
                                   const std::string& what) const {
  if (v->shape.size() != 1 || v->type != GgmlType::kF32) return InvalidArgument("tensor parallelism: {} is not an f32 vector", what);
  const int64_t n = v->shape[0];
  if (n % total != 0) return InvalidArgument("tensor parallelism: {} has {} elements, not a multiple of {}", what, n, total);
  const int64_t per = n / total;
  v->data += first * per * sizeof(float);
  v->shape[0] = count * per;
  v->num_bytes = static_cast<uint64_t>(v->shape[0] * sizeof(float));
  return Status::Ok();
}

Status TensorSharder::Rows(MatrixWeight* w, const std::string& what) const {
  return KeepRows(w, split_.first_slice(), split_.num_slices(), split_.slices, what);
}
Status TensorSharder::Vector(TensorView* v, const std::string& what) const {
  return KeepElements(v, split_.first_slice(), split_.num_slices(), split_.slices, what);
}
Status TensorSharder::KvRows(MatrixWeight* w, const std::string& what) const {
  return KeepRows(w, kv_.first, kv_.count, kv_heads_, what);
}
Status TensorSharder::KvVector(TensorView* v, const std::string& what) const {
  return KeepElements(v, kv_.first, kv_.count, kv_heads_, what);
}

Status TensorSharder::Columns(MatrixWeight* w, const std::string& what) const {
  const TensorView full = w->view;
  if (full.shape.size() != 2) return InvalidArgument("tensor parallelism: {} is not a matrix", what);
  const int64_t cols = full.shape[0], rows = full.shape[1];
  const GgmlTypeTraits& t = TypeTraits(full.type);
  const int64_t per = cols / split_.slices;
  if (cols % split_.slices != 0 || per % t.block_size != 0) {
    return InvalidArgument("tensor parallelism: {} has rows of {} ({}), which do not cut into {} slices of whole "
                           "{}-element blocks", what, cols, t.name, split_.slices, t.block_size);
  }
  if (full.data == nullptr) return Internal("tensor parallelism: {} was released", what);
  const int64_t in_row = full.RowBytes(), part_row = RowBytes(full.type, per);
  std::vector<MatrixWeight> parts(static_cast<size_t>(split_.num_slices()));
  for (int s = 0; s < split_.num_slices(); ++s) {
    const int64_t offset = (split_.first_slice() + s) * part_row;
    auto bytes = std::make_unique<uint8_t[]>(static_cast<size_t>(rows * part_row));
    for (int64_t r = 0; r < rows; ++r) std::memcpy(bytes.get() + r * part_row, full.data + r * in_row + offset, part_row);
    parts[s].view = TensorView{full.type, {per, rows}, bytes.get(), static_cast<uint64_t>(rows * part_row)};
    owned_->push_back(std::move(bytes));
  }
  w->packed.reset();
  if (parts.size() == 1) {
    w->view = parts[0].view;
    return Status::Ok();
  }
  w->view = TensorView{full.type, {per * split_.num_slices(), rows}, nullptr,
                       static_cast<uint64_t>(rows * part_row * split_.num_slices())};
  w->parts = std::move(parts);
  return Status::Ok();
}

}  // namespace gale
