// Jinja values: Python-compatible truthiness, str/repr, comparisons and JSON.
#include "jinja/value.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "jinja/budget.h"

namespace gale::jinja {

namespace {

thread_local std::shared_ptr<RenderBudget> tls_budget;

// A shared object whose bytes count against the current render's budget until its last
// reference goes. Over the budget, `fallback` (an empty object) is stored instead, so a runaway
// template cannot keep growing memory before the renderer stops it at its next step.
template <typename T>
std::shared_ptr<T> MakeCounted(T&& obj, int64_t bytes) {
  const std::shared_ptr<RenderBudget>& b = tls_budget;
  if (!b) return std::make_shared<T>(std::move(obj));
  if (b->live_bytes + bytes > b->max_live_bytes) {
    b->Exceed(fmt::format("template values exceed {} bytes", b->max_live_bytes));
    return std::make_shared<T>();
  }
  b->live_bytes += bytes;
  return std::shared_ptr<T>(new T(std::move(obj)), [b, bytes](T* p) {
    b->live_bytes -= bytes;
    delete p;
  });
}

}  // namespace

bool RenderBudget::CheckDeadline() {
  work = 0;
  if (ThreadCpuTime() > cpu_deadline) Exceed("template rendering ran past its time limit");
  return ok();
}

std::chrono::nanoseconds ThreadCpuTime() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

std::shared_ptr<RenderBudget> CurrentBudget() { return tls_budget; }

BudgetScope::BudgetScope(std::shared_ptr<RenderBudget> budget) : previous_(std::move(tls_budget)) {
  tls_budget = std::move(budget);
}

BudgetScope::~BudgetScope() { tls_budget = std::move(previous_); }

bool ChargeWork(int64_t units) {
  RenderBudget* b = tls_budget.get();
  if (b == nullptr) return true;
  if (!b->ok()) return false;
  b->work += units;
  if (b->work >= (1 << 16)) return b->CheckDeadline();
  return true;
}

bool CanBuild(size_t bytes) {
  RenderBudget* b = tls_budget.get();
  if (b == nullptr) return true;
  if (static_cast<int64_t>(bytes) > b->max_value_bytes) {
    b->Exceed(fmt::format("a template value would exceed {} bytes", b->max_value_bytes));
    return false;
  }
  return b->ok();
}

bool JsonDeeperThan(const nlohmann::ordered_json& j, int max_depth) {
  std::vector<std::pair<const nlohmann::ordered_json*, int>> stack = {{&j, 0}};
  while (!stack.empty()) {
    auto [v, d] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (d + 1 > max_depth) return true;
    for (const auto& child : *v) stack.emplace_back(&child, d + 1);
  }
  return false;
}

std::shared_ptr<const std::string> Value::MakeString(std::string s) {
  if (s.empty()) return nullptr;
  const int64_t bytes = static_cast<int64_t>(s.capacity()) + 32;
  return MakeCounted<std::string>(std::move(s), bytes);
}

const std::string& Value::EmptyString() {
  static const std::string kEmpty;
  return kEmpty;
}

const Value* ValueDict::Find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (k.Equals(key) && k.is_string() == key.is_string()) return &v;
  }
  return nullptr;
}

Value* ValueDict::Find(const Value& key) {
  for (auto& [k, v] : items) {
    if (k.Equals(key) && k.is_string() == key.is_string()) return &v;
  }
  return nullptr;
}

