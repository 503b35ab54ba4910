// Reading an architecture's tensors from a GGUF file by name and shape, keeping count of which
// ones were consumed so that Load can name every tensor of the file it did not use. Owns no
// bytes: views point into the file's mapping.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace gale {

struct MatrixWeight;
struct ModelHParams;

class TensorLoader {
 public:
  explicit TensorLoader(const GgufFile& file) : file_(file) {}

  bool Has(const std::string& name) const { return file_.FindTensor(name) != nullptr; }
  // A tensor of exactly this shape (GGUF order: the row length first). One-dimensional tensors
  // (norm weights, biases) must be f32.
  Status Get(const std::string& name, const std::vector<int64_t>& shape, TensorView* out);
  // A weight matrix of `out` rows of `in` elements.
  Status Matrix(const std::string& name, int64_t in, int64_t out, MatrixWeight* w);
  // A fused matrix of `in`-element rows (Phi-3's attn_qkv, ffn_up = gate and up) as consecutive
  // row ranges, each a matrix of its own: parts[i] = {rows, out}.
  Status SplitMatrix(const std::string& name, int64_t in, const std::vector<std::pair<int64_t, MatrixWeight*>>& parts);
  // A 3-D tensor of `count` matrices of `rows` rows of `in` elements, one after the other (a
  // mixture's experts, per-head projections): one view each, out->size() == count.
  Status StackedMatrices(const std::string& name, int64_t in, int64_t rows, int64_t count, std::vector<MatrixWeight>* out);
  // An f32 vector of n; as Get.
  Status Vector(const std::string& name, int64_t n, TensorView* out) { return Get(name, {n}, out); }
  // Marks a tensor used without reading it through here.
  void MarkUsed(const std::string& name) { used_.insert(name); }
  // The file's tensors nobody asked for, in file order.
  std::vector<std::string> Unused() const;

 private:
  const GgufFile& file_;
  std::set<std::string> used_;
};

// The f32 data of a one-dimensional weight (Get checked its type).
inline const float* Floats(const TensorView& v) { return reinterpret_cast<const float*>(v.data); }

// Llama 3.1-3.3's RoPE frequency scaling as llama.cpp's converter stores it: rope_freqs.weight,
// [rope_dims / 2] positive divisors of each frequency. Empty when the file has none.
StatusOr<std::vector<float>> ReadRopeFreqFactors(TensorLoader& tensors, const ModelHParams& hp);

}  // namespace gale
