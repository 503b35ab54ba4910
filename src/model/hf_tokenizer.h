// tokenizer.json (+ tokenizer_config.json) of a Hugging Face checkpoint to GGUF's tokenizer keys
// (`gale convert --hf`): byte-level BPE (GPT-2's pre-tokenizer, or Llama 3's or Qwen2's split regex) with
// merges, or SentencePiece-style BPE with byte fallback (Llama 2, Mistral, TinyLlama) as GGUF's
// "llama" tokenizer with scores from merge ranks; added tokens become control or user-defined
// tokens. The files are untrusted: every field's type and every id is checked. Reads no files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "gguf/gguf_writer.h"

namespace gale {

struct HfTokenizer {
  bool spm = false;                  // SentencePiece-style ("llama"); else byte-level BPE ("gpt2")
  std::string pre;                   // the pre-tokenizer: "sentencepiece", "gpt-2", "llama-bpe" or "qwen2"
  std::vector<std::string> tokens;   // [vocab]
  std::vector<int32_t> types;        // [vocab] GGUF token types
  std::vector<float> scores;         // [vocab] spm only
  std::vector<std::string> merges;   // "a b", by rank
  bool add_space_prefix = false;     // spm only
  int64_t unk = -1, bos = -1, eos = -1;
  bool add_bos = false;
  std::optional<std::string> chat_template;
};

// config: the checkpoint's config.json (for bos/eos ids it may give); vocab: its vocab_size.
StatusOr<HfTokenizer> ImportHfTokenizer(const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config,
                                        const nlohmann::json& config, int64_t vocab);

// Writes the tokenizer.* keys.
void WriteHfTokenizer(const HfTokenizer& t, GgufWriter* out);

}  // namespace gale
