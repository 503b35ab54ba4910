// `gale eval ppl`: perplexity of a text, and KL divergence against a base model's saved
// log-probabilities.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tools/cli_common.h"
#include "tools/commands.h"
#include "tools/eval.h"

namespace gale {

CommandFn RegisterEval(CLI::App& app) {
  struct Opts {
    std::string model, file, save_logits, kl_base, kv_type = "f32", v_type, output = "text";
    int64_t ctx = 0, stride = 0;
    int threads = ThreadPool::DefaultNumThreads();
    LoadOptions load;
  };
  auto o = std::make_shared<Opts>();
  app.require_subcommand(1);
  CLI::App* ppl = app.add_subcommand("ppl", "perplexity of a text; KL divergence against a base model's log-probabilities");
  ppl->add_option("-m,--model", o->model, "GGUF model (default: the bundled one)");
  ppl->add_option("-f,--file", o->file, "the text")->required();
  ppl->add_option("--ctx", o->ctx, "window length in tokens (default: the model's context)");
  ppl->add_option("--stride", o->stride, "window step (default: half the window)");
  ppl->add_option("--kv-type", o->kv_type, "KV cache type during the evaluation: f32 | f16 | bf16 | int8 | int4")
      ->capture_default_str();
  ppl->add_option("--v-cache-dtype", o->v_type, "V's type when it differs from --kv-type");
  ppl->add_option("--save-logits", o->save_logits, "write every scored position's log-probabilities (the base for --kl-base)");
  ppl->add_option("--kl-base", o->kl_base, "compare with a base's --save-logits file: KL divergence, top-1 agreement");
  ppl->add_option("-t,--threads", o->threads, "threads")->capture_default_str();
  ppl->add_option("-o,--output", o->output, "text | json")->capture_default_str();
  o->load.Register(*ppl);
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale eval: %s\n", s.ToString().c_str());
      return 1;
    };
    if (o->output != "text" && o->output != "json") return fail(InvalidArgument("-o must be text or json"));
    const auto kv = kernels::ParseKvType(o->kv_type);
    if (!kv) return fail(InvalidArgument("--kv-type '{}' is not one of f32, f16, bf16, int8, int4", o->kv_type));
    if (o->threads < 1) return fail(InvalidArgument("-t must be >= 1"));
    std::optional<kernels::KvType> v;
    if (!o->v_type.empty()) {
      v = kernels::ParseKvType(o->v_type);
      if (!v) return fail(InvalidArgument("--v-cache-dtype '{}' is not one of f32, f16, bf16, int8, int4", o->v_type));
    }
    std::ifstream in(o->file, std::ios::binary);
    if (!in) return fail(IoError("cannot open '{}'", o->file));
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    if (text.find('\0') != std::string::npos) return fail(InvalidArgument("'{}' is binary, not text", o->file));
    auto m = LoadModel(o->model, o->load);
    if (!m.ok()) return fail(m.status());
    const std::vector<int32_t> tokens = m->tok->Encode(text);
    ThreadPool pool(o->threads);
    PplOptions opt;
    opt.ctx = o->ctx;
    opt.stride = o->stride;
    opt.kv_type = *kv;
    opt.v_kv_type = v;
    auto r = EvaluatePerplexity(*m->model, tokens, opt, !o->save_logits.empty() || !o->kl_base.empty(), pool);
    if (!r.ok()) return fail(r.status().WithContext(o->file));
    nlohmann::json j = {{"model", m->path},
                        {"file", o->file},
                        {"kv_type", o->kv_type},
                        {"v_cache_dtype", o->v_type.empty() ? o->kv_type : o->v_type},
                        {"tokens", tokens.size()},
                        {"scored", r->num_scored},
                        {"nll", r->nll},
                        {"perplexity", r->ppl()}};
    if (!o->save_logits.empty()) {
      if (Status s = SaveLogprobs(o->save_logits, *r); !s.ok()) return fail(s);
    }
    if (!o->kl_base.empty()) {
      auto base = LoadLogprobs(o->kl_base);
      if (!base.ok()) return fail(base.status());
      auto kl = CompareLogprobs(*base, *r);
      if (!kl.ok()) return fail(kl.status().WithContext(o->kl_base));
      j["base_perplexity"] = kl->base_ppl;
      j["kl_mean"] = kl->mean;
      j["kl_median"] = kl->median;
      j["kl_p99"] = kl->p99;
      j["kl_max"] = kl->max;
      j["top1_agreement"] = kl->top1_agreement;
    }
    if (o->output == "json") {
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }
    std::printf("perplexity %.4f over %lld tokens (mean NLL %.5f nats), KV %s%s\n", r->ppl(),
                static_cast<long long>(r->num_scored), r->nll, o->kv_type.c_str(),
                o->v_type.empty() ? "" : (" / V " + o->v_type).c_str());
    if (j.contains("kl_mean")) {
      std::printf("vs base (perplexity %.4f): KL mean %.6f, median %.6f, p99 %.6f, max %.6f; top-1 agreement %.2f%%\n",
                  j["base_perplexity"].get<double>(), j["kl_mean"].get<double>(), j["kl_median"].get<double>(),
                  j["kl_p99"].get<double>(), j["kl_max"].get<double>(), 100.0 * j["top1_agreement"].get<double>());
    }
    return 0;
  };
}

}  // namespace gale
