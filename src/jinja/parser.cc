// Lexer and parser. The lexer turns the source into text runs and tag tokens, applying the
// whitespace rules exactly as Jinja2's lexer does; the parser follows Jinja2's grammar and
// operator precedence (or < and < not < comparisons < + - < ~ < * / // % < ** < unary < filters
// and tests < postfix).
#include "jinja/parser.h"

#include <cctype>
#include <cstdlib>
#include <set>

namespace gale::jinja {
namespace {

struct Token {
  enum class Type { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
  Type type;
  std::string text;
  int line;
};

Status SyntaxError(int line, const std::string& msg) {
  return InvalidArgument("TemplateSyntaxError: line {}: {}", line, msg);
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class Lexer {
 public:
  Lexer(std::string_view src, const ParseOptions& o) : src_(src), opt_(o) {}

  StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with '-': drop leading whitespace
    bool line_starting = true;
    while (pos <= src_.size()) {
      size_t start = pos;
      while (true) {
        start = src_.find('{', start);
        if (start == std::string_view::npos || start + 1 >= src_.size()) {
          start = std::string_view::npos;
          break;
        }
        const char k = src_[start + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++start;
      }
      std::string text(src_.substr(pos, start == std::string_view::npos ? std::string_view::npos : start - pos));
      if (strip_next) {
        size_t i = 0;
        while (i < text.size() && IsSpace(text[i])) ++i;
        text.erase(0, i);
      }
      if (start != std::string_view::npos) {
        const char kind = src_[start + 1];
        const char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
        if (mod == '-') {
          size_t e = text.size();
          while (e > 0 && IsSpace(text[e - 1])) --e;
          text.resize(e);
        } else if (opt_.lstrip_blocks && (kind == '%' || kind == '#') && mod != '+') {
          const size_t nl = text.rfind('\n');
          const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
          if (l_pos > 0 || line_starting) {
            bool all_ws = true;
            for (size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && IsSpace(text[i]);
            if (all_ws) text.resize(l_pos);
          }
        }
      }
      if (!text.empty()) Emit(Token::Type::kText, std::move(text));
      line_ += CountLines(pos, start == std::string_view::npos ? src_.size() : start);
      if (start == std::string_view::npos) break;

      const char kind = src_[start + 1];
      pos = start + 2;
      if (pos < src_.size() && (src_[pos] == '-' || src_[pos] == '+')) ++pos;
      bool consumed_newline = false;
      if (kind == '#') {
        const size_t end = src_.find("#}", pos);
        if (end == std::string_view::npos) return SyntaxError(line_, "missing end of comment tag");
        const bool minus = end > pos && src_[end - 1] == '-';
        const bool plus = end > pos && src_[end - 1] == '+';
        line_ += CountLines(pos, end);
        pos = end + 2;
        ApplyTagEnd(minus, plus, &pos, &strip_next, &consumed_newline);
        line_starting = consumed_newline;
        continue;
      }
      const bool is_block = kind == '%';
      Emit(is_block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "");
      bool minus = false, plus = false;
      RETURN_IF_ERROR(LexTag(is_block, &pos, &minus, &plus));
      Emit(is_block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "");
      ApplyTagEnd(minus, plus && is_block, &pos, &strip_next, &consumed_newline, is_block);
      line_starting = consumed_newline;
    }
    Emit(Token::Type::kEof, "");
    return std::move(tokens_);
  }

 private:
  int CountLines(size_t a, size_t b) const {
    int n = 0;
    for (size_t i = a; i < b && i < src_.size(); ++i) n += src_[i] == '\n';
    return n;
  }

  // After a tag: '-' strips the following whitespace; otherwise trim_blocks drops one newline
  // after a block or comment tag (not after {{ }}, and not with '+').
  void ApplyTagEnd(bool minus, bool plus, size_t* pos, bool* strip_next, bool* consumed_newline,
                   bool trims = true) {
    *strip_next = false;
    *consumed_newline = false;
    if (minus) {
      size_t p = *pos;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      *consumed_newline = p > *pos && src_[p - 1] == '\n';
      line_ += CountLines(*pos, p);
      *pos = p;
      return;
    }
    if (trims && opt_.trim_blocks && !plus && *pos < src_.size() && src_[*pos] == '\n') {
      ++*pos;
      ++line_;
      *consumed_newline = true;
    }
  }

  void Emit(Token::Type t, std::string text) { tokens_.push_back({t, std::move(text), line_}); }

  Status LexTag(bool is_block, size_t* pos, bool* minus, bool* plus) {
    const char close = is_block ? '%' : '}';
    size_t p = *pos;
    while (true) {
      while (p < src_.size() && IsSpace(src_[p])) {
        line_ += src_[p] == '\n';
        ++p;
      }
      if (p >= src_.size()) return SyntaxError(line_, is_block ? "unexpected end of template in a {% tag"
                                                                : "unexpected end of template in a {{ tag");
      auto at = [&](std::string_view s) { return src_.substr(p, s.size()) == s; };
      const std::string end2 = std::string(1, close) + "}";
      if (at(end2)) {
        *pos = p + 2;
        return Status::Ok();
      }
      if ((src_[p] == '-' || src_[p] == '+') && src_.substr(p + 1, 2) == end2) {
        *minus = src_[p] == '-';
        *plus = src_[p] == '+';
        *pos = p + 3;
        return Status::Ok();
      }
      const char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        Emit(Token::Type::kName, std::string(src_.substr(p, e - p)));
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t f = e + 1;
          if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
          if (f < src_.size() && std::isdigit(static_cast<unsigned char>(src_[f]))) {
            is_float = true;
            e = f;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string num;
        for (size_t i = p; i < e; ++i) {
          if (src_[i] != '_') num += src_[i];
        }
        Emit(is_float ? Token::Type::kFloat : Token::Type::kInt, num);
        p = e;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t e = p + 1;
        while (true) {
          if (e >= src_.size()) return SyntaxError(line_, "unterminated string");
          const char d = src_[e];
          if (d == c) break;
          if (d == '\n') ++line_;
          if (d == '\\' && e + 1 < src_.size()) {
            const char n = src_[e + 1];
            e += 2;
            switch (n) {
              case 'n': s += '\n'; break;
              case 't': s += '\t'; break;
              case 'r': s += '\r'; break;
              case '\\': s += '\\'; break;
              case '\'': s += '\''; break;
              case '"': s += '"'; break;
              case '0': s += '\0'; break;
              case 'u':
              case 'x': {
                const size_t len = n == 'u' ? 4 : 2;
                if (e + len > src_.size()) return SyntaxError(line_, "bad escape in string");
                const uint32_t cp = static_cast<uint32_t>(std::strtoul(std::string(src_.substr(e, len)).c_str(), nullptr, 16));
                e += len;
                AppendUtf8(cp, &s);
                break;
              }
              case '\n': ++line_; break;  // line continuation
              default:
                s += '\\';
                s += n;
            }
            continue;
          }
          s += d;
          ++e;
        }
        Emit(Token::Type::kString, std::move(s));
        p = e + 1;
      } else {
        static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
        bool matched = false;
        for (const char* op : kOps) {
          if (at(op)) {
            Emit(Token::Type::kOp, op);
            p += std::string_view(op).size();
            matched = true;
            break;
          }
        }
        if (!matched) return SyntaxError(line_, std::string("unexpected character '") + c + "'");
      }
    }
  }

  static void AppendUtf8(uint32_t cp, std::string* s) {
    if (cp < 0x80) {
      *s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *s += static_cast<char>(0xC0 | (cp >> 6));
      *s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *s += static_cast<char>(0xE0 | (cp >> 12));
      *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view src_;
  ParseOptions opt_;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  StatusOr<ParsedTemplate> Run() {
    ParsedTemplate out;
    std::string end_tag;
    RETURN_IF_ERROR(ParseBody({}, &out.nodes, &end_tag));
    return out;
  }

 private:
  using T = Token::Type;
  const Token& Peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& Next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool IsOp(const char* op, size_t k = 0) const { return Peek(k).type == T::kOp && Peek(k).text == op; }
  bool IsName(const char* n, size_t k = 0) const { return Peek(k).type == T::kName && Peek(k).text == n; }
  Status Expect(const char* op) {
    if (!IsOp(op)) return SyntaxError(Peek().line, std::string("expected '") + op + "', got '" + Describe(Peek()) + "'");
    ++i_;
    return Status::Ok();
  }
  Status ExpectName(const char* n) {
    if (!IsName(n)) return SyntaxError(Peek().line, std::string("expected '") + n + "', got '" + Describe(Peek()) + "'");
    ++i_;
    return Status::Ok();
  }
  StatusOr<std::string> Identifier() {
    if (Peek().type != T::kName) return SyntaxError(Peek().line, "expected a name, got '" + Describe(Peek()) + "'");
    return Next().text;
  }
  Status ExpectBlockEnd() {
    if (Peek().type != T::kBlockEnd) return SyntaxError(Peek().line, "expected end of statement block, got '" + Describe(Peek()) + "'");
    ++i_;
    return Status::Ok();
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case T::kEof: return "end of template";
      case T::kBlockEnd: return "%}";
      case T::kVarEnd: return "}}";
      case T::kText: return "text";
      default: return t.text;
    }
  }

  // Parses nodes until one of end_tags opens a block tag ({% end_tag ...); returns its name in
  // *found (the tag name token is consumed, the rest of the tag is not). Empty end_tags: to EOF.
  Status ParseBody(const std::set<std::string>& end_tags, NodeList* out, std::string* found) {
    while (true) {
      const Token& tok = Peek();
      if (tok.type == T::kEof) {
        if (end_tags.empty()) return Status::Ok();
        std::string want;
        for (const auto& e : end_tags) want += (want.empty() ? "'" : " or '") + e + "'";
        return SyntaxError(tok.line, "unexpected end of template; Jinja was looking for " + want);
      }
      if (tok.type == T::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = tok.line;
        n->text = tok.text;
        out->push_back(std::move(n));
        ++i_;
        continue;
      }
      if (tok.type == T::kVarBegin) {
        ++i_;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = tok.line;
        ASSIGN_OR_RETURN(n->expr, ParseExpression());
        if (Peek().type != T::kVarEnd) return SyntaxError(Peek().line, "expected '}}', got '" + Describe(Peek()) + "'");
        ++i_;
        out->push_back(std::move(n));
        continue;
      }
      if (tok.type != T::kBlockBegin) return SyntaxError(tok.line, "unexpected '" + Describe(tok) + "'");
      ++i_;
      ASSIGN_OR_RETURN(std::string tag, Identifier());
      if (end_tags.count(tag)) {
        *found = tag;
        return Status::Ok();
      }
      ASSIGN_OR_RETURN(auto node, ParseStatement(tag, tok.line, end_tags));
      out->push_back(std::move(node));
    }
  }

  StatusOr<std::unique_ptr<Node>> ParseStatement(const std::string& tag, int line, const std::set<std::string>& outer) {
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string found;
    if (tag == "if") {
      n->kind = Node::Kind::kIf;
      ASSIGN_OR_RETURN(ExprPtr cond, ParseExpression());
      RETURN_IF_ERROR(ExpectBlockEnd());
      while (true) {
        NodeList body;
        RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &found));
        n->branches.emplace_back(std::move(cond), std::move(body));
        if (found == "endif") break;
        if (found == "elif") {
          ASSIGN_OR_RETURN(cond, ParseExpression());
          RETURN_IF_ERROR(ExpectBlockEnd());
          continue;
        }
        RETURN_IF_ERROR(ExpectBlockEnd());  // else
        NodeList else_body;
        RETURN_IF_ERROR(ParseBody({"endif"}, &else_body, &found));
        n->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (tag == "for") {
      n->kind = Node::Kind::kFor;
      do {
        ASSIGN_OR_RETURN(std::string target, Identifier());
        n->targets.push_back(target);
      } while (IsOp(",") && (++i_, true));
      RETURN_IF_ERROR(ExpectName("in"));
      ASSIGN_OR_RETURN(n->expr, ParseExpression(/*allow_cond=*/false));
      if (IsName("if")) {
        ++i_;
        ASSIGN_OR_RETURN(n->filter_cond, ParseExpression());
      }
      if (IsName("recursive")) {
        ++i_;
        n->recursive = true;
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &n->body, &found));
      if (found == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        RETURN_IF_ERROR(ParseBody({"endfor"}, &n->else_body, &found));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (tag == "set") {
      ASSIGN_OR_RETURN(std::string target, Identifier());
      n->targets.push_back(target);
      if (IsOp(".")) {
        ++i_;
        ASSIGN_OR_RETURN(n->attr_target, Identifier());
      } else {
        while (IsOp(",")) {
          ++i_;
          ASSIGN_OR_RETURN(std::string more, Identifier());
          n->targets.push_back(more);
        }
      }
      if (IsOp("=")) {
        ++i_;
        n->kind = Node::Kind::kSet;
        ASSIGN_OR_RETURN(n->expr, ParseTupleOrExpression());
        RETURN_IF_ERROR(ExpectBlockEnd());
        return n;
      }
      n->kind = Node::Kind::kSetBlock;
      if (IsOp("|")) {
        // {% set x | filter %}: applied to the block's text.
        ++i_;
        auto holder = std::make_unique<Expr>();
        holder->kind = Expr::Kind::kLiteral;
        ASSIGN_OR_RETURN(n->expr, ParseFilters(std::move(holder)));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endset"}, &n->body, &found));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (tag == "macro") {
      n->kind = Node::Kind::kMacro;
      ASSIGN_OR_RETURN(n->text, Identifier());
      RETURN_IF_ERROR(ParseParams(&n->params));
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endmacro"}, &n->body, &found));
      if (Peek().type == T::kName) ++i_;  // {% endmacro name %}
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (tag == "call") {
      n->kind = Node::Kind::kCallBlock;
      if (IsOp("(")) RETURN_IF_ERROR(ParseParams(&n->params));
      ASSIGN_OR_RETURN(n->expr, ParseExpression());
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endcall"}, &n->body, &found));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (tag == "filter") {
      n->kind = Node::Kind::kFilterBlock;
      auto holder = std::make_unique<Expr>();
      holder->kind = Expr::Kind::kLiteral;
      ASSIGN_OR_RETURN(n->expr, ParseFilterChain(std::move(holder)));
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endfilter"}, &n->body, &found));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (tag == "break" || tag == "continue") {
      n->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    std::string msg = "Encountered unknown tag '" + tag + "'.";
    if (!outer.empty()) {
      msg += " Jinja was looking for the following tags:";
      for (const auto& e : outer) msg += " '" + e + "'";
      msg += ".";
    }
    return SyntaxError(line, msg);
  }

  Status ParseParams(std::vector<std::pair<std::string, ExprPtr>>* params) {
    RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      ASSIGN_OR_RETURN(std::string name, Identifier());
      ExprPtr def;
      if (IsOp("=")) {
        ++i_;
        ASSIGN_OR_RETURN(def, ParseExpression());
      }
      params->emplace_back(name, std::move(def));
      if (!IsOp(",")) break;
      ++i_;
    }
    return Expect(")");
  }

  ExprPtr Make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // `a, b` without brackets (set x = 1, 2) is a tuple.
  StatusOr<ExprPtr> ParseTupleOrExpression() {
    const int line = Peek().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
    if (!IsOp(",")) return first;
    auto t = Make(Expr::Kind::kTuple, line);
    t->args.push_back(std::move(first));
    while (IsOp(",")) {
      ++i_;
      if (Peek().type == T::kBlockEnd || Peek().type == T::kVarEnd) break;
      ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
      t->args.push_back(std::move(e));
    }
    return t;
  }

  StatusOr<ExprPtr> ParseExpression(bool allow_cond = true) {
    if (++depth_ > kMaxDepth) return SyntaxError(Peek().line, "expression nested too deeply");
    ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    if (allow_cond) {
      while (IsName("if")) {
        const int line = Next().line;
        auto c = Make(Expr::Kind::kCond, line);
        ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
        ExprPtr other;
        if (IsName("else")) {
          ++i_;
          ASSIGN_OR_RETURN(other, ParseExpression());
        }
        c->args.push_back(std::move(e));
        c->args.push_back(std::move(cond));
        c->args.push_back(std::move(other));
        e = std::move(c);
      }
    }
    --depth_;
    return e;
  }

  StatusOr<ExprPtr> ParseBinaryChain(StatusOr<ExprPtr> (Parser::*next)(), std::initializer_list<const char*> ops,
                                     bool names) {
    ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (true) {
      const char* op = nullptr;
      for (const char* o : ops) {
        if (names ? IsName(o) : IsOp(o)) op = o;
      }
      if (op == nullptr) return left;
      const int line = Next().line;
      ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      auto b = Make(Expr::Kind::kBinary, line);
      b->name = op;
      b->args.push_back(std::move(left));
      b->args.push_back(std::move(right));
      left = std::move(b);
    }
  }

  StatusOr<ExprPtr> ParseOr() { return ParseBinaryChain(&Parser::ParseAnd, {"or"}, true); }
  StatusOr<ExprPtr> ParseAnd() { return ParseBinaryChain(&Parser::ParseNot, {"and"}, true); }
  StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const int line = Next().line;
      if (++depth_ > kMaxDepth) return SyntaxError(line, "expression nested too deeply");
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      --depth_;
      auto u = Make(Expr::Kind::kUnary, line);
      u->name = "not";
      u->args.push_back(std::move(operand));
      return u;
    }
    return ParseCompare();
  }
  StatusOr<ExprPtr> ParseCompare() {
    const int line = Peek().line;
    ASSIGN_OR_RETURN(ExprPtr left, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        ++i_;
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        i_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, line);
        cmp->args.push_back(std::move(left));
      }
      ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(right));
    }
    return cmp ? std::move(cmp) : std::move(left);
  }
  StatusOr<ExprPtr> ParseMath1() { return ParseBinaryChain(&Parser::ParseConcat, {"+", "-"}, false); }
  StatusOr<ExprPtr> ParseConcat() { return ParseBinaryChain(&Parser::ParseMath2, {"~"}, false); }
  StatusOr<ExprPtr> ParseMath2() { return ParseBinaryChain(&Parser::ParsePow, {"*", "/", "//", "%"}, false); }
  StatusOr<ExprPtr> ParsePow() { return ParseBinaryChain(&Parser::ParseUnaryWithFilters, {"**"}, false); }
  StatusOr<ExprPtr> ParseUnaryWithFilters() { return ParseUnary(true); }

  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      if (++depth_ > kMaxDepth) return SyntaxError(t.line, "expression nested too deeply");
      auto u = Make(Expr::Kind::kUnary, t.line);
      u->name = t.text;
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      --depth_;
      u->args.push_back(std::move(operand));
      e = std::move(u);
    } else {
      ASSIGN_OR_RETURN(e, ParsePrimary());
      ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    }
    if (with_filter) return ParseFilters(std::move(e));
    return e;
  }