const Value* ValueDict::FindString(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(Value key, Value v) {
  if (Value* e = Find(key)) {
    *e = std::move(v);
  } else {
    items.emplace_back(std::move(key), std::move(v));
  }
}

Value Value::List(ValueList items) {
  Value v(Kind::kList);
  for (const Value& e : items) {
    v.depth_ = std::max(v.depth_, e.depth_ + 1);
    v.has_ns_ = v.has_ns_ || e.has_ns_;
  }
  v.depth_ = std::max(v.depth_, 1);
  const int64_t bytes = static_cast<int64_t>(items.capacity() * sizeof(Value)) + 32;
  v.list_ = MakeCounted<ValueList>(std::move(items), bytes);
  return v;
}

Value Value::Dict(ValueDict d) {
  Value v(Kind::kDict);
  for (const auto& [k, e] : d.items) {
    v.depth_ = std::max({v.depth_, k.depth_ + 1, e.depth_ + 1});
    v.has_ns_ = v.has_ns_ || k.has_ns_ || e.has_ns_;
  }
  v.depth_ = std::max(v.depth_, 1);
  const int64_t bytes = static_cast<int64_t>(d.items.capacity() * sizeof(std::pair<Value, Value>)) + 32;
  v.dict_ = MakeCounted<ValueDict>(std::move(d), bytes);
  return v;
}

Value Value::Namespace(ValueDict d) {
  Value v = Dict(std::move(d));
  v.namespace_ = true;
  v.has_ns_ = true;
  return v;
}

Value Value::Callable(std::string name, NativeFn fn) {
  Value v(Kind::kCallable);
  v.str_ = MakeString(std::move(name));
  v.fn_ = std::make_shared<NativeFn>(std::move(fn));
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return !dict_->items.empty();
    case Kind::kCallable: return true;
  }
  return false;
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // fmt's shortest round-trip form is Python's repr (1e-05, 1e+16, 0.1) except that Python
  // keeps ".0" on integral values.
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

namespace {

std::string ReprString(const std::string& s) {
  // Python picks single quotes unless the text has a single quote and no double quote.
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == static_cast<unsigned char>(q)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += q;
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          *out += fmt::format("\\u{:04x}", c);
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return int_ ? "True" : "False";
    case Kind::kInt: return std::to_string(int_);
    case Kind::kFloat: return FloatRepr(float_);
    case Kind::kString: return as_string();
    default: return Repr();
  }
}

// NOTE: within a render, a repr stops early (the result cut short) once it outgrows the
// budget's value size or the budget is otherwise exceeded; the renderer then fails at its next
// step, so a cut result is never printed.
std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kString: return ReprString(as_string());
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!ChargeWork(1 + static_cast<int64_t>(out.size() >> 16)) || !CanBuild(out.size())) return out;
        if (i) out += ", ";
        out += (*list_)[i].Repr();
      }
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = namespace_ ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (!ChargeWork(1 + static_cast<int64_t>(out.size() >> 16)) || !CanBuild(out.size())) return out;
        if (i) out += ", ";
        out += dict_->items[i].first.Repr() + ": " + dict_->items[i].second.Repr();
      }
      return out + (namespace_ ? "}>" : "}");
    }
    case Kind::kCallable: return "<function " + as_string() + ">";
    default: return Str();
  }
}

bool Value::Equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return as_float() == o.as_float();
    return int_ == o.int_;
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString:
      if (str_ == o.str_) return true;
      if (!ChargeWork(1 + static_cast<int64_t>(as_string().size() >> 6))) return false;
      return as_string() == o.as_string();
    case Kind::kList: {
      if (list_ == o.list_) return true;
      if (list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!ChargeWork() || !(*list_)[i].Equals((*o.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (dict_ == o.dict_) return true;
      if (dict_->items.size() != o.dict_->items.size()) return false;
      for (const auto& [k, v] : dict_->items) {
        if (!ChargeWork(1 + static_cast<int64_t>(dict_->items.size()))) return false;
        const Value* ov = o.dict_->Find(k);
        if (ov == nullptr || !v.Equals(*ov)) return false;
      }
      return true;
    }
    case Kind::kCallable: return fn_ == o.fn_;
    default: return false;
  }
}

StatusOr<bool> Value::Less(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return as_float() < o.as_float();
    return int_ < o.int_;
  }
  if (is_string() && o.is_string()) {
    ChargeWork(1 + static_cast<int64_t>(std::min(as_string().size(), o.as_string().size()) >> 6));
    return as_string() < o.as_string();
  }
  if (is_list() && o.is_list()) {
    const size_t n = std::min(list_->size(), o.list_->size());
    for (size_t i = 0; i < n; ++i) {
      if (!ChargeWork()) return false;
      if ((*list_)[i].Equals((*o.list_)[i])) continue;
      return (*list_)[i].Less((*o.list_)[i]);
    }
    return list_->size() < o.list_->size();
  }
  return InvalidArgument("TypeError: '<' not supported between {} and {}", Repr(), o.Repr());
}

