// Regular expressions (the ECMAScript subset JSON Schema `pattern`s and vLLM's guided_regex use)
// to a GBNF expression matching exactly the strings the regex matches in full: literals and
// escapes (\d \w \s and their negations, \n \t \r \f \v \xHH \uHHHH, escaped punctuation), `.`,
// [classes] and [^negated], groups (also (?:...)), `|`, and the quantifiers * + ? {n} {n,} {n,m}
// (lazy forms match the same strings). ^ and $ are allowed only at the ends. Backreferences and
// lookarounds are refused: no context-free grammar has them.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace gale::grammar {

// How a set of code points becomes GBNF text: CharSetGbnf for plain text; JSON strings need
// `"`, `\` and control characters written as escapes.
using CharSetWriter = std::function<std::string(const CharSet&)>;

StatusOr<std::string> RegexToGbnf(std::string_view pattern, const CharSetWriter& write_set);

// The writer for characters inside a JSON string: the set's members, escaped as JSON requires.
std::string JsonStringCharSet(const CharSet& s);

}  // namespace gale::grammar
