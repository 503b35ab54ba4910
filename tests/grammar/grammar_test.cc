// GBNF parsing, the pushdown matcher and token masks (src/grammar/grammar.h, matcher.h).
#include "grammar/grammar.h"

#include <random>

#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "byte_trie.h"

namespace gale::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> Compile(const std::string& gbnf, std::shared_ptr<const TokenTrie> trie = test::ByteTrie()) {
  auto g = ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << gbnf;
  if (!g.ok()) return nullptr;
  return std::make_shared<const CompiledGrammar>(std::move(*g), std::move(trie));
}

// Whether the whole text is a sentence of the grammar (false on any refused byte).
bool Matches(const std::string& gbnf, const std::string& text) {
  auto c = Compile(gbnf);
  return c && test::AcceptsText(c, text);
}

// A group's made-up rule never takes a name the text defines later (JSON Schema rules are named
// "parent-N" as the groups' are; a 28-deep schema used to fail with "defined twice").
TEST(Gbnf, GroupsNeverTakeANameDefinedLater) {
  EXPECT_TRUE(Matches("root ::= (\"a\" | \"b\") root-1 (\"x\")?\nroot-1 ::= \"c\"\nroot-2 ::= \"d\"", "ac"));
  EXPECT_TRUE(Matches("root ::= (\"a\" | \"b\") root-1 (\"x\")?\nroot-1 ::= \"c\"\nroot-2 ::= \"d\"", "bcx"));
}

TEST(Gbnf, ParsesAndMatchesTheSyntax) {
  EXPECT_TRUE(Matches(R"(root ::= "ab" "c")", "abc"));
  EXPECT_FALSE(Matches(R"(root ::= "ab" "c")", "ab"));
  EXPECT_FALSE(Matches(R"(root ::= "ab" "c")", "abcd"));
  EXPECT_TRUE(Matches(R"(root ::= [a-c]+ [^a-c])", "abcax"));
  EXPECT_FALSE(Matches(R"(root ::= [a-c]+ [^a-c])", "abcab"));
  EXPECT_TRUE(Matches("root ::= x | y\nx ::= \"x\"\ny ::= \"y\" # comment", "y"));
  EXPECT_TRUE(Matches("root ::= (\"a\" |\n   \"b\")* \"c\"", "ababbc"));
  EXPECT_TRUE(Matches(R"(root ::= "a"{2,3})", "aa"));
  EXPECT_TRUE(Matches(R"(root ::= "a"{2,3})", "aaa"));
  EXPECT_FALSE(Matches(R"(root ::= "a"{2,3})", "a"));
  EXPECT_FALSE(Matches(R"(root ::= "a"{2,3})", "aaaa"));
  EXPECT_TRUE(Matches(R"(root ::= "a"{2,} "b"?)", "aaaaab"));
  EXPECT_TRUE(Matches(R"(root ::= "\x41\u00e9\n\"\\")", "A\xC3\xA9\n\"\\"));
  EXPECT_TRUE(Matches(R"(root ::= . .)", "\xE2\x82\xAC!"));  // one code point of 3 bytes, then one of 1
  EXPECT_TRUE(Matches(R"(root ::= [α-ω]+)", "\xCE\xB1\xCF\x89"));
  EXPECT_FALSE(Matches(R"(root ::= [α-ω]+)", "\xCE\x91"));  // capital alpha
  EXPECT_TRUE(Matches("root ::= \"\" | \"a\"", ""));
  EXPECT_TRUE(Matches("root ::= a\na ::= \"x\" a | \"y\"", "xxxxy"));  // right recursion
}

