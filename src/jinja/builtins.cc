// Filters, tests and methods. Each follows the Python/Jinja2 function of the same name; where a
// corner is not implemented the call is an error naming it, never a silent wrong answer.
#include "jinja/builtins.h"

#include "jinja/budget.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

namespace gale::jinja {
namespace {

bool IsPySpace(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

Status TypeError(const std::string& msg) { return InvalidArgument("TypeError: {}", msg); }

std::string KindName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kCallable: return "function";
  }
  return "?";
}

std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string u = ToU32(s);
  std::u32string set;
  const bool custom = chars.is_string();
  if (custom) set = ToU32(chars.as_string());
  auto strip_it = [&](char32_t c) { return custom ? set.find(c) != std::u32string::npos : IsPySpace(c); };
  size_t b = 0, e = u.size();
  if (left) while (b < e && strip_it(u[b])) ++b;
  if (right) while (e > b && strip_it(u[e - 1])) --e;
  return FromU32(u.substr(b, e - b));
}

std::string MapCase(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
  std::u32string u = ToU32(s);
  bool prev_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    const utf8proc_int32_t c = static_cast<utf8proc_int32_t>(u[i]);
    const bool cased = utf8proc_toupper(c) != c || utf8proc_tolower(c) != c;
    switch (mode) {
      case 0: u[i] = static_cast<char32_t>(utf8proc_tolower(c)); break;
      case 1: u[i] = static_cast<char32_t>(utf8proc_toupper(c)); break;
      case 2: u[i] = static_cast<char32_t>(prev_cased ? utf8proc_tolower(c) : utf8proc_toupper(c)); break;
      case 3: u[i] = static_cast<char32_t>(i == 0 ? utf8proc_toupper(c) : utf8proc_tolower(c)); break;
    }
    prev_cased = cased;
  }
  return FromU32(u);
}

