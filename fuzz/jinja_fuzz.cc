// libFuzzer target for chat templates, which come from downloaded model files: parse arbitrary
// bytes as a template and, when they parse, render them over a small chat context under tight
// limits. Any crash, hang or sanitizer report is a bug; errors are fine.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  auto t = gale::jinja::Template::Parse(src);
  if (!t.ok()) return 0;
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \u00e9 \ud83d\ude42"},
                 {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": [{"type": "function"}]})");
  gale::jinja::RenderOptions o;
  o.max_output_bytes = 1 << 16;
  o.max_steps = 200000;
  o.max_call_depth = 16;
  (void)t->Render(ctx, o);
  return 0;
}
