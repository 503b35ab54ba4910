// The renderer: walks the parsed template over a frame stack of variables with Jinja2's scoping
// (a for loop's body has its own frame; a macro sees the template's top level and its own
// arguments, not its caller's locals), and the sandbox limits of RenderOptions.
#include <array>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "jinja/budget.h"
#include "jinja/builtins.h"
#include "jinja/template.h"

namespace gale::jinja {
namespace {

Status WithLine(int line, const Status& s) {
  if (s.ok() || s.message().rfind("line ", 0) == 0 || s.message().find("TemplateSyntaxError") == 0) return s;
  return Status(s.code(), fmt::format("line {}: {}", line, s.message()));
}

Status Undefined(const Value& v) { return InvalidArgument("UndefinedError: '{}' is undefined", v.as_string()); }

class Renderer {
 public:
  static constexpr size_t kMaxItems = 1000000;

  Renderer(const RenderOptions& o, std::shared_ptr<RenderBudget> budget) : opt_(o), budget_(std::move(budget)) {}

  Status Run(const NodeList& nodes, const Value& context, std::string* out) {
    frames_.emplace_back();
    if (context.is_dict()) {
      for (const auto& [k, v] : context.dict().items) frames_[0][k.Str()] = v;
    }
    AddGlobals();
    auto flow = Exec(nodes, out);
    return flow.status();
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Frame = std::unordered_map<std::string, Value>;

  void AddGlobals() {
    Frame& g = frames_[0];
    g["raise_exception"] = Value::Callable("raise_exception", [](CallArgs& a) -> StatusOr<Value> {
      return InvalidArgument("TemplateError: {}", a.Get(0, "message").Str());
    });
    g["strftime_now"] = Value::Callable("strftime_now", [this](CallArgs& a) -> StatusOr<Value> {
      std::tm tm{};
      if (opt_.now) {
        tm = *opt_.now;
      } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      const std::string f = a.Get(0, "format").Str();
      char buf[512];
      const size_t n = f.empty() ? 0 : std::strftime(buf, sizeof(buf), f.c_str(), &tm);
      return Value(std::string(buf, n));
    });
    g["range"] = Value::Callable("range", [](CallArgs& a) -> StatusOr<Value> {
      int64_t start = 0, stop, step = 1;
      if (a.args.size() == 1) {
        stop = a.args[0].as_int();
      } else if (a.args.size() >= 2) {
        start = a.args[0].as_int();
        stop = a.args[1].as_int();
        if (a.args.size() >= 3) step = a.args[2].as_int();
      } else {
        return InvalidArgument("TypeError: range expected at least 1 argument");
      }
      if (step == 0) return InvalidArgument("ValueError: range() arg 3 must not be zero");
      ValueList out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (out.size() >= 1000000) return ResourceExhausted("range() longer than 1000000 items");
        if ((out.size() & 1023) == 0 && !ChargeWork(1024)) return ResourceExhausted("{}", CurrentBudget()->exceeded);
        out.emplace_back(i);
        if (__builtin_add_overflow(i, step, &i)) break;  // past int64's end: past stop too
      }
      return Value::List(std::move(out));
    });
    auto make_dict = [](bool ns) {
      return [ns](CallArgs& a) -> StatusOr<Value> {
        ValueDict d;
        for (const auto& p : a.args) {
          if (!p.is_dict()) return InvalidArgument("TypeError: {}() takes keyword arguments or a mapping", ns ? "namespace" : "dict");
          for (const auto& [k, v] : p.dict().items) d.Set(k, v);
        }
        for (const auto& [k, v] : a.kwargs) d.Set(Value(k), v);
        return ns ? Value::Namespace(std::move(d)) : Value::Dict(std::move(d));
      };
    };
    g["namespace"] = Value::Callable("namespace", make_dict(true));
    g["dict"] = Value::Callable("dict", make_dict(false));
  }