std::vector<Value> Split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<Value> out;
  if (!sep.is_string() || sep.as_string().empty()) {
    std::u32string u = ToU32(s);
    size_t i = 0;
    while (true) {
      while (i < u.size() && IsPySpace(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = u.size();
        while (e > i && IsPySpace(u[e - 1])) --e;
        out.emplace_back(FromU32(u.substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < u.size() && !IsPySpace(u[j])) ++j;
      out.emplace_back(FromU32(u.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string& d = sep.as_string();
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t at = s.find(d, start);
    if (at == std::string::npos) break;
    out.emplace_back(s.substr(start, at - start));
    start = at + d.size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between characters (and at both ends).
    std::u32string u = ToU32(s);
    int64_t n = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (!CanBuild(out.size() + to.size())) return out;
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (i < u.size()) out += FromU32(u.substr(i, 1));
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    if (!CanBuild(out.size() + (at - start) + to.size())) return out;
    out += s.substr(start, at - start) + to;
    start = at + from.size();
    ++n;
  }
  return out + s.substr(start);
}

// Python str.format: {} {0} {name} with optional !r/!s and a format spec for numbers.
StatusOr<std::string> StrFormat(const std::string& f, CallArgs& args) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t end = f.find('}', i);
    if (end == std::string::npos) return InvalidArgument("ValueError: single '{{' in format string");
    std::string field = f.substr(i + 1, end - i - 1);
    i = end;
    std::string spec, conv;
    if (size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    if (!CanBuild(out.size())) return out;
    // A width or precision beyond any real use would allocate that much: refuse it.
    for (size_t p = 0, run = 0; p < spec.size(); ++p) {
      run = std::isdigit(static_cast<unsigned char>(spec[p])) ? run + 1 : 0;
      if (run > 6) return InvalidArgument("ValueError: format spec '{}' too large", spec);
    }
    Value v;
    if (field.empty()) {
      v = args.Get(auto_idx++, "");
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      if (field.size() > 6 || !std::all_of(field.begin(), field.end(), ::isdigit)) {
        return InvalidArgument("IndexError: format field '{}' has no argument", field);
      }
      v = args.Get(static_cast<size_t>(std::stoul(field)), "");
    } else {
      v = args.Get(SIZE_MAX, field.c_str());
    }
    if (v.is_undefined()) return InvalidArgument("IndexError: format field '{}' has no argument", field);
    if (conv == "r") {
      out += v.Repr();
    } else if (!spec.empty() && v.is_number()) {
      try {
        out += v.is_float() ? fmt::format(fmt::runtime("{:" + spec + "}"), v.as_float())
                            : fmt::format(fmt::runtime("{:" + spec + "}"), v.as_int());
      } catch (const std::exception&) {
        return InvalidArgument("ValueError: format spec '{}' not supported", spec);
      }
    } else {
      out += v.Str();
    }
  }
  return out;
}

Value BoundMethod(const Value& obj, const std::string& name) {
  return Value::Callable(name, [obj, name](CallArgs& a) -> StatusOr<Value> {
    if (obj.is_string()) {
      const std::string& s = obj.as_string();
      if (name == "strip") return Value(Strip(s, a.Get(0, "chars"), true, true));
      if (name == "lstrip") return Value(Strip(s, a.Get(0, "chars"), true, false));
      if (name == "rstrip") return Value(Strip(s, a.Get(0, "chars"), false, true));
      if (name == "upper") return Value(MapCase(s, 1));
      if (name == "lower") return Value(MapCase(s, 0));
      if (name == "title") return Value(MapCase(s, 2));
      if (name == "capitalize") return Value(MapCase(s, 3));
      if (name == "split") {
        const Value m = a.Get(1, "maxsplit");
        return Value::List(Split(s, a.Get(0, "sep"), m.is_int() ? m.as_int() : -1));
      }
      if (name == "splitlines") {
        ValueList out;
        size_t start = 0;
        while (start < s.size()) {
          size_t e = s.find('\n', start);
          if (e == std::string::npos) e = s.size();
          std::string line = s.substr(start, e - start);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          out.emplace_back(line);
          start = e + 1;
        }
        return Value::List(std::move(out));
      }
      if (name == "startswith" || name == "endswith") {
        const Value p = a.Get(0, "prefix");
        std::vector<std::string> options;
        if (p.is_string()) options.push_back(p.as_string());
        else if (p.is_list()) for (const auto& e : p.list()) if (e.is_string()) options.push_back(e.as_string());
        for (const auto& o : options) {
          if (name == "startswith" ? s.compare(0, o.size(), o) == 0 && s.size() >= o.size()
                                   : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0) {
            return Value(true);
          }
        }
        return Value(false);
      }
      if (name == "replace") {
        const Value c = a.Get(2, "count");
        if (!a.Get(0, "old").is_string() || !a.Get(1, "new").is_string()) return TypeError("replace() needs strings");
        return Value(Replace(s, a.Get(0, "old").as_string(), a.Get(1, "new").as_string(), c.is_int() ? c.as_int() : -1));
      }
      if (name == "find" || name == "index" || name == "rfind" || name == "count") {
        const Value sub = a.Get(0, "sub");
        if (!sub.is_string()) return TypeError(name + "() needs a string");
        if (name == "count") {
          if (sub.as_string().empty()) return Value(static_cast<int64_t>(ToU32(s).size() + 1));
          int64_t n = 0;
          for (size_t p = s.find(sub.as_string()); p != std::string::npos; p = s.find(sub.as_string(), p + sub.as_string().size())) ++n;
          return Value(n);
        }
        const size_t at = name == "rfind" ? s.rfind(sub.as_string()) : s.find(sub.as_string());
        if (at == std::string::npos) {
          if (name == "index") return InvalidArgument("ValueError: substring not found");
          return Value(int64_t{-1});
        }
        return Value(static_cast<int64_t>(ToU32(s.substr(0, at)).size()));
      }
      if (name == "join") {
        const Value items = a.Get(0, "iterable");
        if (!items.is_list()) return TypeError("join() needs a list");
        std::string out;
        for (size_t i = 0; i < items.list().size(); ++i) {
          if (!CanBuild(out.size() + s.size())) return Value(std::string());
          if (i) out += s;
          out += items.list()[i].Str();
        }
        return Value(out);
      }
      if (name == "format") {
        ASSIGN_OR_RETURN(std::string r, StrFormat(s, a));
        return Value(r);
      }
      if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isupper" || name == "islower") {
        std::u32string u = ToU32(s);
        if (u.empty()) return Value(false);
        for (char32_t c : u) {
          const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
          bool ok = false;
          if (name == "isdigit") ok = cat == UTF8PROC_CATEGORY_ND;
          else if (name == "isalpha") ok = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
          else if (name == "isspace") ok = IsPySpace(c);
          else if (name == "isupper") ok = cat != UTF8PROC_CATEGORY_LL;
          else ok = cat != UTF8PROC_CATEGORY_LU;
          if (!ok) return Value(false);
        }
        return Value(true);
      }
    } else if (obj.is_dict()) {
      ValueDict& d = obj.dict();
      if (name == "get") {
        const Value k = a.Get(0, "key");
        const Value* v = d.Find(k);
        if (v != nullptr) return *v;
        return a.Has(1, "default") ? a.Get(1, "default") : Value::None();
      }
      if (name == "items" || name == "keys" || name == "values") {
        ValueList out;
        for (const auto& [k, v] : d.items) {
          if (name == "items") out.push_back(Value::List({k, v}));
          else if (name == "keys") out.push_back(k);
          else out.push_back(v);
        }
        return Value::List(std::move(out));
      }
    } else if (obj.is_list()) {
      ValueList& l = obj.list();
      if (name == "index" || name == "count") {
        const Value x = a.Get(0, "value");
        int64_t n = 0;
        for (size_t i = 0; i < l.size(); ++i) {
          if (!l[i].Equals(x)) continue;
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") return InvalidArgument("ValueError: value is not in list");
        return Value(n);
      }
    }
    return InvalidArgument("'{}' object has no method '{}'", KindName(obj), name);
  });
}

const std::unordered_set<std::string> kStrMethods = {
    "strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize", "split", "splitlines", "startswith",
    "endswith", "replace", "find", "rfind", "index", "count", "join", "format", "isdigit", "isalpha", "isspace",
    "isupper", "islower"};
const std::unordered_set<std::string> kDictMethods = {"get", "items", "keys", "values"};
const std::unordered_set<std::string> kListMethods = {"index", "count"};
// Hugging Face renders in Jinja2's ImmutableSandboxedEnvironment: methods that modify a list or
// dict are refused (SecurityError), so a template cannot either.
const std::unordered_set<std::string> kMutatingMethods = {"append", "extend", "pop", "insert", "remove", "clear",
                                                          "update", "setdefault", "popitem", "sort", "reverse"};

}  // namespace

StatusOr<ValueList> Iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_dict()) {
    ValueList keys;
    for (const auto& kv : v.dict().items) keys.emplace_back(kv.first);
    return keys;
  }
  if (v.is_string()) {
    ValueList chars;
    for (char32_t c : ToU32(v.as_string())) chars.emplace_back(FromU32(std::u32string(1, c)));
    return chars;
  }
  if (v.is_undefined()) return ValueList{};
  return TypeError("'" + KindName(v) + "' object is not iterable");
}

namespace {

// Attribute path "a.b" of a value (Jinja's make_attrgetter), Undefined where missing.
StatusOr<Value> AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!part.empty() && part.size() <= 18 && std::all_of(part.begin(), part.end(), ::isdigit)) {
      ASSIGN_OR_RETURN(cur, GetItem(cur, Value(static_cast<int64_t>(std::stoll(part)))));
    } else {
      ASSIGN_OR_RETURN(cur, GetItem(cur, Value(part)));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

StatusOr<Value> SortValues(ValueList items, bool reverse, bool case_sensitive, const Value& attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) {
    Value k = v;
    if (attribute.is_string()) {
      ASSIGN_OR_RETURN(k, AttrPath(v, attribute.as_string()));
    }
    if (!case_sensitive && k.is_string()) k = Value(MapCase(k.as_string(), 0));
    keyed.emplace_back(std::move(k), std::move(v));
  }
  Status err;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto lt = reverse ? b.first.Less(a.first) : a.first.Less(b.first);
    if (!lt.ok()) {
      err = lt.status();
      return false;
    }
    return *lt;
  });
  if (!err.ok()) return err;
  ValueList out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::List(std::move(out));
}

}  // namespace

