// gale convert --hf for DeepSeek-V4 / V4.1 checkpoints. A random-weight deepseek4 (and deepseek41)
// model is written out as DeepSeek publishes its checkpoints (the names, dtypes and layouts of the
// public weight inventory: FP8 e4m3 dense matrices with UE8M0 scales per 128x128 (V4) or 32x32
// (V4.1) tile in a .scale tensor, FP4 e2m1 experts two per byte, low nibble first, with a UE8M0
// scale per 32, BF16 embeddings, norms and compressors, F32 mixes and sinks, an I64 hash table,
// the config flat (V4) or under text_config (V4.1)). Converted back, every tensor holds exactly the
// checkpoint's values (FP8 as F8E4M3, FP4 as MXFP4 with the same codes), and the model gives the
// logits of the original weights rounded as the checkpoint rounds them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "base/fp16.h"
#include "base/thread_pool.h"
#include "model/arch/deepseek4_engram.h"
#include "convert/hf_convert.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_file.h"
#include "gguf/safetensors.h"
#include "model/model.h"
#include "model/synth.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// How the checkpoint stores a tensor.
enum class Store { kFp8, kBf16, kF32, kI64 };

// The published name and storage of a GGUF tensor of gale's deepseek4 / deepseek41 files (the
// inverse of the converter's map, written out again from the public inventory).
bool HfNameOf(const std::string& gguf, std::string* hf, Store* store) {
  static const std::map<std::string, std::pair<std::string, Store>> kTop = {
      {"token_embd.weight", {"embed.weight", Store::kBf16}},
      {"output.weight", {"head.weight", Store::kBf16}},
      {"output_norm.weight", {"norm.weight", Store::kBf16}},
      {"output_hc_base.weight", {"hc_head_base", Store::kF32}},
      {"output_hc_fn.weight", {"hc_head_fn", Store::kF32}},
      {"output_hc_scale.weight", {"hc_head_scale", Store::kF32}}};
  static const std::map<std::string, std::pair<std::string, Store>> kLayer = {
      {"attn_norm.weight", {"attn_norm.weight", Store::kBf16}},
      {"ffn_norm.weight", {"ffn_norm.weight", Store::kBf16}},
      {"attn_q_a.weight", {"attn.wq_a.weight", Store::kFp8}},
      {"attn_q_a_norm.weight", {"attn.q_norm.weight", Store::kBf16}},
      {"attn_q_b.weight", {"attn.wq_b.weight", Store::kFp8}},
      {"attn_kv.weight", {"attn.wkv.weight", Store::kFp8}},
      {"attn_kv_a_norm.weight", {"attn.kv_norm.weight", Store::kBf16}},
      {"attn_sinks.weight", {"attn.attn_sink", Store::kF32}},
      {"attn_output_a.weight", {"attn.wo_a.weight", Store::kFp8}},
      {"attn_output_b.weight", {"attn.wo_b.weight", Store::kFp8}},
      {"hc_attn_base.weight", {"hc_attn_base", Store::kF32}},
      {"hc_attn_fn.weight", {"hc_attn_fn", Store::kF32}},
      {"hc_attn_scale.weight", {"hc_attn_scale", Store::kF32}},
      {"hc_ffn_base.weight", {"hc_ffn_base", Store::kF32}},
      {"hc_ffn_fn.weight", {"hc_ffn_fn", Store::kF32}},
      {"hc_ffn_scale.weight", {"hc_ffn_scale", Store::kF32}},
      {"ffn_gate_inp.weight", {"ffn.gate.weight", Store::kBf16}},
      {"exp_probs_b.bias", {"ffn.gate.bias", Store::kF32}},
      {"ffn_gate_tid2eid.weight", {"ffn.gate.tid2eid", Store::kI64}},
      {"ffn_gate_shexp.weight", {"ffn.shared_experts.w1.weight", Store::kFp8}},
      {"ffn_down_shexp.weight", {"ffn.shared_experts.w2.weight", Store::kFp8}},
      {"ffn_up_shexp.weight", {"ffn.shared_experts.w3.weight", Store::kFp8}},
      {"attn_compressor_kv.weight", {"attn.compressor.wkv.weight", Store::kBf16}},
      {"attn_compressor_gate.weight", {"attn.compressor.wgate.weight", Store::kBf16}},
      {"attn_compressor_norm.weight", {"attn.compressor.norm.weight", Store::kBf16}},
      {"attn_compressor_ape.weight", {"attn.compressor.ape", Store::kF32}},
      {"indexer.attn_q_b.weight", {"attn.indexer.wq_b.weight", Store::kFp8}},
      {"indexer.proj.weight", {"attn.indexer.weights_proj.weight", Store::kBf16}},
      {"indexer.attn_k.weight", {"attn.indexer.wk.weight", Store::kBf16}},
      {"indexer.k_norm.weight", {"attn.indexer.k_norm.weight", Store::kBf16}},
      {"indexer_compressor_kv.weight", {"attn.indexer.compressor.wkv.weight", Store::kBf16}},
      {"indexer_compressor_gate.weight", {"attn.indexer.compressor.wgate.weight", Store::kBf16}},
      {"indexer_compressor_norm.weight", {"attn.indexer.compressor.norm.weight", Store::kBf16}},
      {"indexer_compressor_ape.weight", {"attn.indexer.compressor.ape", Store::kF32}},
      {"engram_embd.weight", {"engram.embed.weight", Store::kFp8}},
      {"engram_wkv.weight", {"engram.wkv.weight", Store::kFp8}},
      {"engram_q.weight", {"engram.q_weight", Store::kBf16}},
      {"engram_k.weight", {"engram.k_weight", Store::kBf16}}};
  if (auto it = kTop.find(gguf); it != kTop.end()) {
    *hf = it->second.first;
    *store = it->second.second;
    return true;
  }
  const size_t dot = gguf.find('.', 4);
  if (gguf.rfind("blk.", 0) != 0 || dot == std::string::npos) return false;
  auto it = kLayer.find(gguf.substr(dot + 1));
  if (it == kLayer.end()) return false;
  *hf = "layers." + gguf.substr(4, dot - 4) + "." + it->second.first;
  *store = it->second.second;
  return true;
}

