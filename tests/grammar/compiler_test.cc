// The constraint compiler and the matcher's bounds (src/grammar/compiler.h, matcher.h): hostile
// grammars are refused with the bound they passed, never followed at any cost; refusals are
// cached; large enumerations stay cheap to follow.
#include "grammar/compiler.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "byte_trie.h"

namespace gale::grammar {
namespace {

Constraint Gbnf(const std::string& text) { return {Constraint::Kind::kGbnf, text, ""}; }

// ("a"{0,9999}){0,9999} is ambiguous past counting (every split of a run of a's into groups is
// a parse): its first state alone would take ~10^8 stacks.
TEST(GrammarCompiler, ARepetitionOfARepetitionIsRefusedNamingTheBound) {
  GrammarCompiler c(test::ByteTrie());
  auto g = c.Compile(Gbnf(R"(root ::= ("a"{0,9999}){0,9999})"));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("too ambiguous to follow"), std::string::npos) << g.status().message();
  // Refusals are cached: the same constraint again is answered without compiling.
  auto again = c.Cached(Gbnf(R"(root ::= ("a"{0,9999}){0,9999})"));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->status().message(), g.status().message());
  EXPECT_FALSE(c.Cached(Gbnf(R"(root ::= "b")")).has_value());
}

TEST(GrammarCompiler, TheTimeLimitIsNamed) {
  // A first state of ~250K stacks' work: within the work bound, past a 0 ms limit.
  GrammarCompiler c(test::ByteTrie(), 64, std::chrono::milliseconds(0));
  auto g = c.Compile(Gbnf(R"(root ::= ("a"{0,300}){0,300})"));
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("took longer than the server's limit of 0 ms"), std::string::npos)
      << g.status().message();
  GrammarCompiler roomy(test::ByteTrie());
  EXPECT_TRUE(roomy.Compile(Gbnf(R"(root ::= ("a"{0,30}){0,30})")).ok());
}

// The limit covers converting a schema, not only building the first state: a schema of 100,000
// parts is refused about when the limit is reached, naming where the conversion stopped.
TEST(GrammarCompiler, TheTimeLimitCoversConvertingTheSchema) {
  nlohmann::ordered_json any = nlohmann::ordered_json::array();
  for (int i = 0; i < 100000; ++i) {
    any.push_back({{"type", "object"}, {"properties", {{"k" + std::to_string(i), {{"type", "integer"}}}}}});
  }
  const Constraint c{Constraint::Kind::kJsonSchema, nlohmann::ordered_json{{"anyOf", any}}.dump(), ""};
  GrammarCompiler quick(test::ByteTrie(), 64, std::chrono::milliseconds(20));
  const auto t0 = std::chrono::steady_clock::now();
  auto g = quick.Compile(c);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("took longer than the server's limit of 20 ms"), std::string::npos)
      << g.status().message();
  EXPECT_NE(g.status().message().find("/anyOf/"), std::string::npos) << g.status().message();
  // Parsing the schema's 3 MB of JSON comes first and is not bounded; the conversion after it is.
  const auto p0 = std::chrono::steady_clock::now();
  const auto parsed = nlohmann::ordered_json::parse(c.text);
  EXPECT_TRUE(parsed.is_object());
  const double parse_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0).count();
  EXPECT_LT(ms, 3 * parse_ms + 500) << "refused after " << ms << " ms";
}

// Values checked against the keywords beside them (an enum of 20,000 against 2,000 branches) are
// inside the bound as well.
TEST(GrammarCompiler, TheTimeLimitCoversCheckingEnumValues) {
  nlohmann::ordered_json values = nlohmann::ordered_json::array(), any = nlohmann::ordered_json::array();
  for (int i = 0; i < 20000; ++i) values.push_back("v" + std::to_string(i));
  for (int i = 0; i < 2000; ++i) any.push_back({{"maxLength", i}});
  const Constraint c{Constraint::Kind::kJsonSchema, nlohmann::ordered_json{{"enum", values}, {"anyOf", any}}.dump(), ""};
  GrammarCompiler quick(test::ByteTrie(), 64, std::chrono::milliseconds(20));
  const auto t0 = std::chrono::steady_clock::now();
  auto g = quick.Compile(c);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("took longer than the server's limit of 20 ms"), std::string::npos) << g.status().message();
  EXPECT_LT(ms, 500) << "refused after " << ms << " ms";
}

