// Hyperparameters of a llama-family model, read from GGUF metadata under the architecture's
// prefix (`llama.embedding_length`, ...), with llama.cpp's key names and defaults.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace gale {

struct LlamaHParams {
  std::string arch;         // general.architecture
  int64_t dim = 0;          // embedding_length
  int64_t ffn_dim = 0;      // feed_forward_length
  int64_t num_layers = 0;   // block_count
  int64_t num_heads = 0;    // attention.head_count
  int64_t num_kv_heads = 0; // attention.head_count_kv (defaults to num_heads)
  int64_t head_dim = 0;     // dim / num_heads
  int64_t rope_dims = 0;    // rope.dimension_count (defaults to head_dim)
  int64_t context_length = 0;
  int64_t vocab_size = 0;   // rows of token_embd
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor for linear scaling

  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// Reads and validates; errors name the key and the rule broken.
StatusOr<LlamaHParams> ReadLlamaHParams(const GgufFile& file);

}  // namespace gale
