// JSON Schema -> GBNF. One rule per subschema, named after where it sits; identical bodies share a
// rule. Integer bounds become digit-range alternatives (a range's numbers of each length).
#include "grammar/json_schema.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "base/utf8.h"
#include "grammar/regex.h"

namespace gale::grammar {
namespace {

using Json = nlohmann::ordered_json;

const std::map<std::string, std::string>& Primitives() {
  static const std::map<std::string, std::string> kRules = {
      // Compact JSON, as OpenAI's structured outputs: no whitespace between tokens (a model that
      // may add it fills long runs of it); one optional space before the value (lead-space: a
      // SentencePiece model's first token often carries one).
      {"space", "\"\""},
      {"lead-space", "\" \"?"},
      // A JSON string character: anything but ", \ and controls, or an escape (no lone surrogates).
      {"char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))"},
      {"string", "\"\\\"\" char* \"\\\"\" space"},
      {"integral-part", "\"0\" | [1-9] [0-9]{0,15}"},
      {"integer", "\"-\"? integral-part space"},
      {"number", "\"-\"? integral-part (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? space"},
      {"boolean", "(\"true\" | \"false\") space"},
      {"null", "\"null\" space"},
      {"value", "object | array | string | number | boolean | null"},
      {"object", "\"{\" space (string \":\" space value (\",\" space string \":\" space value)*)? \"}\" space"},
      {"array", "\"[\" space (value (\",\" space value)*)? \"]\" space"},
      {"uuid", "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12} \"\\\"\" space"},
      // Days that exist in every year (no February 29: a leap day needs the year).
      {"date", "[0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | \"02\" \"-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))"},
      {"hms", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})?"},
      {"time", "hms (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
      // Subsets of the RFC forms (what validators accept; not all they accept).
      {"dns-label", "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?"},
      {"email-string", "\"\\\"\" [a-zA-Z0-9_+-]+ (\".\" [a-zA-Z0-9_+-]+)* \"@\" dns-label (\".\" dns-label)* \".\" [a-zA-Z]{2,63} \"\\\"\" space"},
      {"hostname-string", "\"\\\"\" dns-label (\".\" dns-label)* \"\\\"\" space"},
      {"uri-string", "\"\\\"\" (\"https\" | \"http\") \"://\" dns-label (\".\" dns-label)* (\"/\" [a-zA-Z0-9._~-]*)* \"\\\"\" space"},
      {"dec-octet", "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]"},
      {"ipv4-string", "\"\\\"\" dec-octet \".\" dec-octet \".\" dec-octet \".\" dec-octet \"\\\"\" space"},
      // RFC 3986's characters (unreserved, reserved, percent-encoded); a relative reference's first
      // segment has no ':' (else it would read as a scheme).
      {"pct-encoded", "\"%\" [0-9a-fA-F] [0-9a-fA-F]"},
      {"uri-scheme", "[a-zA-Z] [a-zA-Z0-9+.-]*"},
      {"uri-ref-char", "[a-zA-Z0-9._~!$&'()*+,;=:@/?#-] | \"[\" | \"]\" | pct-encoded"},
      {"uri-nc-char", "[a-zA-Z0-9._~!$&'()*+,;=@-] | pct-encoded"},
      {"uri-reference-string", "\"\\\"\" (uri-scheme \":\" uri-ref-char* | uri-nc-char+ ([/?#] uri-ref-char*)? | [/?#] uri-ref-char*)? \"\\\"\" space"},
      // RFC 3987: an IRI is a URI whose characters may also be any non-ASCII character.
      {"iri-string", "\"\\\"\" uri-scheme \":\" (uri-ref-char | [^\\x00-\\x7F])* \"\\\"\" space"},
      // RFC 6570: literals and {expressions} with an optional operator and variables with modifiers.
      {"uri-template-string", "\"\\\"\" ([!#$&(-;=?-Z_a-z~] | \"[\" | \"]\" | [^\\x00-\\x7F] | pct-encoded | uri-template-expr)* \"\\\"\" space"},
      {"uri-template-expr", "\"{\" [-+#./;?&=,!@|]? uri-template-var (\",\" uri-template-var)* \"}\""},
      {"uri-template-var", "([a-zA-Z0-9_] | pct-encoded) (\".\"? ([a-zA-Z0-9_] | pct-encoded))* (\":\" [1-9] [0-9]{0,3} | \"*\")?"},
      // RFC 4291's text forms (RFC 3986's IPv6address).
      {"h16", "[0-9a-fA-F]{1,4}"},
      {"ls32", "h16 \":\" h16 | dec-octet \".\" dec-octet \".\" dec-octet \".\" dec-octet"},
      {"ipv6-string", "\"\\\"\" ((h16 \":\"){6} ls32 | \"::\" (h16 \":\"){5} ls32 | h16? \"::\" (h16 \":\"){4} ls32 | ((h16 \":\")? h16)? \"::\" (h16 \":\"){3} ls32 | ((h16 \":\"){0,2} h16)? \"::\" (h16 \":\"){2} ls32 | ((h16 \":\"){0,3} h16)? \"::\" h16 \":\" ls32 | ((h16 \":\"){0,4} h16)? \"::\" ls32 | ((h16 \":\"){0,5} h16)? \"::\" h16 | ((h16 \":\"){0,6} h16)? \"::\") \"\\\"\" space"},
      // RFC 3339's duration (its appendix A): years, months, days in that order, or weeks, and a time.
      {"dur-time", "\"T\" ([0-9]+ \"H\" ([0-9]+ \"M\" ([0-9]+ \"S\")?)? | [0-9]+ \"M\" ([0-9]+ \"S\")? | [0-9]+ \"S\")"},
      {"duration-string", "\"\\\"\" \"P\" (([0-9]+ \"D\" | [0-9]+ \"M\" ([0-9]+ \"D\")? | [0-9]+ \"Y\" ([0-9]+ \"M\" ([0-9]+ \"D\")?)?) dur-time? | dur-time | [0-9]+ \"W\") \"\\\"\" space"},
      {"date-string", "\"\\\"\" date \"\\\"\" space"},
      {"time-string", "\"\\\"\" time \"\\\"\" space"},
      {"date-time-string", "\"\\\"\" date \"T\" time-utc \"\\\"\" space"},
      {"time-utc", "hms \"Z\""},
  };
  return kRules;
}

const std::map<std::string, std::vector<std::string>>& PrimitiveDeps() {
  static const std::map<std::string, std::vector<std::string>> kDeps = {
      {"string", {"char", "space"}},
      {"integer", {"integral-part", "space"}},
      {"number", {"integral-part", "space"}},
      {"boolean", {"space"}},
      {"null", {"space"}},
      {"value", {"object", "array", "string", "number", "boolean", "null"}},
      {"object", {"space", "string", "value"}},
      {"array", {"space", "value"}},
      {"uuid", {"space"}},
      {"date-string", {"date", "space"}},
      {"email-string", {"dns-label", "space"}},
      {"hostname-string", {"dns-label", "space"}},
      {"uri-string", {"dns-label", "space"}},
      {"ipv4-string", {"dec-octet", "space"}},
      {"uri-ref-char", {"pct-encoded"}},
      {"uri-nc-char", {"pct-encoded"}},
      {"uri-reference-string", {"uri-scheme", "uri-ref-char", "uri-nc-char", "space"}},
      {"iri-string", {"uri-scheme", "uri-ref-char", "space"}},
      {"uri-template-var", {"pct-encoded"}},
      {"uri-template-expr", {"uri-template-var"}},
      {"uri-template-string", {"pct-encoded", "uri-template-expr", "space"}},
      {"ls32", {"h16", "dec-octet"}},
      {"ipv6-string", {"h16", "ls32", "space"}},
      {"duration-string", {"dur-time", "space"}},
      {"time-string", {"time", "space"}},
      {"date-time-string", {"date", "time-utc", "space"}},
      {"time", {"hms"}},
      {"time-utc", {"hms"}},
  };
  return kDeps;
}

std::string JsonLiteral(const Json& v) { return GbnfLiteral(v.dump(-1, ' ', false, Json::error_handler_t::replace)); }

// Numbers in [x, y] written with exactly x.size() == y.size() digits (x <= y).
std::string SameLength(const std::string& x, const std::string& y) {
  const size_t n = x.size();
  if (n == 0) return "";
  if (x == y) return GbnfLiteral(x);
  if (x[0] == y[0]) return GbnfLiteral(x.substr(0, 1)) + " " + SameLength(x.substr(1), y.substr(1));
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  auto tail = [&](const std::string& rest) { return n == 1 ? std::string() : " " + rest; };
  if (x.substr(1) == zeros && y.substr(1) == nines) {
    return fmt::format("[{}-{}]", x[0], y[0]) + tail(fmt::format("[0-9]{{{}}}", n - 1));
  }
  std::vector<std::string> alts;
  alts.push_back(GbnfLiteral(x.substr(0, 1)) + tail(SameLength(x.substr(1), nines)));
  if (y[0] - x[0] >= 2) {
    alts.push_back(fmt::format("[{}-{}]", static_cast<char>(x[0] + 1), static_cast<char>(y[0] - 1)) +
                   tail(fmt::format("[0-9]{{{}}}", n - 1)));
  }
  alts.push_back(GbnfLiteral(y.substr(0, 1)) + tail(SameLength(zeros, y.substr(1))));
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// A name's JSON-encoded text in units: a character (its UTF-8 bytes) or an escape as JSON writes
// it (\" \\ \n ... \u001f).
std::vector<std::string> EncodedUnits(const std::string& name) {
  const std::string text = Json(name).dump(-1, ' ', false, Json::error_handler_t::replace);
  std::vector<std::string> units;
  for (size_t i = 1; i + 1 < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    size_t len = b == '\\' ? (text[i + 1] == 'u' ? 6 : 2) : b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
    len = std::min(len, text.size() - 1 - i);
    units.push_back(text.substr(i, len));
    i += len;
  }
  return units;
}

uint32_t FirstCodePoint(const std::string& u) {
  const unsigned char b = static_cast<unsigned char>(u[0]);
  if (b < 0x80) return b;
  const int len = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
  uint32_t cp = len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k < len && k < static_cast<int>(u.size()); ++k) cp = (cp << 6) | (static_cast<unsigned char>(u[k]) & 0x3F);
  return cp;
}

// A pattern that is one character's class repeated, anchored at both ends ("^[a-z0-9_]+$",
// "^\\d{4,8}$"): the class as its own regex, and the counts (hi < 0: unbounded). Anything else:
// nullopt.
struct ClassRepeat {
  std::string atom;
  int64_t lo = 0, hi = -1;
};
std::optional<ClassRepeat> AsClassRepeat(std::string_view p) {
  if (p.size() < 3 || p.front() != '^' || p.back() != '$' || p[p.size() - 2] == '\\') return std::nullopt;
  p.remove_prefix(1);
  p.remove_suffix(1);
  size_t i = 0;
  if (p[0] == '[') {
    i = 1;
    if (i < p.size() && p[i] == '^') ++i;
    if (i < p.size() && p[i] == ']') ++i;
    while (i < p.size() && p[i] != ']') i += p[i] == '\\' ? 2 : 1;
    if (i >= p.size()) return std::nullopt;
    ++i;
  } else if (p[0] == '\\') {
    if (p.size() < 2 || std::string_view("wdsWDS").find(p[1]) == std::string_view::npos) return std::nullopt;
    i = 2;
  } else if (p[0] == '.') {
    i = 1;
  } else {
    return std::nullopt;
  }
  ClassRepeat r;
  r.atom = std::string(p.substr(0, i));
  std::string_view q = p.substr(i);
  if (q.size() > 1 && q.back() == '?') q.remove_suffix(1);  // lazy: the same strings
  if (q == "*") return r;
  if (q == "+") return r.lo = 1, r;
  if (q == "?") return r.hi = 1, r;
  if (q.size() < 3 || q.front() != '{' || q.back() != '}') return std::nullopt;
  q = q.substr(1, q.size() - 2);
  const size_t comma = q.find(',');
  auto num = [](std::string_view d, int64_t* out) {
    if (d.empty() || d.size() > 9 || d.find_first_not_of("0123456789") != std::string_view::npos) return false;
    *out = std::stoll(std::string(d));
    return true;
  };
  if (!num(q.substr(0, comma), &r.lo)) return std::nullopt;
  if (comma == std::string_view::npos) return r.hi = r.lo, r;
  if (comma + 1 == q.size()) return r;
  if (!num(q.substr(comma + 1), &r.hi) || r.hi < r.lo) return std::nullopt;
  return r;
}

constexpr int64_t kMaxBound = 999999999999999;  // 15 digits: what `integral-part` writes at most

// Unsigned integers in [lo, hi] (hi unset: up to 16 digits), written without leading zeros.
std::string UnsignedRange(int64_t lo, std::optional<int64_t> hi) {
  const std::string a = std::to_string(lo);
  std::vector<std::string> alts;
  const size_t max_len = hi ? std::to_string(*hi).size() : a.size();
  for (size_t len = a.size(); len <= max_len; ++len) {
    const std::string from = len == a.size() ? a : fmt::format("1{}", std::string(len - 1, '0'));
    const std::string to = hi && len == max_len ? std::to_string(*hi) : std::string(len, '9');
    alts.push_back(SameLength(from, to));
  }
  if (!hi && a.size() < 16) alts.push_back(fmt::format("[1-9] [0-9]{{{},15}}", a.size()));
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// The formats with a grammar as regexes over the string's text, the same languages as their
// GBNF primitives (a test compares them): where a format meets a `pattern` or lengths, an
// automaton reads them together. Formats without one here: nullopt.
std::optional<std::string> FormatRegex(const std::string& f) {
  static const std::string dns = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?";
  static const std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])";
  static const std::string date =
      "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
  static const std::string hms = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?";
  if (f == "date") return date;
  if (f == "time") return hms + "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
  if (f == "date-time") return date + "T" + hms + "Z";
  if (f == "uuid") return "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  if (f == "email") return "[a-zA-Z0-9_+-]+(?:\\.[a-zA-Z0-9_+-]+)*@" + dns + "(?:\\." + dns + ")*\\.[a-zA-Z]{2,63}";
  if (f == "hostname") return dns + "(?:\\." + dns + ")*";
  if (f == "uri") return "https?://" + dns + "(?:\\." + dns + ")*(?:/[a-zA-Z0-9._~-]*)*";
  if (f == "ipv4") return octet + "\\." + octet + "\\." + octet + "\\." + octet;
  return std::nullopt;
}

// A pattern's lookaheads at its anchored start, `^(?!X)(?=Y)...` (zod 4.0's email pattern opens
// with two): the pattern without them (still anchored), and each one's body with whether it must
// match (?=) or must not (?!). A lookahead anywhere else stays, and the regex reader refuses it.
struct Lookaheads {
  std::string rest;
  // Per lookahead: the texts it matches at the start, as a regex searched (a prefix matching its
  // body, the whole text where the body ends with $), and whether the text must be among them.
  std::vector<std::pair<std::string, bool>> checks;
};

// Where, from `from` on, a regex's structure reaches `stop` outside escapes and classes with
// `depth` groups open (the depth counted from `depth` at `from`): that character's place, or npos.
size_t RegexFind(std::string_view p, size_t from, int depth, char stop) {
  bool in_class = false;
  for (size_t j = from; j < p.size(); ++j) {
    const char c = p[j];
    if (c == '\\') {
      ++j;
    } else if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (c == ')' && --depth == 0 && stop == ')') {
      return j;
    } else if (c == '(') {
      ++depth;
    } else if (c == stop && stop != ')' && depth == 0) {
      return j;
    }
  }
  return std::string_view::npos;
}

Lookaheads LeadingLookaheads(const std::string& pattern) {
  Lookaheads out{pattern, {}};
  if (pattern.empty() || pattern[0] != '^') return out;
  size_t i = 1;
  while (pattern.compare(i, 3, "(?!") == 0 || pattern.compare(i, 3, "(?=") == 0) {
    const size_t close = RegexFind(pattern, i + 3, 1, ')');
    if (close == std::string::npos) return {pattern, {}};  // not closed: left to the reader's error
    std::string body = pattern.substr(i + 3, close - (i + 3));
    size_t slashes = 0;
    while (body.size() > slashes + 1 && body[body.size() - 2 - slashes] == '\\') ++slashes;
    const bool anchored = !body.empty() && body.back() == '$' && slashes % 2 == 0;
    if (anchored) body.pop_back();
    out.checks.emplace_back("^(?:" + body + ")" + (anchored ? "$" : ""), pattern[i + 2] == '=');
    i = close + 1;
  }
  out.rest = "^" + pattern.substr(i);
  // A top-level alternative after them would not be under them (^(?!a)b|c): left unsplit.
  if (RegexFind(out.rest, 1, 0, '|') != std::string::npos) return {pattern, {}};
  return out;
}

// Formats JSON Schema defines, which are checked (by a grammar) or refused; any other is an
// annotation.
bool IsCheckedFormat(const std::string& f) {
  static const std::set<std::string> kChecked = {"date", "time", "date-time", "uuid", "email", "hostname", "uri", "ipv4",
                                                 "ipv6", "uri-reference", "iri", "uri-template", "duration", "regex",
                                                 "iri-reference", "idn-email", "idn-hostname", "json-pointer",
                                                 "relative-json-pointer"};
  return kChecked.count(f) > 0;
}

// A string's length in code points (JSON Schema's string length).
int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) i += static_cast<size_t>(Utf8Decode(s.substr(i)).second);
  return n;
}

