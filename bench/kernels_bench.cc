// Google Benchmark microbenchmarks of the kernels on the active ISA (GALE_ISA caps it): the
// matmul per weight type at decode (1 token), batched decode (16) and prefill (64 tokens) shapes, attention and the
// activation quantizer. Counters report GB/s of weights read and GFLOP/s.
//   build/kernels_bench --benchmark_filter=MatMul
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "base/fp16.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "kv/kv_storage.h"

namespace gale {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,      GgmlType::kQ8_0,
                               GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kW4A16G64,
                               GgmlType::kW4A16ZG64, GgmlType::kW4A8G64, GgmlType::kQ5_0, GgmlType::kQ5_1,
                               GgmlType::kQ3_K, GgmlType::kQ2_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
                               GgmlType::kF8E4M3, GgmlType::kMXFP4};

struct Matrix {
  std::vector<uint8_t> bytes;
  TensorView view;
  std::unique_ptr<kernels::PackedWeights> packed;
};

Matrix MakeMatrix(GgmlType t, int64_t cols, int64_t rows) {
  Matrix m;
  Rng rng(1);
  std::vector<float> row(cols);
  m.bytes.resize(RowBytes(t, cols) * rows);
  if (t == GgmlType::kQ3_K || t == GgmlType::kQ2_K) {
    // No writer for these: random super-blocks under small scales (the speed does not depend on
    // the values). Q3_K's d is at byte 108; Q2_K's d and dmin at 80 and 82.
    for (uint8_t& b : m.bytes) b = static_cast<uint8_t>(rng.NextU64());
    const uint16_t d = Fp32ToFp16(0.01f);
    const size_t bytes = TypeTraits(t).block_bytes, at = t == GgmlType::kQ3_K ? 108 : 80;
    for (size_t i = 0; i < m.bytes.size(); i += bytes) {
      std::memcpy(&m.bytes[i + at], &d, 2);
      if (t == GgmlType::kQ2_K) std::memcpy(&m.bytes[i + 82], &d, 2);
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : row) v = rng.Uniform(-1, 1);
      QuantizeRowRef(t, row.data(), m.bytes.data() + r * RowBytes(t, cols), cols);
    }
  }
  m.view.type = t;
  m.view.shape = {cols, rows};
  m.view.data = m.bytes.data();
  m.view.num_bytes = m.bytes.size();
  m.packed = kernels::PackForActiveIsa(m.view);
  return m;
}

// A rows x cols product of `tokens` tokens on `threads` threads, with GB/s and GFLOP/s counters.
void RunMatMul(benchmark::State& state, GgmlType t, int64_t cols, int64_t rows, int64_t tokens, int threads);

// args: type index, tokens, threads. Shape: a 2048 x 768 projection (110m's ffn_gate).
void BM_MatMul(benchmark::State& state) {
  RunMatMul(state, kTypes[state.range(0)], 768, 2048, state.range(1), static_cast<int>(state.range(2)));
}
BENCHMARK(BM_MatMul)->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, {1, 16, 64}, {1, 2}})->UseRealTime();

// args: type index (float types), columns, threads; 64 tokens, 2048 rows: long rows, where the
// float GEMM is k-blocked (tinyllama's k is 2048 for most products, 5632 for ffn_down).
void BM_MatMulLongRows(benchmark::State& state) {
  RunMatMul(state, kTypes[state.range(0)], state.range(1), 2048, 64, static_cast<int>(state.range(2)));
}
BENCHMARK(BM_MatMulLongRows)->ArgsProduct({{0, 1, 2}, {768, 2048, 5632}, {1, 2}})->UseRealTime();

// args: type index, tokens, threads. A 131072 x 768 matrix (~57 MB as Q4_0, more than the L3 of
// the machines measured): weights stream from memory every call, as a whole model's do at
// decode and batched decode.
void BM_MatMulStreaming(benchmark::State& state) {
  RunMatMul(state, kTypes[state.range(0)], 768, 131072, state.range(1), static_cast<int>(state.range(2)));
}
BENCHMARK(BM_MatMulStreaming)->ArgsProduct({{3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16, 17}, {1, 16, 64}, {1, 2}})->UseRealTime();

