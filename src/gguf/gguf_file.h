// GgufFile: a read-only, bounds-checked view of a GGUF file (v2 and v3). Metadata is parsed into
// GgufValues; tensor data stays in the mmap and is handed out as TensorViews. Knows no model
// architecture: what a key means is the model layer's business.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "gguf/ggml_types.h"

namespace gale {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
inline constexpr uint64_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDims = 4;

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view GgufValueTypeName(GgufValueType type);

// One metadata value. Scalars keep their exact type and bits so a file round-trips unchanged.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint32;
  uint64_t bits = 0;      // scalar payload: the little-endian bytes, zero-extended
  std::string str;        // kString
  GgufValueType array_type = GgufValueType::kUint32;  // kArray: element type
  std::vector<GgufValue> array;                      // kArray: elements

  static GgufValue U8(uint8_t v) { return Scalar(GgufValueType::kUint8, v); }
  static GgufValue I8(int8_t v) { return Scalar(GgufValueType::kInt8, static_cast<uint8_t>(v)); }
  static GgufValue U16(uint16_t v) { return Scalar(GgufValueType::kUint16, v); }
  static GgufValue I16(int16_t v) { return Scalar(GgufValueType::kInt16, static_cast<uint16_t>(v)); }
  static GgufValue U32(uint32_t v) { return Scalar(GgufValueType::kUint32, v); }
  static GgufValue I32(int32_t v) { return Scalar(GgufValueType::kInt32, static_cast<uint32_t>(v)); }
  static GgufValue U64(uint64_t v) { return Scalar(GgufValueType::kUint64, v); }
  static GgufValue I64(int64_t v) { return Scalar(GgufValueType::kInt64, static_cast<uint64_t>(v)); }
  static GgufValue F32(float v);
  static GgufValue F64(double v);
  static GgufValue Bool(bool v) { return Scalar(GgufValueType::kBool, v ? 1 : 0); }
  static GgufValue String(std::string v);
  static GgufValue Array(GgufValueType elem_type, std::vector<GgufValue> elems);
  static GgufValue StringArray(const std::vector<std::string>& v);
  static GgufValue F32Array(const std::vector<float>& v);
  static GgufValue I32Array(const std::vector<int32_t>& v);

  // Typed reads; nullopt when the value is not of a compatible kind. Integers of any width
  // convert to int64 when they fit; floats and integers convert to double.
  std::optional<int64_t> AsInt() const;
  std::optional<double> AsDouble() const;
  std::optional<bool> AsBool() const;
  const std::string* AsString() const { return type == GgufValueType::kString ? &str : nullptr; }
  bool IsArrayOf(GgufValueType t) const { return type == GgufValueType::kArray && array_type == t; }

  bool operator==(const GgufValue& o) const;

 private:
  static GgufValue Scalar(GgufValueType t, uint64_t bits) {
    GgufValue v;
    v.type = t;
    v.bits = bits;
    return v;
  }
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type_id = 0;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the contiguous (fastest) dimension
  uint64_t offset = 0;         // from the start of the data section
  uint64_t num_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t NumElements() const;
};

// What model code sees of a tensor: type, shape (ggml order) and bytes. Type is supported by gale.
struct TensorView {
  GgmlType type;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t num_bytes = 0;

  int64_t NumElements() const;
  int64_t RowBytes() const { return gale::RowBytes(type, shape[0]); }
  int64_t NumRows() const { return NumElements() / shape[0]; }
  const uint8_t* Row(int64_t row_idx) const { return data + row_idx * RowBytes(); }
};

class GgufFile {
 public:
  // Maps the file read-only and parses it. Errors name the file and what is wrong.
  // With copy_to_memory the bytes are read into anonymous memory backed by transparent huge
  // pages instead (costs a copy and the load time; saves TLB misses when weights are streamed).
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path, bool copy_to_memory = false);
  // Parses bytes held in memory (tests, fuzzing). The file keeps its own copy.
  static StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::span<const uint8_t> bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_bytes() const { return size_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kvs_; }
  const GgufValue* Find(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // A view of a tensor whose type gale can compute with; clear errors otherwise.
  StatusOr<TensorView> Tensor(std::string_view name) const;

  // Gives the pages wholly inside [data, data + bytes) back to the OS, for tensor data no one
  // reads again (a matrix repacked elsewhere). A mapped file would re-read them from disk if
  // touched; a copy in memory would read zeros, so the caller must drop its pointers. No-op for
  // FromBytes. Returns the bytes released.
  uint64_t ReleasePages(const uint8_t* data, uint64_t bytes);
  // Locks the tensor data still in use (every page not given back by ReleasePages) in memory:
  // mlock, reading it in first where the page cache does not hold it. Returns the bytes locked,
  // or an error naming the limit (RLIMIT_MEMLOCK, `ulimit -l`) when the OS refuses. No-op (0) for
  // FromBytes.
  StatusOr<uint64_t> LockPages();

  // Typed metadata lookups with errors that name the key.
  StatusOr<int64_t> GetInt(std::string_view key) const;
  // The default when absent. A key present with a value of another kind also gives the default,
  // and is recorded: MistypedKeys() names it, so a loader can refuse the file rather than run
  // with a default the file did not ask for.
  int64_t GetInt(std::string_view key, int64_t default_value) const;
  StatusOr<double> GetDouble(std::string_view key) const;
  double GetDouble(std::string_view key, double default_value) const;
  StatusOr<std::string> GetString(std::string_view key) const;
  // Keys the defaulted lookups above found with a value of another kind (thread-safe).
  std::vector<std::string> MistypedKeys() const;

 private:
  GgufFile() = default;
  Status Parse();

  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;          // munmap on destruction when set
  std::vector<std::pair<uintptr_t, uintptr_t>> released_;  // page ranges ReleasePages gave back
  std::vector<uint8_t> owned_;       // FromBytes keeps the bytes here
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kvs_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
  mutable std::mutex mistyped_mu_;
  mutable std::vector<std::string> mistyped_;
  void NoteMistyped(std::string_view key) const;
};

}  // namespace gale
