// GGUF parsing. Every count, length and offset read from the file is checked against the bytes
// that remain before it is used, so a hostile file costs at most its own size in memory and gets
// a DataLoss/InvalidArgument status naming the key or tensor at fault.
#include "gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "base/check.h"

namespace gale {
namespace {

constexpr int kMaxArrayDepth = 8;
constexpr uint64_t kMaxNameBytes = 1 << 16;

// Bytes a value of this type needs at least on disk (used to bound counts before allocating).
uint64_t MinEncodedBytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString: return 8;
    case GgufValueType::kArray: return 12;
  }
  return 1;
}

uint64_t ScalarBytes(GgufValueType t) {
  return t == GgufValueType::kString || t == GgufValueType::kArray ? 0 : MinEncodedBytes(t);
}

bool ValidValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status ReadBytes(void* out, uint64_t n, std::string_view what) {
    if (n > remaining()) {
      return DataLoss("file truncated while reading {} at byte {} (needs {} bytes, {} left)", what,
                      pos_, n, remaining());
    }
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  Status ReadU32(uint32_t* v, std::string_view what) { return ReadBytes(v, 4, what); }
  Status ReadU64(uint64_t* v, std::string_view what) { return ReadBytes(v, 8, what); }

  Status ReadString(std::string* s, std::string_view what) {
    uint64_t n;
    RETURN_IF_ERROR(ReadU64(&n, what));
    if (n > remaining()) {
      return DataLoss("{}: string length {} at byte {} runs past the end of the file ({} bytes left)",
                      what, n, pos_ - 8, remaining());
    }
    s->assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return Status::Ok();
  }

  Status ReadValue(GgufValueType type, GgufValue* v, const std::string& key, int depth) {
    v->type = type;
    if (type == GgufValueType::kString) return ReadString(&v->str, "value of key '" + key + "'");
    if (type == GgufValueType::kArray) {
      if (depth >= kMaxArrayDepth) {
        return DataLoss("key '{}': arrays nested deeper than {}", key, kMaxArrayDepth);
      }
      uint32_t elem_type = 0;
      uint64_t count = 0;
      RETURN_IF_ERROR(ReadU32(&elem_type, "array type of key '" + key + "'"));
      if (!ValidValueType(elem_type)) {
        return DataLoss("key '{}': array element type {} is not a GGUF value type", key, elem_type);
      }
      RETURN_IF_ERROR(ReadU64(&count, "array length of key '" + key + "'"));
      const auto et = static_cast<GgufValueType>(elem_type);
      if (count > remaining() / MinEncodedBytes(et)) {
        return DataLoss("key '{}': array of {} {} elements cannot fit in the {} bytes left", key,
                        count, GgufValueTypeName(et), remaining());
      }
      v->array_type = et;
      v->array.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        RETURN_IF_ERROR(ReadValue(et, &v->array[i], key, depth + 1));
      }
      return Status::Ok();
    }
    const uint64_t n = ScalarBytes(type);
    v->bits = 0;
    RETURN_IF_ERROR(ReadBytes(&v->bits, n, "value of key '" + key + "'"));
    if (type == GgufValueType::kBool && v->bits > 1) {
      return DataLoss("key '{}': bool value {} is neither 0 nor 1", key, v->bits);
    }
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  static constexpr std::string_view kNames[] = {"uint8", "int8",  "uint16", "int16", "uint32",
                                                "int32", "float32", "bool", "string", "array",
                                                "uint64", "int64", "float64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : "invalid";
}

GgufValue GgufValue::F32(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return Scalar(GgufValueType::kFloat32, b);
}
GgufValue GgufValue::F64(double v) {
  uint64_t b;
  std::memcpy(&b, &v, 8);
  return Scalar(GgufValueType::kFloat64, b);
}
GgufValue GgufValue::String(std::string v) {
  GgufValue r;
  r.type = GgufValueType::kString;
  r.str = std::move(v);
  return r;
}
GgufValue GgufValue::Array(GgufValueType elem_type, std::vector<GgufValue> elems) {
  GgufValue r;
  r.type = GgufValueType::kArray;
  r.array_type = elem_type;
  r.array = std::move(elems);
  return r;
}
GgufValue GgufValue::StringArray(const std::vector<std::string>& v) {
  std::vector<GgufValue> e;
  e.reserve(v.size());
  for (const auto& s : v) e.push_back(String(s));
  return Array(GgufValueType::kString, std::move(e));
}
GgufValue GgufValue::F32Array(const std::vector<float>& v) {
  std::vector<GgufValue> e;
  e.reserve(v.size());
  for (float f : v) e.push_back(F32(f));
  return Array(GgufValueType::kFloat32, std::move(e));
}
GgufValue GgufValue::I32Array(const std::vector<int32_t>& v) {
  std::vector<GgufValue> e;
  e.reserve(v.size());
  for (int32_t i : v) e.push_back(I32(i));
  return Array(GgufValueType::kInt32, std::move(e));
}

std::optional<int64_t> GgufValue::AsInt() const {
  switch (type) {
    case GgufValueType::kUint8: return static_cast<uint8_t>(bits);
    case GgufValueType::kInt8: return static_cast<int8_t>(bits);
    case GgufValueType::kUint16: return static_cast<uint16_t>(bits);
    case GgufValueType::kInt16: return static_cast<int16_t>(bits);
    case GgufValueType::kUint32: return static_cast<uint32_t>(bits);
    case GgufValueType::kInt32: return static_cast<int32_t>(bits);
    case GgufValueType::kInt64: return static_cast<int64_t>(bits);
    case GgufValueType::kUint64:
      if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(bits);
    default: return std::nullopt;
  }
}

std::optional<double> GgufValue::AsDouble() const {
  if (type == GgufValueType::kFloat32) {
    float f;
    uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (type == GgufValueType::kFloat64) {
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  if (auto i = AsInt()) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> GgufValue::AsBool() const {
  if (type == GgufValueType::kBool) return bits != 0;
  return std::nullopt;
}

bool GgufValue::operator==(const GgufValue& o) const {
  if (type != o.type) return false;
  if (type == GgufValueType::kString) return str == o.str;
  if (type == GgufValueType::kArray) return array_type == o.array_type && array == o.array;
  return bits == o.bits;
}

int64_t GgufTensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) munmap(mapping_, size_);
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path, bool copy_to_memory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open '{}': {}", path, std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError("cannot stat '{}': {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("'{}' is not a regular file", path);
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ > 0 && copy_to_memory) {
    // read() rather than a mapping copied out: the file's pages are never mapped here, so the
    // resident set holds one copy of the weights, also while loading.
    void* a = mmap(nullptr, file->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) {
      ::close(fd);
      return IoError("cannot allocate {} bytes to load '{}' into memory", file->size_, path);
    }
    file->mapping_ = a;  // unmapped by the destructor, also on the errors below
    file->base_ = static_cast<const uint8_t*>(a);
    madvise(a, file->size_, MADV_HUGEPAGE);
    uint64_t done = 0;
    while (done < file->size_) {
      const uint64_t want = std::min<uint64_t>(file->size_ - done, uint64_t{64} << 20);
      const ssize_t got = ::pread(fd, static_cast<uint8_t*>(a) + done, want, static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        const int err = got < 0 ? errno : 0;
        ::close(fd);
        return IoError("cannot read '{}' at byte {}: {}", path, done, got < 0 ? std::strerror(err) : "unexpected end of file");
      }
      done += static_cast<uint64_t>(got);
    }
  } else if (file->size_ > 0) {
    void* m = mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return IoError("cannot mmap '{}': {}", path, std::strerror(err));
    }
    file->mapping_ = m;
    file->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  Status s = file->Parse();
  if (!s.ok()) return s.WithContext(path);
  return file;
}

uint64_t GgufFile::ReleasePages(const uint8_t* data, uint64_t bytes) {
  if (mapping_ == nullptr || bytes == 0) return 0;
  CHECK(data >= base_ && data + bytes <= base_ + size_);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end <= begin) return 0;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) != 0) return 0;
  released_.emplace_back(begin, end);
  return end - begin;
}

