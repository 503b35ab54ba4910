// gale convert --hf for Qwen3.5 / 3.6: synthetic qwen35 and qwen35moe models written out as Hugging
// Face checkpoints (the text model of Qwen3_5ForCausalLM, and of the multimodal
// Qwen3_5MoeForConditionalGeneration with its vision and MTP tensors beside it) convert back to the
// same tensors and logits; bad checkpoints are clear errors.
//
// The export follows Hugging Face's conventions, stated independently of the converter: value
// head `hh` of a linear-attention layer reads key head hh / r (r value heads per key head, in
// groups), where llama.cpp's value head j reads key head j % key_heads; so HF's head g * r + i is
// GGUF's head i * key_heads + g. The zero-centred norms store w - 1, A_log = log(-ssm_a), the
// convolution is [channels, 1, K].
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "convert/hf_convert.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "gguf/safetensors.h"
#include "model/model.h"
#include "model/synth.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

SynthShape Shape(bool moe) {
  SynthShape s;
  s.arch = moe ? "qwen35moe" : "qwen35";
  s.dim = 64, s.num_layers = 4, s.num_heads = 4, s.num_kv_heads = 2, s.head_dim = 16, s.ffn_dim = 96;
  s.vocab_size = 300, s.context_length = 512;  // the tokenizer's 258, padded
  s.ssm_conv = 4, s.ssm_state = 16, s.ssm_k_heads = 2, s.ssm_v_heads = 6;  // three value heads per key head
  // Layers 0, 2 and 3 recurrent, layer 1 full attention.
  s.keys.push_back({"attention.recurrent_layers", GgufValue::Array(GgufValueType::kBool,
                                                                   {GgufValue::Bool(true), GgufValue::Bool(false),
                                                                    GgufValue::Bool(true), GgufValue::Bool(true)})});
  if (moe) s.num_experts = 4, s.experts_used = 2, s.expert_ffn = 32;
  return s;
}

