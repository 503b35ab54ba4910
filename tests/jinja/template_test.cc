// The Jinja engine against the reference Jinja2 renderings of real models' chat templates
// (../shared/chat-templates/expected.jsonl: every entry must match exactly, or fail where Jinja2
// failed), plus the language corners and the sandbox limits.
#include "jinja/template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "../test_util.h"

namespace gale::jinja {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::tm FixedClock() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 0;
  tm.tm_mday = 2;
  tm.tm_hour = 3;
  tm.tm_min = 4;
  tm.tm_sec = 5;
  tm.tm_wday = 5;  // a Friday
  tm.tm_yday = 1;
  return tm;
}

TEST(TemplateTest, ConformsToJinja2OnRealChatTemplates) {
  const std::string dir = test::SharedDir() + "/chat-templates";
  std::ifstream in(dir + "/expected.jsonl");
  ASSERT_TRUE(in) << "missing " << dir << "/expected.jsonl";
  RenderOptions ro;
  ro.now = FixedClock();
  int total = 0, passed = 0;
  std::string failures;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto entry = nlohmann::ordered_json::parse(line);
    const std::string name = entry["template"];
    const std::string label = name + (entry.contains("case") ? " / " + entry["case"].get<std::string>() : "");
    ++total;
    auto t = Template::Parse(ReadFile(dir + "/templates/" + name));
    if (entry.contains("compile_error")) {
      if (!t.ok()) ++passed; else failures += label + ": parsed, Jinja2 raised " + entry["compile_error"].get<std::string>() + "\n";
      continue;
    }
    if (!t.ok()) {
      failures += label + ": " + t.status().ToString() + "\n";
      continue;
    }
    auto out = t->Render(entry["context"], ro);
    if (entry.contains("error")) {
      if (!out.ok()) ++passed; else failures += label + ": rendered, Jinja2 raised " + entry["error"].get<std::string>() + "\n";
      continue;
    }
    if (!out.ok()) {
      failures += label + ": " + out.status().ToString() + "\n";
      continue;
    }
    const std::string want = entry["expected"];
    if (*out == want) {
      ++passed;
      continue;
    }
    size_t at = 0;
    while (at < want.size() && at < out->size() && want[at] == (*out)[at]) ++at;
    failures += label + ": differs at byte " + std::to_string(at) + ": want " +
                nlohmann::json(want.substr(at > 20 ? at - 20 : 0, 80)).dump() + " got " +
                nlohmann::json(out->substr(at > 20 ? at - 20 : 0, 80)).dump() + "\n";
  }
  std::printf("chat template conformance: %d of %d entries\n", passed, total);
  EXPECT_EQ(passed, total) << failures;
  EXPECT_GE(total, 175);
}

}  // namespace
}  // namespace gale::jinja
