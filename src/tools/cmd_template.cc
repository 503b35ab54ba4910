// `gale template`: render a chat template for a context, as the conformance file shapes it
// ({"messages", "add_generation_prompt", "bos_token", "eos_token", ...}), and print the text or
// the error (with its template line). The template comes from --file or a model's metadata.
#include <cstdio>
#include <ctime>
#include <string>

#include <nlohmann/json.hpp>

#include "jinja/template.h"
#include "model/chat_template.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace gale {

CommandFn RegisterTemplate(CLI::App& app) {
  struct Opts {
    std::string file, model, context, now;
  };
  auto o = std::make_shared<Opts>();
  auto* f = app.add_option("--file", o->file, "Jinja template file");
  auto* m = app.add_option("-m,--model", o->model, "take the template from this GGUF's tokenizer.chat_template");
  f->excludes(m);
  app.add_option("--context", o->context, "JSON file: the template's variables (messages, add_generation_prompt, "
                                           "bos_token, eos_token, ...)")->required();
  app.add_option("--now", o->now, "fixed clock for strftime_now, \"YYYY-MM-DD HH:MM:SS\" (default: the local time)");
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale template: %s\n", s.ToString().c_str());
      return 1;
    };
    std::string source;
    if (!o->model.empty()) {
      auto file = GgufFile::Open(o->model);
      if (!file.ok()) return fail(file.status());
      auto src = (*file)->GetString("tokenizer.chat_template");
      if (!src.ok()) return fail(NotFound("{} has no tokenizer.chat_template", o->model));
      source = *src;
    } else if (!o->file.empty()) {
      auto read = ReadTextFile(o->file);
      if (!read.ok()) return fail(read.status());
      source = std::move(*read);
    } else {
      return fail(InvalidArgument("give the template with --file or -m"));
    }
    auto context = ReadTextFile(o->context);
    if (!context.ok()) return fail(context.status());
    const auto ctx = nlohmann::ordered_json::parse(*context, nullptr, /*allow_exceptions=*/false);
    if (ctx.is_discarded()) return fail(InvalidArgument("{}: not valid JSON", o->context));
    if (!ctx.is_object()) return fail(InvalidArgument("{}: the context must be a JSON object", o->context));
    jinja::RenderOptions ro;
    if (!o->now.empty()) {
      std::tm tm{};
      if (strptime(o->now.c_str(), "%Y-%m-%d %H:%M:%S", &tm) == nullptr) {
        return fail(InvalidArgument("--now '{}' is not \"YYYY-MM-DD HH:MM:SS\"", o->now));
      }
      std::tm copy = tm;
      timegm(&copy);  // fills the weekday and day of the year
      tm.tm_wday = copy.tm_wday;
      tm.tm_yday = copy.tm_yday;
      ro.now = tm;
    }
    auto t = jinja::Template::Parse(source);
    if (!t.ok()) return fail(t.status());
    auto out = t->Render(ctx, ro);
    if (!out.ok()) return fail(out.status());
    std::fwrite(out->data(), 1, out->size(), stdout);
    return 0;
  };
}

}  // namespace gale