std::u32string ToU32(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t left = static_cast<utf8proc_ssize_t>(s.size());
  while (left > 0) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {  // invalid byte: keep it as U+FFFD-free raw marker (its byte value)
      cp = 0xDC00 + *p;
      n = 1;
    }
    out.push_back(static_cast<char32_t>(cp));
    p += n;
    left -= n;
  }
  return out;
}

std::string FromU32(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) {
    if (c >= 0xDC80 && c <= 0xDCFF) {  // a raw byte from ToU32
      out += static_cast<char>(c - 0xDC00);
      continue;
    }
    utf8proc_uint8_t buf[4];
    const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
    out.append(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
  }
  return out;
}

int64_t LengthOf(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(ToU32(v.as_string()).size());
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict().items.size());
  if (v.is_undefined()) return 0;
  return -1;
}

Value GetAttribute(const Value& obj, const std::string& name) {
  if ((obj.is_list() || (obj.is_dict() && !obj.is_namespace())) && kMutatingMethods.count(name)) {
    const std::string type = obj.is_list() ? "list" : "dict";
    return Value::Callable(name, [name, type](CallArgs&) -> StatusOr<Value> {
      return InvalidArgument("SecurityError: access to attribute '{}' of '{}' object is unsafe", name, type);
    });
  }
  if (obj.is_namespace()) {
    if (const Value* v = obj.dict().FindString(name)) return *v;
    return Value::Undefined(name);
  }
  if (obj.is_dict()) {
    if (kDictMethods.count(name)) return BoundMethod(obj, name);
    if (const Value* v = obj.dict().FindString(name)) return *v;
    return Value::Undefined(name);
  }
  if (obj.is_string() && kStrMethods.count(name)) return BoundMethod(obj, name);
  if (obj.is_list() && kListMethods.count(name)) return BoundMethod(obj, name);
  return Value::Undefined(name);
}

StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(key)) return *v;
    if (key.is_string() && !obj.is_namespace() && kDictMethods.count(key.as_string())) {
      return BoundMethod(obj, key.as_string());
    }
    return Value::Undefined(key.Str());
  }
  if (obj.is_list() || obj.is_string()) {
    if (!key.is_int() && !key.is_bool()) {
      if (key.is_string()) return GetAttribute(obj, key.as_string());
      return Value::Undefined(key.Str());
    }
    if (obj.is_list()) {
      int64_t i = key.as_int();
      const int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined("[" + key.Str() + "]");
      return obj.list()[i];
    }
    const std::u32string u = ToU32(obj.as_string());
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(u.size());
    if (i < 0 || i >= static_cast<int64_t>(u.size())) return Value::Undefined("[" + key.Str() + "]");
    return Value(FromU32(u.substr(i, 1)));
  }
  if (obj.is_undefined()) return InvalidArgument("UndefinedError: '{}' is undefined", obj.as_string());
  return Value::Undefined(key.Str());
}

StatusOr<Value> Slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const int64_t step = step_v.is_undefined() || step_v.is_none() ? 1 : step_v.as_int();
  if (step == 0) return InvalidArgument("ValueError: slice step cannot be zero");
  std::u32string u;
  int64_t n;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else if (obj.is_string()) {
    u = ToU32(obj.as_string());
    n = static_cast<int64_t>(u.size());
  } else {
    return TypeError("'" + KindName(obj) + "' object is not subscriptable");
  }
  auto norm = [&](const Value& v, int64_t def) -> int64_t {
    if (v.is_undefined() || v.is_none()) return def;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = norm(start_v, step > 0 ? 0 : n - 1);
  const int64_t stop = norm(stop_v, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
  if (obj.is_list()) {
    ValueList out;
    for (int64_t i : idx) out.push_back(obj.list()[i]);
    return Value::List(std::move(out));
  }
  std::u32string out;
  for (int64_t i : idx) out += u[i];
  return Value(FromU32(out));
}

StatusOr<std::string> PercentFormat(const std::string& f, const Value& args) {
  ValueList list = args.is_list() ? args.list() : ValueList{args};
  size_t k = 0;
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    if (i + 1 >= f.size()) return InvalidArgument("ValueError: incomplete format");
    const char c = f[++i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (k >= list.size()) return TypeError("not enough arguments for format string");
    const Value& v = list[k++];
    if (!CanBuild(out.size())) return out;
    if (c == 's') out += v.Str();
    else if (c == 'r') out += v.Repr();
    else if (c == 'd' || c == 'i') out += std::to_string(v.as_int());
    else if (c == 'f') out += fmt::format("{:.6f}", v.as_float());
    else return InvalidArgument("ValueError: unsupported format character '{}'", c);
  }
  return out;
}

bool HasFilter(const std::string& n) {
  static const std::unordered_set<std::string> kFilters = {
      "tojson", "length", "count", "trim", "default", "d", "string", "upper", "lower", "join", "safe", "items",
      "dictsort", "list", "selectattr", "rejectattr", "select", "reject", "map", "min", "max", "sort", "first",
      "last", "replace", "capitalize", "title", "int", "float", "abs", "round", "unique", "reverse", "indent",
      "sum", "e", "escape", "attr", "wordcount", "center", "format", "batch", "striptags", "truncate", "bool"};
  return kFilters.count(n) > 0;
}

bool HasTest(const std::string& n) {
  static const std::unordered_set<std::string> kTests = {
      "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number", "integer", "float",
      "boolean", "true", "false", "callable", "even", "odd", "divisibleby", "eq", "equalto", "==", "ne", "!=",
      "lt", "<", "lessthan", "le", "<=", "gt", ">", "greaterthan", "ge", ">=", "in", "sameas", "lower", "upper",
      "filter", "test", "escaped"};
  return kTests.count(n) > 0;
}

StatusOr<bool> ApplyTest(const std::string& n, const Value& v, CallArgs& a) {
  if (!ChargeWork()) return ResourceExhausted("{}", CurrentBudget()->exceeded);
  const Value arg = a.Get(0, "other");
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_dict();
  if (n == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (n == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (n == "number") return v.is_int() || v.is_float();
  if (n == "integer") return v.is_int();
  if (n == "float") return v.is_float();
  if (n == "boolean") return v.is_bool();
  if (n == "true") return v.is_bool() && v.as_bool();
  if (n == "false") return v.is_bool() && !v.as_bool();
  if (n == "callable") return v.is_callable();
  if (n == "even" || n == "odd") {
    if (!v.is_int()) return TypeError("even/odd need an integer");
    return (v.as_int() % 2 == 0) == (n == "even");
  }
  if (n == "divisibleby") {
    if (!arg.is_number() || arg.as_int() == 0) return TypeError("divisibleby needs a non-zero number");
    return v.as_int() % arg.as_int() == 0;
  }
  if (n == "eq" || n == "equalto" || n == "==") return v.Equals(arg);
  if (n == "ne" || n == "!=") return !v.Equals(arg);
  if (n == "lt" || n == "<" || n == "lessthan") return v.Less(arg);
  if (n == "gt" || n == ">" || n == "greaterthan") return arg.Less(v);
  if (n == "le" || n == "<=") {
    ASSIGN_OR_RETURN(bool gt, arg.Less(v));
    return !gt;
  }
  if (n == "ge" || n == ">=") {
    ASSIGN_OR_RETURN(bool lt, v.Less(arg));
    return !lt;
  }
  if (n == "in") {
    if (arg.is_string()) return v.is_string() && arg.as_string().find(v.as_string()) != std::string::npos;
    if (arg.is_list()) return std::any_of(arg.list().begin(), arg.list().end(), [&](const Value& e) { return e.Equals(v); });
    if (arg.is_dict()) return arg.dict().Find(v) != nullptr;
    return false;
  }
  if (n == "sameas") return v.SameAs(arg);
  if (n == "lower") return v.is_string() && MapCase(v.as_string(), 0) == v.as_string();
  if (n == "upper") return v.is_string() && MapCase(v.as_string(), 1) == v.as_string();
  if (n == "filter") return arg.is_string() && HasFilter(arg.as_string());
  if (n == "test") return arg.is_string() && HasTest(arg.as_string());
  if (n == "escaped") return false;
  return InvalidArgument("TemplateAssertionError: No test named '{}'", n);
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// The filters: each takes the filter's name (for those registered under several), the value and
// the call's arguments.
namespace {

using FilterFn = StatusOr<Value> (*)(const std::string& n, const Value& v, CallArgs& a);

StatusOr<Value> FilterToJson(const std::string&, const Value& v, CallArgs& a) {
  const Value indent = a.Get(0, "indent");
  const Value seps = a.Get(99, "separators");
  const Value sort = a.Get(99, "sort_keys");
  std::string item_sep = indent.is_int() ? "," : ", ", key_sep = ": ";
  if (seps.is_list() && seps.list().size() == 2) {
    item_sep = seps.list()[0].Str();
    key_sep = seps.list()[1].Str();
  }
  ASSIGN_OR_RETURN(std::string s, v.ToJson(indent.is_int() ? static_cast<int>(indent.as_int()) : -1, item_sep,
                                           key_sep, sort.Truthy()));
  return Value(s);
}

StatusOr<Value> FilterLength(const std::string&, const Value& v, CallArgs&) {
  const int64_t len = LengthOf(v);
  if (len < 0) return TypeError("object of type '" + KindName(v) + "' has no len()");
  return Value(len);
}

StatusOr<Value> FilterDefault(const std::string&, const Value& v, CallArgs& a) {
  const bool boolean = a.Get(1, "boolean").Truthy();
  if (v.is_undefined() || (boolean && !v.Truthy())) return a.Has(0, "default_value") ? a.Get(0, "default_value") : Value("");
  return v;
}

StatusOr<Value> FilterInt(const std::string&, const Value& v, CallArgs& a) {
  if (v.is_number()) return Value(v.as_int());
  if (v.is_string()) {
    try {
      return Value(static_cast<int64_t>(std::stoll(Strip(v.as_string(), Value(), true, true))));
    } catch (...) {
    }
  }
  return a.Has(0, "default") ? a.Get(0, "default") : Value(int64_t{0});
}

StatusOr<Value> FilterFloat(const std::string&, const Value& v, CallArgs& a) {
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    try {
      return Value(std::stod(v.as_string()));
    } catch (...) {
    }
  }
  return a.Has(0, "default") ? a.Get(0, "default") : Value(0.0);
}

StatusOr<Value> FilterAbs(const std::string&, const Value& v, CallArgs&) {
  if (v.is_int()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) return InvalidArgument("OverflowError: abs() out of range");
    return Value(static_cast<int64_t>(std::llabs(v.as_int())));
  }
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  return TypeError("bad operand type for abs()");
}

StatusOr<Value> FilterRound(const std::string&, const Value& v, CallArgs& a) {
  const int64_t prec = a.Has(0, "precision") ? a.Get(0, "precision").as_int() : 0;
  const std::string method = a.Has(1, "method") ? a.Get(1, "method").Str() : "common";
  const double m = std::pow(10.0, static_cast<double>(prec));
  double x = v.as_float() * m;
  x = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
  return Value(x / m);
}

StatusOr<Value> FilterJoin(const std::string&, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  const std::string sep = a.Has(0, "d") ? a.Get(0, "d").Str() : "";
  const Value attr = a.Get(1, "attribute");
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    if (attr.is_string()) {
      ASSIGN_OR_RETURN(Value x, AttrPath(items[i], attr.as_string()));
      out += x.Str();
    } else {
      out += items[i].Str();
    }
  }
  return Value(out);
}

StatusOr<Value> FilterItems(const std::string&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::List();
  if (!v.is_dict()) return TypeError("items needs a mapping");
  ValueList out;
  for (const auto& [k, x] : v.dict().items) out.push_back(Value::List({k, x}));
  return Value::List(std::move(out));
}

StatusOr<Value> FilterDictSort(const std::string&, const Value& v, CallArgs& a) {
  if (!v.is_dict()) return TypeError("dictsort needs a mapping");
  const bool case_sensitive = a.Get(0, "case_sensitive").Truthy();
  const bool by_value = a.Get(1, "by").Str() == "value";
  const bool reverse = a.Get(2, "reverse").Truthy();
  ValueList sorted;
  for (const auto& [k, x] : v.dict().items) sorted.push_back(Value::List({k, x}));
  Status err;
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Value& p, const Value& q) {
    Value x = p.list()[by_value ? 1 : 0], y = q.list()[by_value ? 1 : 0];
    if (!case_sensitive && x.is_string()) x = Value(MapCase(x.as_string(), 0));
    if (!case_sensitive && y.is_string()) y = Value(MapCase(y.as_string(), 0));
    auto lt = reverse ? y.Less(x) : x.Less(y);
    if (!lt.ok()) err = lt.status();
    return lt.ok() && *lt;
  });
  if (!err.ok()) return err;
  return Value::List(std::move(sorted));
}