// 10^k, for k up to 18.
int64_t Pow10(int k) {
  int64_t v = 1;
  for (int i = 0; i < k; ++i) v *= 10;
  return v;
}

// A bound on a number's magnitude: its integer part and fraction digits (no trailing zeros),
// and whether the bound itself is excluded.
struct DecimalBound {
  int64_t integer = 0;
  std::string fraction;
  bool strict = false;
};

// |v| as a DecimalBound, from the shortest text that reads back as v (so 0.1 is "1" after the
// point, not the binary value's 55 digits). An upper bound past 15 integer digits is lowered to
// what `integral-part` writes; a lower bound there, or a bound finer than 20 digits after the
// point, cannot be written (nullopt).
std::optional<DecimalBound> Magnitude(double v, bool strict, bool upper) {
  std::string t = fmt::format("{}", std::abs(v));
  int exp = 0;
  if (const size_t e = t.find_first_of("eE"); e != std::string::npos) {
    exp = std::stoi(t.substr(e + 1));
    t.resize(e);
  }
  std::string digits = t;
  int point = static_cast<int>(t.size());
  if (const size_t dot = t.find('.'); dot != std::string::npos) {
    digits = t.substr(0, dot) + t.substr(dot + 1);
    point = static_cast<int>(dot);
  }
  point += exp;
  std::string whole, fraction;
  if (point <= 0) {
    whole = "0";
    fraction = std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (point >= static_cast<int>(digits.size())) {
    whole = digits + std::string(static_cast<size_t>(point) - digits.size(), '0');
  } else {
    whole = digits.substr(0, static_cast<size_t>(point));
    fraction = digits.substr(static_cast<size_t>(point));
  }
  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
  whole.erase(0, std::min(whole.find_first_not_of('0'), whole.size() - 1));
  if (whole.size() > 15) {
    if (!upper) return std::nullopt;
    return DecimalBound{kMaxBound, "", false};
  }
  if (fraction.size() > 20) return std::nullopt;
  return DecimalBound{std::stoll(whole), fraction, strict};
}

// A bound on the digits after a number's point, as those digits without trailing zeros.
struct FractionBound {
  bool present = false;
  std::string digits;
  bool strict = false;
  FractionBound Rest() const { return {present, digits.empty() ? "" : digits.substr(1), strict}; }
};
// Digit strings after the point: whether none at all is one, and GBNF alternatives for the others.
struct FractionSet {
  bool empty_ok = false;
  std::vector<std::string> alts;
};

std::string JoinAlternatives(const std::vector<std::string>& alts) {
  std::string out;
  for (const std::string& a : alts) out += (out.empty() ? "" : " | ") + a;
  return alts.size() > 1 ? "(" + out + ")" : out;
}

// Digit strings after the point, at least `min` of them (0 or 1), where only the first `free` may
// be other than 0 (free < 0: any).
std::string FreeDigits(int free, int min) {
  if (free < 0) return fmt::format("[0-9]{{{},16}}", min);
  if (free == 0) return fmt::format("\"0\"{{{},16}}", min);
  return fmt::format("[0-9]{{{},{}}} \"0\"{{0,16}}", min, free);
}

// The digit strings g after the point with lo <= 0.g <= hi (< or > where strict), of which only
// the first `free` digits may be other than 0 (free < 0: any; a multipleOf of 10^-free), a digit
// at a time: a first digit strictly between the bounds' first digits leaves the rest free, one
// equal to a bound's first digit leaves the rest bounded by that bound's rest.
FractionSet Fractions(FractionBound lo, FractionBound hi, int free = -1) {
  if (lo.present && lo.digits.empty() && !lo.strict) lo.present = false;  // >= 0: no bound
  if (hi.present && hi.digits.empty()) {  // <= 0 (only zeros), or < 0 (nothing)
    if (hi.strict || lo.present) return {};
    return {true, {"\"0\"{1,16}"}};
  }
  if (free == 0) {  // only zeros: 0, which satisfies hi (> 0 here) and lo only when lo is unset
    if (lo.present) return {};
    return {true, {"\"0\"{1,16}"}};
  }
  if (!lo.present && !hi.present) return {true, {FreeDigits(free, 1)}};
  if (lo.present && lo.digits.empty() && !hi.present) {  // > 0: a digit other than 0 among the free ones
    if (free < 0) return {false, {"\"0\"{0,15} [1-9] [0-9]{0,15}"}};
    FractionSet out;
    for (int zeros = 0; zeros < free; ++zeros) {
      out.alts.push_back(fmt::format("\"0\"{{{}}} [1-9] {}", zeros, FreeDigits(free - zeros - 1, 0)));
    }
    return out;
  }
  FractionSet out;
  out.empty_ok = !lo.present;
  const int l = lo.present ? (lo.digits.empty() ? 0 : lo.digits[0] - '0') : -1;
  const int h = hi.present ? hi.digits[0] - '0' : 10;
  const int rest_free = free < 0 ? -1 : free - 1;
  auto then = [&](int d, const FractionSet& rest) {
    const std::string digit = fmt::format("\"{}\"", d);
    if (rest.alts.empty()) {
      if (rest.empty_ok) out.alts.push_back(digit);
      return;
    }
    out.alts.push_back(digit + " " + (rest.alts.size() > 1 || rest.empty_ok ? "(" + JoinAlternatives(rest.alts) + ")" : rest.alts[0]) +
                       (rest.empty_ok ? "?" : ""));
  };
  if (l + 1 <= h - 1) {
    out.alts.push_back((l + 1 == h - 1 ? fmt::format("\"{}\"", l + 1) : fmt::format("[{}-{}]", l + 1, h - 1)) + " " +
                       FreeDigits(rest_free, 0));
  }
  if (l == h) {
    then(l, Fractions(lo.Rest(), hi.Rest(), rest_free));
  } else {
    if (l >= 0) then(l, Fractions(lo.Rest(), {}, rest_free));
    if (h <= 9) then(h, Fractions({}, hi.Rest(), rest_free));
  }
  return out;
}

// Decimal magnitudes m (no sign, no exponent) with lo <= m <= hi (lo unset: from 0; hi unset:
// no end), as GBNF alternatives: the integer parts strictly between the bounds' with any
// fraction, and each bound's own integer part with the fractions its bound allows (free: as
// Fractions').
std::vector<std::string> Magnitudes(const std::optional<DecimalBound>& lo, const std::optional<DecimalBound>& hi, int free) {
  std::vector<std::string> out;
  auto add = [&](const std::string& whole, const FractionSet& f) {
    if (f.alts.empty() && !f.empty_ok) return;
    if (f.alts.empty()) return out.push_back(whole);
    out.push_back(whole + " (\".\" " + JoinAlternatives(f.alts) + ")" + (f.empty_ok ? "?" : ""));
  };
  const int64_t li = lo ? lo->integer : 0;
  const FractionBound lf = lo ? FractionBound{true, lo->fraction, lo->strict} : FractionBound{};
  if (hi && li > hi->integer) return out;
  if (hi && li == hi->integer) {
    add(GbnfLiteral(std::to_string(li)), Fractions(lf, {true, hi->fraction, hi->strict}, free));
    return out;
  }
  add(GbnfLiteral(std::to_string(li)), Fractions(lf, {}, free));
  if (!hi || li + 1 <= hi->integer - 1) {
    add(UnsignedRange(li + 1, hi ? std::optional<int64_t>(hi->integer - 1) : std::nullopt), Fractions({}, {}, free));
  }
  if (hi) add(GbnfLiteral(std::to_string(hi->integer)), Fractions({}, {true, hi->fraction, hi->strict}, free));
  return out;
}

class Converter {
 public:
  Converter(const Json& root, std::string root_name, ThreadCpuClock::time_point deadline, ObjectKeys objects)
      : root_(root), root_name_(std::move(root_name)), deadline_(deadline), objects_(objects) {
    used_names_.insert(root_name_);
  }

  StatusOr<std::string> Convert() {
    ASSIGN_OR_RETURN(std::string top, Visit(root_, "root", ""));
    // JSON text may start with a space (a SentencePiece model's first token often carries one).
    std::string out = root_name_ + " ::= " + UsePrimitive("lead-space") + " " + top + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  template <typename... Args>
  static Status Error(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
    return InvalidArgument("schema at '{}': {}", path.empty() ? "/" : path, fmt::format(f, std::forward<Args>(args)...));
  }
  // A schema no value satisfies (OutOfRange): an optional property with it is left out.
  static Status MatchesNothing(const std::string& path, const std::string& why) {
    return Status(StatusCode::kOutOfRange, fmt::format("schema at '{}': {}: no value matches", path.empty() ? "/" : path, why));
  }

  std::string UsePrimitive(const std::string& name) {
    if (have_primitive_.insert(name).second) {
      used_names_.insert(name);
      rules_.emplace_back(name, Primitives().at(name));
      auto it = PrimitiveDeps().find(name);
      if (it != PrimitiveDeps().end()) {
        for (const auto& d : it->second) UsePrimitive(d);
      }
    }
    return name;
  }

  std::string FreshName(const std::string& hint) {
    std::string base;
    for (char c : hint) {
      const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-';
      if (!ok && !base.empty() && base.back() == '-') continue;
      base += ok ? c : '-';
      if (base.size() >= 48) break;
    }
    if (base.empty() || Primitives().count(base)) base = "r-" + base;
    // Suffixes go on from the last one a base took: many rules share a base (names are cut at 48
    // characters), and probing from 1 each time was quadratic in them.
    std::string name = base;
    for (int& i = next_suffix_[base]; used_names_.count(name);) name = fmt::format("{}-{}", base, ++i);
    used_names_.insert(name);
    return name;
  }

  // A named rule with this body (an existing one when the body is the same).
  std::string Rule(const std::string& hint, const std::string& body) {
    auto it = by_body_.find(body);
    if (it != by_body_.end()) return it->second;
    const std::string name = FreshName(hint);
    rules_.emplace_back(name, body);
    by_body_.emplace(body, name);
    return name;
  }

  StatusOr<const Json*> Resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') return Error(path, "only local $refs (#/...) are supported, got '{}'", ref);
    const Json* at = &root_;
    size_t pos = 1;
    while (pos < ref.size()) {
      if (ref[pos] != '/') return Error(path, "bad $ref '{}'", ref);
      const size_t next = std::min(ref.find('/', pos + 1), ref.size());
      std::string seg = ref.substr(pos + 1, next - pos - 1);
      std::string unescaped;  // JSON pointer escapes: ~1 is '/', ~0 is '~'
      for (size_t k = 0; k < seg.size(); ++k) {
        if (seg[k] == '~' && k + 1 < seg.size() && (seg[k + 1] == '0' || seg[k + 1] == '1')) {
          unescaped += seg[++k] == '1' ? '/' : '~';
        } else {
          unescaped += seg[k];
        }
      }
      seg = std::move(unescaped);
      if (at->is_object() && at->contains(seg)) {
        at = &(*at)[seg];
      } else if (at->is_array() && !seg.empty() && std::all_of(seg.begin(), seg.end(), ::isdigit) &&
                 seg.size() < 9 && std::stoul(seg) < at->size()) {
        at = &(*at)[std::stoul(seg)];
      } else {
        return Error(path, "$ref '{}' points at nothing", ref);
      }
      pos = next;
    }
    return at;
  }

  StatusOr<std::string> Visit(const Json& s, const std::string& hint, const std::string& path) {
    if (++depth_ > 128) return Error(path, "the schema nests too deep");
    if (++visits_ % 64 == 0 && ThreadCpuClock::now() > deadline_) {
      return ResourceExhausted("converting the schema ran out of time at '{}'", path.empty() ? "/" : path);
    }
    auto r = VisitInner(s, hint, path);
    --depth_;
    return r;
  }

  StatusOr<std::string> VisitInner(const Json& s, const std::string& hint, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) return MatchesNothing(path, "the schema false");
      return UsePrimitive("value");
    }
    if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
    if (s.contains("not")) {
      ASSIGN_OR_RETURN(Json folded, FoldNot(s, path));
      return VisitInner(folded, hint, path);
    }
    for (const char* kw : {"if", "then", "else", "dependentSchemas",
                           "minContains", "maxContains",
                           "unevaluatedProperties", "unevaluatedItems"}) {
      if (s.contains(kw)) return Error(path, "'{}' is not supported", kw);
    }
    if (s.contains("$ref")) return RefRule(s, path);
    if (s.contains("nullable") && s["nullable"] == true) {
      Json copy = s;
      copy.erase("nullable");
      ASSIGN_OR_RETURN(std::string inner, Visit(copy, hint, path));
      return Rule(hint, inner + " | " + UsePrimitive("null"));
    }
    if (s.contains("const")) {
      Json rest = s;
      rest.erase("const");
      ASSIGN_OR_RETURN(const bool ok, Satisfies(s["const"], rest, path));
      if (!ok) return MatchesNothing(path, "'const' is not a value the rest of the schema allows");
      return Rule(hint, JsonLiteral(s["const"]) + " " + UsePrimitive("space"));
    }
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) return Error(path, "'enum' must be a non-empty array");
      Json rest = s;
      rest.erase("enum");
      std::string body;
      for (const auto& v : s["enum"]) {
        ASSIGN_OR_RETURN(const bool ok, Satisfies(v, rest, path));
        if (ok) body += (body.empty() ? "" : " | ") + JsonLiteral(v);
      }
      if (body.empty()) return MatchesNothing(path, "no value of 'enum' is one the rest of the schema allows");
      return Rule(hint, "(" + body + ") " + UsePrimitive("space"));
    }
    for (const char* kw : {"anyOf", "oneOf"}) {
      if (s.contains(kw)) return UnionRule(s, kw, hint, path);
    }
    if (s.contains("allOf")) return AllOfRule(s, hint, path);
    return TypedRule(s, hint, path);
  }

  // Whether the value v satisfies the schema (an enum's or const's value against the keywords
  // beside it): the keywords of scalars, `enum`/`const`, and allOf/anyOf/oneOf/not/$ref over them.
  // A keyword that applies to v's kind and is not read here (an object's or array's structure,
  // `if`, a number's multipleOf other than integers') is refused, naming it.
  StatusOr<bool> Satisfies(const Json& v, const Json& schema, const std::string& path, int depth = 0) {
    if (depth > 16) return Error(path, "'enum' or 'const' beside keywords nested deeper than 16 is not supported");
    // (Values times keywords can be many: the conversion's time bound covers them too.)
    if (++visits_ % 64 == 0 && ThreadCpuClock::now() > deadline_) {
      return ResourceExhausted("converting the schema ran out of time at '{}'", path.empty() ? "/" : path);
    }
    if (schema.is_boolean()) return schema.get<bool>();
    if (!schema.is_object()) return Error(path, "a schema must be an object or a boolean");
    const Json& s = schema;
    auto refuse = [&](const std::string& k) -> StatusOr<bool> {
      return Error(path, "'enum' or 'const' beside '{}' is not supported", k);
    };
    const bool nullable = s.contains("nullable") && s["nullable"] == true;
    if (s.contains("type") && !(nullable && v.is_null()) && !OfType(v, s)) return false;
    if (s.contains("const") && s["const"] != v) return false;
    if (s.contains("enum") && s["enum"].is_array() && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) {
      return false;
    }
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      const Json& x = it.value();
      if (k == "$ref") {
        if (!x.is_string()) return Error(path, "'$ref' must be a string");
        ASSIGN_OR_RETURN(const Json* target, Resolve(x.get<std::string>(), path));
        ASSIGN_OR_RETURN(const bool ok, Satisfies(v, *target, path, depth + 1));
        if (!ok) return false;
      } else if (k == "allOf" || k == "anyOf" || k == "oneOf") {
        if (!x.is_array()) return Error(path, "'{}' must be an array", k);
        size_t n = 0;
        for (const Json& b : x) {
          ASSIGN_OR_RETURN(const bool ok, Satisfies(v, b, path, depth + 1));
          n += ok;
        }
        if (k == "allOf" ? n != x.size() : k == "anyOf" ? n == 0 : n != 1) return false;
      } else if (k == "not") {
        ASSIGN_OR_RETURN(const bool ok, Satisfies(v, x, path, depth + 1));
        if (ok) return false;
      } else if (k == "if" || k == "then" || k == "else" || k == "dependentSchemas") {
        return refuse(k);
      } else if (v.is_string() && (k == "minLength" || k == "maxLength")) {
        if (!x.is_number_unsigned() && !x.is_number_integer()) return Error(path, "'{}' must be a count", k);
        const int64_t n = CodePoints(v.get_ref<const std::string&>());
        if (k == "minLength" ? n < x.get<int64_t>() : n > x.get<int64_t>()) return false;
      } else if (v.is_string() && (k == "pattern" || k == "format" || k == kNotPatterns || k == kNotStrings)) {
        const std::string& text = v.get_ref<const std::string&>();
        if (k == "pattern") {
          if (!x.is_string()) return Error(path, "'pattern' must be a string");
          ASSIGN_OR_RETURN(const bool in, Matches(x.get<std::string>(), RegexMatch::kSearch, text, path));
          if (!in) return false;
        } else if (k == "format") {
          const std::optional<std::string> re = x.is_string() ? FormatRegex(x.get<std::string>()) : std::nullopt;
          if (!re) {
            if (x.is_string() && IsCheckedFormat(x.get<std::string>())) return refuse("format' '" + x.get<std::string>());
            continue;  // an annotation
          }
          ASSIGN_OR_RETURN(const bool in, Matches(*re, RegexMatch::kWhole, text, path));
          if (!in) return false;
        } else if (k == kNotStrings) {
          if (std::find(x.begin(), x.end(), v) != x.end()) return false;
        } else {
          for (const Json& p : x) {
            ASSIGN_OR_RETURN(const bool in, Matches(p.get<std::string>(), RegexMatch::kSearch, text, path));
            if (in) return false;
          }
        }
      } else if (v.is_number() && (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum")) {
        if (x.is_boolean()) continue;  // draft 4's form, read with minimum/maximum below
        if (!x.is_number()) return Error(path, "'{}' must be a number", k);
        const double a = v.get<double>(), b = x.get<double>();
        const bool draft4_exclusive = (k == "minimum" && s.value("exclusiveMinimum", Json(false)) == true) ||
                                      (k == "maximum" && s.value("exclusiveMaximum", Json(false)) == true);
        const bool below = k == "minimum" || k == "exclusiveMinimum";
        const bool strict = k[0] == 'e' || draft4_exclusive;
        if (below ? (strict ? a <= b : a < b) : (strict ? a >= b : a > b)) return false;
      } else if (v.is_number() && k == "multipleOf") {
        if (!(v.is_number_integer() || v.is_number_unsigned()) || !(x.is_number_integer() || x.is_number_unsigned()) ||
            x.get<int64_t>() <= 0) {
          return refuse("multipleOf");
        }
        if (v.get<int64_t>() % x.get<int64_t>() != 0) return false;
      } else if (v.is_object() && (k == "properties" || k == "required" || k == "additionalProperties" ||
                                   k == "patternProperties" || k == "minProperties" || k == "maxProperties" ||
                                   k == "propertyNames" || k == "dependencies" || k == "dependentRequired" ||
                                   k == kForbiddenKeys)) {
        ASSIGN_OR_RETURN(const bool ok, ObjectSatisfies(v, s, k, path, depth));
        if (!ok) return false;
      } else if (v.is_array() && (k == "items" || k == "prefixItems" || k == "minItems" || k == "maxItems" ||
                                  k == "uniqueItems" || k == "contains")) {
        ASSIGN_OR_RETURN(const bool ok, ArraySatisfies(v, s, k, path, depth));
        if (!ok) return false;
      }
    }
    return true;
  }

  // Satisfies for one keyword of an object value, as JSON Schema reads it (keys beyond
  // `properties` allowed unless additionalProperties says otherwise).
  StatusOr<bool> ObjectSatisfies(const Json& v, const Json& s, const std::string& k, const std::string& path, int depth) {
    const Json& x = s[k];
    if (k == "required" || k == kForbiddenKeys) {
      if (!x.is_array()) return Error(path, "'{}' must be an array", k);
      if (k == "required") return std::all_of(x.begin(), x.end(), [&](const Json& r) { return r.is_string() && v.contains(r.get<std::string>()); });
      for (const Json& set : x) {
        if (std::all_of(set.begin(), set.end(), [&](const Json& r) { return v.contains(r.get<std::string>()); })) return false;
      }
      return true;
    }
    if (k == "minProperties" || k == "maxProperties") {
      ASSIGN_OR_RETURN(const int64_t n, Count(s, k.c_str(), path, 0));
      return k == "minProperties" ? static_cast<int64_t>(v.size()) >= n : static_cast<int64_t>(v.size()) <= n;
    }
    if (k == "dependencies" || k == "dependentRequired") {
      if (!x.is_object()) return Error(path, "'{}' must be an object", k);
      for (auto d = x.begin(); d != x.end(); ++d) {
        if (!v.contains(d.key())) continue;
        if (d.value().is_array()) {
          for (const Json& r : d.value()) {
            if (!r.is_string() || !v.contains(r.get<std::string>())) return false;
          }
        } else {
          ASSIGN_OR_RETURN(const bool ok, Satisfies(v, d.value(), path, depth + 1));
          if (!ok) return false;
        }
      }
      return true;
    }
    if (k == "propertyNames") {
      for (auto m = v.begin(); m != v.end(); ++m) {
        ASSIGN_OR_RETURN(const bool ok, Satisfies(Json(m.key()), x, path, depth + 1));
        if (!ok) return false;
      }
      return true;
    }
    if (k == "patternProperties" && s.contains("additionalProperties")) return true;  // (read with it, below)
    // properties, patternProperties and additionalProperties: each member against the schemas
    // its key selects.
    const Json props = s.value("properties", Json::object());
    const Json pats = s.value("patternProperties", Json::object());
    if (!props.is_object() || !pats.is_object()) return Error(path, "'properties' and 'patternProperties' must be objects");
    for (auto m = v.begin(); m != v.end(); ++m) {
      bool matched = false;
      if (k == "properties" && props.contains(m.key())) {
        ASSIGN_OR_RETURN(const bool ok, Satisfies(m.value(), props[m.key()], path, depth + 1));
        if (!ok) return false;
      }
      if (k == "properties") continue;
      for (auto p = pats.begin(); p != pats.end(); ++p) {
        ASSIGN_OR_RETURN(const bool in, Matches(p.key(), RegexMatch::kSearch, m.key(), path));
        if (!in) continue;
        matched = true;
        ASSIGN_OR_RETURN(const bool ok, Satisfies(m.value(), p.value(), path, depth + 1));
        if (!ok) return false;
      }
      if (k == "additionalProperties" && !matched && !props.contains(m.key())) {
        ASSIGN_OR_RETURN(const bool ok, Satisfies(m.value(), x, path, depth + 1));
        if (!ok) return false;
      }
    }
    return true;
  }

  // Satisfies for one keyword of an array value.
  StatusOr<bool> ArraySatisfies(const Json& v, const Json& s, const std::string& k, const std::string& path, int depth) {
    const Json& x = s[k];
    if (k == "minItems" || k == "maxItems") {
      ASSIGN_OR_RETURN(const int64_t n, Count(s, k.c_str(), path, 0));
      return k == "minItems" ? static_cast<int64_t>(v.size()) >= n : static_cast<int64_t>(v.size()) <= n;
    }
    if (k == "uniqueItems") {
      if (x != true) return true;
      for (size_t i = 0; i < v.size(); ++i) {
        for (size_t j = i + 1; j < v.size(); ++j) {
          if (v[i] == v[j]) return false;
        }
      }
      return true;
    }
    if (k == "contains") {
      for (const Json& e : v) {
        ASSIGN_OR_RETURN(const bool ok, Satisfies(e, x, path, depth + 1));
        if (ok) return true;
      }
      return false;
    }
    // items and prefixItems (draft 4's items as an array: a prefix too, then additionalItems).
    const Json prefix = s.contains("prefixItems") ? s["prefixItems"] : s.contains("items") && s["items"].is_array() ? s["items"] : Json::array();
    const Json rest = s.contains("items") && !s["items"].is_array() ? s["items"] : s.contains("prefixItems") ? Json(true)
                                                                       : s.value("additionalItems", Json(true));
    if (k == "prefixItems" && s.contains("items")) return true;  // (read with items)
    for (size_t i = 0; i < v.size(); ++i) {
      ASSIGN_OR_RETURN(const bool ok, Satisfies(v[i], i < prefix.size() ? prefix[i] : rest, path, depth + 1));
      if (!ok) return false;
    }
    return true;
  }

  // Whether a regex matches a text (Satisfies'), its automaton built once per schema.
  StatusOr<bool> Matches(const std::string& regex, RegexMatch how, const std::string& text, const std::string& path) {
    const std::string key = (how == RegexMatch::kWhole ? "w" : "s") + regex;
    auto it = value_dfas_.find(key);
    if (it == value_dfas_.end()) {
      auto dfa = BuildDfa({{regex, how, std::nullopt}}, kMaxDfaStates);
      if (!dfa.ok()) return Error(path, "a pattern or format beside 'enum' or 'const': {}", dfa.status().message());
      it = value_dfas_.emplace(key, std::move(*dfa)).first;
    }
    return DfaAccepts(it->second, text) != 0;
  }

  // The type names of a set of kinds (Kinds' bits), for `type`.
  static Json TypeNames(unsigned kinds) {
    Json types = Json::array();
    for (const auto& [bits, name] : std::vector<std::pair<unsigned, const char*>>{
             {1, "string"}, {6, "number"}, {2, "integer"}, {8, "boolean"}, {16, "null"}, {32, "object"}, {64, "array"}}) {
      if ((kinds & bits) == bits && !(bits == 2 && (kinds & 4))) types.push_back(name);
    }
    return types.size() == 1 ? types[0] : types;
  }

  // `required` alone, or allOf/anyOf of such (annotations and properties that constrain nothing
  // beside them): the key sets an object must hold one of (the schema in disjunctive form).
  std::optional<std::vector<std::set<std::string>>> RequiredSets(const Json& schema, int depth = 0) {
    const Json& s = Deref(schema);
    if (!s.is_object() || depth > 8) return std::nullopt;
    std::vector<std::set<std::string>> out = {{}};
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (k == "description" || k == "title" || k == "$comment") continue;
      if (k == "properties" && it.value().is_object()) {
        for (auto p = it.value().begin(); p != it.value().end(); ++p) {
          if (!(p.value() == true || (p.value().is_object() && !HasConstraints(p.value())))) return std::nullopt;
        }
        continue;
      }
      std::vector<std::set<std::string>> part;  // this keyword's sets, then joined with the others'
      if (k == "required" && it.value().is_array()) {
        std::set<std::string> keys;
        for (const Json& r : it.value()) {
          if (!r.is_string()) return std::nullopt;
          keys.insert(r.get<std::string>());
        }
        part = {keys};
      } else if ((k == "allOf" || k == "anyOf") && it.value().is_array() && !it.value().empty()) {
        if (k == "allOf") part = {{}};
        for (const Json& b : it.value()) {
          auto sets = RequiredSets(b, depth + 1);
          if (!sets) return std::nullopt;
          if (k == "anyOf") {
            part.insert(part.end(), sets->begin(), sets->end());
          } else if (!JoinSets(*sets, &part)) {
            return std::nullopt;
          }
        }
      } else {
        return std::nullopt;
      }
      if (!JoinSets(part, &out)) return std::nullopt;
    }
    return out;
  }

  // Both: every set of `sets` with every set of *out, joined (false past 64 sets).
  static bool JoinSets(const std::vector<std::set<std::string>>& sets, std::vector<std::set<std::string>>* out) {
    std::vector<std::set<std::string>> joined;
    for (const auto& a : *out) {
      for (const auto& c : sets) {
        joined.push_back(a);
        joined.back().insert(c.begin(), c.end());
      }
    }
    *out = std::move(joined);
    return out->size() <= 64;
  }

  // The schema with its `not` folded into keywords a grammar has, for the forms that allow it:
  // not of a schema every value matches ({} or true): nothing; not of false: nothing added;
  // not not X: X as well; not {type}: the other types; not of `required` (or allOf/anyOf of
  // such): objects without key k, or never with every key of a set (kForbiddenKeys, which
  // ObjectRule reads); not {enum/const} of strings (and null): other strings (kNotStrings, which
  // StringRule reads), other values unchanged; not {pattern} (with type string or none): strings
  // that do not match it (kNotPatterns). A $ref is followed. Other forms are refused.
  StatusOr<Json> FoldNot(const Json& s, const std::string& path) {
    Json out = s;
    const Json n = Deref(out["not"]);
    out.erase("not");
    if (n.is_boolean()) {
      if (n.get<bool>()) return MatchesNothing(path, "'not' of a schema every value matches");
      return out;
    }
    if (!n.is_object()) return Error(path, "'not' must be a schema");
    std::set<std::string> keys;
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (it.key() != "description" && it.key() != "title" && it.key() != "$comment") keys.insert(it.key());
    }
    if (keys.empty()) return MatchesNothing(path, "'not' of a schema every value matches");
    if (keys == std::set<std::string>{"not"}) return Both(out, n["not"]);
    const unsigned kinds = Kinds(out);
    if (keys == std::set<std::string>{"type"}) {
      const unsigned left = kinds & ~TypeKinds(n["type"]);
      if (left == 0) return MatchesNothing(path, "'not' excludes every type the schema allows");
      if ((left & 6) == 4) return Error(path, "'not' leaving numbers that are not integers is not supported");
      out["type"] = TypeNames(left);
      return out;
    }
    const bool composed = out.contains("$ref") || out.contains("anyOf") || out.contains("oneOf") || out.contains("allOf");
    if (auto sets = RequiredSets(n)) {
      // A value that is no object passes `required` (it applies to objects only), so fails 'not'.
      if (!(kinds & 32)) return MatchesNothing(path, "'not' of 'required' leaves only objects");
      std::set<std::string> req;
      if (out.contains("required") && out["required"].is_array()) {
        for (const Json& r : out["required"]) {
          if (r.is_string()) req.insert(r.get<std::string>());
        }
      }
      Json forbidden = out.value(kForbiddenKeys, Json::array());
      for (const auto& set : *sets) {
        if (std::includes(req.begin(), req.end(), set.begin(), set.end())) {
          return MatchesNothing(path, "'not' forbids keys that are required");
        }
        if (set.size() > 1) {
          forbidden.push_back(Json(std::vector<std::string>(set.begin(), set.end())));
          continue;
        }
        const std::string k = *set.begin();
        // An object that took any key still does (but k): declaring k must not close it.
        if (!out.contains("properties") && !out.contains("additionalProperties")) out["additionalProperties"] = true;
        if (!out.contains("properties")) out["properties"] = Json::object();
        out["properties"][k] = false;
      }
      if (!forbidden.empty()) {
        if (composed) return Error(path, "'not' of several required keys beside '$ref', 'anyOf', 'oneOf' or 'allOf' is not supported");
        if (!out.contains("properties") && !out.contains("additionalProperties")) out["additionalProperties"] = true;
        out[kForbiddenKeys] = std::move(forbidden);
      }
      out["type"] = "object";
      return out;
    }
    const bool strings_only = keys == std::set<std::string>{"enum"} || keys == std::set<std::string>{"const"};
    const bool pattern = keys == std::set<std::string>{"pattern"} ||
                         (keys == std::set<std::string>{"pattern", "type"} && n["type"] == "string");
    if ((strings_only || pattern) && !composed && !out.contains("enum") && !out.contains("const")) {
      unsigned left = kinds;
      if (pattern) {
        if (!n["pattern"].is_string()) return Error(path, "'pattern' must be a string");
        // Without a type, a value that is no string passes the pattern, so fails 'not'.
        if (!n.contains("type")) left &= 1;
        Json list = out.value(kNotPatterns, Json::array());
        list.push_back(n["pattern"]);
        out[kNotPatterns] = std::move(list);
      } else {
        const Json values = n.contains("const") ? Json::array({n["const"]}) : n["enum"];
        if (!values.is_array()) return Error(path, "'enum' must be an array");
        Json list = out.value(kNotStrings, Json::array());
        for (const Json& v : values) {
          if (v.is_null()) {
            left &= ~16u;
          } else if (v.is_string()) {
            list.push_back(v);
          } else if (KindsOf(v) & kinds) {
            return Error(path, "'not' of an 'enum' or 'const' holding values other than strings and null is not supported");
          }
        }
        out[kNotStrings] = std::move(list);
      }
      if (left == 0) return MatchesNothing(path, "'not' leaves no value");
      if (left != kinds || !out.contains("type")) out["type"] = TypeNames(left);
      return out;
    }
    return Error(path, "'not' is not supported (beyond not of: true, false, {{}}, not, type, required keys, string enum or const, pattern)");
  }

  // A $ref's rule, named before its target is visited so that a recursive schema refers to itself.
  StatusOr<std::string> RefRule(const Json& s, const std::string& path) {
    if (!s["$ref"].is_string()) return Error(path, "'$ref' must be a string");
    const std::string ref = s["$ref"].get<std::string>();
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return it->second;
    ASSIGN_OR_RETURN(const Json* target, Resolve(ref, path));
    const std::string name = FreshName(ref.size() > 2 ? ref.substr(ref.rfind('/') + 1) : "root-ref");
    ref_rules_.emplace(ref, name);
    const size_t slot = rules_.size();
    rules_.emplace_back(name, "");
    ASSIGN_OR_RETURN(std::string body, Visit(*target, name, ref.substr(1)));
    rules_[slot].second = body;
    return name;
  }

  // anyOf / oneOf (kw): a rule per branch, each with the schema's other keys (siblings) merged in.
  StatusOr<std::string> UnionRule(const Json& s, const char* kw, const std::string& hint, const std::string& path) {
    if (!s[kw].is_array() || s[kw].empty()) return Error(path, "'{}' must be a non-empty array", kw);
    Json siblings = s;
    siblings.erase(kw);
    std::string body;
    std::vector<Json> branches;
    for (size_t i = 0; i < s[kw].size(); ++i) {
      const std::string bpath = fmt::format("{}/{}/{}", path, kw, i);
      const bool merged = s[kw][i].is_object() && HasConstraints(siblings);
      // A branch that is a $ref merges as its target: a $ref's rule would not see the siblings.
      Json alt = s[kw][i];
      std::string merged_ref;  // the ref and the siblings, when the branch is a $ref merged with them
      if (merged && alt.contains("$ref")) {
        for (auto it = alt.begin(); it != alt.end(); ++it) {
          if (it.key() != "$ref" && HasConstraints(Json{{it.key(), it.value()}})) {
            return Error(bpath, "a '$ref' beside other keywords, in a '{}' with keywords beside it, is not supported", kw);
          }
        }
        const Json& target = Deref(alt);
        if (&target == &alt || !target.is_object()) return Error(bpath, "'$ref' does not resolve to a schema object");
        merged_ref = alt["$ref"].dump() + "\x01" + siblings.dump();
        alt = target;
      }
      Json use = alt;
      if (merged) {
        // Both the siblings and the branch hold: their required keys add up, their properties
        // join (one property constrained by both is not taken apart).
        use = siblings;
        for (auto it = alt.begin(); it != alt.end(); ++it) {
          if (it.key() == "required" && it.value().is_array() && use.contains("required") && use["required"].is_array()) {
            for (const auto& k : it.value()) use["required"].push_back(k);
          } else if (it.key() == "properties" && it.value().is_object() && use.contains("properties") &&
                     use["properties"].is_object()) {
            for (auto p = it.value().begin(); p != it.value().end(); ++p) {
              Json& at = use["properties"][p.key()];
              at = at.is_null() ? p.value() : Conjoin(at, p.value());
            }
          } else if (it.key() == "patternProperties" && use.contains(it.key()) && use[it.key()] != it.value()) {
            return Error(bpath, "'patternProperties' both beside and inside '{}' are not supported", kw);
          } else {
            use[it.key()] = it.value();
          }
        }
      }
      // A branch no value satisfies (with the siblings) drops out of the union.
      Status closed = merged ? CloseMerged({&siblings, &alt}, bpath, use) : Status::Ok();
      if (closed.code() == StatusCode::kOutOfRange) continue;
      RETURN_IF_ERROR(closed);
      if (!merged_ref.empty()) {
        // One rule per ref and siblings, named before it is visited: a recursive schema (a ref
        // whose target holds the same union) refers to it again.
        auto it = merged_refs_.find(merged_ref);
        if (it == merged_refs_.end()) {
          const std::string name = FreshName(fmt::format("{}-{}-ref", hint, i));
          it = merged_refs_.emplace(merged_ref, name).first;
          const size_t slot = rules_.size();
          rules_.emplace_back(name, "");
          ASSIGN_OR_RETURN(std::string inner, Visit(use, name + "-body", bpath));
          rules_[slot].second = inner;
        }
        body += (body.empty() ? "" : " | ") + it->second;
        branches.push_back(std::move(use));
        continue;
      }
      auto e = Visit(use, fmt::format("{}-{}", hint, i), bpath);
      if (!e.ok() && e.status().code() == StatusCode::kOutOfRange) continue;
      if (!e.ok()) return e.status();
      body += (body.empty() ? "" : " | ") + *e;
      branches.push_back(std::move(use));
    }
    if (branches.empty()) return MatchesNothing(path, fmt::format("no '{}' branch matches a value", kw));
    // oneOf: exactly one branch. A grammar cannot exclude a value two branches both match, so
    // the branches must be disjoint, as far as can be shown (types, or consts and enums, at the
    // top or at a key both require).
    if (std::string(kw) == "oneOf") {
      for (size_t i = 0; i < branches.size(); ++i) {
        for (size_t j = i + 1; j < branches.size(); ++j) {
          if (!Disjoint(branches[i], branches[j])) {
            return Error(path, "'oneOf' branches {} and {} may both match a value (a grammar cannot exclude it); "
                               "use anyOf if either may", i, j);
          }
        }
      }
    }
    return Rule(hint, body);
  }

  // allOf: its parts merged into one schema (properties joined, required added up).
  StatusOr<std::string> AllOfRule(const Json& s, const std::string& hint, const std::string& path) {
    if (!s["allOf"].is_array() || s["allOf"].empty()) return Error(path, "'allOf' must be a non-empty array");
    Json merged = s;
    merged.erase("allOf");
    // The parts, flattened: an allOf inside a part adds its parts; an anyOf or oneOf inside one is
    // taken out, and becomes the merged schema's own (its branches then take the merged keywords;
    // one such union in all).
    std::vector<Json> flat;
    std::optional<std::pair<std::string, Json>> union_kw;
    for (const char* kw : {"anyOf", "oneOf"}) {
      if (merged.contains(kw)) union_kw = std::pair(std::string(kw), merged[kw]);
    }
    RETURN_IF_ERROR(FlattenAllOf(s["allOf"], path + "/allOf", 0, &flat, &union_kw));
    if (union_kw) merged[union_kw->first] = union_kw->second;
    std::vector<const Json*> parts = {&s};
    for (size_t i = 0; i < flat.size(); ++i) {
      const Json* part = &flat[i];
      const std::string ppath = fmt::format("{}/allOf/{}", path, i);
      parts.push_back(part);
      for (auto it = part->begin(); it != part->end(); ++it) {
        if (it.key() == "properties" && it.value().is_object()) {
          if (!merged.contains("properties")) merged["properties"] = Json::object();
          for (auto p = it.value().begin(); p != it.value().end(); ++p) {
            Json& at = merged["properties"][p.key()];
            at = at.is_null() ? p.value() : Conjoin(at, p.value());
          }
        } else if (it.key() == "additionalProperties") {
          continue;  // each part's own: CloseMerged
        } else if (it.key() == "required" && it.value().is_array()) {
          if (!merged.contains("required")) merged["required"] = Json::array();
          for (const auto& k : it.value()) merged["required"].push_back(k);
        } else if (merged.contains(it.key()) && merged[it.key()] != it.value() && it.key() != "description" &&
                   it.key() != "title") {
          return Error(ppath, "allOf parts disagree on '{}'", it.key());
        } else {
          merged[it.key()] = it.value();
        }
      }
    }
    RETURN_IF_ERROR(CloseMerged(parts, path, merged));
    return Visit(merged, hint, path);
  }

  // allOf's parts (items of `all`), each resolved through its $refs, into *flat: a part's own
  // allOf adds its parts in turn; its anyOf or oneOf goes to *union_kw (at most one in all).
  Status FlattenAllOf(const Json& all, const std::string& path, int depth, std::vector<Json>* flat,
                      std::optional<std::pair<std::string, Json>>* union_kw) {
    if (depth > 16) return Error(path, "'allOf' nests too deep");
    for (size_t i = 0; i < all.size(); ++i) {
      const Json* part = &all[i];
      const std::string ppath = fmt::format("{}/{}", path, i);
      for (int hops = 0; part->is_object() && part->contains("$ref") && hops < 32; ++hops) {
        if (!(*part)["$ref"].is_string()) return Error(ppath, "'$ref' must be a string");
        ASSIGN_OR_RETURN(part, Resolve((*part)["$ref"].get<std::string>(), ppath));
      }
      if (part->is_boolean() && part->get<bool>()) continue;
      if (!part->is_object()) return Error(ppath, "allOf parts must be objects");
      if (part->contains("$ref")) return Error(ppath, "'$ref' inside allOf is not supported");
      Json own = *part;
      if (own.contains("allOf")) {
        if (!own["allOf"].is_array() || own["allOf"].empty()) return Error(ppath, "'allOf' must be a non-empty array");
        RETURN_IF_ERROR(FlattenAllOf(own["allOf"], ppath + "/allOf", depth + 1, flat, union_kw));
        own.erase("allOf");
      }
      for (const char* kw : {"anyOf", "oneOf"}) {
        if (!own.contains(kw)) continue;
        if (*union_kw) return Error(ppath, "two unions ('anyOf'/'oneOf') under one allOf are not supported");
        *union_kw = std::pair(std::string(kw), own[kw]);
        own.erase(kw);
      }
      flat->push_back(std::move(own));
    }
    return Status::Ok();
  }

  // One schema both a and b hold for (a property two merged schemas constrain): either alone when
  // the other constrains nothing, their keywords side by side when no keyword is in both with
  // another value and none reads the others (properties, items, references, combinators), else
  // {"allOf": [a, b]}.
  static Json Conjoin(const Json& a, const Json& b) {
    if (a == b || !HasConstraints(b)) return a;
    if (!HasConstraints(a)) return b;
    static const std::set<std::string> kReading = {"properties", "additionalProperties", "patternProperties", "items",
                                                   "prefixItems", "$ref", "allOf", "anyOf", "oneOf", "required"};
    bool side_by_side = a.is_object() && b.is_object();
    for (auto it = b.begin(); side_by_side && it != b.end(); ++it) {
      if (it.key() == "description" || it.key() == "title") continue;
      if (a.contains(it.key()) ? a[it.key()] != it.value() : kReading.count(it.key()) > 0) side_by_side = false;
    }
    for (auto it = a.begin(); side_by_side && it != a.end(); ++it) {
      if (kReading.count(it.key()) > 0 && !b.contains(it.key())) side_by_side = false;
    }
    if (!side_by_side) return Json{{"allOf", Json::array({a, b})}};
    Json out = a;
    for (auto it = b.begin(); it != b.end(); ++it) {
      if (!out.contains(it.key())) out[it.key()] = it.value();
    }
    return out;
  }

  // Schemas merged into one (allOf's parts, or a union's siblings and branch) where one or more of
  // them has additionalProperties false: as a validator reads each of them apart, an instance may
  // only have the keys every closed one declares in its own properties. The merged schema keeps
  // just those properties and is closed; a key it requires that one of them forbids matches nothing.
  Status CloseMerged(const std::vector<const Json*>& parts, const std::string& path, Json& merged) {
    std::optional<std::set<std::string>> allowed;
    for (const Json* part : parts) {
      if (!part->is_object() || !part->contains("additionalProperties") || (*part)["additionalProperties"] != false) continue;
      std::set<std::string> keys;
      if (part->contains("properties") && (*part)["properties"].is_object()) {
        for (auto it = (*part)["properties"].begin(); it != (*part)["properties"].end(); ++it) keys.insert(it.key());
      }
      if (allowed) {
        std::set<std::string> both;
        for (const std::string& k : keys) {
          if (allowed->count(k)) both.insert(k);
        }
        allowed = std::move(both);
      } else {
        allowed = std::move(keys);
      }
    }
    if (!allowed) return Status::Ok();
    for (const Json* part : parts) {
      // Keys a pattern allows are not in `allowed`: rather than drop them, refuse.
      if (part->is_object() && part->contains("patternProperties")) {
        return Error(path, "'patternProperties' merged with additionalProperties false is not supported");
      }
    }
    merged["additionalProperties"] = false;
    if (merged.contains("properties") && merged["properties"].is_object()) {
      Json kept = Json::object();
      for (auto it = merged["properties"].begin(); it != merged["properties"].end(); ++it) {
        if (allowed->count(it.key())) kept[it.key()] = it.value();
      }
      merged["properties"] = std::move(kept);
    }
    if (merged.contains("required") && merged["required"].is_array()) {
      for (const Json& k : merged["required"]) {
        if (k.is_string() && !allowed->count(k.get<std::string>())) {
          return MatchesNothing(path, fmt::format("required property '{}' is forbidden by a part with "
                                                  "additionalProperties false", k.get<std::string>()));
        }
      }
    }
    return Status::Ok();
  }

  // By 'type' (or the keywords that imply one); a list of types is a union.
  StatusOr<std::string> TypedRule(const Json& s, const std::string& hint, const std::string& path) {
    std::string type;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_array()) {
        if (t.empty()) return Error(path, "'type' must not be an empty list");
        std::string body;
        for (const auto& one : t) {
          if (!one.is_string()) return Error(path, "'type' entries must be strings");
          Json copy = s;
          copy["type"] = one;
          ASSIGN_OR_RETURN(std::string e, Visit(copy, hint + "-" + one.get<std::string>(), path));
          body += (body.empty() ? "" : " | ") + e;
        }
        return Rule(hint, body);
      }
      if (!t.is_string()) return Error(path, "'type' must be a string or a list of strings");
      type = t.get<std::string>();
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required") ||
               s.contains("patternProperties")) {
      type = "object";
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems") ||
               s.contains("contains")) {
      type = "array";
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
      type = "string";
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum") || s.contains("multipleOf")) {
      // Number keywords constrain numbers only: any other value passes them.
      ASSIGN_OR_RETURN(const std::string number, NumberRule(s, hint + "-number", path));
      std::string body;
      for (const char* other : {"object", "array", "string", "boolean", "null"}) body += UsePrimitive(other) + " | ";
      return Rule(hint, body + number);
    } else {
      return UsePrimitive("value");
    }
    if (type == "object") return ObjectRule(s, hint, path);
    if (type == "array") return ArrayRule(s, hint, path);
    if (type == "string") return StringRule(s, hint, path);
    if (type == "integer") return IntegerRule(s, hint, path);
    if (type == "number") return NumberRule(s, hint, path);
    if (type == "boolean") return UsePrimitive("boolean");
    if (type == "null") return UsePrimitive("null");
    return Error(path, "unknown type '{}'", type);
  }

  // The schema behind a chain of local $refs (itself when it has none, or one does not resolve).
  const Json& Deref(const Json& s) {
    const Json* at = &s;
    for (int hops = 0; at->is_object() && at->contains("$ref") && (*at)["$ref"].is_string() && hops < 16; ++hops) {
      auto next = Resolve((*at)["$ref"].get<std::string>(), "");
      if (!next.ok()) break;
      at = *next;
    }
    return *at;
  }

  // The kinds of JSON value a schema lets through as the grammar writes it (a bit each: string,
  // integer, other number, boolean, null, object, array).
  static unsigned KindsOf(const Json& v) {
    if (v.is_string()) return 1;
    if (v.is_number_integer() || v.is_number_unsigned() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())) return 2;
    if (v.is_number()) return 4;
    if (v.is_boolean()) return 8;
    if (v.is_null()) return 16;
    if (v.is_object()) return 32;
    return 64;
  }
  // The kinds a "type" (a name or a list of names) allows; a name not known allows any.
  static unsigned TypeKinds(const Json& type) {
    auto of = [](const Json& n) -> unsigned {
      if (!n.is_string()) return 127;
      const std::string k = n.get<std::string>();
      return k == "string" ? 1 : k == "integer" ? 2 : k == "number" ? 6 : k == "boolean" ? 8 : k == "null" ? 16
             : k == "object" ? 32 : k == "array" ? 64 : 127;
    };
    if (!type.is_array()) return of(type);
    unsigned t = 0;
    for (const auto& n : type) t |= of(n);
    return t;
  }
  unsigned Kinds(const Json& schema) {
    const Json& s = Deref(schema);
    if (!s.is_object()) return s.is_boolean() && !s.get<bool>() ? 0 : 127;
    unsigned out = 127;
    if (s.contains("type")) {
      out &= TypeKinds(s["type"]);
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties") ||
               s.contains("patternProperties")) {
      out &= 32;  // written as an object (ObjectRule)
    } else if (s.contains("items") || s.contains("prefixItems")) {
      out &= 64;
    }
    if (const auto vals = Values(s)) {
      unsigned v = 0;
      for (const auto& x : *vals) v |= KindsOf(x);
      out &= v;
    }
    if (s.contains("nullable") && s["nullable"] == true) out |= 16;
    return out;
  }
  // The values a schema allows when it lists them (const or enum, or branches that all do).
  std::optional<Json> Values(const Json& schema, int depth = 0) {
    const Json& s = Deref(schema);
    if (!s.is_object() || depth > 8) return std::nullopt;
    Json out = Json::array();
    if (s.contains("const")) {
      out.push_back(s["const"]);
    } else if (s.contains("enum") && s["enum"].is_array()) {
      out = s["enum"];
    } else {
      const char* kw = s.contains("anyOf") ? "anyOf" : s.contains("oneOf") ? "oneOf" : nullptr;
      if (kw == nullptr || !s[kw].is_array()) return std::nullopt;
      for (const auto& b : s[kw]) {
        const auto v = Values(b, depth + 1);
        if (!v) return std::nullopt;
        for (const auto& x : *v) out.push_back(x);
      }
    }
    return out;
  }
  static bool ValuesDisjoint(const Json& a, const Json& b) {
    for (const auto& x : a) {
      for (const auto& y : b) {
        if (x == y) return false;
      }
    }
    return true;
  }
  bool Disjoint(const Json& a_in, const Json& b_in) {
    const Json& a = Deref(a_in);
    const Json& b = Deref(b_in);
    if ((Kinds(a) & Kinds(b)) == 0) return true;
    if (!a.is_object() || !b.is_object()) return false;
    if (const auto va = Values(a)) {
      const auto vb = Values(b);
      if (vb && ValuesDisjoint(*va, *vb)) return true;
    }
    // Objects one requires a key of that the other does not allow.
    auto forbids = [](const Json& o, const Json& key) {
      return o.contains("additionalProperties") && o["additionalProperties"] == false &&
             !(o.contains("properties") && o["properties"].is_object() && o["properties"].contains(key.get<std::string>()));
    };
    if ((Kinds(a) | Kinds(b)) == 32) {
      for (const auto* pair : {&a, &b}) {
        const Json& x = *pair;
        const Json& y = pair == &a ? b : a;
        if (!x.contains("required") || !x["required"].is_array()) continue;
        for (const auto& k : x["required"]) {
          if (k.is_string() && forbids(y, k)) return true;
        }
      }
    }
    // Objects told apart by a key both require, whose allowed values do not meet.
    if ((Kinds(a) | Kinds(b)) != 32 || !a.contains("required") || !b.contains("required") || !a.contains("properties") ||
        !b.contains("properties") || !a["required"].is_array() || !b["required"].is_array()) {
      return false;
    }
    for (const auto& k : a["required"]) {
      if (!k.is_string() || !a["properties"].contains(k.get<std::string>())) continue;
      bool in_b = false;
      for (const auto& k2 : b["required"]) in_b = in_b || k2 == k;
      if (!in_b || !b["properties"].contains(k.get<std::string>())) continue;
      const Json& pa = Deref(a["properties"][k.get<std::string>()]);
      const Json& pb = Deref(b["properties"][k.get<std::string>()]);
      if (!pa.is_object() || !pb.is_object()) continue;
      if ((Kinds(pa) & Kinds(pb)) == 0) return true;
      const auto xa = Values(pa);
      const auto xb = xa ? Values(pb) : std::nullopt;
      if (xb && ValuesDisjoint(*xa, *xb)) return true;
    }
    return false;
  }

  // Whether v is of the schema's "type" (no type: any).
  static bool OfType(const Json& v, const Json& s) {
    return !s.contains("type") || (KindsOf(v) & TypeKinds(s["type"])) != 0;
  }

  static bool HasConstraints(const Json& s) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (k != "description" && k != "title" && k != "$comment" && k != "examples" && k != "default" && k != "$defs" &&
          k != "definitions" && k != "$schema" && k != "$id") {
        return true;
      }
    }
    return false;
  }

  // patternProperties: each pattern's schema, and an automaton reading the patterns (language i:
  // pattern i, as JSON Schema's search) and the names the object declares or requires (the last
  // language). A key's signature is the set of patterns it matches.
  struct PatternKeys {
    std::vector<Json> schemas;
    Dfa dfa;
    uint32_t names_bit = 0;

    uint32_t Signature(const std::string& key) const { return DfaAccepts(dfa, key) & (names_bit - 1); }
    // `own` and the schema of every pattern in `sig`.
    Json With(Json own, uint32_t sig) const {
      for (size_t i = 0; i < schemas.size(); ++i) {
        if (sig >> i & 1) own = Both(own, schemas[i]);
      }
      return own;
    }
  };

  static Json Both(const Json& a, const Json& b) {
    if (a.is_boolean() || b.is_boolean()) {
      if (a == false || b == false) return false;
      return a.is_boolean() ? b : a;
    }
    return Conjoin(a, b);
  }

  StatusOr<std::optional<PatternKeys>> ReadPatternKeys(const Json& s, const std::set<std::string>& names,
                                                       bool others_take_any, const std::string& path) {
    if (!s.contains("patternProperties")) return std::optional<PatternKeys>();
    const Json& pp = s["patternProperties"];
    if (!pp.is_object()) return Error(path, "'patternProperties' must be an object");
    if (pp.size() > 31) return Error(path, "more than 31 'patternProperties' are not supported");
    PatternKeys pk;
    std::vector<DfaLanguage> langs;
    bool all_trivial = true;
    for (auto it = pp.begin(); it != pp.end(); ++it) {
      if (!it.value().is_object() && !it.value().is_boolean()) return Error(path, "a pattern's schema must be a schema");
      all_trivial = all_trivial && (it.value() == true || (it.value().is_object() && !HasConstraints(it.value())));
      pk.schemas.push_back(it.value());
      langs.push_back(DfaLanguage{it.key(), RegexMatch::kSearch, std::nullopt});
    }
    // Patterns whose keys may hold anything, where every other key may too, change nothing.
    if (all_trivial && others_take_any) return std::optional<PatternKeys>();
    langs.push_back(DfaLanguage{"", RegexMatch::kWhole, std::vector<std::string>(names.begin(), names.end())});
    pk.names_bit = uint32_t{1} << pk.schemas.size();
    auto dfa = BuildDfa(langs, kMaxDfaStates);
    if (!dfa.ok()) return Error(path + "/patternProperties", "{}", dfa.status().message());
    pk.dfa = std::move(*dfa);
    return std::optional<PatternKeys>(std::move(pk));
  }

  // One key-value pair of an object beyond its declared and required names: with patterns, per
  // signature the keys that have it and the value its patterns (or, for none, `others`) allow;
  // without, any key but those names, or the keys of `key_rule` where propertyNames gives them
  // ("" there: none). "" when no such pair can occur.
  StatusOr<std::string> ExtraPair(const std::optional<PatternKeys>& pk, const std::set<std::string>& names,
                                  const std::optional<std::string>& others, const std::string& hint,
                                  const std::string& path, const std::optional<std::string>& key_rule = std::nullopt) {
    const std::string sp = UsePrimitive("space");
    if (!pk) {
      if (!others || (key_rule && key_rule->empty())) return std::string();  // (no key can come)
      // A declared name cannot come again through here (with any value): its key is excluded.
      const std::string key = key_rule ? *key_rule : names.empty() ? UsePrimitive("string") : KeyExcept(names, hint);
      return Rule(hint + "-additional-kv", key + " \":\" " + sp + " " + *others);
    }
    std::set<uint32_t> sigs = {0};
    for (const Dfa::State& q : pk->dfa.states) {
      if (!(q.accepts & pk->names_bit)) sigs.insert(q.accepts);
    }
    std::string body;
    for (uint32_t sig : sigs) {
      std::string value;
      if (sig == 0) {
        if (!others) continue;
        value = *others;
      } else {
        auto v = Visit(pk->With(true, sig), fmt::format("{}-pattern-{}", hint, sig), path + "/patternProperties");
        if (!v.ok() && v.status().code() == StatusCode::kOutOfRange) continue;
        ASSIGN_OR_RETURN(value, std::move(v));
      }
      auto key = DfaString(pk->dfa, [&](uint32_t a) { return a == sig; }, 0, -1, fmt::format("{}-key-{}", hint, sig), path);
      if (!key.ok() && key.status().code() == StatusCode::kOutOfRange) continue;
      ASSIGN_OR_RETURN(std::string k, std::move(key));
      body += (body.empty() ? "" : " | ") + k + " \":\" " + sp + " " + value;
    }
    return body.empty() ? std::string() : Rule(hint + "-additional-kv", body);
  }

  StatusOr<std::string> ObjectRule(const Json& s, const std::string& hint, const std::string& path) {
    const std::string sp = UsePrimitive("space");
    std::vector<std::string> kvs, kv_names;
    std::vector<bool> required;
    std::set<std::string> req;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Error(path, "'required' must be an array of strings");
      for (const auto& k : s["required"]) {
        if (!k.is_string()) return Error(path, "'required' must be an array of strings");
        req.insert(k.get<std::string>());
      }
    }
    if (s.contains("properties") && !s["properties"].is_object()) return Error(path, "'properties' must be an object");
    std::set<std::string> declared, names = req;
    if (s.contains("properties")) {
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) names.insert(it.key());
    }
    // Keys matching no pattern: additionalProperties true or a schema; absent means none when
    // properties are declared and objects are closed (strict), any otherwise.
    const bool has_ap = s.contains("additionalProperties");
    const bool extra_allowed = (has_ap && !(s["additionalProperties"].is_boolean() && !s["additionalProperties"].get<bool>())) ||
                               (!has_ap && (objects_ == ObjectKeys::kOpen || !s.contains("properties")));
    const bool any_extra = extra_allowed && (!has_ap || s["additionalProperties"] == true ||
                                             (s["additionalProperties"].is_object() && !HasConstraints(s["additionalProperties"])));
    ASSIGN_OR_RETURN(std::optional<PatternKeys> pk, ReadPatternKeys(s, names, any_extra, path));
    ASSIGN_OR_RETURN(const std::optional<KeyNames> key_names, ReadPropertyNames(s, path));
    if (key_names && pk) return Error(path, "'propertyNames' together with 'patternProperties' is not supported");
    for (const auto& k : req) {
      if (key_names && !key_names->Allows(k)) return MatchesNothing(path, fmt::format("required '{}' is not a name 'propertyNames' allows", k));
    }
    if (s.contains("properties")) {
      const Json& props = s["properties"];
      for (auto it = props.begin(); it != props.end(); ++it) {
        if (key_names && !key_names->Allows(it.key())) continue;  // a name it refuses never comes
        declared.insert(it.key());
        const std::string ppath = path + "/properties/" + it.key();
        const Json own = pk ? pk->With(it.value(), pk->Signature(it.key())) : it.value();
        auto visited = Visit(own, hint + "-" + it.key(), ppath);
        // An optional property no value can satisfy cannot be present (nor come as an extra key).
        if (!visited.ok() && visited.status().code() == StatusCode::kOutOfRange && !req.count(it.key())) continue;
        ASSIGN_OR_RETURN(std::string value, std::move(visited));
        kvs.push_back(Rule(hint + "-" + it.key() + "-kv",
                           JsonLiteral(Json(it.key())) + " " + sp + " \":\" " + sp + " " + value));
        kv_names.push_back(it.key());
        required.push_back(req.count(it.key()) > 0);
      }
    }
    std::optional<std::string> others;  // the value of a key matching no pattern, when allowed
    if (extra_allowed) {
      others = UsePrimitive("value");
      if (has_ap && !s["additionalProperties"].is_boolean()) {
        ASSIGN_OR_RETURN(others, Visit(s["additionalProperties"], hint + "-additional", path + "/additionalProperties"));
      }
    }
    // A required property the schema does not declare: present, with what its patterns, or
    // additional keys, take.
    for (const auto& k : req) {
      if (declared.count(k)) continue;
      const uint32_t sig = pk ? pk->Signature(k) : 0;
      std::string value;
      if (sig != 0) {
        ASSIGN_OR_RETURN(value, Visit(pk->With(true, sig), hint + "-" + k, path + "/patternProperties"));
      } else if (others) {
        value = *others;
      } else {
        return Error(path, "required property '{}' is not in 'properties' and no other key is allowed: no object matches", k);
      }
      declared.insert(k);
      kvs.push_back(Rule(hint + "-" + k + "-kv", JsonLiteral(Json(k)) + " " + sp + " \":\" " + sp + " " + value));
      kv_names.push_back(k);
      required.push_back(true);
    }
    std::optional<std::string> key_rule;  // the extra keys' rule where propertyNames says what they are
    if (key_names && others) {
      ASSIGN_OR_RETURN(std::string k, key_names->KeyRule(*this, declared, hint + "-name", path));
      key_rule = std::move(k);
    }
    ASSIGN_OR_RETURN(const std::string extra, ExtraPair(pk, declared, others, hint, path, key_rule));
    ASSIGN_OR_RETURN(const std::vector<uint64_t> needs, Dependencies(s, kv_names, !extra.empty(), path));
    ASSIGN_OR_RETURN(const std::vector<uint64_t> forbidden, ForbiddenSets(s, kv_names, !extra.empty(), path));
    if (s.contains("minProperties") || s.contains("maxProperties") || !needs.empty() || !forbidden.empty()) {
      return CountedMembers(s, kvs, required, needs, forbidden, extra, hint, path);
    }
    // after[i]: properties i.. once one has been written (each needs a comma); first[i]: the
    // same before any has been.
    const size_t n = kvs.size();
    std::string after = extra.empty() ? "" : "(\",\" " + sp + " " + extra + ")*";
    std::string first = extra.empty() ? "" : "(" + extra + " (\",\" " + sp + " " + extra + ")*)?";
    for (size_t i = n; i-- > 0;) {
      const std::string a = after.empty() ? "" : " " + after;
      const std::string with = "\",\" " + sp + " " + kvs[i] + a;
      std::string new_after = required[i] ? with : "(" + with + (after.empty() ? ")?" : " | " + after + ")");
      std::string new_first = required[i] ? kvs[i] + a : "(" + kvs[i] + a + (first.empty() ? ")?" : " | " + first + ")");
      after = Rule(fmt::format("{}-after-{}", hint, i), new_after);
      first = Rule(fmt::format("{}-from-{}", hint, i), new_first);
    }
    return Rule(hint, "\"{\" " + sp + (first.empty() ? "" : " " + first) + " \"}\" " + sp);
  }

  // dependentRequired (and draft 4's `dependencies` with arrays): per member (by its place among
  // `names`), the members that must be present when it is; empty when there are none. A schema
  // form is refused; so is a key outside `names` where other keys may come (a member that needs a
  // key no object can have is never present).
  StatusOr<std::vector<uint64_t>> Dependencies(const Json& s, const std::vector<std::string>& names, bool extra_keys,
                                               const std::string& path) {
    std::vector<uint64_t> needs;
    for (const char* kw : {"dependencies", "dependentRequired"}) {
      if (!s.contains(kw)) continue;
      if (!s[kw].is_object()) return Error(path, "'{}' must be an object", kw);
      if (names.size() > 64) return Error(path, "'{}' on an object of more than 64 properties is not supported", kw);
      needs.resize(names.size(), 0);
      auto index = [&](const std::string& k) -> int {
        auto it = std::find(names.begin(), names.end(), k);
        return it == names.end() ? -1 : static_cast<int>(it - names.begin());
      };
      for (auto it = s[kw].begin(); it != s[kw].end(); ++it) {
        if (!it.value().is_array()) return Error(path, "'{}' with a schema (not a list of keys) is not supported", kw);
        const int a = index(it.key());
        for (const Json& b : it.value()) {
          if (!b.is_string()) return Error(path, "'{}' lists must hold strings", kw);
          const int bi = index(b.get<std::string>());
          if ((a < 0 || bi < 0) && extra_keys) {
            return Error(path, "'{}' naming a key the object does not declare, where other keys may come, is not supported", kw);
          }
          if (a < 0 || a == bi) continue;  // a key no object has needs nothing
          needs[static_cast<size_t>(a)] |= bi < 0 ? (uint64_t{1} << a) : (uint64_t{1} << bi);  // needs itself: never present
        }
      }
    }
    return needs;
  }

  // The key sets 'not' forbids together (kForbiddenKeys, FoldNot's), as masks over `names`. A set
  // with a key no object can have never comes whole; one with a key outside `names` where other
  // keys may come is refused (extra keys are not tracked).
  StatusOr<std::vector<uint64_t>> ForbiddenSets(const Json& s, const std::vector<std::string>& names, bool extra_keys,
                                                const std::string& path) {
    std::vector<uint64_t> out;
    if (!s.contains(kForbiddenKeys)) return out;
    if (names.size() > 64) return Error(path, "'not' of several required keys on an object of more than 64 properties is not supported");
    for (const Json& set : s[kForbiddenKeys]) {
      uint64_t mask = 0;
      bool possible = true;
      for (const Json& k : set) {
        auto it = std::find(names.begin(), names.end(), k.get<std::string>());
        if (it != names.end()) {
          mask |= uint64_t{1} << (it - names.begin());
        } else if (extra_keys) {
          return Error(path, "'not' of required keys the object does not declare, where other keys may come, is not supported");
        } else {
          possible = false;
        }
      }
      if (possible) out.push_back(mask);
    }
    return out;
  }

  // propertyNames: a string schema every key must satisfy (pattern, lengths, a format with a
  // regex, enum/const). Allows checks a declared name; KeyRule writes the rule of the keys other
  // than `declared` that it allows ("" when none is).
  struct KeyNames {
    Json schema;
    std::optional<Dfa> dfa;  // pattern (bit 0) and format (bit 1), when either is given
    uint32_t all = 0;
    int64_t min_len = 0, max_len = -1;

    bool Allows(const std::string& k) const {
      if (schema.contains("enum") && std::find(schema["enum"].begin(), schema["enum"].end(), Json(k)) == schema["enum"].end()) return false;
      if (schema.contains("const") && schema["const"] != Json(k)) return false;
      const int64_t n = CodePoints(k);
      if (n < min_len || (max_len >= 0 && n > max_len)) return false;
      return !dfa || (DfaAccepts(*dfa, k) & all) == all;
    }

    StatusOr<std::string> KeyRule(Converter& c, const std::set<std::string>& declared, const std::string& hint,
                                  const std::string& path) const {
      if (schema.contains("enum") || schema.contains("const")) {
        std::vector<std::string> alts;
        const Json values = schema.contains("const") ? Json::array({schema["const"]}) : schema["enum"];
        for (const Json& v : values) {
          if (v.is_string() && !declared.count(v.get<std::string>()) && Allows(v.get<std::string>())) alts.push_back(JsonLiteral(v));
        }
        if (alts.empty()) return std::string();
        return c.Rule(hint, JoinAlternatives(alts) + " " + c.UsePrimitive("space"));
      }
      // The allowed strings, but not the declared names (a language of their own).
      std::vector<DfaLanguage> languages;
      std::string p = schema.contains("pattern") ? schema["pattern"].get<std::string>() : "";
      languages.push_back({p.empty() ? "[\\s\\S]*" : p, p.empty() ? RegexMatch::kWhole : RegexMatch::kSearch, std::nullopt});
      if (schema.contains("format")) languages.push_back({*FormatRegex(schema["format"].get<std::string>()), RegexMatch::kWhole, std::nullopt});
      const uint32_t want = (1u << languages.size()) - 1, names_bit = 1u << languages.size();
      languages.push_back({"", RegexMatch::kWhole, std::vector<std::string>(declared.begin(), declared.end())});
      auto both = BuildDfa(languages, kMaxDfaStates);
      if (!both.ok()) return c.Error(path, "'propertyNames': {}", both.status().message());
      auto rule = c.DfaString(*both, [&](uint32_t a) { return (a & want) == want && !(a & names_bit); }, min_len, max_len, hint, path);
      if (!rule.ok() && rule.status().code() == StatusCode::kOutOfRange) return std::string();
      return rule;
    }
  };

  StatusOr<std::optional<KeyNames>> ReadPropertyNames(const Json& s, const std::string& path) {
    if (!s.contains("propertyNames") || Deref(s["propertyNames"]) == true) return std::optional<KeyNames>();
    const Json& pn = Deref(s["propertyNames"]);  // (through its $refs)
    const std::string at = path + "/propertyNames";
    KeyNames k;
    if (pn == false) {  // no key at all
      k.schema = {{"enum", Json::array()}};
      return std::optional<KeyNames>(std::move(k));
    }
    if (!pn.is_object()) return Error(at, "'propertyNames' must be a schema");
    for (auto it = pn.begin(); it != pn.end(); ++it) {
      static const std::set<std::string> kKnown = {"type", "pattern", "minLength", "maxLength", "format", "enum", "const",
                                                   "description", "title", "$comment", "examples"};
      if (!kKnown.count(it.key())) return Error(at, "'{}' in 'propertyNames' is not supported", it.key());
    }
    if (pn.contains("type") && pn["type"] != "string") return Error(at, "'propertyNames' must describe strings");
    if (pn.contains("pattern") && !pn["pattern"].is_string()) return Error(at, "'pattern' must be a string");
    if (pn.contains("enum") && !pn["enum"].is_array()) return Error(at, "'enum' must be an array");
    if (pn.contains("format") && !(pn["format"].is_string() && (FormatRegex(pn["format"].get<std::string>()) ||
                                                                !IsCheckedFormat(pn["format"].get<std::string>())))) {
      return Error(at, "this 'format' in 'propertyNames' is not supported");
    }
    k.schema = pn;
    if (pn.contains("format") && !FormatRegex(pn["format"].get<std::string>())) k.schema.erase("format");  // an annotation
    ASSIGN_OR_RETURN(k.min_len, Count(pn, "minLength", at, 0));
    ASSIGN_OR_RETURN(k.max_len, Count(pn, "maxLength", at, -1));
    std::vector<DfaLanguage> languages;
    if (k.schema.contains("pattern")) languages.push_back({k.schema["pattern"].get<std::string>(), RegexMatch::kSearch, std::nullopt});
    if (k.schema.contains("format")) languages.push_back({*FormatRegex(k.schema["format"].get<std::string>()), RegexMatch::kWhole, std::nullopt});
    if (!languages.empty()) {
      auto dfa = BuildDfa(languages, kMaxDfaStates);
      if (!dfa.ok()) return Error(at, "{}", dfa.status().message());
      k.dfa = std::move(*dfa);
      k.all = (1u << languages.size()) - 1;
    }
    return std::optional<KeyNames>(std::move(k));
  }

  // An object's members (ObjectRule's: kvs in order, then any number of `extra` pairs) with
  // minProperties/maxProperties: the members written so far counted (up to the larger bound; past
  // maxProperties nothing more), a rule per place and count, ending only at a count within the
  // bounds. Places and counts that cannot reach such an end are left out.
  StatusOr<std::string> CountedMembers(const Json& s, const std::vector<std::string>& kvs, const std::vector<bool>& required,
                                       const std::vector<uint64_t>& needs, const std::vector<uint64_t>& forbidden,
                                       const std::string& extra, const std::string& hint, const std::string& path) {
    ASSIGN_OR_RETURN(const int64_t min_p, Count(s, "minProperties", path, 0));
    ASSIGN_OR_RETURN(const int64_t max_p, Count(s, "maxProperties", path, -1));
    if (max_p >= 0 && max_p < min_p) return MatchesNothing(path, "'maxProperties' is below 'minProperties'");
    const int64_t n = static_cast<int64_t>(kvs.size());
    const int64_t cap = max_p >= 0 ? max_p : min_p;  // counts past it are the same (or not allowed)
    if ((n + 2) * (cap + 1) > 4000) return Error(path, "'minProperties'/'maxProperties' need more than 4,000 grammar rules here");
    const std::string sp = UsePrimitive("space");
    auto next = [&](int64_t c) -> std::optional<int64_t> {
      if (max_p >= 0) return c < max_p ? std::optional<int64_t>(c + 1) : std::nullopt;
      return std::min(c + 1, cap);
    };
    // Dependencies: writing member i makes the later ones it needs required (`due`); leaving member
    // b out rules out the later ones that need it (`barred`).
    auto bit = [](int64_t i) { return uint64_t{1} << i; };
    std::vector<uint64_t> bars(static_cast<size_t>(n), 0);
    for (int64_t a = 0; a < static_cast<int64_t>(needs.size()); ++a) {
      for (int64_t b = 0; b < n; ++b) {
        if ((needs[static_cast<size_t>(a)] & bit(b)) && a > b) bars[static_cast<size_t>(b)] |= bit(a);
        if ((needs[static_cast<size_t>(a)] & bit(b)) && a == b) bars[static_cast<size_t>(b)] |= bit(a);  // needs itself
      }
    }
    auto later = [&](int64_t i) { return i < static_cast<int64_t>(needs.size()) ? needs[static_cast<size_t>(i)] & ~((bit(i) << 1) - 1) : 0; };
    // Forbidden sets ('not'): which of their members were written (`seen`); a member that would
    // complete one is left out.
    uint64_t watched = 0;
    for (uint64_t f : forbidden) watched |= f;
    auto completes = [&](uint64_t seen) {
      return std::any_of(forbidden.begin(), forbidden.end(), [&](uint64_t f) { return (seen & f) == f; });
    };
    // member(i, c, first, due, barred, seen): members i.. (i == n: the extra pairs) with c written,
    // `first` when none has been (no comma before the next).
    std::map<std::tuple<int64_t, int64_t, bool, uint64_t, uint64_t, uint64_t>, std::optional<std::string>> memo;
    std::function<std::optional<std::string>(int64_t, int64_t, bool, uint64_t, uint64_t, uint64_t)> member =
        [&](int64_t i, int64_t c, bool first, uint64_t due, uint64_t barred, uint64_t seen) -> std::optional<std::string> {
      const auto key = std::make_tuple(i, c, first, due, barred, seen);
      if (auto it = memo.find(key); it != memo.end()) return it->second;
      if (memo.size() > 4000) return std::nullopt;  // (reported below)
      memo[key] = std::nullopt;  // (a loop back to itself, through the extra pairs, is found below)
      const std::string comma = first ? "" : "\",\" " + sp + " ";
      std::vector<std::string> alts;
      bool may_end = false;
      const std::string name = FreshName(fmt::format("{}-m{}-{}{}", hint, i, c, first ? "f" : ""));
      if (i < n) {
        const bool needs_self = i < static_cast<int64_t>(needs.size()) && (needs[static_cast<size_t>(i)] & bit(i));
        const uint64_t seen2 = seen | (bit(i) & watched);
        if (auto c2 = next(c); c2 && !(barred & bit(i)) && !needs_self && !completes(seen2)) {
          if (auto rest = member(i + 1, *c2, false, (due | later(i)) & ~bit(i), barred, seen2)) {
            alts.push_back(comma + kvs[static_cast<size_t>(i)] + " " + *rest);
          }
        }
        if (!required[static_cast<size_t>(i)] && !(due & bit(i))) {
          if (auto rest = member(i + 1, c, first, due, barred | bars[static_cast<size_t>(i)], seen)) alts.push_back(*rest);
        }
      } else {
        may_end = c >= min_p;
        if (!extra.empty()) {
          if (auto c2 = next(c)) {
            const std::string rest = *c2 == c && !first ? name : member(n, *c2, false, 0, 0, 0).value_or("");
            if (!rest.empty() || (*c2 == c && !first)) alts.push_back(comma + extra + " " + rest);
          }
        }
      }
      if (alts.empty() && !may_end) return memo[key] = std::nullopt;
      std::string body = alts.empty() ? "\"\"" : alts.size() == 1 && !may_end ? alts[0] : "(" + fmt::format("{}", fmt::join(alts, " | ")) + ")";
      if (!alts.empty() && may_end) body += "?";
      rules_.emplace_back(name, body);
      return memo[key] = name;
    };
    const auto members = member(0, 0, true, 0, 0, 0);
    if (memo.size() > 4000) return Error(path, "the object's member counts, dependencies and 'not' need more than 4,000 grammar rules");
    if (!members) return MatchesNothing(path, "no object satisfies 'minProperties', 'maxProperties', the dependencies and 'not' together");
    return Rule(hint, "\"{\" " + sp + " " + *members + " \"}\" " + sp);
  }

  // Automata become grammars of at most this many states (counts of lengths included).
  static constexpr size_t kMaxDfaStates = 2000;
  // Keywords FoldNot writes for ObjectRule and StringRule (no schema's own: '$' then a space).
  static constexpr const char* kForbiddenKeys = "$ forbidden key sets";  // [[k, ...], ...]: never all present
  static constexpr const char* kNotStrings = "$ not strings";            // [s, ...]: a string is none of them
  static constexpr const char* kNotPatterns = "$ not patterns";          // [p, ...]: a string matches none

  // The JSON strings (with their quotes, then space) whose text the automaton reads into a state
  // whose accepts satisfy `keep`, of min_len to max_len code points (max_len < 0: unbounded): a
  // rule per pair of a state and a count that can still reach such an end, the count going up to
  // max_len (or min_len, past which it stops mattering). MatchesNothing when no string qualifies.
  StatusOr<std::string> DfaString(const Dfa& dfa, const std::function<bool(uint32_t)>& keep, int64_t min_len,
                                  int64_t max_len, const std::string& hint, const std::string& path) {
    const int64_t cap = max_len >= 0 ? max_len : min_len;
    auto next_count = [&](int64_t n) -> int64_t { return max_len >= 0 ? (n < max_len ? n + 1 : -1) : std::min(n + 1, min_len); };
    // The pairs reachable from (start, 0), numbered as found.
    std::map<std::pair<int32_t, int64_t>, int32_t> ids = {{{0, 0}, 0}};
    std::vector<std::pair<int32_t, int64_t>> pairs = {{0, 0}};
    std::vector<std::vector<std::pair<const CharSet*, int32_t>>> edges(1);
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (pairs.size() > kMaxDfaStates) {
        return Error(path, "the string's automaton needs more than {} states (pattern and lengths together)", kMaxDfaStates);
      }
      const auto [q, n] = pairs[i];
      const int64_t m = next_count(n);
      if (m < 0 || m > cap + 1) continue;
      for (const Dfa::Edge& e : dfa.states[q].edges) {
        auto [it, added] = ids.emplace(std::make_pair(e.to, m), static_cast<int32_t>(pairs.size()));
        if (added) {
          pairs.emplace_back(e.to, m);
          edges.emplace_back();
        }
        edges[i].emplace_back(&e.chars, it->second);
      }
    }
    auto ends = [&](size_t i) { return keep(dfa.states[pairs[i].first].accepts) && pairs[i].second >= min_len; };
    // Live: can still reach an end (backwards from the ends).
    std::vector<bool> live(pairs.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = pairs.size(); i-- > 0;) {
        if (live[i]) continue;
        bool l = ends(i);
        for (const auto& [chars, to] : edges[i]) l = l || live[to];
        if (l) live[i] = true, changed = true;
      }
    }
    if (!live[0]) return MatchesNothing(path, "no string matches the pattern within the lengths");
    std::vector<std::string> names(pairs.size());
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (live[i]) names[i] = FreshName(fmt::format("{}-s{}", hint, i));
    }
    const std::string close = "\"\\\"\" " + UsePrimitive("space");
    std::unordered_map<const CharSet*, std::string> texts;  // an edge's set as GBNF, written once
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (!live[i]) continue;
      std::string body = ends(i) ? close : "";
      for (const auto& [chars, to] : edges[i]) {
        if (!live[to]) continue;
        auto [t, added] = texts.emplace(chars, "");
        if (added) t->second = JsonStringCharSet(*chars);
        body += (body.empty() ? "" : " | ") + t->second + " " + names[to];
      }
      rules_.emplace_back(names[i], body);
    }
    return Rule(hint, "\"\\\"\" " + names[0]);
  }

  // A JSON string (with its quotes, then space) that is none of `names` once decoded: a property
  // written through additionalProperties must not be a declared one again. Built over a trie of
  // the names' encoded texts: along it, a key may end only where no name does, and it leaves the
  // trie by a character or an escape no name continues with, after which anything goes. Along the
  // trie \u escapes and \/ are not allowed (they would spell a name's character another way).
  std::string KeyExcept(const std::set<std::string>& names, const std::string& hint) {
    // One trie per set of names: big schemas repeat their objects (a set's trie is thousands of
    // rules in Kubernetes' schemas).
    auto known = key_except_.find(names);
    if (known != key_except_.end()) return known->second;
    struct Node {
      std::map<std::string, int> next;
      bool name_ends = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      int at = 0;
      for (const std::string& u : EncodedUnits(name)) {
        auto it = trie[at].next.find(u);
        if (it == trie[at].next.end()) {
          trie.push_back({});
          it = trie[at].next.emplace(u, static_cast<int>(trie.size()) - 1).first;
        }
        at = it->second;
      }
      trie[at].name_ends = true;
    }
    const std::string rest = Rule(hint + "-rest", UsePrimitive("char") + "* \"\\\"\" " + UsePrimitive("space"));
    std::vector<std::string> names_of(trie.size());
    for (size_t k = 0; k < trie.size(); ++k) names_of[k] = FreshName(fmt::format("{}-key-{}", hint, k));
    for (size_t k = 0; k < trie.size(); ++k) {
      std::vector<std::string> alts;
      if (!trie[k].name_ends) alts.push_back("\"\\\"\" " + UsePrimitive("space"));
      CharSet plain;  // a character leaving the trie: not a quote, backslash or control
      plain.AddRange(0, 0x1F);
      plain.AddRange('"', '"');
      plain.AddRange('\\', '\\');
      std::string escapes = "\"bfnrt\\";  // those leaving it: the escapes no name continues with
      for (const auto& [u, child] : trie[k].next) {
        alts.push_back(GbnfLiteral(u) + " " + names_of[child]);
        if (u[0] != '\\') {
          plain.AddRange(FirstCodePoint(u), FirstCodePoint(u));
        } else if (u.size() == 2) {
          escapes.erase(std::remove(escapes.begin(), escapes.end(), u[1]), escapes.end());
        }
      }
      plain.Negate();
      plain.Normalize();
      alts.push_back(CharSetGbnf(plain) + " " + rest);
      if (!escapes.empty()) {
        std::string set = "[";
        for (char c : escapes) set += c == '\\' ? "\\\\" : c == '"' ? "\"" : std::string(1, c);
        alts.push_back("\"\\\\\" " + set + "] " + rest);
      }
      std::string body;
      for (const std::string& a : alts) body += (body.empty() ? "" : " | ") + a;
      rules_.emplace_back(names_of[k], body);
    }
    return key_except_[names] = Rule(hint + "-key", "\"\\\"\" " + names_of[0]);
  }

  StatusOr<int64_t> Count(const Json& s, const char* key, const std::string& path, int64_t dflt) {
    if (!s.contains(key)) return dflt;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return Error(path, "'{}' must be a non-negative integer", key);
    if (v.get<int64_t>() > kMaxCount) return Error(path, "'{}' above {} is not supported", key, kMaxCount);
    return v.get<int64_t>();
  }

  // Lengths and item counts up to a billion; past GBNF's 10,000 per {m,n} they are counts of
  // groups of 100 (Repeat).
  static constexpr int64_t kMaxCount = 1000000000;

  static std::string Repeat(const std::string& x, int64_t lo, int64_t hi) {  // hi < 0: unbounded
    if (lo > kMaxRepetition || hi > kMaxRepetition) {
      // x{lo,hi} = x{lo} x{0,n}; x{lo} = (x{100}){lo/100} x{lo%100}; x{0,n} with n = 100q + r is
      // either fewer than q hundreds and up to 99 more, or q hundreds and up to r more: one parse
      // for every length.
      const std::string h = "(" + x + "){100}";
      auto join = [](const std::string& a, const std::string& b) { return a.empty() ? b : b.empty() ? a : a + " " + b; };
      const std::string exact = join(Repeat(h, lo / 100, lo / 100), Repeat(x, lo % 100, lo % 100));
      if (hi < 0) return join(exact, Repeat(x, 0, -1));
      const int64_t n = hi - lo, q = n / 100, r = n % 100;
      if (q == 0) return join(exact, Repeat(x, 0, r));
      const std::string fewer = join(q > 1 ? Repeat(h, 0, q - 1) : "", Repeat(x, 0, 99));
      const std::string most = join(Repeat(h, q, q), Repeat(x, 0, r));
      return join(exact, "(" + fewer + " | " + most + ")");
    }
    if (hi == lo) return lo == 0 ? "" : lo == 1 ? x : fmt::format("({}){{{}}}", x, lo);
    if (hi < 0) return fmt::format("({}){{{},}}", x, lo);
    return fmt::format("({}){{{},{}}}", x, lo, hi);
  }

  StatusOr<std::string> ArrayRule(const Json& s, const std::string& hint, const std::string& path) {
    const std::string sp = UsePrimitive("space");
    ASSIGN_OR_RETURN(int64_t min_items, Count(s, "minItems", path, 0));
    ASSIGN_OR_RETURN(int64_t max_items, Count(s, "maxItems", path, -1));
    if (max_items >= 0 && max_items < min_items) return Error(path, "'maxItems' is below 'minItems'");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return Error(path, "'prefixItems' must be an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
        ASSIGN_OR_RETURN(std::string e, Visit(s["prefixItems"][i], fmt::format("{}-{}", hint, i),
                                              fmt::format("{}/prefixItems/{}", path, i)));
        prefix.push_back(e);
      }
    }
    std::string item;
    if (s.contains("items") && !(s["items"].is_boolean() && !s["items"].get<bool>())) {
      if (s["items"].is_array()) return Error(path, "'items' as an array (draft 4 tuples) is not supported; use prefixItems");
      auto visited = Visit(s["items"], hint + "-item", path + "/items");
      // Items no value satisfies: as items false (only the prefix, or an empty array).
      if (!visited.ok() && visited.status().code() != StatusCode::kOutOfRange) return visited.status();
      if (visited.ok()) item = *visited;
    } else if (!s.contains("items") && prefix.empty()) {
      item = UsePrimitive("value");
    }
    const std::string comma = "\",\" " + sp + " ";
    if (s.contains("uniqueItems") && s["uniqueItems"] == true) return UniqueItems(s, min_items, max_items, hint, path);
    if (s.contains("contains")) {
      // At least one item matches `contains` too: items, then one matching both, then items.
      if (!prefix.empty() || s.contains("minItems") || s.contains("maxItems")) {
        return Error(path, "'contains' together with prefixItems, minItems or maxItems is not supported");
      }
      if (item.empty()) return MatchesNothing(path, "'contains' needs an item, and no item is allowed");
      const Json items = s.contains("items") ? s["items"] : Json::object();
      ASSIGN_OR_RETURN(const std::string both, Visit(Conjoin(items, s["contains"]), hint + "-contains", path + "/contains"));
      return Rule(hint, "\"[\" " + sp + " (" + item + " " + comma + ")* " + both + " (" + comma + item + ")* \"]\" " + sp);
    }
    if (!prefix.empty()) {
      const int64_t k = static_cast<int64_t>(prefix.size());
      if ((max_items >= 0 && max_items < k) || (min_items > k && item.empty())) {
        return Error(path, "'minItems'/'maxItems' conflict with the {} prefixItems", k);
      }
      std::string body = "\"[\" " + sp;
      for (int64_t i = 0; i < k; ++i) body += (i ? " " + comma : " ") + prefix[i];
      if (!item.empty()) {
        const int64_t lo = std::max<int64_t>(0, min_items - k);
        const int64_t hi = max_items < 0 ? -1 : max_items - k;
        const std::string rest = Repeat(comma + item, lo, hi);
        if (!rest.empty()) body += " " + rest;
      }
      return Rule(hint, body + " \"]\" " + sp);
    }
    if (item.empty() || max_items == 0) {
      if (min_items > 0) return Error(path, "'minItems' needs items");
      return Rule(hint, "\"[\" " + sp + " \"]\" " + sp);
    }
    const int64_t lo = std::max<int64_t>(0, min_items - 1);
    const int64_t hi = max_items < 0 ? -1 : max_items - 1;
    std::string rest = Repeat(comma + item, lo, hi);
    std::string inner = item + (rest.empty() ? "" : " " + rest);
    if (min_items == 0) inner = "(" + inner + ")?";
    return Rule(hint, "\"[\" " + sp + " " + inner + " \"]\" " + sp);
  }

  // An array of distinct items, where the items are a few values (an enum or const, booleans,
  // null): a rule per set of values written so far, each going on with a value not in it. Items
  // of any other kind (strings, numbers, objects: no grammar can remember them all) are refused.
  StatusOr<std::string> UniqueItems(const Json& s, int64_t min_items, int64_t max_items, const std::string& hint,
                                    const std::string& path) {
    constexpr size_t kMaxValues = 8;
    if (s.contains("prefixItems") || s.contains("contains") || (s.contains("items") && s["items"].is_array())) {
      return Error(path, "'uniqueItems' together with prefixItems, contains or tuple items is not supported");
    }
    const Json own = s.value("items", Json(true));
    const Json& items = Deref(own);
    // The values an item may be: listed, or a type with a few values.
    Json values = Json::array();
    if (items.is_object() && (items.contains("enum") || items.contains("const"))) {
      Json rest = items;
      rest.erase("enum");
      rest.erase("const");
      const Json listed = items.contains("const") ? Json::array({items["const"]}) : items["enum"];
      if (!listed.is_array()) return Error(path + "/items", "'enum' must be an array");
      for (const Json& v : listed) {
        if (items.contains("const") && items.contains("enum") && std::find(items["enum"].begin(), items["enum"].end(), v) == items["enum"].end()) continue;
        ASSIGN_OR_RETURN(const bool ok, Satisfies(v, rest, path + "/items"));
        if (ok && std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
      }
    } else if (items.is_object() && items.contains("type") && (items["type"] == "boolean" || items["type"] == "null") &&
               !HasConstraints([&] { Json t = items; t.erase("type"); return t; }())) {
      values = items["type"] == "null" ? Json::array({nullptr}) : Json::array({false, true});
    } else {
      return Error(path, "'uniqueItems' is supported only over items with a few listed values (an enum or const of up to {}), "
                         "booleans or null",
                   kMaxValues);
    }
    if (values.size() > kMaxValues) return Error(path, "'uniqueItems' over more than {} item values is not supported", kMaxValues);
    const int64_t k = static_cast<int64_t>(values.size());
    const int64_t most = max_items < 0 ? k : std::min(max_items, k);
    if (min_items > most) return MatchesNothing(path, "'minItems' asks for more distinct items than there are values");
    const std::string sp = UsePrimitive("space");
    // after(set): the items after the ones in `set` (each with its comma), then the end.
    std::map<uint32_t, std::string> after;
    std::function<std::string(uint32_t)> rule = [&](uint32_t set) -> std::string {
      if (auto it = after.find(set); it != after.end()) return it->second;
      const int64_t n = std::popcount(set);
      std::vector<std::string> alts;
      if (n < most) {
        for (int64_t i = 0; i < k; ++i) {
          if (set & (1u << i)) continue;
          std::string next = rule(set | (1u << i));
          alts.push_back("\",\" " + sp + " " + JsonLiteral(values[static_cast<size_t>(i)]) + " " + sp + (next.empty() ? "" : " " + next));
        }
      }
      std::string body = alts.empty() ? "" : "(" + fmt::format("{}", fmt::join(alts, " | ")) + ")";
      if (n >= min_items && !body.empty()) body += "?";
      return after[set] = body.empty() ? "" : Rule(fmt::format("{}-u{}", hint, set), body);
    };
    std::vector<std::string> alts;
    for (int64_t i = 0; i < k && most > 0; ++i) {
      std::string next = rule(1u << i);
      alts.push_back(JsonLiteral(values[static_cast<size_t>(i)]) + " " + sp + (next.empty() ? "" : " " + next));
    }
    std::string inner = alts.empty() ? "" : "(" + fmt::format("{}", fmt::join(alts, " | ")) + ")";
    if (min_items == 0 && !inner.empty()) inner += "?";
    return Rule(hint, "\"[\" " + sp + (inner.empty() ? "" : " " + inner) + " \"]\" " + sp);
  }

  StatusOr<std::string> StringRule(const Json& s, const std::string& hint, const std::string& path) {
    const std::string sp = UsePrimitive("space");
    ASSIGN_OR_RETURN(int64_t min_len, Count(s, "minLength", path, 0));
    ASSIGN_OR_RETURN(int64_t max_len, Count(s, "maxLength", path, -1));
    if (max_len >= 0 && max_len < min_len) return Error(path, "'maxLength' is below 'minLength'");
    const bool bounded = s.contains("minLength") || s.contains("maxLength");
    // A format with a grammar beside a pattern or lengths, or a pattern opening with lookaheads:
    // one automaton reads them together (each a language; a text must be in every one, and in
    // none of a negative lookahead's).
    const std::optional<std::string> format =
        s.contains("format") && s["format"].is_string() ? FormatRegex(s["format"].get<std::string>()) : std::nullopt;
    Lookaheads pattern;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return Error(path, "'pattern' must be a string");
      pattern = LeadingLookaheads(s["pattern"].get<std::string>());
    }
    // Strings 'not' excludes (FoldNot): by value and by pattern.
    const bool excluded = s.contains(kNotStrings) || s.contains(kNotPatterns);
    if (excluded && !format && s.contains("format") && s["format"].is_string() && IsCheckedFormat(s["format"].get<std::string>())) {
      return Error(path, "'not' beside 'format' '{}' is not supported", s["format"].get<std::string>());
    }
    if ((format && (s.contains("pattern") || bounded)) || !pattern.checks.empty() || excluded) {
      std::vector<DfaLanguage> languages;
      uint32_t must = 0, must_not = 0;
      auto add = [&](std::string regex, RegexMatch how, bool in) {
        (in ? must : must_not) |= 1u << languages.size();
        languages.push_back({std::move(regex), how, std::nullopt});
      };
      if (format) add(*format, RegexMatch::kWhole, true);
      if (s.contains("pattern")) add(pattern.rest, RegexMatch::kSearch, true);
      for (const auto& [regex, in] : pattern.checks) add(regex, RegexMatch::kSearch, in);
      for (const Json& p : s.value(kNotPatterns, Json::array())) add(p.get<std::string>(), RegexMatch::kSearch, false);
      if (s.contains(kNotStrings)) {
        must_not |= 1u << languages.size();
        languages.push_back({"", RegexMatch::kWhole, s[kNotStrings].get<std::vector<std::string>>()});
      }
      if (languages.size() > 32) return Error(path, "'pattern' has too many lookaheads");
      auto dfa = BuildDfa(languages, kMaxDfaStates);
      if (!dfa.ok()) return Error(path, "'format' or lookaheads with a pattern or lengths: {}", dfa.status().message());
      return DfaString(*dfa, [must, must_not](uint32_t a) { return (a & must) == must && (a & must_not) == 0; }, min_len,
                       max_len, hint, path);
    }
    if (s.contains("pattern")) {
      // (A format JSON Schema defines and FormatRegex has not: refused beside a pattern; other
      // formats are annotations.)
      if (s.contains("format") && s["format"].is_string() && IsCheckedFormat(s["format"].get<std::string>())) {
        return Error(path, "'pattern' together with 'format' '{}' is not supported", s["format"].get<std::string>());
      }
      if (bounded) {
        // One class repeated: its counts and the lengths intersect.
        if (auto cr = AsClassRepeat(s["pattern"].get<std::string>())) {
          const int64_t lo = std::max(min_len, cr->lo);
          const int64_t hi = max_len < 0 ? cr->hi : cr->hi < 0 ? max_len : std::min(max_len, cr->hi);
          if (hi >= 0 && hi < lo) return MatchesNothing(path, "the pattern's counts and the lengths do not meet");
          auto atom = RegexToGbnf(cr->atom, JsonStringCharSet);
          if (!atom.ok()) return Error(path, "{}", atom.status().message());
          const std::string body = Repeat("(" + *atom + ")", lo, hi);
          return Rule(hint, "\"\\\"\" " + (body.empty() ? "" : body + " ") + "\"\\\"\" " + sp);
        }
        // Otherwise the pattern's automaton, its states counted up to the lengths.
        const DfaLanguage pattern{s["pattern"].get<std::string>(), RegexMatch::kSearch, std::nullopt};
        auto dfa = BuildDfa({pattern}, kMaxDfaStates);
        if (!dfa.ok()) return Error(path, "'pattern' with lengths: {}", dfa.status().message());
        return DfaString(*dfa, [](uint32_t accepts) { return accepts != 0; }, min_len, max_len, hint, path);
      }
      auto re = RegexToGbnf(s["pattern"].get<std::string>(), JsonStringCharSet, RegexMatch::kSearch);
      if (!re.ok()) return Error(path, "{}", re.status().message());
      return Rule(hint, "\"\\\"\" " + *re + " \"\\\"\" " + sp);
    }
    if (s.contains("format") && s["format"].is_string()) {
      const std::string f = s["format"].get<std::string>();
      const char* rule = f == "date" ? "date-string" : f == "time" ? "time-string" : f == "date-time" ? "date-time-string"
                         : f == "uuid" ? "uuid" : f == "email" ? "email-string" : f == "hostname" ? "hostname-string"
                         : f == "uri" ? "uri-string" : f == "ipv4" ? "ipv4-string" : f == "ipv6" ? "ipv6-string"
                         : f == "uri-reference" ? "uri-reference-string" : f == "iri" ? "iri-string"
                         : f == "uri-template" ? "uri-template-string" : f == "duration" ? "duration-string" : nullptr;
      if (rule != nullptr) {
        if (bounded) return Error(path, "'format' '{}' together with lengths is not supported", f);
        return UsePrimitive(rule);
      }
      // The other formats JSON Schema defines are assertions a validator checks, which gale has no
      // grammar for: refused rather than generated unchecked. Formats it does not define are
      // annotations (a plain string).
      if (IsCheckedFormat(f)) return Error(path, "'format' '{}' is not supported", f);
    }
    if (!bounded) return UsePrimitive("string");
    UsePrimitive("char");
    return Rule(hint, "\"\\\"\" " + Repeat("char", min_len, max_len) + " \"\\\"\" " + sp);
  }

  // Integer bounds from minimum/maximum and their exclusive forms (draft 4's booleans too).
  Status Bounds(const Json& s, const std::string& path, std::optional<double>* lo, std::optional<double>* lo_excl,
                std::optional<double>* hi, std::optional<double>* hi_excl) {
    auto num = [&](const char* k, std::optional<double>* out) -> Status {
      if (!s.contains(k) || s[k].is_boolean()) return Status::Ok();
      if (!s[k].is_number()) return Error(path, "'{}' must be a number", k);
      *out = s[k].get<double>();
      return Status::Ok();
    };
    RETURN_IF_ERROR(num("minimum", lo));
    RETURN_IF_ERROR(num("maximum", hi));
    RETURN_IF_ERROR(num("exclusiveMinimum", lo_excl));
    RETURN_IF_ERROR(num("exclusiveMaximum", hi_excl));
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"] == true && *lo) *lo_excl = *lo, lo->reset();
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"] == true && *hi) *hi_excl = *hi, hi->reset();
    return Status::Ok();
  }

  // multipleOf as p / 10^k (nullopt: none); refused when not a number above 0 or finer than 10^-6.
  StatusOr<std::optional<std::pair<int64_t, int>>> MultipleOf(const Json& s, const std::string& path) {
    using Multiple = std::optional<std::pair<int64_t, int>>;
    if (!s.contains("multipleOf")) return Multiple();
    const Json& m = s["multipleOf"];
    if (!m.is_number() || !(m.get<double>() > 0)) return Error(path, "'multipleOf' must be a number above 0");
    const auto d = Magnitude(m.get<double>(), false, false);
    if (!d || d->fraction.size() > 6) return Error(path, "'multipleOf' {} is not supported (finer than 10^-6)", m.dump());
    std::string digits = std::to_string(d->integer) + d->fraction;
    if (digits.size() > 18) return Error(path, "'multipleOf' {} is not supported (too many digits)", m.dump());
    return Multiple(std::pair<int64_t, int>(std::stoll(digits), static_cast<int>(d->fraction.size())));
  }

  // Numbers whose value times 10^k is a multiple of p (multipleOf p/10^k), with no bounds: the
  // remainder mod p as the digits are read, the integer part's and then (numbers) the first k
  // after the point; any after those must be 0. Integers (number false) have k 0 and no point.
  StatusOr<std::string> MultipleRule(int64_t p, int k, bool number, const std::string& hint, const std::string& path) {
    if (p > 1000 || p * (k + 1) > 4000) return Error(path, "'multipleOf' needs more than 4,000 grammar states here");
    auto pow10 = [&](int e) {
      int64_t v = 1 % p;
      for (int i = 0; i < e; ++i) v = v * 10 % p;
      return v;
    };
    // alive[j][r]: j digits after the point read with remainder r can still end a multiple.
    std::vector<std::vector<bool>> alive(static_cast<size_t>(k + 1), std::vector<bool>(static_cast<size_t>(p)));
    for (int j = k; j >= 1; --j) {
      for (int64_t r = 0; r < p; ++r) {
        bool ok = j == k ? r == 0 : r * pow10(k - j) % p == 0;
        for (int d = 0; d < 10 && !ok && j < k; ++d) ok = alive[static_cast<size_t>(j + 1)][static_cast<size_t>((10 * r + d) % p)];
        alive[static_cast<size_t>(j)][static_cast<size_t>(r)] = ok;
      }
    }
    std::vector<std::vector<std::string>> names(static_cast<size_t>(k + 1), std::vector<std::string>(static_cast<size_t>(p)));
    for (int j = 0; j <= k; ++j) {
      for (int64_t r = 0; r < p; ++r) {
        if (j == 0 || alive[static_cast<size_t>(j)][static_cast<size_t>(r)]) {
          names[static_cast<size_t>(j)][static_cast<size_t>(r)] = FreshName(fmt::format("mult{}-{}-{}", p, j, r));
        }
      }
    }
    // Digits from remainder r into the states of `next` (digits grouped by the state they reach).
    auto digits_into = [&](int64_t r, const std::vector<std::string>& next, int from) {
      std::map<int64_t, std::string> by_state;
      for (int d = from; d < 10; ++d) {
        const int64_t t = (10 * r + d) % p;
        if (!next[static_cast<size_t>(t)].empty()) by_state[t] += static_cast<char>('0' + d);
      }
      std::vector<std::string> alts;
      for (const auto& [t, ds] : by_state) alts.push_back(fmt::format("[{}] {}", ds, next[static_cast<size_t>(t)]));
      return alts;
    };
    auto body = [](const std::vector<std::string>& alts, bool may_end) {
      if (alts.empty()) return std::string("\"\"");
      return "(" + fmt::format("{}", fmt::join(alts, " | ")) + ")" + (may_end ? "?" : "");
    };
    // After the integer part with remainder r: the point and more digits, or the end.
    auto after_integer = [&](int64_t r) {
      std::vector<std::string> alts;
      if (number && k > 0) {
        for (std::string& a : digits_into(r, names[1], 0)) alts.push_back("\".\" " + a);
      }
      const bool may_end = r * pow10(k) % p == 0;
      if (number && k == 0 && may_end) alts.push_back("\".\" \"0\"{1,16}");
      return std::pair(alts, may_end);
    };
    for (int64_t r = 0; r < p; ++r) {
      std::vector<std::string> alts = digits_into(r, names[0], 0);
      auto [tail, may_end] = after_integer(r);
      alts.insert(alts.end(), tail.begin(), tail.end());
      rules_.emplace_back(names[0][static_cast<size_t>(r)], body(alts, may_end));
    }
    for (int j = 1; j <= k; ++j) {
      for (int64_t r = 0; r < p; ++r) {
        const std::string& name = names[static_cast<size_t>(j)][static_cast<size_t>(r)];
        if (name.empty()) continue;
        if (j == k) {
          rules_.emplace_back(name, "\"0\"{0,16}");
        } else {
          rules_.emplace_back(name, body(digits_into(r, names[static_cast<size_t>(j + 1)], 0), r * pow10(k - j) % p == 0));
        }
      }
    }
    auto [zero_tail, zero_ends] = after_integer(0);
    std::vector<std::string> first = digits_into(0, names[0], 1);  // [1-9] then the integer part's rest
    first.push_back("\"0\" " + body(zero_tail, zero_ends));
    return Rule(hint, "\"-\"? " + body(first, false) + " " + UsePrimitive("space"));
  }

  // Multiples of p/10^k within both bounds (given as lower/upper with their strictness), when at
  // most 1,000: each written as a literal (an integer's digits; a number's may end in zeros after
  // the point). integer: only those that are integers.
  StatusOr<std::string> BoundedMultiples(int64_t p, int k, const std::optional<std::pair<double, bool>>& lower,
                                         const std::optional<std::pair<double, bool>>& upper, bool integer,
                                         const std::string& hint, const std::string& path) {
    if (!lower || !upper) return Error(path, "'multipleOf' other than a power of ten with only one bound is not supported");
    if (std::abs(lower->first) > 1e15 || std::abs(upper->first) > 1e15) {
      return Error(path, "'multipleOf' with bounds past 10^15 is not supported");
    }
    const int64_t ten_k = Pow10(k);
    const double step = static_cast<double>(p) / static_cast<double>(ten_k);
    const double first = std::ceil(lower->first / step), last = std::floor(upper->first / step);
    if (!(last - first < 1000.0)) return Error(path, "'multipleOf' within these bounds has more than 1,000 values");
    std::vector<std::string> alts;
    for (auto m = static_cast<int64_t>(first) - 1; m <= static_cast<int64_t>(last) + 1; ++m) {
      const double v = static_cast<double>(m * p) / static_cast<double>(ten_k);
      if (v < lower->first || (lower->second && v == lower->first) || v > upper->first || (upper->second && v == upper->first)) continue;
      const int64_t scaled = m * p;  // v times 10^k
      if (integer && scaled % ten_k != 0) continue;
      std::string digits = std::to_string(scaled < 0 ? -scaled : scaled);
      if (static_cast<int>(digits.size()) <= k) digits.insert(0, static_cast<size_t>(k) + 1 - digits.size(), '0');
      std::string whole = digits.substr(0, digits.size() - static_cast<size_t>(k)), frac = digits.substr(whole.size());
      while (!frac.empty() && frac.back() == '0') frac.pop_back();
      const std::string text = (scaled < 0 ? "-" : "") + whole + (frac.empty() ? "" : "." + frac);
      if (integer) {
        alts.push_back(GbnfLiteral(text));
      } else {
        alts.push_back(GbnfLiteral(text) + (frac.empty() ? " (\".\" \"0\"{1,16})?" : " \"0\"{0,16}"));
      }
    }
    if (alts.empty()) return MatchesNothing(path, "no multiple of 'multipleOf' lies within the bounds");
    return Rule(hint, JoinAlternatives(alts) + " " + UsePrimitive("space"));
  }

  // The tighter of each pair of bounds, with whether it is exclusive (where they tie, exclusive).
  static std::pair<std::optional<std::pair<double, bool>>, std::optional<std::pair<double, bool>>> Tightest(
      const std::optional<double>& lo, const std::optional<double>& lo_excl, const std::optional<double>& hi,
      const std::optional<double>& hi_excl) {
    std::optional<std::pair<double, bool>> lower, upper;
    if (lo) lower = std::pair(*lo, false);
    if (lo_excl && (!lower || *lo_excl >= lower->first)) lower = std::pair(*lo_excl, true);
    if (hi) upper = std::pair(*hi, false);
    if (hi_excl && (!upper || *hi_excl <= upper->first)) upper = std::pair(*hi_excl, true);
    return {lower, upper};
  }

  StatusOr<std::string> IntegerRule(const Json& s, const std::string& hint, const std::string& path) {
    std::optional<double> lo, lo_excl, hi, hi_excl;
    RETURN_IF_ERROR(Bounds(s, path, &lo, &lo_excl, &hi, &hi_excl));
    ASSIGN_OR_RETURN(const auto multiple, MultipleOf(s, path));
    const bool bounded = lo || lo_excl || hi || hi_excl;
    if (multiple) {  // an integer is a multiple of p/10^k when it is one of p/gcd(p, 10^k)
      const int64_t q = multiple->first / std::gcd(multiple->first, Pow10(multiple->second));
      if (q > 1 && bounded) {
        const auto [lower, upper] = Tightest(lo, lo_excl, hi, hi_excl);
        return BoundedMultiples(multiple->first, multiple->second, lower, upper, /*integer=*/true, hint, path);
      }
      if (q > 1) return MultipleRule(q, 0, /*number=*/false, hint, path);
    }
    if (!bounded) return UsePrimitive("integer");
    std::optional<int64_t> a, b;  // inclusive integer bounds
    auto clamp = [](double v) { return static_cast<int64_t>(std::clamp(v, -1e15 + 1, 1e15 - 1)); };
    if (lo) a = clamp(std::ceil(*lo));
    if (lo_excl) a = std::max(a.value_or(INT64_MIN), clamp(std::floor(*lo_excl) + 1));
    if (hi) b = clamp(std::floor(*hi));
    if (hi_excl) b = std::min(b.value_or(INT64_MAX), clamp(std::ceil(*hi_excl) - 1));
    if (a && b && *a > *b) return Error(path, "no integer lies within the bounds");
    if (a && std::abs(*a) > kMaxBound) a = *a < 0 ? -kMaxBound : kMaxBound;
    if (b && std::abs(*b) > kMaxBound) b = *b < 0 ? -kMaxBound : kMaxBound;
    std::vector<std::string> alts;
    if (!b || *b >= 0) alts.push_back(UnsignedRange(a ? std::max<int64_t>(*a, 0) : 0, b));
    if (!a || *a < 0) {
      // Negative numbers: "-" then the magnitude in [max(1, -b), -a].
      const int64_t mag_lo = b && *b < 0 ? -*b : 1;
      alts.push_back("\"-\" " + UnsignedRange(mag_lo, a ? std::optional<int64_t>(-*a) : std::nullopt));
    }
    std::string body = alts.size() == 1 ? alts[0] : "(" + alts[0] + " | " + alts[1] + ")";
    return Rule(hint, body + " " + UsePrimitive("space"));
  }

  // A number within bounds (and a multiple of 10^-k), written without an exponent: the
  // non-negative side's magnitudes, and "-" before the negative side's (never "-0").
  StatusOr<std::string> NumberRule(const Json& s, const std::string& hint, const std::string& path) {
    std::optional<double> lo, lo_excl, hi, hi_excl;
    RETURN_IF_ERROR(Bounds(s, path, &lo, &lo_excl, &hi, &hi_excl));
    ASSIGN_OR_RETURN(const auto multiple, MultipleOf(s, path));
    const bool bounded = lo || lo_excl || hi || hi_excl;
    int free = -1;  // digits after the point that may be other than 0 (multipleOf 10^-k: k)
    if (multiple && multiple->first == 1) {
      free = multiple->second;
    } else if (multiple) {
      if (bounded) {
        const auto [lower, upper] = Tightest(lo, lo_excl, hi, hi_excl);
        return BoundedMultiples(multiple->first, multiple->second, lower, upper, /*integer=*/false, hint, path);
      }
      return MultipleRule(multiple->first, multiple->second, /*number=*/true, hint, path);
    }
    if (!bounded && free < 0) return UsePrimitive("number");
    const auto [lower, upper] = Tightest(lo, lo_excl, hi, hi_excl);
    auto magnitude = [&](const std::pair<double, bool>& b, bool is_upper) -> StatusOr<DecimalBound> {
      auto m = Magnitude(b.first, b.second, is_upper);
      if (!m) return Error(path, "the bound {} cannot be written (more than 15 digits before the point or 20 after)", b.first);
      return *m;
    };
    std::vector<std::string> alts;
    if (!upper || upper->first > 0 || (upper->first == 0 && !upper->second)) {  // x >= 0
      std::optional<DecimalBound> mlo, mhi;
      if (lower && lower->first >= 0) {
        ASSIGN_OR_RETURN(mlo, magnitude(*lower, false));
      }
      if (upper) {
        ASSIGN_OR_RETURN(mhi, magnitude(*upper, true));
      }
      for (std::string& a : Magnitudes(mlo, mhi, free)) alts.push_back(std::move(a));
    }
    if (!lower || lower->first < 0) {  // x < 0: -x from -upper (or above 0) to -lower
      std::optional<DecimalBound> mlo = DecimalBound{0, "", true}, mhi;
      if (upper && upper->first < 0) {
        ASSIGN_OR_RETURN(mlo, magnitude(*upper, false));
      }
      if (lower) {
        ASSIGN_OR_RETURN(mhi, magnitude(*lower, true));
      }
      const std::vector<std::string> negative = Magnitudes(mlo, mhi, free);
      if (!negative.empty()) alts.push_back("\"-\" " + JoinAlternatives(negative));
    }
    if (alts.empty()) return Error(path, "no number lies within the bounds");
    return Rule(hint, JoinAlternatives(alts) + " " + UsePrimitive("space"));
  }

  const Json& root_;
  std::string root_name_;
  ThreadCpuClock::time_point deadline_;
  ObjectKeys objects_;
  std::unordered_map<std::string, int> next_suffix_;  // FreshName's last suffix per base
  std::unordered_map<std::string, Dfa> value_dfas_;     // Matches' automata, by how and regex
  std::map<std::set<std::string>, std::string> key_except_;  // KeyExcept's rule per set of names
  int depth_ = 0;
  int64_t visits_ = 0;
  std::vector<std::pair<std::string, std::string>> rules_;  // in the order written
  std::map<std::string, std::string> by_body_;
  std::map<std::string, std::string> ref_rules_;
  std::map<std::string, std::string> merged_refs_;  // UnionRule's $ref branches with siblings
  std::set<std::string> used_names_ = {"root"};
  std::set<std::string> have_primitive_;
};

