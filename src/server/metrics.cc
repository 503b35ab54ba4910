// Prometheus text exposition.
#include "server/metrics.h"

#include <fmt/format.h>

namespace gale::server {

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  *out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}),
      e2e_({0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0}) {}

void Metrics::RequestDone(const std::string& outcome, int64_t prompt_tokens, int64_t generation_tokens,
                          double ttft_s, double e2e_s) {
  std::lock_guard<std::mutex> lock(mu_);
  ++outcomes_[outcome];
  (void)prompt_tokens;  // counted as they are processed (Tokens)
  if (outcome == "rejected") return;
  if (ttft_s >= 0) ttft_.Observe(ttft_s);
  if (generation_tokens > 1 && ttft_s >= 0) tpot_.Observe((e2e_s - ttft_s) / static_cast<double>(generation_tokens - 1));
  e2e_.Observe(e2e_s);
}

void Metrics::Tokens(int64_t prompt_tokens, int64_t generation_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  generation_tokens_ += static_cast<uint64_t>(generation_tokens);
}

void Metrics::HttpResponse(int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_status_[status];
}

std::string Metrics::Render(const Engine* engine) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  out += "# HELP gale:request_success_total Finished requests by finish reason.\n# TYPE gale:request_success_total counter\n";
  for (const char* r : {"stop", "length", "abort", "error", "rejected"}) {
    auto it = outcomes_.find(r);
    out += fmt::format("gale:request_success_total{{finished_reason=\"{}\"}} {}\n", r, it == outcomes_.end() ? 0 : it->second);
  }
  out += "# HELP gale:http_responses_total HTTP responses by status.\n# TYPE gale:http_responses_total counter\n";
  for (const auto& [status, n] : http_status_) out += fmt::format("gale:http_responses_total{{status=\"{}\"}} {}\n", status, n);
  out += fmt::format("# HELP gale:prompt_tokens_total Prompt tokens processed (counted when a request's prompt is done).\n# TYPE gale:prompt_tokens_total counter\ngale:prompt_tokens_total {}\n", prompt_tokens_);
  out += fmt::format("# HELP gale:generation_tokens_total Tokens generated (counted as they are generated).\n# TYPE gale:generation_tokens_total counter\ngale:generation_tokens_total {}\n", generation_tokens_);
  ttft_.Render("gale:time_to_first_token_seconds", "Time to first token.", &out);
  tpot_.Render("gale:time_per_output_token_seconds", "Time per output token after the first.", &out);
  e2e_.Render("gale:e2e_request_latency_seconds", "End-to-end request latency.", &out);
  if (engine != nullptr) {
    const EngineStats& s = engine->stats();
    const double used = engine->num_blocks() > 0
                            ? 1.0 - static_cast<double>(s.num_free_blocks.load()) / static_cast<double>(engine->num_blocks())
                            : 0.0;
    out += fmt::format("# HELP gale:num_requests_running Requests in the running batch.\n# TYPE gale:num_requests_running gauge\ngale:num_requests_running {}\n", s.num_running.load());
    out += fmt::format("# HELP gale:num_requests_waiting Requests waiting to be scheduled.\n# TYPE gale:num_requests_waiting gauge\ngale:num_requests_waiting {}\n", s.num_waiting.load());
    out += fmt::format("# HELP gale:kv_cache_usage_perc Share of KV blocks in use (1 = full).\n# TYPE gale:kv_cache_usage_perc gauge\ngale:kv_cache_usage_perc {}\n", used);
    out += fmt::format("# HELP gale:num_preemptions_total Preemptions.\n# TYPE gale:num_preemptions_total counter\ngale:num_preemptions_total {}\n", s.num_preemptions.load());
    out += fmt::format("# HELP gale:prefix_cache_queries_total Prompt tokens looked up in the prefix cache.\n# TYPE gale:prefix_cache_queries_total counter\ngale:prefix_cache_queries_total {}\n", s.prefix_cache_query_tokens.load());
    out += fmt::format("# HELP gale:prefix_cache_hits_total Prompt tokens found in the prefix cache.\n# TYPE gale:prefix_cache_hits_total counter\ngale:prefix_cache_hits_total {}\n", s.prefix_cache_hit_tokens.load());
    out += fmt::format("# HELP gale:prefix_cache_blocks Blocks findable in the prefix cache.\n# TYPE gale:prefix_cache_blocks gauge\ngale:prefix_cache_blocks {}\n", s.prefix_cache_blocks.load());
    out += fmt::format("# HELP gale:spec_decode_num_drafts_total Verifications of one request's speculative guesses.\n# TYPE gale:spec_decode_num_drafts_total counter\ngale:spec_decode_num_drafts_total {}\n", s.spec_num_drafts.load());
    out += fmt::format("# HELP gale:spec_decode_num_draft_tokens_total Speculative tokens guessed and verified.\n# TYPE gale:spec_decode_num_draft_tokens_total counter\ngale:spec_decode_num_draft_tokens_total {}\n", s.spec_num_draft_tokens.load());
    out += fmt::format("# HELP gale:spec_decode_num_accepted_tokens_total Speculative tokens accepted.\n# TYPE gale:spec_decode_num_accepted_tokens_total counter\ngale:spec_decode_num_accepted_tokens_total {}\n", s.spec_num_accepted_tokens.load());
    out += fmt::format("# HELP gale:kv_evicted_tokens_total Positions KV retention dropped from sequences' caches.\n# TYPE gale:kv_evicted_tokens_total counter\ngale:kv_evicted_tokens_total {}\n", s.kv_evicted_tokens.load());
    out += fmt::format("# HELP gale:kv_evictions_total KV retention compactions.\n# TYPE gale:kv_evictions_total counter\ngale:kv_evictions_total {}\n", s.kv_evictions.load());
    out += fmt::format("# HELP gale:engine_steps_total Engine steps.\n# TYPE gale:engine_steps_total counter\ngale:engine_steps_total {}\n", s.num_steps.load());
  }
  return out;
}

}  // namespace gale::server