StatusOr<Value> FilterFirstLast(const std::string& n, const Value& v, CallArgs&) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  if (items.empty()) return Value::Undefined(n);
  return n == "first" ? items.front() : items.back();
}

StatusOr<Value> FilterReverse(const std::string&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::u32string u = ToU32(v.as_string());
    std::reverse(u.begin(), u.end());
    return Value(FromU32(u));
  }
  ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::List(std::move(items));
}

StatusOr<Value> FilterUnique(const std::string&, const Value& v, CallArgs&) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  ValueList out;
  for (auto& x : items) {
    if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return y.Equals(x); })) out.push_back(x);
  }
  return Value::List(std::move(out));
}

StatusOr<Value> FilterMinMax(const std::string& n, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  if (items.empty()) return Value::Undefined(n);
  ASSIGN_OR_RETURN(Value sorted, SortValues(std::move(items), false, a.Get(0, "case_sensitive").Truthy(),
                                            a.Get(1, "attribute")));
  return n == "min" ? sorted.list().front() : sorted.list().back();
}

StatusOr<Value> FilterSum(const std::string&, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  const Value attr = a.Get(0, "attribute");
  Value total = a.Has(1, "start") ? a.Get(1, "start") : Value(int64_t{0});
  for (auto& x : items) {
    Value y = x;
    if (attr.is_string()) {
      ASSIGN_OR_RETURN(y, AttrPath(x, attr.as_string()));
    }
    if (!y.is_number()) return TypeError("sum needs numbers");
    if (total.is_float() || y.is_float()) {
      total = Value(total.as_float() + y.as_float());
      continue;
    }
    int64_t t = 0;
    if (__builtin_add_overflow(total.as_int(), y.as_int(), &t)) return InvalidArgument("OverflowError: sum out of range");
    total = Value(t);
  }
  return total;
}

