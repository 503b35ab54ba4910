// `gale tokenize`: the ids (and pieces) a model's tokenizer gives a text, like llama.cpp's
// llama-tokenize. Reads only the tokenizer metadata; the model's tensors are not loaded.
#include <cstdio>
#include <memory>
#include <string>

#include "model/tokenizer.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace gale {

CommandFn RegisterTokenize(CLI::App& app) {
  struct Opts {
    std::string model, prompt, file;
    bool ids_only = false, no_bos = false, parse_special = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-m,--model", o->model, "GGUF file (a vocab-only GGUF works)")->required();
  app.add_option("-p,--prompt", o->prompt, "text to tokenize");
  app.add_option("--file", o->file, "read the text from this file");
  app.add_flag("--ids-only", o->ids_only, "print only the ids, as a list");
  app.add_flag("--no-bos", o->no_bos, "do not add BOS/EOS even if the vocab asks for them");
  app.add_flag("--parse-special", o->parse_special, "turn special-token texts like </s> into those tokens");
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale tokenize: %s\n", s.ToString().c_str());
      return 1;
    };
    std::string text = o->prompt;
    if (!o->file.empty()) {
      auto read = ReadTextFile(o->file);
      if (!read.ok()) return fail(read.status());
      text = std::move(*read);
    }
    auto file = GgufFile::Open(o->model);
    if (!file.ok()) return fail(file.status());
    auto tok = Tokenizer::FromGguf(**file);
    if (!tok.ok()) return fail(tok.status().WithContext(o->model));
    const std::vector<int32_t> ids = (*tok)->Encode(text, !o->no_bos, o->parse_special);
    if (o->ids_only) {
      std::string line = "[";
      for (size_t i = 0; i < ids.size(); ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
      std::printf("%s]\n", line.c_str());
      return 0;
    }
    for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, (*tok)->TokenToPiece(id).c_str());
    return 0;
  };
}

}  // namespace gale