TEST(Gbnf, ErrorsSayWhatIsWrong) {
  auto msg = [](const std::string& g) {
    auto r = ParseGbnf(g);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_NE(msg("root ::= x").find("'x' is used but never defined"), std::string::npos);
  EXPECT_NE(msg("start ::= \"x\"").find("no rule named 'root'"), std::string::npos);
  EXPECT_NE(msg("root ::= root \"x\" | \"y\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(msg("root ::= a\na ::= b? a \"x\"\nb ::= \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(msg("root ::= \"abc").find("unterminated string"), std::string::npos);
  EXPECT_NE(msg("root ::= [abc").find("unterminated character class"), std::string::npos);
  EXPECT_NE(msg("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"{3,2}").find("max below min"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"{99999}").find("limited to"), std::string::npos);
  EXPECT_NE(msg("root ::= (((\"a\")").find("expected ')'"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(msg("root ::= \"a\"\n\nx y").find("line 3"), std::string::npos);
  EXPECT_NE(msg(std::string(200, '(')).find("expected a rule name"), std::string::npos);
  EXPECT_NE(msg("root ::= " + std::string(200, '(')).find("nest deeper"), std::string::npos);
  EXPECT_NE(msg("root ::= [z-a]").find("reversed"), std::string::npos);
}

TEST(Gbnf, PrintsBackToAnEquivalentGrammar) {
  auto g = ParseGbnf("root ::= [a-cx] \"q\"* | \"\\n\"");
  ASSERT_TRUE(g.ok());
  auto again = ParseGbnf(g->ToString());
  ASSERT_TRUE(again.ok()) << g->ToString();
  for (const char* s : {"a", "xqq", "\n", "bq"}) EXPECT_TRUE(Matches(again->ToString(), s)) << s;
  EXPECT_FALSE(Matches(again->ToString(), "d"));
}

// A vocabulary of multi-byte tokens, UTF-8 pieces and partial characters, like a BPE one.
std::shared_ptr<const TokenTrie> MixedTrie(std::vector<std::string>* out = nullptr) {
  std::vector<std::string> toks;
  const std::string alphabet = "{}[]\":, abnulltrfs01-.\\e\n";
  for (char a : alphabet) toks.push_back(std::string(1, a));
  for (char a : alphabet) {
    for (char b : alphabet) toks.push_back(std::string{a, b});
  }
  for (const char* t : {"{\"", "\":", "\",", "\"}", "true", "false", "null", "ab\"", " \"a", "\xC3", "\xA9", "\xED", "\xC3\xA9",
                        "\xE2\x82", "\xAC", "\xE2\x82\xAC", "\xE2\x82\xAC\"", "\xF0\x9F\x98\x80"}) {
    toks.push_back(t);
  }
  toks.push_back("");  // a control token: no bytes
  if (out) *out = toks;
  std::vector<bool> usable(toks.size(), true);
  return std::make_shared<const TokenTrie>(toks, usable);
}

const char* kJsonish = R"(
root ::= object
object ::= "{" ws (pair ("," ws pair)*)? "}"
pair ::= string ":" ws value
value ::= object | string | "true" | "false" | "null" | number
string ::= "\"" ([^"\\] | "\\" ["\\n])* "\"" ws
number ::= "-"? [0-9]+ ("." [0-9]+)? ws
ws ::= [ \n]{0,3}
)";

TEST(Matcher, MaskEqualsTokenByTokenCheckOnRandomWalks) {
  std::vector<std::string> toks;
  auto trie = MixedTrie(&toks);
  auto c = Compile(kJsonish, trie);
  ASSERT_TRUE(c);
  const int32_t stop = static_cast<int32_t>(toks.size()) - 1;
  std::mt19937 rng(7);
  int64_t checked = 0, ended = 0;
  for (int walk = 0; walk < 30; ++walk) {
    GrammarMatcher m(c, {stop});
    std::string text;
    for (int step = 0; step < 60; ++step) {
      auto mask = m.Mask();
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < trie->vocab_size(); ++t) {
        const bool bit = ((*mask)[t >> 6] >> (t & 63)) & 1;
        ASSERT_EQ(bit, m.Allows(t)) << "token '" << toks[t] << "' at walk " << walk << " step " << step;
        if (bit) allowed.push_back(t);
        ++checked;
      }
      ASSERT_FALSE(allowed.empty()) << "walk " << walk << " step " << step << " text so far: " << text;
      const int32_t t = allowed[rng() % allowed.size()];
      if (t == stop) {
        ASSERT_TRUE(m.CanEnd());
        ++ended;
        break;
      }
      ASSERT_TRUE(m.Accept(t).ok());
      text += toks[t];
    }
  }
  EXPECT_GT(checked, 10000);
  EXPECT_GT(ended, 0);
}

TEST(Matcher, PartialUtf8TokensCompleteAcrossTokens) {
  std::vector<std::string> toks;
  auto trie = MixedTrie(&toks);
  auto id = [&](const std::string& t) { return static_cast<int32_t>(std::find(toks.begin(), toks.end(), t) - toks.begin()); };
  auto c = Compile("root ::= \"\\\"\" [^\"a-z\\u20AC]* \"\\\"\"", trie);  // anything but ", a-z and the euro sign
  GrammarMatcher m(c, {});
  ASSERT_TRUE(m.Accept(id("\"")).ok());
  ASSERT_TRUE(m.Accept(id("\xE2\x82")).ok());  // two of three bytes: U+2080..U+20BF are possible
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.Allows(id("\"")));            // the character must finish first
  EXPECT_TRUE(m.Allows(id("\xA9")));           // U+20A9, the won sign
  EXPECT_FALSE(m.Allows(id("\xAC")));          // U+20AC, the euro sign, is excluded
  EXPECT_FALSE(m.Allows(id("\xC3")));          // not a continuation byte
  ASSERT_TRUE(m.Accept(id("\xA9")).ok());
  EXPECT_TRUE(m.Allows(id("\"")));
  // ED A0..BF would start a surrogate (U+D800..), never a character: refused at once, so no
  // state is left that nothing can continue.
  EXPECT_EQ(m.AllowedPrefix(std::vector<int32_t>{id("\xED"), id("\xA9")}), 1u);
  EXPECT_FALSE(m.Allows(id("\xE2\x82\xAC\"")));
  ASSERT_TRUE(m.Accept(id("\xC3\xA9")).ok());
  ASSERT_TRUE(m.Accept(id("\"")).ok());
  EXPECT_TRUE(m.Done());
}

TEST(Matcher, StopTokensOnlyWhereTheGrammarMayEndAndDone) {
  auto c = Compile(R"(root ::= "a" "b"?)");
  const int32_t stop = 0;  // byte 0 as the stop token: not matchable as text then
  GrammarMatcher m(c, {stop});
  EXPECT_FALSE(m.Allows(stop));
  EXPECT_FALSE(m.CanEnd());
  ASSERT_TRUE(m.Accept('a').ok());
  EXPECT_TRUE(m.Allows(stop));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.Done());
  auto mask = m.Mask();
  EXPECT_TRUE((*mask)[0] & 1);
  ASSERT_TRUE(m.Accept('b').ok());
  EXPECT_TRUE(m.Done());
  EXPECT_FALSE(m.Accept('b').ok());
  std::vector<float> logits(256, 1.0f);
  EXPECT_TRUE(m.MaskLogits(logits));  // the stop token is left
  for (int t = 0; t < 256; ++t) EXPECT_EQ(std::isinf(logits[t]), t != stop) << t;
}

TEST(Matcher, MasksAreCachedAcrossRequestsOfOneGrammar) {
  auto c = Compile(kJsonish, MixedTrie());
  GrammarMatcher a(c, {}), b(c, {});
  auto ma = a.Mask();
  auto mb = b.Mask();
  EXPECT_EQ(*ma, *mb);
  EXPECT_EQ(ma.get(), mb.get());  // the same cached mask
  EXPECT_GE(c->cache_hits(), 1);
  // Inside a string the state after each character is the same: one mask computed for all.
  std::vector<std::string> toks;
  MixedTrie(&toks);
  auto id = [&](const std::string& t) { return static_cast<int32_t>(std::find(toks.begin(), toks.end(), t) - toks.begin()); };
  GrammarMatcher s(c, {});
  for (const char* t : {"{\"", "a", "b"}) ASSERT_TRUE(s.Accept(id(t)).ok());
  s.Mask();
  const int64_t misses = c->cache_misses();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(s.Accept(id(i % 2 ? "a" : "b")).ok());
    s.Mask();
  }
  EXPECT_EQ(c->cache_misses(), misses);
}

