// The Hugging Face folder's files: JSON, tokenizer files, safetensors shards.
#include "model/hf_checkpoint.h"

#include <algorithm>
#include <cstring>

#include "base/file.h"

namespace gale {

StatusOr<nlohmann::json> ReadHfJson(const std::filesystem::path& p, bool required) {
  if (!required && !std::filesystem::exists(p)) return nlohmann::json();
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(p.string()));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("'{}' is not a JSON object", p.string());
  return j;
}

StatusOr<int64_t> HfConfigInt(const nlohmann::json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback >= 0) return fallback;
    return InvalidArgument("config.json: '{}' is missing", key);
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < lo || j[key].get<int64_t>() > hi) {
    return InvalidArgument("config.json: '{}' must be an integer in [{}, {}]", key, lo, hi);
  }
  return j[key].get<int64_t>();
}

double HfConfigNum(const nlohmann::json& j, const char* key, double fallback) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

StatusOr<HfTokenizerFiles> ReadHfTokenizerFiles(const std::filesystem::path& dir) {
  HfTokenizerFiles f;
  ASSIGN_OR_RETURN(f.tokenizer, ReadHfJson(dir / "tokenizer.json", true));
  ASSIGN_OR_RETURN(f.config, ReadHfJson(dir / "tokenizer_config.json", false));
  return f;
}

std::string HfModelName(const std::filesystem::path& dir) {
  return dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
}

StatusOr<HfFileStart> StartHfFile(const std::filesystem::path& dir, const nlohmann::json& config, int64_t vocab,
                                  const std::string& arch, uint32_t file_type, GgufWriter* out) {
  HfFileStart start;
  ASSIGN_OR_RETURN(start.files, ReadHfTokenizerFiles(dir));
  ASSIGN_OR_RETURN(start.tokenizer, ImportHfTokenizer(start.files.tokenizer, start.files.config, config, vocab));
  out->SetString("general.architecture", arch);
  out->SetString("general.name", HfModelName(dir));
  out->SetU32("general.file_type", file_type);
  return start;
}

StatusOr<HfTensors> LoadHfTensors(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  HfTensors tensors;
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) return InvalidArgument("'{}' has no .safetensors files", dir.string());
  for (const auto& p : paths) {
    ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> f, SafetensorsFile::Open(p.string()));
    for (const auto& t : f->tensors()) {
      if (!tensors.emplace(t.name, std::make_pair(f, &t)).second) {
        return InvalidArgument("tensor '{}' is in two files", t.name);
      }
    }
  }
  return tensors;
}

Status HfKeysContext::AddFloats(const std::string& name, const std::vector<float>& v) const {
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return out->AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), {static_cast<int64_t>(v.size())}, std::move(bytes));
}

}  // namespace gale
