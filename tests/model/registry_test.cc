// LoadModel's dispatch and each architecture's checks of its file: an unknown architecture names
// the supported ones, a missing architecture-specific tensor is an error naming it, a file with
// exactly the architecture's tensors loads without warnings, and a tensor it does not use is named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "../test_util.h"
#include "base/thread_pool.h"
#include "engine/engine.h"
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
  EXPECT_EQ(SupportedArchitectures(), (std::vector<std::string>{"llama", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "phi3", "gemma2", "gemma3", "deepseek2", "deepseek4", "deepseek41", "glm4moe", "gpt-oss", "bert"}));
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
  EXPECT_NE(m.status().message().find("llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe, phi3, gemma2, gemma3, deepseek2, deepseek4, deepseek41, glm4moe, gpt-oss"), std::string::npos) << m.status().message();
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
           {"gemma2", "blk.0.post_attention_norm.weight"}, {"deepseek4", "output_hc_fn.weight"},
           {"deepseek4", "blk.1.indexer.proj.weight"}, {"deepseek4", "blk.2.attn_compressor_ape.weight"},
           {"deepseek4", "blk.0.ffn_gate_tid2eid.weight"}, {"deepseek4", "blk.1.exp_probs_b.bias"},
           {"deepseek4", "blk.2.hc_ffn_scale.weight"}, {"deepseek41", "blk.0.engram_wkv.weight"},
           {"deepseek41", "blk.2.engram_embd.weight"}, {"deepseek41", "blk.1.attn_compressor_norm.weight"},
           {"deepseek41", "blk.3.indexer.k_norm.weight"}, {"deepseek41", "blk.1.indexer.proj.weight"}}) {
    const auto b = Edited(arch, tensor);
    auto m = LoadModel(**GgufFile::FromBytes(b));
    ASSERT_FALSE(m.ok()) << arch << " without " << tensor;
    EXPECT_NE(m.status().message().find(tensor), std::string::npos) << m.status().message();
  }
}

// KV retention on a sliding-window model needs the windowed layers in layer groups of their own
// (they index positions while retention compacts the full layers' slots): a cache of one group
// is refused with a clear error in the forward pass, as are the engine's settings that would
// give one (--no-kv-window-groups) and a model whose every layer is windowed.
TEST(RegistryTest, SlidingWindowModelsRefuseRetentionWithoutLayerGroups) {
  const auto b = Edited("gemma3");
  const auto file = GgufFile::FromBytes(b).value();  // outlives the model, which reads its weights in place
  auto m = LoadModel(*file).value();
  EXPECT_EQ(m->hparams().sliding_window, 8);
  EXPECT_EQ(m->hparams().LayerWindow(5), 0);  // the sixth layer is global
  EXPECT_EQ(m->hparams().LayerWindow(6), 8);
  Workspace ws;
  ThreadPool pool(1);
  std::vector<float> acc(m->hparams().num_layers * 16);
  ForwardBatch batch;
  batch.tokens = {1, 2};
  batch.positions = {0, 1};
  batch.attn_acc = {{acc.data(), 16}};
  KvCache single(m->hparams(), 16);
  auto s = m->Forward(batch, single, ws, pool);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer groups"), std::string::npos) << s.message();
  KvCache grouped(m->hparams(), 16, 1, kernels::KvType::kF32, 16, std::nullopt, /*window_groups=*/true);
  EXPECT_TRUE(m->Forward(batch, grouped, ws, pool).ok());
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 8 << 20;
  cfg.retention.policy = RetentionPolicy::kWindow;
  cfg.retention.budget = 32;
  cfg.kv_window_groups = false;
  auto e = Engine::Create(*m, nullptr, cfg, pool);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--no-kv-window-groups"), std::string::npos) << e.status().message();
  cfg.kv_window_groups = true;
  EXPECT_TRUE(Engine::Create(*m, nullptr, cfg, pool).ok());
  const auto mistral_bytes = SynthesizeModel(test::ArchTestShape("mistral"), GgmlType::kF32, 1)->WriteToBytes();
  const auto mistral_file = GgufFile::FromBytes(mistral_bytes).value();
  auto mistral = LoadModel(*mistral_file).value();
  e = Engine::Create(*mistral, nullptr, cfg, pool);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("full-attention layers"), std::string::npos) << e.status().message();
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