class HfDeepseek4Test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gale-hf-ds4-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes the checkpoint of `synth` (experts MXFP4) into dir_ with FP8 tiles of `tile`, and
  // returns the same model with every tensor holding the checkpoint's values (f32 where the
  // checkpoint rounds: FP8 and BF16; the experts' bytes as they are).
  std::unique_ptr<GgufFile> Export(const SynthShape& s, const GgufFile& synth, int64_t tile, bool nested) {
    std::vector<SafetensorsFile::Entry> entries;
    GgufWriter want;
    for (const auto& [key, value] : synth.metadata()) want.SetValue(key, value);
    for (const GgufTensorInfo& t : synth.tensors()) {
      const std::vector<int64_t> hf_shape(t.shape.rbegin(), t.shape.rend());
      const std::string name = t.name;
      const size_t exps = name.find("_exps.weight");
      if (exps != std::string::npos) {  // MXFP4 experts -> per-expert FP4 + scales
        EXPECT_EQ(t.type_id, static_cast<uint32_t>(GgmlType::kMXFP4));
        const std::string layer = name.substr(4, name.find('.', 4) - 4);
        const std::string proj = name.find("ffn_gate_exps") != std::string::npos ? "w1"
                                 : name.find("ffn_down_exps") != std::string::npos ? "w2" : "w3";
        const int64_t in = t.shape[0], out = t.shape[1];
        const auto* b = reinterpret_cast<const BlockMXFP4*>(t.data);
        for (int64_t e = 0; e < t.shape[2]; ++e) {
          std::vector<uint8_t> packed(out * in / 2), scales(out * in / 32);
          for (int64_t r = 0; r < out; ++r) {
            for (int64_t k = 0; k < in / 32; ++k, ++b) {
              scales[r * (in / 32) + k] = b->e;
              for (int j = 0; j < 32; ++j) {
                const int code = j < 16 ? b->qs[j] & 15 : b->qs[j - 16] >> 4;
                packed[r * (in / 2) + 16 * k + j / 2] |= static_cast<uint8_t>(code << (4 * (j % 2)));
              }
            }
          }
          const std::string base = "layers." + layer + ".ffn.experts." + std::to_string(e) + "." + proj;
          entries.push_back({base + ".weight", "I8", {out, in / 2}, std::move(packed)});
          entries.push_back({base + ".scale", "F8_E8M0", {out, in / 32}, std::move(scales)});
        }
        EXPECT_TRUE(want.AddTensor(name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
        continue;
      }
      std::string hf;
      Store store;
      if (!HfNameOf(name, &hf, &store)) {
        ADD_FAILURE() << "no checkpoint name for " << name;
        continue;
      }
      if (store == Store::kI64) {
        std::vector<uint8_t> ids(t.NumElements() * 8);
        for (int64_t i = 0; i < t.NumElements(); ++i) {
          int32_t v;
          std::memcpy(&v, t.data + 4 * i, 4);
          const int64_t w = v;
          std::memcpy(ids.data() + 8 * i, &w, 8);
        }
        entries.push_back({hf, "I64", hf_shape, std::move(ids)});
        EXPECT_TRUE(want.AddTensor(name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
        continue;
      }
      std::vector<float> v = test::TensorValues(t);
      if (store == Store::kF32) {
        entries.push_back({hf, "F32", hf_shape, test::FloatBytes(v)});
      } else if (store == Store::kBf16) {
        std::vector<uint8_t> b(v.size() * 2);
        for (size_t i = 0; i < v.size(); ++i) {
          const uint16_t h = Fp32ToBf16(v[i]);
          std::memcpy(b.data() + 2 * i, &h, 2);
          v[i] = Bf16ToFp32(h);
        }
        entries.push_back({hf, "BF16", hf_shape, std::move(b)});
      } else {  // FP8 with a scale per tile x tile: the smallest power of two that fits the tile in 448
        const int64_t rows = hf_shape[0], cols = hf_shape[1];
        const int64_t sr = (rows + tile - 1) / tile, sc = (cols + tile - 1) / tile;
        // Tiles of different magnitudes (1, 1/2, 1/4 by position), so each has its own scale.
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = std::ldexp(v[r * cols + c], -static_cast<int>((r / tile + c / tile) % 3));
        }
        std::vector<uint8_t> codes(rows * cols), scales(sr * sc);
        for (int64_t i = 0; i < sr; ++i) {
          for (int64_t j = 0; j < sc; ++j) {
            float amax = 0.0f;
            for (int64_t r = i * tile; r < std::min(rows, (i + 1) * tile); ++r) {
              for (int64_t c = j * tile; c < std::min(cols, (j + 1) * tile); ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
            }
            int e = 127;
            while (e > 1 && amax <= 448.0f * E8M0ToFp32(static_cast<uint8_t>(e - 1))) --e;
            while (amax > 448.0f * E8M0ToFp32(static_cast<uint8_t>(e))) ++e;
            scales[i * sc + j] = static_cast<uint8_t>(e);
            const float scale = E8M0ToFp32(static_cast<uint8_t>(e));
            for (int64_t r = i * tile; r < std::min(rows, (i + 1) * tile); ++r) {
              for (int64_t c = j * tile; c < std::min(cols, (j + 1) * tile); ++c) {
                codes[r * cols + c] = Fp32ToE4M3(v[r * cols + c] / scale);
                v[r * cols + c] = E4M3ToFp32(codes[r * cols + c]) * scale;
              }
            }
          }
        }
        entries.push_back({hf, "F8_E4M3", hf_shape, std::move(codes)});
        entries.push_back({hf.substr(0, hf.size() - 7) + ".scale", "F8_E8M0", {sr, sc}, std::move(scales)});
      }
      EXPECT_TRUE(want.AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), t.shape, test::FloatBytes(v)).ok());
    }
    // Two shards, as releases are split.
    const size_t half = entries.size() / 2;
    std::vector<SafetensorsFile::Entry> a(entries.begin(), entries.begin() + half), b(entries.begin() + half, entries.end());
    WriteBytesTo(dir_ / "model-00001-of-00002.safetensors", SafetensorsFile::Write(a));
    WriteBytesTo(dir_ / "model-00002-of-00002.safetensors", SafetensorsFile::Write(b));

    Json cfg = {{"hidden_size", s.dim},
                {"num_hidden_layers", s.num_layers},
                {"num_attention_heads", s.num_heads},
                {"num_key_value_heads", 1},
                {"head_dim", s.head_dim},
                {"qk_rope_head_dim", s.rope_dim},
                {"q_lora_rank", s.q_lora_rank},
                {"o_lora_rank", s.out_lora_rank},
                {"o_groups", s.out_groups},
                {"index_n_heads", s.indexer_heads},
                {"index_head_dim", s.indexer_dim},
                {"index_topk", s.indexer_top_k},
                {"n_routed_experts", s.num_experts},
                {"num_experts_per_tok", s.experts_used},
                {"moe_intermediate_size", s.expert_ffn},
                {"n_shared_experts", s.shared_experts},
                {"num_hash_layers", s.hash_layers},
                {"hc_mult", s.hc_count},
                {"hc_sinkhorn_iters", 20},
                {"hc_eps", 1e-6},
                {"sliding_window", s.sliding_window},
                {"vocab_size", s.vocab_size},
                {"max_position_embeddings", s.context_length},
                {"rms_norm_eps", 1e-6},
                {"rope_theta", 10000.0},
                {"compress_rope_theta", 160000.0},
                {"routed_scaling_factor", 1.5},
                {"norm_topk_prob", true},
                {"scoring_func", "sqrtsoftplus"},
                {"swiglu_limit", s.swiglu_clamp},
                {"compress_ratios", s.compress_ratios},
                {"num_nextn_predict_layers", 1}};
    Json quant = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                  {"weight_block_size", {tile, tile}}, {"expert_dtype", "fp4"}};
    Json config;
    if (!s.engram_layers.empty()) {  // the engram_* block: buckets from engram_vocab_size up, as synth draws them
      cfg["engram_layer_ids"] = s.engram_layers;
      cfg["engram_max_ngram_size"] = s.engram_ngram;
      cfg["engram_n_heads"] = s.engram_heads;
      cfg["engram_head_dim"] = s.engram_dim;
      cfg["engram_vocab_size"] = s.engram_rows;
      cfg["engram_pad_token_id"] = 2;
      cfg["engram_compressed_vocab_size"] = 229;
      Json rows = Json::array();
      for (int64_t l : s.engram_layers) rows.push_back(synth.FindTensor("blk." + std::to_string(l) + ".engram_embd.weight")->shape[1]);
      cfg["engram_num_embeddings"] = rows;
    }
    if (s.candidate_layer >= 0) {
      cfg["candidate_source_layer_id"] = s.candidate_layer;
      cfg["candidate_topk_blocks"] = s.candidate_blocks;
      cfg["candidate_block_size"] = s.candidate_block_size;
    }
    if (nested) {
      cfg["model_type"] = "deepseek_v41";
      cfg["kv_source_layer_ids"] = s.kv_source_layers;
      cfg["index_source_layer_ids"] = s.index_source_layers;
      config = {{"architectures", {"DeepseekV41ForCausalLM"}}, {"text_config", cfg}, {"quantization_config", quant}};
    } else {
      config = cfg;
      config["architectures"] = {"DeepseekV4ForCausalLM"};
      config["model_type"] = "deepseek_v4";
      config["quantization_config"] = quant;
    }
    test::WriteFile(dir_ / "config.json", config.dump(2));
    // A byte-level BPE tokenizer with DeepSeek's two specials.
    Json vocab = Json::object();
    for (int b = 0; b < 256; ++b) vocab[test::ByteLevelChar(b)] = b;
    Json tok = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array()}}},
                {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                {"decoder", {{"type", "ByteLevel"}}},
                {"added_tokens",
                 {{{"id", 256}, {"content", "<｜begin▁of▁sentence｜>"}, {"special", true}},
                  {{"id", 257}, {"content", "<｜end▁of▁sentence｜>"}, {"special", true}}}}};
    test::WriteFile(dir_ / "tokenizer.json", tok.dump());
    test::WriteFile(dir_ / "tokenizer_config.json",
              Json{{"bos_token", "<｜begin▁of▁sentence｜>"}, {"eos_token", "<｜end▁of▁sentence｜>"}}.dump());
    return GgufFile::FromBytes(want.WriteToBytes()).value();
  }

  static void WriteBytesTo(const fs::path& p, const std::vector<uint8_t>& b) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }

  StatusOr<std::unique_ptr<GgufFile>> Convert(HfConvertReport* report = nullptr) {
    GgufWriter w;
    ASSIGN_OR_RETURN(HfConvertReport r, ConvertHf(dir_.string(), GgmlType::kF32, &w));
    if (report != nullptr) *report = r;
    return GgufFile::FromBytes(w.WriteToBytes());
  }

  // Tensor by tensor: the converted file holds exactly `want`'s values, the FP8 ones as F8E4M3 and
  // the experts as MXFP4 with the same bytes; the two models' logits agree.
  void ExpectSameModel(const GgufFile& got, const GgufFile& want, int64_t fp8_expected) {
    int64_t fp8 = 0;
    for (const GgufTensorInfo& w : want.tensors()) {
      const GgufTensorInfo* g = got.FindTensor(w.name);
      ASSERT_NE(g, nullptr) << w.name;
      ASSERT_EQ(g->shape, w.shape) << w.name;
      if (g->type_id == static_cast<uint32_t>(GgmlType::kF8E4M3)) ++fp8;
      if (w.type_id != static_cast<uint32_t>(GgmlType::kF32)) {
        ASSERT_EQ(g->type_id, w.type_id) << w.name;
        ASSERT_EQ(0, std::memcmp(g->data, w.data, w.num_bytes)) << w.name;
        continue;
      }
      const std::vector<float> gv = test::TensorValues(*g), wv = test::TensorValues(w);
      for (size_t i = 0; i < wv.size(); ++i) ASSERT_EQ(gv[i], wv[i]) << w.name << " at " << i;
    }
    EXPECT_EQ(got.tensors().size(), want.tensors().size());
    EXPECT_EQ(fp8, fp8_expected);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 160; ++i) tokens.push_back(1 + (i * 37 + 5) % 255);
    const std::vector<float> a = test::PrefillLogits(got, tokens), b = test::PrefillLogits(want, tokens);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    float worst = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    EXPECT_LT(worst, 1e-5f);
  }

  fs::path dir_;
};

