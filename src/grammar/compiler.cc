// Constraint -> GBNF -> CompiledGrammar (its start state built under the time limit), with an LRU
// of compiled grammars and refusals.
#include "grammar/compiler.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include "base/check.h"

#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace gale::grammar {

StatusOr<std::string> ConstraintToGbnf(const Constraint& c) {
  using Json = nlohmann::ordered_json;
  switch (c.kind) {
    case Constraint::Kind::kJsonObject: return JsonObjectGbnf();
    case Constraint::Kind::kJsonSchema: {
      Json schema = Json::parse(c.text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return InvalidArgument("the JSON schema is not valid JSON");
      try {
        return JsonSchemaToGbnf(schema);
      } catch (const nlohmann::json::exception& e) {
        return InvalidArgument("the JSON schema has a field of an unexpected type ({})", e.what());
      }
    }
    case Constraint::Kind::kRegex: {
      ASSIGN_OR_RETURN(std::string e, RegexToGbnf(c.text, CharSetGbnf));
      return "root ::= " + e + "\n";
    }
    case Constraint::Kind::kChoice: {
      Json choices = Json::parse(c.text, nullptr, false);
      if (!choices.is_array() || choices.empty()) return InvalidArgument("choices must be a non-empty array of strings");
      std::string body;
      for (const auto& ch : choices) {
        if (!ch.is_string()) return InvalidArgument("choices must be a non-empty array of strings");
        body += (body.empty() ? "" : " | ") + GbnfLiteral(ch.get<std::string>());
      }
      return "root ::= " + body + "\n";
    }
    case Constraint::Kind::kGbnf: return c.text;
  }
  return Internal("unknown constraint kind");
}

GrammarCompiler::Key GrammarCompiler::KeyOf(const Constraint& c) {
  XXH3_state_t* st = XXH3_createState();
  CHECK(st != nullptr);
  XXH3_128bits_reset(st);
  const int32_t kind = static_cast<int32_t>(c.kind);
  XXH3_128bits_update(st, &kind, sizeof(kind));
  XXH3_128bits_update(st, c.text.data(), c.text.size());
  const XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return {h.low64, h.high64};
}

std::optional<StatusOr<std::shared_ptr<const CompiledGrammar>>> GrammarCompiler::Cached(const Constraint& c) {
  const Key key = KeyOf(c);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  if (!it->second.grammar) return StatusOr<std::shared_ptr<const CompiledGrammar>>(it->second.error);
  return StatusOr<std::shared_ptr<const CompiledGrammar>>(it->second.grammar);
}

StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::CompileUncached(const Constraint& c) {
  const auto deadline = std::chrono::steady_clock::now() + time_limit_;
  ASSIGN_OR_RETURN(std::string gbnf, ConstraintToGbnf(c));
  ASSIGN_OR_RETURN(Grammar g, ParseGbnf(gbnf));
  auto compiled = std::make_shared<CompiledGrammar>(std::move(g), trie_);
  if (Status s = compiled->Prepare(deadline); !s.ok()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return InvalidArgument("compiling the constraint took longer than the server's limit of {} ms "
                             "(gale serve --max-constraint-compile-ms); {}", time_limit_.count(), s.message());
    }
    return InvalidArgument("the constraint cannot be followed: {}", s.message());
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(compiled));
}

StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(const Constraint& c) {
  if (auto hit = Cached(c)) return std::move(*hit);
  auto result = CompileUncached(c);
  const Key key = KeyOf(c);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it != cache_.end()) {  // compiled meanwhile by another thread
    if (!it->second.grammar) return it->second.error;
    return it->second.grammar;
  }
  lru_.push_front(key);
  Entry e;
  e.lru = lru_.begin();
  if (result.ok()) {
    e.grammar = *result;
  } else {
    e.error = result.status();
  }
  cache_.emplace(key, std::move(e));
  while (cache_.size() > max_grammars_) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  return result;
}

}  // namespace gale::grammar
