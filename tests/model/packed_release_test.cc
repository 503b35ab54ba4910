// Model::PackWeights(file): after the file's copy of the packed matrices goes back to the
// OS, forward passes are unchanged, and running those matrices on another ISA fails loudly
// instead of reading released pages.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "../test_util.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/synth.h"

namespace gale {
namespace {

std::vector<float> LastLogits(const Model& m, ThreadPool& pool) {
  KvCache kv(m.hparams(), 16);
  Workspace ws;
  ForwardBatch b;
  b.tokens = {1, 7, 42, 9};
  b.positions = {0, 1, 2, 3};
  EXPECT_TRUE(m.Forward(b, kv, ws, pool).ok());
  return std::vector<float>(ws.logits.begin(), ws.logits.begin() + m.hparams().vocab_size);
}

TEST(PackedReleaseTest, ReleasedSourcesLeaveOutputsUnchanged) {
  if (kernels::Active().pack[kernels::kSlotQ4_0] == nullptr) GTEST_SKIP() << "no packed Q4_0 layout on this CPU";
  const SynthShape shape = test::SmallGqaShape(1024);
  const auto path = test::TempPath("packed_release_test.gguf");
  ASSERT_TRUE(SynthesizeModel(shape, GgmlType::kQ4_0, 5)->WriteFile(path).ok());
  for (bool copy : {true, false}) {
    auto file = GgufFile::Open(path, copy).value();
    ThreadPool pool(2);
    auto kept = LoadModel(*file).value();
    kept->PackWeights();
    const auto before = LastLogits(*kept, pool);
    EXPECT_EQ(kept->released_bytes(), 0u);
    auto model = LoadModel(*file).value();
    model->PackWeights(file.get());
    const uint64_t released = model->released_bytes();
    // Every layer matrix and the untied output layer: all but the embedding, norms and header,
    // less at most a partial page at each end of each matrix.
    uint64_t matrices = 0;
    for (const auto& t : file->tensors()) {
      if (t.shape.size() == 2 && t.name != "token_embd.weight") matrices += t.num_bytes;
    }
    EXPECT_GT(released, matrices * 9 / 10) << "copy " << copy;
    model->PackWeights(file.get());  // again: keeps the packed copies it cannot rebuild
    EXPECT_EQ(model->released_bytes(), released);
    const auto after = LastLogits(*model, pool);
    ASSERT_EQ(before.size(), after.size());
    EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0) << "copy " << copy;
    // Another ISA would need the released originals. (The death test's child reruns this test
    // with its own file, and removes it: it never reaches the end.)
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(
        {
          std::filesystem::remove(path);
          kernels::SetActiveIsa(kernels::Isa::kScalar);
          LastLogits(*model, pool);
        },
        "released after packing");
  }
  std::filesystem::remove(path);
}

// A file held in memory (FromBytes) gives no pages back, yet its packed matrices are still cut
// off from their originals, and packing again keeps the packed copies rather than reading them.
TEST(PackedReleaseTest, PackingAgainAfterAReleaseOfNoBytesKeepsThePackedCopies) {
  if (kernels::Active().pack[kernels::kSlotQ4_0] == nullptr) GTEST_SKIP() << "no packed Q4_0 layout on this CPU";
  const auto bytes = SynthesizeModel(test::SmallGqaShape(1024), GgmlType::kQ4_0, 5)->WriteToBytes();
  auto file = GgufFile::FromBytes(bytes).value();
  ThreadPool pool(2);
  auto model = LoadModel(*file).value();
  model->PackWeights(file.get());
  EXPECT_EQ(model->released_bytes(), 0u);
  const auto before = LastLogits(*model, pool);
  model->PackWeights(file.get());
  const auto after = LastLogits(*model, pool);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace gale
