// Statistics and reports.
#include "loadgen/report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace gale::loadgen {

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

namespace {

nlohmann::json Stats(const std::vector<double>& v) {
  nlohmann::json j;
  double sum = 0.0;
  for (double x : v) sum += x;
  auto num = [](double x) { return std::isnan(x) ? nlohmann::json(nullptr) : nlohmann::json(x); };
  j["mean"] = v.empty() ? nlohmann::json(nullptr) : nlohmann::json(sum / static_cast<double>(v.size()));
  j["p50"] = num(Percentile(v, 0.5));
  j["p90"] = num(Percentile(v, 0.9));
  j["p99"] = num(Percentile(v, 0.99));
  j["p99.9"] = num(Percentile(v, 0.999));
  j["count"] = v.size();
  return j;
}

double TpotOf(const RequestResult& r) {
  if (r.output_tokens <= 1 || r.ttft_s < 0) return -1.0;
  return (r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1);
}

}  // namespace

nlohmann::json Summarize(const Phase& phase, const Slo& slo) {
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t ok = 0, good = 0, out_tokens = 0, in_tokens = 0;
  std::map<std::string, int64_t> errors;
  for (const auto& r : phase.results) {
    if (r.outcome != Outcome::kOk) {
      ++errors[OutcomeName(r.outcome)];
      continue;
    }
    ++ok;
    out_tokens += r.output_tokens;
    in_tokens += r.prompt_tokens;
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    const double t = TpotOf(r);
    if (t >= 0) tpot.push_back(t);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    e2e.push_back(r.e2e_s);
    const bool meets = (slo.ttft_s < 0 || (r.ttft_s >= 0 && r.ttft_s <= slo.ttft_s)) &&
                       (slo.tpot_s < 0 || (t >= 0 && t <= slo.tpot_s)) && (slo.e2e_s < 0 || r.e2e_s <= slo.e2e_s);
    good += meets;
  }
  const double wall = std::max(phase.wall_s, 1e-9);
  const int64_t n = static_cast<int64_t>(phase.results.size());
  nlohmann::json j;
  j["label"] = phase.label;
  j["load"] = phase.load;
  j["requests"] = n;
  j["completed"] = ok;
  j["wall_seconds"] = phase.wall_s;
  j["request_throughput"] = static_cast<double>(ok) / wall;
  j["output_token_throughput"] = static_cast<double>(out_tokens) / wall;
  j["total_token_throughput"] = static_cast<double>(out_tokens + in_tokens) / wall;
  j["goodput"] = static_cast<double>(good) / wall;
  j["slo_attainment"] = n > 0 ? static_cast<double>(good) / static_cast<double>(n) : 0.0;
  const auto timeouts = errors.count("timeout") ? errors.at("timeout") : 0;
  j["timeout_rate"] = n > 0 ? static_cast<double>(timeouts) / static_cast<double>(n) : 0.0;
  j["error_rate"] = n > 0 ? static_cast<double>(n - ok) / static_cast<double>(n) : 0.0;
  j["errors"] = errors;
  j["ttft_s"] = Stats(ttft);
  j["tpot_s"] = Stats(tpot);
  j["itl_s"] = Stats(itl);
  j["e2e_s"] = Stats(e2e);
  return j;
}

nlohmann::json ServerCounters(const std::map<std::string, double>& before, const std::map<std::string, double>& after) {
  auto delta = [&](const std::string& name) -> double {
    auto a = after.find(name);
    if (a == after.end()) return -1.0;
    auto b = before.find(name);
    return a->second - (b == before.end() ? 0.0 : b->second);
  };
  nlohmann::json out = nlohmann::json::object();
  const double drafts = delta("gale:spec_decode_num_drafts_total");
  const double guessed = delta("gale:spec_decode_num_draft_tokens_total");
  const double accepted = delta("gale:spec_decode_num_accepted_tokens_total");
  if (drafts >= 0 && guessed >= 0 && accepted >= 0) {
    out["spec_drafts"] = drafts;
    out["spec_draft_tokens"] = guessed;
    out["spec_accepted_tokens"] = accepted;
    out["spec_acceptance_rate"] = guessed > 0 ? accepted / guessed : 0.0;
    out["spec_mean_tokens_per_verify"] = drafts > 0 ? 1.0 + accepted / drafts : 0.0;
  }
  const double queries = delta("gale:prefix_cache_queries_total"), hits = delta("gale:prefix_cache_hits_total");
  if (queries >= 0 && hits >= 0) out["prefix_cache_hit_rate"] = queries > 0 ? hits / queries : 0.0;
  if (const double p = delta("gale:num_preemptions_total"); p >= 0) out["preemptions"] = p;
  return out;
}

