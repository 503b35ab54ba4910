// Regular expressions (the ECMAScript subset JSON Schema `pattern`s and vLLM's guided_regex use)
// to a GBNF expression matching exactly the strings the regex matches in full: literals and
// escapes (\d \w \s and their negations, \n \t \r \f \v \xHH \uHHHH, escaped punctuation), `.`,
// [classes] and [^negated], groups (also (?:...)), `|`, and the quantifiers * + ? {n} {n,} {n,m}
// (lazy forms match the same strings). ^ and $ are allowed only at the ends. Backreferences and
// lookarounds are refused: no context-free grammar has them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"

namespace gale::grammar {

// How a set of code points becomes GBNF text: CharSetGbnf for plain text; JSON strings need
// `"`, `\` and control characters written as escapes.
using CharSetWriter = std::function<std::string(const CharSet&)>;

// How a pattern matches a text: kWhole, the whole text (vLLM's guided_regex, a grammar's regex);
// kSearch, anywhere in it, as JSON Schema's `pattern` and ECMAScript's test() do: a top-level
// alternative not anchored by ^ (or $) may have any text before (after) it. In kSearch, anchors
// inside groups are refused; kWhole ignores them.
enum class RegexMatch { kWhole, kSearch };

StatusOr<std::string> RegexToGbnf(std::string_view pattern, const CharSetWriter& write_set,
                                  RegexMatch how = RegexMatch::kWhole);

// A deterministic automaton over code points that reads several languages at once: state 0 is
// the start; a state's `accepts` bit i says the text read so far is in language i. Complete: every
// code point leads somewhere (to a state no language accepts from, when none reads it). Used where a grammar needs what one regex cannot say alone: keys that match no pattern, a
// pattern within lengths.
struct Dfa {
  struct Edge {
    CharSet chars;
    int32_t to = 0;
  };
  struct State {
    std::vector<Edge> edges;  // disjoint sets
    uint32_t accepts = 0;
  };
  std::vector<State> states;
};

// One language of a Dfa: a pattern, or (when `words` is set) exactly these UTF-8 strings.
struct DfaLanguage {
  std::string pattern;
  RegexMatch how = RegexMatch::kSearch;
  std::optional<std::vector<std::string>> words;
};

// At most 32 languages. An automaton past max_states states (or its construction past a
// proportional amount of work) is an error saying so.
StatusOr<Dfa> BuildDfa(const std::vector<DfaLanguage>& languages, size_t max_states);

// The accepts of the state the automaton reaches reading `text` (UTF-8) from the start (0 where
// no edge reads a character).
uint32_t DfaAccepts(const Dfa& dfa, std::string_view text);

// The writer for characters inside a JSON string: the set's members, escaped as JSON requires.
std::string JsonStringCharSet(const CharSet& s);

}  // namespace gale::grammar
