// A context-free grammar over Unicode code points, in the flat form the matcher walks, and the
// parser of its text form: llama.cpp's GBNF (`name ::= alternatives`, "literals", [classes],
// [^negated], `.`, (groups), the postfixes * + ? {m} {m,} {m,n}, and `<[N]>`: exactly the token
// with id N, as llama.cpp writes a token in a grammar, which lets a grammar ask for control tokens
// no text spells (gpt-oss's <|channel|>). JSON Schema and regexes are translated to this text
// (json_schema.h, regex.h), so every constraint has one form a user can read and one compiler.
// Apart from token ids this file knows nothing of tokens; matcher.h does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace gale::grammar {

// A set of code points: a bitmap for ASCII, sorted disjoint ranges for the rest.
struct CharSet {
  uint64_t ascii[2] = {0, 0};                        // bit c: code point c < 128 is in the set
  std::vector<std::pair<uint32_t, uint32_t>> high;   // inclusive ranges of code points >= 128

  bool Contains(uint32_t cp) const;
  // Whether some code point in [lo, hi] is in the set (a partial UTF-8 character's possibilities).
  bool Intersects(uint32_t lo, uint32_t hi) const;
  void AddRange(uint32_t lo, uint32_t hi);
  void Negate();      // the complement within [0, 0x10FFFF]
  void Normalize();   // sorts and merges `high`
  // The set as sorted, disjoint, non-adjacent inclusive ranges of code points (`high` normalized).
  std::vector<std::pair<uint32_t, uint32_t>> Ranges() const;
};

// One element of an alternative: a code point from a set, a rule, the alternative's end, or one
// particular token.
struct Element {
  enum class Kind : uint8_t { kChars, kRule, kEnd, kToken };
  Kind kind = Kind::kEnd;
  int32_t index = -1;  // kChars: into Grammar::char_sets; kRule: the rule; kToken: the token id
  bool terminal() const { return kind == Kind::kChars || kind == Kind::kToken; }
};

// Rules as alternatives of element sequences, all in one array: an alternative starts at an index
// of `elements` and runs to the next kEnd. Positions (indices into `elements`) are what the
// matcher's stacks hold.
struct Grammar {
  std::vector<std::string> rule_names;            // [rules]
  std::vector<std::vector<int32_t>> alternatives; // [rules][alternatives] start positions
  std::vector<Element> elements;
  std::vector<CharSet> char_sets;
  int32_t root = -1;

  // The grammar in GBNF again (one line per rule), for logs and tests.
  std::string ToString() const;
};

// A GBNF string literal matching exactly the UTF-8 text s.
std::string GbnfLiteral(std::string_view s);

// A set as a GBNF term: a "literal" when it is one code point, a [class] otherwise.
std::string CharSetGbnf(const CharSet& s);

// Limits on what a grammar may cost to hold (a request carries it).
inline constexpr size_t kMaxGrammarElements = 1 << 20;
inline constexpr int kMaxGrammarNesting = 128;    // parentheses
inline constexpr int kMaxRepetition = 10000;      // m, n of {m,n}

// Parses GBNF text. Errors name the line and what was expected; a rule used but never defined,
// a missing root and left recursion (which a top-down matcher cannot expand) are errors too.
StatusOr<Grammar> ParseGbnf(std::string_view text, std::string_view root = "root");

}  // namespace gale::grammar
