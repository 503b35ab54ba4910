// Load test execution and report files.
#include "loadgen/runner.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace gale::loadgen {

LoadResult RunLoad(const LoadConfig& cfg) {
  const auto test_start = Clock::now();
  const bool tty = isatty(STDERR_FILENO);
  std::vector<Phase> phases;
  std::vector<nlohmann::json> summaries;
  Rng rng(cfg.seed);
  std::mutex rng_mu;
  for (const Plan& plan : cfg.plans) {
    Phase phase;
    phase.label = plan.label;
    phase.load = plan.load;
    std::mutex mu;
    std::atomic<int64_t> issued{0}, in_flight{0}, done{0}, errors{0}, tokens{0};
    // The server's own counters around the phase (gale's /metrics; absent from other servers).
    std::map<std::string, double> before;
    if (std::string text; GetText(cfg.target, "/metrics", 2.0, &text)) before = ParsePrometheus(text);
    const auto phase_start = Clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - phase_start).count(); };
    // Builds request i of the phase: body, and the lengths asked for.
    auto build = [&](int64_t i, int64_t* in_words, int64_t* out_tokens) {
      std::lock_guard<std::mutex> lock(rng_mu);
      std::string prompt;
      if (!cfg.trace.empty()) {
        const TraceEntry& e = cfg.trace[static_cast<size_t>(i)];
        *in_words = e.input_length;
        *out_tokens = e.output_length;
        prompt = !e.prompt.empty() ? e.prompt : MakePrompt(rng, e.input_length, 0, -1);
      } else {
        *in_words = cfg.in_len.Sample(rng);
        *out_tokens = cfg.out_len.Sample(rng);
        const int group = cfg.prefix_groups > 0 ? static_cast<int>(rng.NextU64() % static_cast<uint64_t>(cfg.prefix_groups)) : -1;
        prompt = MakePrompt(rng, *in_words + (group >= 0 ? cfg.prefix_words : 0), cfg.prefix_words, group);
      }
      nlohmann::json body = {{"max_tokens", *out_tokens}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
      if (!cfg.model.empty()) body["model"] = cfg.model;
      if (!!cfg.ignore_eos) body["ignore_eos"] = true;
      if (cfg.endpoint == "chat") body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", prompt}}});
      else body["prompt"] = prompt;
      return body.dump();
    };
    auto one = [&](int64_t i) {
      int64_t in_words = 0, out_tokens = 0;
      const std::string body = build(i, &in_words, &out_tokens);
      ++in_flight;
      RequestResult r = PostStreaming(cfg.target, cfg.endpoint == "chat" ? "/chat/completions" : "/completions", body,
                                      cfg.timeout, test_start);
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
            if (i >= cfg.requests || elapsed() > cfg.duration) break;
            one(i);
          }
        });
      }
      for (auto& t : workers) t.join();
    } else {
      std::vector<std::thread> workers;
      Arrivals arrivals(plan.rate, cfg.burstiness, cfg.seed * 7919 + static_cast<uint64_t>(phases.size()));
      double next_at = 0.0;
      for (int64_t i = 0; i < cfg.requests; ++i) {
        if (plan.kind == Plan::Kind::kTrace) next_at = cfg.trace[static_cast<size_t>(i)].at_s / cfg.speed;
        else if (i > 0 && plan.rate > 0) next_at += arrivals.NextGapSeconds();
        if (next_at > cfg.duration) break;
        const double wait = next_at - elapsed();
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        while (in_flight.load() >= cfg.max_in_flight) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
    summaries.push_back(Summarize(phase, cfg.slo));
    if (std::string text; !before.empty() && GetText(cfg.target, "/metrics", 2.0, &text)) {
      summaries.back()["server"] = ServerCounters(before, ParsePrometheus(text));
    }
    std::fputs(SummaryText(summaries.back()).c_str(), stdout);
    std::fflush(stdout);
    phases.push_back(std::move(phase));
  }
  if (summaries.size() > 1) {
    std::printf("knee: %s %g\n", cfg.plans.front().kind == Plan::Kind::kClosed ? "concurrency" : "rate", Knee(summaries));
  }
  return LoadResult{std::move(phases), std::move(summaries)};
}

Status WriteReports(const std::string& dir, const std::string& title, const LoadConfig& cfg, const LoadResult& result) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create '{}': {}", dir, ec.message());
  nlohmann::json j;
  j["target"] = "http://" + cfg.target.host + ":" + cfg.target.port + cfg.target.base_path;
  j["endpoint"] = cfg.endpoint;
  j["input_len"] = cfg.in_len.spec();
  j["output_len"] = cfg.out_len.spec();
  j["summaries"] = result.summaries;
  if (result.summaries.size() > 1) j["knee"] = Knee(result.summaries);
  nlohmann::json reqs = nlohmann::json::array();
  for (const auto& p : result.phases) {
    for (const auto& r : p.results) {
      reqs.push_back({{"phase", p.label}, {"start_s", r.start_s}, {"ttft_s", r.ttft_s}, {"e2e_s", r.e2e_s},
                      {"itl_s", r.itl_s}, {"prompt_tokens", r.prompt_tokens}, {"output_tokens", r.output_tokens},
                      {"input_len", r.input_len}, {"output_len", r.output_len},
                      {"outcome", OutcomeName(r.outcome)}, {"http_status", r.http_status}, {"error", r.error}});
    }
  }
  j["requests"] = reqs;
  std::ofstream(dir + "/results.json") << j.dump(1) << '\n';
  std::ofstream html(dir + "/report.html");
  html << HtmlReport(title, result.phases, result.summaries);
  if (!html) return IoError("cannot write {}/report.html", dir);
  return Status::Ok();
}

}  // namespace gale::loadgen