class HfQwen35Test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gale-hf-q35-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The synthetic model as a checkpoint in dir_ (multimodal: text model under
  // model.language_model, text_config, vision and MTP tensors that are not converted; the MoE's
  // experts fused or per expert). Returns the config written.
  Json Export(const SynthShape& s, const GgufFile& g, bool multimodal, bool fused_experts) {
    const int64_t k = s.ssm_k_heads, v = s.ssm_v_heads, r = v / k, st = s.ssm_state;
    // HF head hh = grp * r + i is GGUF head i * k + grp.
    auto gguf_head = [&](int64_t hh) { return (hh % r) * k + hh / r; };
    const std::string pre = multimodal ? "model.language_model." : "model.";
    std::vector<SafetensorsFile::Entry> entries;
    auto put = [&](const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
      entries.push_back({name, "F32", std::move(shape), test::FloatBytes(values)});
    };
    auto tensor = [&](const std::string& name) {
      const GgufTensorInfo* t = g.FindTensor(name);
      EXPECT_NE(t, nullptr) << name;
      return test::TensorValues(*t);
    };
    auto minus_one = [](std::vector<float> x) {
      for (float& e : x) e -= 1.0f;
      return x;
    };
    // Rows [first, first + v * size) in HF order from GGUF's: HF row block hh is GGUF block gguf_head(hh).
    auto grouped_rows = [&](const std::vector<float>& x, int64_t cols, int64_t first, int64_t size) {
      std::vector<float> out = x;
      for (int64_t hh = 0; hh < v; ++hh) {
        for (int64_t e = 0; e < size; ++e) {
          std::memcpy(&out[(first + hh * size + e) * cols], &x[(first + gguf_head(hh) * size + e) * cols], cols * 4);
        }
      }
      return out;
    };
    put(pre + "embed_tokens.weight", {s.vocab_size, s.dim}, tensor("token_embd.weight"));
    put(pre + "norm.weight", {s.dim}, minus_one(tensor("output_norm.weight")));
    put("lm_head.weight", {s.vocab_size, s.dim}, tensor("output.weight"));
    const int64_t conv_dim = 2 * k * st + v * st, q = s.num_heads * s.head_dim, kv = s.num_kv_heads * s.head_dim;
    for (int64_t l = 0; l < s.num_layers; ++l) {
      const std::string h = pre + "layers." + std::to_string(l) + ".", b = "blk." + std::to_string(l) + ".";
      put(h + "input_layernorm.weight", {s.dim}, minus_one(tensor(b + "attn_norm.weight")));
      put(h + "post_attention_layernorm.weight", {s.dim}, minus_one(tensor(b + "post_attention_norm.weight")));
      if (l != 1) {
        const std::string a = h + "linear_attn.";
        put(a + "in_proj_qkv.weight", {conv_dim, s.dim}, grouped_rows(tensor(b + "attn_qkv.weight"), s.dim, 2 * k * st, st));
        put(a + "in_proj_z.weight", {v * st, s.dim}, grouped_rows(tensor(b + "attn_gate.weight"), s.dim, 0, st));
        put(a + "in_proj_a.weight", {v, s.dim}, grouped_rows(tensor(b + "ssm_alpha.weight"), s.dim, 0, 1));
        put(a + "in_proj_b.weight", {v, s.dim}, grouped_rows(tensor(b + "ssm_beta.weight"), s.dim, 0, 1));
        put(a + "conv1d.weight", {conv_dim, 1, s.ssm_conv},
            grouped_rows(tensor(b + "ssm_conv1d.weight"), s.ssm_conv, 2 * k * st, st));
        std::vector<float> dt = grouped_rows(tensor(b + "ssm_dt.bias"), 1, 0, 1);
        std::vector<float> a_log = grouped_rows(tensor(b + "ssm_a"), 1, 0, 1);
        for (float& e : a_log) e = std::log(-e);
        put(a + "dt_bias", {v}, dt);
        put(a + "A_log", {v}, a_log);
        put(a + "norm.weight", {st}, tensor(b + "ssm_norm.weight"));
        // out_proj's columns: HF column block hh is GGUF block gguf_head(hh).
        const std::vector<float> o = tensor(b + "ssm_out.weight");
        std::vector<float> out(o.size());
        const int64_t cols = v * st;
        for (int64_t row = 0; row < s.dim; ++row) {
          for (int64_t hh = 0; hh < v; ++hh) {
            for (int64_t e = 0; e < st; ++e) out[row * cols + hh * st + e] = o[row * cols + gguf_head(hh) * st + e];
          }
        }
        put(a + "out_proj.weight", {s.dim, cols}, out);
      } else {
        const std::string a = h + "self_attn.";
        put(a + "q_proj.weight", {2 * q, s.dim}, tensor(b + "attn_q.weight"));
        put(a + "k_proj.weight", {kv, s.dim}, tensor(b + "attn_k.weight"));
        put(a + "v_proj.weight", {kv, s.dim}, tensor(b + "attn_v.weight"));
        put(a + "o_proj.weight", {s.dim, q}, tensor(b + "attn_output.weight"));
        put(a + "q_norm.weight", {s.head_dim}, minus_one(tensor(b + "attn_q_norm.weight")));
        put(a + "k_norm.weight", {s.head_dim}, minus_one(tensor(b + "attn_k_norm.weight")));
      }
      const std::string m = h + "mlp.";
      if (s.num_experts == 0) {
        put(m + "gate_proj.weight", {s.ffn_dim, s.dim}, tensor(b + "ffn_gate.weight"));
        put(m + "up_proj.weight", {s.ffn_dim, s.dim}, tensor(b + "ffn_up.weight"));
        put(m + "down_proj.weight", {s.dim, s.ffn_dim}, tensor(b + "ffn_down.weight"));
        continue;
      }
      const int64_t e = s.num_experts, f = s.expert_ffn;
      put(m + "gate.weight", {e, s.dim}, tensor(b + "ffn_gate_inp.weight"));
      const std::vector<float> gate = tensor(b + "ffn_gate_exps.weight"), up = tensor(b + "ffn_up_exps.weight"),
                               down = tensor(b + "ffn_down_exps.weight");
      if (fused_experts) {
        std::vector<float> gu;
        for (int64_t x = 0; x < e; ++x) {
          gu.insert(gu.end(), gate.begin() + x * f * s.dim, gate.begin() + (x + 1) * f * s.dim);
          gu.insert(gu.end(), up.begin() + x * f * s.dim, up.begin() + (x + 1) * f * s.dim);
        }
        put(m + "experts.gate_up_proj", {e, 2 * f, s.dim}, gu);
        put(m + "experts.down_proj", {e, s.dim, f}, down);
      } else {
        for (int64_t x = 0; x < e; ++x) {
          const std::string p = m + "experts." + std::to_string(x) + ".";
          put(p + "gate_proj.weight", {f, s.dim}, {gate.begin() + x * f * s.dim, gate.begin() + (x + 1) * f * s.dim});
          put(p + "up_proj.weight", {f, s.dim}, {up.begin() + x * f * s.dim, up.begin() + (x + 1) * f * s.dim});
          put(p + "down_proj.weight", {s.dim, f}, {down.begin() + x * f * s.dim, down.begin() + (x + 1) * f * s.dim});
        }
      }
      put(m + "shared_expert.gate_proj.weight", {s.ffn_dim, s.dim}, tensor(b + "ffn_gate_shexp.weight"));
      put(m + "shared_expert.up_proj.weight", {s.ffn_dim, s.dim}, tensor(b + "ffn_up_shexp.weight"));
      put(m + "shared_expert.down_proj.weight", {s.dim, s.ffn_dim}, tensor(b + "ffn_down_shexp.weight"));
      put(m + "shared_expert_gate.weight", {1, s.dim}, tensor(b + "ffn_gate_inp_shexp.weight"));
    }
    if (multimodal) {
      put("model.visual.patch_embed.proj.weight", {8, 12}, std::vector<float>(96, 0.5f));
      put("mtp.fc.weight", {s.dim, 2 * s.dim}, std::vector<float>(2 * s.dim * s.dim, 0.25f));
    }
    // Two shards.
    std::vector<SafetensorsFile::Entry> second(entries.begin() + static_cast<std::ptrdiff_t>(entries.size() / 2),
                                               entries.end());
    entries.resize(entries.size() / 2);
    test::WriteFile(dir_ / "model-00001-of-00002.safetensors", SafetensorsFile::Write(entries));
    test::WriteFile(dir_ / "model-00002-of-00002.safetensors", SafetensorsFile::Write(second));

    const auto sections = g.Find(s.arch + ".rope.dimension_sections");
    std::vector<int32_t> mrope;
    for (const GgufValue& x : sections->array) mrope.push_back(static_cast<int32_t>(*x.AsInt()));
    mrope.resize(3);  // as Qwen3.5's configs give them: three sections
    Json text = {{"hidden_size", s.dim}, {"num_hidden_layers", s.num_layers}, {"num_attention_heads", s.num_heads},
                 {"num_key_value_heads", s.num_kv_heads}, {"head_dim", s.head_dim}, {"vocab_size", s.vocab_size},
                 {"max_position_embeddings", s.context_length},
                 {"rms_norm_eps", g.GetDouble(s.arch + ".attention.layer_norm_rms_epsilon", 0.0)},
                 {"linear_conv_kernel_dim", s.ssm_conv}, {"linear_key_head_dim", st}, {"linear_value_head_dim", st},
                 {"linear_num_key_heads", k}, {"linear_num_value_heads", v},
                 {"layer_types", {"linear_attention", "full_attention", "linear_attention", "linear_attention"}},
                 {"attn_output_gate", true}, {"tie_word_embeddings", false},
                 {"rope_parameters", {{"rope_type", "default"},
                                      {"rope_theta", g.GetDouble(s.arch + ".rope.freq_base", 0.0)},
                                      {"partial_rotary_factor",
                                       static_cast<double>(g.GetInt(s.arch + ".rope.dimension_count", 0)) / s.head_dim},
                                      {"mrope_section", mrope}, {"mrope_interleaved", true}}}};
    if (s.num_experts > 0) {
      text["num_experts"] = s.num_experts;
      text["num_experts_per_tok"] = s.experts_used;
      text["moe_intermediate_size"] = s.expert_ffn;
      text["shared_expert_intermediate_size"] = s.ffn_dim;
      text["norm_topk_prob"] = true;
    } else {
      text["intermediate_size"] = s.ffn_dim;
    }
    Json config;
    if (multimodal) {
      config = {{"architectures", {s.num_experts > 0 ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration"}},
                {"text_config", text}, {"vision_config", {{"depth", 2}}}};
    } else {
      config = text;
      config["architectures"] = {s.num_experts > 0 ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM"};
    }
    test::WriteFile(dir_ / "config.json", config.dump(2));
    Json vocab = Json::object();
    for (int b = 0; b < 256; ++b) vocab[test::ByteLevelChar(b)] = b;
    Json tok = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array()}}},
                {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                {"decoder", {{"type", "ByteLevel"}}},
                {"added_tokens",
                 {{{"id", 256}, {"content", "<|endoftext|>"}, {"special", true}},
                  {{"id", 257}, {"content", "<|im_end|>"}, {"special", true}}}}};
    test::WriteFile(dir_ / "tokenizer.json", tok.dump());
    test::WriteFile(dir_ / "tokenizer_config.json", Json{{"eos_token", "<|im_end|>"}}.dump());
    return config;
  }

  StatusOr<std::unique_ptr<GgufFile>> Convert(HfConvertReport* report = nullptr) {
    GgufWriter w;
    ASSIGN_OR_RETURN(HfConvertReport r, ConvertHf(dir_.string(), GgmlType::kF32, &w));
    if (report != nullptr) *report = r;
    return GgufFile::FromBytes(w.WriteToBytes());
  }

  fs::path dir_;
};

