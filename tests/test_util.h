// Shared helpers for tests: paths to the source tree and ../shared, random data.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/rng.h"
#include "base/thread_pool.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tokenizer.h"

namespace gale::test {

// The reference data derived at set-up (scripts/derive-test-data.sh: llama.cpp's vocabularies
// and test vectors, real chat templates and Jinja2's renderings of them): $GALE_DATA_DIR when
// set, else the one CMake was configured with (.deps/shared).
inline std::string DataDir() {
  const char* env = std::getenv("GALE_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : GALE_DATA_DIR;
}
// The shared data folder beside the clone, for what only it holds (the stories260K llama2.c
// checkpoint, llama2.c's and llama.cpp's outputs for it): $GALE_SHARED_DIR when set, else the one
// CMake was configured with.
inline std::string SharedDir() {
  const char* env = std::getenv("GALE_SHARED_DIR");
  return env != nullptr && *env != '\0' ? env : GALE_SHARED_DIR;
}
// Skips the test, naming the file, when a reference file is missing (a clone without ../shared,
// or without scripts/install-deps.sh --test's derived data): a missing file is never a crash.
#define GALE_SKIP_UNLESS_FILE(path)                                                                  \
  do {                                                                                              \
    const std::string gale_path_ = (path);                                                          \
    if (!std::filesystem::exists(gale_path_)) GTEST_SKIP() << "reference file missing: " << gale_path_; \
  } while (0)
inline std::string SourceDir() { return GALE_SOURCE_DIR; }

// A path in the temporary folder that no other test process uses at the same time (ctest runs
// tests in parallel, each in its own process): the name with this process's id.
inline std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("gale-" + std::to_string(::getpid()) + "-" + name)).string();
}

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& f : v) f = rng.Uniform(lo, hi);
  return v;
}

// A test-sized model of an architecture ("llama", "qwen2", "qwen3", "phi3", "gemma3"): dim 128, 2
// layers, 4 query heads over 2 KV heads, vocab 2048 (the synth vocab), context 512; qwen3 with a
// head size of 48 (not dim / heads), as its real models have; phi3 with LongRoPE; gemma3 below.
inline SynthShape ArchTestShape(const std::string& arch) {
  SynthShape s = *NamedSynthShape("tiny");
  s.arch = arch;
  if (arch == "qwen3") s.head_dim = 48;
  if (arch == "qwen35" || arch == "qwen35moe") s.num_layers = 4;  // three Gated DeltaNet layers, then full attention
  if (arch == "qwen35moe") {  // eight experts of 64, two per token, and the gated shared one
    s.num_experts = 8;
    s.experts_used = 2;
    s.expert_ffn = 64;
  }
  if (arch == "qwen3moe") {  // eight experts of 64, two per token
    s.head_dim = 48;
    s.num_experts = 8;
    s.experts_used = 2;
    s.expert_ffn = 64;
  }
  if (arch == "deepseek2") {  // latent attention, a dense first layer, then DeepSeek-V3's routing
    s.num_layers = 3;
    s.kv_lora_rank = 64;
    s.q_lora_rank = 64;
    s.nope_dim = 32;
    s.rope_dim = 16;
    s.v_head_dim = 32;
    s.num_experts = 8;
    s.experts_used = 2;
    s.expert_ffn = 64;
    s.leading_dense = 1;
    s.shared_experts = 1;
    s.expert_groups = 4;
    s.groups_used = 2;
  }
  if (arch == "glm4moe") {  // a dense first layer, experts with a shared one, a never-run MTP layer
    s.num_layers = 4;
    s.head_dim = 64;
    s.rope_dim = 32;
    s.num_experts = 8;
    s.experts_used = 2;
    s.expert_ffn = 64;
    s.leading_dense = 1;
    s.shared_experts = 1;
    s.nextn_layers = 1;
  }
  if (arch == "gemma2") {  // four layers (windowed, global, ...), windows of 8, caps that bind
    s.num_layers = 4;
    s.head_dim = 64;
    s.sliding_window = 8;
    s.attn_softcap = 1.5f;
    s.final_softcap = 3.0f;
  }
  if (arch == "gpt-oss") {  // three layers (windowed, global, windowed), windows of 8, sinks, biases
    s.num_layers = 3;
    s.head_dim = 64;
    s.sliding_window = 8;
    s.num_experts = 8;
    s.experts_used = 2;
    s.expert_ffn = 64;
  }
  // deepseek4: a window layer, a ratio-4 layer with the indexer, a ratio-128 one. deepseek41: a
  // window layer, a ratio-2 source, a reader of its rows and picks, a ratio-1 source; Engram on
  // layers 0 and 2.
  if (arch == "deepseek4" || arch == "deepseek41") {
    s.num_layers = 3;
    s.num_kv_heads = 1;
    s.head_dim = 64;
    s.rope_dim = 32;
    s.q_lora_rank = 64;
    s.sliding_window = 8;
    s.compress_ratios = {0, 4, 128};
    s.hash_layers = 1;
    s.indexer_heads = 8;
    s.indexer_dim = 32;
    s.indexer_top_k = 3;
    s.out_groups = 2;
    s.out_lora_rank = 32;
    s.num_experts = 8;
    s.experts_used = 2;
    s.expert_ffn = 64;
    s.shared_experts = 1;
    s.swiglu_clamp = 10.0f;
  }
  if (arch == "deepseek41") {
    s.num_layers = 4;
    s.compress_ratios = {0, 2, 2, 1};
    s.engram_layers = {0, 2};
    s.engram_heads = 2;
    s.engram_dim = 32;
    s.engram_ngram = 3;
    s.engram_rows = 40;
  }
  if (arch == "llama-v16") {  // llama with V heads of 16 under K heads of 32
    s.arch = "llama";
    s.v_head_dim = 16;
  }
  if (arch == "mistral") {  // llama with a window of 8 on every layer (one windowed layer group)
    s.arch = "llama";
    s.sliding_window = 8;
  }
  if (arch == "mixtral") {  // llama with four experts of the FFN's width, two per token
    s.arch = "llama";
    s.num_experts = 4;
    s.experts_used = 2;
  }
  if (arch == "bert") s.num_kv_heads = s.num_heads;  // an encoder: multi-head attention, learned positions
  if (arch == "phi3") s.rope_freqs_ctx = 128;  // LongRoPE, the long factors (context 512)
  if (arch == "gemma3") {  // seven layers (the sixth global), windows of 8 that bind in every test
    s.num_layers = 7;
    s.head_dim = 64;
    s.sliding_window = 8;
  }
  return s;
}

