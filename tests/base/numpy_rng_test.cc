// gale's port of NumPy's default generator against NumPy's own outputs (NumPy 1.24, Debian 12's
// python3-numpy):
//   g = np.random.default_rng(seed); g.bit_generator.random_raw(3)
//   np.random.SeedSequence(seed).generate_state(4, np.uint64)
//   hb = max(1, (np.iinfo(np.int64).max // V) // 2); g.integers(0, hb, size=(n,), dtype=np.int64) * 2 + 1
// (the last is how DeepSeek-V4.1's Engram draws its hash multipliers: seed + 10007 * layer).
#include "base/numpy_rng.h"

#include <gtest/gtest.h>

#include <limits>

namespace gale {
namespace {

TEST(NumpyRngTest, SeedSequenceAndRawOutputsMatchNumpy) {
  EXPECT_EQ(NumpySeedState(10007, 4),
            (std::vector<uint64_t>{0x77d32a348ad70d07ull, 0x993ed609b84a4fa5ull, 0xd5f972dec8698e49ull,
                                   0x7d79ebaebcf148deull}));
  NumpyPcg64 g(10007);
  EXPECT_EQ(g.Next64(), 15187255322829266483ull);
  EXPECT_EQ(g.Next64(), 959186003677246517ull);
  EXPECT_EQ(g.Next64(), 7126631698937927467ull);
}

TEST(NumpyRngTest, EngramMultipliersMatchNumpy) {
  struct Case {
    uint64_t seed;
    int64_t vocab;
    std::vector<int64_t> want;
  };
  const Case cases[] = {
      {0, 99092, {59287678272599, 25111444230055, 3813769577005, 1538373747317}},
      {10007, 99092, {76632096046245, 4839876093313, 35959672319349, 73987337458391}},
      {140098, 99092, {67716810739261, 51510806800915, 30921347202721, 82619226485591}},
      {12345678901234567890ull, 200, {194838190827831, 30084056930155829, 28033540139003283}},
      {7, 258, {22346852895527805, 32074948383499881, 27730378700759353}},
  };
  for (const Case& c : cases) {
    const int64_t half = std::max<int64_t>(1, std::numeric_limits<int64_t>::max() / c.vocab / 2);
    NumpyPcg64 g(c.seed);
    auto r = g.Integers(half, static_cast<int64_t>(c.want.size()));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (size_t i = 0; i < c.want.size(); ++i) EXPECT_EQ((*r)[i] * 2 + 1, c.want[i]) << c.seed << " " << i;
  }
  NumpyPcg64 g(1);
  EXPECT_FALSE(g.Integers(1000, 2).ok());  // NumPy's 32-bit path: not written
}

}  // namespace
}  // namespace gale
