// `gale bench serve`: the standard serving sweep. Starts gale's server in this process on a free
// loopback port, runs gale loadgen's concurrency ramp against it with fixed lengths, prints the
// summaries and the knee, and writes results.json and report.html.
#include <cstdio>
#include <ctime>
#include <sstream>

#include <fmt/format.h>

#include "loadgen/runner.h"
#include "model/chat_template.h"
#include "server/http_server.h"
#include "tools/cli_common.h"
#include "tools/commands.h"

namespace gale {

void RegisterBenchServe(CLI::App& bench, std::function<int()>* run) {
  struct Opts {
    std::string model, ramp = "1,2,4,8,16,32", input_len = "fixed:128", output_len = "fixed:128", out = "bench-serve";
    int64_t requests = 32;
    int threads = ThreadPool::DefaultNumThreads();
    LoadOptions load;
    EngineOptions engine;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* sub = bench.add_subcommand("serve", "sweep concurrency against an in-process gale server; write a report");
  sub->add_option("-m,--model", o->model, "GGUF model (default: the bundled stories260K)");
  sub->add_option("--ramp", o->ramp, "concurrency steps")->capture_default_str();
  sub->add_option("--requests", o->requests, "requests per step")->capture_default_str();
  sub->add_option("--input-len", o->input_len, "prompt length (loadgen forms)")->capture_default_str();
  sub->add_option("--output-len", o->output_len, "output length")->capture_default_str();
  sub->add_option("--out", o->out, "report folder")->capture_default_str();
  sub->add_option("-t,--threads", o->threads, "compute threads")->capture_default_str();
  o->engine.Register(*sub);
  o->load.Register(*sub);
  *run = [o, sub]() -> int {
    if (!sub->parsed()) return -1;
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale bench serve: %s\n", s.ToString().c_str());
      return 1;
    };
    auto cfg = o->engine.Resolve();
    if (!cfg.ok()) return fail(cfg.status());
    auto loaded = LoadModel(o->model, o->load);
    if (!loaded.ok()) return fail(loaded.status());
    ThreadPool pool(o->threads);
    auto engine = Engine::Create(*loaded->model, loaded->tok.get(), *cfg, pool);
    if (!engine.ok()) return fail(engine.status());
    server::ServerOptions so;
    so.port = 0;
    so.max_waiting = 1 << 20;
    server::HttpServer http(so);
    if (Status s = http.Start(); !s.ok()) return fail(s);
    server::ServingState state;
    state.engine = engine->get();
    state.tokenizer = loaded->tok.get();
    state.model_name = "bench";
    state.created = static_cast<int64_t>(std::time(nullptr));
    http.SetReady(state);
    std::fprintf(stderr, "%s\nserving on 127.0.0.1:%u\n", (*engine)->Describe().c_str(), http.port());

    loadgen::LoadConfig lc;
    lc.target.port = std::to_string(http.port());
    auto in = loadgen::LengthDist::Parse(o->input_len);
    auto out = loadgen::LengthDist::Parse(o->output_len);
    if (!in.ok()) return fail(in.status());
    if (!out.ok()) return fail(out.status());
    lc.in_len = *in;
    lc.out_len = *out;
    lc.requests = o->requests;
    lc.duration = 600;
    lc.timeout = 600;
    std::stringstream ss(o->ramp);
    for (std::string item; std::getline(ss, item, ',');) {
      const int64_t c = std::atoll(item.c_str());
      if (c < 1) return fail(InvalidArgument("bad --ramp entry '{}'", item));
      lc.plans.push_back({fmt::format("concurrency {}", c), static_cast<double>(c), loadgen::Plan::Kind::kClosed, c, 0.0});
    }
    const loadgen::LoadResult result = loadgen::RunLoad(lc);
    const std::string title = "gale bench serve: " + loaded->path;
    if (Status s = loadgen::WriteReports(o->out, title, lc, result); !s.ok()) return fail(s);
    std::fprintf(stderr, "wrote %s/results.json and %s/report.html\n", o->out.c_str(), o->out.c_str());
    http.Drain(std::chrono::milliseconds(1000));
    http.Stop();
    return 0;
  };
}

}  // namespace gale