// selectattr, rejectattr, select, reject.
StatusOr<Value> FilterSelect(const std::string& n, const Value& v, CallArgs& a) {
  // Jinja2 iterates only a truthy sequence: none gives nothing.
  ASSIGN_OR_RETURN(ValueList items, v.Truthy() ? Iterate(v) : StatusOr<ValueList>(ValueList{}));
  const bool by_attr = n == "selectattr" || n == "rejectattr";
  const bool keep_if = n == "selectattr" || n == "select";
  const size_t test_pos = by_attr ? 1 : 0;
  ValueList out;
  for (auto& x : items) {
    Value subject = x;
    if (by_attr) {
      ASSIGN_OR_RETURN(subject, AttrPath(x, a.Get(0, "attribute").Str()));
    }
    bool pass;
    if (a.args.size() > test_pos) {
      CallArgs test_args;
      for (size_t i = test_pos + 1; i < a.args.size(); ++i) test_args.args.push_back(a.args[i]);
      ASSIGN_OR_RETURN(pass, ApplyTest(a.args[test_pos].Str(), subject, test_args));
    } else {
      pass = subject.Truthy();
    }
    if (pass == keep_if) out.push_back(x);
  }
  return Value::List(std::move(out));
}

StatusOr<Value> FilterMap(const std::string&, const Value& v, CallArgs& a) {
  ASSIGN_OR_RETURN(ValueList items, v.Truthy() ? Iterate(v) : StatusOr<ValueList>(ValueList{}));
  ValueList out;
  const Value attr = a.Get(99, "attribute");
  for (auto& x : items) {
    if (attr.is_string()) {
      ASSIGN_OR_RETURN(Value y, AttrPath(x, attr.as_string()));
      if (y.is_undefined() && a.Has(99, "default")) y = a.Get(99, "default");
      out.push_back(y);
    } else {
      if (a.args.empty()) return TypeError("map needs a filter name or attribute=");
      CallArgs fa;
      for (size_t i = 1; i < a.args.size(); ++i) fa.args.push_back(a.args[i]);
      ASSIGN_OR_RETURN(Value y, ApplyFilter(a.args[0].Str(), x, fa));
      out.push_back(y);
    }
  }
  return Value::List(std::move(out));
}

