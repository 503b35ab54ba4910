// JSONSchemaBench's MaskBench on gale's JSON Schema grammars: per schema, does the grammar compile,
// accept every valid instance in full and reject every invalid one? (The benchmark's own rule; no
// model, no tokenizer: the grammar runs over single bytes.) Prints the counts beside the published
// figures of LLGuidance, XGrammar and llama.cpp, and compile times; writes JSON.
//
// gale writes compact JSON (no whitespace between tokens, an optional space before the value), so
// each instance is compacted first: whitespace outside strings removed. An instance that differs
// only in whitespace is the same document; nothing else about it changes.
//
// Usage: build/maskbench [path/to/maskbench-all.jsonl.gz] [--json out.json] [--limit N] [--threads N]
//        [--objects closed|open]
// --objects: how an object schema without additionalProperties is read: closed (the server's
// default, as llama.cpp and XGrammar's strict mode) or open (JSON Schema's rule, which the
// benchmark's instances follow; a request asks for it with json_schema's "strict": false).
// (MASKBENCH_LIST=1 in the environment lists the schemas that accepted an invalid instance or
// rejected a valid one, and the slowest percent of compilations; MASKBENCH_ERRORS=TEXT those refused
// with TEXT in the message)
// (default path: ../shared/bench/maskbench/maskbench-all.jsonl.gz beside the source tree).
// Compile times are measured in a second pass, one schema at a time (--threads sets the first's).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "grammar/compiler.h"
#include "grammar/json_schema.h"

namespace gale {
namespace {

using Json = nlohmann::json;

std::shared_ptr<const grammar::TokenTrie> ByteTrie() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  return std::make_shared<const grammar::TokenTrie>(bytes, std::vector<bool>(256, true));
}

std::string Compact(const std::string& text) { return grammar::CompactJsonText(text); }

bool Accepts(const std::shared_ptr<const grammar::CompiledGrammar>& g, const std::string& text) {
  grammar::GrammarMatcher m(g, {});
  for (unsigned char b : text) {
    if (!m.Accept(b).ok()) return false;
  }
  return m.CanEnd();
}

struct Result {
  std::string id;
  bool compiled = false, valid_rejected = false, invalid_accepted = false;
  std::string accepted;  // an invalid instance accepted (the first)
  std::string rejected;  // a valid instance rejected (the first)
  double compile_ms = 0;
  std::string error;  // the compile error's message
};

Result Run(const std::shared_ptr<const grammar::TokenTrie>& trie, const std::string& line, grammar::ObjectKeys objects) {
  Result r;
  const Json row = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!row.is_object() || !row.contains("id") || !row["id"].is_string() || !row.contains("schema_text") ||
      !row["schema_text"].is_string() || !row.contains("tests") || !row["tests"].is_array()) {
    r.error = "not a MaskBench row (id, schema_text, tests)";
    return r;
  }
  r.id = row["id"].get<std::string>();
  // One compiler per schema: nothing cached between them.
  grammar::GrammarCompiler compiler(trie, 1);
  grammar::Constraint c{grammar::Constraint::Kind::kJsonSchema, row["schema_text"].get<std::string>(), ""};
  c.objects = objects;
  auto g = compiler.Compile(c);
  if (!g.ok()) {
    r.error = g.status().message();
    return r;
  }
  r.compiled = true;
  for (const Json& t : row["tests"]) {
    if (!t.is_object() || !t.contains("text") || !t["text"].is_string() || !t.contains("valid") || !t["valid"].is_boolean()) continue;
    const bool ok = Accepts(*g, Compact(t["text"].get<std::string>()));
    if (t["valid"].get<bool>() && !ok && !r.valid_rejected) {
      r.valid_rejected = true;
      r.rejected = t["text"].get<std::string>();
    }
    if (!t["valid"].get<bool>() && ok && !r.invalid_accepted) {
      r.invalid_accepted = true;
      r.accepted = t["text"].get<std::string>();
    }
  }
  return r;
}