std::unique_ptr<GgufFile> Synth(const SynthShape& s, uint64_t seed) {
  auto w = SynthesizeModel(s, GgmlType::kF32, seed);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return GgufFile::FromBytes(w->WriteToBytes()).value();
}

// Tensor by tensor the synthetic model's values (ssm_a through exp and log: within an ulp or two),
// the keys the loader reads, and the same logits.
void ExpectSameModel(const GgufFile& got, const GgufFile& want, const std::string& arch) {
  for (const GgufTensorInfo& w : want.tensors()) {
    SCOPED_TRACE(w.name);
    const GgufTensorInfo* g = got.FindTensor(w.name);
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(g->shape, w.shape);
    ASSERT_EQ(g->type_id, w.type_id);
    const std::vector<float> gv = test::TensorValues(*g), wv = test::TensorValues(w);
    const bool rounded = w.name.ends_with("ssm_a");
    for (size_t i = 0; i < wv.size(); ++i) {
      if (rounded) {
        ASSERT_NEAR(gv[i], wv[i], 1e-6f * std::fabs(wv[i])) << i;
      } else {
        ASSERT_EQ(gv[i], wv[i]) << i;
      }
    }
  }
  EXPECT_EQ(got.tensors().size(), want.tensors().size());
  for (const char* key : {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank",
                          "ssm.inner_size", "rope.dimension_count", "attention.key_length", "expert_count",
                          "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length"}) {
    EXPECT_EQ(got.GetInt(arch + "." + key, -1), want.GetInt(arch + "." + key, -1)) << key;
  }
  EXPECT_EQ(got.Find(arch + ".rope.dimension_sections")->array.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(got.Find(arch + ".rope.dimension_sections")->array[i].AsInt(),
              want.Find(arch + ".rope.dimension_sections")->array[i].AsInt());
  }
  const GgufValue* kinds = got.Find(arch + ".attention.recurrent_layers");
  ASSERT_NE(kinds, nullptr);
  EXPECT_EQ(kinds->array.size(), 4u);
  EXPECT_FALSE(*kinds->array[1].AsBool());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 37 + 5) % 256);
  const std::vector<float> a = test::PrefillLogits(got, tokens), b = test::PrefillLogits(want, tokens);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  float worst = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  EXPECT_LT(worst, 1e-4f);
}

