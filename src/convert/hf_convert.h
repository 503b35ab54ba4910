// `gale convert --hf DIR`: a Hugging Face checkpoint (config.json, *.safetensors, tokenizer.json,
// optionally tokenizer_config.json) of Llama, Mistral, Qwen2/2.5 or Qwen3 to a GGUF with
// llama.cpp's names and layout: weights renamed (model.layers.N.self_attn.q_proj.weight ->
// blk.N.attn_q.weight, Qwen2's biases, Qwen3's q_norm/k_norm), for llama q/k rows permuted from
// Hugging Face's rotate-half order to the interleaved pairs llama's RoPE expects (Qwen's NEOX
// RoPE takes them as they are), matrices as F32, F16 or BF16 (norms and biases stay F32),
// hyperparameters under the architecture's prefix. Tokenizers from tokenizer.json: byte-level
// BPE (GPT-2's pre-tokenizer, or Llama 3's or Qwen2's split regex) with merges,
// or SentencePiece-style BPE with byte fallback (Llama 2, Mistral, TinyLlama) as GGUF's "llama"
// tokenizer with scores from merge ranks; added tokens become control or user-defined tokens.
// DeepSeek-V4 / V4.1 checkpoints go through their own converter (hf_deepseek4.cc): FP8 and FP4
// tensors are kept exactly (F8E4M3, MXFP4), the rest as for the others.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_writer.h"
#include "convert/hf_tokenizer.h"

namespace gale {

struct HfConvertReport {
  int64_t num_tensors = 0, vocab = 0, layers = 0;
  std::vector<std::string> skipped;  // checkpoint tensors with no GGUF counterpart
  std::string pre;                   // the tokenizer's pre-tokenizer type
};

// type: F32, F16 or BF16 for the matrices.
StatusOr<HfConvertReport> ConvertHf(const std::string& dir, GgmlType type, GgufWriter* out);

// The tokenizer of a Hugging Face folder alone (tokenizer.json, tokenizer_config.json if there),
// its vocabulary as many tokens as its highest id + 1 (`gale synth --tokenizer`).
StatusOr<HfTokenizer> ReadHfTokenizerDir(const std::string& dir);

}  // namespace gale