// A value_length the tensors do not have is an error naming the tensor (the V rows' width).
TEST(RegistryTest, AValueHeadSizeTheTensorsDoNotHaveIsAnError) {
  const auto b = Edited("qwen3", "", {"qwen3.attention.value_length", GgufValue::U32(64)});
  auto m = LoadModel(**GgufFile::FromBytes(b));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("attn_v"), std::string::npos) << m.status().message();
}

// K and V head sizes that differ (V narrower than K; every dense family, with its biases, fused
// matrices, windows and sinks): the model gives the logits of the same weights with V widened to
// K's head size by zero rows (and the output projection by zero columns), whose attention runs
// the SIMD kernels with K = V: the V-size path agrees to rounding (it sums in another order).
TEST(RegistryTest, ValueHeadSizeOtherThanKeysEqualsZeroPaddedValues) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "gpt-oss", "glm4moe"}) {
    SCOPED_TRACE(arch);
    SynthShape shape = test::ArchTestShape(arch);
    const int64_t hd = shape.head_dim > 0 ? shape.head_dim : shape.dim / shape.num_heads, vh = hd / 2;
    shape.v_head_dim = vh;
    const auto bytes = SynthesizeModel(shape, GgmlType::kF32, 3)->WriteToBytes();
    const auto file = GgufFile::FromBytes(bytes).value();
    auto model = LoadModel(*file);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const ModelHParams& hp = (*model)->hparams();
    ASSERT_EQ(hp.value_head(), vh);
    // The padded file: V's rows per KV head [vh real, hd - vh zero]; wo's columns likewise per head.
    GgufWriter w;
    for (const auto& [k, v] : file->metadata()) w.SetValue(k, v);
    w.SetValue(hp.arch + ".attention.value_length", GgufValue::U32(static_cast<uint32_t>(hd)));
    w.SetValue(hp.arch + ".attention.key_length", GgufValue::U32(static_cast<uint32_t>(hd)));
    auto widen_rows = [&](const float* src, int64_t heads, int64_t cols, std::vector<float>& out) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < hd; ++d) {
          for (int64_t c = 0; c < cols; ++c) out.push_back(d < vh ? src[(h * vh + d) * cols + c] : 0.0f);
        }
      }
    };
    for (const auto& t : file->tensors()) {
      const float* f = reinterpret_cast<const float*>(t.data);
      const std::string suffix = t.name.substr(t.name.find('.', 4) + 1);
      std::vector<float> out;
      std::vector<int64_t> shape_out = t.shape;
      const int64_t cols = static_cast<int64_t>(t.shape[0]);
      if (suffix == "attn_v.weight" || suffix == "attn_v.bias") {
        widen_rows(f, hp.num_kv_heads, t.shape.size() > 1 ? cols : 1, out);
        shape_out.back() = hp.num_kv_heads * hd;
        if (t.shape.size() == 1) shape_out[0] = hp.num_kv_heads * hd;
      } else if (suffix == "attn_qkv.weight") {
        const int64_t qk_rows = hp.q_dim() + hp.kv_dim();
        out.assign(f, f + qk_rows * cols);
        widen_rows(f + qk_rows * cols, hp.num_kv_heads, cols, out);
        shape_out[1] = qk_rows + hp.num_kv_heads * hd;
      } else if (suffix == "attn_output.weight") {
        for (int64_t r = 0; r < t.shape[1]; ++r) {
          for (int64_t h = 0; h < hp.num_heads; ++h) {
            for (int64_t d = 0; d < hd; ++d) out.push_back(d < vh ? f[r * cols + h * vh + d] : 0.0f);
          }
        }
        shape_out[0] = hp.num_heads * hd;
      } else {
        out.assign(f, f + t.num_bytes / 4);
      }
      std::vector<uint8_t> raw(out.size() * 4);
      std::memcpy(raw.data(), out.data(), raw.size());
      ASSERT_TRUE(w.AddTensor(t.name, t.type_id, shape_out, raw).ok()) << t.name;
    }
    const auto padded_bytes = w.WriteToBytes();
    const auto padded_file = GgufFile::FromBytes(padded_bytes).value();
    auto padded = LoadModel(*padded_file);
    ASSERT_TRUE(padded.ok()) << padded.status().ToString();
    ASSERT_EQ((*padded)->hparams().value_head(), hd);
    ThreadPool pool(2);
    auto logits = [&](const Model& m) {
      KvCache kv(m.hparams(), 32);
      Workspace ws;
      ForwardBatch b;
      for (int32_t i = 0; i < 20; ++i) {
        b.tokens.push_back(3 + (i * 37) % 200);
        b.positions.push_back(i);
      }
      b.all_logits = true;
      EXPECT_TRUE(m.Forward(b, kv, ws, pool).ok());
      return std::vector<float>(ws.logits.begin(), ws.logits.begin() + 20 * m.hparams().vocab_size);
    };
    const auto a = logits(**model), p = logits(**padded);
    double max_diff = 0.0, max_abs = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - p[i])));
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(p[i])));
    }
    EXPECT_LT(max_diff, 1e-4 * std::max(1.0, max_abs)) << "max |logit| " << max_abs;
    std::printf("%s: K head %lld, V head %lld: max |diff| %.2g against zero-padded V (max |logit| %.3g)\n", arch,
                static_cast<long long>(hd), static_cast<long long>(vh), max_diff, max_abs);
  }
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