  Status Step() {
    if (++steps_ > opt_.max_steps) return ResourceExhausted("template ran more than {} steps", opt_.max_steps);
    if ((steps_ & 255) == 0) budget_->CheckDeadline();
    if (!budget_->ok()) return ResourceExhausted("{}", budget_->exceeded);
    return Status::Ok();
  }

  // Every value an expression yields is within the sandbox's limits.
  Status CheckValue(const Value& v) {
    if (!budget_->ok()) return ResourceExhausted("{}", budget_->exceeded);
    if (v.depth() > kMaxDepth) return ResourceExhausted("a template value nests deeper than {}", kMaxDepth);
    if (v.is_string() && !CanBuild(v.as_string().size())) return ResourceExhausted("{}", budget_->exceeded);
    if (v.is_list() && v.list().size() > kMaxItems) return ResourceExhausted("a template list has more than {} items", kMaxItems);
    return Status::Ok();
  }

  Status Append(std::string* out, const std::string& s) {
    if (out->size() + s.size() > opt_.max_output_bytes) {
      return ResourceExhausted("template output exceeds {} bytes", opt_.max_output_bytes);
    }
    *out += s;
    return Status::Ok();
  }

  Value Lookup(const std::string& name) const {
    for (size_t i = frames_.size(); i-- > floor_;) {
      auto it = frames_[i].find(name);
      if (it != frames_[i].end()) return it->second;
    }
    auto it = frames_[0].find(name);
    if (it != frames_[0].end()) return it->second;
    return Value::Undefined(name);
  }

  void Assign(const std::string& name, Value v) { frames_.back()[name] = std::move(v); }

  Status AssignTargets(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      Assign(targets[0], v);
      return Status::Ok();
    }
    if (!v.is_list() || v.list().size() != targets.size()) {
      return InvalidArgument("ValueError: cannot unpack {} into {} names", v.Repr(), targets.size());
    }
    for (size_t i = 0; i < targets.size(); ++i) Assign(targets[i], v.list()[i]);
    return Status::Ok();
  }

  StatusOr<Flow> Exec(const NodeList& nodes, std::string* out) {
    for (const auto& n : nodes) {
      auto f = ExecNode(*n, out);
      if (!f.ok()) return WithLine(n->line, f.status());
      if (*f != Flow::kNormal) return *f;
    }
    return Flow::kNormal;
  }

  StatusOr<std::string> RenderBody(const NodeList& nodes) {
    std::string s;
    ASSIGN_OR_RETURN(Flow f, Exec(nodes, &s));
    (void)f;
    return s;
  }

  // Applies a filter chain parsed around a placeholder (set-block and filter-block bodies).
  StatusOr<Value> ApplyChain(const Expr& chain, Value base) {
    if (chain.kind != Expr::Kind::kFilter) return base;
    ASSIGN_OR_RETURN(Value inner, ApplyChain(*chain.args[0], std::move(base)));
    ASSIGN_OR_RETURN(CallArgs args, EvalArgs(chain, 1));
    return ApplyFilter(chain.name, inner, args);
  }