// <[N]> asks for exactly token N: a control token no text spells (gpt-oss's <|channel|>), or a
// text token by its id (then its text is allowed as well, as any other way of writing it).
TEST(Matcher, TokenTerminalsAllowExactlyThatToken) {
  // 0 "<|c|>" and 1 "<|m|>" are control tokens (not usable as text); 2 "ab", 3 "a", 4 "b", 5 "x".
  std::vector<std::string> toks = {"<|c|>", "<|m|>", "ab", "a", "b", "x"};
  auto trie = std::make_shared<const TokenTrie>(toks, std::vector<bool>{false, false, true, true, true, true});
  auto c = Compile("root ::= <[0]> \"ab\" <[1]> x*\nx ::= \"x\" | <[4]>", trie);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->grammar().ToString().find("<[0]>") != std::string::npos, true) << c->grammar().ToString();
  const int32_t stop = 6;  // past the trie: ends the text where the grammar may end
  GrammarMatcher m(c, {stop});
  auto bits = [&](GrammarMatcher& g) {
    std::vector<int> on;
    const auto mask = g.Mask();
    for (int t = 0; t < 6; ++t) if (((*mask)[0] >> t) & 1) on.push_back(t);
    return on;
  };
  EXPECT_EQ(bits(m), (std::vector<int>{0}));
  EXPECT_FALSE(m.Allows(1));
  EXPECT_FALSE(m.Allows(3));
  EXPECT_EQ(m.AllowedPrefix(std::vector<int32_t>{0, 3, 4, 1, 5, 4, 1}), 6u);
  ASSERT_TRUE(m.Accept(0).ok());
  EXPECT_EQ(bits(m), (std::vector<int>{2, 3}));  // "ab" or "a": text, no control token
  ASSERT_TRUE(m.Accept(3).ok());
  EXPECT_EQ(bits(m), (std::vector<int>{4}));
  ASSERT_TRUE(m.Accept(4).ok());
  EXPECT_EQ(bits(m), (std::vector<int>{1}));
  EXPECT_FALSE(m.CanEnd());
  ASSERT_TRUE(m.Accept(1).ok());
  EXPECT_TRUE(m.CanEnd());
  EXPECT_EQ(bits(m), (std::vector<int>{4, 5}));  // "x" as text, and token 4 by its id
  ASSERT_TRUE(m.Accept(4).ok());
  ASSERT_TRUE(m.Accept(5).ok());
  EXPECT_FALSE(m.Accept(0).ok());
  EXPECT_TRUE(m.Allows(stop));
  // The syntax's errors.
  for (const char* bad : {"root ::= <[]>", "root ::= <[12", "root ::= <[99999999999]>", "root ::= <x>"}) {
    EXPECT_FALSE(ParseGbnf(bad).ok()) << bad;
  }
}

