// GBNF parsing into the flat grammar form, and the checks a top-down matcher needs.
#include "grammar/grammar.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

namespace gale::grammar {

bool CharSet::Contains(uint32_t cp) const {
  if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
  // high is sorted and disjoint: the last range starting at or below cp decides.
  auto it = std::upper_bound(high.begin(), high.end(), cp, [](uint32_t c, const auto& r) { return c < r.first; });
  return it != high.begin() && cp <= std::prev(it)->second;
}

bool CharSet::Intersects(uint32_t lo, uint32_t hi) const {
  for (uint32_t c = lo; c <= hi && c < 128; ++c) {
    if (Contains(c)) return true;
  }
  for (const auto& [a, b] : high) {
    if (a <= hi && b >= lo) return true;
  }
  return false;
}

void CharSet::AddRange(uint32_t lo, uint32_t hi) {
  for (uint32_t c = lo; c <= hi && c < 128; ++c) ascii[c >> 6] |= uint64_t{1} << (c & 63);
  if (hi >= 128) high.emplace_back(std::max<uint32_t>(lo, 128), hi);
}

void CharSet::Normalize() {
  std::sort(high.begin(), high.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : high) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  high = std::move(merged);
}

std::vector<std::pair<uint32_t, uint32_t>> CharSet::Ranges() const {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  auto add = [&](uint32_t lo, uint32_t hi) {
    if (!out.empty() && out.back().second + 1 == lo) {
      out.back().second = hi;
    } else {
      out.emplace_back(lo, hi);
    }
  };
  for (uint32_t c = 0; c < 128; ++c) {
    if (Contains(c)) add(c, c);
  }
  for (const auto& [lo, hi] : high) add(lo, hi);
  return out;
}

void CharSet::Negate() {
  ascii[0] = ~ascii[0];
  ascii[1] = ~ascii[1];
  Normalize();
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 128;
  for (const auto& [a, b] : high) {
    if (a > next) out.emplace_back(next, a - 1);
    next = b + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  high = std::move(out);
}

namespace {

std::string CodePointText(uint32_t c, bool in_class) {
  if (c == '\n') return "\\n";
  if (c == '\r') return "\\r";
  if (c == '\t') return "\\t";
  if (c == '\\') return "\\\\";
  if (!in_class && c == '"') return "\\\"";
  if (in_class && (c == ']' || c == '-' || c == '^' || c == '[')) return std::string("\\") + static_cast<char>(c);
  if (c < 0x20 || c == 0x7F) return fmt::format("\\x{:02X}", c);
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  if (c <= 0xFFFF) return fmt::format("\\u{:04X}", c);
  return fmt::format("\\U{:08X}", c);
}

std::string CharSetText(const CharSet& s) {
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = s.Ranges();
  if (ranges.size() == 1 && ranges[0].first == ranges[0].second) {
    return fmt::format("\"{}\"", CodePointText(ranges[0].first, false));
  }
  std::string out = "[";
  for (const auto& [a, b] : ranges) {
    out += CodePointText(a, true);
    if (b != a) {
      out += '-';
      out += CodePointText(b, true);
    }
  }
  return out + "]";
}

}  // namespace

std::string CharSetGbnf(const CharSet& s) { return CharSetText(s); }

std::string GbnfLiteral(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02X}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string Grammar::ToString() const {
  std::string out;
  for (size_t r = 0; r < rule_names.size(); ++r) {
    out += rule_names[r] + " ::=";
    for (size_t a = 0; a < alternatives[r].size(); ++a) {
      if (a > 0) out += " |";
      for (int32_t p = alternatives[r][a]; elements[p].kind != Element::Kind::kEnd; ++p) {
        out += " ";
        out += elements[p].kind == Element::Kind::kRule    ? rule_names[elements[p].index]
               : elements[p].kind == Element::Kind::kToken ? fmt::format("<[{}]>", elements[p].index)
                                                           : CharSetText(char_sets[elements[p].index]);
      }
    }
    out += "\n";
  }
  return out;
}

namespace {

using Sequence = std::vector<Element>;

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : s_(text) {
    // The names the text defines, so a rule made up for a group never takes one defined later
    // (a JSON Schema's rules are named "parent-N" too).
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string_view::npos) end = text.size();
      size_t i = at;
      while (i < end && (text[i] == ' ' || text[i] == '\t')) ++i;
      const size_t name_start = i;
      while (i < end && IsNameChar(text[i])) ++i;
      const size_t name_end = i;
      while (i < end && (text[i] == ' ' || text[i] == '\t')) ++i;
      if (name_end > name_start && text.substr(i, 3) == "::=") defined_names_.insert(text.substr(name_start, name_end - name_start));
      at = end + 1;
    }
  }