bool Value::SameAs(const Value& o) const {
  if (is_list() && o.is_list()) return list_ == o.list_;
  if (is_dict() && o.is_dict()) return dict_ == o.dict_;
  return kind_ == o.kind_ && Equals(o);
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return None();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& e : j) items.push_back(FromJson(e));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(Value(it.key()), FromJson(it.value()));
      return Dict(std::move(d));
    }
    default: return Value();
  }
}

namespace {

Status ToJsonRec(const Value& v, int indent, int depth, const std::string& item_sep, const std::string& key_sep,
                 bool sort_keys, std::string* out) {
  if (depth > 2 * kMaxDepth + 2) return InvalidArgument("tojson: value nested too deeply");
  if (!ChargeWork(1 + static_cast<int64_t>(out->size() >> 16)) || !CanBuild(out->size())) {
    auto b = CurrentBudget();
    return ResourceExhausted("tojson: {}", b ? b->exceeded : "over the limit");
  }
  auto newline = [&](int d) {
    if (indent >= 0 && CanBuild(out->size() + static_cast<size_t>(indent) * d + 1)) {
      *out += '\n';
      out->append(static_cast<size_t>(indent) * d, ' ');
    }
  };
  switch (v.kind()) {
    case Value::Kind::kNone: *out += "null"; return Status::Ok();
    case Value::Kind::kBool: *out += v.as_bool() ? "true" : "false"; return Status::Ok();
    case Value::Kind::kInt: *out += std::to_string(v.as_int()); return Status::Ok();
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : FloatRepr(d);
      return Status::Ok();
    }
    case Value::Kind::kString: JsonString(v.as_string(), out); return Status::Ok();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return Status::Ok();
      }
      *out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        RETURN_IF_ERROR(ToJsonRec(v.list()[i], indent, depth + 1, item_sep, key_sep, sort_keys, out));
      }
      newline(depth);
      *out += ']';
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      if (v.dict().items.empty()) {
        *out += "{}";
        return Status::Ok();
      }
      // json.dumps writes non-string keys as their JSON text (1 -> "1", True -> "true").
      auto key_text = [](const Value& k) -> std::string {
        if (k.is_string()) return k.as_string();
        if (k.is_bool()) return k.as_bool() ? "true" : "false";
        if (k.is_none()) return "null";
        return k.Str();
      };
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& kv : v.dict().items) items.emplace_back(key_text(kv.first), &kv.second);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        JsonString(items[i].first, out);
        *out += key_sep;
        RETURN_IF_ERROR(ToJsonRec(*items[i].second, indent, depth + 1, item_sep, key_sep, sort_keys, out));
      }
      newline(depth);
      *out += '}';
      return Status::Ok();
    }
    case Value::Kind::kUndefined:
      return InvalidArgument("UndefinedError: '{}' is undefined", v.as_string());
    case Value::Kind::kCallable:
      return InvalidArgument("TypeError: Object of type function is not JSON serializable");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> Value::ToJson(int indent, const std::string& item_sep, const std::string& key_sep,
                                    bool sort_keys) const {
  std::string out;
  RETURN_IF_ERROR(ToJsonRec(*this, indent, 0, item_sep, key_sep, sort_keys, &out));
  return out;
}

Value CallArgs::Get(size_t pos, const char* name) const {
  if (pos < args.size()) return args[pos];
  for (const auto& [k, v] : kwargs) {
    if (k == name) return v;
  }
  return Value::Undefined(name);
}

bool CallArgs::Has(size_t pos, const char* name) const {
  if (pos < args.size()) return true;
  for (const auto& kv : kwargs) {
    if (kv.first == name) return true;
  }
  return false;
}

}  // namespace gale::jinja