namespace gale {
namespace {

// The seam: outside src/model/arch/ and the registry's table, no source names an architecture (as
// a quoted GGUF name); the drivers (synth, quantize, convert, the CLI) ask ArchSpec. The few
// places where the same text is something else are listed with what it is there.
TEST(RegistryTest, NoSourceOutsideTheArchitecturesNamesOne) {
  namespace fs = std::filesystem;
  const std::vector<std::pair<std::string, std::string>> allowed = {
      {"src/convert/llama2c_convert.cc", "llama"},  // llama2.c's checkpoints are llama models by their format
      {"src/model/synth.h", "llama"},               // SynthShape's default architecture
      {"src/model/synth.cc", "llama"},              // tokenizer.ggml.model "llama": SentencePiece
      {"src/model/hf_tokenizer.cc", "llama"},       // the same tokenizer model name
      {"src/model/hf_tokenizer.h", "llama"},
      {"src/model/tokenizer.cc", "llama"},
      {"src/model/tokenizer.cc", "bert"},           // tokenizer.ggml.model "bert": WordPiece
      {"src/model/tokenizer.cc", "qwen2"},          // tokenizer.ggml.pre "qwen2": a pre-tokenizer
      {"src/model/tokenizer.cc", "qwen35"},         // tokenizer.ggml.pre "qwen35": Qwen3.5's pre-tokenizer
      {"src/model/tokenizer.cc", "phi3"},           // a general.name fragment (as llama.cpp, by the name)
      {"src/model/hf_tokenizer.cc", "qwen2"},
      {"src/model/hf_tokenizer.h", "qwen2"},
      {"src/model/hparams.h", "deepseek2"},         // a comment naming llama.cpp's MLA format
  };
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(test::SourceDir() + "/src")) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), test::SourceDir()).string();
    if (rel.starts_with("src/model/arch/") || rel == "src/model/registry.cc") continue;
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    ++files;
    for (const std::string& arch : SupportedArchitectures()) {
      if (text.find("\"" + arch + "\"") == std::string::npos) continue;
      const bool ok = std::find(allowed.begin(), allowed.end(), std::make_pair(rel, arch)) != allowed.end();
      EXPECT_TRUE(ok) << rel << " names the architecture \"" << arch
                      << "\": put what it needs in the architecture's file (model/arch_spec.h)";
    }
  }
  EXPECT_GT(files, 100);
}

}  // namespace
}  // namespace gale