// A small grouped-query llama shape for model tests: dim 256, 2 layers, 4 query heads over 2 KV
// heads, ffn 512.
inline SynthShape SmallGqaShape(int64_t vocab_size) {
  SynthShape shape;
  shape.dim = 256;
  shape.num_layers = 2;
  shape.num_heads = 4;
  shape.num_kv_heads = 2;
  shape.ffn_dim = 512;
  shape.vocab_size = vocab_size;
  return shape;
}

// A one-layer llama of dim 32 (2 query heads over 1 KV head, ffn 64): a draft model that shares
// only the vocabulary with its target.
inline SynthShape TinyDraftShape(int64_t vocab_size) {
  SynthShape shape;
  shape.dim = 32;
  shape.num_layers = 1;
  shape.num_heads = 2;
  shape.num_kv_heads = 1;
  shape.ffn_dim = 64;
  shape.vocab_size = vocab_size;
  return shape;
}

// Writes a file whole (tests that build folders: Hugging Face checkpoints, key files).
inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
inline void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  WriteFile(path, std::string(bytes.begin(), bytes.end()));
}

// GPT-2's byte-to-character map (byte-level BPE's alphabet): the character byte b is written as,
// in UTF-8.
inline std::string ByteLevelChar(int b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += !printable(c);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A tensor's values as floats, whatever its type (dequantized row by row).
inline std::vector<float> TensorValues(const GgufTensorInfo& t) {
  const GgmlType type = GetTypeTraits(t.type_id)->type;
  std::vector<float> v(t.NumElements());
  const int64_t cols = t.shape[0];
  for (int64_t r = 0; r < t.NumElements() / cols; ++r) {
    DequantizeRowRef(type, t.data + r * RowBytes(type, cols), v.data() + r * cols, cols);
  }
  return v;
}

// Floats as the bytes of an F32 tensor (a safetensors entry, a GGUF tensor).
inline std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A whole file's bytes ("" when it cannot be read; tests check what they expect in it).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Token ids written as numbers separated by white space (a line of llama.cpp's .out files).
inline std::vector<int32_t> ParseIds(const std::string& line) {
  std::istringstream in(line);
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// Texts in llama.cpp's .inp format: each followed by "\n__ggml_vocab_test__\n".
inline std::vector<std::string> SplitVocabTexts(const std::string& inp) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t at = 0; at < inp.size();) {
    size_t next = inp.find(sep, at);
    if (next == std::string::npos) next = inp.size();
    texts.push_back(inp.substr(at, next - at));
    at = next + sep.size();
  }
  return texts;
}

// A model file in memory, its model and tokenizer.
struct LoadedModel {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
};
// A random-weight model of a shape (ArchTestShape, or any other) in `type`.
inline LoadedModel SynthModel(const SynthShape& shape, GgmlType type, uint64_t seed = 11) {
  LoadedModel m;
  const auto bytes = SynthesizeModel(shape, type, seed)->WriteToBytes();
  m.file = GgufFile::FromBytes(bytes).value();
  m.model = LoadModel(*m.file).value();
  m.tok = Tokenizer::FromGguf(*m.file).value();
  return m;
}

// Every token's logits from one prefill of `tokens` through the file's model (packed for the
// active ISA), on a fixed cache; empty (with a test failure) when the file does not load.
inline std::vector<float> PrefillLogits(const GgufFile& file, const std::vector<int32_t>& tokens) {
  auto m = LoadModel(file);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  EXPECT_TRUE((*m)->load_warnings().empty());
  (*m)->PackWeights(nullptr);
  KvCache kv((*m)->hparams(), static_cast<int64_t>(tokens.size()));
  Workspace ws;
  ThreadPool pool(2);
  ForwardBatch b;
  b.tokens = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) b.positions.push_back(static_cast<int32_t>(i));
  b.all_logits = true;
  EXPECT_TRUE((*m)->Forward(b, kv, ws, pool).ok());
  return std::vector<float>(ws.logits.begin(), ws.logits.begin() + tokens.size() * (*m)->hparams().vocab_size);
}

}  // namespace gale::test
