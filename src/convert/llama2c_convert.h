// Conversion of llama2.c checkpoints (the legacy "version 0" float32 format of run.c) and their
// tokenizer.bin into a llama GGUF with SentencePiece tokenizer metadata, using llama.cpp's key
// names so llama.cpp loads the result too.
#pragma once

#include <string>

#include "base/status.h"
#include "gguf/gguf_writer.h"

namespace gale {

struct Llama2cConfig {
  int32_t dim, hidden_dim, num_layers, num_heads, num_kv_heads, vocab_size, seq_len;
  bool shared_classifier;
};

// Builds the GGUF in memory-backed form; WriteFile() it afterwards.
StatusOr<GgufWriter> ConvertLlama2c(const std::string& model_path, const std::string& tokenizer_path,
                                    Llama2cConfig* config_out = nullptr);

}  // namespace gale
