// The parsed form of a template: expressions and statements as plain tagged structs. Built by
// parser.cc, walked by render.cc; no behaviour here.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace gale::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args: items
    kTuple,     // args: items
    kDict,      // kwargs-like pairs in dict_items
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]] (null parts allowed)
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs)
    kTest,      // args[0] is [not] name(args[1..])
    kUnary,     // op args[0]: "-", "+", "not"
    kBinary,    // args[0] op args[1]: + - * / // % ** ~ and or in notin
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...
    kCond,      // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;  // name, attribute, filter, test or operator
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::pair<ExprPtr, ExprPtr>> dict_items;
  std::vector<std::string> ops;
};

struct Node;
using NodeList = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches: (cond or null for else, body)
    kFor,          // for targets in expr [if filter] body [else else_body]
    kSet,          // set targets = expr; or set ns.attr = expr (attr_target)
    kSetBlock,     // set targets[0] %} body {% endset (optionally filtered by filter_name)
    kMacro,        // macro name(params) body
    kCallBlock,    // call [(caller params)] expr %} body {% endcall
    kFilterBlock,  // filter name(args) body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter_cond;                                 // for ... if cond
  std::vector<std::pair<ExprPtr, NodeList>> branches;  // if / elif / else
  std::vector<std::string> targets;                    // for / set names
  std::string attr_target;                             // set ns.attr: the attribute (targets[0] is ns)
  std::vector<std::pair<std::string, ExprPtr>> params; // macro / caller parameters with defaults
  NodeList body, else_body;
  bool recursive = false;
};

struct ParsedTemplate {
  NodeList nodes;
};

}  // namespace gale::jinja
