#include "gguf/gguf_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "../test_util.h"
#include "gguf/gguf_writer.h"

namespace gale {
namespace {

GgufWriter SampleWriter() {
  GgufWriter w;
  w.SetValue("u8", GgufValue::U8(200));
  w.SetValue("i8", GgufValue::I8(-100));
  w.SetValue("u16", GgufValue::U16(60000));
  w.SetValue("i16", GgufValue::I16(-30000));
  w.SetValue("u32", GgufValue::U32(4000000000u));
  w.SetValue("i32", GgufValue::I32(-2000000000));
  w.SetValue("f32", GgufValue::F32(3.25f));
  w.SetValue("bool", GgufValue::Bool(true));
  w.SetValue("str", GgufValue::String("h\xc3\xa9llo"));
  w.SetValue("u64", GgufValue::U64(~0ull));
  w.SetValue("i64", GgufValue::I64(-(1ll << 60)));
  w.SetValue("f64", GgufValue::F64(-1.5e300));
  w.SetValue("arr.str", GgufValue::StringArray({"a", "", "ccc"}));
  w.SetValue("arr.f32", GgufValue::F32Array({1.0f, -2.0f}));
  w.SetValue("arr.nested", GgufValue::Array(GgufValueType::kArray,
                                            {GgufValue::I32Array({1, 2}), GgufValue::I32Array({}),
                                             GgufValue::I32Array({3})}));
  w.SetValue("arr.empty", GgufValue::Array(GgufValueType::kUint8, {}));
  std::vector<uint8_t> a(6 * 4 * 4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  EXPECT_TRUE(w.AddTensor("a", static_cast<uint32_t>(GgmlType::kF32), {6, 4}, a).ok());
  std::vector<uint8_t> b(2 * 34);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i);
  EXPECT_TRUE(w.AddTensor("b.q8", static_cast<uint32_t>(GgmlType::kQ8_0), {64}, b).ok());
  std::vector<uint8_t> c(66);  // an iq2_xxs super-block: readable, not computable
  EXPECT_TRUE(w.AddTensor("c.iq2xxs", 16, {256}, c).ok());
  return w;
}

TEST(GgufTest, RoundTripPreservesEveryKeyAndTensorByte) {
  GgufWriter w = SampleWriter();
  const std::vector<uint8_t> bytes = w.WriteToBytes();
  auto f = GgufFile::FromBytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->metadata().size(), 16u);
  EXPECT_EQ(*(*f)->Find("u8")->AsInt(), 200);
  EXPECT_EQ(*(*f)->Find("i8")->AsInt(), -100);
  EXPECT_EQ(*(*f)->Find("i16")->AsInt(), -30000);
  EXPECT_EQ(*(*f)->Find("u32")->AsInt(), 4000000000ll);
  EXPECT_EQ(*(*f)->Find("i32")->AsInt(), -2000000000);
  EXPECT_EQ(*(*f)->Find("f32")->AsDouble(), 3.25);
  EXPECT_EQ(*(*f)->Find("bool")->AsBool(), true);
  EXPECT_EQ(*(*f)->Find("str")->AsString(), "h\xc3\xa9llo");
  EXPECT_FALSE((*f)->Find("u64")->AsInt().has_value());  // does not fit int64
  EXPECT_EQ((*f)->Find("u64")->bits, ~0ull);
  EXPECT_EQ(*(*f)->Find("i64")->AsInt(), -(1ll << 60));
  EXPECT_EQ(*(*f)->Find("f64")->AsDouble(), -1.5e300);
  const GgufValue* nested = (*f)->Find("arr.nested");
  ASSERT_EQ(nested->array.size(), 3u);
  EXPECT_EQ(nested->array[0].array.size(), 2u);
  EXPECT_EQ(*nested->array[2].array[0].AsInt(), 3);
  // Every key equal to what was written, in order.
  GgufWriter again;
  for (const auto& [k, v] : (*f)->metadata()) again.SetValue(k, v);
  for (const auto& t : (*f)->tensors()) {
    ASSERT_TRUE(again.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
  }
  EXPECT_EQ(again.WriteToBytes(), bytes);
  const GgufTensorInfo* a = (*f)->FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{6, 4}));
  for (uint64_t i = 0; i < a->num_bytes; ++i) ASSERT_EQ(a->data[i], static_cast<uint8_t>(i * 7));
  EXPECT_EQ((*f)->data_offset() % 32, 0u);
  auto iq2 = (*f)->Tensor("c.iq2xxs");
  EXPECT_EQ(iq2.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(iq2.status().message().find("iq2_xxs"), std::string::npos);
}

// --mlock's half in the file: LockPages locks the tensor data's pages but those ReleasePages gave
// back (packed matrices), or fails naming the locked-memory limit; never re-reads released pages.
TEST(GgufTest, LockPagesSkipsReleasedPages) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  const int64_t n = 1 << 20;  // two tensors of 4 MiB
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE(w.AddTensor(name, 0, {n}, std::vector<uint8_t>(n * 4, 1)).ok());
  }
  const std::string path = test::TempPath("lock_test.gguf");
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto f = GgufFile::Open(path, /*copy_to_memory=*/false).value();
  const GgufTensorInfo* a = f->FindTensor("a");
  const uint64_t released = f->ReleasePages(a->data, a->num_bytes);
  EXPECT_GT(released, 4u * 1024 * 1024 - 2 * 4096);
  auto locked = f->LockPages();
  if (!locked.ok()) {  // an unprivileged run with a small `ulimit -l`
    EXPECT_NE(locked.status().message().find("ulimit -l"), std::string::npos) << locked.status().message();
  } else {
    const uint64_t data = f->file_bytes() - f->data_offset();
    EXPECT_GE(*locked + released, data);
    EXPECT_LE(*locked + released, data + 2 * 4096);
    EXPECT_LT(*locked, data - 4u * 1024 * 1024 + 2 * 4096);
  }
  f.reset();
  std::filesystem::remove(path);
}

