// `gale convert --hf DIR`: a Hugging Face checkpoint (config.json, *.safetensors, tokenizer.json,
// optionally tokenizer_config.json) to a GGUF with llama.cpp's names and layout. The
// architecture comes from config.json's architectures through the registry (each architecture's
// file describes its family: model/hf_checkpoint.h's HfFamily). The llama-like layout is
// converted here: weights renamed (model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight,
// biases, per-head norms, fused matrices), q/k rows permuted from Hugging Face's rotate-half order
// where the family's RoPE is in normal mode, matrices as F32, F16 or BF16 (norms and biases stay
// F32), hyperparameters under the architecture's prefix, the family's own keys by its hook.
// Tokenizers from tokenizer.json (model/hf_tokenizer.h). A family with a layout of its own
// (DeepSeek-V4 / V4.1) brings its converter.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_writer.h"
#include "model/hf_checkpoint.h"
#include "model/hf_tokenizer.h"

namespace gale {

// type: F32, F16 or BF16 for the matrices.
StatusOr<HfConvertReport> ConvertHf(const std::string& dir, GgmlType type, GgufWriter* out);

// The tokenizer of a Hugging Face folder alone (tokenizer.json, tokenizer_config.json if there),
// its vocabulary as many tokens as its highest id + 1 (`gale synth --tokenizer`).
StatusOr<HfTokenizer> ReadHfTokenizerDir(const std::string& dir);

}  // namespace gale
