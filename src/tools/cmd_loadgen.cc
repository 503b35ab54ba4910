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
#include "loadgen/workload.h"
#include "tools/commands.h"

namespace gale {

using namespace loadgen;

namespace {

struct Plan {
  std::string label;
  double load = 0.0;
  enum class Kind { kClosed, kOpen, kTrace } kind = Kind::kClosed;
  int64_t concurrency = 1;
  double rate = 0.0;  // open loop; <= 0 with kOpen: all at once (burst)
};

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

    const auto test_start = Clock::now();
    const bool tty = isatty(STDERR_FILENO);
    std::vector<Phase> phases;
    std::vector<nlohmann::json> summaries;
    Rng rng(o->seed);
    std::mutex rng_mu;
    for (const Plan& plan : plans) {
      Phase phase;
      phase.label = plan.label;
      phase.load = plan.load;
      std::mutex mu;
      std::atomic<int64_t> issued{0}, in_flight{0}, done{0}, errors{0}, tokens{0};
      const auto phase_start = Clock::now();
      auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - phase_start).count(); };
      // Builds request i of the phase: body, and the lengths asked for.
      auto build = [&](int64_t i, int64_t* in_words, int64_t* out_tokens) {
        std::lock_guard<std::mutex> lock(rng_mu);
        std::string prompt;
        if (!trace.empty()) {
          const TraceEntry& e = trace[static_cast<size_t>(i)];
          *in_words = e.input_length;
          *out_tokens = e.output_length;
          prompt = !e.prompt.empty() ? e.prompt : MakePrompt(rng, e.input_length, 0, -1);
        } else {
          *in_words = in_len->Sample(rng);
          *out_tokens = out_len->Sample(rng);
          const int group = prefix_groups > 0 ? static_cast<int>(rng.NextU64() % static_cast<uint64_t>(prefix_groups)) : -1;
          prompt = MakePrompt(rng, *in_words + (group >= 0 ? prefix_words : 0), prefix_words, group);
        }
        nlohmann::json body = {{"max_tokens", *out_tokens}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
        if (!o->model.empty()) body["model"] = o->model;
        if (!o->no_ignore_eos) body["ignore_eos"] = true;
        if (o->endpoint == "chat") body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", prompt}}});
        else body["prompt"] = prompt;
        return body.dump();
      };
      auto one = [&](int64_t i) {
        int64_t in_words = 0, out_tokens = 0;
        const std::string body = build(i, &in_words, &out_tokens);
        ++in_flight;
        RequestResult r = PostStreaming(target, o->endpoint == "chat" ? "/chat/completions" : "/completions", body,
                                        o->timeout, test_start);
        --in_flight;
        r.input_len = in_words;
        r.output_len = out_tokens;
        ++done;
        if (r.outcome != Outcome::kOk) ++errors;
        tokens += r.output_tokens;
        std::lock_guard<std::mutex> lock(mu);
        phase.results.push_back(std::move(r));
      };
      std::atomic<bool> finished{false};
      std::thread progress([&] {
        auto last = Clock::now();
        while (!finished.load()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          if (Clock::now() - last < std::chrono::milliseconds(tty ? 250 : 5000)) continue;
          last = Clock::now();
          const double t = elapsed();
          std::fprintf(stderr, "%s[%s] %.1f s: %lld done, %lld in flight, %.1f tok/s, %lld errors%s",
                       tty ? "\r" : "", plan.label.c_str(), t, static_cast<long long>(done.load()),
                       static_cast<long long>(in_flight.load()), t > 0 ? tokens.load() / t : 0.0,
                       static_cast<long long>(errors.load()), tty ? "   " : "\n");
        }
      });
      if (plan.kind == Plan::Kind::kClosed) {
        std::vector<std::thread> workers;
        for (int64_t w = 0; w < plan.concurrency; ++w) {
          workers.emplace_back([&] {
            while (true) {
              const int64_t i = issued++;
              if (i >= o->requests || elapsed() > o->duration) break;
              one(i);
            }
          });
        }
        for (auto& t : workers) t.join();
      } else {
        std::vector<std::thread> workers;
        Arrivals arrivals(plan.rate, o->burstiness, o->seed * 7919 + static_cast<uint64_t>(phases.size()));
        double next_at = 0.0;
        for (int64_t i = 0; i < o->requests; ++i) {
          if (plan.kind == Plan::Kind::kTrace) next_at = trace[static_cast<size_t>(i)].at_s / o->speed;
          else if (i > 0 && plan.rate > 0) next_at += arrivals.NextGapSeconds();
          if (next_at > o->duration) break;
          const double wait = next_at - elapsed();
          if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
          while (in_flight.load() >= o->max_in_flight) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          ++in_flight;  // counted before the thread starts, so the cap holds
          workers.emplace_back([&, i] {
            --in_flight;
            one(i);
          });
        }
        for (auto& t : workers) t.join();
      }
      phase.wall_s = elapsed();
      finished = true;
      progress.join();
      if (tty) std::fputc('\n', stderr);
      summaries.push_back(Summarize(phase, slo));
      std::fputs(SummaryText(summaries.back()).c_str(), stdout);
      std::fflush(stdout);
      phases.push_back(std::move(phase));
    }
    if (summaries.size() > 1) {
      std::printf("knee: %s %g\n", plans.front().kind == Plan::Kind::kClosed ? "concurrency" : "rate", Knee(summaries));
    }
    if (!o->out.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o->out, ec);
      if (ec) return fail(IoError("cannot create '{}': {}", o->out, ec.message()));
      nlohmann::json j;
      j["target"] = o->url;
      j["endpoint"] = o->endpoint;
      j["input_len"] = o->input_len;
      j["output_len"] = o->output_len;
      j["summaries"] = summaries;
      if (summaries.size() > 1) j["knee"] = Knee(summaries);
      nlohmann::json reqs = nlohmann::json::array();
      for (const auto& p : phases) {
        for (const auto& r : p.results) {
          reqs.push_back({{"phase", p.label}, {"start_s", r.start_s}, {"ttft_s", r.ttft_s}, {"e2e_s", r.e2e_s},
                          {"itl_s", r.itl_s}, {"prompt_tokens", r.prompt_tokens}, {"output_tokens", r.output_tokens},
                          {"input_len", r.input_len}, {"output_len", r.output_len},
                          {"outcome", OutcomeName(r.outcome)}, {"http_status", r.http_status}, {"error", r.error}});
        }
      }
      j["requests"] = reqs;
      std::ofstream(o->out + "/results.json") << j.dump(1) << '\n';
      std::ofstream(o->out + "/report.html") << HtmlReport("gale loadgen: " + o->url, phases, summaries);
      std::fprintf(stderr, "wrote %s/results.json and %s/report.html\n", o->out.c_str(), o->out.c_str());
    }
    return 0;
  };
}

}  // namespace gale