TEST(GgufTest, OpenMapsFileAndHonorsAlignment) {
  GgufWriter w = SampleWriter();
  w.SetU32("general.alignment", 64);
  const auto path = std::filesystem::path(test::TempPath("gguf_test.gguf"));
  ASSERT_TRUE(w.WriteFile(path.string()).ok());
  auto f = GgufFile::Open(path.string());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  for (const auto& t : (*f)->tensors()) EXPECT_EQ(t.offset % 64, 0u);
  // Read into memory instead of mapped: the same metadata and tensor bytes.
  auto copy = GgufFile::Open(path.string(), /*copy_to_memory=*/true);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ((*copy)->metadata().size(), (*f)->metadata().size());
  for (const auto& t : (*f)->tensors()) {
    const GgufTensorInfo* c = (*copy)->FindTensor(t.name);
    ASSERT_NE(c, nullptr);
    ASSERT_EQ(c->num_bytes, t.num_bytes);
    EXPECT_EQ(std::memcmp(c->data, t.data, t.num_bytes), 0);
    EXPECT_NE(c->data, t.data);
  }
  std::filesystem::remove(path);
  auto missing = GgufFile::Open(path.string());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
}

// Every prefix of a valid file is rejected with an error, never a crash.
TEST(GgufTest, EveryTruncationIsAnError) {
  const std::vector<uint8_t> bytes = SampleWriter().WriteToBytes();
  for (size_t n = 0; n < bytes.size(); ++n) {
    // Prefixes that end inside the padding after the last tensor are still complete files.
    auto f = GgufFile::FromBytes(std::span(bytes.data(), n));
    if (f.ok()) {
      const auto& last = (*f)->tensors().back();
      ASSERT_GE(n, (*f)->data_offset() + last.offset + last.num_bytes) << "accepted truncated file of " << n;
    } else {
      ASSERT_FALSE(f.status().message().empty());
    }
  }
}

std::vector<uint8_t> Patch(std::vector<uint8_t> b, size_t at, const void* v, size_t n) {
  std::memcpy(b.data() + at, v, n);
  return b;
}

std::string ErrorOf(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::FromBytes(bytes);
  return f.ok() ? "" : f.status().message();
}

