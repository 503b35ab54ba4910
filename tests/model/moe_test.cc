// The mixture-of-experts block on its own: each router rule (llama.cpp's build_moe_ffn) on scores
// worked out by hand, and the grouped expert products against one product per token.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/rng.h"
#include "base/thread_pool.h"
#include "gguf/ggml_types.h"
#include "kernels/kernels.h"
#include "gguf/gguf_writer.h"
#include "model/blocks.h"
#include "model/model.h"
#include "model/synth.h"
#include "../test_util.h"

namespace gale {
namespace {

struct Routed {
  std::vector<int32_t> chosen;
  std::vector<float> weight;
  std::vector<float> scores;
};

Routed Route(const MoeHParams& moe, std::vector<float> logits, const std::vector<float>& bias = {}) {
  Routed r;
  r.chosen.resize(moe.num_used);
  r.weight.resize(moe.num_used);
  std::vector<float> scratch(3 * moe.num_experts);
  RouteToken(moe, logits.data(), bias.empty() ? nullptr : bias.data(), r.chosen.data(), r.weight.data(), scratch.data());
  r.scores = logits;
  return r;
}

TEST(MoeTest, SoftmaxThenTopKRenormalized) {
  MoeHParams moe;
  moe.num_experts = 4;
  moe.num_used = 2;
  moe.norm_weights = true;
  const Routed r = Route(moe, {0.0f, 2.0f, 1.0f, -1.0f});
  EXPECT_EQ(r.chosen, (std::vector<int32_t>{1, 2}));
  // e^2 / (e^2 + e^1) and e^1 / (e^2 + e^1)
  EXPECT_NEAR(r.weight[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.weight[1], 1.0 / (1.0 + std::exp(1.0)), 1e-6);
  moe.norm_weights = false;  // the softmax over all four
  const Routed raw = Route(moe, {0.0f, 2.0f, 1.0f, -1.0f});
  const double z = 1.0 + std::exp(2.0) + std::exp(1.0) + std::exp(-1.0);
  EXPECT_NEAR(raw.weight[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(raw.scores[3], std::exp(-1.0) / z, 1e-6);  // the scores are the probabilities
}

TEST(MoeTest, TopKThenSoftmaxOfTheChosen) {  // gpt-oss
  MoeHParams moe;
  moe.num_experts = 4;
  moe.num_used = 2;
  moe.gating = ExpertGating::kSoftmaxWeight;
  const Routed r = Route(moe, {3.0f, 0.5f, 1.0f, -2.0f});
  EXPECT_EQ(r.chosen, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(r.weight[0], 1.0 / (1.0 + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(r.weight[1], 1.0 / (1.0 + std::exp(2.0)), 1e-6);
}

// DeepSeek-V3: sigmoid scores, a bias that moves the choice but not the weights, groups ranked by
// their two best biased scores, weights renormalized then scaled.
TEST(MoeTest, SigmoidWithSelectionBiasGroupsAndScale) {
  MoeHParams moe;
  moe.num_experts = 8;
  moe.num_used = 2;
  moe.gating = ExpertGating::kSigmoid;
  moe.norm_weights = true;
  moe.weights_scale = 2.5f;
  moe.num_groups = 4;  // groups {0,1} {2,3} {4,5} {6,7}
  moe.groups_used = 1;
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  // Expert 0 has the best single score, but group {4,5} has the best pair; the bias lifts 5 over 4.
  const std::vector<float> logits = {3.0f, -3.0f, 0.0f, 0.0f, 1.5f, 1.0f, -1.0f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.2f, 0.0f, 0.0f};
  const Routed r = Route(moe, logits, bias);
  EXPECT_EQ(r.chosen, (std::vector<int32_t>{5, 4}));
  const double p4 = sig(1.5), p5 = sig(1.0);  // the weights: unbiased probabilities
  EXPECT_NEAR(r.weight[0], 2.5 * p5 / (p4 + p5), 1e-6);
  EXPECT_NEAR(r.weight[1], 2.5 * p4 / (p4 + p5), 1e-6);
  EXPECT_NEAR(r.scores[5], p5 + 0.2, 1e-6);
  moe.num_groups = moe.groups_used = 0;  // without groups, expert 0 wins
  EXPECT_EQ(Route(moe, logits, bias).chosen[0], 0);
}

TEST(MoeTest, TiesGoToTheLowerExpertAndNothingIsChosenTwice) {
  MoeHParams moe;
  moe.num_experts = 4;
  moe.num_used = 3;
  const Routed r = Route(moe, {1.0f, 1.0f, 1.0f, 1.0f});
  EXPECT_EQ(r.chosen, (std::vector<int32_t>{0, 1, 2}));
  const Routed nan = Route(moe, {NAN, NAN, NAN, NAN});
  EXPECT_EQ(nan.chosen, (std::vector<int32_t>{0, 1, 2}));
}

// The grouped products give, bitwise, what one MatMul per expert over its own rows gives, for each
// kernel ISA and weight type, whatever rows the other experts have.
TEST(MoeTest, GroupedProductsEqualSeparateProducts) {
  const int64_t cols = 256, rows = 48, total = 23;
  ThreadPool pool(2);
  Rng rng(3);
  std::vector<float> x(total * cols);
  for (float& v : x) v = rng.Uniform(-1.0f, 1.0f);
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(TypeTraits(type).name);
    std::vector<std::vector<uint8_t>> bytes(3);
    std::vector<TensorView> w(3);
    for (int e = 0; e < 3; ++e) {
      bytes[e].resize(rows * RowBytes(type, cols));
      std::vector<float> row(cols);
      for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = rng.Uniform(-0.1f, 0.1f);
        QuantizeRowRef(type, row.data(), bytes[e].data() + r * RowBytes(type, cols), cols);
      }
      w[e] = TensorView{type, {cols, rows}, bytes[e].data(), bytes[e].size()};
    }
    for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
      if (kernels::GetKernelTable(isa) == nullptr) continue;
      kernels::SetActiveIsa(isa);
      std::vector<std::unique_ptr<kernels::PackedWeights>> packed;
      for (const TensorView& v : w) packed.push_back(kernels::PackForActiveIsa(v));
      // Expert 0 takes rows [0, 5), expert 1 none, expert 2 rows [5, 23).
      const int64_t begin[3] = {0, 5, 5}, count[3] = {5, 0, 18};
      std::vector<float> grouped(total * rows, -1.0f), separate(total * rows, -2.0f);
      std::vector<kernels::GroupedProduct> products;
      for (int e = 0; e < 3; ++e) {
        products.push_back({{&w[e], packed[e].get(), grouped.data() + begin[e] * rows}, begin[e], count[e]});
      }
      kernels::MatMulGrouped(products, x.data(), total, pool);
      for (int e = 0; e < 3; ++e) {
        if (count[e] > 0) {
          kernels::MatMul(w[e], packed[e].get(), x.data() + begin[e] * cols, count[e], separate.data() + begin[e] * rows, pool);
        }
      }
      EXPECT_EQ(grouped, separate) << kernels::IsaName(isa);
    }
    kernels::SetActiveIsa(kernels::BestIsa());
  }
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

// A mixture file rewritten with fused experts, as llama.cpp's newer converters write some: each
// layer's ffn_gate_exps and ffn_up_exps (and their biases) as one ffn_gate_up_exps, per expert
// the gate's rows then up's.
std::vector<uint8_t> FusedGateUp(const GgufFile& f) {
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) w.SetValue(key, value);
  for (const GgufTensorInfo& t : f.tensors()) {
    const auto copy = [&](const GgufTensorInfo& x) { return std::vector<uint8_t>(x.data, x.data + x.num_bytes); };
    const size_t at = t.name.find("ffn_gate_exps.");
    if (at == std::string::npos) {
      if (t.name.find("ffn_up_exps.") == std::string::npos) {
        EXPECT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, copy(t)).ok());
      }
      continue;
    }
    const std::string suffix = t.name.substr(at + std::string("ffn_gate_exps").size());  // ".weight" or ".bias"
    const GgufTensorInfo* up = f.FindTensor(t.name.substr(0, at) + "ffn_up_exps" + suffix);
    EXPECT_NE(up, nullptr);
    const int64_t experts = t.shape.back();
    const uint64_t per = t.num_bytes / experts;
    std::vector<uint8_t> fused;
    for (int64_t e = 0; e < experts; ++e) {
      fused.insert(fused.end(), t.data + e * per, t.data + (e + 1) * per);
      fused.insert(fused.end(), up->data + e * per, up->data + (e + 1) * per);
    }
    std::vector<int64_t> shape = t.shape;
    shape[shape.size() - 2] *= 2;  // [dim, 2 ffn, experts] or, for biases, [2 ffn, experts]
    EXPECT_TRUE(w.AddTensor(t.name.substr(0, at) + "ffn_gate_up_exps" + suffix, t.type_id, shape, std::move(fused)).ok());
  }
  return w.WriteToBytes();
}

// Fused ffn_gate_up_exps (with its bias, gpt-oss) runs bitwise as the separate tensors do.
TEST(MoeTest, FusedGateUpExpertsEqualSeparateOnes) {
  for (const char* arch : {"qwen3moe", "gpt-oss"}) {
    for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
      SCOPED_TRACE(std::string(arch) + " " + std::string(TypeTraits(type).name));
      auto separate = GgufFile::FromBytes(SynthesizeModel(test::ArchTestShape(arch), type, 5)->WriteToBytes()).value();
      auto fused = GgufFile::FromBytes(FusedGateUp(*separate)).value();
      ASSERT_NE(fused->FindTensor("blk.1.ffn_gate_up_exps.weight"), nullptr);
      ASSERT_EQ(fused->FindTensor("blk.1.ffn_up_exps.weight"), nullptr);
      const std::vector<int32_t> tokens = {1, 50, 300, 7, 99, 1000, 12, 5};
      const std::vector<float> a = test::PrefillLogits(*separate, tokens), b = test::PrefillLogits(*fused, tokens);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    }
  }
}

}  // namespace
}  // namespace gale
