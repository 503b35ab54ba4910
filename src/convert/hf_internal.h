// What the Hugging Face converters share: the folder's JSON files and safetensors shards, and the
// DeepSeek-V4 / V4.1 converter (its own file: the layout has little in common with llama's).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "convert/hf_convert.h"
#include "gguf/safetensors.h"

namespace gale {

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

// Every tensor of the folder's .safetensors files by name, each with the file that holds it (the
// writer fills tensors later, so each fill keeps its file mapped).
using HfTensors = std::map<std::string, std::pair<std::shared_ptr<SafetensorsFile>, const SafetensorsTensor*>>;
StatusOr<HfTensors> LoadHfTensors(const std::filesystem::path& dir);

// DeepseekV4ForCausalLM (flat config.json) and DeepseekV41ForCausalLM (config under text_config).
// type: the GGUF type of the BF16/F16/F32 matrices (FP8 and FP4 tensors keep their bytes).
StatusOr<HfConvertReport> ConvertDeepseek4Hf(const std::filesystem::path& dir, const nlohmann::json& config,
                                             GgmlType type, GgufWriter* out);

}  // namespace gale
