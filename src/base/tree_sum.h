// The one order in which partial sums of a split product are added (tensor parallelism: a rank's
// slices in MatMul, the ranks' sums in Communicator::AllReduceSum): neighbours in pairs, level by
// level, an odd last one carried up unchanged. For k = 4: (p0 + p1) + (p2 + p3). Level j's nodes are the
// sums of aligned runs of 2^j leaves, so a rank holding 2^j consecutive aligned slices can add its
// own first and the ranks' sums after: the same bits as one process adding all k.
#pragma once

#include <cstddef>
#include <span>

namespace gale {

// parts[0][i] = the tree sum of parts[*][i] for i < n; the other parts are scratch.
inline void TreeSum(std::span<float* const> parts, size_t n) {
  for (size_t step = 1; step < parts.size(); step *= 2) {
    for (size_t a = 0; a + step < parts.size(); a += 2 * step) {
      float* x = parts[a];
      const float* y = parts[a + step];
      for (size_t i = 0; i < n; ++i) x[i] += y[i];
    }
  }
}

}  // namespace gale