SynthShape Ds4Shape(const std::string& arch) {
  SynthShape s = test::ArchTestShape(arch);
  s.expert_type = GgmlType::kMXFP4;
  return s;
}

TEST_F(HfDeepseek4Test, V4CheckpointConvertsExactly) {
  SynthShape s = Ds4Shape("deepseek4");
  s.compress_ratios = {0, 4, 128};
  auto synth = GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 11)->WriteToBytes()).value();
  auto want = Export(s, *synth, 128, /*nested=*/false);
  HfConvertReport report;
  auto got = Convert(&report);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(report.skipped.empty()) << report.skipped.front();
  EXPECT_EQ((*got)->GetString("general.architecture").value(), "deepseek4");
  EXPECT_EQ((*got)->FindTensor("blk.0.ffn_gate_tid2eid.weight")->type_id, 26u);
  EXPECT_EQ((*got)->FindTensor("token_embd.weight")->type_id, static_cast<uint32_t>(GgmlType::kF32));
  // 7 FP8 matrices per layer (q_a, q_b, kv, output_a/b, three shared-expert ones), plus the
  // ratio-4 layer's indexer query.
  ExpectSameModel(**got, *want, 8 * s.num_layers + 1);
}

// V4.1 with Engram on layers 0 and 2 (n-grams to 3, 2 heads): the checkpoint has the tables and
// projections but not the hash constants, which the converter computes. The multipliers are
// NumPy's (np.random.default_rng(0 + 10007 * layer).integers(0, (2^63 - 1) // 229 // 2, 3) * 2 + 1,
// 229 the test tokenizer's compressed size: 26 capitals fold onto small letters and tab, CR, LF
// onto the space, so 128 - 29 ASCII keys, 128 raw high bytes, 2 specials), the buckets the primes
// synth drew from the same start, the token map EngramTokenMap's (checked on a real tokenizer
// against a Python reading in engram_constants_test).
TEST_F(HfDeepseek4Test, V41CheckpointWithEngramConvertsExactly) {
  SynthShape s = Ds4Shape("deepseek41");
  s.kv_source_layers = {1, 3};
  s.index_source_layers = {1, 3};
  s.candidate_layer = 3;  // the two-level index's keys (the last index source: no later ones to filter)
  s.candidate_blocks = 4;
  s.candidate_block_size = 2;
  ASSERT_EQ(s.engram_layers, (std::vector<int64_t>{0, 2}));
  ASSERT_EQ(s.engram_ngram, 3);
  auto synth = GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 12)->WriteToBytes()).value();
  auto exported = Export(s, *synth, 32, /*nested=*/true);
  int64_t compressed = 0;
  const Json tj = Json::parse(test::ReadFile((dir_ / "tokenizer.json").string()));
  auto mapped = EngramTokenMap(tj, true, s.vocab_size, &compressed);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  const std::vector<uint32_t> map = *mapped;
  ASSERT_EQ(compressed, 229);
  // The model with the reference's constants in place of synth's own.
  GgufWriter w;
  for (const auto& [key, value] : exported->metadata()) w.SetValue(key, value);
  std::vector<GgufValue> mult, tmap;
  for (uint64_t m : {25654736311740337ull, 10866127649103169ull, 1650279715827503ull, 33106018299269813ull,
                     16052819734834565ull, 9799889646211349ull}) {
    mult.push_back(GgufValue::U64(m));
  }
  for (uint32_t v : map) tmap.push_back(GgufValue::U32(v));
  w.SetValue("deepseek41.engram.multipliers", GgufValue::Array(GgufValueType::kUint64, std::move(mult)));
  w.SetValue("deepseek41.engram.token_map", GgufValue::Array(GgufValueType::kUint32, std::move(tmap)));
  w.SetU32("deepseek41.engram.pad_id", map[2]);
  for (const GgufTensorInfo& t : exported->tensors()) {
    ASSERT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
  }
  auto want = GgufFile::FromBytes(w.WriteToBytes()).value();
  HfConvertReport report;
  auto got = Convert(&report);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(report.skipped.empty()) << report.skipped.front();
  EXPECT_EQ((*got)->GetString("general.architecture").value(), "deepseek41");
  for (const char* key : {"engram.layer_ids", "engram.head_count", "engram.key_length", "engram.max_ngram_size",
                          "engram.pad_id", "engram.multipliers", "engram.primes", "engram.offsets", "engram.token_map",
                          "attention.indexer.candidate_source_layer", "attention.indexer.candidate_top_k_blocks",
                          "attention.indexer.candidate_block_size"}) {
    const std::string k = std::string("deepseek41.") + key;
    const GgufValue* a = (*got)->Find(k);
    const GgufValue* b = want->Find(k);
    ASSERT_NE(a, nullptr) << k;
    ASSERT_NE(b, nullptr) << k;
    EXPECT_EQ(a->array.size(), b->array.size()) << k;
    for (size_t i = 0; i < std::min(a->array.size(), b->array.size()); ++i) {
      ASSERT_EQ(*a->array[i].AsInt(), *b->array[i].AsInt()) << k << " " << i;
    }
    if (a->array.empty()) EXPECT_EQ(*a->AsInt(), *b->AsInt()) << k;
  }
  // 8 FP8 matrices per layer, the two index sources' queries, two tables and two projections.
  ExpectSameModel(**got, *want, 8 * s.num_layers + 2 + 4);
}

