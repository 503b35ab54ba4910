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

void Histogram::Render(const std::string& name, const std::string& help, const std::string& labels, std::string* out) const {
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const std::string more = labels.empty() ? "" : "," + labels;
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"{}}} {}\n", name, bounds_[i], more, cum);
  }
  cum += counts_.back();
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  *out += fmt::format("{}_bucket{{le=\"+Inf\"{}}} {}\n{}_sum{} {}\n{}_count{} {}\n", name, more, cum, name, braces, sum_, name,
                      braces, count_);
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

std::string Metrics::Render(const Engine* engine, const std::string& model_name) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  // The families vLLM also has come twice: as gale:NAME, and as vllm:NAME with vLLM's model_name
  // label, so that routers and autoscalers written for vLLM read gale unchanged.
  std::string escaped;
  for (char c : model_name) {
    if (c == '\\' || c == '"') escaped += '\\';
    escaped += c == '\n' ? ' ' : c;
  }
  const std::string vllm_label = fmt::format("model_name=\"{}\"", escaped);
  struct Sample {
    std::string labels;  // "" or `key="value"`
    double value;
  };
  auto family = [&](const char* type, const std::string& name, const std::string& help, const std::vector<Sample>& samples,
                    bool vllm) {
    for (const bool v : {false, true}) {
      if (v && !vllm) break;
      const std::string full = (v ? "vllm:" : "gale:") + name;
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", full, help, full, type);
      for (const Sample& s : samples) {
        std::string labels = s.labels;
        if (v) labels = labels.empty() ? vllm_label : labels + "," + vllm_label;
        out += fmt::format("{}{} {}\n", full, labels.empty() ? "" : "{" + labels + "}", s.value);
      }
    }
  };
  auto histogram = [&](const Histogram& h, const std::string& name, const std::string& help) {
    h.Render("gale:" + name, help, "", &out);
    h.Render("vllm:" + name, help, vllm_label, &out);
  };
  std::vector<Sample> outcomes;
  for (const char* r : {"stop", "length", "abort", "error", "rejected"}) {
    auto it = outcomes_.find(r);
    outcomes.push_back({fmt::format("finished_reason=\"{}\"", r), static_cast<double>(it == outcomes_.end() ? 0 : it->second)});
  }
  family("counter", "request_success_total", "Finished requests by finish reason.", outcomes, true);
  std::vector<Sample> statuses;
  for (const auto& [status, n] : http_status_) statuses.push_back({fmt::format("status=\"{}\"", status), static_cast<double>(n)});
  family("counter", "http_responses_total", "HTTP responses by status.", statuses, false);
  family("counter", "prompt_tokens_total", "Prompt tokens processed (counted when a request's prompt is done).",
         {{"", static_cast<double>(prompt_tokens_)}}, true);
  family("counter", "generation_tokens_total", "Tokens generated (counted as they are generated).",
         {{"", static_cast<double>(generation_tokens_)}}, true);
  histogram(ttft_, "time_to_first_token_seconds", "Time to first token.");
  histogram(tpot_, "time_per_output_token_seconds", "Time per output token after the first.");
  histogram(e2e_, "e2e_request_latency_seconds", "End-to-end request latency.");
  if (engine != nullptr) {
    const EngineStats& s = engine->stats();
    const double used = engine->num_blocks() > 0
                            ? 1.0 - static_cast<double>(s.num_free_blocks.load()) / static_cast<double>(engine->num_blocks())
                            : 0.0;
    auto one = [](double v) { return std::vector<Sample>{{"", v}}; };
    family("gauge", "num_requests_running", "Requests in the running batch.", one(s.num_running.load()), true);
    family("gauge", "num_requests_waiting", "Requests waiting to be scheduled.", one(s.num_waiting.load()), true);
    family("gauge", "kv_cache_usage_perc", "Share of KV blocks in use (1 = full).", one(used), true);
    // vLLM's older name for the same gauge, which some autoscalers still read.
    out += fmt::format("# HELP vllm:gpu_cache_usage_perc Share of KV blocks in use (1 = full).\n"
                       "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{{{}}} {}\n", vllm_label, used);
    family("counter", "num_preemptions_total", "Preemptions.", one(s.num_preemptions.load()), true);
    family("counter", "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
           one(s.prefix_cache_query_tokens.load()), true);
    family("counter", "prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", one(s.prefix_cache_hit_tokens.load()), true);
    family("gauge", "prefix_cache_blocks", "Blocks findable in the prefix cache.", one(s.prefix_cache_blocks.load()), false);
    family("counter", "spec_decode_num_drafts_total", "Verifications of one request's speculative guesses.",
           one(s.spec_num_drafts.load()), true);
    family("counter", "spec_decode_num_draft_tokens_total", "Speculative tokens guessed and verified.",
           one(s.spec_num_draft_tokens.load()), true);
    family("counter", "spec_decode_num_accepted_tokens_total", "Speculative tokens accepted.",
           one(s.spec_num_accepted_tokens.load()), true);
    family("counter", "kv_evicted_tokens_total", "Positions KV retention dropped from sequences' caches.",
           one(s.kv_evicted_tokens.load()), false);
    family("counter", "kv_evictions_total", "KV retention compactions.", one(s.kv_evictions.load()), false);
    family("counter", "engine_steps_total", "Engine steps.", one(s.num_steps.load()), false);
  }
  return out;
}

}  // namespace gale::server