TEST(Matcher, LogitsOutsideTheVocabularyAreMasked) {
  auto c = Compile(R"(root ::= "a")");
  GrammarMatcher m(c, {});
  std::vector<float> logits(300, 0.5f);  // a model vocabulary padded past the tokenizer's
  ASSERT_TRUE(m.MaskLogits(logits));
  for (int t = 0; t < 300; ++t) EXPECT_EQ(std::isinf(logits[t]), t != 'a') << t;
}

TEST(Matcher, AGrammarTheVocabularyCannotSpellMasksEverything) {
  std::vector<std::string> toks = {"a", "b"};
  auto trie = std::make_shared<const TokenTrie>(toks, std::vector<bool>{true, true});
  auto c = Compile(R"(root ::= "c")", trie);
  GrammarMatcher m(c, {});
  std::vector<float> logits(2, 0.0f);
  EXPECT_FALSE(m.MaskLogits(logits));
}

TEST(Regex, TranslatesTheCommonSyntax) {
  auto re = [](const std::string& pattern, const std::string& text) {
    auto e = RegexToGbnf(pattern, CharSetGbnf);
    EXPECT_TRUE(e.ok()) << pattern << ": " << e.status().message();
    return e.ok() && Matches("root ::= " + *e, text);
  };
  EXPECT_TRUE(re("^[a-z]+@[a-z]+\\.(com|org)$", "me@example.org"));
  EXPECT_FALSE(re("^[a-z]+@[a-z]+\\.(com|org)$", "me@example.net"));
  EXPECT_TRUE(re("\\d{3}-\\d{4}", "555-1234"));
  EXPECT_FALSE(re("\\d{3}-\\d{4}", "55-1234"));
  EXPECT_TRUE(re("(?:ab)+c?", "ababc"));
  EXPECT_TRUE(re("[^\\s,]+", "x;y"));
  EXPECT_FALSE(re("[^\\s,]+", "x y"));
  EXPECT_TRUE(re("a.c", "a\xE2\x82\xAC" "c"));
  EXPECT_FALSE(re("a.c", "a\nc"));
  EXPECT_TRUE(re("[A-Z][a-z]*?\\w{0,2}", "Abc_9"));
  EXPECT_TRUE(re("x|", ""));
  EXPECT_TRUE(re("[\\-+]?\\u0041\\x42", "-AB"));
  // Repetitions of what can be empty (left-recursive if written as they stand).
  EXPECT_TRUE(re("(a*)*b", "aab"));
  EXPECT_TRUE(re("(a*)*b", "b"));
  EXPECT_TRUE(re("([a-z]*|x?)+", ""));
  EXPECT_TRUE(re("(a?b?)*c", "abbac"));
  EXPECT_FALSE(re("(a?b?)*c", "abd"));
  EXPECT_TRUE(re("^(https?://)?([a-z.-]+)\\.([a-z.]{2,6})([/\\w .-]*)*/?$", "http://x.org/a b/c"));
  for (const char* bad : {"(a", "a)", "(?=a)", "\\1", "a**b{", "\\bx", "a^b", "[b-a]"}) {
    EXPECT_FALSE(RegexToGbnf(bad, CharSetGbnf).ok()) << bad;
  }
}

