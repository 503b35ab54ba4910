// LoadModel's dispatch and each architecture's checks of its file: an unknown architecture names
// the supported ones, a missing architecture-specific tensor is an error naming it, a file with
// exactly the architecture's tensors loads without warnings, and a tensor it does not use is named.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../test_util.h"
#include "base/thread_pool.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/synth.h"

namespace gale {
namespace {

// The file of `arch`'s test shape, without drop_tensor and with set_key set.
std::vector<uint8_t> Edited(const std::string& arch, const std::string& drop_tensor = "",
                            const std::pair<std::string, GgufValue>& set_key = {}) {
  const auto bytes = SynthesizeModel(test::ArchTestShape(arch), GgmlType::kF32, 1)->WriteToBytes();
  auto f = GgufFile::FromBytes(bytes).value();
  GgufWriter w;
  for (const auto& [k, v] : f->metadata()) w.SetValue(k, v);
  if (!set_key.first.empty()) w.SetValue(set_key.first, set_key.second);
  for (const auto& t : f->tensors()) {
    if (t.name == drop_tensor) continue;
    EXPECT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
  }
  return w.WriteToBytes();
}

TEST(RegistryTest, EveryArchitectureLoadsItsOwnFileWithoutWarnings) {
  EXPECT_EQ(SupportedArchitectures(), (std::vector<std::string>{"llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "deepseek2", "glm4moe", "gpt-oss", "bert"}));
  std::vector<std::string> files = SupportedArchitectures();
  files.push_back("mixtral");  // a llama with experts
  for (const std::string& arch : files) {
    const auto b = Edited(arch);
    auto m = LoadModel(**GgufFile::FromBytes(b));
    ASSERT_TRUE(m.ok()) << arch << ": " << m.status().ToString();
    EXPECT_EQ((*m)->hparams().arch, arch == "mixtral" ? "llama" : arch);
    EXPECT_TRUE((*m)->load_warnings().empty()) << arch << ": " << (*m)->load_warnings()[0];
  }
  const auto q3 = Edited("qwen3");
  auto m = LoadModel(**GgufFile::FromBytes(q3)).value();
  EXPECT_EQ(m->hparams().head_dim, 48);  // attention.key_length, not dim / heads = 32
  EXPECT_EQ(m->hparams().q_dim(), 192);
  EXPECT_EQ(m->hparams().rope_style, RopeStyle::kNeox);
  const auto moe = Edited("qwen3moe");
  m = LoadModel(**GgufFile::FromBytes(moe)).value();
  EXPECT_EQ(m->hparams().moe.num_experts, 8);
  EXPECT_EQ(m->hparams().moe.num_used, 2);
  EXPECT_EQ(m->hparams().moe.expert_ffn, 64);
  EXPECT_TRUE(m->hparams().moe.norm_weights);
  const auto mixtral = Edited("mixtral");
  m = LoadModel(**GgufFile::FromBytes(mixtral)).value();
  EXPECT_EQ(m->hparams().moe.num_experts, 4);
  EXPECT_EQ(m->hparams().moe.expert_ffn, m->hparams().ffn_dim);  // Mixtral: each expert is the FFN's width
}

// A mixture's keys are checked, and an architecture without experts refuses a file with some.
TEST(RegistryTest, MixtureHyperparametersAreChecked) {
  const std::vector<std::pair<std::pair<std::string, GgufValue>, std::string>> cases = {
      {{"qwen3moe.expert_used_count", GgufValue::U32(9)}, "expert_used_count must be in [1, expert_count]"},
      {{"qwen3moe.expert_used_count", GgufValue::U32(0)}, "expert_used_count must be in [1, expert_count]"},
      {{"qwen3moe.expert_count", GgufValue::U32(100000)}, "expert_count out of range"},
      {{"qwen3moe.expert_gating_func", GgufValue::U32(7)}, "expert_gating_func 7 is not supported"},
      {{"qwen3moe.expert_group_count", GgufValue::U32(3)}, "expert groups must divide expert_count"},
      {{"qwen3moe.expert_count", GgufValue::U32(6)}, "blk.0.ffn_gate_inp.weight: expected shape"},
  };
  for (const auto& [key, want] : cases) {
    const auto b = Edited("qwen3moe", "", key);
    auto m = LoadModel(**GgufFile::FromBytes(b));
    ASSERT_FALSE(m.ok()) << key.first;
    EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status().message();
  }
  const auto dense_bytes = Edited("qwen3", "", {"qwen3.expert_count", GgufValue::U32(8)});
  auto dense_file = GgufFile::FromBytes(dense_bytes).value();
  GgufWriter w;
  for (const auto& [k, v] : dense_file->metadata()) w.SetValue(k, v);
  w.SetValue("qwen3.expert_used_count", GgufValue::U32(2));
  for (const auto& t : dense_file->tensors()) {
    ASSERT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
  }
  const auto dense = w.WriteToBytes();
  auto m = LoadModel(**GgufFile::FromBytes(dense));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("a mixture of experts in this architecture is not supported"), std::string::npos)
      << m.status().message();
  const auto no_experts = Edited("qwen3moe", "", {"qwen3moe.expert_count", GgufValue::U32(0)});
  m = LoadModel(**GgufFile::FromBytes(no_experts));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("no qwen3moe.expert_count"), std::string::npos) << m.status().message();
}

TEST(RegistryTest, UnknownArchitectureNamesTheSupportedOnes) {
  const auto b = Edited("llama", "", {"general.architecture", GgufValue::String("mamba")});
  auto m = LoadModel(**GgufFile::FromBytes(b));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("'mamba' is not supported"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, deepseek2, glm4moe, gpt-oss"), std::string::npos) << m.status().message();
}

TEST(RegistryTest, MissingArchitectureTensorsAreErrors) {
  for (const auto& [arch, tensor] : std::vector<std::pair<std::string, std::string>>{
           {"qwen2", "blk.1.attn_k.bias"}, {"qwen3", "blk.0.attn_q_norm.weight"}, {"qwen3", "blk.1.attn_k_norm.weight"},
           {"phi3", "blk.1.attn_qkv.weight"}, {"phi3", "rope_factors_short.weight"},
           {"gemma3", "blk.3.post_ffw_norm.weight"}, {"qwen3moe", "blk.1.ffn_down_exps.weight"},
           {"qwen3moe", "blk.0.ffn_gate_inp.weight"}, {"mixtral", "blk.1.ffn_up_exps.weight"},
           {"deepseek2", "blk.1.attn_k_b.weight"}, {"deepseek2", "blk.2.attn_kv_a_norm.weight"},
           {"deepseek2", "blk.0.ffn_down.weight"}, {"deepseek2", "blk.2.ffn_up_shexp.weight"},
           {"glm4moe", "blk.1.attn_v.bias"}, {"glm4moe", "blk.2.exp_probs_b.bias"},
           {"glm4moe", "blk.0.post_attention_norm.weight"}, {"gpt-oss", "blk.1.attn_sinks.weight"},
           {"gpt-oss", "blk.0.ffn_up_exps.bias"}, {"gpt-oss", "blk.2.attn_output.bias"},
           {"gpt-oss", "blk.1.ffn_gate_inp.bias"}, {"gemma2", "blk.3.post_ffw_norm.weight"},
           {"gemma2", "blk.0.post_attention_norm.weight"}}) {
    const auto b = Edited(arch, tensor);
    auto m = LoadModel(**GgufFile::FromBytes(b));
    ASSERT_FALSE(m.ok()) << arch << " without " << tensor;
    EXPECT_NE(m.status().message().find(tensor), std::string::npos) << m.status().message();
  }
}

// A sliding-window model refuses KV retention (its windows count cache slots from 0) with a clear
// error, in the forward pass and in the engine.
TEST(RegistryTest, SlidingWindowModelsRefuseAttentionTracking) {
  const auto b = Edited("gemma3");
  const auto file = GgufFile::FromBytes(b).value();  // outlives the model, which reads its weights in place
  auto m = LoadModel(*file).value();
  EXPECT_EQ(m->hparams().sliding_window, 8);
  EXPECT_EQ(m->hparams().LayerWindow(5), 0);  // the sixth layer is global
  EXPECT_EQ(m->hparams().LayerWindow(6), 8);
  KvCache kv(m->hparams(), 16);
  Workspace ws;
  ThreadPool pool(1);
  std::vector<float> acc(m->hparams().num_layers * 16);
  ForwardBatch batch;
  batch.tokens = {1, 2};
  batch.positions = {0, 1};
  batch.attn_acc = {{acc.data(), 16}};
  auto s = m->Forward(batch, kv, ws, pool);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sliding windows"), std::string::npos) << s.message();
}

// Mistral 7B v0.1-style llama files (llama.attention.sliding_window) attend over the window on
// every layer, as Hugging Face's Mistral does (llama.cpp ignores the key, so no llama.cpp logits
// to compare): with one layer, the last position's logits depend on the window's tokens only, so
// ten tokens give bitwise the logits of their last four alone at the same positions; the same
// file without the window differs.
TEST(RegistryTest, LlamaSlidingWindowAttendsOverTheWindowOnly) {
  SynthShape shape = test::SmallGqaShape(512);
  shape.num_layers = 1;
  shape.sliding_window = 4;
  const auto bytes = SynthesizeModel(shape, GgmlType::kF32, 5)->WriteToBytes();
  shape.sliding_window = 0;
  const auto full_bytes = SynthesizeModel(shape, GgmlType::kF32, 5)->WriteToBytes();
  // The files outlive the models, which read their weights in place.
  const auto windowed_file = GgufFile::FromBytes(bytes).value(), full_file = GgufFile::FromBytes(full_bytes).value();
  auto windowed = LoadModel(*windowed_file).value();
  auto full = LoadModel(*full_file).value();
  EXPECT_EQ(windowed->hparams().sliding_window, 4);
  EXPECT_EQ(windowed->hparams().LayerWindow(0), 4);
  EXPECT_EQ(full->hparams().sliding_window, 0);
  ThreadPool pool(1);
  auto last_logits = [&](const Model& m, std::vector<int32_t> tokens, int32_t first_pos) {
    KvCache kv(m.hparams(), 16);
    Workspace ws;
    ForwardBatch b;
    b.tokens = tokens;
    for (size_t i = 0; i < tokens.size(); ++i) b.positions.push_back(first_pos + static_cast<int32_t>(i));
    EXPECT_TRUE(m.Forward(b, kv, ws, pool).ok());
    return std::vector<float>(ws.logits.begin(), ws.logits.begin() + m.hparams().vocab_size);
  };
  const std::vector<int32_t> ten = {5, 77, 310, 2, 41, 199, 8, 260, 33, 470};
  const std::vector<int32_t> last4(ten.end() - 4, ten.end());
  EXPECT_EQ(last_logits(*windowed, ten, 0), last_logits(*windowed, last4, 6));
  EXPECT_NE(last_logits(*full, ten, 0), last_logits(*full, last4, 6));
  EXPECT_NE(last_logits(*windowed, ten, 0), last_logits(*full, ten, 0));
}

TEST(RegistryTest, KeyAndValueHeadSizesThatDifferAreRefused) {
  const auto b = Edited("qwen3", "", {"qwen3.attention.value_length", GgufValue::U32(64)});
  auto m = LoadModel(**GgufFile::FromBytes(b));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("value_length"), std::string::npos) << m.status().message();
}

// Another architecture's tensors in a file are named: a qwen2 file read as llama (the biases), and
// a rope_freqs tensor in a qwen3 file (Qwen has no frequency divisors; llama.cpp ignores it too).
TEST(RegistryTest, TensorsAnArchitectureDoesNotUseAreNamed) {
  const auto b = Edited("qwen2", "", {"general.architecture", GgufValue::String("llama")});
  // The keys stay under "qwen2.": rename them as a llama file would have them.
  auto f = GgufFile::FromBytes(b).value();
  GgufWriter w;
  for (const auto& [k, v] : f->metadata()) w.SetValue(k.starts_with("qwen2.") ? "llama." + k.substr(6) : k, v);
  for (const auto& t : f->tensors()) {
    EXPECT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
  }
  const auto lb = w.WriteToBytes();
  auto m = LoadModel(**GgufFile::FromBytes(lb));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ((*m)->load_warnings().size(), 1u);
  EXPECT_NE((*m)->load_warnings()[0].find("6 tensor(s)"), std::string::npos) << (*m)->load_warnings()[0];
  EXPECT_NE((*m)->load_warnings()[0].find("attn_q.bias"), std::string::npos) << (*m)->load_warnings()[0];
}

}  // namespace
}  // namespace gale
