// Tokenizer throughput (Google Benchmark; --benchmark_format=json for JSON): encode MB/s of
// English prose on one core for the GPT-2 (byte-level BPE) and Llama (SentencePiece) vocabs from
// ../shared/vocab, and the batch API on the pool.
//   build/tokenizer_bench [--benchmark_format=json]
// The default text is generated (see Prose()); GALE_PROSE=FILE measures on another file.
#include <benchmark/benchmark.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gguf/gguf_file.h"
#include "model/tokenizer.h"

namespace gale {
namespace {

std::string Prose() {
  if (const char* f = std::getenv("GALE_PROSE")) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // About 64 KiB of English-like prose: words drawn with Zipf-like frequencies (rank r with
  // weight 1/r) from a list of common words, in sentences with punctuation, digits and line breaks,
  // so a cache of repeated words helps about as much as it would on real text.
  static const char* kWords[] = {
      "the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as",
      "with", "his", "they", "I", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but",
      "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which",
      "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them",
      "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look", "two",
      "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first", "water",
      "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get", "come", "made",
      "may", "part", "garden", "mountain", "river", "library", "telescope", "breakfast", "carefully",
      "wonderful", "quietly", "adventure", "yesterday", "neighbourhood", "extraordinary", "government",
      "information", "development", "understanding", "particularly", "environmental", "responsibility"};
  constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  double total = 0.0;
  for (int r = 1; r <= kNumWords; ++r) total += 1.0 / r;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto uniform = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / 9007199254740992.0;
  };
  std::string s;
  int in_sentence = 0;
  while (s.size() < (64u << 10)) {
    double u = uniform() * total;
    int r = 0;
    while (r + 1 < kNumWords && u > 1.0 / (r + 1)) u -= 1.0 / (++r);
    std::string w = kWords[r];
    if (in_sentence == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
    s += w;
    ++in_sentence;
    const double p = uniform();
    if (in_sentence > 4 && p < 0.12) {
      s += p < 0.02 ? "?\n" : p < 0.04 ? "!  " : ". ";
      in_sentence = 0;
    } else if (p < 0.16) {
      s += ", ";
    } else if (p < 0.17) {
      s += " " + std::to_string(static_cast<int>(uniform() * 2000)) + " ";
    } else {
      s += " ";
    }
  }
  return s;
}

std::unique_ptr<Tokenizer> Load(const std::string& name, std::unique_ptr<GgufFile>* keep) {
  auto f = GgufFile::Open(std::string(GALE_DATA_DIR) + "/vocab/ggml-vocab-" + name + ".gguf");
  if (!f.ok()) return nullptr;
  auto t = Tokenizer::FromGguf(**f);
  if (!t.ok()) return nullptr;
  *keep = std::move(*f);
  return std::move(*t);
}

void BM_Encode(benchmark::State& state, const std::string& vocab) {
  std::unique_ptr<GgufFile> keep;
  auto tok = Load(vocab, &keep);
  if (!tok) {
    state.SkipWithError("vocab not found");
    return;
  }
  const std::string text = Prose();
  for (auto _ : state) benchmark::DoNotOptimize(tok->Encode(text, false));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
}
BENCHMARK_CAPTURE(BM_Encode, gpt2, std::string("gpt-2"))->UseRealTime();
BENCHMARK_CAPTURE(BM_Encode, llama_spm, std::string("llama-spm"))->UseRealTime();

void BM_EncodeBatch(benchmark::State& state, const std::string& vocab) {
  std::unique_ptr<GgufFile> keep;
  auto tok = Load(vocab, &keep);
  if (!tok) {
    state.SkipWithError("vocab not found");
    return;
  }
  const std::string text = Prose();
  std::vector<std::string> prompts;
  for (size_t i = 0; i + 2048 <= text.size(); i += 2048) prompts.push_back(text.substr(i, 2048));
  ThreadPool pool(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(tok->EncodeBatch(prompts, pool, false));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(prompts.size() * 2048));
}
BENCHMARK_CAPTURE(BM_EncodeBatch, gpt2, std::string("gpt-2"))->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_EncodeBatch, llama_spm, std::string("llama-spm"))->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
