// Profiler output: Chrome trace-event JSON written by hand (names are our own static strings,
// no escaping needed) and a plain-text summary.
#include "base/profiler.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

namespace gale {
namespace {
Profiler* g_profiler = nullptr;
}

void SetProfiler(Profiler* p) { g_profiler = p; }
Profiler* GetProfiler() { return g_profiler; }

Profiler::Profiler() : origin_(std::chrono::steady_clock::now()) { events_.reserve(1 << 16); }

int64_t Profiler::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count();
}

Status Profiler::WriteChromeTrace(const std::string& path) const {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return IoError("cannot write trace '{}': {}", path, std::strerror(errno));
  std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
  for (size_t i = 0; i < events_.size(); ++i) {
    const TraceEvent& e = events_[i];
    std::fprintf(f,
                 "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,"
                 "\"args\":{\"layer\":%lld,\"tokens\":%lld,\"bytes\":%lld}}%s\n",
                 e.name, e.category, e.start_ns / 1000.0, e.duration_ns / 1000.0, static_cast<long long>(e.layer),
                 static_cast<long long>(e.tokens), static_cast<long long>(e.bytes), i + 1 < events_.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  if (std::fclose(f) != 0) return IoError("writing trace '{}' failed", path);
  return Status::Ok();
}

std::string Profiler::Summary() const {
  struct Acc {
    int64_t ns = 0, count = 0, bytes = 0;
  };
  std::map<std::string, Acc> ops, steps, cpu;
  int64_t op_total = 0;
  for (const auto& e : events_) {
    std::map<std::string, Acc>* m = std::strcmp(e.category, "op") == 0     ? &ops
                                    : std::strcmp(e.category, "step") == 0 ? &steps
                                                                           : &cpu;
    Acc& a = (*m)[e.name];
    a.ns += e.duration_ns;
    a.count += 1;
    a.bytes += e.bytes;
    if (m == &ops) op_total += e.duration_ns;
  }
  std::string out;
  char line[256];
  auto section = [&](const char* title, const std::map<std::string, Acc>& m, int64_t total) {
    std::vector<std::pair<std::string, Acc>> v(m.begin(), m.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    out += title;
    for (const auto& [name, a] : v) {
      const double ms = a.ns / 1e6;
      std::snprintf(line, sizeof(line), "  %-14s %9.2f ms %6.1f%%  %7lld calls", name.c_str(), ms,
                    total > 0 ? 100.0 * a.ns / total : 0.0, static_cast<long long>(a.count));
      out += line;
      if (a.bytes > 0 && a.ns > 0) {
        std::snprintf(line, sizeof(line), "  %6.1f GB/s", a.bytes / (a.ns / 1e9) / 1e9);
        out += line;
      }
      out += "\n";
    }
  };
  int64_t step_total = 0, cpu_total = 0;
  for (const auto& [n, a] : steps) step_total += a.ns;
  for (const auto& [n, a] : cpu) cpu_total += a.ns;
  section("time per op kind (model forward):\n", ops, op_total);
  section("steps:\n", steps, step_total);
  section("CPU-side work outside the model:\n", cpu, step_total + cpu_total);
  return out;
}

}  // namespace gale
