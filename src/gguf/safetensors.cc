// Safetensors: bounds-checked header parsing over a mapped file.
#include "gguf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

namespace gale {

int64_t SafetensorsTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t SafetensorsDtypeSize(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2" || dtype == "F8_E8M0") {
    return 1;
  }
  return 0;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return IoError("cannot open '{}'", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return IoError("cannot stat '{}'", path);
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return IoError("cannot map '{}'", path);
    }
    f->map_ = p;
    f->base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  RETURN_IF_ERROR(f->Parse());
  return f;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::vector<uint8_t> bytes, std::string name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = std::move(name);
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  RETURN_IF_ERROR(f->Parse());
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, size_);
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status SafetensorsFile::Parse() {
  if (size_ < 8) return DataLoss("{}: {} bytes is too short for a safetensors header", name_, size_);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(base_[i]) << (8 * i);
  if (header_len > size_ - 8 || header_len > (uint64_t{100} << 20)) {
    return DataLoss("{}: header of {} bytes runs past the end of the {}-byte file", name_, header_len, size_);
  }
  const std::string_view text(reinterpret_cast<const char*>(base_ + 8), header_len);
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss("{}: the header is not a JSON object", name_);
  const uint8_t* data = base_ + 8 + header_len;
  const uint64_t data_size = size_ - 8 - header_len;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& v = it.value();
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      return DataLoss("{}: tensor '{}' needs dtype, shape and two data_offsets", name_, it.key());
    }
    SafetensorsTensor t;
    t.name = it.key();
    t.dtype = v["dtype"].get<std::string>();
    int64_t n = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return DataLoss("{}: tensor '{}' has a bad dimension", name_, t.name);
      }
      t.shape.push_back(d.get<int64_t>());
      if (t.shape.back() > 0 && n > (int64_t{1} << 50) / t.shape.back()) {
        return DataLoss("{}: tensor '{}' is too large", name_, t.name);
      }
      n *= t.shape.back();
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return DataLoss("{}: tensor '{}' has bad data_offsets", name_, t.name);
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return DataLoss("{}: tensor '{}' data [{}, {}) runs past the {} bytes of data", name_, t.name, begin, end, data_size);
    }
    const int64_t es = SafetensorsDtypeSize(t.dtype);
    if (es == 0) return InvalidArgument("{}: tensor '{}' has unknown dtype '{}'", name_, t.name, t.dtype);
    if (end - begin != static_cast<uint64_t>(n * es)) {
      return DataLoss("{}: tensor '{}' has {} bytes, its shape and {} need {}", name_, t.name, end - begin, t.dtype,
                      n * es);
    }
    t.data = data + begin;
    t.num_bytes = end - begin;
    tensors_.push_back(std::move(t));
  }
  return Status::Ok();
}

std::vector<uint8_t> SafetensorsFile::Write(const std::vector<Entry>& entries) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.data.size()}}};
    offset += e.data.size();
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& e : entries) out.insert(out.end(), e.data.begin(), e.data.end());
  return out;
}

}  // namespace gale
