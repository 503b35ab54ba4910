// GGUF serialization. One Emit() template writes to a file or a byte vector, so the two outputs
// cannot drift apart.
#include "gguf/gguf_writer.h"

#include <cstdio>
#include <cstring>
#include <memory>

namespace gale {
namespace {

struct VectorSink {
  std::vector<uint8_t>* out;
  void Write(const void* p, uint64_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out->insert(out->end(), b, b + n);
  }
  bool ok() const { return true; }
};

struct FileSink {
  FILE* f;
  bool failed = false;
  void Write(const void* p, uint64_t n) {
    if (!failed && n > 0 && std::fwrite(p, 1, n, f) != n) failed = true;
  }
  bool ok() const { return !failed; }
};

template <typename Sink>
void WriteU32(Sink& s, uint32_t v) { s.Write(&v, 4); }
template <typename Sink>
void WriteU64(Sink& s, uint64_t v) { s.Write(&v, 8); }
template <typename Sink>
void WriteString(Sink& s, const std::string& str) {
  WriteU64(s, str.size());
  s.Write(str.data(), str.size());
}

template <typename Sink>
void WriteValue(Sink& s, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kString: WriteString(s, v.str); return;
    case GgufValueType::kArray:
      WriteU32(s, static_cast<uint32_t>(v.array_type));
      WriteU64(s, v.array.size());
      for (const auto& e : v.array) WriteValue(s, e);
      return;
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool:
      s.Write(&v.bits, 1); return;
    case GgufValueType::kUint16: case GgufValueType::kInt16: s.Write(&v.bits, 2); return;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32:
      s.Write(&v.bits, 4); return;
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kFloat64:
      s.Write(&v.bits, 8); return;
  }
}

template <typename Sink>
void Pad(Sink& s, uint64_t written, uint64_t alignment) {
  static const uint8_t kZeros[256] = {};
  uint64_t pad = (alignment - written % alignment) % alignment;
  while (pad > 0) {
    const uint64_t n = pad < sizeof(kZeros) ? pad : sizeof(kZeros);
    s.Write(kZeros, n);
    pad -= n;
  }
}

// Counts bytes written to the wrapped sink (for padding).
template <typename Sink>
struct CountingSink {
  Sink* inner;
  uint64_t count = 0;
  void Write(const void* p, uint64_t n) {
    inner->Write(p, n);
    count += n;
  }
};

}  // namespace

void GgufWriter::SetValue(const std::string& key, GgufValue value) {
  for (auto& kv : kvs_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kvs_.emplace_back(key, std::move(value));
}

uint64_t GgufWriter::Alignment() const {
  for (const auto& kv : kvs_) {
    if (kv.first == "general.alignment") {
      if (auto v = kv.second.AsInt(); v && *v > 0) return static_cast<uint64_t>(*v);
    }
  }
  return kGgufDefaultAlignment;
}

Status GgufWriter::CheckTensor(const std::string& name, uint32_t type_id,
                               const std::vector<int64_t>& shape, uint64_t* num_bytes) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return InvalidArgument("tensor '{}' added twice", name);
  }
  if (name.size() >= 64) return InvalidArgument("tensor name '{}' is longer than llama.cpp's 63 bytes", name);
  if (shape.empty() || shape.size() > kGgufMaxDims) {
    return InvalidArgument("tensor '{}': {} dimensions (1 to {} allowed)", name, shape.size(), kGgufMaxDims);
  }
  const auto layout = BlockLayout(type_id);
  if (!layout) return InvalidArgument("tensor '{}': unknown ggml type id {}", name, type_id);
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument("tensor '{}': negative dimension", name);
    n *= d;
  }
  if (shape[0] % layout->block_size != 0) {
    return InvalidArgument("tensor '{}': first dimension {} is not a multiple of the {} block size {}",
                           name, shape[0], TypeName(type_id), layout->block_size);
  }
  *num_bytes = static_cast<uint64_t>(n / layout->block_size * layout->block_bytes);
  return Status::Ok();
}

Status GgufWriter::AddTensor(const std::string& name, uint32_t type_id, std::vector<int64_t> shape,
                             std::vector<uint8_t> data) {
  uint64_t num_bytes;
  RETURN_IF_ERROR(CheckTensor(name, type_id, shape, &num_bytes));
  if (data.size() != num_bytes) {
    return InvalidArgument("tensor '{}': {} bytes given, shape and type need {}", name, data.size(), num_bytes);
  }
  tensors_.push_back({name, type_id, std::move(shape), num_bytes, std::move(data), nullptr});
  return Status::Ok();
}

Status GgufWriter::AddTensor(const std::string& name, uint32_t type_id, std::vector<int64_t> shape,
                             FillFn fill) {
  uint64_t num_bytes;
  RETURN_IF_ERROR(CheckTensor(name, type_id, shape, &num_bytes));
  tensors_.push_back({name, type_id, std::move(shape), num_bytes, {}, std::move(fill)});
  return Status::Ok();
}

template <typename Sink>
void GgufWriter::Emit(Sink& sink) const {
  CountingSink<Sink> s{&sink};
  const uint64_t alignment = Alignment();
  WriteU32(s, kGgufMagic);
  WriteU32(s, 3);
  WriteU64(s, tensors_.size());
  WriteU64(s, kvs_.size());
  for (const auto& [key, value] : kvs_) {
    WriteString(s, key);
    WriteU32(s, static_cast<uint32_t>(value.type));
    WriteValue(s, value);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    WriteString(s, t.name);
    WriteU32(s, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) WriteU64(s, static_cast<uint64_t>(d));
    WriteU32(s, t.type_id);
    WriteU64(s, offset);
    offset += (t.num_bytes + alignment - 1) / alignment * alignment;
  }
  Pad(s, s.count, alignment);
  std::vector<uint8_t> scratch;
  for (const auto& t : tensors_) {
    if (t.fill) {
      scratch.assign(t.num_bytes, 0);
      t.fill(scratch.data(), t.num_bytes);
      s.Write(scratch.data(), t.num_bytes);
    } else {
      s.Write(t.data.data(), t.num_bytes);
    }
    Pad(s, s.count, alignment);
  }
}

Status GgufWriter::WriteFile(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return IoError("cannot create '{}': {}", tmp, std::strerror(errno));
  FileSink sink{f};
  Emit(sink);
  const bool close_ok = std::fclose(f) == 0;
  if (!sink.ok() || !close_ok) {
    std::remove(tmp.c_str());
    return IoError("writing '{}' failed (disk full?)", path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return IoError("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno));
  }
  return Status::Ok();
}

std::vector<uint8_t> GgufWriter::WriteToBytes() const {
  std::vector<uint8_t> out;
  VectorSink sink{&out};
  Emit(sink);
  return out;
}

}  // namespace gale
