// Constraint -> GBNF -> CompiledGrammar, with an LRU of compiled grammars.
#include "grammar/compiler.h"

#include <nlohmann/json.hpp>

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

StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(const Constraint& c) {
  const std::string key = std::to_string(static_cast<int>(c.kind)) + ":" + c.text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  ASSIGN_OR_RETURN(std::string gbnf, ConstraintToGbnf(c));
  ASSIGN_OR_RETURN(Grammar g, ParseGbnf(gbnf));
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(g), trie_);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second.first;  // compiled meanwhile by another thread
  lru_.push_front(key);
  cache_.emplace(key, std::make_pair(compiled, lru_.begin()));
  while (cache_.size() > max_grammars_) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
  return std::shared_ptr<const CompiledGrammar>(compiled);
}

}  // namespace gale::grammar