  // Filters (|f) and tests (is [not] t), in any order and number.
  StatusOr<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        ++i_;
        ASSIGN_OR_RETURN(e, ParseOneFilter(std::move(e)));
      } else if (IsName("is")) {
        const int line = Next().line;
        auto t = Make(Expr::Kind::kTest, line);
        if (IsName("not")) {
          ++i_;
          t->negated = true;
        }
        ASSIGN_OR_RETURN(t->name, Identifier());
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseCallArgs(t.get()));
        } else if (Peek().type == T::kString || Peek().type == T::kInt || Peek().type == T::kFloat ||
                   (Peek().type == T::kName && !IsName("and") && !IsName("or") && !IsName("else") &&
                    !IsName("if") && !IsName("in") && !IsName("is") && !IsName("not"))) {
          // `is divisibleby 3`, `is sameas x`: one argument without parentheses.
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> ParseFilterChain(ExprPtr e) {
    ASSIGN_OR_RETURN(e, ParseOneFilter(std::move(e)));
    while (IsOp("|")) {
      ++i_;
      ASSIGN_OR_RETURN(e, ParseOneFilter(std::move(e)));
    }
    return e;
  }

  StatusOr<ExprPtr> ParseOneFilter(ExprPtr e) {
    const int line = Peek().line;
    auto f = Make(Expr::Kind::kFilter, line);
    ASSIGN_OR_RETURN(f->name, Identifier());
    while (IsOp(".")) {  // dotted filter names
      ++i_;
      ASSIGN_OR_RETURN(std::string more, Identifier());
      f->name += "." + more;
    }
    f->args.push_back(std::move(e));
    if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(f.get()));
    return f;
  }