TEST_F(HfQwen35Test, DenseCheckpointConverts) {
  const SynthShape s = Shape(/*moe=*/false);
  auto synth = Synth(s, 3);
  Export(s, *synth, /*multimodal=*/false, false);
  HfConvertReport report;
  auto got = Convert(&report);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*(*got)->GetString("general.architecture"), "qwen35");
  ExpectSameModel(**got, *synth, "qwen35");
  EXPECT_TRUE(report.skipped.empty()) << report.skipped.size();
}

TEST_F(HfQwen35Test, MultimodalMoeCheckpointConverts) {
  const SynthShape s = Shape(/*moe=*/true);
  auto synth = Synth(s, 4);
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused);
    Export(s, *synth, /*multimodal=*/true, fused);
    HfConvertReport report;
    auto got = Convert(&report);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*(*got)->GetString("general.architecture"), "qwen35moe");
    ExpectSameModel(**got, *synth, "qwen35moe");
    // The vision tower and the MTP block are listed as skipped.
    EXPECT_EQ(report.skipped, (std::vector<std::string>{"model.visual.patch_embed.proj.weight", "mtp.fc.weight"}));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
}

// Checkpoints it cannot convert are errors that say why.
TEST_F(HfQwen35Test, BadCheckpointsAreClearErrors) {
  const SynthShape s = Shape(/*moe=*/false);
  auto synth = Synth(s, 3);
  const Json good = Export(s, *synth, false, false);
  auto expect = [&](Json c, const std::string& needle) {
    test::WriteFile(dir_ / "config.json", c.dump());
    auto got = Convert();
    ASSERT_FALSE(got.ok()) << needle;
    EXPECT_NE(got.status().message().find(needle), std::string::npos) << got.status().ToString();
  };
  Json c = good;
  c["linear_value_head_dim"] = 32;
  expect(c, "linear_value_head_dim");
  c = good;
  c["linear_num_value_heads"] = 5;
  expect(c, "multiple of the key heads");
  c = good;
  c["layer_types"] = {"linear_attention", "full_attention"};
  expect(c, "layer_types has 2 entries");
  c = good;
  c["attn_output_gate"] = false;
  expect(c, "attn_output_gate");
  c = good;
  c["rope_parameters"]["rope_type"] = "yarn";
  expect(c, "RoPE type 'yarn'");
  c = good;
  c["hidden_size"] = 32;  // the tensors are 64 wide
  expect(c, "has shape");
  // A tensor missing.
  test::WriteFile(dir_ / "config.json", good.dump());
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  auto got = Convert();
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("missing from the checkpoint"), std::string::npos) << got.status().ToString();
}

}  // namespace
}  // namespace gale