// A grammar whose first state is cheap and whose second explodes: the compiler cannot see it, so
// the matcher stops at its work bound and the request (only it) ends with that error.
TEST(GrammarMatcherBounds, AnExplosionAfterTheFirstTokenStopsAtTheWorkBound) {
  GrammarCompiler c(test::ByteTrie());
  auto g = c.Compile(Gbnf(R"(root ::= "x" ("a"{0,9999}){0,9999})"));
  ASSERT_TRUE(g.ok()) << g.status().message();
  GrammarMatcher m(*g, {});
  ASSERT_TRUE(m.Accept('x').ok());
  std::vector<float> logits(256, 0.0f);
  EXPECT_FALSE(m.MaskLogits(logits));
  EXPECT_EQ(m.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find("steps of work"), std::string::npos) << m.status().message();
  // At most one step's charge past the bound (a charge is at most an arena's worth of stacks).
  EXPECT_LE(m.last_call_work(), kMaxWorkPerCall + kMaxMatcherNodes);
  EXPECT_LE(m.num_nodes(), kMaxMatcherNodes);
  // Dead from there on, at no further cost.
  EXPECT_FALSE(m.Allows('a'));
  EXPECT_FALSE(m.Accept('a').ok());
  // Another request of the same grammar is its own: it starts afresh.
  GrammarMatcher other(*g, {});
  EXPECT_TRUE(other.status().ok());
  EXPECT_TRUE(other.Allows('x'));
}

// An enum of 20,000 strings is a trie after left-factoring: its first state is one stack, and
// each character is one step.
TEST(GrammarCompiler, ALargeEnumIsFollowedWithOneStack) {
  nlohmann::ordered_json schema;
  for (int i = 0; i < 20000; ++i) schema["enum"].push_back("value" + std::to_string(i));
  GrammarCompiler c(test::ByteTrie());
  auto g = c.Compile({Constraint::Kind::kJsonSchema, schema.dump(), ""});
  ASSERT_TRUE(g.ok()) << g.status().message();
  ASSERT_NE((*g)->start(), nullptr);
  EXPECT_LT((*g)->start()->num_nodes(), 64);
  EXPECT_TRUE(test::AcceptsText(*g, "\"value12345\""));
  EXPECT_TRUE(test::AcceptsText(*g, "\"value0\""));
  EXPECT_FALSE(test::AcceptsText(*g, "\"value20000\""));
  EXPECT_FALSE(test::AcceptsText(*g, "\"value\""));
  GrammarMatcher m(*g, {});
  for (char ch : std::string("\"value1999")) ASSERT_TRUE(m.Accept(static_cast<unsigned char>(ch)).ok());
  EXPECT_LT(m.num_nodes(), 200);
}

// Left-factoring keeps the language: shared prefixes, a prefix that is itself an alternative,
// duplicates, empty alternatives and alternatives that start with a rule.
TEST(GrammarCompiler, LeftFactoringKeepsTheLanguage) {
  const std::string gbnf = R"(root ::= "ab" | "abc" | "a" | "ab" | "" | x "q" | "b" x
x ::= "a" "z" | "a" | "a" "z" "z")";
  GrammarCompiler c(test::ByteTrie());
  auto g = c.Compile(Gbnf(gbnf));
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const char* yes : {"", "a", "ab", "abc", "aq", "azq", "azzq", "ba", "baz", "bazz"}) {
    EXPECT_TRUE(test::AcceptsText(*g, yes)) << yes;
  }
  for (const char* no : {"abcd", "b", "q", "azzzq", "bazzz", "aa"}) EXPECT_FALSE(test::AcceptsText(*g, no)) << no;
}

// A grammar's masks are shared by its requests, but stop tokens are each request's own: a
// request without a stop token never sees another's allowed.
TEST(GrammarMatcherBounds, StopTokensAreNotSharedThroughTheMaskCache) {
  GrammarCompiler c(test::ByteTrie());
  auto g = c.Compile(Gbnf(R"(root ::= "a"*)"));
  ASSERT_TRUE(g.ok());
  GrammarMatcher with(*g, {'z'}), without(*g, {});
  EXPECT_TRUE(((*with.Mask())['z' >> 6] >> ('z' & 63)) & 1);
  EXPECT_FALSE(((*without.Mask())['z' >> 6] >> ('z' & 63)) & 1);
  std::vector<float> logits(256, 1.0f);
  ASSERT_TRUE(without.MaskLogits(logits));
  EXPECT_TRUE(std::isinf(logits['z']));
  EXPECT_EQ(logits['a'], 1.0f);
}

}  // namespace
}  // namespace gale::grammar

