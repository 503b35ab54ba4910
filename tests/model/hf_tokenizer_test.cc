// tokenizer.json import on hostile and malformed files: every one is an error naming the file,
// never an exception or an out-of-bounds read (each case below threw or read past the token list
// before), and well-formed files still import.
#include "model/hf_tokenizer.h"

#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/tokenizer.h"

namespace gale {
namespace {

using Json = nlohmann::json;

Json ByteLevel() {
  return Json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<s>": 3}, "merges": ["a b"]},
                         "pre_tokenizer": {"type": "ByteLevel", "use_regex": true},
                         "post_processor": {"single": [{"SpecialToken": {"id": "<s>"}}]}})");
}

TEST(HfTokenizerTest, ImportsAWellFormedFile) {
  auto t = ImportHfTokenizer(ByteLevel(), Json::parse(R"({"bos_token": "<s>"})"), Json::object(), 8);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->pre, "gpt-2");
  EXPECT_EQ(t->tokens.size(), 8u);
  EXPECT_EQ(t->bos, 3);
  EXPECT_TRUE(t->add_bos);
  EXPECT_EQ(t->merges, std::vector<std::string>{"a b"});
}

TEST(HfTokenizerTest, MalformedFilesAreErrors) {
  struct Case {
    const char* name;
    Json tokenizer, config;
  };
  std::vector<Case> cases;
  auto with = [](const char* pointer, Json v) {
    Json j = ByteLevel();
    j[Json::json_pointer(pointer)] = std::move(v);
    return j;
  };
  cases.push_back({"pre-tokenizer list of numbers",
                   with("/pre_tokenizer", Json::parse(R"({"type": "Sequence", "pretokenizers": [1, "x"]})")), {}});
  cases.push_back({"split pattern as a string",
                   with("/pre_tokenizer", Json::parse(R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": "x"}]})")), {}});
  cases.push_back({"byte_fallback as a string", with("/model/byte_fallback", "yes"), {}});
  cases.push_back({"use_regex as a number", with("/pre_tokenizer/use_regex", 3), {}});
  cases.push_back({"added token 'special' as a string",
                   with("/added_tokens", Json::parse(R"([{"id": 5, "content": "<x>", "special": "yes"}])")), {}});
  cases.push_back({"negative token id", with("/model/vocab/a", -1), {}});
  cases.push_back({"token id past any vocabulary", with("/model/vocab/a", int64_t{1} << 40), {}});
  cases.push_back({"more tokens than vocab_size", with("/model/vocab/z", 100), {}});
  cases.push_back({"merge as a number", with("/model/merges", Json::parse("[7]")), {}});
  cases.push_back({"type as an array", with("/model/type", Json::array()), {}});
  cases.push_back({"bos id past the tokens", ByteLevel(), Json::parse(R"({"bos_token_id": 99999})")});
  cases.push_back({"eos id past the tokens", ByteLevel(), Json::parse(R"({"eos_token_id": [12345]})")});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    StatusOr<HfTokenizer> t = InvalidArgument("not run");
    EXPECT_NO_THROW(t = ImportHfTokenizer(c.tokenizer, Json::object(), c.config.is_null() ? Json::object() : c.config, 8));
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(".json"), std::string::npos) << t.status().ToString();
  }
}

// A byte-fallback vocab whose "byte" token is not two hex digits ("<0x<s>", found by
// hf_tokenizer_fuzz: std::stoi threw while decoding it): it imports, and decodes to its own text.
TEST(HfTokenizerTest, ByteTokensThatAreNotHexDecodeAsText) {
  const Json tj = Json::parse(R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}]},
      "model": {"type": "BPE", "byte_fallback": true, "vocab": {"<unk>": 1, "<0x<s>": 0, "</s>": 2, "<0x41>": 3,
      "\u2581": 4, "h": 5, "\u2581h": 6}, "merges": [["\u2581", "h"]]}})");
  auto t = ImportHfTokenizer(tj, Json::object(), Json::parse(R"({"bos_token_id": 1, "eos_token_id": 2})"), 300);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  WriteHfTokenizer(*t, &w);
  auto file = GgufFile::FromBytes(w.WriteToBytes()).value();
  auto tok = Tokenizer::FromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::string text;
  EXPECT_NO_THROW(text = (*tok)->Decode({0, 3, 6}));
  EXPECT_EQ(text, "<0x<s>A h");
}

}  // namespace
}  // namespace gale