// One schema's compile time in milliseconds (refusals included), from a fresh compiler.
double CompileMs(const std::shared_ptr<const grammar::TokenTrie>& trie, const std::string& line, grammar::ObjectKeys objects) {
  const Json row = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!row.is_object() || !row.contains("schema_text") || !row["schema_text"].is_string()) return 0;
  grammar::GrammarCompiler compiler(trie, 1);
  grammar::Constraint c{grammar::Constraint::Kind::kJsonSchema, row["schema_text"].get<std::string>(), ""};
  c.objects = objects;
  const auto t0 = std::chrono::steady_clock::now();
  (void)compiler.Compile(c);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int Main(int argc, char** argv) {
  std::string path = std::string(GALE_SOURCE_DIR) + "/../shared/bench/maskbench/maskbench-all.jsonl.gz";
  std::string json_out;
  size_t limit = 0;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  grammar::ObjectKeys objects = grammar::ObjectKeys::kClosed;
  const char* usage =
      "usage: maskbench [path/to/maskbench-all.jsonl.gz] [--json out.json] [--limit N] [--threads N] "
      "[--objects closed|open]\n";
  auto count = [&](const char* flag, const std::string& v) -> std::optional<long> {
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 0) {
      fmt::print(stderr, "{} takes a count, not '{}'\n", flag, v);
      return std::nullopt;
    }
    return n;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      fmt::print("{}", usage);
      return 0;
    }
    if (a == "--objects" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "open" && v != "closed") {
        fmt::print(stderr, "--objects takes open or closed\n");
        return 1;
      }
      objects = v == "open" ? grammar::ObjectKeys::kOpen : grammar::ObjectKeys::kClosed;
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else if (a == "--limit" && i + 1 < argc) {
      auto n = count("--limit", argv[++i]);
      if (!n) return 1;
      limit = static_cast<size_t>(*n);
    } else if (a == "--threads" && i + 1 < argc) {
      auto n = count("--threads", argv[++i]);
      if (!n) return 1;
      threads = static_cast<int>(std::clamp<long>(*n, 1, 1024));
    } else if (!a.empty() && a[0] == '-') {
      fmt::print(stderr, "unknown option {}\n{}", a, usage);
      return 1;
    } else {
      path = a;
    }
  }
  FILE* in = popen(("gzip -dc '" + path + "'").c_str(), "r");
  if (in == nullptr) {
    fmt::print(stderr, "cannot read {}\n", path);
    return 1;
  }
  std::vector<std::string> rows;  // parsed one at a time by the workers
  std::string line;
  for (int ch; (ch = std::fgetc(in)) != EOF;) {
    if (ch != '\n') {
      line += static_cast<char>(ch);
      continue;
    }
    if (!line.empty()) rows.push_back(std::move(line));
    line.clear();
    if (limit > 0 && rows.size() >= limit) break;
  }
  if (!line.empty() && (limit == 0 || rows.size() < limit)) rows.push_back(std::move(line));
  pclose(in);
  if (rows.empty()) {
    fmt::print(stderr, "no schemas in {} (the set-up step's ../shared/bench/maskbench)\n", path);
    return 1;
  }
  const auto trie = ByteTrie();
  std::vector<Result> results(rows.size());
  std::atomic<size_t> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < rows.size();) results[i] = Run(trie, rows[i], objects);
    });
  }
  for (auto& t : pool) t.join();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Compile times come from a pass of their own, one schema at a time: what one request's
  // compilation takes on an otherwise idle machine, not slowed by the test pass's other threads.
  for (size_t i = 0; i < rows.size(); ++i) results[i].compile_ms = CompileMs(trie, rows[i], objects);

  size_t compiled = 0, passing = 0, valid_rejected = 0, invalid_accepted = 0;
  std::vector<double> compile_ms;
  std::map<std::string, size_t> errors;  // the refusal's message up to its first ':' or quote
  for (const Result& r : results) {
    compile_ms.push_back(r.compile_ms);
    if (!r.compiled) {
      // The kind of refusal: the message without its schema path (the first quoted part), names
      // quoted after a keyword's (keywords kept), or numbers.
      std::string key;
      bool quoted = false;
      int quotes = 0;
      std::string part;
      for (char ch : r.error) {
        if (ch == '\'') {
          quoted = !quoted;
          if (!quoted) {
            ++quotes;
            const bool keyword = quotes > 1 && part.find_first_of("/ .") == std::string::npos && part.size() < 24;
            key += keyword ? "'" + part + "'" : "'..'";
            part.clear();
          }
        } else if (quoted) {
          part += ch;
        } else {
          key += (ch >= '0' && ch <= '9') ? 'N' : ch;
        }
      }
      ++errors[key.substr(0, 90)];
      continue;
    }
    ++compiled;
    valid_rejected += r.valid_rejected;
    invalid_accepted += r.invalid_accepted;
    passing += !r.valid_rejected && !r.invalid_accepted;
  }
  const size_t n = rows.size();
  const char* mode = objects == grammar::ObjectKeys::kOpen ? "open" : "closed";
  fmt::print("MaskBench: {} schemas ({}), objects without additionalProperties {}, {:.0f} s on {} threads\n", n, path,
             mode, wall_s, threads);
  fmt::print("| engine | passing | compile errors | a valid instance rejected | an invalid instance accepted |\n");
  fmt::print("|---|---|---|---|---|\n");
  fmt::print("| gale | {} | {} | {} | {} |\n", passing, n - compiled, valid_rejected, invalid_accepted);
  if (n == 11305) {
    fmt::print("| LLGuidance (published) | 8,909 | 2,377 | 20 | 0 |\n");
    fmt::print("| XGrammar (published) | 8,122 | 90 | 1,408 | 1,368 |\n");
    fmt::print("| llama.cpp (published) | 6,505 | 1,301 | 2,850 | 649 |\n");
  }
  fmt::print("compile time: median {:.2f} ms, p99 {:.2f} ms, max {:.0f} ms\n", Percentile(compile_ms, 0.5),
             Percentile(compile_ms, 0.99), Percentile(compile_ms, 1.0));
  std::vector<std::pair<size_t, std::string>> top;
  for (const auto& [k, v] : errors) top.push_back({v, k});
  std::sort(top.rbegin(), top.rend());
  fmt::print("most frequent compile errors:\n");
  for (size_t i = 0; i < std::min<size_t>(20, top.size()); ++i) fmt::print("  {:5} {}\n", top[i].first, top[i].second);
  if (std::getenv("MASKBENCH_LIST") != nullptr) {
    std::vector<std::pair<double, std::string>> slow;
    for (const Result& r : results) slow.emplace_back(r.compile_ms, r.id);
    std::sort(slow.rbegin(), slow.rend());
    // The slowest percent: what the p99 is made of.
    for (size_t i = 0; i < std::max<size_t>(15, slow.size() / 100 + 1) && i < slow.size(); ++i) {
      fmt::print("slow: {:.1f} ms {}\n", slow[i].first, slow[i].second);
    }
    for (const Result& r : results) {
      if (r.invalid_accepted) fmt::print("invalid accepted: {}: {}\n", r.id, r.accepted.substr(0, 200));
      if (r.valid_rejected) fmt::print("valid rejected: {}: {}\n", r.id, Json(r.rejected.substr(0, 300)).dump(-1, ' ', false, Json::error_handler_t::replace));
    }
  }
  if (const char* want = std::getenv("MASKBENCH_ERRORS"); want != nullptr) {
    for (const Result& r : results) {
      if (!r.compiled && r.error.find(want) != std::string::npos) fmt::print("refused: {}: {}\n", r.id, r.error.substr(0, 300));
    }
  }
  if (!json_out.empty()) {
    Json j = {{"schemas", n},
              {"objects", mode},
              {"passing", passing},
              {"compile_errors", n - compiled},
              {"valid_rejected", valid_rejected},
              {"invalid_accepted", invalid_accepted},
              {"compile_ms_median", Percentile(compile_ms, 0.5)},
              {"compile_ms_p99", Percentile(compile_ms, 0.99)},
              {"wall_s", wall_s}};
    Json errs = Json::object();
    for (const auto& [v, k] : top) errs[k] = v;
    j["compile_errors_by_kind"] = errs;
    std::ofstream(json_out) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace gale

int main(int argc, char** argv) { return gale::Main(argc, argv); }
