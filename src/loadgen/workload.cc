// Workload generation.
#include "loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

namespace gale::loadgen {

StatusOr<LengthDist> LengthDist::Parse(const std::string& spec) {
  LengthDist d;
  d.spec_ = spec;
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), args = colon == std::string::npos ? "" : spec.substr(colon + 1);
  auto bad = [&] {
    return InvalidArgument("length '{}': use fixed:N, uniform:A-B, lognormal:MEDIAN,SIGMA or zipf:A-B,S", spec);
  };
  try {
    if (kind == "fixed") {
      d.kind_ = Kind::kFixed;
      d.a_ = std::stoll(args);
      if (d.a_ < 1) return bad();
    } else if (kind == "uniform" || kind == "zipf") {
      const size_t dash = args.find('-');
      if (dash == std::string::npos) return bad();
      d.a_ = std::stoll(args.substr(0, dash));
      const size_t comma = args.find(',', dash);
      d.b_ = std::stoll(args.substr(dash + 1, comma == std::string::npos ? std::string::npos : comma - dash - 1));
      if (d.a_ < 1 || d.b_ < d.a_ || d.b_ > 1000000) return bad();
      d.kind_ = kind == "uniform" ? Kind::kUniform : Kind::kZipf;
      if (d.kind_ == Kind::kZipf) {
        d.x_ = comma == std::string::npos ? 1.1 : std::stod(args.substr(comma + 1));
        double sum = 0.0;
        for (int64_t n = d.a_; n <= d.b_; ++n) {
          sum += std::pow(static_cast<double>(n - d.a_ + 1), -d.x_);
          d.cdf_.push_back(sum);
        }
        for (double& c : d.cdf_) c /= sum;
      }
    } else if (kind == "lognormal") {
      const size_t comma = args.find(',');
      if (comma == std::string::npos) return bad();
      d.kind_ = Kind::kLognormal;
      d.x_ = std::stod(args.substr(0, comma));  // median
      d.y_ = std::stod(args.substr(comma + 1));  // sigma of the log
      if (d.x_ < 1 || d.y_ < 0) return bad();
    } else {
      return bad();
    }
  } catch (const std::exception&) {
    return bad();
  }
  return d;
}

int64_t LengthDist::Sample(Rng& rng) const {
  switch (kind_) {
    case Kind::kFixed: return a_;
    case Kind::kUniform: return a_ + static_cast<int64_t>(rng.NextU64() % static_cast<uint64_t>(b_ - a_ + 1));
    case Kind::kLognormal: {
      // Box-Muller normal.
      const double u1 = std::max(1e-12, rng.UniformDouble()), u2 = rng.UniformDouble();
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      return std::clamp<int64_t>(static_cast<int64_t>(std::llround(x_ * std::exp(y_ * z))), 1, 32768);
    }
    case Kind::kZipf: {
      const double u = rng.UniformDouble();
      const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
      return a_ + static_cast<int64_t>(std::min<size_t>(it - cdf_.begin(), cdf_.size() - 1));
    }
  }
  return a_;
}

double Arrivals::Normal() {
  const double u1 = std::max(1e-12, rng_.UniformDouble()), u2 = rng_.UniformDouble();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Marsaglia and Tsang's method; shape < 1 through the boost u^(1/shape).
double Arrivals::Gamma(double shape) {
  if (shape < 1.0) {
    const double u = std::max(1e-12, rng_.UniformDouble());
    return Gamma(shape + 1.0) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    double x, v;
    do {
      x = Normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = rng_.UniformDouble();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(std::max(u, 1e-300)) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

double Arrivals::NextGapSeconds() {
  if (rate_ <= 0) return 0.0;
  return Gamma(k_) / (k_ * rate_);
}

std::string MakePrompt(Rng& rng, int64_t n_words, int64_t prefix_words, int prefix_group) {
  static const char* kWords[] = {"the", "cat", "dog", "sat", "on", "a", "mat", "and", "ran", "to", "the", "park",
                                 "with", "her", "friend", "they", "played", "in", "sun", "one", "day", "big", "red",
                                 "ball", "was", "happy", "tree", "saw", "little", "bird", "sang", "song", "home"};
  constexpr size_t kNum = sizeof(kWords) / sizeof(kWords[0]);
  std::string out;
  Rng shared(1000003ull * static_cast<uint64_t>(prefix_group + 1));
  for (int64_t i = 0; i < n_words; ++i) {
    Rng& r = prefix_group >= 0 && i < prefix_words ? shared : rng;
    if (i) out += ' ';
    out += kWords[r.NextU64() % kNum];
  }
  return out;
}

StatusOr<std::vector<TraceEntry>> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IoError("cannot open trace '{}'", path);
  std::vector<TraceEntry> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument("{}:{}: not a JSON object", path, n);
    TraceEntry e;
    if (j.contains("timestamp") && j["timestamp"].is_number()) e.at_s = j["timestamp"].get<double>();
    else if (j.contains("timestamp_ms") && j["timestamp_ms"].is_number()) e.at_s = j["timestamp_ms"].get<double>() / 1e3;
    else return InvalidArgument("{}:{}: needs \"timestamp\" (seconds) or \"timestamp_ms\"", path, n);
    if (j.contains("prompt") && j["prompt"].is_string()) e.prompt = j["prompt"];
    if (j.contains("input_length") && j["input_length"].is_number_integer()) e.input_length = j["input_length"];
    if (j.contains("output_length") && j["output_length"].is_number_integer()) e.output_length = j["output_length"];
    if (e.prompt.empty() && e.input_length <= 0) return InvalidArgument("{}:{}: needs \"prompt\" or \"input_length\"", path, n);
    if (e.output_length <= 0) e.output_length = 128;
    out.push_back(std::move(e));
  }
  if (out.empty()) return InvalidArgument("trace '{}' has no requests", path);
  std::stable_sort(out.begin(), out.end(), [](const TraceEntry& a, const TraceEntry& b) { return a.at_s < b.at_s; });
  const double t0 = out.front().at_s;
  for (auto& e : out) e.at_s -= t0;
  return out;
}

}  // namespace gale::loadgen
