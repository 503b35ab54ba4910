// `gale quantize`: every 2-D weight of an F32/F16/BF16 GGUF becomes the scheme's type, except the
// token embedding and the output layer (unless asked), tensors named by a --keep regular
// expression, and tensors whose rows do not fit the type's block or group (those become F16 and
// are reported). Norms and other 1-D tensors are copied. Metadata is copied, with
// general.file_type set as llama.cpp sets it (1024, "guessed", for gale's own types).
//
// Schemes:
//   q8_0, q4_0  llama.cpp's types, round to nearest (bit-exact with its quantizer)
//   q4_k, q6_k  llama.cpp's K-quant layouts (super-blocks of 256), round-to-nearest scales
//   w8a8        int8 weights in groups of 32 with an f16 scale (stored as Q8_0) and int8
//               activations (gale quantizes them per 32 at run time); with calibration,
//               SmoothQuant migrates activation outliers into the weights (--smooth-alpha)
//   w4a16       int4 weights, groups of 64 or 128, symmetric or with a zero point, f32
//               activations; with calibration, an AWQ-style search for per-channel scales and a
//               clipping ratio per matrix
//   w4a8        the same int4 weights (symmetric) with int8 activations
// Per-channel scales are folded where they cost nothing at run time: into the RMSNorm weights
// before wq/wk/wv and w_gate/w_up, into wv's rows before wo (shared per KV channel under GQA), and
// into w_up's rows before w_down; the consumers' columns take the inverse.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "quant/calibration.h"

namespace gale {

enum class QuantScheme { kQ8_0, kQ4_0, kW8A8, kW4A16, kW4A8, kQ4_K, kQ6_K, kQ4_1, kQ5_0, kQ5_1, kIQ4_NL, kIQ4_XS,
                         kMXFP4,    // mxfp4: the experts (3-D tensors) MXFP4, other matrices Q8_0, as llama.cpp's MXFP4_MOE
                         kFP8 };    // fp8: the experts MXFP4, other matrices F8E4M3, DeepSeek-V4's release types
// "q8_0", "q4_0", "w8a8", "w4a16", "w4a8", "q4_k", "q6_k"
StatusOr<QuantScheme> ParseQuantScheme(const std::string& name);
const char* QuantSchemeName(QuantScheme s);

struct QuantizeOptions {
  QuantScheme scheme = QuantScheme::kQ8_0;
  int group_size = 128;     // w4a16, w4a8: 64 or 128
  bool zero_point = false;  // w4a16: asymmetric groups
  double smooth_alpha = 0.5;  // w8a8 with calibration: migration strength in [0, 1]
  const ActivationStats* calibration = nullptr;  // SmoothQuant (w8a8) or AWQ search (w4)
  std::vector<std::string> keep;     // ECMAScript regexes searched in tensor names
  bool quantize_embeddings = false;  // token_embd.weight
  bool quantize_output = false;      // output.weight
  ThreadPool* pool = nullptr;        // for the AWQ search's products (required with calibration)
  std::function<void(const std::string&)> progress;  // one line per step of the search
  // Tests: apply the calibrated scales but write every matrix as F32 (the transform alone must
  // leave the model's outputs unchanged).
  bool transform_only = false;
};

// The storage type of a scheme's quantized matrices.
StatusOr<GgmlType> SchemeType(const QuantizeOptions& options);

struct QuantizeReport {
  int64_t quantized = 0;  // matrices of the scheme's type
  int64_t quantized_q8 = 0;  // mxfp4: the other matrices, Q8_0
  std::vector<std::string> kept;       // "name (why)"
  // "name (rows of N): type" for matrices whose rows do not fit the scheme's block: llama.cpp's
  // fallbacks for the K-quants (Q4_K -> Q5_0, Q6_K -> Q8_0) and IQ4_XS (-> IQ4_NL), else F16.
  std::vector<std::string> fallbacks;
  std::vector<std::string> transforms;  // per layer and input: the scales chosen
  uint64_t bytes_in = 0, bytes_out = 0;
};

// Fills out; tensor data is produced while out is written (one row at a time).
StatusOr<QuantizeReport> QuantizeModel(const GgufFile& in, const QuantizeOptions& options, GgufWriter* out);

}  // namespace gale
