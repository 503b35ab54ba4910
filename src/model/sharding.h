// Cutting weight matrices for a tensor-parallel rank (TensorSplit, model/weights.h): the rows or
// columns of the rank's slices, errors naming the matrix and the rule broken.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/weights.h"

namespace gale {

// Cuts matrices for a tensor-parallel rank (Model::ShardLayer): each into the split's slices
// (TensorSplit), keeping this rank's. Errors name the matrix (`what`) and the rule broken.
class TensorSharder {
 public:
  // The KV heads a rank's query heads read, [first, first + count) of the model's.
  struct HeadRange {
    int64_t first = 0, count = 0;
  };
  // heads, kv_heads: the whole model's. With fewer KV heads than slices, the ranks whose query
  // heads read one KV head each keep a copy of it (vLLM's replication).
  static StatusOr<HeadRange> KvHeads(const TensorSplit& split, int64_t heads, int64_t kv_heads);
  TensorSharder(const TensorSplit& split, int64_t kv_heads, HeadRange kv, std::vector<std::unique_ptr<uint8_t[]>>* owned)
      : split_(split), kv_heads_(kv_heads), kv_(kv), owned_(owned) {}
  // A column-parallel matrix (Q, gate, up): the rows of this rank's slices (a view).
  Status Rows(MatrixWeight* w, const std::string& what) const;
  // Its bias: the same elements.
  Status Vector(TensorView* v, const std::string& what) const;
  // K and V (and their biases): the rows of the rank's KV heads.
  Status KvRows(MatrixWeight* w, const std::string& what) const;
  Status KvVector(TensorView* v, const std::string& what) const;
  // A row-parallel matrix (output projection, down): the columns of this rank's slices, copied,
  // one matrix per slice (MatrixWeight::parts), or the one block itself where the rank has one
  // slice. A slice's columns must be whole quantization blocks.
  Status Columns(MatrixWeight* w, const std::string& what) const;
  // Keeps runs [first, first + count) of `total` equal runs of a matrix's rows (a view).
  Status KeepRows(MatrixWeight* w, int64_t first, int64_t count, int64_t total, const std::string& what) const;

 private:
  // The same over a vector's elements.
  Status KeepElements(TensorView* v, int64_t first, int64_t count, int64_t total, const std::string& what) const;

  TensorSplit split_;
  int64_t kv_heads_;
  HeadRange kv_;
  std::vector<std::unique_ptr<uint8_t[]>>* owned_;
};

}  // namespace gale
