// Hugging Face checkpoints as the architectures see them (`gale convert --hf`): the folder's JSON
// files and safetensors shards, and HfFamily, how a family's checkpoints become its GGUF: the
// generic driver (convert/hf_convert.cc) converts the llama-like layout (model.layers.N.self_attn.
// q_proj ...) with a family's variations and keys; a family with a layout of its own (DeepSeek-V4)
// brings its whole converter. Each family's description is in its architecture's file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_writer.h"
#include "gguf/safetensors.h"
#include "model/hf_tokenizer.h"

namespace gale {

struct HfConvertReport {
  int64_t num_tensors = 0, vocab = 0, layers = 0;
  std::vector<std::string> skipped;  // checkpoint tensors with no GGUF counterpart
  std::string pre;                   // the tokenizer's pre-tokenizer type
};

// config.json's integer `key` in [lo, hi]; fallback (when >= 0) if it is absent or null.
StatusOr<int64_t> HfConfigInt(const nlohmann::json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi);
// A number, or fallback when it is absent or not a number.
double HfConfigNum(const nlohmann::json& j, const char* key, double fallback);

// A JSON object from the file; an empty one when it is absent and not required.
StatusOr<nlohmann::json> ReadHfJson(const std::filesystem::path& p, bool required);

// The folder's tokenizer.json and tokenizer_config.json (empty when absent).
struct HfTokenizerFiles {
  nlohmann::json tokenizer, config;
};
StatusOr<HfTokenizerFiles> ReadHfTokenizerFiles(const std::filesystem::path& dir);

// general.name of a converted folder: its last path component.
std::string HfModelName(const std::filesystem::path& dir);

// What every converter does first: the folder's tokenizer files and tokenizer (config.json's ids
// as fallbacks, padded to vocab), and the file's general.* keys (architecture, name, file type).
struct HfFileStart {
  HfTokenizerFiles files;
  HfTokenizer tokenizer;
};
StatusOr<HfFileStart> StartHfFile(const std::filesystem::path& dir, const nlohmann::json& config, int64_t vocab,
                                  const std::string& arch, uint32_t file_type, GgufWriter* out);

// Every tensor of the folder's .safetensors files by name, each with the file that holds it (the
// writer fills tensors later, so each fill keeps its file mapped).
using HfTensors = std::map<std::string, std::pair<std::shared_ptr<SafetensorsFile>, const SafetensorsTensor*>>;
StatusOr<HfTensors> LoadHfTensors(const std::filesystem::path& dir);

// What a family's own keys hook sees of a llama-like checkpoint being converted: the config, the
// GGUF being written (under its prefix `p`), and the sizes the driver read.
struct HfKeysContext {
  const nlohmann::json& config;
  GgufWriter* out;
  std::string p;  // "{arch}."
  int64_t dim, layers, heads, head_dim, rope_dims, context_length;
  bool rope_scaling_done = false;  // the hook wrote the RoPE scaling: the driver leaves it
  // A f32 tensor of exactly these values (RoPE factors).
  Status AddFloats(const std::string& name, const std::vector<float>& v) const;
};

struct HfFamily {
  // config.json's architectures[0] (or model_type) names of the family's checkpoints.
  std::vector<std::string_view> names;
  // A whole converter for a layout of the family's own (null: the llama-like driver with the
  // variations below). type: the GGUF type of the F32/F16/BF16 matrices.
  StatusOr<HfConvertReport> (*convert)(const std::filesystem::path& dir, const nlohmann::json& config, GgmlType type,
                                       GgufWriter* out) = nullptr;
  // The llama-like layout's variations.
  bool permute_qk = false;     // RoPE in normal mode: q/k rows from Hugging Face's rotate-half order
  bool qkv_bias = false;       // self_attn.{q,k,v}_proj.bias
  bool qk_norm = false;        // self_attn.{q,k}_norm
  bool fused = false;          // qkv_proj and gate_up_proj (Phi-3)
  bool partial_rotary = false; // partial_rotary_factor rotates part of each head
  // Gemma's: norms store 1 + w, norms after attention and the FFN (pre_feedforward_layernorm is
  // the FFN's), the embedding tied unless the config says otherwise, the head size always written,
  // multimodal checkpoints (text_config, language_model.* names).
  bool gemma_layout = false;
  // Keys the family reads from the config (windows, soft-caps, RoPE scaling of its own kind);
  // errors name what cannot be converted.
  Status (*keys)(HfKeysContext& c) = nullptr;
};

}  // namespace gale
