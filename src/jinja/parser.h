// Template source -> ParsedTemplate: a lexer with Jinja2's whitespace control (`-` and `+`
// modifiers, trim_blocks, lstrip_blocks) and a recursive-descent parser for the statements and
// expressions chat templates use. Errors are Jinja2's TemplateSyntaxError with the line.
#pragma once

#include <string_view>

#include "base/status.h"
#include "jinja/ast.h"

namespace gale::jinja {

struct ParseOptions {
  bool trim_blocks = true;    // as Hugging Face's apply_chat_template
  bool lstrip_blocks = true;
};

StatusOr<ParsedTemplate> Parse(std::string_view source, const ParseOptions& options);

}  // namespace gale::jinja
