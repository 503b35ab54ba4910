// `gale quantize`: an F32/F16/BF16 GGUF to Q8_0 or Q4_0 (see tools/quantize.h).
#include <cstdio>
#include <memory>

#include "tools/commands.h"
#include "tools/quantize.h"

namespace gale {

CommandFn RegisterQuantize(CLI::App& app) {
  struct Opts {
    std::string in, out, type = "q8_0";
    std::vector<std::string> keep;
    bool embeddings = false, output = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-i,--input", o->in, "F32/F16/BF16 GGUF")->required();
  app.add_option("-o,--output", o->out, "output GGUF")->required();
  app.add_option("--type", o->type, "q8_0 | q4_0")->capture_default_str();
  app.add_option("--keep", o->keep, "keep tensors whose name matches this regex unquantized (repeatable), e.g. 'blk\\.0\\.'");
  app.add_flag("--quantize-embeddings", o->embeddings, "quantize token_embd.weight too");
  app.add_flag("--quantize-output", o->output, "quantize output.weight too");
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale quantize: %s\n", s.ToString().c_str());
      return 1;
    };
    const auto type = ParseTypeName(o->type);
    if (!type || (*type != GgmlType::kQ8_0 && *type != GgmlType::kQ4_0)) {
      return fail(InvalidArgument("--type '{}' is not one of q8_0, q4_0", o->type));
    }
    if (o->in == o->out) return fail(InvalidArgument("the output would overwrite the input"));
    auto in = GgufFile::Open(o->in);
    if (!in.ok()) return fail(in.status());
    QuantizeOptions opt;
    opt.type = *type;
    opt.keep = o->keep;
    opt.quantize_embeddings = o->embeddings;
    opt.quantize_output = o->output;
    GgufWriter w;
    auto report = QuantizeModel(**in, opt, &w);
    if (!report.ok()) return fail(report.status().WithContext(o->in));
    if (Status s = w.WriteFile(o->out); !s.ok()) return fail(s);
    for (const auto& k : report->kept) std::fprintf(stderr, "kept: %s\n", k.c_str());
    for (const auto& f : report->to_f16) std::fprintf(stderr, "f16 (does not fit blocks of 32): %s\n", f.c_str());
    std::fprintf(stderr, "wrote %s: %lld tensors %s, %.2f MiB -> %.2f MiB\n", o->out.c_str(),
                 static_cast<long long>(report->quantized), o->type.c_str(), report->bytes_in / 1048576.0,
                 report->bytes_out / 1048576.0);
    return 0;
  };
}

}  // namespace gale