StatusOr<uint64_t> GgufFile::LockPages() {
  if (mapping_ == nullptr) return uint64_t{0};
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uintptr_t, uintptr_t>> released = released_;
  std::sort(released.begin(), released.end());
  // The tensor data's pages (from the page holding data_offset_), less the released ranges.
  uintptr_t at = (reinterpret_cast<uintptr_t>(base_) + data_offset_) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(base_) + size_;
  uint64_t locked = 0;
  auto lock = [&](uintptr_t a, uintptr_t b) -> Status {
    if (b <= a) return Status::Ok();
    if (mlock(reinterpret_cast<void*>(a), b - a) != 0) {
      return ResourceExhausted("mlock of {} bytes of the model file failed: {} (raise the locked-memory limit, `ulimit -l`)",
                               b - a, std::strerror(errno));
    }
    locked += b - a;
    return Status::Ok();
  };
  for (const auto& [b, e] : released) {
    if (e <= at) continue;
    RETURN_IF_ERROR(lock(at, std::min(b, end)));
    at = std::max(at, e);
  }
  RETURN_IF_ERROR(lock(at, end));
  return locked;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::span<const uint8_t> bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->owned_.assign(bytes.begin(), bytes.end());
  file->base_ = file->owned_.data();
  file->size_ = file->owned_.size();
  RETURN_IF_ERROR(file->Parse());
  return file;
}

