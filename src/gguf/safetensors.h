// Safetensors reader (Hugging Face checkpoints): an 8-byte little-endian header length, a JSON
// header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// tensors' bytes (row-major, offsets relative to the end of the header). The file is mapped and
// untrusted: the header's size, every offset, shape and dtype size are checked against the file
// before a tensor is exposed. Knows no architecture. Plus a writer for tests and tools.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace gale {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // "F32", "F16", "BF16", ... as written
  std::vector<int64_t> shape;   // row-major: shape.back() is contiguous
  const uint8_t* data = nullptr;
  uint64_t num_bytes = 0;
  int64_t NumElements() const;
};

// Bytes per element of a dtype name; 0 when unknown.
int64_t SafetensorsDtypeSize(std::string_view dtype);

class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  static StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::vector<uint8_t> bytes, std::string name = "<memory>");
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& name() const { return name_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(std::string_view name) const;

  // A file holding the given tensors (tests).
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  static std::vector<uint8_t> Write(const std::vector<Entry>& entries);

 private:
  SafetensorsFile() = default;
  Status Parse();

  std::string name_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;  // mmap'd region (Open), or null
  std::vector<uint8_t> owned_;  // FromBytes
  std::vector<SafetensorsTensor> tensors_;
};

}  // namespace gale