TEST_F(HfDeepseek4Test, EngramChecksAgainstTheConfig) {
  SynthShape s = Ds4Shape("deepseek41");
  s.kv_source_layers = {1, 3};
  s.index_source_layers = {1, 3};
  auto synth = GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 12)->WriteToBytes()).value();
  Export(s, *synth, 32, /*nested=*/true);
  auto error = [&]() {
    auto r = Convert();
    return r.ok() ? std::string("ok") : r.status().ToString();
  };
  const std::string config = test::ReadFile((dir_ / "config.json").string());
  ASSERT_EQ(error(), "ok");
  Json c = Json::parse(config);
  c["text_config"]["engram_compressed_vocab_size"] = 230;  // another tokenizer's
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("not the checkpoint's tokenizer"), std::string::npos) << error();
  c = Json::parse(config);
  c["text_config"]["engram_vocab_size"] = 44;  // a different prime layout (buckets from 47 on)
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("table rows"), std::string::npos) << error();
  c = Json::parse(config);
  c["text_config"].erase("engram_layer_ids");
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("no engram_layer_ids"), std::string::npos) << error();
  // Hostile values: a layer past the model, a huge bucket start, a wrongly typed field.
  c = Json::parse(config);
  c["text_config"]["engram_layer_ids"] = {0, 99};
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("Engram layer 99"), std::string::npos) << error();
  c = Json::parse(config);
  c["text_config"]["engram_vocab_size"] = {int64_t{1} << 62, 40};
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("engram_vocab_size"), std::string::npos) << error();
  c = Json::parse(config);
  c["text_config"]["norm_topk_prob"] = "yes";
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("unexpected type"), std::string::npos) << error();
}