  StatusOr<Flow> ExecNode(const Node& n, std::string* out) {
    RETURN_IF_ERROR(Step());
    switch (n.kind) {
      case Node::Kind::kText:
        RETURN_IF_ERROR(Append(out, n.text));
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        RETURN_IF_ERROR(Append(out, v.Str()));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          bool take = true;
          if (cond) {
            ASSIGN_OR_RETURN(Value c, Eval(*cond));
            take = c.Truthy();
          }
          if (take) return Exec(body, out);
        }
        return Flow::kNormal;
      case Node::Kind::kFor: return ExecFor(n, out);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        if (!n.attr_target.empty()) {
          Value ns = Lookup(n.targets[0]);
          if (!ns.is_namespace()) {
            return InvalidArgument("TemplateRuntimeError: cannot assign attribute on non-namespace object '{}'",
                                   n.targets[0]);
          }
          // NOTE: a namespace attribute never holds a namespace (Jinja2 allows it; no real
          // template does it): so no namespace can contain itself, and a namespace's nesting,
          // which grows after it was put in other values, stays bounded (value.h, depth()).
          if (v.holds_namespace()) {
            return InvalidArgument("TemplateRuntimeError: namespace attribute '{}.{}' cannot hold a namespace",
                                   n.targets[0], n.attr_target);
          }
          ns.dict().Set(Value(n.attr_target), std::move(v));
          return Flow::kNormal;
        }
        RETURN_IF_ERROR(AssignTargets(n.targets, v));
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        ASSIGN_OR_RETURN(std::string s, RenderBody(n.body));
        Value v(std::move(s));
        if (n.expr) {
          ASSIGN_OR_RETURN(v, ApplyChain(*n.expr, std::move(v)));
        }
        Assign(n.targets[0], std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kFilterBlock: {
        ASSIGN_OR_RETURN(std::string s, RenderBody(n.body));
        ASSIGN_OR_RETURN(Value v, ApplyChain(*n.expr, Value(std::move(s))));
        RETURN_IF_ERROR(Append(out, v.Str()));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        Assign(n.text, MakeMacro(n, n.text, /*is_caller=*/false));
        return Flow::kNormal;
      case Node::Kind::kCallBlock: {
        if (n.expr->kind != Expr::Kind::kCall) return InvalidArgument("TemplateSyntaxError: {{% call %}} needs a call");
        ASSIGN_OR_RETURN(Value callee, Eval(*n.expr->args[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(*n.expr, 1));
        args.kwargs.emplace_back("caller", MakeMacro(n, "caller", /*is_caller=*/true));
        ASSIGN_OR_RETURN(Value v, CallValue(callee, args));
        RETURN_IF_ERROR(Append(out, v.Str()));
        return Flow::kNormal;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  StatusOr<Flow> ExecFor(const Node& n, std::string* out) {
    ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
    ASSIGN_OR_RETURN(ValueList items, Iterate(seq));
    frames_.emplace_back();
    struct Pop {
      std::vector<Frame>& f;
      ~Pop() { f.pop_back(); }
    } pop{frames_};
    if (n.filter_cond) {
      ValueList kept;
      for (const Value& item : items) {
        RETURN_IF_ERROR(AssignTargets(n.targets, item));
        ASSIGN_OR_RETURN(Value c, Eval(*n.filter_cond));
        if (c.Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    static const std::array<const char*, 12> kLoopKeys = {"index", "index0", "revindex", "revindex0", "first", "last",
                                                         "length", "depth", "depth0", "previtem", "nextitem", "cycle"};
    std::vector<Value> loop_keys(kLoopKeys.begin(), kLoopKeys.end());
    auto cycle_idx = std::make_shared<int64_t>(0);
    const Value cycle = Value::Callable("cycle", [cycle_idx](CallArgs& a) -> StatusOr<Value> {
      if (a.args.empty()) return InvalidArgument("TypeError: no items for cycling given");
      return a.args[static_cast<size_t>(*cycle_idx) % a.args.size()];
    });
    for (int64_t i = 0; i < len; ++i) {
      RETURN_IF_ERROR(Step());
      // Each iteration starts from a fresh frame: a `set` in the body does not carry over to the
      // next iteration (Jinja2's scoping; templates use namespace() to carry values).
      frames_.back().clear();
      RETURN_IF_ERROR(AssignTargets(n.targets, items[i]));
      // NOTE: built by position, not Set (no key search), from keys made once per loop: this dict
      // is made on every iteration of every loop.
      ValueDict loop;
      loop.items.reserve(kLoopKeys.size());
      const Value fields[] = {Value(i + 1), Value(i), Value(len - i), Value(len - i - 1), Value(i == 0),
                              Value(i == len - 1), Value(len), Value(int64_t{1}), Value(int64_t{0}),
                              i > 0 ? items[i - 1] : Value::Undefined("previtem"),
                              i + 1 < len ? items[i + 1] : Value::Undefined("nextitem"), cycle};
      for (size_t k = 0; k < kLoopKeys.size(); ++k) loop.items.emplace_back(loop_keys[k], fields[k]);
      *cycle_idx = i;
      Assign("loop", Value::Dict(std::move(loop)));
      ASSIGN_OR_RETURN(Flow f, Exec(n.body, out));
      if (f == Flow::kBreak) break;
    }
    if (len == 0 && !n.else_body.empty()) {
      ASSIGN_OR_RETURN(Flow f, Exec(n.else_body, out));
      (void)f;
    }
    return Flow::kNormal;
  }

  Value MakeMacro(const Node& n, const std::string& name, bool is_caller) {
    const Node* node = &n;
    return Value::Callable(name, [this, node, is_caller](CallArgs& a) -> StatusOr<Value> {
      if (++depth_ > opt_.max_call_depth) {
        --depth_;
        return ResourceExhausted("macro calls nested deeper than {}", opt_.max_call_depth);
      }
      const size_t saved_floor = floor_;
      // A macro sees the top level and its arguments; a caller block also sees its call site.
      if (!is_caller) floor_ = frames_.size();
      frames_.emplace_back();
      Frame& f = frames_.back();
      for (size_t i = 0; i < node->params.size(); ++i) {
        const auto& [pname, def] = node->params[i];
        Value v = a.Get(i, pname.c_str());
        if (v.is_undefined() && def) {
          auto d = Eval(*def);
          if (!d.ok()) {
            frames_.pop_back();
            floor_ = saved_floor;
            --depth_;
            return d.status();
          }
          v = *d;
        }
        if (v.is_undefined()) v = Value::Undefined(pname);
        f[pname] = v;
      }
      for (const auto& [k, v] : a.kwargs) {
        if (k == "caller") frames_.back()[k] = v;
      }
      auto s = RenderBody(node->body);
      frames_.pop_back();
      floor_ = saved_floor;
      --depth_;
      if (!s.ok()) return s.status();
      return Value(*s);
    });
  }

  StatusOr<Value> CallValue(const Value& callee, CallArgs& args) {
    if (callee.is_undefined()) return Undefined(callee);
    if (!callee.is_callable()) return InvalidArgument("TypeError: '{}' object is not callable", callee.Str());
    return callee.fn()(args);
  }

  StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      a.args.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*x));
      a.kwargs.emplace_back(k, std::move(v));
    }
    return a;
  }

  // Python's integers grow without bound; a template's are int64, and a result past it is an
  // error rather than a wrapped (undefined) value.
  static StatusOr<Value> IntResult(bool overflow, int64_t v, const std::string& op) {
    if (overflow) return InvalidArgument("OverflowError: integer result of '{}' out of range", op);
    return Value(v);
  }

  static StatusOr<Value> IntPower(int64_t base, int64_t e) {
    int64_t v = 1;
    bool overflow = false;
    while (e > 0 && !overflow) {
      if (e & 1) overflow |= __builtin_mul_overflow(v, base, &v);
      e >>= 1;
      // The squared base is a factor of the result whenever bits remain.
      if (e > 0) overflow |= __builtin_mul_overflow(base, base, &base);
    }
    return IntResult(overflow, v, "**");
  }

  StatusOr<Value> Arith(const std::string& op, const Value& l, const Value& r) {
    if (op == "~") return Value(l.Str() + r.Str());
    if (l.is_undefined()) return Undefined(l);
    if (r.is_undefined()) return Undefined(r);
    const bool nums = l.is_number() && r.is_number();
    const bool floats = nums && (l.is_float() || r.is_float());
    if (op == "+") {
      if (nums && floats) return Value(l.as_float() + r.as_float());
      if (nums) {
        int64_t v = 0;
        const bool overflow = __builtin_add_overflow(l.as_int(), r.as_int(), &v);
        return IntResult(overflow, v, op);
      }
      if (l.is_string() && r.is_string()) {
        if (l.is_markup() || r.is_markup()) {
          return Value::Markup((l.is_markup() ? l.as_string() : HtmlEscape(l.as_string())) +
                               (r.is_markup() ? r.as_string() : HtmlEscape(r.as_string())));
        }
        return Value(l.as_string() + r.as_string());
      }
      if (l.is_list() && r.is_list()) {
        ValueList v = l.list();
        v.insert(v.end(), r.list().begin(), r.list().end());
        return Value::List(std::move(v));
      }
    } else if (op == "-") {
      if (nums && floats) return Value(l.as_float() - r.as_float());
      if (nums) {
        int64_t v = 0;
        const bool overflow = __builtin_sub_overflow(l.as_int(), r.as_int(), &v);
        return IntResult(overflow, v, op);
      }
    } else if (op == "*") {
      if (nums && floats) return Value(l.as_float() * r.as_float());
      if (nums) {
        int64_t v = 0;
        const bool overflow = __builtin_mul_overflow(l.as_int(), r.as_int(), &v);
        return IntResult(overflow, v, op);
      }
      const Value* s = l.is_string() || l.is_list() ? &l : &r;
      const Value* k = s == &l ? &r : &l;
      if ((s->is_string() || s->is_list()) && k->is_int()) {
        const int64_t times = std::max<int64_t>(0, k->as_int());
        if (s->is_string()) {
          if (!CanBuild(static_cast<size_t>(std::min<double>(static_cast<double>(s->as_string().size()) * times, 1e18)))) {
            return ResourceExhausted("string repetition too large: {}", budget_->exceeded);
          }
          std::string out;
          for (int64_t i = 0; i < times; ++i) out += s->as_string();
          return Value(out);
        }
        ValueList out;
        if (static_cast<double>(s->list().size()) * times > kMaxItems) {
          return ResourceExhausted("list repetition over {} items", kMaxItems);
        }
        for (int64_t i = 0; i < times; ++i) out.insert(out.end(), s->list().begin(), s->list().end());
        return Value::List(std::move(out));
      }
    } else if (op == "/") {
      if (nums) {
        if (r.as_float() == 0.0) return InvalidArgument("ZeroDivisionError: division by zero");
        return Value(l.as_float() / r.as_float());
      }
    } else if (op == "//" || op == "%") {
      if (l.is_string() && op == "%") {
        ASSIGN_OR_RETURN(std::string s, PercentFormat(l.as_string(), r));
        return Value(s);
      }
      if (nums) {
        if (r.as_float() == 0.0) return InvalidArgument("ZeroDivisionError: integer division or modulo by zero");
        if (floats) {
          const double q = std::floor(l.as_float() / r.as_float());
          return op == "//" ? Value(q) : Value(l.as_float() - q * r.as_float());
        }
        const int64_t a = l.as_int(), b = r.as_int();
        if (b == -1) {  // a / -1 overflows for the smallest a; the remainder is always 0
          if (op == "%") return Value(int64_t{0});
          int64_t q = 0;
          const bool overflow = __builtin_sub_overflow(int64_t{0}, a, &q);
          return IntResult(overflow, q, op);
        }
        // Python floors: the remainder takes the divisor's sign. Neither step can overflow (q * b
        // can: floor(a / b) * b lies below a, which may already be near the smallest int64).
        const int64_t rem = a % b;
        const bool adjust = rem != 0 && ((rem < 0) != (b < 0));
        if (op == "%") return Value(adjust ? rem + b : rem);
        return Value(a / b - (adjust ? 1 : 0));
      }
    } else if (op == "**") {
      if (nums) {
        if (!floats && r.as_int() >= 0) return IntPower(l.as_int(), r.as_int());
        return Value(std::pow(l.as_float(), r.as_float()));
      }
    }
    return InvalidArgument("TypeError: unsupported operand type(s) for {}: {} and {}", op, l.Repr(), r.Repr());
  }

  StatusOr<bool> Compare(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return l.Equals(r);
    if (op == "!=") return !l.Equals(r);
    if (op == "<") return l.Less(r);
    if (op == ">") return r.Less(l);
    if (op == "<=") {
      ASSIGN_OR_RETURN(bool gt, r.Less(l));
      return !gt;
    }
    if (op == ">=") {
      ASSIGN_OR_RETURN(bool lt, l.Less(r));
      return !lt;
    }
    CallArgs a;
    a.args.push_back(r);
    if (r.is_undefined()) return op == "notin";
    if (!r.is_string() && !r.is_list() && !r.is_dict()) {
      return InvalidArgument("TypeError: argument of type '{}' is not iterable", r.Str());
    }
    ASSIGN_OR_RETURN(bool in, ApplyTest("in", l, a));
    return op == "in" ? in : !in;
  }

  // Every expression node is a recursive call; chains the parser builds without nesting (a + a +
  // ..., x | f | f ..., a.b.c ...) are bounded here, before they can exhaust the stack.
  StatusOr<Value> Eval(const Expr& e) {
    constexpr int kMaxEvalDepth = 256;
    if (eval_depth_ >= kMaxEvalDepth) return ResourceExhausted("expression nested deeper than {}", kMaxEvalDepth);
    ++eval_depth_;
    StatusOr<Value> v = EvalNode(e);
    --eval_depth_;
    if (v.ok()) RETURN_IF_ERROR(CheckValue(*v));
    return v;
  }

  StatusOr<Value> EvalNode(const Expr& e) {
    RETURN_IF_ERROR(Step());
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& x : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*x));
          items.push_back(std::move(v));
        }
        return Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict d;
        for (const auto& [k, x] : e.dict_items) {
          ASSIGN_OR_RETURN(Value key, Eval(*k));
          ASSIGN_OR_RETURN(Value v, Eval(*x));
          d.Set(std::move(key), std::move(v));
        }
        return Value::Dict(std::move(d));
      }
      case Expr::Kind::kGetAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        if (obj.is_undefined()) return Undefined(obj);
        return GetAttribute(obj, e.name);
      }
      case Expr::Kind::kGetItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        if (obj.is_undefined()) return Undefined(obj);
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        Value parts[3];
        for (int k = 0; k < 3; ++k) {
          if (e.args[k + 1]) {
            ASSIGN_OR_RETURN(parts[k], Eval(*e.args[k + 1]));
          } else {
            parts[k] = Value::None();
          }
        }
        if (obj.is_undefined()) return Undefined(obj);
        return Slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return CallValue(callee, args);
      }
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return ApplyFilter(e.name, v, args);
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, v, args));
        return Value(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (e.name == "not") return Value(!v.Truthy());
        if (v.is_undefined()) return Undefined(v);
        if (!v.is_number()) return InvalidArgument("TypeError: bad operand type for unary {}: {}", e.name, v.Repr());
        if (e.name == "+") return v;
        if (v.is_float()) return Value(-v.as_float());
        int64_t neg = 0;
        const bool overflow = __builtin_sub_overflow(int64_t{0}, v.as_int(), &neg);
        return IntResult(overflow, neg, "-");
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        if (e.name == "and") {
          if (!l.Truthy()) return l;
          return Eval(*e.args[1]);
        }
        if (e.name == "or") {
          if (l.Truthy()) return l;
          return Eval(*e.args[1]);
        }
        ASSIGN_OR_RETURN(Value r, Eval(*e.args[1]));
        return Arith(e.name, l, r);
      }
      case Expr::Kind::kCompare: {
        ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value r, Eval(*e.args[i + 1]));
          ASSIGN_OR_RETURN(bool ok, Compare(e.ops[i], l, r));
          if (!ok) return Value(false);
          l = std::move(r);
        }
        return Value(true);
      }
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value::Undefined("else");
      }
    }
    return Value();
  }

  RenderOptions opt_;
  std::shared_ptr<RenderBudget> budget_;
  std::vector<Frame> frames_;
  size_t floor_ = 1;  // frames below this (except 0) are invisible: a macro's caller's locals
  int64_t steps_ = 0;
  int depth_ = 0;
  int eval_depth_ = 0;
};