  StatusOr<Grammar> Parse(std::string_view root_name) {
    SkipSpace(true);
    while (pos_ < s_.size()) {
      RETURN_IF_ERROR(ParseRule());
      SkipSpace(true);
    }
    for (size_t r = 0; r < names_.size(); ++r) {
      if (!defined_[r]) return Error("rule '{}' is used but never defined", names_[r]);
    }
    auto it = ids_.find(std::string(root_name));
    if (it == ids_.end()) return InvalidArgument("grammar: no rule named '{}' (the start rule)", root_name);
    LeftFactor();
    return Flatten(it->second);
  }

 private:
  template <typename... Args>
  Status Error(fmt::format_string<Args...> f, Args&&... args) const {
    const size_t line = 1 + std::count(s_.begin(), s_.begin() + std::min(pos_, s_.size()), '\n');
    return InvalidArgument("grammar line {}: {}", line, fmt::format(f, std::forward<Args>(args)...));
  }

  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }

  // Spaces, tabs and # comments; newlines too where `newlines` (inside parentheses, after `|`,
  // between rules).
  void SkipSpace(bool newlines) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (pos_ < s_.size() && IsNameChar(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  int32_t RuleId(const std::string& name) {
    auto [it, inserted] = ids_.emplace(name, static_cast<int32_t>(names_.size()));
    if (inserted) {
      names_.push_back(name);
      defined_.push_back(false);
      bodies_.emplace_back();
    }
    return it->second;
  }

  int32_t NewRule(const std::string& base) {
    std::string name;
    do {
      name = base;
      name += '-';
      name += std::to_string(++anon_count_);
    } while (ids_.count(name) || defined_names_.count(name));
    const int32_t id = RuleId(name);
    defined_[id] = true;
    return id;
  }

  Status ParseRule() {
    const std::string name = ParseName();
    if (name.empty()) return Error("expected a rule name, got '{}'", Peek());
    SkipSpace(false);
    if (s_.substr(pos_, 3) != "::=") return Error("expected '::=' after rule name '{}'", name);
    pos_ += 3;
    SkipSpace(true);
    const int32_t id = RuleId(name);
    if (defined_[id]) return Error("rule '{}' is defined twice", name);
    defined_[id] = true;
    std::vector<Sequence> alts;
    RETURN_IF_ERROR(ParseAlternatives(name, /*nested=*/false, &alts));
    bodies_[id] = std::move(alts);
    if (!AtEnd() && Peek() != '\n' && Peek() != '\r') return Error("unexpected '{}' in rule '{}'", Peek(), name);
    return Status::Ok();
  }

  Status ParseAlternatives(const std::string& rule, bool nested, std::vector<Sequence>* alts) {
    while (true) {
      Sequence seq;
      RETURN_IF_ERROR(ParseSequence(rule, nested, &seq));
      alts->push_back(std::move(seq));
      if (Peek() != '|') return Status::Ok();
      ++pos_;
      SkipSpace(true);
    }
  }

  Status ParseSequence(const std::string& rule, bool nested, Sequence* seq) {
    while (true) {
      SkipSpace(nested);
      if (AtEnd()) return Status::Ok();
      const char c = Peek();
      if (c == '|' || c == ')' || c == '\n' || c == '\r') return Status::Ok();
      Sequence atom;
      if (c == '"') {
        ++pos_;
        while (true) {
          if (AtEnd()) return Error("unterminated string literal");
          if (Peek() == '"') {
            ++pos_;
            break;
          }
          ASSIGN_OR_RETURN(uint32_t cp, ParseChar(false));
          atom.push_back(AddCodePoint(cp));
        }
      } else if (c == '[') {
        ++pos_;
        CharSet set;
        const bool negated = Peek() == '^';
        if (negated) ++pos_;
        while (true) {
          if (AtEnd()) return Error("unterminated character class");
          if (Peek() == ']') {
            ++pos_;
            break;
          }
          ASSIGN_OR_RETURN(uint32_t lo, ParseChar(true));
          uint32_t hi = lo;
          if (Peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
            ++pos_;
            ASSIGN_OR_RETURN(hi, ParseChar(true));
            if (hi < lo) return Error("character range {:X}-{:X} is reversed", lo, hi);
          }
          set.AddRange(lo, hi);
        }
        set.Normalize();
        if (negated) set.Negate();
        atom.push_back(AddChars(std::move(set)));
      } else if (c == '.') {
        ++pos_;
        CharSet set;
        set.AddRange(0, 0x10FFFF);
        set.Normalize();
        atom.push_back(AddChars(std::move(set)));
      } else if (c == '(') {
        ++pos_;
        if (++depth_ > kMaxGrammarNesting) return Error("parentheses nest deeper than {}", kMaxGrammarNesting);
        SkipSpace(true);
        std::vector<Sequence> alts;
        RETURN_IF_ERROR(ParseAlternatives(rule, /*nested=*/true, &alts));
        if (Peek() != ')') return Error("expected ')'");
        ++pos_;
        --depth_;
        const int32_t id = NewRule(rule);
        bodies_[id] = std::move(alts);
        atom.push_back({Element::Kind::kRule, id});
      } else if (c == '<' && s_.substr(pos_, 2) == "<[") {
        pos_ += 2;
        const size_t start = pos_;
        int64_t id = 0;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9' && id <= (int64_t{1} << 31)) id = id * 10 + (s_[pos_++] - '0');
        if (pos_ == start || s_.substr(pos_, 2) != "]>" || id >= (int64_t{1} << 31)) {
          return Error("expected a token id in <[N]>");
        }
        pos_ += 2;
        atom.push_back({Element::Kind::kToken, static_cast<int32_t>(id)});
      } else if (IsNameChar(c)) {
        const std::string name = ParseName();
        atom.push_back({Element::Kind::kRule, RuleId(name)});
      } else {
        return Error("unexpected '{}'", c);
      }
      // Postfix operators, possibly several (("a")?* is legal, if odd).
      while (true) {
        const char p = Peek();
        int64_t lo, hi;  // hi < 0: unbounded
        if (p == '*') {
          lo = 0, hi = -1, ++pos_;
        } else if (p == '+') {
          lo = 1, hi = -1, ++pos_;
        } else if (p == '?') {
          lo = 0, hi = 1, ++pos_;
        } else if (p == '{') {
          ++pos_;
          SkipSpace(false);
          ASSIGN_OR_RETURN(lo, ParseCount());
          SkipSpace(false);
          hi = lo;
          if (Peek() == ',') {
            ++pos_;
            SkipSpace(false);
            if (Peek() == '}') {
              hi = -1;
            } else {
              ASSIGN_OR_RETURN(hi, ParseCount());
              if (hi < lo) return Error("repetition {{{},{}}} has max below min", lo, hi);
            }
            SkipSpace(false);
          }
          if (Peek() != '}') return Error("expected '}}' to close a repetition");
          ++pos_;
        } else {
          break;
        }
        atom = Repeat(rule, std::move(atom), lo, hi);
      }
      seq->insert(seq->end(), atom.begin(), atom.end());
      num_elements_ += atom.size();
      if (num_elements_ > kMaxGrammarElements) return Error("the grammar has more than {} elements", kMaxGrammarElements);
    }
  }

  StatusOr<int64_t> ParseCount() {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + (s_[pos_++] - '0');
      if (v > kMaxRepetition) return Error("repetition counts are limited to {}", kMaxRepetition);
    }
    if (pos_ == start) return Error("expected a number in a repetition");
    return v;
  }

  // One code point (a literal's character): ASCII ones are looked up without building a set.
  Element AddCodePoint(uint32_t cp) {
    if (cp < 128 && ascii_ids_[cp] >= 0) return {Element::Kind::kChars, ascii_ids_[cp]};
    CharSet set;
    set.AddRange(cp, cp);
    const Element e = AddChars(std::move(set));
    if (cp < 128) ascii_ids_[cp] = e.index;
    return e;
  }

  // One index per distinct set, so that equal terminals are equal elements (LeftFactor).
  Element AddChars(CharSet set) {
    set.Normalize();
    std::string key(reinterpret_cast<const char*>(set.ascii), sizeof(set.ascii));
    for (const auto& [lo, hi] : set.high) {
      key.append(reinterpret_cast<const char*>(&lo), sizeof(lo));
      key.append(reinterpret_cast<const char*>(&hi), sizeof(hi));
    }
    auto [it, inserted] = set_ids_.emplace(std::move(key), static_cast<int32_t>(char_sets_.size()));
    if (inserted) char_sets_.push_back(std::move(set));
    return {Element::Kind::kChars, it->second};
  }

  // Left-factors every rule: alternatives that start with the same terminal become one (the
  // terminal, then a new rule of their tails), repeatedly, so that a choice among many literals
  // (an enum of 20,000 strings) is a trie the matcher follows with one stack, not one per
  // literal. Empty alternatives are kept once. The language is unchanged.
  void LeftFactor() {
    std::vector<int32_t> work(bodies_.size());
    for (size_t r = 0; r < work.size(); ++r) work[r] = static_cast<int32_t>(r);
    while (!work.empty()) {
      const int32_t r = work.back();
      work.pop_back();
      if (bodies_[r].size() < 2) continue;
      auto key = [](const Element& e) {
        return (static_cast<uint64_t>(e.kind) << 32) | static_cast<uint32_t>(e.index);
      };
      {
        // Most rules have nothing to factor: no two alternatives start with one terminal, and at
        // most one is empty. Those are left as they are without building the maps below.
        std::vector<uint64_t> firsts;
        int empties = 0;
        for (const Sequence& a : bodies_[r]) {
          if (a.empty()) ++empties;
          else if (a[0].terminal()) firsts.push_back(key(a[0]));
        }
        std::sort(firsts.begin(), firsts.end());
        if (empties < 2 && std::adjacent_find(firsts.begin(), firsts.end()) == firsts.end()) continue;
      }
      std::vector<Sequence> alts = std::move(bodies_[r]);  // NewRule below may move bodies_
      std::unordered_map<uint64_t, int32_t> count;
      for (const Sequence& a : alts) {
        if (!a.empty() && a[0].terminal()) ++count[key(a[0])];
      }
      std::vector<Sequence> out;
      std::unordered_map<uint64_t, int32_t> tail_rule;  // first terminal -> the rule of its tails
      bool have_empty = false;
      for (Sequence& a : alts) {
        if (a.empty()) {
          if (!have_empty) out.emplace_back();
          have_empty = true;
          continue;
        }
        if (!a[0].terminal() || count[key(a[0])] < 2) {
          out.push_back(std::move(a));
          continue;
        }
        auto [it, first] = tail_rule.emplace(key(a[0]), -1);
        if (first) {
          it->second = NewRule(names_[r]);
          out.push_back({a[0], {Element::Kind::kRule, it->second}});
          work.push_back(it->second);
        }
        bodies_[it->second].emplace_back(a.begin() + 1, a.end());
      }
      bodies_[r] = std::move(out);
    }
  }

  // One element standing for the sequence (a new rule when it has more than one).
  Element Single(const std::string& rule, Sequence seq) {
    if (seq.size() == 1) return seq[0];
    const int32_t id = NewRule(rule);
    bodies_[id] = {std::move(seq)};
    return {Element::Kind::kRule, id};
  }

  Sequence Repeat(const std::string& rule, Sequence atom, int64_t lo, int64_t hi) {
    const Element x = Single(rule, std::move(atom));
    Sequence out(static_cast<size_t>(lo), x);
    if (hi < 0) {
      // star ::= x star | (empty): right recursion, which a top-down matcher expands lazily.
      const int32_t star = NewRule(rule);
      bodies_[star] = {{x, {Element::Kind::kRule, star}}, {}};
      out.push_back({Element::Kind::kRule, star});
    } else if (hi > lo) {
      // Up to hi - lo more: opt_k ::= x opt_{k-1} | (empty), nested so no count is ambiguous.
      int32_t inner = -1;
      for (int64_t k = 0; k < hi - lo; ++k) {
        const int32_t opt = NewRule(rule);
        Sequence body = {x};
        if (inner >= 0) body.push_back({Element::Kind::kRule, inner});
        bodies_[opt] = {std::move(body), {}};
        inner = opt;
      }
      out.push_back({Element::Kind::kRule, inner});
    }
    return out;
  }

  // One character of a literal or class: an escape or one UTF-8 encoded code point.
  StatusOr<uint32_t> ParseChar(bool in_class) {
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      if (pos_ + 1 >= s_.size()) return Error("a '\\' ends the grammar");
      const char e = s_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 'r': return uint32_t{'\r'};
        case 't': return uint32_t{'\t'};
        case '0': return uint32_t{0};
        case 'x': return ParseHex(2);
        case 'u': return ParseHex(4);
        case 'U': return ParseHex(8);
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': case '.':
          return static_cast<uint32_t>(e);
        default: return Error("unknown escape '\\{}'", e);
      }
    }
    if (c == '\n' && !in_class) return Error("a string literal cannot span lines (write \\n)");
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > s_.size()) return Error("invalid UTF-8 in the grammar");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < len; ++i) {
      const unsigned char b = static_cast<unsigned char>(s_[pos_ + i]);
      if ((b & 0xC0) != 0x80) return Error("invalid UTF-8 in the grammar");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += len;
    return cp;
  }

  StatusOr<uint32_t> ParseHex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= s_.size()) return Error("expected {} hex digits", digits);
      const char h = s_[pos_++];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) return Error("expected {} hex digits", digits);
      v = v * 16 + static_cast<uint32_t>(d);
    }
    if (v > 0x10FFFF) return Error("code point {:X} is past U+10FFFF", v);
    return v;
  }

  StatusOr<Grammar> Flatten(int32_t root) {
    Grammar g;
    g.root = root;
    g.rule_names = std::move(names_);
    g.char_sets = std::move(char_sets_);
    g.alternatives.resize(g.rule_names.size());
    for (size_t r = 0; r < bodies_.size(); ++r) {
      for (const Sequence& seq : bodies_[r]) {
        g.alternatives[r].push_back(static_cast<int32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), seq.begin(), seq.end());
        g.elements.push_back({Element::Kind::kEnd, -1});
      }
    }
    RETURN_IF_ERROR(CheckLeftRecursion(g));
    return g;
  }

  // A rule that can reach itself before consuming a character would make the matcher expand
  // forever. nullable: rules that can match the empty string.
  static Status CheckLeftRecursion(const Grammar& g) {
    const size_t n = g.rule_names.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (int32_t start : g.alternatives[r]) {
          bool all = true;
          for (int32_t p = start; g.elements[p].kind != Element::Kind::kEnd; ++p) {
            if (g.elements[p].terminal() || !nullable[g.elements[p].index]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    // left[r]: rules r can start with (reached through nullable prefixes).
    std::vector<std::vector<int32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (int32_t start : g.alternatives[r]) {
        for (int32_t p = start; g.elements[p].kind == Element::Kind::kRule; ++p) {
          left[r].push_back(g.elements[p].index);
          if (!nullable[g.elements[p].index]) break;
        }
      }
    }
    std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<int32_t, size_t>> stack;
    for (size_t s = 0; s < n; ++s) {
      if (color[s]) continue;
      stack.push_back({static_cast<int32_t>(s), 0});
      color[s] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i < left[r].size()) {
          const int32_t next = left[r][i++];
          if (color[next] == 1) {
            return InvalidArgument("grammar: rule '{}' is left-recursive (it can reach itself before matching a character)",
                                   g.rule_names[next]);
          }
          if (color[next] == 0) {
            color[next] = 1;
            stack.push_back({next, 0});
          }
        } else {
          color[r] = 2;
          stack.pop_back();
        }
      }
    }
    return Status::Ok();
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;
  int anon_count_ = 0;
  std::unordered_set<std::string_view> defined_names_;  // every name the text defines (NewRule avoids them)
  size_t num_elements_ = 0;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<std::vector<Sequence>> bodies_;  // [rule][alternative]
  std::vector<CharSet> char_sets_;
  std::unordered_map<std::string, int32_t> set_ids_;  // a set's content -> its index
  std::array<int32_t, 128> ascii_ids_ = MinusOnes();   // an ASCII code point's one-element set
  static std::array<int32_t, 128> MinusOnes() {
    std::array<int32_t, 128> a;
    a.fill(-1);
    return a;
  }
};

}  // namespace

StatusOr<Grammar> ParseGbnf(std::string_view text, std::string_view root) {
  GbnfParser p(text);
  return p.Parse(root);
}

}  // namespace gale::grammar
