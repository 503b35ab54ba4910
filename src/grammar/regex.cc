// A recursive-descent regex reader that writes GBNF as it goes.
#include "grammar/regex.h"

#include <fmt/format.h>

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

class RegexReader {
 public:
  RegexReader(std::string_view p, const CharSetWriter& w) : p_(p), write_(w) {}

  StatusOr<std::string> Read() {
    if (Peek() == '^') ++pos_;
    ASSIGN_OR_RETURN(std::string e, Alternation());
    if (pos_ < p_.size()) return Error("unexpected '{}'", p_[pos_]);
    return e;
  }

 private:
  template <typename... Args>
  Status Error(fmt::format_string<Args...> f, Args&&... args) const {
    return InvalidArgument("regex '{}' at {}: {}", p_, pos_, fmt::format(f, std::forward<Args>(args)...));
  }
  char Peek() const { return pos_ < p_.size() ? p_[pos_] : '\0'; }

  StatusOr<std::string> Alternation() {
    std::vector<std::string> alts;
    while (true) {
      ASSIGN_OR_RETURN(std::string s, Sequence());
      alts.push_back(s.empty() ? "\"\"" : s);
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  StatusOr<std::string> Sequence() {
    std::string out;
    while (pos_ < p_.size() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        ++pos_;
        if (pos_ != p_.size() && Peek() != ')' && Peek() != '|') return Error("'$' is supported only at the end");
        continue;
      }
      if (Peek() == '^') return Error("'^' is supported only at the start");
      ASSIGN_OR_RETURN(std::string atom, Atom());
      ASSIGN_OR_RETURN(atom, Quantified(std::move(atom)));
      if (!out.empty()) out += " ";
      out += atom;
    }
    return out;
  }

  StatusOr<std::string> Quantified(std::string atom) {
    while (true) {
      const char c = Peek();
      std::string q;
      if (c == '*' || c == '+' || c == '?') {
        q = std::string(1, c);
        ++pos_;
      } else if (c == '{' && pos_ + 1 < p_.size() && std::isdigit(static_cast<unsigned char>(p_[pos_ + 1]))) {
        const size_t close = p_.find('}', pos_);
        if (close == std::string_view::npos) return Error("unterminated '{{'");
        q = std::string(p_.substr(pos_, close - pos_ + 1));
        for (char d : q.substr(1, q.size() - 2)) {
          if (!std::isdigit(static_cast<unsigned char>(d)) && d != ',') return Error("bad repetition '{}'", q);
        }
        pos_ = close + 1;
      } else {
        return atom;
      }
      if (Peek() == '?' || Peek() == '+') ++pos_;  // lazy / possessive: the same strings
      if (++quantifiers_ > 1000) return Error("too many quantifiers");
      atom = "(" + atom + ")" + q;
    }
  }

  StatusOr<std::string> Atom() {
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      if (p_.substr(pos_, 2) == "?:") {
        pos_ += 2;
      } else if (Peek() == '?') {
        return Error("lookarounds and named groups are not supported");
      }
      if (++depth_ > kMaxGrammarNesting) return Error("groups nest too deep");
      ASSIGN_OR_RETURN(std::string inner, Alternation());
      --depth_;
      if (Peek() != ')') return Error("expected ')'");
      ++pos_;
      return fmt::format("({})", inner.empty() ? std::string("\"\"") : inner);
    }
    if (c == '[') return Class();
    if (c == '.') {
      ++pos_;
      CharSet s;
      s.AddRange('\n', '\n');
      s.Negate();
      return write_(s);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return Error("nothing to repeat");
    CharSet s;
    if (c == '\\') {
      RETURN_IF_ERROR(Escape(&s));
    } else {
      ASSIGN_OR_RETURN(uint32_t cp, Utf8());
      s.AddRange(cp, cp);
    }
    s.Normalize();
    return write_(s);
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

  StatusOr<std::string> Class() {
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
    return write_(s);
  }

  std::string_view p_;
  const CharSetWriter& write_;
  size_t pos_ = 0;
  int depth_ = 0;
  int quantifiers_ = 0;
};

}  // namespace

StatusOr<std::string> RegexToGbnf(std::string_view pattern, const CharSetWriter& write_set) {
  RegexReader r(pattern, write_set);
  ASSIGN_OR_RETURN(std::string e, r.Read());
  return e.empty() ? std::string("\"\"") : e;
}

}  // namespace gale::grammar
