// `gale loadgen`: load tests any OpenAI-compatible server (gale, llama.cpp's llama-server, vLLM)
// with streaming requests: constant concurrency, open-loop Poisson/gamma arrivals, stepped ramps,
// bursts and trace replay; fixed, uniform and long-tailed lengths; shared prefixes. Prints a
// live progress line and a summary; --out DIR writes results.json and report.html.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loadgen/client.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/workload.h"
#include "tools/commands.h"

namespace gale {

using namespace loadgen;

namespace {


StatusOr<std::vector<double>> ParseList(const std::string& s, const char* flag) {
  std::vector<double> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || !(v > 0)) return InvalidArgument("bad {} entry '{}'", flag, item);
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgument("{} is empty", flag);
  return out;
}

}  // namespace

CommandFn RegisterLoadgen(CLI::App& app) {
  struct Opts {
    std::string url = "http://127.0.0.1:8080/v1", api_key, model, endpoint = "completions";
    int64_t concurrency = 0, burst = 0, requests = 100, max_in_flight = 1024;
    double rate = 0.0, burstiness = 1.0, duration = 60.0, timeout = 60.0, speed = 1.0;
    std::string ramp_concurrency, ramp_rate, trace, input_len = "fixed:128", output_len = "fixed:128", shared_prefix,
                slo, out;
    uint64_t seed = 1;
    bool no_ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--url", o->url, "server base URL (http only)")->capture_default_str();
  app.add_option("--api-key", o->api_key, "sent as Authorization: Bearer KEY");
  app.add_option("--model", o->model, "model name to send (vLLM needs it; gale and llama-server do not)");
  app.add_option("--endpoint", o->endpoint, "completions | chat")->capture_default_str();
  app.add_option("--concurrency", o->concurrency, "closed loop: this many requests in flight");
  app.add_option("--rate", o->rate, "open loop: requests per second (gamma arrivals, see --burstiness)");
  app.add_option("--burstiness", o->burstiness, "gamma shape of inter-arrival times (1 = Poisson)")->capture_default_str();
  app.add_option("--ramp-concurrency", o->ramp_concurrency, "steps of concurrency, e.g. 1,2,4,8,16");
  app.add_option("--ramp-rate", o->ramp_rate, "steps of arrival rate, e.g. 1,2,4,8");
  app.add_option("--burst", o->burst, "send this many requests at once");
  app.add_option("--trace", o->trace, "replay a JSONL trace (timestamp, prompt or input_length, output_length)");
  app.add_option("--speed", o->speed, "trace replay speed factor")->capture_default_str();
  app.add_option("--requests", o->requests, "requests per phase (per ramp step)")->capture_default_str();
  app.add_option("--duration", o->duration, "seconds per phase at most")->capture_default_str();
  app.add_option("--input-len", o->input_len, "prompt length: fixed:N, uniform:A-B, lognormal:MEDIAN,SIGMA, zipf:A-B,S")
      ->capture_default_str();
  app.add_option("--output-len", o->output_len, "output length (same forms)")->capture_default_str();
  app.add_option("--shared-prefix", o->shared_prefix, "K:P: K groups of prompts sharing a P-word prefix");
  app.add_option("--timeout", o->timeout, "seconds before a request counts as timed out")->capture_default_str();
  app.add_option("--slo", o->slo, "goodput objectives, e.g. ttft=0.5,tpot=0.05,e2e=10 (seconds)");
  app.add_option("--max-in-flight", o->max_in_flight, "open loop: most requests in flight")->capture_default_str();
  app.add_option("--out", o->out, "write results.json and report.html here");
  app.add_option("--seed", o->seed, "workload seed")->capture_default_str();
  app.add_flag("--no-ignore-eos", o->no_ignore_eos, "let the model stop early (default: ask for exactly the output length)");
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale loadgen: %s\n", s.ToString().c_str());
      return 1;
    };
    Target target;
    if (!ParseUrl(o->url, &target)) return fail(InvalidArgument("--url '{}' is not http://HOST:PORT[/path]", o->url));
    target.api_key = o->api_key;
    if (o->endpoint != "completions" && o->endpoint != "chat") return fail(InvalidArgument("--endpoint must be completions or chat"));
    auto in_len = LengthDist::Parse(o->input_len);
    if (!in_len.ok()) return fail(in_len.status());
    auto out_len = LengthDist::Parse(o->output_len);
    if (!out_len.ok()) return fail(out_len.status());
    int64_t prefix_groups = 0, prefix_words = 0;
    if (!o->shared_prefix.empty()) {
      if (std::sscanf(o->shared_prefix.c_str(), "%ld:%ld", &prefix_groups, &prefix_words) != 2 || prefix_groups < 1 || prefix_words < 1) {
        return fail(InvalidArgument("--shared-prefix must be K:P with K, P >= 1"));
      }
    }
    Slo slo;
    if (!o->slo.empty()) {
      std::stringstream ss(o->slo);
      for (std::string kv; std::getline(ss, kv, ',');) {
        const size_t eq = kv.find('=');
        const std::string k = kv.substr(0, eq);
        const double v = eq == std::string::npos ? -1 : std::atof(kv.substr(eq + 1).c_str());
        if (v <= 0) return fail(InvalidArgument("--slo entry '{}' needs a positive number of seconds", kv));
        if (k == "ttft") slo.ttft_s = v;
        else if (k == "tpot") slo.tpot_s = v;
        else if (k == "e2e") slo.e2e_s = v;
        else return fail(InvalidArgument("--slo knows ttft, tpot and e2e, not '{}'", k));
      }
    }
    if (o->requests < 1 || o->duration <= 0 || o->timeout <= 0 || o->speed <= 0) {
      return fail(InvalidArgument("--requests, --duration, --timeout and --speed must be positive"));
    }
    // The phases to run.
    std::vector<Plan> plans;
    int shapes = (o->concurrency > 0) + (o->rate > 0) + !o->ramp_concurrency.empty() + !o->ramp_rate.empty() +
                 (o->burst > 0) + !o->trace.empty();
    if (shapes > 1) return fail(InvalidArgument("choose one load shape: --concurrency, --rate, --ramp-*, --burst or --trace"));
    std::vector<TraceEntry> trace;
    if (!o->ramp_concurrency.empty() || !o->ramp_rate.empty()) {
      const bool conc = !o->ramp_concurrency.empty();
      auto steps = ParseList(conc ? o->ramp_concurrency : o->ramp_rate, conc ? "--ramp-concurrency" : "--ramp-rate");
      if (!steps.ok()) return fail(steps.status());
      for (double v : *steps) {
        Plan p;
        p.load = v;
        p.kind = conc ? Plan::Kind::kClosed : Plan::Kind::kOpen;
        p.concurrency = static_cast<int64_t>(v);
        p.rate = v;
        p.label = conc ? fmt::format("concurrency {}", p.concurrency) : fmt::format("rate {}/s", v);
        plans.push_back(p);
      }
    } else if (o->rate > 0) {
      plans.push_back({fmt::format("rate {}/s", o->rate), o->rate, Plan::Kind::kOpen, 0, o->rate});
    } else if (o->burst > 0) {
      plans.push_back({fmt::format("burst {}", o->burst), static_cast<double>(o->burst), Plan::Kind::kOpen, 0, 0.0});
      o->requests = o->burst;
    } else if (!o->trace.empty()) {
      auto t = ReadTrace(o->trace);
      if (!t.ok()) return fail(t.status());
      trace = std::move(t).value();
      plans.push_back({fmt::format("trace x{}", o->speed), o->speed, Plan::Kind::kTrace, 0, 0.0});
      o->requests = static_cast<int64_t>(trace.size());
    } else {
      const int64_t c = o->concurrency > 0 ? o->concurrency : 1;
      plans.push_back({fmt::format("concurrency {}", c), static_cast<double>(c), Plan::Kind::kClosed, c, 0.0});
    }

    LoadConfig cfg;
    cfg.target = target;
    cfg.model = o->model;
    cfg.endpoint = o->endpoint;
    cfg.plans = plans;
    cfg.requests = o->requests;
    cfg.duration = o->duration;
    cfg.timeout = o->timeout;
    cfg.speed = o->speed;
    cfg.burstiness = o->burstiness;
    cfg.max_in_flight = o->max_in_flight;
    cfg.in_len = *in_len;
    cfg.out_len = *out_len;
    cfg.prefix_groups = prefix_groups;
    cfg.prefix_words = prefix_words;
    cfg.trace = std::move(trace);
    cfg.slo = slo;
    cfg.seed = o->seed;
    cfg.ignore_eos = !o->no_ignore_eos;
    const LoadResult result = RunLoad(cfg);
    if (!o->out.empty()) {
      if (Status s = WriteReports(o->out, "gale loadgen: " + o->url, cfg, result); !s.ok()) return fail(s);
      std::fprintf(stderr, "wrote %s/results.json and %s/report.html\n", o->out.c_str(), o->out.c_str());
    }
    return 0;
  };
}

}  // namespace gale