TEST(GgufTest, BadHeadersGetClearErrors) {
  const std::vector<uint8_t> good = SampleWriter().WriteToBytes();
  EXPECT_NE(ErrorOf(Patch(good, 0, "GGUX", 4)).find("not a GGUF file"), std::string::npos);
  uint32_t v1 = 1, v9 = 9, vbe = 0x03000000;
  EXPECT_NE(ErrorOf(Patch(good, 4, &v1, 4)).find("version 1"), std::string::npos);
  EXPECT_NE(ErrorOf(Patch(good, 4, &v9, 4)).find("unsupported GGUF version 9"), std::string::npos);
  EXPECT_NE(ErrorOf(Patch(good, 4, &vbe, 4)).find("big-endian"), std::string::npos);
  uint64_t huge = 1ull << 62;
  EXPECT_NE(ErrorOf(Patch(good, 8, &huge, 8)).find("tensor count"), std::string::npos);
  EXPECT_NE(ErrorOf(Patch(good, 16, &huge, 8)).find("metadata count"), std::string::npos);
  // First key's length (at byte 24) far past the end.
  EXPECT_NE(ErrorOf(Patch(good, 24, &huge, 8)).find("past the end"), std::string::npos);
}

TEST(GgufTest, BadValuesAndTensorsGetClearErrors) {
  auto build = [](auto mutate) {
    GgufWriter w;
    w.SetU32("k", 1);
    std::vector<uint8_t> t(4 * 8);
    EXPECT_TRUE(w.AddTensor("t", 0, {8}, t).ok());
    std::vector<uint8_t> b = w.WriteToBytes();
    mutate(b);
    return ErrorOf(b);
  };
  // Layout: header 24 | key "k" (8+1) | type u32 at 33 | value at 37 | tensor name len at 41,
  // "t" at 49 | n_dims at 50 | dim at 54 | type at 62 | offset at 66.
  EXPECT_NE(build([](auto& b) { uint32_t t = 99; std::memcpy(&b[33], &t, 4); }).find("not a GGUF type"), std::string::npos);
  EXPECT_NE(build([](auto& b) { uint32_t n = 7; std::memcpy(&b[50], &n, 4); }).find("7 dimensions"), std::string::npos);
  EXPECT_NE(build([](auto& b) { uint32_t t = 77; std::memcpy(&b[62], &t, 4); }).find("unknown ggml type id 77"), std::string::npos);
  EXPECT_NE(build([](auto& b) { uint64_t o = 1ull << 40; std::memcpy(&b[66], &o, 8); }).find("runs past the end"), std::string::npos);
  EXPECT_NE(build([](auto& b) { uint64_t o = 3; std::memcpy(&b[66], &o, 8); }).find("alignment"), std::string::npos);
  EXPECT_NE(build([](auto& b) { uint64_t d = 1ull << 62; std::memcpy(&b[54], &d, 8); }).find("tensor 't'"), std::string::npos);
  EXPECT_NE(build([](auto& b) { uint32_t t = 8; std::memcpy(&b[62], &t, 4); }).find("block size"), std::string::npos);  // q8_0 with 8 elems
  EXPECT_NE(build([](auto& b) { uint32_t t = 7; std::memcpy(&b[33], &t, 4); b[37] = 5; }).find("bool"), std::string::npos);
}

TEST(GgufTest, HugeArrayCountIsRejectedBeforeAllocating) {
  GgufWriter w;
  w.SetValue("a", GgufValue::StringArray({"x"}));
  std::vector<uint8_t> b = w.WriteToBytes();
  // key "a": 24 + 8 + 1 = 33 type, 37 elem type, 41 count
  uint64_t huge = 1ull << 60;
  std::memcpy(&b[41], &huge, 8);
  EXPECT_NE(ErrorOf(b).find("cannot fit"), std::string::npos);
}

TEST(GgufTest, DeeplyNestedArraysAreRejected) {
  GgufValue v = GgufValue::I32Array({1});
  for (int i = 0; i < 20; ++i) v = GgufValue::Array(GgufValueType::kArray, {v});
  GgufWriter w;
  w.SetValue("deep", v);
  EXPECT_NE(ErrorOf(w.WriteToBytes()).find("nested deeper"), std::string::npos);
}

TEST(GgufTest, WriterRejectsBadTensors) {
  GgufWriter w;
  EXPECT_FALSE(w.AddTensor("x", 8, {33}, std::vector<uint8_t>(34)).ok());  // q8_0 needs 32 | ne0
  EXPECT_FALSE(w.AddTensor("x", 0, {4}, std::vector<uint8_t>(3)).ok());    // wrong byte count
  EXPECT_TRUE(w.AddTensor("x", 0, {4}, std::vector<uint8_t>(16)).ok());
  EXPECT_FALSE(w.AddTensor("x", 0, {4}, std::vector<uint8_t>(16)).ok());   // duplicate
}

}  // namespace
}  // namespace gale