std::string SummaryText(const nlohmann::json& s) {
  auto ms = [](const nlohmann::json& v) { return v.is_null() ? std::string("-") : fmt::format("{:.1f}", v.get<double>() * 1e3); };
  std::string out = fmt::format(
      "== {}: {} requests, {} completed in {:.2f} s\n"
      "   throughput: {:.2f} req/s, {:.1f} output tok/s, {:.1f} total tok/s; goodput {:.2f} req/s ({:.1f}% within SLO)\n"
      "   errors: {:.2f}% (timeouts {:.2f}%){}\n",
      s["label"].get<std::string>(), s["requests"].get<int64_t>(), s["completed"].get<int64_t>(),
      s["wall_seconds"].get<double>(), s["request_throughput"].get<double>(), s["output_token_throughput"].get<double>(),
      s["total_token_throughput"].get<double>(), s["goodput"].get<double>(), 100.0 * s["slo_attainment"].get<double>(),
      100.0 * s["error_rate"].get<double>(), 100.0 * s["timeout_rate"].get<double>(),
      s["errors"].empty() ? "" : " " + s["errors"].dump());
  out += "   ms        mean     p50     p90     p99   p99.9\n";
  for (const char* k : {"ttft_s", "tpot_s", "itl_s", "e2e_s"}) {
    const auto& v = s[k];
    out += fmt::format("   {:<6} {:>7} {:>7} {:>7} {:>7} {:>7}\n", std::string(k).substr(0, std::string(k).size() - 2),
                       ms(v["mean"]), ms(v["p50"]), ms(v["p90"]), ms(v["p99"]), ms(v["p99.9"]));
  }
  if (s.contains("server") && !s["server"].empty()) {
    const auto& c = s["server"];
    out += "   server:";
    if (c.contains("spec_draft_tokens")) {
      out += fmt::format(" speculative {:.0f} of {:.0f} guesses accepted ({:.1f}%), {:.2f} tokens per verifying step;",
                         c["spec_accepted_tokens"].get<double>(), c["spec_draft_tokens"].get<double>(),
                         100.0 * c["spec_acceptance_rate"].get<double>(), c["spec_mean_tokens_per_verify"].get<double>());
    }
    if (c.contains("prefix_cache_hit_rate")) {
      out += fmt::format(" prefix cache hits {:.1f}%;", 100.0 * c["prefix_cache_hit_rate"].get<double>());
    }
    if (c.contains("preemptions")) out += fmt::format(" {:.0f} preemptions", c["preemptions"].get<double>());
    out += "\n";
  }
  return out;
}

double Knee(const std::vector<nlohmann::json>& s) {
  if (s.size() < 2) return -1.0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    const double t0 = s[i]["output_token_throughput"], t1 = s[i + 1]["output_token_throughput"];
    const auto& p0 = s[i]["ttft_s"]["p99"];
    const auto& p1 = s[i + 1]["ttft_s"]["p99"];
    const bool flat = t1 < t0 * 1.10;
    const bool blowup = !p0.is_null() && !p1.is_null() && p1.get<double>() > 2.0 * p0.get<double>();
    if (flat || blowup) return s[i]["load"];
  }
  return s.back()["load"];
}

namespace {

// A line chart in SVG: series of (x, y) points, axes with min/max labels, optional marked x.
std::string Chart(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                  const std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>>& series,
                  double mark_x = std::nan(""), bool dots = false) {
  const double w = 560, h = 300, l = 60, r = 20, t = 30, b = 45;
  double x0 = INFINITY, x1 = -INFINITY, y0 = 0, y1 = -INFINITY;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.second) {
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y1 = std::max(y1, y);
    }
  }
  if (!(x1 > x0)) {
    x0 = std::isfinite(x0) ? x0 - 1 : 0;
    x1 = x0 + 2;
  }
  if (!(y1 > y0)) y1 = 1;
  auto X = [&](double x) { return l + (x - x0) / (x1 - x0) * (w - l - r); };
  auto Y = [&](double y) { return h - b - (y - y0) / (y1 - y0) * (h - t - b); };
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"};
  std::string svg = fmt::format("<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
                                "viewBox=\"0 0 {} {}\"><title>{}</title>", w, h, w, h, title);
  svg += fmt::format("<text x=\"{}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>", l, title);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>", l, h - b, w - r, h - b);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>", l, t, l, h - b);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\">{:.3g}</text>", l, h - b + 14, x0);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{:.3g}</text>", w - r, h - b + 14, x1);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>", (l + w - r) / 2, h - 8, xlabel);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{:.3g}</text>", l - 4, t + 4, y1);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">0</text>", l - 4, h - b);
  svg += fmt::format("<text x=\"14\" y=\"{}\" font-size=\"11\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>",
                     (t + h - b) / 2, (t + h - b) / 2, ylabel);
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % 5];
    std::string pts;
    for (const auto& [x, y] : series[i].second) {
      pts += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
      if (dots) svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2\" fill=\"{}\"/>", X(x), Y(y), color);
    }
    if (!dots) svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>", color, pts);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"{}\">{}</text>", w - r - 140, t + 14 * (i + 1), color,
                       series[i].first);
  }
  if (std::isfinite(mark_x)) {
    svg += fmt::format("<line class=\"knee\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#888\" stroke-dasharray=\"4\"/>"
                       "<text x=\"{0:.1f}\" y=\"{1}\" font-size=\"11\">knee</text>", X(mark_x), t + 10, h - b);
  }
  return svg + "</svg>";
}

