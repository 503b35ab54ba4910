// Every hyperparameter key llama.cpp's loader reads for an architecture gale runs is honoured by
// gale or refused with an error naming it (src/model/hparams.cc and the architectures' loaders):
//   - the list of keys is llama.cpp's own (tests/data/llamacpp/hparam_keys.json, extracted from
//     its source by scripts/llamacpp-keys.py), and kKeyCases says for each how it is checked;
//   - keys set to other than their defaults give llama.cpp's logits (tests/data/llamacpp/keys.gguf,
//     written by scripts/make-ggml-reference.sh from the same files as kKeyShapes), and the same
//     files without those keys are far from them where the keys change the model, bitwise the
//     same where llama.cpp gives them no effect;
//   - keys gale does not run are refused at the values that would need it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/synth.h"
#include "../test_util.h"

namespace gale {
namespace {

// As scripts/make-ggml-reference.sh's keys section writes them (vocab 512, context 256, f32,
// seed 7).
struct KeyShape {
  const char* name;
  const char* arch;
  int64_t dim, layers, heads, kv_heads, head_dim, ffn;
  std::vector<const char*> keys;  // gale synth --key specs
  // Whether the keys change the model (llama.cpp's logits are far from the file without them);
  // false: they have no effect in llama.cpp, and the file without them gives the same logits.
  bool changes = true;
  int64_t window = 0, experts = 0, used = 0, expert_ffn = 0;
  double yarn = 0.0;
  float attn_softcap = 50.0f, final_softcap = 30.0f;
  void (*more)(SynthShape*) = nullptr;  // the architecture's own knobs
};

// DeepSeek-V4 as tests/model/deepseek4_test.cc's deepseek4_b (its clamp 0.3 on the experts).
void Deepseek4B(SynthShape* s) {
  s->rope_dim = 64;
  s->q_lora_rank = 64;
  s->compress_ratios = {4, 128, 4, 0, 128};
  s->hash_layers = 1;
  s->indexer_heads = 16;
  s->indexer_dim = 64;
  s->indexer_top_k = 8;
  s->out_groups = 1;
  s->out_lora_rank = 32;
  s->shared_experts = 1;
  s->swiglu_clamp = 0.3f;
}

const std::vector<KeyShape>& KeyShapes() {
  static const std::vector<KeyShape> shapes = {
      {"gemma3_keys", "gemma3", 128, 7, 4, 1, 64, 256,
       {"attention.sliding_window_pattern=u32:3", "rope.freq_base_swa=f32:50000", "final_logit_softcapping=f32:3",
        "rope.scaling.factor=f32:2"}, true, 5},
      {"gemma3_pattern", "gemma3", 128, 7, 4, 1, 64, 256,
       {"attention.sliding_window_pattern=bools:true,false,true,true,false,true,false"}, true, 5},
      {"gemma2_keys", "gemma2", 128, 4, 4, 2, 64, 256,
       {"attention.sliding_window_pattern=u32:3", "rope.freq_base_swa=f32:50000", "rope.scaling.factor=f32:2"}, true, 5,
       0, 0, 0, 0.0, 1.5f, 3.0f},
      {"gpt_oss_keys", "gpt-oss", 192, 4, 3, 1, 64, 384,
       {"attention.sliding_window_pattern=u32:3", "rope.freq_base_swa=f32:40000"}, true, 5, 6, 3, 96, 4.0},
      {"llama_linear", "llama", 256, 2, 4, 2, 0, 512,
       {"rope.scaling.factor=f32:4", "rope.scaling.attn_factor=f32:0.8", "rope.scaling.finetuned=bool:true",
        "rope.scaling.alpha=f32:3", "vocab_size=u32:1000", "attention.layer_norm_rms_epsilon=f32:0.01"}},
      {"llama_scale_linear", "llama", 256, 2, 4, 2, 0, 512, {"rope.scale_linear=f32:3"}},
      {"llama_none", "llama", 256, 2, 4, 2, 0, 512, {"rope.scaling.type=str:none", "rope.scaling.factor=f32:4"}, false},
      {"qwen2_arrays", "qwen2", 256, 2, 4, 2, 0, 512,
       {"attention.head_count=u32s:4,4", "attention.head_count_kv=u32s:2,2", "feed_forward_length=u32s:512,512"}, false},
      {"qwen3moe_arrays", "qwen3moe", 256, 2, 4, 2, 64, 512,
       {"expert_used_count=u32s:2,2", "expert_feed_forward_length=u32s:128,128"}, false, 0, 8, 2, 128},
      {"phi3_window", "phi3", 256, 2, 4, 4, 0, 512, {"attention.sliding_window=u32:5"}, false},
      {"deepseek4_shexp", "deepseek4", 128, 5, 2, 1, 128, 256, {"swiglu_clamp_shexp=f32s:0.02,0.02,0.02,0.02,0.02"}, true,
       24, 6, 3, 32, 0.0, 50.0f, 30.0f, Deepseek4B},
  };
  return shapes;
}

SynthShape ShapeOf(const KeyShape& k, bool with_keys = true) {
  SynthShape s;
  s.arch = k.arch;
  s.dim = k.dim;
  s.num_layers = k.layers;
  s.num_heads = k.heads;
  s.num_kv_heads = k.kv_heads;
  s.head_dim = k.head_dim;
  s.ffn_dim = k.ffn;
  s.vocab_size = 512;
  s.context_length = 256;
  s.sliding_window = k.window;
  s.num_experts = k.experts;
  s.experts_used = k.used;
  s.expert_ffn = k.expert_ffn;
  s.yarn_factor = k.yarn;
  s.yarn_orig_ctx = k.yarn > 0 ? 64 : 0;
  s.attn_softcap = k.attn_softcap;
  s.final_softcap = k.final_softcap;
  if (k.more != nullptr) k.more(&s);
  if (with_keys) {
    for (const char* spec : k.keys) s.keys.push_back(ParseSynthKey(spec).value());
  }
  return s;
}

std::unique_ptr<GgufFile> Synth(const SynthShape& s) {
  auto w = SynthesizeModel(s, GgmlType::kF32, 7);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return GgufFile::FromBytes(w->WriteToBytes()).value();
}

std::vector<float> Floats(const GgufTensorInfo& t) {
  std::vector<float> v(t.num_bytes / 4);
  std::memcpy(v.data(), t.data, t.num_bytes);
  return v;
}

// gale's logits at every 8th position (as tools/ggml_reference.cc's long mode keeps them).
std::vector<float> Every8th(const std::vector<float>& all, size_t positions, int64_t vocab) {
  std::vector<float> out;
  for (size_t p = 7; p < positions; p += 8) out.insert(out.end(), all.begin() + p * vocab, all.begin() + (p + 1) * vocab);
  return out;
}

TEST(HParamKeysTest, KeysSetByTheFileGiveLlamaCppLogits) {
  auto ref = GgufFile::Open(test::SourceDir() + "/tests/data/llamacpp/keys.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::vector<int32_t> tokens;
  for (const GgufValue& v : (*ref)->Find("tokens")->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  ASSERT_EQ(tokens.size(), 64u);
  for (const KeyShape& k : KeyShapes()) {
    SCOPED_TRACE(k.name);
    const GgufTensorInfo* t = (*ref)->FindTensor(k.name);
    ASSERT_NE(t, nullptr) << "keys.gguf predates this shape: run scripts/make-ggml-reference.sh keys";
    const std::vector<float> want = Floats(*t);
    const std::vector<float> got = Every8th(test::PrefillLogits(*Synth(ShapeOf(k)), tokens), tokens.size(), 512);
    const std::vector<float> plain = Every8th(test::PrefillLogits(*Synth(ShapeOf(k, false)), tokens), tokens.size(), 512);
    ASSERT_EQ(got.size(), want.size());
    double max_diff = 0.0, keyless = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_diff = std::max<double>(max_diff, std::fabs(got[i] - want[i]));
      keyless = std::max<double>(keyless, std::fabs(plain[i] - want[i]));
    }
    std::printf("%s: max |diff| against llama.cpp %.2e; the file without its keys %.3f\n", k.name, max_diff, keyless);
    // Gemma's GeGLU: llama.cpp's GELU reads an f16 table (see llamacpp_reference_test.cc).
    const bool gemma = std::string(k.arch).starts_with("gemma");
    EXPECT_LT(max_diff, gemma ? 5e-3 : 2e-5);
    if (k.changes) {
      EXPECT_GT(keyless, 50 * max_diff + 0.05) << "the keys did not change the model";
    } else {
      EXPECT_EQ(plain, got) << "keys llama.cpp gives no effect changed gale's logits";
    }
  }
}

// How each key llama.cpp reads is checked.
enum class How {
  kReference,   // a file setting it gives llama.cpp's logits: `where` names the shape (file)
  kRefused,     // set to `value`, the file is refused with an error naming the key
  kStructural,  // it has no default: every shape of every reference test sets it (`where`)
  kNoEffect,    // llama.cpp gives it no effect here: set to `value`, gale's logits are bitwise those
                // of the file without it
};
struct KeyCase {
  const char* arch;  // "*": a key every architecture reads, through the same code
  const char* key;
  How how;
  const char* where;        // the shape or test
  const char* value = "";   // kRefused, kNoEffect: the --key value (TYPE:VALUE)
};

const std::vector<KeyCase>& KeyCases() {
  static const std::vector<KeyCase> cases = {
      // Read by every architecture (llama_model_base::load_hparams).
      {"llama", "attention.causal", How::kRefused, "a decoder", "bool:false"},
      {"bert", "attention.causal", How::kRefused, "an encoder", "bool:true"},
      {"*", "attention.head_count", How::kReference, "keys.gguf qwen2_arrays (an array per layer)"},
      {"*", "attention.head_count_kv", How::kReference, "keys.gguf qwen2_arrays; logits.gguf qwen2_odd"},
      {"*", "attention.key_length", How::kReference, "logits.gguf qwen3_gqa (128, dim / heads = 64)"},
      {"gemma3", "attention.key_length_swa", How::kRefused, "windowed layers' own size", "u32:32"},
      {"*", "attention.value_length", How::kReference, "logits.gguf deepseek2 (the latent)"},
      {"gemma3", "attention.value_length_swa", How::kRefused, "windowed layers' own size", "u32:32"},
      {"*", "block_count", How::kStructural, "every shape"},
      {"qwen3", "classifier.output_labels", How::kRefused, "classification heads", "strs:a,b"},
      {"*", "context_length", How::kStructural, "every shape (YaRN's default original context)"},
      {"*", "embedding_length", How::kStructural, "every shape"},
      {"llama", "embedding_length_out", How::kRefused, "another output width", "u32:128"},
      {"*", "expert_count", How::kReference, "logits.gguf qwen3moe, mixtral"},
      {"*", "expert_group_count", How::kReference, "logits.gguf deepseek2 (4 groups)"},
      {"*", "expert_group_used_count", How::kReference, "logits.gguf deepseek2 (2 used)"},
      {"*", "expert_used_count", How::kReference, "keys.gguf qwen3moe_arrays (an array per layer)"},
      {"*", "feed_forward_length", How::kReference, "keys.gguf qwen2_arrays (an array per layer)"},
      {"*", "nextn_predict_layers", How::kReference, "logits.gguf glm4moe; NextnLayersAreNotRun"},
      {"*", "pooling_type", How::kReference, "logits.gguf qwen3_embd_mean, _cls, _last"},
      {"*", "rope.dimension_count", How::kReference, "logits.gguf glm4moe (32 of 64)"},
      {"gemma3", "rope.dimension_count_swa", How::kRefused, "windowed layers' own size", "u32:32"},
      {"*", "rope.freq_base", How::kReference, "logits.gguf qwen2_gqa (1e6)"},
      {"*", "rope.scale_linear", How::kReference, "keys.gguf llama_scale_linear"},
      {"*", "rope.scaling.alpha", How::kReference, "keys.gguf llama_linear (no effect in llama.cpp)"},
      {"*", "rope.scaling.attn_factor", How::kReference, "keys.gguf llama_linear"},
      {"*", "rope.scaling.factor", How::kReference, "keys.gguf llama_linear (linear by default)"},
      {"*", "rope.scaling.finetuned", How::kReference, "keys.gguf llama_linear (no effect)"},
      {"*", "rope.scaling.original_context_length", How::kReference, "logits.gguf llama_yarn"},
      {"*", "rope.scaling.type", How::kReference, "keys.gguf llama_none; logits.gguf llama_yarn"},
      // Each architecture's own (load_arch_hparams).
      {"bert", "attention.layer_norm_epsilon", How::kReference, "logits.gguf bert_mean.embd (1e-12)"},
      {"deepseek2", "attention.key_length_mla", How::kReference, "logits.gguf deepseek2"},
      {"deepseek2", "attention.kv_lora_rank", How::kReference, "logits.gguf deepseek2"},
      {"deepseek2", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf deepseek2 (1e-6)"},
      {"deepseek2", "attention.q_lora_rank", How::kReference, "logits.gguf deepseek2; deepseek2_lite has none"},
      {"deepseek2", "attention.temperature_length", How::kNoEffect, "without temperature_scale", "u32:8"},
      {"deepseek2", "attention.temperature_scale", How::kRefused, "temperature tuning", "f32:0.5"},
      {"deepseek2", "attention.value_length_mla", How::kReference, "logits.gguf deepseek2"},
      {"deepseek2", "expert_feed_forward_length", How::kReference, "logits.gguf deepseek2"},
      {"deepseek2", "expert_gating_func", How::kReference, "logits.gguf deepseek2 (sigmoid)"},
      {"deepseek2", "expert_shared_count", How::kReference, "logits.gguf deepseek2"},
      {"deepseek2", "expert_weights_norm", How::kReference, "logits.gguf deepseek2"},
      {"deepseek2", "expert_weights_scale", How::kReference, "logits.gguf deepseek2 (2.5)"},
      {"deepseek2", "leading_dense_block_count", How::kReference, "logits.gguf deepseek2"},
      {"deepseek2", "rope.scaling.yarn_log_multiplier", How::kReference, "logits.gguf deepseek2_yarn"},
      {"deepseek2", "vocab_size", How::kReference, "logits.gguf deepseek2_lite (llama.cpp tells lite files by it)"},
      {"deepseek4", "attention.compress_ratios", How::kReference, "deepseek4.gguf deepseek4, deepseek4_b"},
      {"deepseek4", "attention.compress_rope_freq_base", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "attention.indexer.head_count", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "attention.indexer.key_length", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "attention.indexer.top_k", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "attention.layer_norm_rms_epsilon", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "attention.output_group_count", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "attention.output_lora_rank", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "attention.q_lora_rank", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "attention.sliding_window", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "expert_feed_forward_length", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "expert_gating_func", How::kReference, "deepseek4.gguf deepseek4 (sqrt softplus)"},
      {"deepseek4", "expert_shared_count", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "expert_weights_norm", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "expert_weights_scale", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "hash_layer_count", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "hyper_connection.count", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "hyper_connection.epsilon", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "hyper_connection.sinkhorn_iterations", How::kReference, "deepseek4.gguf deepseek4"},
      {"deepseek4", "swiglu_clamp_exp", How::kReference, "deepseek4.gguf deepseek4, deepseek4_b"},
      {"deepseek4", "swiglu_clamp_shexp", How::kReference, "keys.gguf deepseek4_shexp"},
      {"gemma2", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf gemma2 (1e-6)"},
      {"gemma2", "attention.sliding_window", How::kReference, "logits.gguf gemma2 (5)"},
      {"gemma2", "attention.sliding_window_pattern", How::kReference, "keys.gguf gemma2_keys"},
      {"gemma2", "attn_logit_softcapping", How::kReference, "logits.gguf gemma2 (1.5)"},
      {"gemma2", "final_logit_softcapping", How::kReference, "logits.gguf gemma2 (3)"},
      {"gemma2", "rope.freq_base_swa", How::kReference, "keys.gguf gemma2_keys"},
      {"gemma3", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf gemma3 (1e-6)"},
      {"gemma3", "attention.sliding_window", How::kReference, "logits.gguf gemma3 (5)"},
      {"gemma3", "attention.sliding_window_pattern", How::kReference, "keys.gguf gemma3_keys, gemma3_pattern"},
      {"gemma3", "final_logit_softcapping", How::kReference, "keys.gguf gemma3_keys"},
      {"gemma3", "rope.freq_base_swa", How::kReference, "keys.gguf gemma3_keys"},
      {"glm4moe", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf glm4moe"},
      {"glm4moe", "expert_feed_forward_length", How::kReference, "logits.gguf glm4moe"},
      {"glm4moe", "expert_gating_func", How::kReference, "logits.gguf glm4moe"},
      {"glm4moe", "expert_shared_count", How::kReference, "logits.gguf glm4moe"},
      {"glm4moe", "expert_weights_norm", How::kReference, "logits.gguf glm4moe"},
      {"glm4moe", "expert_weights_scale", How::kReference, "logits.gguf glm4moe (1.5)"},
      {"glm4moe", "leading_dense_block_count", How::kReference, "logits.gguf glm4moe"},
      {"glm4moe", "rope.dimension_sections", How::kRefused, "multimodal M-RoPE", "u32s:8,8,8,0"},
      {"gpt-oss", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf gpt_oss"},
      {"gpt-oss", "attention.sliding_window", How::kReference, "logits.gguf gpt_oss (5)"},
      {"gpt-oss", "attention.sliding_window_pattern", How::kReference, "keys.gguf gpt_oss_keys"},
      {"gpt-oss", "expert_feed_forward_length", How::kReference, "logits.gguf gpt_oss"},
      {"gpt-oss", "rope.freq_base_swa", How::kReference, "keys.gguf gpt_oss_keys (with YaRN)"},
      {"llama", "attention.layer_norm_rms_epsilon", How::kReference, "keys.gguf llama_linear (0.01)"},
      {"llama", "vocab_size", How::kReference, "keys.gguf llama_linear (no effect)"},
      {"phi3", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf phi3"},
      {"phi3", "attention.sliding_window", How::kReference, "keys.gguf phi3_window (llama.cpp disables Phi's window)"},
      {"qwen2", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf qwen2_gqa (1e-6)"},
      {"qwen3", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf qwen3_gqa (1e-6)"},
      {"qwen3moe", "attention.layer_norm_rms_epsilon", How::kReference, "logits.gguf qwen3moe (1e-6)"},
      {"qwen3moe", "expert_feed_forward_length", How::kReference, "keys.gguf qwen3moe_arrays"},
      {"qwen35", "attention.layer_norm_rms_epsilon", How::kReference, "qwen35.gguf qwen35 (1e-6)"},
      {"qwen35", "attention.recurrent_layers", How::kReference, "qwen35.gguf qwen35_recurrent"},
      {"qwen35", "full_attention_interval", How::kReference, "qwen35.gguf qwen35_odd (3)"},
      {"qwen35", "rope.dimension_sections", How::kReference, "qwen35.gguf qwen35_sections"},
      {"qwen35", "ssm.conv_kernel", How::kStructural, "every qwen35 shape"},
      {"qwen35", "ssm.group_count", How::kStructural, "every qwen35 shape (key heads; 1 in qwen35_odd)"},
      {"qwen35", "ssm.inner_size", How::kStructural, "every qwen35 shape (checked: value heads x state size)"},
      {"qwen35", "ssm.state_size", How::kStructural, "every qwen35 shape (24 in qwen35_odd)"},
      {"qwen35", "ssm.time_step_rank", How::kStructural, "every qwen35 shape (value heads; 3 in qwen35_odd)"},
      // qwen35moe: qwen35's loader and layers, with the mixture.
      {"qwen35moe", "attention.layer_norm_rms_epsilon", How::kReference, "qwen35.gguf qwen35moe (1e-6)"},
      {"qwen35moe", "attention.recurrent_layers", How::kReference, "qwen35.gguf qwen35_recurrent (qwen35's loader)"},
      {"qwen35moe", "expert_feed_forward_length", How::kReference, "qwen35.gguf qwen35moe (64)"},
      {"qwen35moe", "expert_shared_feed_forward_length", How::kReference, "qwen35.gguf qwen35moe (96)"},
      {"qwen35moe", "full_attention_interval", How::kReference, "qwen35.gguf qwen35moe_odd (3)"},
      {"qwen35moe", "rope.dimension_sections", How::kReference, "qwen35.gguf qwen35_sections (qwen35's loader)"},
      {"qwen35moe", "ssm.conv_kernel", How::kStructural, "every qwen35moe shape"},
      {"qwen35moe", "ssm.group_count", How::kStructural, "every qwen35moe shape (1 in qwen35moe_odd)"},
      {"qwen35moe", "ssm.inner_size", How::kStructural, "every qwen35moe shape"},
      {"qwen35moe", "ssm.state_size", How::kStructural, "every qwen35moe shape (24 in qwen35moe_odd)"},
      {"qwen35moe", "ssm.time_step_rank", How::kStructural, "every qwen35moe shape (3 in qwen35moe_odd)"},
  };
  return cases;
}

std::string Strip(const std::string& key) { return key.substr(key.find('.') + 1); }  // "%s.x" -> "x"

// Every key of llama.cpp's list, for every architecture, has a case; every keys.gguf case's shape
// really sets its key.
TEST(HParamKeysTest, EveryKeyLlamaCppReadsIsHonouredOrRefused) {
  std::ifstream in(test::SourceDir() + "/tests/data/llamacpp/hparam_keys.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json keys = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& item : keys["arch"].items()) {
    const std::string arch = item.key();  // named copies: lambdas capture them (not bindings)
    const nlohmann::json& own = item.value();
    std::vector<std::string> all;
    for (const auto& k : keys["generic"]) all.push_back(Strip(k.get<std::string>()));
    for (const auto& k : own) all.push_back(Strip(k.get<std::string>()));
    for (const std::string& key : all) {
      const bool covered = std::any_of(KeyCases().begin(), KeyCases().end(), [&](const KeyCase& c) {
        return c.key == key && (c.arch == arch || std::string(c.arch) == "*" ||
                                (c.how == How::kRefused && std::find(own.begin(), own.end(), "%s." + key) == own.end()));
      });
      EXPECT_TRUE(covered) << arch << ": llama.cpp reads " << key << " and no case checks it";
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
  for (const KeyCase& c : KeyCases()) {
    if (c.how != How::kReference || !std::string(c.where).starts_with("keys.gguf ")) continue;
    const std::string names = std::string(c.where).substr(10);
    const auto shape = std::find_if(KeyShapes().begin(), KeyShapes().end(),
                                    [&](const KeyShape& k) { return names.starts_with(k.name); });
    ASSERT_NE(shape, KeyShapes().end()) << c.where;
    EXPECT_NE(Synth(ShapeOf(*shape))->Find(std::string(shape->arch) + "." + c.key), nullptr)
        << c.key << ": " << shape->name << " does not set it";
  }
}

// A small file of each architecture that loads, as the refusals' base.
SynthShape BaseOf(const std::string& arch) {
  SynthShape s;
  s.arch = arch;
  s.dim = 64;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = arch == "bert" ? 4 : 2;
  s.ffn_dim = 128;
  s.vocab_size = 512;
  s.context_length = 256;
  if (arch == "gemma3") s.sliding_window = 5;
  if (arch == "glm4moe" || arch == "deepseek2") {
    s.num_experts = 4;
    s.experts_used = 2;
    s.expert_ffn = 64;
  }
  if (arch == "deepseek2") {
    s.kv_lora_rank = 32;
    s.q_lora_rank = 32;
    s.nope_dim = 16;
    s.rope_dim = 16;
    s.v_head_dim = 16;
    s.num_kv_heads = 4;
  }
  return s;
}

TEST(HParamKeysTest, KeysGaleDoesNotRunAreRefusedNamingThem) {
  int refused = 0;
  for (const KeyCase& c : KeyCases()) {
    if (c.how != How::kRefused) continue;
    SCOPED_TRACE(std::string(c.arch) + " " + c.key);
    SynthShape s = BaseOf(c.arch);
    ASSERT_TRUE(LoadModel(*Synth(s)).ok()) << "the base file must load";
    s.keys.push_back(ParseSynthKey(std::string(c.key) + "=" + c.value).value());
    auto m = LoadModel(*Synth(s));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(c.key), std::string::npos) << m.status().message();
    ++refused;
  }
  EXPECT_GE(refused, 9);
}

TEST(HParamKeysTest, KeysWithoutEffectChangeNothing) {
  int cases = 0;
  for (const KeyCase& c : KeyCases()) {
    if (c.how != How::kNoEffect) continue;
    SCOPED_TRACE(std::string(c.arch) + " " + c.key);
    SynthShape s = BaseOf(c.arch);
    const std::vector<int32_t> tokens = {1, 70, 300, 12, 9, 400};
    const std::vector<float> without = test::PrefillLogits(*Synth(s), tokens);
    s.keys.push_back(ParseSynthKey(std::string(c.key) + "=" + c.value).value());
    EXPECT_EQ(test::PrefillLogits(*Synth(s), tokens), without);
    ++cases;
  }
  EXPECT_GE(cases, 1);
}

// A file whose last layer is a multi-token-prediction layer (nextn_predict_layers 1) runs the
// layers before it: bitwise the logits of the same file without that layer (synth seeds each
// tensor by its name, so the layers it shares are the same).
TEST(HParamKeysTest, NextnLayersAreNotRun) {
  for (const char* arch : {"llama", "qwen3"}) {
    SCOPED_TRACE(arch);
    SynthShape two = BaseOf(arch);
    SynthShape three = two;
    three.num_layers = 3;
    three.keys.push_back(ParseSynthKey("nextn_predict_layers=u32:1").value());
    const std::vector<int32_t> tokens = {1, 70, 300, 12, 9, 400};
    auto with = Synth(three);
    auto m = LoadModel(*with);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->hparams().num_layers, 2);
    EXPECT_EQ(test::PrefillLogits(*with, tokens), test::PrefillLogits(*Synth(two), tokens));
  }
}

// Per-layer values gale cannot run (its layers share one) are refused naming the key.
TEST(HParamKeysTest, PerLayerValuesThatDifferAreRefused) {
  SynthShape s = BaseOf("qwen2");
  s.keys.push_back(ParseSynthKey("attention.head_count_kv=u32s:2,4").value());
  auto m = LoadModel(*Synth(s));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("head_count_kv"), std::string::npos) << m.status().message();
  SynthShape t = BaseOf("qwen2");
  t.keys.push_back(ParseSynthKey("attention.head_count=str:four").value());
  auto n = LoadModel(*Synth(t));
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("head_count"), std::string::npos) << n.status().message();
}

// A key of the wrong kind is never read as its default (the file asks for something).
TEST(HParamKeysTest, KeysOfTheWrongKindAreRefusedNotDefaulted) {
  for (const char* spec : {"rope.freq_base_swa=str:fifty", "attention.sliding_window=bool:true",
                           "final_logit_softcapping=str:3", "rope.scaling.factor=str:2"}) {
    SCOPED_TRACE(spec);
    SynthShape s = BaseOf("gemma3");
    s.keys.push_back(ParseSynthKey(spec).value());
    auto m = LoadModel(*Synth(s));
    ASSERT_FALSE(m.ok());
    const std::string key = std::string(spec).substr(0, std::string(spec).find('='));
    EXPECT_NE(m.status().message().find(key), std::string::npos) << m.status().message();
  }
}

}  // namespace
}  // namespace gale
