// A Jinja chat template: parse once, render many times. Rendering is sandboxed (no file,
// environment or attribute access beyond the values passed in), bounded in output size, call
// depth and work, and every error says what went wrong and on which template line. Behaves as
// Hugging Face's apply_chat_template environment: trim_blocks, lstrip_blocks, loop controls,
// raise_exception(), strftime_now(), and tojson without HTML escaping.
#pragma once

#include <chrono>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "jinja/parser.h"
#include "jinja/value.h"

namespace gale::jinja {

struct RenderOptions {
  size_t max_output_bytes = 16u << 20;
  size_t max_value_bytes = 16u << 20;   // one string the template builds
  size_t max_live_bytes = 256u << 20;   // strings, lists and dicts alive at once (the context too)
  int max_call_depth = 64;              // nested macro calls
  int64_t max_steps = 2'000'000;        // statements and expressions evaluated
  // CPU time one render may take (0: no limit). Real chat templates render a long conversation in
  // milliseconds; this stops a hostile one (the steps above take ~1.5 us each here, so max_steps
  // alone would allow seconds).
  std::chrono::milliseconds max_time{500};
  std::optional<std::tm> now;        // strftime_now's clock; nullopt: the local time
};

class Template {
 public:
  // Errors are Jinja2's TemplateSyntaxError (with the line), or an unknown filter or test.
  static StatusOr<Template> Parse(std::string_view source, const ParseOptions& options = {});

  // context: a JSON object; its keys become the template's variables.
  StatusOr<std::string> Render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;
  StatusOr<std::string> Render(const Value& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const ParsedTemplate> parsed_;
};

}  // namespace gale::jinja