std::string PrimitiveGrammar(const std::string& top) {
  std::string out = "root ::= lead-space " + top + "\n";
  std::set<std::string> done;
  std::vector<std::string> todo = {top, "lead-space"};
  while (!todo.empty()) {
    const std::string n = todo.back();
    todo.pop_back();
    if (!done.insert(n).second) continue;
    out += n + " ::= " + Primitives().at(n) + "\n";
    auto it = PrimitiveDeps().find(n);
    if (it != PrimitiveDeps().end()) todo.insert(todo.end(), it->second.begin(), it->second.end());
  }
  return out;
}

}  // namespace

StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema, const std::string& root_name,
                                       ThreadCpuClock::time_point deadline, ObjectKeys objects) {
  Converter c(schema, root_name, deadline, objects);
  auto out = c.Convert();
  if (!out.ok() && out.status().code() == StatusCode::kOutOfRange) return InvalidArgument("{}", out.status().message());
  return out;
}

std::string CompactJsonText(std::string_view text) {
  std::string out;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r') {
      continue;
    }
    out += ch;
  }
  return out;
}

std::string JsonObjectGbnf() { return PrimitiveGrammar("object"); }
std::string JsonValueGbnf() { return PrimitiveGrammar("value"); }

}  // namespace gale::grammar
