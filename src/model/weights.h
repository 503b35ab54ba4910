// Reading an architecture's tensors from a GGUF file by name and shape, keeping count of which
// ones were consumed so that Load can name every tensor of the file it did not use (views point
// into the file's mapping); the weight matrix type, and how tensor parallelism splits it.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "kernels/kernels.h"

namespace gale {

struct ModelHParams;

// Tensor parallelism (dist/tensor_parallel.h): every layer's attention heads and FFN rows are cut
// into `slices` equal slices and rank `rank` of `ranks` holds slices [first_slice(),
// first_slice() + num_slices()): Q, K, V, gate and up keep the rows of its slices (its heads, its
// part of the FFN's width); the output projection and down keep the matching columns, as one
// matrix per slice. A row-parallel product is the sum of its slices' products, added in a fixed
// pairwise tree (base/tree_sum.h): first the rank's own slices (MatMul), then the ranks'
// partial sums (PartialSums). Wherever slices / ranks is a power of two, the numbers are added
// in the same tree as one process with the same slices adds them: the same bits (so slices 4
// gives one answer with 1, 2 or 4 ranks).
struct TensorSplit {
  int rank = 0, ranks = 1, slices = 1;
  int num_slices() const { return slices / ranks; }
  int first_slice() const { return rank * num_slices(); }
  bool on() const { return slices > 1; }
};

// A weight matrix: its view into the file, and optionally a copy packed for the active ISA.
// A tensor-parallel rank with more than one slice keeps a row-parallel matrix (output
// projection, FFN down) as its slices' column blocks: `parts`, each [rows, in / parts]; view then
// has the whole shape and type but no data, and MatMul sums the parts' products in a fixed tree.
struct MatrixWeight {
  TensorView view;
  std::unique_ptr<kernels::PackedWeights> packed;
  std::vector<MatrixWeight> parts;
};


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
