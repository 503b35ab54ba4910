// API keys: the file's format, which source wins, and the match.
#include "server/api_keys.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace gale::server {
namespace {

std::string WriteFile(const std::string& text) {
  const std::string path = ::testing::TempDir() + "gale-keys-" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(ApiKeysTest, FileHoldsOneKeyPerLine) {
  const std::string path = WriteFile("# ops\r\n  alpha  \n\n\tbeta\r\n#gamma\n");
  auto keys = ReadApiKeyFile(path);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, (std::vector<std::string>{"alpha", "beta"}));
  std::ofstream(path, std::ios::binary) << "# none\n\n";
  EXPECT_NE(ReadApiKeyFile(path).status().message().find("holds no key"), std::string::npos);
  std::ofstream(path, std::ios::binary) << "two words\n";
  EXPECT_NE(ReadApiKeyFile(path).status().message().find("line 1"), std::string::npos);
  std::remove(path.c_str());
  EXPECT_NE(ReadApiKeyFile(path).status().message().find("cannot be read"), std::string::npos);
}

TEST(ApiKeysTest, FlagsAndFileBeforeTheEnvironment) {
  const std::string path = WriteFile("from-file\n");
  EXPECT_EQ(*ResolveApiKeys({"a"}, path, "env"), (std::vector<std::string>{"a", "from-file"}));
  EXPECT_EQ(*ResolveApiKeys({}, path, "env"), (std::vector<std::string>{"from-file"}));
  EXPECT_EQ(*ResolveApiKeys({}, "", " env \n"), (std::vector<std::string>{"env"}));
  EXPECT_TRUE(ResolveApiKeys({}, "", std::nullopt)->empty());
  EXPECT_FALSE(ResolveApiKeys({}, "", "").ok()) << "an empty GALE_API_KEY";
  EXPECT_FALSE(ResolveApiKeys({"a b"}, "", std::nullopt).ok());
  std::remove(path.c_str());
}

TEST(ApiKeysTest, MatchesWholeKeysOnly) {
  EXPECT_TRUE(ApiKeyMatches({}, "anything"));
  const std::vector<std::string> keys = {"alpha", "beta"};
  EXPECT_TRUE(ApiKeyMatches(keys, "alpha"));
  EXPECT_TRUE(ApiKeyMatches(keys, "beta"));
  for (const char* wrong : {"", "alph", "alphaa", "Alpha", "bet", "gamma"}) EXPECT_FALSE(ApiKeyMatches(keys, wrong)) << wrong;
}

}  // namespace
}  // namespace gale::server