namespace gale::grammar {
namespace {

// Free text up to a marker's first occurrence: exactly the texts without it, for a marker whose
// prefixes recur (KMP's fallbacks) and one of several code points.
TEST(GrammarCompiler, TextWithoutAMarker) {
  for (const std::string marker : {"</think>", "abab", "aab", "\xC3\xA9t\xC3\xA9"}) {
    SCOPED_TRACE(marker);
    auto g = ParseGbnf(TextWithoutGbnf("t", marker), "t-0");
    ASSERT_TRUE(g.ok()) << g.status().message();
    auto c = std::make_shared<const CompiledGrammar>(std::move(*g), test::ByteTrie());
    std::mt19937 rng(5);
    const std::string alphabet = marker + "xy";
    for (int i = 0; i < 400; ++i) {
      std::string text;
      const int len = static_cast<int>(rng() % 14);
      for (int k = 0; k < len; ++k) text += alphabet[rng() % alphabet.size()];
      if (!test::AcceptsText(c, "")) FAIL();
      // Valid UTF-8 only (the matcher refuses broken characters whatever the grammar).
      bool valid = true;
      for (size_t k = 0; k < text.size();) {
        const unsigned char b = static_cast<unsigned char>(text[k]);
        const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : 0;
        if (n == 0 || k + n > text.size() || (n == 2 && (static_cast<unsigned char>(text[k + 1]) >> 6) != 2)) {
          valid = false;
          break;
        }
        k += n;
      }
      if (!valid) continue;
      EXPECT_EQ(test::AcceptsText(c, text), text.find(marker) == std::string::npos) << text;
    }
  }
}

// A constraint after a reasoning model's thought: anything up to the first </think>, up to two
// newlines, then the constraint; the constraint never inside the thought.
TEST(GrammarCompiler, AConstraintAfterTheThought) {
  GrammarCompiler c(test::ByteTrie());
  Constraint k{Constraint::Kind::kJsonSchema, R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})", ""};
  k.after = "</think>";
  auto g = c.Compile(k);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(test::AcceptsText(*g, "Let me see. {\"a\": 1} maybe</think>\n\n{\"a\":1}"));
  EXPECT_TRUE(test::AcceptsText(*g, "</think>{\"a\":2}"));
  EXPECT_TRUE(test::AcceptsText(*g, "<think?</thin</think>\n{\"a\":3}"));
  EXPECT_FALSE(test::AcceptsText(*g, "{\"a\":1}"));                        // no thought closed
  EXPECT_FALSE(test::AcceptsText(*g, "x</think>y</think>{\"a\":1}"));      // the first </think> ends it
  EXPECT_FALSE(test::AcceptsText(*g, "x</think>\n\n\n{\"a\":1}"));         // two newlines at most
  // A different marker is a different grammar (the cache key holds it).
  Constraint plain{Constraint::Kind::kJsonSchema, k.text, ""};
  auto p = c.Compile(plain);
  ASSERT_TRUE(p.ok());
  EXPECT_NE(p->get(), g->get());
  EXPECT_TRUE(test::AcceptsText(*p, "{\"a\":1}"));
}

// Open objects (JSON Schema's reading of a schema without additionalProperties) are another
// grammar: other keys pass, a declared one keeps its schema.
TEST(GrammarCompiler, OpenObjectsAreTheirOwnGrammar) {
  GrammarCompiler c(test::ByteTrie());
  Constraint closed{Constraint::Kind::kJsonSchema, R"({"properties":{"a":{"type":"integer"}}})", ""};
  Constraint open = closed;
  open.objects = ObjectKeys::kOpen;
  auto gc = c.Compile(closed);
  auto go = c.Compile(open);
  ASSERT_TRUE(gc.ok() && go.ok());
  EXPECT_NE(gc->get(), go->get());
  EXPECT_FALSE(test::AcceptsText(*gc, "{\"a\":1,\"b\":[true]}"));
  EXPECT_TRUE(test::AcceptsText(*go, "{\"a\":1,\"b\":[true]}"));
  EXPECT_TRUE(test::AcceptsText(*go, "{\"b\":\"x\"}"));
  EXPECT_FALSE(test::AcceptsText(*go, "{\"a\":\"x\"}"));
  EXPECT_FALSE(test::AcceptsText(*go, "{\"b\":1,\"a\":\"x\"}"));
}

}  // namespace
}  // namespace gale::grammar