std::vector<std::pair<double, double>> Cdf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < v.size(); ++i) out.emplace_back(v[i] * 1e3, static_cast<double>(i + 1) / static_cast<double>(v.size()));
  return out;
}

}  // namespace

std::string HtmlReport(const std::string& title, const std::vector<Phase>& phases,
                       const std::vector<nlohmann::json>& summaries) {
  std::vector<double> ttft, e2e, tpot;
  std::vector<std::pair<double, double>> ttft_time, tput;
  double end = 0.0;
  for (const auto& p : phases) {
    for (const auto& r : p.results) {
      if (r.outcome != Outcome::kOk) continue;
      if (r.ttft_s >= 0) {
        ttft.push_back(r.ttft_s);
        ttft_time.emplace_back(r.start_s, r.ttft_s * 1e3);
      }
      e2e.push_back(r.e2e_s);
      end = std::max(end, r.start_s + r.e2e_s);
    }
  }
  // Output tokens per second in one-second bins, each request's tokens spread over its decode.
  std::vector<double> bins(static_cast<size_t>(std::ceil(end)) + 1, 0.0);
  for (const auto& p : phases) {
    for (const auto& r : p.results) {
      if (r.outcome != Outcome::kOk || r.output_tokens <= 0) continue;
      const double a = r.start_s + std::max(0.0, r.ttft_s), z = r.start_s + r.e2e_s;
      const double per = static_cast<double>(r.output_tokens) / std::max(z - a, 1e-3);
      for (size_t s = static_cast<size_t>(a); s < bins.size() && static_cast<double>(s) < z; ++s) {
        bins[s] += per * (std::min(z, s + 1.0) - std::max(a, static_cast<double>(s)));
      }
    }
  }
  for (size_t s = 0; s < bins.size(); ++s) tput.emplace_back(static_cast<double>(s), bins[s]);
  std::string html = "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>" + title +
                     "</title><style>body{font-family:sans-serif;margin:2em}pre{background:#f4f4f4;padding:1em}"
                     "svg{margin:0.5em;border:1px solid #ddd}</style></head><body><h1>" + title + "</h1>";
  html += "<h2>Latency distributions</h2>";
  html += Chart("TTFT and end-to-end latency (CDF)", "milliseconds", "fraction of requests",
                {{"TTFT", Cdf(ttft)}, {"E2E", Cdf(e2e)}});
  html += "<h2>Over time</h2>";
  html += Chart("TTFT over the test", "seconds since start", "TTFT ms", {{"TTFT", ttft_time}}, std::nan(""), true);
  html += Chart("Output tokens per second", "seconds since start", "tokens/s", {{"throughput", tput}});
  if (summaries.size() > 1) {
    std::vector<std::pair<double, double>> tp, p99;
    for (const auto& s : summaries) {
      tp.emplace_back(s["load"].get<double>(), s["output_token_throughput"].get<double>());
      if (!s["ttft_s"]["p99"].is_null()) p99.emplace_back(s["load"].get<double>(), s["ttft_s"]["p99"].get<double>() * 1e3);
    }
    const double knee = Knee(summaries);
    html += "<h2>Against load</h2>";
    html += Chart("Output throughput against load", "load", "tokens/s", {{"throughput", tp}}, knee);
    html += Chart("p99 TTFT against load", "load", "ms", {{"p99 TTFT", p99}}, knee);
  }
  html += "<h2>Summary</h2>";
  for (const auto& s : summaries) {
    std::string text = SummaryText(s);
    std::string esc;
    for (char c : text) esc += c == '<' ? std::string("&lt;") : c == '&' ? std::string("&amp;") : std::string(1, c);
    html += "<pre>" + esc + "</pre>";
  }
  return html + "</body></html>\n";
}

}  // namespace gale::loadgen