TEST(Regex, SearchMatchesAnywhereUnlessAnchored) {
  auto re = [](const std::string& pattern, const std::string& text) {
    auto e = RegexToGbnf(pattern, CharSetGbnf, RegexMatch::kSearch);
    EXPECT_TRUE(e.ok()) << pattern << ": " << e.status().message();
    return e.ok() && Matches("root ::= " + *e, text);
  };
  EXPECT_TRUE(re("\\d{3}", "ab123cd"));
  EXPECT_FALSE(re("\\d{3}", "ab12cd"));
  EXPECT_TRUE(re("^ab", "abz"));
  EXPECT_FALSE(re("^ab", "zab"));
  EXPECT_TRUE(re("ab$", "zab"));
  EXPECT_FALSE(re("ab$", "abz"));
  EXPECT_TRUE(re("^x$|y", "zyz"));
  EXPECT_FALSE(re("^x$|y", "xx"));
  EXPECT_TRUE(re("", "anything"));
  EXPECT_FALSE(RegexToGbnf("(a$)", CharSetGbnf, RegexMatch::kSearch).ok());
  EXPECT_TRUE(RegexToGbnf("(a$)", CharSetGbnf).ok());
}

// The automaton of several languages at once: each state says which hold for the text read.
TEST(Regex, AutomatonReadsSeveralLanguagesAtOnce) {
  auto dfa = BuildDfa({DfaLanguage{"^a+$", RegexMatch::kSearch, std::nullopt}, DfaLanguage{"b", RegexMatch::kSearch, std::nullopt},
                       DfaLanguage{"", RegexMatch::kWhole, std::vector<std::string>{"ab", "\xC3\xA9"}}},
                      100);
  ASSERT_TRUE(dfa.ok()) << dfa.status().message();
  auto accepts = [&](const std::string& text) {
    int32_t q = 0;
    for (unsigned char c : text) {  // ASCII texts and U+00E9 (C3 A9)
      if (c == 0xC3) continue;
      const uint32_t cp = c == 0xA9 ? 0xE9 : c;
      int32_t to = -1;
      for (const Dfa::Edge& e : dfa->states[q].edges) {
        if (e.chars.Contains(cp)) to = e.to;
      }
      if (to < 0) return uint32_t{0};
      q = to;
    }
    return dfa->states[q].accepts;
  };
  EXPECT_EQ(accepts("aaa"), 1u);
  EXPECT_EQ(accepts("ab"), 6u);
  EXPECT_EQ(accepts("xbx"), 2u);
  EXPECT_EQ(accepts("\xC3\xA9"), 4u);
  EXPECT_EQ(accepts(""), 0u);
  EXPECT_EQ(accepts("c"), 0u);
  EXPECT_FALSE(BuildDfa({DfaLanguage{"(a|b)*a(a|b){12}", RegexMatch::kWhole, std::nullopt}}, 100).ok());  // 2^13 states
}

TEST(Regex, InsideJsonStringsQuotesAndControlsAreEscaped) {
  auto e = RegexToGbnf("[^,]+", JsonStringCharSet);
  ASSERT_TRUE(e.ok());
  const std::string g = "root ::= \"\\\"\" " + *e + " \"\\\"\"";
  EXPECT_TRUE(Matches(g, "\"a\\\"b\\\\c\\n\""));   // "a\"b\\c\n" as JSON
  EXPECT_FALSE(Matches(g, "\"a\"b\""));
  EXPECT_FALSE(Matches(g, "\"a\nb\""));            // a raw newline is not JSON
  EXPECT_FALSE(Matches(g, "\"a,b\""));
}

}  // namespace
}  // namespace gale::grammar
