// Sampler cost per token (Google Benchmark): one row of logits over a Llama-2-sized (32,000) or
// Llama-3-sized (128,256) vocabulary, with the settings an OpenAI client sends by default
// (temperature 1, no truncation), a nucleus (top_p 0.95), the CLI's defaults (top_k 40, top_p
// 0.95, min_p 0.05), and greedy. Logits are a peaked random row, like a model's.
//   build/sampler_bench
#include <benchmark/benchmark.h>

#include <vector>

#include "base/rng.h"
#include "runner/sampler.h"

namespace gale {
namespace {

// args: vocab, settings (0: temperature 1 untruncated, 1: top_p 0.95, 2: CLI defaults, 3: greedy).
void BM_Sample(benchmark::State& state) {
  const int64_t vocab = state.range(0);
  SamplingParams p;
  p.seed = 7;
  switch (state.range(1)) {
    case 0:
      p.temperature = 1.0f, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
      break;
    case 1:
      p.temperature = 1.0f, p.top_k = 0, p.top_p = 0.95f, p.min_p = 0.0f;
      break;
    case 2:
      break;  // SamplingParams' defaults (the CLI's)
    default:
      p.temperature = 0.0f;
  }
  Rng rng(3);
  std::vector<float> row(vocab);
  // A few strong candidates over a long tail, as a language model's logits look.
  for (float& v : row) v = rng.Uniform(-4.0f, 4.0f);
  for (int i = 0; i < 20; ++i) row[rng.NextU64() % vocab] += 8.0f;
  Sampler s(p);
  std::vector<float> logits(vocab);
  for (auto _ : state) {
    logits = row;
    benchmark::DoNotOptimize(s.Sample(logits, {}));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Sample)->ArgsProduct({{32000, 128256}, {0, 1, 2, 3}})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