void RunMatMul(benchmark::State& state, GgmlType t, int64_t cols, int64_t rows, int64_t tokens, int threads) {
  Matrix m = MakeMatrix(t, cols, rows);
  std::vector<float> x(cols * tokens, 0.5f), y(rows * tokens);
  ThreadPool pool(threads);
  for (auto _ : state) {
    kernels::MatMul(m.view, m.packed.get(), x.data(), tokens, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(TypeTraits(t).name) + " " + kernels::IsaName(kernels::Active().isa));
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(m.bytes.size()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * cols * rows * tokens / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Positions [0, len) of layer 0 of kv through its block table, K and V uniform in [-1, 1).
void WriteRandomKv(KvStorage& kv, const std::vector<int32_t>& table, int64_t len, int64_t block_size, int64_t row,
                   Rng& rng) {
  std::vector<float> k(row), v(row);
  for (int64_t p = 0; p < len; ++p) {
    for (float& f : k) f = rng.Uniform(-1, 1);
    for (float& f : v) f = rng.Uniform(-1, 1);
    kv.Write(0, table[p / block_size], p % block_size, k.data(), v.data());
  }
}

// Attention shapes: query heads, KV heads, head_dim.
struct AttnShape {
  int heads, kv_heads, head_dim;
};
// arg 0: 110m (12 heads of 64); 1: stories260K (8 heads of 8 over 4 KV heads); 2: 110m's heads
// over 4 KV heads (grouped-query attention).
AttnShape AttnShapeOf(int64_t arg) {
  return arg == 0 ? AttnShape{12, 12, 64} : arg == 1 ? AttnShape{8, 4, 8} : AttnShape{12, 4, 64};
}

// args: context length, KV type (0 f32, 1 f16, 2 bf16, 3 int8, 4 int4), shape (AttnShapeOf). One
// token's query heads over its paged cache (blocks of 16 in reverse order), one thread.
void BM_Attention(benchmark::State& state) {
  const int64_t len = state.range(0), block_size = 16;
  const auto type = static_cast<kernels::KvType>(state.range(1));
  const auto [heads, kv_heads, head_dim] = AttnShapeOf(state.range(2));
  const int64_t num_blocks = (len + block_size - 1) / block_size;
  KvStorage kv(1, kv_heads, head_dim, num_blocks, block_size, type);
  std::vector<int32_t> table(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) table[i] = static_cast<int32_t>(num_blocks - 1 - i);
  Rng rng(2);
  std::vector<float> q(heads * head_dim), out(heads * head_dim);
  for (float& f : q) f = rng.Uniform(-1, 1);
  WriteRandomKv(kv, table, len, block_size, kv_heads * head_dim, rng);
  const int32_t pos = static_cast<int32_t>(len - 1);
  const int32_t* tp = table.data();
  ThreadPool pool(1);
  for (auto _ : state) {
    kernels::Attention(q.data(), 1, &pos, &tp, kv.Layer(0), heads, kv_heads, head_dim, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(kernels::KvTypeName(type));
  state.counters["GB/s"] = benchmark::Counter(2.0 * len * kv.row_bytes(),
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Attention)->ArgsProduct({{128, 1024, 4096}, {0, 1, 2, 3, 4}, {0}});
BENCHMARK(BM_Attention)->ArgsProduct({{128, 512}, {0, 1, 3}, {1}});

// args: prompt length, KV type, shape (AttnShapeOf). Prefill:
// every position of one sequence attends to its prefix in one call, one thread; GFLOP/s counts
// q.k and weights.v of the causal half.
void BM_AttentionPrefill(benchmark::State& state) {
  const int64_t len = state.range(0), block_size = 16;
  const auto type = static_cast<kernels::KvType>(state.range(1));
  const auto [heads, kv_heads, head_dim] = AttnShapeOf(state.range(2));
  const int64_t num_blocks = (len + block_size - 1) / block_size;
  KvStorage kv(1, kv_heads, head_dim, num_blocks, block_size, type);
  std::vector<int32_t> table(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) table[i] = static_cast<int32_t>(i);
  Rng rng(3);
  std::vector<float> q(len * heads * head_dim), out(len * heads * head_dim);
  for (float& f : q) f = rng.Uniform(-1, 1);
  WriteRandomKv(kv, table, len, block_size, kv_heads * head_dim, rng);
  std::vector<int32_t> pos(len);
  for (int64_t p = 0; p < len; ++p) pos[p] = static_cast<int32_t>(p);
  const std::vector<const int32_t*> tables(len, table.data());
  ThreadPool pool(1);
  for (auto _ : state) {
    kernels::Attention(q.data(), len, pos.data(), tables.data(), kv.Layer(0), heads, kv_heads, head_dim, out.data(),
                       pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(kernels::KvTypeName(type));
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * heads * head_dim * (len * (len + 1) / 2) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionPrefill)->ArgsProduct({{512}, {0, 1}, {0, 2, 1}});

void BM_QuantizeActivations(benchmark::State& state) {
  const int64_t k = 4096;
  std::vector<float> x(k, 0.3f);
  std::vector<int8_t> qs(k);
  std::vector<float> d(k / 32);
  std::vector<int32_t> qsum(k / 32);
  for (auto _ : state) {
    kernels::Active().quantize_acts(x.data(), k, k, qs.data(), d.data(), qsum.data());
    benchmark::DoNotOptimize(qs.data());
  }
  state.counters["GB/s"] = benchmark::Counter(k * 4.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_QuantizeActivations);

}  // namespace
}  // namespace gale

BENCHMARK_MAIN();
