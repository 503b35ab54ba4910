// GgufWriter: builds a GGUF v3 file (the layout llama.cpp writes: header, metadata, tensor infos,
// padding to general.alignment, tensor data each padded to the alignment). Tensor bytes are
// either held in memory or produced by a callback at write time, so multi-GB files stream.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace gale {

class GgufWriter {
 public:
  // Fills `out` (exactly the tensor's byte size) with the tensor's data.
  using FillFn = std::function<void(uint8_t* out, uint64_t num_bytes)>;

  void SetValue(const std::string& key, GgufValue value);  // replaces an existing key in place
  void SetU32(const std::string& key, uint32_t v) { SetValue(key, GgufValue::U32(v)); }
  void SetF32(const std::string& key, float v) { SetValue(key, GgufValue::F32(v)); }
  void SetString(const std::string& key, std::string v) { SetValue(key, GgufValue::String(std::move(v))); }
  void SetBool(const std::string& key, bool v) { SetValue(key, GgufValue::Bool(v)); }

  // shape in ggml order (shape[0] contiguous). type_id may be any ggml type with a known layout.
  Status AddTensor(const std::string& name, uint32_t type_id, std::vector<int64_t> shape,
                   std::vector<uint8_t> data);
  Status AddTensor(const std::string& name, uint32_t type_id, std::vector<int64_t> shape, FillFn fill);

  Status WriteFile(const std::string& path) const;
  // The whole file in memory (tests).
  std::vector<uint8_t> WriteToBytes() const;

 private:
  struct PendingTensor {
    std::string name;
    uint32_t type_id;
    std::vector<int64_t> shape;
    uint64_t num_bytes;
    std::vector<uint8_t> data;
    FillFn fill;
  };
  Status CheckTensor(const std::string& name, uint32_t type_id, const std::vector<int64_t>& shape,
                     uint64_t* num_bytes) const;
  template <typename Sink>
  void Emit(Sink& sink) const;
  uint64_t Alignment() const;

  std::vector<std::pair<std::string, GgufValue>> kvs_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace gale
