// A recursive-descent regex reader that writes GBNF as it goes.
#include "grammar/regex.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "base/utf8.h"

namespace gale::grammar {

std::string JsonStringCharSet(const CharSet& s) {
  CharSet plain = s;
  plain.ascii[0] &= ~uint64_t{0xFFFFFFFF};                 // controls 0x00-0x1F
  plain.ascii[0] &= ~(uint64_t{1} << '"');
  plain.ascii[1] &= ~(uint64_t{1} << ('\\' - 64));
  std::vector<std::string> alts;
  if (plain.ascii[0] || plain.ascii[1] || !plain.high.empty()) alts.push_back(CharSetGbnf(plain));
  if (s.Contains('"')) alts.push_back("\"\\\\\\\"\"");   // the two characters \"
  if (s.Contains('\\')) alts.push_back("\"\\\\\\\\\"");  // the two characters \\ (one escaped backslash)
  for (uint32_t c = 0; c < 0x20; ++c) {
    if (!s.Contains(c)) continue;
    const char* short_form = c == '\n' ? "n" : c == '\t' ? "t" : c == '\r' ? "r" : c == '\b' ? "b" : c == '\f' ? "f" : nullptr;
    alts.push_back(short_form ? fmt::format("\"\\\\{}\"", short_form) : fmt::format("\"\\\\u00{:02x}\"", c));
  }
  if (alts.empty()) return "[]";
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

namespace {

// The parsed pattern: nodes in one array, children by index.
struct Node {
  enum class Kind : uint8_t { kSet, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kSeq;
  CharSet set;                  // kSet
  std::vector<int32_t> kids;    // kSeq, kAlt; kRepeat: one
  int32_t lo = 0, hi = -1;      // kRepeat (hi < 0: unbounded)
};

// A top-level alternative and whether ^ / $ anchor its sides.
struct Branch {
  int32_t node = -1;
  bool start_anchored = false, end_anchored = false;
};

struct Ast {
  std::vector<Node> nodes;
  std::vector<Branch> branches;
};

class RegexReader {
 public:
  RegexReader(std::string_view p, RegexMatch how) : p_(p), how_(how) {}

  StatusOr<Ast> Read() {
    while (true) {
      Branch b;
      if (Peek() == '^') {
        ++pos_;
        b.start_anchored = true;
      }
      ASSIGN_OR_RETURN(b.node, Sequence(&b.end_anchored));
      ast_.branches.push_back(b);
      if (Peek() != '|') break;
      ++pos_;
    }
    if (pos_ < p_.size()) return Error("unexpected '{}'", p_[pos_]);
    return std::move(ast_);
  }

 private:
  template <typename... Args>
  Status Error(fmt::format_string<Args...> f, Args&&... args) const {
    return InvalidArgument("regex '{}' at {}: {}", p_, pos_, fmt::format(f, std::forward<Args>(args)...));
  }
  char Peek() const { return pos_ < p_.size() ? p_[pos_] : '\0'; }

  int32_t Add(Node n) {
    ast_.nodes.push_back(std::move(n));
    return static_cast<int32_t>(ast_.nodes.size()) - 1;
  }
  int32_t AddSet(CharSet s) {
    s.Normalize();
    Node n;
    n.kind = Node::Kind::kSet;
    n.set = std::move(s);
    return Add(std::move(n));
  }

  StatusOr<int32_t> Alternation() {
    Node alt;
    alt.kind = Node::Kind::kAlt;
    while (true) {
      ASSIGN_OR_RETURN(int32_t s, Sequence(nullptr));
      alt.kids.push_back(s);
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alt.kids.size() == 1) return alt.kids[0];
    return Add(std::move(alt));
  }

  // `end_anchored`: where a top-level alternative records a closing $ (null inside groups).
  StatusOr<int32_t> Sequence(bool* end_anchored) {
    Node seq;
    seq.kind = Node::Kind::kSeq;
    while (pos_ < p_.size() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        ++pos_;
        if (pos_ != p_.size() && Peek() != ')' && Peek() != '|') return Error("'$' is supported only at the end");
        if (end_anchored != nullptr) {
          *end_anchored = true;
        } else if (how_ == RegexMatch::kSearch) {
          return Error("'$' inside a group is not supported");
        }
        continue;
      }
      if (Peek() == '^') return Error("'^' is supported only at the start");
      ASSIGN_OR_RETURN(int32_t atom, Atom());
      ASSIGN_OR_RETURN(atom, Quantified(atom));
      seq.kids.push_back(atom);
    }
    if (seq.kids.size() == 1) return seq.kids[0];
    return Add(std::move(seq));
  }

  StatusOr<int32_t> Quantified(int32_t atom) {
    while (true) {
      const char c = Peek();
      Node rep;
      rep.kind = Node::Kind::kRepeat;
      if (c == '*' || c == '+' || c == '?') {
        rep.lo = c == '+' ? 1 : 0;
        rep.hi = c == '?' ? 1 : -1;
        ++pos_;
      } else if (c == '{' && pos_ + 1 < p_.size() && std::isdigit(static_cast<unsigned char>(p_[pos_ + 1]))) {
        const size_t close = p_.find('}', pos_);
        if (close == std::string_view::npos) return Error("unterminated '{{'");
        const std::string_view q = p_.substr(pos_ + 1, close - pos_ - 1);
        const size_t comma = q.find(',');
        auto count = [](std::string_view d, int32_t* out) {
          if (d.empty() || d.size() > 6 || d.find_first_not_of("0123456789") != std::string_view::npos) return false;
          *out = std::stoi(std::string(d));
          return *out <= kMaxRepetition;
        };
        bool ok = count(q.substr(0, comma), &rep.lo);
        if (comma == std::string_view::npos) {
          rep.hi = rep.lo;
        } else if (comma + 1 < q.size()) {
          ok = ok && count(q.substr(comma + 1), &rep.hi);
        }
        if (!ok || (rep.hi >= 0 && rep.hi < rep.lo)) {
          return Error("bad repetition '{{{}}}' (counts up to {})", q, kMaxRepetition);
        }
        pos_ = close + 1;
      } else {
        return atom;
      }
      if (Peek() == '?' || Peek() == '+') ++pos_;  // lazy / possessive: the same strings
      if (++quantifiers_ > 1000) return Error("too many quantifiers");
      rep.kids.push_back(atom);
      atom = Add(std::move(rep));
    }
  }

  StatusOr<int32_t> Atom() {
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (p_.substr(pos_, 2) == "?:") {
        pos_ += 2;
      } else if (Peek() == '?') {
        return Error("lookarounds and named groups are not supported");
      }
      if (++depth_ > kMaxGrammarNesting) return Error("groups nest too deep");
      ASSIGN_OR_RETURN(int32_t inner, Alternation());
      --depth_;
      if (Peek() != ')') return Error("expected ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return Class();
    if (c == '.') {
      ++pos_;
      CharSet s;
      s.AddRange('\n', '\n');
      s.Negate();
      return AddSet(std::move(s));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return Error("nothing to repeat");
    CharSet s;
    if (c == '\\') {
      RETURN_IF_ERROR(Escape(&s));
    } else {
      ASSIGN_OR_RETURN(uint32_t cp, Utf8());
      s.AddRange(cp, cp);
    }
    return AddSet(std::move(s));
  }

  StatusOr<uint32_t> Utf8() {
    const unsigned char c = static_cast<unsigned char>(p_[pos_]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > p_.size()) return Error("invalid UTF-8");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(p_[pos_ + i]) & 0x3F);
    pos_ += len;
    return cp;
  }

  // After a backslash: adds what the escape stands for to s.
  Status Escape(CharSet* s) {
    ++pos_;
    if (pos_ >= p_.size()) return Error("the pattern ends with '\\'");
    const char e = p_[pos_++];
    auto add_class = [&](char k, bool negate) {
      CharSet c;
      if (k == 'd') c.AddRange('0', '9');
      if (k == 'w') {
        c.AddRange('0', '9');
        c.AddRange('a', 'z');
        c.AddRange('A', 'Z');
        c.AddRange('_', '_');
      }
      if (k == 's') {
        for (uint32_t w : {' ', '\t', '\n', '\r', '\v', '\f'}) c.AddRange(w, w);
        c.AddRange(0xA0, 0xA0);
        c.AddRange(0x2028, 0x2029);
        c.AddRange(0xFEFF, 0xFEFF);
      }
      c.Normalize();
      if (negate) c.Negate();
      s->ascii[0] |= c.ascii[0];
      s->ascii[1] |= c.ascii[1];
      s->high.insert(s->high.end(), c.high.begin(), c.high.end());
      s->Normalize();
    };
    switch (e) {
      case 'd': case 'w': case 's': add_class(e, false); return Status::Ok();
      case 'D': case 'W': case 'S': add_class(static_cast<char>(e + 32), true); return Status::Ok();
      case 'n': s->AddRange('\n', '\n'); return Status::Ok();
      case 't': s->AddRange('\t', '\t'); return Status::Ok();
      case 'r': s->AddRange('\r', '\r'); return Status::Ok();
      case 'f': s->AddRange('\f', '\f'); return Status::Ok();
      case 'v': s->AddRange('\v', '\v'); return Status::Ok();
      case '0': s->AddRange(0, 0); return Status::Ok();
      case 'x': case 'u': {
        const int n = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          const char h = Peek();
          const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) return Error("expected {} hex digits after \\{}", n, e);
          v = v * 16 + static_cast<uint32_t>(d);
          ++pos_;
        }
        s->AddRange(v, v);
        return Status::Ok();
      }
      case 'b': case 'B': return Error("word boundaries are not supported");
      default:
        if (e >= '1' && e <= '9') return Error("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(e))) return Error("unknown escape '\\{}'", e);
        s->AddRange(static_cast<unsigned char>(e), static_cast<unsigned char>(e));
        return Status::Ok();
    }
  }

  StatusOr<int32_t> Class() {
    ++pos_;
    CharSet s;
    const bool negate = Peek() == '^';
    if (negate) ++pos_;
    bool first = true;
    while (true) {
      if (pos_ >= p_.size()) return Error("unterminated '['");
      if (Peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      uint32_t lo;
      if (Peek() == '\\') {
        CharSet e;
        RETURN_IF_ERROR(Escape(&e));
        // A single-character escape can start a range; a class escape (\d) cannot.
        uint32_t only = 0, count = 0;
        for (uint32_t c = 0; c < 128 && count < 2; ++c) {
          if (e.Contains(c)) only = c, ++count;
        }
        if (!e.high.empty()) count += 2;
        if (count != 1 || Peek() != '-' || pos_ + 1 >= p_.size() || p_[pos_ + 1] == ']') {
          s.ascii[0] |= e.ascii[0];
          s.ascii[1] |= e.ascii[1];
          s.high.insert(s.high.end(), e.high.begin(), e.high.end());
          continue;
        }
        lo = only;
      } else {
        ASSIGN_OR_RETURN(lo, Utf8());
      }
      uint32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        if (Peek() == '\\') {
          CharSet e;
          RETURN_IF_ERROR(Escape(&e));
          hi = 0x110000;
          for (uint32_t c = 0; c < 128; ++c) {
            if (e.Contains(c)) hi = c;
          }
          if (hi == 0x110000) return Error("bad range end");
        } else {
          ASSIGN_OR_RETURN(hi, Utf8());
        }
        if (hi < lo) return Error("range out of order");
      }
      s.AddRange(lo, hi);
    }
    s.Normalize();
    if (negate) s.Negate();
    return AddSet(std::move(s));
  }

  std::string_view p_;
  RegexMatch how_;
  Ast ast_;
  size_t pos_ = 0;
  int depth_ = 0;
  int quantifiers_ = 0;
};

// The pattern's GBNF: a set through the writer; groups in parentheses only where needed.
class GbnfWriter {
 public:
  GbnfWriter(const Ast& ast, const CharSetWriter& w) : ast_(ast), write_(w) {}

  std::string Write(int32_t id) const {
    const Node& n = ast_.nodes[id];
    switch (n.kind) {
      case Node::Kind::kSet:
        return write_(n.set);
      case Node::Kind::kSeq: {
        std::string out;
        for (int32_t k : n.kids) {
          const std::string e = Write(k);
          if (!e.empty()) out += (out.empty() ? "" : " ") + e;
        }
        return out;
      }
      case Node::Kind::kAlt: {
        std::string out = "(";
        for (size_t i = 0; i < n.kids.size(); ++i) out += (i ? " | " : "") + NonEmpty(Write(n.kids[i]));
        return out + ")";
      }
      case Node::Kind::kRepeat: {
        std::string inner = "(";
        if (n.hi < 0 && Nullable(n.kids[0])) {
          // (x)* with x able to match nothing is left-recursive in GBNF: repeat x's non-empty
          // strings instead (the same language, as the empty copies add nothing).
          const std::optional<std::string> ne = WriteNonEmpty(n.kids[0]);
          if (!ne) return "";
          return inner + *ne + ")*";
        }
        inner += NonEmpty(Write(n.kids[0]));
        inner += ")";
        if (n.lo == 0 && n.hi < 0) return inner + "*";
        if (n.lo == 1 && n.hi < 0) return inner + "+";
        if (n.lo == 0 && n.hi == 1) return inner + "?";
        if (n.hi == n.lo) return fmt::format("{}{{{}}}", inner, n.lo);
        if (n.hi < 0) return fmt::format("{}{{{},}}", inner, n.lo);
        return fmt::format("{}{{{},{}}}", inner, n.lo, n.hi);
      }
    }
    return "";
  }

  static std::string NonEmpty(std::string e) { return e.empty() ? "\"\"" : e; }

  bool Nullable(int32_t id) const {
    const Node& n = ast_.nodes[id];
    switch (n.kind) {
      case Node::Kind::kSet: return false;
      case Node::Kind::kSeq: return std::all_of(n.kids.begin(), n.kids.end(), [&](int32_t k) { return Nullable(k); });
      case Node::Kind::kAlt: return std::any_of(n.kids.begin(), n.kids.end(), [&](int32_t k) { return Nullable(k); });
      case Node::Kind::kRepeat: return n.lo == 0 || Nullable(n.kids[0]);
    }
    return false;
  }

  // The node's strings but the empty one (nullopt: there are none).
  std::optional<std::string> WriteNonEmpty(int32_t id) const {
    const Node& n = ast_.nodes[id];
    if (!Nullable(id)) return Write(id);
    std::vector<std::string> alts;
    switch (n.kind) {
      case Node::Kind::kSet:
        break;
      case Node::Kind::kSeq:
        // Every part can be empty: the first non-empty one is part i, then the rest as they are.
        for (size_t i = 0; i < n.kids.size(); ++i) {
          const std::optional<std::string> first = WriteNonEmpty(n.kids[i]);
          if (!first) continue;
          std::string alt = *first;
          for (size_t j = i + 1; j < n.kids.size(); ++j) {
            const std::string e = Write(n.kids[j]);
            if (!e.empty()) alt += " " + e;
          }
          alts.push_back(alt);
        }
        break;
      case Node::Kind::kAlt:
        for (int32_t k : n.kids) {
          if (auto e = WriteNonEmpty(k)) alts.push_back(*e);
        }
        break;
      case Node::Kind::kRepeat: {
        // x{lo,hi} with x nullable is x's non-empty strings 0..hi times; x not nullable, lo == 0.
        if (n.hi == 0) break;
        const std::optional<std::string> x = Nullable(n.kids[0]) ? WriteNonEmpty(n.kids[0]) : Write(n.kids[0]);
        if (!x) break;
        const std::string inner = "(" + *x + ")";
        alts.push_back(n.hi < 0 ? inner + "+" : n.hi == 1 ? inner : fmt::format("{}{{1,{}}}", inner, n.hi));
        break;
      }
    }
    if (alts.empty()) return std::nullopt;
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

 private:
  const Ast& ast_;
  const CharSetWriter& write_;
};

CharSet AllCodePoints() {
  CharSet all;
  all.AddRange(0, 0x10FFFF);
  all.Normalize();
  return all;
}


// Thompson's construction over the parsed pattern: sets on edges, epsilon moves, a cap on states.
class Nfa {
 public:
  struct State {
    std::vector<std::pair<int32_t, int32_t>> edges;  // (index into sets, to)
    std::vector<int32_t> eps;
    int32_t accepts = -1;  // the language this state completes
  };
  explicit Nfa(size_t max_states) : max_states_(max_states) {}

  int32_t New() {
    if (states_.size() >= max_states_) {
      too_big_ = true;
      return 0;
    }
    states_.push_back({});
    return static_cast<int32_t>(states_.size()) - 1;
  }
  void Edge(int32_t from, const CharSet& set, int32_t to) {
    sets_.push_back(set);
    states_[from].edges.emplace_back(static_cast<int32_t>(sets_.size()) - 1, to);
  }
  void Eps(int32_t from, int32_t to) { states_[from].eps.push_back(to); }
  void Loop(int32_t at) { Edge(at, AllCodePoints(), at); }

  // The fragment for node `id` from state `from`; returns its exit.
  int32_t Build(const Ast& ast, int32_t id, int32_t from) {
    if (too_big_) return from;
    const Node& n = ast.nodes[id];
    switch (n.kind) {
      case Node::Kind::kSet: {
        const int32_t to = New();
        if (!too_big_) Edge(from, n.set, to);
        return to;
      }
      case Node::Kind::kSeq:
        for (int32_t k : n.kids) from = Build(ast, k, from);
        return from;
      case Node::Kind::kAlt: {
        const int32_t end = New();
        for (int32_t k : n.kids) {
          const int32_t start = New();
          if (too_big_) return from;
          Eps(from, start);
          Eps(Build(ast, k, start), end);
        }
        return end;
      }
      case Node::Kind::kRepeat: {
        for (int32_t i = 0; i < n.lo && !too_big_; ++i) from = Build(ast, n.kids[0], from);
        if (n.hi < 0) {
          const int32_t loop = New();
          if (too_big_) return from;
          Eps(from, loop);
          Eps(Build(ast, n.kids[0], loop), loop);
          return loop;
        }
        const int32_t out = New();
        if (too_big_) return from;
        Eps(from, out);
        for (int32_t i = n.lo; i < n.hi && !too_big_; ++i) {
          from = Build(ast, n.kids[0], from);
          if (!too_big_) Eps(from, out);
        }
        return out;
      }
    }
    return from;
  }

  bool too_big() const { return too_big_; }
  const std::vector<State>& states() const { return states_; }
  std::vector<State>& states() { return states_; }
  const std::vector<CharSet>& sets() const { return sets_; }

 private:
  size_t max_states_;
  bool too_big_ = false;
  std::vector<State> states_;
  std::vector<CharSet> sets_;
};

// Language li from state `from`: its words, or its pattern's branches (a searched side reads
// anything first or after), all ending in one accepting state.
Status AddLanguage(Nfa& nfa, const DfaLanguage& lang, int32_t from, int32_t li) {
  std::vector<int32_t> ends;
  if (lang.words) {
    for (const std::string& w : *lang.words) {
      int32_t at = from;
      for (size_t i = 0; i < w.size() && !nfa.too_big();) {
        const auto [cp, len] = Utf8Decode(std::string_view(w).substr(i));
        i += static_cast<size_t>(len);
        CharSet one;
        one.AddRange(cp, cp);
        one.Normalize();
        const int32_t next = nfa.New();
        if (!nfa.too_big()) nfa.Edge(at, one, next);
        at = next;
      }
      ends.push_back(at);
    }
  } else {
    ASSIGN_OR_RETURN(Ast ast, RegexReader(lang.pattern, lang.how).Read());
    for (const Branch& b : ast.branches) {
      int32_t at = nfa.New();
      if (nfa.too_big()) break;
      nfa.Eps(from, at);
      if (lang.how == RegexMatch::kSearch && !b.start_anchored) nfa.Loop(at);
      at = nfa.Build(ast, b.node, at);
      if (lang.how == RegexMatch::kSearch && !b.end_anchored) {
        const int32_t tail = nfa.New();
        if (nfa.too_big()) break;
        nfa.Eps(at, tail);
        nfa.Loop(tail);
        at = tail;
      }
      ends.push_back(at);
    }
  }
  if (nfa.too_big()) return Status::Ok();
  const int32_t accept = nfa.New();
  if (nfa.too_big()) return Status::Ok();
  for (int32_t e : ends) nfa.Eps(e, accept);
  nfa.states()[accept].accepts = li;
  return Status::Ok();
}

// Subset construction over the code-point intervals no set splits, with a budget of work
// proportional to the states allowed.
StatusOr<Dfa> Determinize(const Nfa& nfa, int32_t start, size_t max_states) {
  // The alphabet in intervals no set splits; each set as the intervals it covers.
  std::vector<uint32_t> cuts = {0};
  for (const CharSet& set : nfa.sets()) {
    for (const auto& [lo, hi] : set.Ranges()) {
      cuts.push_back(lo);
      cuts.push_back(hi + 1);
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  while (!cuts.empty() && cuts.back() > 0x10FFFF) cuts.pop_back();
  auto interval_end = [&](size_t j) { return j + 1 < cuts.size() ? cuts[j + 1] - 1 : 0x10FFFF; };
  std::vector<std::vector<int32_t>> covers(nfa.sets().size());
  for (size_t k = 0; k < nfa.sets().size(); ++k) {
    for (const auto& [lo, hi] : nfa.sets()[k].Ranges()) {
      for (size_t j = std::lower_bound(cuts.begin(), cuts.end(), lo) - cuts.begin(); j < cuts.size() && cuts[j] <= hi; ++j) {
        covers[k].push_back(static_cast<int32_t>(j));
      }
    }
  }

  const auto& ns = nfa.states();
  auto closure = [&](std::vector<int32_t> set) {
    std::vector<int32_t> stack = set;
    std::vector<bool> seen(ns.size(), false);
    for (int32_t s : set) seen[s] = true;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      for (int32_t t : ns[s].eps) {
        if (!seen[t]) seen[t] = true, set.push_back(t), stack.push_back(t);
      }
    }
    std::sort(set.begin(), set.end());
    return set;
  };
  // Subset construction, with a budget of work proportional to the states allowed.
  Dfa dfa;
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> pending;
  auto id_of = [&](std::vector<int32_t> set) -> int32_t {
    auto [it, added] = ids.emplace(std::move(set), static_cast<int32_t>(dfa.states.size()));
    if (added) {
      dfa.states.push_back({});
      for (int32_t s : it->first) {
        if (ns[s].accepts >= 0) dfa.states.back().accepts |= uint32_t{1} << ns[s].accepts;
      }
      pending.push_back(it->first);
    }
    return it->second;
  };
  id_of(closure({start}));
  int64_t work = 0;
  const int64_t work_limit = static_cast<int64_t>(max_states) * 20000;
  std::vector<std::vector<int32_t>> targets(cuts.size());
  for (size_t d = 0; d < pending.size(); ++d) {
    if (dfa.states.size() > max_states || work > work_limit) {
      return InvalidArgument("the patterns together need more than {} automaton states", max_states);
    }
    const std::vector<int32_t> set = pending[d];
    for (auto& t : targets) t.clear();
    for (int32_t s : set) {
      for (const auto& [k, to] : ns[s].edges) {
        work += static_cast<int64_t>(covers[k].size());
        for (int32_t j : covers[k]) targets[j].push_back(to);
      }
    }
    // Complete: a code point no state reads leads to the empty set, a state no language accepts
    // from (which a grammar of the strings no pattern matches needs).
    std::map<int32_t, CharSet> by_target;
    for (size_t j = 0; j < cuts.size(); ++j) {
      std::sort(targets[j].begin(), targets[j].end());
      targets[j].erase(std::unique(targets[j].begin(), targets[j].end()), targets[j].end());
      work += static_cast<int64_t>(targets[j].size());
      const int32_t to = id_of(closure(targets[j]));
      by_target[to].AddRange(cuts[j], interval_end(j));
    }
    for (auto& [to, chars] : by_target) {
      chars.Normalize();
      dfa.states[d].edges.push_back({std::move(chars), to});
    }
  }
  return dfa;
}

}  // namespace

StatusOr<std::string> RegexToGbnf(std::string_view pattern, const CharSetWriter& write_set, RegexMatch how) {
  ASSIGN_OR_RETURN(Ast ast, RegexReader(pattern, how).Read());
  const GbnfWriter w(ast, write_set);
  std::string any = "(";
  any += write_set(AllCodePoints());
  any += ")*";
  std::vector<std::string> alts;
  for (const Branch& b : ast.branches) {
    std::string e = w.Write(b.node);
    if (how == RegexMatch::kSearch) {
      if (!b.start_anchored) e = e.empty() ? any : any + " " + e;
      if (!b.end_anchored && !(e == any)) e = e.empty() ? any : e + " " + any;
    }
    alts.push_back(GbnfWriter::NonEmpty(e));
  }
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

StatusOr<Dfa> BuildDfa(const std::vector<DfaLanguage>& languages, size_t max_states) {
  if (languages.size() > 32) return InvalidArgument("more than 32 patterns to combine");
  Nfa nfa(max_states * 16);
  const int32_t start = nfa.New();
  for (size_t li = 0; li < languages.size() && !nfa.too_big(); ++li) {
    const int32_t from = nfa.New();
    nfa.Eps(start, from);
    RETURN_IF_ERROR(AddLanguage(nfa, languages[li], from, static_cast<int32_t>(li)));
  }
  if (nfa.too_big()) return InvalidArgument("the patterns together need more than {} automaton states", max_states * 16);
  return Determinize(nfa, start, max_states);
}

uint32_t DfaAccepts(const Dfa& dfa, std::string_view text) {
  size_t q = 0;
  for (size_t i = 0; i < text.size();) {
    const auto [cp, len] = Utf8Decode(text.substr(i));
    i += static_cast<size_t>(len);
    const auto e = std::find_if(dfa.states[q].edges.begin(), dfa.states[q].edges.end(),
                                [cp = cp](const Dfa::Edge& edge) { return edge.chars.Contains(cp); });
    if (e == dfa.states[q].edges.end()) return 0;  // (a complete automaton always has one)
    q = static_cast<size_t>(e->to);
  }
  return dfa.states[q].accepts;
}

}  // namespace gale::grammar
