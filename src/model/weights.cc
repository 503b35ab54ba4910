// Tensor lookup with shape checks and a record of what was used.
#include "model/weights.h"

#include <cmath>
#include <cstring>

#include "model/hparams.h"

namespace gale {

Status TensorLoader::Get(const std::string& name, const std::vector<int64_t>& shape, TensorView* out) {
  auto t = file_.Tensor(name);
  if (!t.ok()) return t.status();
  if (t->shape != shape) {
    std::string want, got;
    for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (int64_t d : t->shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
    return InvalidArgument("tensor {}: expected shape [{}], got [{}]", name, want, got);
  }
  if (shape.size() == 1 && t->type != GgmlType::kF32) {
    return InvalidArgument("tensor {}: one-dimensional weights must be f32, got {}", name,
                           TypeName(static_cast<uint32_t>(t->type)));
  }
  *out = std::move(*t);
  used_.insert(name);
  return Status::Ok();
}

Status TensorLoader::Matrix(const std::string& name, int64_t in, int64_t out, MatrixWeight* w) {
  return Get(name, {in, out}, &w->view);
}

Status TensorLoader::SplitMatrix(const std::string& name, int64_t in,
                                 const std::vector<std::pair<int64_t, MatrixWeight*>>& parts) {
  int64_t total = 0;
  for (const auto& [rows, w] : parts) total += rows;
  TensorView all;
  RETURN_IF_ERROR(Get(name, {in, total}, &all));
  const int64_t row_bytes = all.RowBytes();
  int64_t at = 0;
  for (const auto& [rows, w] : parts) {
    w->view = TensorView{all.type, {in, rows}, all.data + at * row_bytes, static_cast<uint64_t>(rows * row_bytes)};
    at += rows;
  }
  return Status::Ok();
}

Status TensorLoader::StackedMatrices(const std::string& name, int64_t in, int64_t rows, int64_t count,
                                     std::vector<MatrixWeight>* out) {
  TensorView all;
  RETURN_IF_ERROR(Get(name, {in, rows, count}, &all));
  const uint64_t bytes = static_cast<uint64_t>(rows * all.RowBytes());
  out->clear();
  out->resize(count);
  for (int64_t i = 0; i < count; ++i) (*out)[i].view = TensorView{all.type, {in, rows}, all.data + i * bytes, bytes};
  return Status::Ok();
}

std::vector<std::string> TensorLoader::Unused() const {
  std::vector<std::string> unused;
  for (const auto& t : file_.tensors()) {
    if (!used_.contains(t.name)) unused.push_back(t.name);
  }
  return unused;
}

StatusOr<std::vector<float>> ReadRopeFreqFactors(TensorLoader& tensors, const ModelHParams& hp) {
  std::vector<float> factors;
  if (!tensors.Has("rope_freqs.weight")) return factors;
  TensorView f;
  RETURN_IF_ERROR(tensors.Vector("rope_freqs.weight", hp.rope_dims / 2, &f));
  factors.resize(static_cast<size_t>(hp.rope_dims / 2));
  std::memcpy(factors.data(), f.data, factors.size() * sizeof(float));
  for (float v : factors) {
    if (!(v > 0.0f) || !std::isfinite(v)) return InvalidArgument("tensor rope_freqs.weight: factor {} is not positive", v);
  }
  return factors;
}

}  // namespace gale
