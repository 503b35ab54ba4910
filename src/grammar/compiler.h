// What a request constrains its output to, in the forms the APIs take (a JSON Schema, any JSON
// object, a regex, a list of choices, GBNF), and the compiler that turns one into a
// CompiledGrammar over a vocabulary, caching the result: a server sees the same schema request
// after request, and the compiled grammar carries the mask cache they share.
//
// Compiling is bounded: a time limit (checked while the grammar's first state is built, the step
// whose cost a hostile grammar can make explode), the grammar's size (kMaxGrammarElements) and
// the matcher's limits (matcher.h). Past any bound the constraint is refused with an error naming
// it; refusals are cached too, so a client repeating one costs nothing more. The server runs
// Compile on threads of its own, never on the engine's.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace gale::grammar {

struct Constraint {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGbnf };
  Kind kind = Kind::kGbnf;
  // kJsonSchema: the schema as JSON text; kRegex: the pattern; kChoice: a JSON array of strings;
  // kGbnf: the grammar (start rule `root`); kJsonObject: unused.
  std::string text;
  // Set: the output is free text up to the first occurrence of this marker (a reasoning model's
  // "</think>": the thought is the model's own), then up to two newlines, then the constraint.
  std::string after;
  // kJsonSchema: objects without additionalProperties closed (the default) or open (json_schema.h).
  ObjectKeys objects = ObjectKeys::kClosed;
};

// GBNF rules `name-0` .. `name-(n-1)` matching exactly the texts that do not contain `marker`
// (n code points): a KMP automaton over code points, right-recursive, so a matcher follows it
// with a few stacks.
std::string TextWithoutGbnf(const std::string& name, const std::string& marker);

// The constraint as GBNF (errors name what is wrong: the schema path, the regex position).
// ResourceExhausted past the deadline.
StatusOr<std::string> ConstraintToGbnf(
    const Constraint& c, ThreadCpuClock::time_point deadline = ThreadCpuClock::time_point::max());

// The default bound on one compilation (gale serve --max-constraint-compile-ms).
inline constexpr std::chrono::milliseconds kDefaultCompileTime{2000};

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenTrie> trie, size_t max_grammars = 64,
                           std::chrono::milliseconds time_limit = kDefaultCompileTime)
      : trie_(std::move(trie)), max_grammars_(max_grammars), time_limit_(time_limit) {}
  // Thread-safe. The least recently used entry is dropped past max_grammars (requests holding a
  // grammar keep it alive). Errors are InvalidArgument: the constraint is the client's.
  StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Constraint& c);
  // What Compile would return from the cache alone (a grammar, or a refusal), without compiling.
  std::optional<StatusOr<std::shared_ptr<const CompiledGrammar>>> Cached(const Constraint& c);
  const TokenTrie& trie() const { return *trie_; }
  std::chrono::milliseconds time_limit() const { return time_limit_; }

 private:
  // A constraint's kind and text, hashed (128 bits: the cache holds no client text).
  struct Key {
    uint64_t lo = 0, hi = 0;
    bool operator==(const Key& o) const { return lo == o.lo && hi == o.hi; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.lo); }
  };
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;  // null: refused with `error`
    Status error;
    std::list<Key>::iterator lru;
  };
  static Key KeyOf(const Constraint& c);
  StatusOr<std::shared_ptr<const CompiledGrammar>> CompileUncached(const Constraint& c);

  std::shared_ptr<const TokenTrie> trie_;
  size_t max_grammars_;
  std::chrono::milliseconds time_limit_;
  std::mutex mu_;
  std::list<Key> lru_;  // most recent first
  std::unordered_map<Key, Entry, KeyHash> cache_;
};

}  // namespace gale::grammar
