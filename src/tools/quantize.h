// `gale quantize` for llama.cpp's Q8_0 and Q4_0 (round-to-nearest, block scales; no calibration):
// every 2-D weight of an F32/F16/BF16 GGUF becomes the target type, except the token embedding
// and the output layer (unless asked), tensors named by a --keep regular expression, and tensors
// whose rows do not fit the type's block of 32 (those become F16 and are reported). Norms and
// other 1-D tensors are copied. Metadata is copied, with general.file_type set as llama.cpp sets
// it.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"

namespace gale {

struct QuantizeOptions {
  GgmlType type = GgmlType::kQ8_0;   // kQ8_0 or kQ4_0
  std::vector<std::string> keep;     // ECMAScript regexes searched in tensor names
  bool quantize_embeddings = false;  // token_embd.weight
  bool quantize_output = false;      // output.weight
};

struct QuantizeReport {
  int64_t quantized = 0;
  std::vector<std::string> kept;       // "name (why)"
  std::vector<std::string> to_f16;     // rows not a multiple of the block
  uint64_t bytes_in = 0, bytes_out = 0;
};

// Fills out; tensor data is produced while out is written (one row at a time).
StatusOr<QuantizeReport> QuantizeModel(const GgufFile& in, const QuantizeOptions& options, GgufWriter* out);

}  // namespace gale
