// Constraint -> GBNF -> CompiledGrammar (its start state built under the time limit), with an LRU
// of compiled grammars and refusals.
#include "grammar/compiler.h"

#include <algorithm>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/check.h"

#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace gale::grammar {

StatusOr<std::string> ConstraintToGbnf(const Constraint& c, ThreadCpuClock::time_point deadline) {
  using Json = nlohmann::ordered_json;
  switch (c.kind) {
    case Constraint::Kind::kJsonObject: return JsonObjectGbnf();
    case Constraint::Kind::kJsonSchema: {
      Json schema = Json::parse(c.text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return InvalidArgument("the JSON schema is not valid JSON");
      try {
        return JsonSchemaToGbnf(schema, "root", deadline, c.objects);
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

std::string TextWithoutGbnf(const std::string& name, const std::string& marker) {
  // The marker's code points (UTF-8 decoded; invalid bytes as themselves).
  std::vector<uint32_t> m;
  for (size_t i = 0; i < marker.size();) {
    const unsigned char b = static_cast<unsigned char>(marker[i]);
    const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < len && i + k < marker.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(marker[i + k]) & 0x3F);
    m.push_back(cp);
    i += static_cast<size_t>(len);
  }
  const size_t n = m.size();
  // KMP's failure function, then the transition of state i (i code points of the marker matched)
  // on c.
  std::vector<size_t> fail(n + 1, 0);
  for (size_t i = 1, k = 0; i < n; ++i) {
    while (k > 0 && m[i] != m[k]) k = fail[k];
    if (m[i] == m[k]) ++k;
    fail[i + 1] = k;
  }
  auto next = [&](size_t i, uint32_t c) {
    while (i > 0 && (i == n || m[i] != c)) i = fail[i];
    return m[i] == c ? i + 1 : 0;
  };
  std::vector<uint32_t> distinct(m.begin(), m.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  CharSet others;
  for (uint32_t c : distinct) others.AddRange(c, c);
  others.Normalize();
  others.Negate();
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    std::string body = "\"\"";
    for (uint32_t c : distinct) {
      const size_t j = next(i, c);
      if (j == n) continue;  // the marker itself: not in the text
      CharSet one;
      one.AddRange(c, c);
      body += fmt::format(" | {} {}-{}", CharSetGbnf(one), name, j);
    }
    body += fmt::format(" | {} {}-0", CharSetGbnf(others), name);
    out += fmt::format("{}-{} ::= {}\n", name, i, body);
  }
  return out;
}

GrammarCompiler::Key GrammarCompiler::KeyOf(const Constraint& c) {
  XXH3_state_t* st = XXH3_createState();
  CHECK(st != nullptr);
  XXH3_128bits_reset(st);
  const int32_t kind = static_cast<int32_t>(c.kind);
  XXH3_128bits_update(st, &kind, sizeof(kind));
  XXH3_128bits_update(st, c.text.data(), c.text.size());
  const uint64_t after_bytes = c.after.size();
  XXH3_128bits_update(st, &after_bytes, sizeof(after_bytes));
  XXH3_128bits_update(st, c.after.data(), c.after.size());
  const int32_t objects = static_cast<int32_t>(c.objects);
  XXH3_128bits_update(st, &objects, sizeof(objects));
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
  const auto deadline = ThreadCpuClock::now() + time_limit_;
  // Every stage counts against the limit: a schema of tens of thousands of parts takes a while to
  // convert and parse before its first state is built.
  auto too_long = [&](const std::string& what) {
    return InvalidArgument("compiling the constraint took longer than the server's limit of {} ms of CPU time "
                           "(gale serve --max-constraint-compile-ms); {}", time_limit_.count(), what);
  };
  auto converted = ConstraintToGbnf(c, deadline);
  if (!converted.ok()) {
    if (converted.status().code() == StatusCode::kResourceExhausted) return too_long(converted.status().message());
    return converted.status();
  }
  std::string gbnf = std::move(*converted);
  std::string start = "root";
  if (!c.after.empty()) {
    // Free text up to the marker's first occurrence, then the constraint.
    gbnf += "\n" + TextWithoutGbnf("gale-free", c.after);
    gbnf += "gale-start ::= gale-free-0 " + GbnfLiteral(c.after) + " \"\\n\"{0,2} root\n";
    start = "gale-start";
  }
  ASSIGN_OR_RETURN(Grammar g, ParseGbnf(gbnf, start));
  if (ThreadCpuClock::now() > deadline) return too_long("its grammar was still being read");
  auto compiled = std::make_shared<CompiledGrammar>(std::move(g), trie_);
  if (Status s = compiled->Prepare(deadline); !s.ok()) {
    if (ThreadCpuClock::now() > deadline) return too_long(s.message());
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
