// What a request constrains its output to, in the forms the APIs take (a JSON Schema, any JSON
// object, a regex, a list of choices, GBNF), and the compiler that turns one into a
// CompiledGrammar over a vocabulary, caching the result: a server sees the same schema request
// after request, and the compiled grammar carries the mask cache they share.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "grammar/matcher.h"

namespace gale::grammar {

struct Constraint {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGbnf };
  Kind kind = Kind::kGbnf;
  // kJsonSchema: the schema as JSON text; kRegex: the pattern; kChoice: a JSON array of strings;
  // kGbnf: the grammar (start rule `root`); kJsonObject: unused.
  std::string text;
};

// The constraint as GBNF (errors name what is wrong: the schema path, the regex position).
StatusOr<std::string> ConstraintToGbnf(const Constraint& c);

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenTrie> trie, size_t max_grammars = 64)
      : trie_(std::move(trie)), max_grammars_(max_grammars) {}
  // Thread-safe. The least recently used grammar is dropped past max_grammars (requests holding
  // it keep it alive).
  StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Constraint& c);
  const TokenTrie& trie() const { return *trie_; }

 private:
  std::shared_ptr<const TokenTrie> trie_;
  size_t max_grammars_;
  std::mutex mu_;
  std::list<std::string> lru_;  // keys, most recent first
  std::unordered_map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>, std::list<std::string>::iterator>> cache_;
};

}  // namespace gale::grammar