Status GgufFile::Parse() {
  Reader r(base_, size_);
  uint32_t magic;
  RETURN_IF_ERROR(r.ReadU32(&magic, "magic"));
  if (magic != kGgufMagic) {
    return InvalidArgument("not a GGUF file: magic is 0x{:08x}, expected 0x{:08x} (\"GGUF\")", magic,
                           kGgufMagic);
  }
  RETURN_IF_ERROR(r.ReadU32(&version_, "version"));
  if (version_ == 1) return Unimplemented("GGUF version 1 is not supported (re-convert the model)");
  if (version_ != 2 && version_ != 3) {
    if (__builtin_bswap32(version_) == 2 || __builtin_bswap32(version_) == 3) {
      return Unimplemented("big-endian GGUF files are not supported");
    }
    return InvalidArgument("unsupported GGUF version {} (gale reads versions 2 and 3)", version_);
  }
  uint64_t num_tensors, num_kvs;
  RETURN_IF_ERROR(r.ReadU64(&num_tensors, "tensor count"));
  RETURN_IF_ERROR(r.ReadU64(&num_kvs, "metadata count"));
  // A kv needs >= 13 bytes, a tensor info >= 24: bound counts before reserving anything.
  if (num_kvs > r.remaining() / 13) {
    return DataLoss("metadata count {} cannot fit in a file of {} bytes", num_kvs, size_);
  }
  if (num_tensors > r.remaining() / 24) {
    return DataLoss("tensor count {} cannot fit in a file of {} bytes", num_tensors, size_);
  }

  kvs_.reserve(num_kvs);
  for (uint64_t i = 0; i < num_kvs; ++i) {
    std::string key;
    RETURN_IF_ERROR(r.ReadString(&key, fmt::format("key of metadata entry {}", i)));
    if (kv_index_.count(key)) return DataLoss("duplicate metadata key '{}'", key);
    uint32_t type;
    RETURN_IF_ERROR(r.ReadU32(&type, "type of key '" + key + "'"));
    if (!ValidValueType(type)) return DataLoss("key '{}': value type {} is not a GGUF type", key, type);
    GgufValue value;
    RETURN_IF_ERROR(r.ReadValue(static_cast<GgufValueType>(type), &value, key, 0));
    kv_index_.emplace(key, kvs_.size());
    kvs_.emplace_back(std::move(key), std::move(value));
  }

  if (const GgufValue* a = Find("general.alignment")) {
    const auto v = a->AsInt();
    if (a->type != GgufValueType::kUint32 || !v || *v == 0 || (*v & (*v - 1)) != 0) {
      return InvalidArgument("general.alignment must be a uint32 power of two");
    }
    alignment_ = static_cast<uint64_t>(*v);
  }

  tensors_.reserve(num_tensors);
  for (uint64_t i = 0; i < num_tensors; ++i) {
    GgufTensorInfo t;
    RETURN_IF_ERROR(r.ReadString(&t.name, fmt::format("name of tensor {}", i)));
    if (t.name.size() > kMaxNameBytes) return DataLoss("tensor {}: name of {} bytes is too long", i, t.name.size());
    if (tensor_index_.count(t.name)) return DataLoss("duplicate tensor name '{}'", t.name);
    uint32_t num_dims;
    RETURN_IF_ERROR(r.ReadU32(&num_dims, "dimension count of tensor '" + t.name + "'"));
    if (num_dims == 0 || num_dims > kGgufMaxDims) {
      return DataLoss("tensor '{}': {} dimensions (1 to {} allowed)", t.name, num_dims, kGgufMaxDims);
    }
    int64_t num_elements = 1;
    for (uint32_t d = 0; d < num_dims; ++d) {
      uint64_t dim;
      RETURN_IF_ERROR(r.ReadU64(&dim, "shape of tensor '" + t.name + "'"));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && static_cast<uint64_t>(num_elements) >
                           static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim)) {
        return DataLoss("tensor '{}': shape overflows 64 bits", t.name);
      }
      num_elements *= static_cast<int64_t>(dim);
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    RETURN_IF_ERROR(r.ReadU32(&t.type_id, "type of tensor '" + t.name + "'"));
    const auto layout = BlockLayout(t.type_id);
    if (!layout) return DataLoss("tensor '{}': unknown ggml type id {}", t.name, t.type_id);
    if (t.shape[0] % layout->block_size != 0) {
      return DataLoss("tensor '{}': first dimension {} is not a multiple of the {} block size {}",
                      t.name, t.shape[0], TypeName(t.type_id), layout->block_size);
    }
    const uint64_t num_blocks = static_cast<uint64_t>(num_elements / layout->block_size);
    if (num_blocks > std::numeric_limits<uint64_t>::max() / layout->block_bytes) {
      return DataLoss("tensor '{}': byte size overflows 64 bits", t.name);
    }
    t.num_bytes = num_blocks * layout->block_bytes;
    RETURN_IF_ERROR(r.ReadU64(&t.offset, "offset of tensor '" + t.name + "'"));
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t header_end = r.pos();
  data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (num_tensors > 0 && data_offset_ > size_) {
    return DataLoss("file truncated: the tensor data section would start at byte {} of {}",
                    data_offset_, size_);
  }
  const uint64_t data_bytes = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (auto& t : tensors_) {
    if (t.offset % alignment_ != 0) {
      return DataLoss("tensor '{}': offset {} is not a multiple of the alignment {}", t.name,
                      t.offset, alignment_);
    }
    if (t.offset > data_bytes || t.num_bytes > data_bytes - t.offset) {
      return DataLoss("tensor '{}': data [{}, {}) runs past the end of the data section ({} bytes; "
                      "the file is truncated or corrupt)",
                      t.name, t.offset, t.offset + t.num_bytes, data_bytes);
    }
    t.data = base_ + data_offset_ + t.offset;
  }
  return Status::Ok();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<TensorView> GgufFile::Tensor(std::string_view name) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) return NotFound("tensor '{}' not found", name);
  const auto traits = GetTypeTraits(t->type_id);
  if (!traits) {
    return Unimplemented("tensor '{}' has type {} (id {}), which gale cannot compute with yet", name,
                         TypeName(t->type_id), t->type_id);
  }
  TensorView v;
  v.type = traits->type;
  v.shape = t->shape;
  v.data = t->data;
  v.num_bytes = t->num_bytes;
  return v;
}

StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound("metadata key '{}' is missing", key);
  auto i = v->AsInt();
  if (!i) return InvalidArgument("metadata key '{}' is a {}, expected an integer", key, GgufValueTypeName(v->type));
  return *i;
}

int64_t GgufFile::GetInt(std::string_view key, int64_t default_value) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return default_value;
  if (!v->AsInt()) NoteMistyped(key);
  return v->AsInt().value_or(default_value);
}

void GgufFile::NoteMistyped(std::string_view key) const {
  std::lock_guard<std::mutex> lock(mistyped_mu_);
  if (std::find(mistyped_.begin(), mistyped_.end(), key) == mistyped_.end()) mistyped_.emplace_back(key);
}

std::vector<std::string> GgufFile::MistypedKeys() const {
  std::lock_guard<std::mutex> lock(mistyped_mu_);
  return mistyped_;
}

StatusOr<double> GgufFile::GetDouble(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound("metadata key '{}' is missing", key);
  auto d = v->AsDouble();
  if (!d) return InvalidArgument("metadata key '{}' is a {}, expected a number", key, GgufValueTypeName(v->type));
  return *d;
}

double GgufFile::GetDouble(std::string_view key, double default_value) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return default_value;
  if (!v->AsDouble()) NoteMistyped(key);
  return v->AsDouble().value_or(default_value);
}

StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound("metadata key '{}' is missing", key);
  if (v->type != GgufValueType::kString) {
    return InvalidArgument("metadata key '{}' is a {}, expected a string", key, GgufValueTypeName(v->type));
  }
  return v->str;
}

}  // namespace gale
