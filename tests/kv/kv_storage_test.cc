// KvStorage's memory: reserved at construction, committed page by page on first write, or all at
// once by Prefault.
#include "kv/kv_storage.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace gale {
namespace {

// Pages of [p, p + bytes) that are resident (p page aligned).
int64_t ResidentPages(const uint8_t* p, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (mincore(const_cast<uint8_t*>(p), bytes, vec.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char c : vec) n += c & 1;
  return n;
}

TEST(KvStorageTest, PrefaultCommitsEveryPageAndKeepsZeros) {
  // 4 layers x 1024 blocks x 16 positions x 2 heads x 64 f16 = 16 MiB for K, the same for V.
  KvStorage kv(4, 2, 64, 1024, 16, kernels::KvType::kF16);
  const uint64_t k_bytes = 4ull * 1024 * 16 * 2 * 64 * 2;
  ASSERT_EQ(kv.num_bytes(), 2 * k_bytes);
  const uint8_t* k = kv.Layer(0).k;
  const uint8_t* v = kv.Layer(0).v;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ASSERT_EQ(reinterpret_cast<uintptr_t>(k) % page, 0u);
  // Reserved only: (almost) nothing resident before the first write. Not exactly nothing: the
  // mapping's header is written at construction, and where the mapping happens to start on a
  // 2 MiB boundary a transparent huge page backs the first 2 MiB with it (seen under ASan).
  const int64_t pages = static_cast<int64_t>(k_bytes / page);
  EXPECT_LE(ResidentPages(k, k_bytes), static_cast<int64_t>((2u << 20) / page));
  EXPECT_GE(kv.Prefault(), 0.0);
  EXPECT_EQ(ResidentPages(k, k_bytes), pages);
  EXPECT_EQ(ResidentPages(v, k_bytes), pages);
  const std::vector<uint8_t> zeros(page, 0);
  for (uint64_t i = 0; i < k_bytes; i += page) {
    ASSERT_TRUE(std::memcmp(k + i, zeros.data(), page) == 0 && std::memcmp(v + i, zeros.data(), page) == 0) << i;
  }
  // Writes and reads as before.
  std::vector<float> row(128), kr(128), vr(128);
  for (int i = 0; i < 128; ++i) row[i] = 0.5f * static_cast<float>(i);
  kv.Write(3, 63, 15, row.data(), row.data());
  kv.Read(3, 63, 15, kr.data(), vr.data());
  EXPECT_EQ(kr, row);
  EXPECT_EQ(vr, row);
}

}  // namespace
}  // namespace gale