// Jinja2 rejects unknown filters and tests when compiling; so do we.
Status CheckNames(const Expr* e) {
  if (e == nullptr) return Status::Ok();
  if (e->kind == Expr::Kind::kFilter && !HasFilter(e->name)) {
    return InvalidArgument("TemplateAssertionError: line {}: No filter named '{}'.", e->line, e->name);
  }
  if (e->kind == Expr::Kind::kTest && !HasTest(e->name)) {
    return InvalidArgument("TemplateAssertionError: line {}: No test named '{}'.", e->line, e->name);
  }
  for (const auto& a : e->args) RETURN_IF_ERROR(CheckNames(a.get()));
  for (const auto& [k, v] : e->kwargs) RETURN_IF_ERROR(CheckNames(v.get()));
  for (const auto& [k, v] : e->dict_items) {
    RETURN_IF_ERROR(CheckNames(k.get()));
    RETURN_IF_ERROR(CheckNames(v.get()));
  }
  return Status::Ok();
}

// NOTE: like Jinja2 3.x, names used inside an {% if %} body are checked only when that body
// runs (templates guard optional filters that way).
Status CheckNames(const NodeList& nodes) {
  for (const auto& n : nodes) {
    RETURN_IF_ERROR(CheckNames(n->expr.get()));
    RETURN_IF_ERROR(CheckNames(n->filter_cond.get()));
    for (const auto& [c, body] : n->branches) RETURN_IF_ERROR(CheckNames(c.get()));
    for (const auto& [p, d] : n->params) RETURN_IF_ERROR(CheckNames(d.get()));
    RETURN_IF_ERROR(CheckNames(n->body));
    RETURN_IF_ERROR(CheckNames(n->else_body));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Template> Template::Parse(std::string_view source, const ParseOptions& options) {
  ASSIGN_OR_RETURN(ParsedTemplate parsed, jinja::Parse(source, options));
  RETURN_IF_ERROR(CheckNames(parsed.nodes));
  Template t;
  t.parsed_ = std::make_shared<const ParsedTemplate>(std::move(parsed));
  return t;
}

namespace {

std::shared_ptr<RenderBudget> MakeBudget(const RenderOptions& options) {
  auto b = std::make_shared<RenderBudget>();
  b->max_live_bytes = static_cast<int64_t>(options.max_live_bytes);
  b->max_value_bytes = static_cast<int64_t>(options.max_value_bytes);
  if (options.max_time.count() > 0) b->cpu_deadline = ThreadCpuTime() + options.max_time;
  return b;
}

StatusOr<std::string> RenderWithin(const ParsedTemplate& t, const Value& context, const RenderOptions& options,
                                   std::shared_ptr<RenderBudget> budget) {
  BudgetScope scope(budget);
  std::string out;
  {
    Renderer r(options, budget);
    RETURN_IF_ERROR(r.Run(t.nodes, context, &out));
  }
  if (!budget->ok()) return ResourceExhausted("{}", budget->exceeded);
  return out;
}

}  // namespace

StatusOr<std::string> Template::Render(const Value& context, const RenderOptions& options) const {
  return RenderWithin(*parsed_, context, options, MakeBudget(options));
}

StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  if (!context.is_object()) return InvalidArgument("the template context must be a JSON object");
  if (JsonDeeperThan(context, kMaxDepth - 1)) {
    return InvalidArgument("the template context nests deeper than {} levels", kMaxDepth - 1);
  }
  auto budget = MakeBudget(options);
  BudgetScope scope(budget);  // the context's values count too
  Value ctx = Value::FromJson(context);
  return RenderWithin(*parsed_, ctx, options, budget);
}

}  // namespace gale::jinja