StatusOr<Value> FilterIndent(const std::string&, const Value& v, CallArgs& a) {
  const Value w = a.Get(0, "width");
  const int64_t width = w.is_number() ? std::max<int64_t>(0, w.as_int()) : 4;
  if (!w.is_string() && !CanBuild(static_cast<size_t>(std::min<int64_t>(width, int64_t{1} << 40)))) {
    return ResourceExhausted("indent width {} too large", width);
  }
  const std::string pad = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(width), ' ');
  const bool first = a.Get(1, "first").Truthy(), blank = a.Get(2, "blank").Truthy();
  const std::string s = v.Str();
  if (!CanBuild(s.size() + pad.size() * (std::count(s.begin(), s.end(), '\n') + 1))) {
    return ResourceExhausted("indent result too large");
  }
  std::string out;
  size_t start = 0;
  bool is_first = true;
  while (true) {
    const size_t nl = s.find('\n', start);
    const std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if ((!is_first || first) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
    is_first = false;
  }
  return Value(out);
}

StatusOr<Value> FilterCenter(const std::string&, const Value& v, CallArgs& a) {
  const int64_t width = a.Has(0, "width") ? a.Get(0, "width").as_int() : 80;
  std::string s = v.Str();
  const int64_t len = static_cast<int64_t>(ToU32(s).size());
  if (len >= width) return Value(s);
  if (!CanBuild(static_cast<size_t>(std::min<int64_t>(width, int64_t{1} << 40)) + s.size())) {
    return ResourceExhausted("center width {} too large", width);
  }
  const int64_t total = width - len, left = total / 2 + (total & width & 1);
  return Value(std::string(left, ' ') + s + std::string(total - left, ' '));
}

