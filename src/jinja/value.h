// Values of the Jinja template language as chat templates use them: Python semantics (None,
// bool, int, float, str, list, dict in insertion order, callables) plus Jinja's Undefined. Lists
// and dicts are shared references, as in Python (`ns.items.append(x)` mutates in place).
// Conversion to text follows Python's str()/repr(), and tojson follows json.dumps, so renders
// match the reference Jinja2 engine byte for byte.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace gale::jinja {

class Value;
using ValueList = std::vector<Value>;

// Ordered map with Python dict semantics (keys compare by value: 1 == 1.0; "1" != 1).
struct ValueDict {
  std::vector<std::pair<Value, Value>> items;
  const Value* Find(const Value& key) const;
  Value* Find(const Value& key);
  const Value* FindString(const std::string& key) const;
  void Set(Value key, Value v);
};

struct CallArgs;
using NativeFn = std::function<StatusOr<Value>(CallArgs& args)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() = default;  // undefined
  static Value Undefined(std::string name = "") {
    Value v;
    v.str_ = MakeString(std::move(name));
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  Value(bool b) : kind_(Kind::kBool), int_(b) {}  // NOLINT
  Value(int64_t i) : kind_(Kind::kInt), int_(i) {}  // NOLINT
  Value(int i) : kind_(Kind::kInt), int_(i) {}  // NOLINT
  Value(double d) : kind_(Kind::kFloat), float_(d) {}  // NOLINT
  // Strings are shared, immutable and counted against the current render's budget (budget.h):
  // copying a Value never copies its text.
  Value(std::string s) : kind_(Kind::kString), str_(MakeString(std::move(s))) {}  // NOLINT
  Value(const char* s) : kind_(Kind::kString), str_(MakeString(s)) {}  // NOLINT
  // Markupsafe's Markup (what `|safe` and `|escape` return): text that concatenating with `+`
  // does not escape, while the plain text it is concatenated with is HTML-escaped (a template
  // writing `"..."|safe + obj|tojson` gets &#34; for its quotes, as under Jinja2).
  static Value Markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }
  static Value List(ValueList items = {});
  static Value Dict(ValueDict d = {});
  // A namespace() object: a dict whose entries templates may assign with `set ns.x = ...`.
  static Value Namespace(ValueDict d = {});
  static Value Callable(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && namespace_; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return kind_ == Kind::kFloat ? static_cast<int64_t>(float_) : int_; }
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return str_ ? *str_ : EmptyString(); }  // also an Undefined's name
  ValueList& list() const { return *list_; }
  ValueDict& dict() const { return *dict_; }
  const NativeFn& fn() const { return *fn_; }
  const std::string& callable_name() const { return as_string(); }
  // Containers nested inside this value (0 for a scalar), as of its construction. Lists and plain
  // dicts never change after that; a namespace may gain attributes, but never one holding a
  // namespace (the renderer refuses it), so its real depth exceeds this by at most one value's.
  int depth() const { return depth_; }
  // A namespace, or a container holding one somewhere inside.
  bool holds_namespace() const { return has_ns_; }

  // Python truthiness (Undefined is false).
  bool Truthy() const;
  // Python str(): what {{ value }} prints.
  std::string Str() const;
  // Python repr(): how values appear inside a printed list or dict.
  std::string Repr() const;
  // Python ==.
  bool Equals(const Value& other) const;
  // Python <; error for types that do not order.
  StatusOr<bool> Less(const Value& other) const;
  // Identity for lists/dicts (Jinja's `sameas`), equality otherwise.
  bool SameAs(const Value& other) const;

  // j must be nested at most kMaxDepth deep (JsonDeeperThan checks it without recursion).
  static Value FromJson(const nlohmann::ordered_json& j);
  // json.dumps(value, ensure_ascii=False, indent, separators, sort_keys): indent < 0 is None.
  StatusOr<std::string> ToJson(int indent, const std::string& item_sep, const std::string& key_sep,
                               bool sort_keys) const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  static std::shared_ptr<const std::string> MakeString(std::string s);
  static const std::string& EmptyString();
  Kind kind_ = Kind::kUndefined;
  bool namespace_ = false;
  bool markup_ = false;
  bool has_ns_ = false;
  int32_t depth_ = 0;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::shared_ptr<const std::string> str_;  // null: ""
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<NativeFn> fn_;
};

// Arguments of a call: positional, then keyword (in call order).
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // The argument at position pos or named name; Undefined when absent.
  Value Get(size_t pos, const char* name) const;
  bool Has(size_t pos, const char* name) const;
};

// Deepest nesting of lists and dicts a render builds or accepts; every recursive walk over values
// (str, repr, tojson, comparisons, destruction) is bounded by it.
inline constexpr int kMaxDepth = 256;

// Whether j nests arrays and objects more than max_depth deep; iterative, so any depth is safe.
bool JsonDeeperThan(const nlohmann::ordered_json& j, int max_depth);

// Python's float repr (shortest round trip, always with a '.' or exponent).
std::string FloatRepr(double d);

}  // namespace gale::jinja