  // ( positional..., name=value... ) appended to e->args / e->kwargs.
  Status ParseCallArgs(Expr* e) {
    RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (Peek().type == T::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        ++i_;
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        e->kwargs.emplace_back(name, std::move(v));
      } else {
        if (!e->kwargs.empty()) return SyntaxError(Peek().line, "positional argument after keyword argument");
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
        e->args.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      ++i_;
    }
    return Expect(")");
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const int line = Next().line;
        auto g = Make(Expr::Kind::kGetAttr, line);
        if (Peek().type == T::kInt) {
          g->kind = Expr::Kind::kGetItem;
          auto idx = Make(Expr::Kind::kLiteral, line);
          idx->literal = Value(static_cast<int64_t>(std::strtoll(Next().text.c_str(), nullptr, 10)));
          g->args.push_back(std::move(e));
          g->args.push_back(std::move(idx));
        } else {
          ASSIGN_OR_RETURN(g->name, Identifier());
          g->args.push_back(std::move(e));
        }
        e = std::move(g);
      } else if (IsOp("[")) {
        const int line = Next().line;
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[k], ParseExpression());
          }
          if (IsOp(":") && k < 2) {
            ++i_;
            slice = true;
            continue;
          }
          break;
        }
        RETURN_IF_ERROR(Expect("]"));
        auto g = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem, line);
        g->args.push_back(std::move(e));
        if (slice) {
          for (auto& p : parts) g->args.push_back(std::move(p));
        } else {
          if (!parts[0]) return SyntaxError(line, "expected an index inside []");
          g->args.push_back(std::move(parts[0]));
        }
        e = std::move(g);
      } else if (IsOp("(")) {
        auto c = Make(Expr::Kind::kCall, Peek().line);
        c->args.push_back(std::move(e));
        RETURN_IF_ERROR(ParseCallArgs(c.get()));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    switch (t.type) {
      case T::kString: {
        auto e = Make(Expr::Kind::kLiteral, t.line);
        std::string s;
        while (Peek().type == T::kString) s += Next().text;  // adjacent literals concatenate
        e->literal = Value(std::move(s));
        return e;
      }
      case T::kInt: {
        auto e = Make(Expr::Kind::kLiteral, t.line);
        e->literal = Value(static_cast<int64_t>(std::strtoll(Next().text.c_str(), nullptr, 10)));
        return e;
      }
      case T::kFloat: {
        auto e = Make(Expr::Kind::kLiteral, t.line);
        e->literal = Value(std::strtod(Next().text.c_str(), nullptr));
        return e;
      }
      case T::kName: {
        const std::string& n = t.text;
        auto e = Make(Expr::Kind::kLiteral, t.line);
        if (n == "true" || n == "True") {
          e->literal = Value(true);
        } else if (n == "false" || n == "False") {
          e->literal = Value(false);
        } else if (n == "none" || n == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = n;
        }
        ++i_;
        return e;
      }
      case T::kOp: {
        if (t.text == "(") {
          const int line = Next().line;
          if (IsOp(")")) {
            ++i_;
            return Make(Expr::Kind::kTuple, line);
          }
          ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
          if (IsOp(")")) {
            ++i_;
            return first;
          }
          auto tup = Make(Expr::Kind::kTuple, line);
          tup->args.push_back(std::move(first));
          while (IsOp(",")) {
            ++i_;
            if (IsOp(")")) break;
            ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
            tup->args.push_back(std::move(e));
          }
          RETURN_IF_ERROR(Expect(")"));
          return tup;
        }
        if (t.text == "[") {
          const int line = Next().line;
          auto l = Make(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
            l->args.push_back(std::move(e));
            if (!IsOp(",")) break;
            ++i_;
          }
          RETURN_IF_ERROR(Expect("]"));
          return l;
        }
        if (t.text == "{") {
          const int line = Next().line;
          auto d = Make(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            ASSIGN_OR_RETURN(ExprPtr k, ParseExpression());
            RETURN_IF_ERROR(Expect(":"));
            ASSIGN_OR_RETURN(ExprPtr v, ParseExpression());
            d->dict_items.emplace_back(std::move(k), std::move(v));
            if (!IsOp(",")) break;
            ++i_;
          }
          RETURN_IF_ERROR(Expect("}"));
          return d;
        }
        break;
      }
      default: break;
    }
    return SyntaxError(t.line, "unexpected '" + Describe(t) + "'");
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  // Nesting of expressions and unary operators (each level is a recursive call here and in the
  // renderer: a fuzzer's 610 nested minus signs overflowed the renderer's stack under ASan).
  static constexpr int kMaxDepth = 200;
  int depth_ = 0;
};

}  // namespace

StatusOr<ParsedTemplate> Parse(std::string_view source, const ParseOptions& options) {
  Lexer lexer(source, options);
  ASSIGN_OR_RETURN(std::vector<Token> tokens, lexer.Run());
  Parser parser(std::move(tokens));
  return parser.Run();
}

}  // namespace gale::jinja