const std::unordered_map<std::string, FilterFn>& Filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = {
      {"safe", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return v.is_markup() ? v : Value::Markup(v.Str());
       }},
      {"string", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return v.is_markup() ? v : Value(v.Str());
       }},
      {"e", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return v.is_markup() ? v : Value::Markup(HtmlEscape(v.Str()));
       }},
      {"escape", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return v.is_markup() ? v : Value::Markup(HtmlEscape(v.Str()));
       }},
      {"tojson", FilterToJson},
      {"length", FilterLength},
      {"count", FilterLength},
      {"default", FilterDefault},
      {"d", FilterDefault},
      {"trim", [](const std::string&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         return Value(Strip(v.Str(), a.Get(0, "chars"), true, true));
       }},
      {"upper", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> { return Value(MapCase(v.Str(), 1)); }},
      {"lower", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> { return Value(MapCase(v.Str(), 0)); }},
      {"capitalize", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> { return Value(MapCase(v.Str(), 3)); }},
      {"title", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> { return Value(MapCase(v.Str(), 2)); }},
      {"replace", [](const std::string&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         const Value c = a.Get(2, "count");
         return Value(Replace(v.Str(), a.Get(0, "old").Str(), a.Get(1, "new").Str(), c.is_int() ? c.as_int() : -1));
       }},
      {"int", FilterInt},
      {"float", FilterFloat},
      {"bool", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> { return Value(v.Truthy()); }},
      {"abs", FilterAbs},
      {"round", FilterRound},
      {"join", FilterJoin},
      {"list", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> {
         ASSIGN_OR_RETURN(ValueList items, Iterate(v));
         return Value::List(std::move(items));
       }},
      {"items", FilterItems},
      {"dictsort", FilterDictSort},
      {"first", FilterFirstLast},
      {"last", FilterFirstLast},
      {"reverse", FilterReverse},
      {"sort", [](const std::string&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         ASSIGN_OR_RETURN(ValueList items, Iterate(v));
         return SortValues(std::move(items), a.Get(0, "reverse").Truthy(), a.Get(1, "case_sensitive").Truthy(),
                           a.Get(2, "attribute"));
       }},
      {"unique", FilterUnique},
      {"min", FilterMinMax},
      {"max", FilterMinMax},
      {"sum", FilterSum},
      {"selectattr", FilterSelect},
      {"rejectattr", FilterSelect},
      {"select", FilterSelect},
      {"reject", FilterSelect},
      {"map", FilterMap},
      {"attr", [](const std::string&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         return GetAttribute(v, a.Get(0, "name").Str());
       }},
      {"indent", FilterIndent},
      {"wordcount", [](const std::string&, const Value& v, CallArgs&) -> StatusOr<Value> {
         return Value(static_cast<int64_t>(Split(v.Str(), Value(), -1).size()));
       }},
      {"center", FilterCenter},
      {"format", [](const std::string&, const Value& v, CallArgs& a) -> StatusOr<Value> {
         ValueList args = a.args;
         ASSIGN_OR_RETURN(std::string s, PercentFormat(v.Str(), Value::List(std::move(args))));
         return Value(s);
       }},
  };
  return kFilters;
}

}  // namespace

StatusOr<Value> ApplyFilter(const std::string& n, const Value& v, CallArgs& a) {
  // Filters run per item inside other filters (map, select): stop as soon as the render is over
  // budget. Work counts the bytes a string filter reads, so the time limit is checked often enough.
  if (!ChargeWork(1 + static_cast<int64_t>(v.as_string().size() >> 8))) {
    return ResourceExhausted("{}", CurrentBudget()->exceeded);
  }
  const auto& filters = Filters();
  if (auto it = filters.find(n); it != filters.end()) return it->second(n, v, a);
  return InvalidArgument("TemplateAssertionError: filter '{}' is not supported", n);
}

}  // namespace gale::jinja