TEST_F(HfDeepseek4Test, BadCheckpointsAreClearErrors) {
  SynthShape s = Ds4Shape("deepseek4");
  auto synth = GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 13)->WriteToBytes()).value();
  Export(s, *synth, 128, false);
  auto error = [&]() {
    auto r = Convert();
    return r.ok() ? std::string("ok") : r.status().ToString();
  };
  const std::string config = test::ReadFile((dir_ / "config.json").string());
  // Tiles that do not match the scale tensors.
  Json c = Json::parse(config);
  c["quantization_config"]["weight_block_size"] = {32, 32};
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("scale shape"), std::string::npos) << error();
  // A ratio list shorter than the layers.
  c = Json::parse(config);
  c["compress_ratios"] = {0};
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("compress_ratios"), std::string::npos) << error();
  // YaRN as DeepSeek's configs write it (with or without its type) becomes the GGUF keys; another
  // scaling is refused.
  for (const bool typed : {true, false}) {
    c = Json::parse(config);
    c["rope_scaling"] = {{"factor", 16}, {"original_max_position_embeddings", 65536}, {"beta_fast", 32}, {"beta_slow", 1}};
    if (typed) c["rope_scaling"]["type"] = "yarn";
    test::WriteFile(dir_ / "config.json", c.dump());
    auto yarn = Convert();
    ASSERT_TRUE(yarn.ok()) << yarn.status().ToString();
    EXPECT_EQ((*yarn)->GetString("deepseek4.rope.scaling.type").value(), "yarn");
    EXPECT_EQ((*yarn)->GetDouble("deepseek4.rope.scaling.factor").value(), 16.0);
    EXPECT_EQ((*yarn)->GetInt("deepseek4.rope.scaling.original_context_length").value(), 65536);
  }
  c["rope_scaling"]["type"] = "linear";
  test::WriteFile(dir_ / "config.json", c.dump());
  EXPECT_NE(error().find("rope_scaling 'linear'"), std::string::npos) << error();
  test::WriteFile(dir_ / "config.json", config);
  ASSERT_EQ(error(), "ok");
  // A missing expert and a missing scale: one shard rewritten without them.
  for (const char* drop : {"layers.1.ffn.experts.3.w2.weight", "layers.0.attn.wq_a.scale"}) {
    std::vector<SafetensorsFile::Entry> kept;
    fs::path shard;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().extension() != ".safetensors") continue;
      auto f = SafetensorsFile::Open(e.path().string()).value();
      if (f->Find(drop) == nullptr) continue;
      shard = e.path();
      for (const auto& t : f->tensors()) {
        if (t.name != drop) kept.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)});
      }
    }
    ASSERT_FALSE(shard.empty()) << drop;
    const std::string saved = test::ReadFile(shard.string());
    WriteBytesTo(shard, SafetensorsFile::Write(kept));
    const std::string e = error();
    EXPECT_NE(e.find(std::string(drop).substr(0, std::string(drop).rfind('.'))), std::string::npos) << e;
    test::WriteFile(shard, saved);
  }
}

}  // namespace
}  // namespace gale
