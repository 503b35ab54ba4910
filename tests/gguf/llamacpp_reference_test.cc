// gale against a real llama.cpp build (tests/data/llamacpp, written by tools/ggml_reference.cc from
// the prebuilt libraries of the npm package @node-llama-cpp/linux-x64; its README names the version):
// ggml's quantized blocks of every weight type gale reads, ggml's dequantization of them, files
// made by llama_model_quantize (llama-quantize's Q2_K ... IQ4_XS mixes) with llama.cpp's logits,
// and llama.cpp's logits on random-weight files of every architecture gale runs (f32 throughout).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "kernels/kernels.h"
#include "engine/engine.h"
#include "model/model.h"
#include "../test_util.h"
#include "model/synth.h"
#include "quant/quantize.h"

namespace gale {
namespace {

std::string DataDir() { return test::SourceDir() + "/tests/data/llamacpp"; }

std::vector<float> Floats(const GgufTensorInfo& t) {
  std::vector<float> v(t.num_bytes / 4);
  std::memcpy(v.data(), t.data, t.num_bytes);
  return v;
}

// gale's reference quantizers that claim llama.cpp's bytes (ggml's quantize_row_*_ref).
bool BitExactQuantizer(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS:
    case GgmlType::kMXFP4: return true;
    default: return false;
  }
}

double Rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0.0;
  for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(e / static_cast<double>(a.size()));
}

TEST(LlamaCppReferenceTest, DequantizesGgmlBlocksBitwiseAndQuantizesAsGgml) {
  auto f = GgufFile::Open(DataDir() + "/blocks.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  int types = 0;
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    if (!t.name.ends_with(".q")) continue;
    const std::string prefix = t.name.substr(0, t.name.size() - 2);
    SCOPED_TRACE(prefix);
    const auto traits = GetTypeTraits(t.type_id);
    ASSERT_TRUE(traits.has_value()) << "gale cannot read ggml type " << t.type_id;
    ++types;
    const GgmlType type = traits->type;
    const std::vector<float> src = Floats(*(*f)->FindTensor(prefix + ".src"));
    const std::vector<float> want = Floats(*(*f)->FindTensor(prefix + ".deq"));
    const int64_t n = t.shape[0], rows = t.shape[1];
    const int64_t row_bytes = RowBytes(type, n);
    ASSERT_EQ(static_cast<uint64_t>(row_bytes * rows), t.num_bytes);
    std::vector<float> got(src.size());
    for (int64_t r = 0; r < rows; ++r) DequantizeRowRef(type, t.data + r * row_bytes, got.data() + r * n, n);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "dequantized ggml blocks differ";

    if (!CanQuantize(type)) continue;
    // The IQ4 types as llama-quantize writes them (ggml_quantize_chunk; ggml's quantize_row_iq4_nl_ref
    // skips the scale search), the others as their quantize_row_*_ref.
    const bool iq4 = type == GgmlType::kIQ4_NL || type == GgmlType::kIQ4_XS;
    const GgufTensorInfo* ref = iq4 ? &t : (*f)->FindTensor(prefix + ".ref");
    std::vector<uint8_t> mine(t.num_bytes);
    for (int64_t r = 0; r < rows; ++r) QuantizeRowRef(type, src.data() + r * n, mine.data() + r * row_bytes, n);
    if (BitExactQuantizer(type)) {
      size_t first = 0;
      while (first < mine.size() && mine[first] == ref->data[first]) ++first;
      EXPECT_EQ(first, mine.size()) << "quantized bytes differ from ggml's from byte " << first << " (row "
                                    << static_cast<int64_t>(first) / row_bytes << ")";
      continue;
    }
    // The K-quants: gale rounds scales to nearest, ggml searches them; the error may be larger,
    // not much.
    std::vector<float> back(src.size());
    for (int64_t r = 0; r < rows; ++r) DequantizeRowRef(type, mine.data() + r * row_bytes, back.data() + r * n, n);
    const double e_gale = Rmse(back, src), e_ggml = Rmse(want, src);
    std::printf("%s: rmse gale %.5f, ggml %.5f\n", prefix.c_str(), e_gale, e_ggml);
    EXPECT_LT(e_gale, 1.6 * e_ggml);
  }
  EXPECT_EQ(types, 13);
}

std::vector<float> GaleLogits(const GgufFile& file, const std::vector<int32_t>& tokens,
                              ActivationObserver* observer = nullptr) {
  auto m = LoadModel(file);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {};
  (*m)->PackWeights(nullptr);  // as the engine runs it: the active ISA's packed layouts, if any
  const int64_t vocab = (*m)->hparams().vocab_size;
  KvCache kv((*m)->hparams(), static_cast<int64_t>(tokens.size()));
  Workspace ws;
  ThreadPool pool(2);
  std::vector<float> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    ForwardBatch b;
    b.tokens = {tokens[i]};
    b.positions = {static_cast<int32_t>(i)};
    b.observer = observer;
    EXPECT_TRUE((*m)->Forward(b, kv, ws, pool).ok());
    out.insert(out.end(), ws.logits.begin(), ws.logits.begin() + vocab);
  }
  return out;
}

// The largest |difference| of two [positions, vocab 512] logit arrays and at how many positions
// their greedy tokens agree.
std::pair<double, int> Agreement(const std::vector<float>& got, const std::vector<float>& want, size_t positions) {
  double max_diff = 0.0;
  for (size_t i = 0; i < got.size(); ++i) max_diff = std::max<double>(max_diff, std::fabs(got[i] - want[i]));
  const int64_t vocab = 512;
  int same_greedy = 0;
  for (size_t p = 0; p < positions; ++p) {
    auto argmax = [&](const std::vector<float>& v) {
      return std::max_element(v.begin() + p * vocab, v.begin() + (p + 1) * vocab) - (v.begin() + p * vocab);
    };
    same_greedy += argmax(got) == argmax(want);
  }
  return {max_diff, same_greedy};
}

class LlamaCppModelTest : public ::testing::TestWithParam<kernels::Isa> {
 protected:
  void SetUp() override {
    if (kernels::GetKernelTable(GetParam()) == nullptr) GTEST_SKIP() << "this CPU has no " << kernels::IsaName(GetParam());
    kernels::SetActiveIsa(GetParam());
  }
  void TearDown() override { kernels::SetActiveIsa(kernels::BestIsa()); }
};

// Each llama-quantize mix, run by gale, against llama.cpp on the same weights dequantized by ggml
// to an F32 file (so without llama.cpp's rounding of activations to int8): the scalar ISA, which
// multiplies f32 activations, agrees as closely as the F32 models do; the SIMD ISAs round
// activations to int8 per 32 as llama.cpp does for its quantized types (llama.cpp's own runs of
// the quantized files are as far from its F32 runs as gale's are, printed for comparison). A wrong
// scale, bit or type mapping moves the logits by the quantization's whole effect or more.
TEST_P(LlamaCppModelTest, QuantizedFilesGiveLlamaCppLogits) {
  auto ref = GgufFile::Open(DataDir() + "/logits.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const GgufValue* tv = (*ref)->Find("tokens");
  ASSERT_NE(tv, nullptr);
  std::vector<int32_t> tokens;
  for (const GgufValue& v : tv->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  const std::vector<float> f32 = Floats(*(*ref)->FindTensor("f32"));

  // The F32 model the mixes were made from (scripts/make-ggml-reference.sh): gale's synth, seed 7.
  SynthShape shape = test::SmallGqaShape(512);
  shape.context_length = 256;
  auto w = SynthesizeModel(shape, GgmlType::kF32, 7);
  ASSERT_TRUE(w.ok());
  auto f32_file = GgufFile::FromBytes(w->WriteToBytes());
  ASSERT_TRUE(f32_file.ok());
  const std::vector<float> gale_f32 = GaleLogits(**f32_file, tokens);
  ASSERT_EQ(gale_f32.size(), f32.size());
  const double base = Rmse(gale_f32, f32);
  std::printf("f32: rmse against llama.cpp %.5f (logits rms %.3f)\n", base, Rmse(f32, std::vector<float>(f32.size())));
  EXPECT_LT(base, 2e-3);

  int files = 0;
  for (const GgufTensorInfo& t : (*ref)->tensors()) {
    // The quantized mixes are the tensors with a ".deq" partner.
    if (t.name == "f32" || t.name.ends_with(".deq") || (*ref)->FindTensor(t.name + ".deq") == nullptr) continue;
    SCOPED_TRACE(t.name);
    ++files;
    auto model = GgufFile::Open(DataDir() + "/" + t.name + ".gguf");
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    const std::vector<float> llama_q = Floats(t);
    const std::vector<float> llama_deq = Floats(*(*ref)->FindTensor(t.name + ".deq"));
    const std::vector<float> got = GaleLogits(**model, tokens);
    ASSERT_EQ(got.size(), llama_deq.size());
    const double diff = Rmse(got, llama_deq), quant = Rmse(llama_deq, f32);
    std::printf("%s (%s): rmse against llama.cpp on its weights %.5f; llama.cpp's int8 run %.5f from them, "
                "gale's %.5f from it; the weights' effect %.5f\n", t.name.c_str(), kernels::IsaName(GetParam()),
                diff, Rmse(llama_q, llama_deq), Rmse(got, llama_q), quant);
    // The scalar ISA multiplies the K-quants as f32, the IQ4 types (as the 32-element legacy types)
    // with int8 activations: its reference for the SIMD packed layouts.
    const bool f32_activations = GetParam() == kernels::Isa::kScalar && !t.name.starts_with("iq4");
    EXPECT_LT(diff, f32_activations ? 2e-3 : 0.03);
  }
  EXPECT_EQ(files, 7);
}

// Llama 3.1's frequency scaling, stored as llama.cpp's converter stores it (rope_freqs.weight:
// a divisor per frequency): gale gives llama.cpp's logits on the same file (both f32 throughout,
// as ArchitecturesGiveLlamaCppLogits). The same weights with the tensor left out are far from them: a loader
// that ignored it (as gale did before) fails here.
TEST_P(LlamaCppModelTest, Llama3RopeFreqsGiveLlamaCppLogits) {
  auto ref = GgufFile::Open(DataDir() + "/logits.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::vector<int32_t> tokens;
  for (const GgufValue& v : (*ref)->Find("tokens")->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  const GgufTensorInfo* t = (*ref)->FindTensor("rope_freqs");
  ASSERT_NE(t, nullptr) << "logits.gguf predates the rope_freqs model: run scripts/make-ggml-reference.sh";
  const std::vector<float> want = Floats(*t);

  // scripts/make-ggml-reference.sh: the F32 model's shape and seed, --rope-freqs-ctx 64.
  SynthShape shape = test::SmallGqaShape(512);
  shape.context_length = 256;
  shape.rope_freqs_ctx = 64;
  auto with = GgufFile::FromBytes(SynthesizeModel(shape, GgmlType::kF32, 7)->WriteToBytes()).value();
  ASSERT_NE(with->FindTensor("rope_freqs.weight"), nullptr);
  const double got = Rmse(GaleLogits(*with, tokens), want);
  shape.rope_freqs_ctx = 0;
  auto without = GgufFile::FromBytes(SynthesizeModel(shape, GgmlType::kF32, 7)->WriteToBytes()).value();
  const double ignored = Rmse(GaleLogits(*without, tokens), want);
  std::printf("rope_freqs (%s): rmse against llama.cpp %.2e; with the tensor ignored %.5f\n",
              kernels::IsaName(GetParam()), got, ignored);
  EXPECT_LT(got, 1e-5);
  EXPECT_GT(ignored, 0.05);
}

// The architectures in several shapes, as scripts/make-ggml-reference.sh writes them (vocab 512,
// context 256, f32, seed 7): grouped-query attention, odd head counts, head sizes other than
// dim / heads.
struct ArchShape {
  const char* name;
  const char* arch;
  int64_t dim, num_layers, num_heads, num_kv_heads, head_dim, ffn_dim;
  int64_t rope_ctx = 0;  // SynthShape::rope_freqs_ctx
  double yarn = 0.0;     // SynthShape::yarn_factor, from an original context of 64
};
constexpr ArchShape kArchShapes[] = {
    {"llama_head48", "llama", 256, 2, 8, 2, 48, 512},
    {"llama_yarn", "llama", 256, 2, 4, 2, 0, 512, 0, 4.0},
    {"qwen2_gqa", "qwen2", 256, 2, 4, 2, 0, 512},
    {"qwen2_odd", "qwen2", 192, 2, 3, 1, 64, 320},
    {"qwen2_yarn", "qwen2", 192, 2, 3, 1, 64, 320, 0, 4.0},
    {"qwen3_gqa", "qwen3", 256, 2, 4, 2, 128, 512},
    {"qwen3_odd", "qwen3", 160, 3, 5, 5, 48, 384},
    {"phi3", "phi3", 256, 2, 4, 4, 0, 512},
    {"phi3_longrope", "phi3", 192, 2, 3, 1, 64, 320, 64},
    {"gemma3", "gemma3", 128, 7, 4, 1, 64, 256},
    {"gemma3_odd", "gemma3", 96, 7, 3, 3, 48, 160},
    {"gemma2", "gemma2", 128, 4, 4, 2, 64, 256},
    {"gemma2_odd", "gemma2", 96, 3, 3, 1, 48, 160},
};

SynthShape ShapeOf(const ArchShape& a) {
  SynthShape s;
  s.arch = a.arch;
  s.dim = a.dim;
  s.num_layers = a.num_layers;
  s.num_heads = a.num_heads;
  s.num_kv_heads = a.num_kv_heads;
  s.head_dim = a.head_dim;
  s.ffn_dim = a.ffn_dim;
  s.vocab_size = 512;
  s.context_length = 256;
  s.rope_freqs_ctx = a.rope_ctx;
  s.yarn_factor = a.yarn;
  s.yarn_orig_ctx = a.yarn > 0 ? 64 : 0;
  // gemma3: windows of 5 over 16 tokens (layers 0-4 and 6 windowed, 5 global); the other
  // architectures none (a llama file's window, Mistral's, is one llama.cpp ignores).
  s.sliding_window = std::string(a.arch).rfind("gemma", 0) == 0 ? 5 : 0;
  s.attn_softcap = 1.5f;  // gemma2: caps that bind (scores and logits reach past them)
  s.final_softcap = 3.0f;
  return s;
}

// The same file presented as a llama: general.architecture and the key prefix changed, tensors
// as they are (the mutation check: what the architecture adds must matter to the logits).
std::vector<uint8_t> AsLlama(const GgufFile& f, const std::string& arch) {
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) {
    if (key == "general.architecture") {
      w.SetString(key, "llama");
    } else if (key.starts_with(arch + ".")) {
      w.SetValue("llama." + key.substr(arch.size() + 1), value);
    } else {
      w.SetValue(key, value);
    }
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_TRUE(w.AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)).ok());
  }
  return w.WriteToBytes();
}

// Each architecture against llama.cpp on the same file, both in f32 throughout (llama.cpp with an
// f32 KV cache and without flash attention, which casts K and V to f16): every logit within 2e-5
// (logits are up to ~5, where an f32 ulp is 4.8e-7; the engines sum up to 512 products per
// output in different orders through 2-3 layers, a few ulps each: measured 1.7e-6 to 4.8e-6,
// rms 4e-7 to 1.2e-6, while one f16 rounding anywhere on the way gives ~3e-4 rms), the same
// greedy token at every position, and far from it (> 50x) when the architecture's own parts
// (NEOX RoPE, biases, per-head norms) are dropped by loading the file as a llama.
TEST_P(LlamaCppModelTest, ArchitecturesGiveLlamaCppLogits) {
  auto ref = GgufFile::Open(DataDir() + "/logits.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::vector<int32_t> tokens;
  for (const GgufValue& v : (*ref)->Find("tokens")->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  for (const ArchShape& a : kArchShapes) {
    SCOPED_TRACE(a.name);
    const GgufTensorInfo* t = (*ref)->FindTensor(a.name);
    ASSERT_NE(t, nullptr) << "logits.gguf predates this shape: run scripts/make-ggml-reference.sh";
    const std::vector<float> want = Floats(*t);
    auto w = SynthesizeModel(ShapeOf(a), GgmlType::kF32, 7);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto file = GgufFile::FromBytes(w->WriteToBytes()).value();
    const std::vector<float> got = GaleLogits(*file, tokens);
    ASSERT_EQ(got.size(), want.size());
    const auto [max_diff, same_greedy] = Agreement(got, want, tokens.size());
    // The mutation: qwen as a llama; phi3's LongRoPE without its factors, a YaRN file without
    // its scaling, gemma3 with windows too wide to bind, gemma2 also with caps too high to bind
    // (the fused matrices' split is checked by the logits themselves: a wrong one is far).
    double mutated = 0.0, uncapped = 0.0;
    const bool gemma = std::string(a.arch) == "gemma3" || std::string(a.arch) == "gemma2";
    if (std::string(a.arch) == "gemma2") {
      SynthShape wide = ShapeOf(a);
      wide.attn_softcap = wide.final_softcap = 1000.0f;
      auto f = GgufFile::FromBytes(SynthesizeModel(wide, GgmlType::kF32, 7)->WriteToBytes()).value();
      uncapped = Rmse(GaleLogits(*f, tokens), want);
      std::printf("%s: caps too high to bind: rmse %.3f\n", a.name, uncapped);
      EXPECT_GT(uncapped, 0.05);
    }
    const bool mutate =
        std::string(a.arch) == "qwen2" || std::string(a.arch) == "qwen3" || a.rope_ctx > 0 || a.yarn > 0 || gemma;
    if (a.rope_ctx > 0 || a.yarn > 0 || gemma) {  // the scaling dropped; gemma's windows wider than the text
      SynthShape plain = ShapeOf(a);
      plain.rope_freqs_ctx = 0;
      plain.yarn_factor = 0.0;
      if (gemma) plain.sliding_window = 1000;
      auto without = GgufFile::FromBytes(SynthesizeModel(plain, GgmlType::kF32, 7)->WriteToBytes()).value();
      mutated = Rmse(GaleLogits(*without, tokens), want);
    } else if (mutate) {
      auto as_llama = GgufFile::FromBytes(AsLlama(*file, a.arch)).value();
      mutated = Rmse(GaleLogits(*as_llama, tokens), want);
    }
    std::printf("%s (%s): max |diff| against llama.cpp %.2e, rmse %.2e, greedy %d/%zu; mutated: rmse %.3f\n",
                a.name, kernels::IsaName(GetParam()), max_diff, Rmse(got, want), same_greedy, tokens.size(), mutated);
    // Gemma's GeGLU: llama.cpp's CPU GELU reads a table of f16 results at f16 inputs (relative
    // error up to ~1e-3 per activation), gale computes it in f32: measured max |diff| 1.9e-3 and
    // 2.5e-3, rms 4.2e-4 and 5.1e-4 (logits rms ~1.5); with llama.cpp's f16 rounding emulated in
    // gale's GELU, rms 1.1e-4 and 1.6e-4 (the rest is not yet explained, see docs/model-layer.md).
    EXPECT_LT(max_diff, gemma ? 5e-3 : 2e-5);
    if (gemma) {
      EXPECT_LT(Rmse(got, want), 1e-3);
    }
    EXPECT_EQ(same_greedy, static_cast<int>(tokens.size()));
    if (mutate) {
      EXPECT_GT(mutated, 50 * Rmse(got, want) + 0.05);
    }
  }
}

// Mixtures of experts as scripts/make-ggml-reference.sh writes them (vocab 512, context 256, f32,
// seed 7, f32 routers).
struct MoeShape {
  const char* name;
  const char* arch;
  int64_t dim, num_layers, num_heads, num_kv_heads, head_dim, ffn_dim, experts, used, expert_ffn;
  // glm4moe: rotated dims, dense leading layers, shared experts; one multi-token-prediction layer
  int64_t rope = 0, dense = 0, shared = 0;
  // gpt-oss: windows of 5 on the even layers, YaRN by this factor from an original context of 64
  double yarn = 0.0;
};
constexpr MoeShape kMoeShapes[] = {
    {"qwen3moe", "qwen3moe", 256, 2, 4, 2, 64, 512, 8, 2, 128},
    {"qwen3moe_odd", "qwen3moe", 192, 3, 3, 1, 64, 384, 6, 3, 96},
    {"mixtral", "llama", 256, 2, 4, 2, 0, 128, 4, 2, 0},
    {"glm4moe", "glm4moe", 256, 4, 4, 2, 64, 512, 8, 2, 64, 32, 1, 1},
    {"glm4moe_odd", "glm4moe", 192, 4, 3, 1, 64, 384, 6, 3, 96, 16, 0, 2},
    {"gpt_oss", "gpt-oss", 256, 3, 8, 2, 64, 512, 8, 2, 128},
    {"gpt_oss_yarn", "gpt-oss", 192, 4, 3, 1, 64, 384, 6, 3, 96, 0, 0, 0, 4.0},
    {"gpt_oss_1l", "gpt-oss", 256, 1, 8, 2, 64, 512, 8, 2, 128},  // the MXFP4 test's f32 original
};

// Records the smallest gap between a token's last chosen expert's selection score and the best
// score left out, over every token and layer: the routing's margin. With expert groups (groups
// used of groups), also the gap between the last group kept and the best left out (a group's
// score: its two best experts' sum), and the experts' gap counts only the kept groups' experts.
class RoutingMargin : public ActivationObserver {
 public:
  RoutingMargin(int64_t groups = 0, int64_t groups_used = 0) : groups_(groups), groups_used_(groups_used) {}
  void Observe(int64_t, LinearInput, const float*, int64_t, int64_t) override {}
  void ObserveRouting(int64_t, const float* scores, int64_t num_tokens, int64_t num_experts, const int32_t* chosen,
                      int64_t num_used) override {
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* s = scores + t * num_experts;
      const int32_t* c = chosen + t * num_used;
      std::vector<uint8_t> allowed(num_experts, 1);
      if (groups_ > 1) {
        const int64_t per = num_experts / groups_;
        std::vector<std::pair<float, int64_t>> g;
        for (int64_t i = 0; i < groups_; ++i) {
          std::vector<float> v(s + i * per, s + (i + 1) * per);
          std::sort(v.rbegin(), v.rend());
          g.push_back({v[0] + (per > 1 ? v[1] : 0.0f), i});
        }
        std::sort(g.rbegin(), g.rend());
        min_gap = std::min<double>(min_gap, g[groups_used_ - 1].first - g[groups_used_].first);
        for (int64_t i = groups_used_; i < groups_; ++i) {
          for (int64_t e = g[i].second * per; e < (g[i].second + 1) * per; ++e) allowed[e] = 0;
        }
      }
      float worst_in = s[c[0]], best_out = -1e30f;
      for (int64_t e = 0; e < num_experts; ++e) {
        bool in = false;
        for (int64_t j = 0; j < num_used; ++j) in = in || c[j] == e;
        if (in) worst_in = std::min(worst_in, s[e]);
        else if (allowed[e]) best_out = std::max(best_out, s[e]);
      }
      if (best_out > -1e30f) min_gap = std::min<double>(min_gap, worst_in - best_out);
      ++routed;
    }
  }
  double min_gap = 1e30;
  int64_t routed = 0;

 private:
  int64_t groups_, groups_used_;
};

// gale on the synth file of shape s against llama.cpp's logits `want` (as the tests below say):
// within 2e-5, the same greedy tokens, every routing choice (and group, where s has groups) won
// by at least 1e-4 over routed_layers layers per token, and one expert fewer per token far.
void ExpectMixtureMatches(const char* name, const SynthShape& s, const std::vector<int32_t>& tokens,
                          const std::vector<float>& want, int64_t routed_layers) {
  auto file = GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 7)->WriteToBytes()).value();
  RoutingMargin margin(s.expert_groups, s.groups_used);
  const std::vector<float> got = GaleLogits(*file, tokens, &margin);
  ASSERT_EQ(got.size(), want.size());
  const auto [max_diff, same_greedy] = Agreement(got, want, tokens.size());
  SynthShape fewer = s;
  fewer.experts_used = s.experts_used - 1;
  auto fewer_file = GgufFile::FromBytes(SynthesizeModel(fewer, GgmlType::kF32, 7)->WriteToBytes()).value();
  const double mutated = Rmse(GaleLogits(*fewer_file, tokens), want);
  std::printf("%s (%s): max |diff| against llama.cpp %.2e, rmse %.2e, greedy %d/%zu, routing margin %.2e over %lld "
              "choices; one expert fewer: rmse %.3f\n",
              name, kernels::IsaName(kernels::Active().isa), max_diff, Rmse(got, want), same_greedy, tokens.size(),
              margin.min_gap, static_cast<long long>(margin.routed), mutated);
  EXPECT_EQ(margin.routed, static_cast<int64_t>(tokens.size()) * routed_layers);
  EXPECT_GT(margin.min_gap, 1e-4);
  EXPECT_LT(max_diff, 2e-5);
  EXPECT_EQ(same_greedy, static_cast<int>(tokens.size()));
  EXPECT_GT(mutated, 50 * Rmse(got, want) + 0.05);
}

// Each mixture against llama.cpp on the same file, f32 throughout (f32 KV cache, no flash
// attention): every logit within 2e-5 as for the dense architectures, the same greedy token at
// every position. Routing ties are kept out by construction, not by tolerance: the observer
// checks that every choice of every token and layer won by a margin (selection score gap) of at
// least 1e-4, some 100x what the engines' different f32 summation orders move a router logit
// (the products have 256 terms of ~0.06: ulps of 1e-7), so the two engines route alike. The
// mutation: the same file with one expert fewer per token is far.
TEST_P(LlamaCppModelTest, MixturesOfExpertsGiveLlamaCppLogits) {
  auto ref = GgufFile::Open(DataDir() + "/logits.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::vector<int32_t> tokens;
  for (const GgufValue& v : (*ref)->Find("tokens")->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  for (const MoeShape& a : kMoeShapes) {
    SCOPED_TRACE(a.name);
    const GgufTensorInfo* t = (*ref)->FindTensor(a.name);
    ASSERT_NE(t, nullptr) << "logits.gguf predates this shape: run scripts/make-ggml-reference.sh";
    const std::vector<float> want = Floats(*t);
    SynthShape s;
    s.arch = a.arch;
    s.dim = a.dim;
    s.num_layers = a.num_layers;
    s.num_heads = a.num_heads;
    s.num_kv_heads = a.num_kv_heads;
    s.head_dim = a.head_dim;
    s.ffn_dim = a.ffn_dim;
    s.vocab_size = 512;
    s.context_length = 256;
    s.num_experts = a.experts;
    s.experts_used = a.used;
    s.expert_ffn = a.expert_ffn;
    const bool glm = std::string(a.arch) == "glm4moe";
    if (glm) {
      s.rope_dim = a.rope;
      s.leading_dense = a.dense;
      s.shared_experts = a.shared;
      s.nextn_layers = 1;
    }
    if (std::string(a.arch) == "gpt-oss") {
      s.sliding_window = 5;
      s.yarn_factor = a.yarn;
      s.yarn_orig_ctx = a.yarn > 0 ? 64 : 0;
    }
    const int64_t run_layers = a.num_layers - (glm ? 1 : 0);
    ExpectMixtureMatches(a.name, s, tokens, want, run_layers - a.dense);
    if (std::string(a.arch) == "gpt-oss") {  // windows too wide to bind: far
      SynthShape wide = s;
      wide.sliding_window = 1000;
      auto f = GgufFile::FromBytes(SynthesizeModel(wide, GgmlType::kF32, 7)->WriteToBytes()).value();
      const double unwindowed = Rmse(GaleLogits(*f, tokens), want);
      std::printf("%s: windows that do not bind: rmse %.3f\n", a.name, unwindowed);
      EXPECT_GT(unwindowed, 0.05);
    }
  }
}

// MXFP4 experts (gpt-oss's published type): gpt_oss's shape with one layer through `gale quantize
// --type mxfp4` (MXFP4 experts, Q8_0 attention; embeddings, router and biases kept f32), in both
// engines on int8 activations (llama.cpp's q8_0, gale's own quantizer: rounding half away from
// zero against half to even, a different reciprocal), so the bound is the activations' rounding,
// not f32's. One layer because its router reads the f32 embeddings, identical in both: with three,
// the engines' int8 differences (~0.05 per logit) moved a later layer's router inputs enough to
// flip a choice at 2 of 16 positions (margins ~0.02), a tie of arithmetic, not of the format.
// Measured max |diff| 0.042, RMS 8.4e-3 (the f32 file: 0.137 RMS away). Bound: every logit within
// 0.1, the same greedy tokens; the f32 file's logits far (> 5x) from llama.cpp's MXFP4 ones.
TEST_P(LlamaCppModelTest, Mxfp4ExpertsGiveLlamaCppLogits) {
  auto ref = GgufFile::Open(DataDir() + "/logits.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::vector<int32_t> tokens;
  for (const GgufValue& v : (*ref)->Find("tokens")->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  const GgufTensorInfo* t = (*ref)->FindTensor("gpt_oss_mxfp4");
  ASSERT_NE(t, nullptr) << "logits.gguf predates this shape: run scripts/make-ggml-reference.sh";
  const std::vector<float> want = Floats(*t);
  SynthShape s;
  s.arch = "gpt-oss";
  s.dim = 256;
  s.num_layers = 1;
  s.num_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.ffn_dim = 512;
  s.num_experts = 8;
  s.experts_used = 2;
  s.expert_ffn = 128;
  s.sliding_window = 5;
  s.vocab_size = 512;
  s.context_length = 256;
  auto f32 = GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 7)->WriteToBytes()).value();
  QuantizeOptions o;
  o.scheme = QuantScheme::kMXFP4;
  GgufWriter w;
  ASSERT_TRUE(QuantizeModel(*f32, o, &w).ok());
  auto q = GgufFile::FromBytes(w.WriteToBytes()).value();
  EXPECT_EQ(q->FindTensor("blk.0.ffn_up_exps.weight")->type_id, static_cast<uint32_t>(GgmlType::kMXFP4));
  EXPECT_EQ(q->FindTensor("blk.0.attn_q.weight")->type_id, static_cast<uint32_t>(GgmlType::kQ8_0));
  EXPECT_EQ(q->FindTensor("blk.0.ffn_up_exps.bias")->type_id, static_cast<uint32_t>(GgmlType::kF32));
  EXPECT_EQ(q->FindTensor("blk.0.ffn_gate_inp.weight")->type_id, static_cast<uint32_t>(GgmlType::kF32));
  RoutingMargin margin;
  const std::vector<float> got = GaleLogits(*q, tokens, &margin);
  ASSERT_EQ(got.size(), want.size());
  const auto [max_diff, same_greedy] = Agreement(got, want, tokens.size());
  const double f32_rmse = Rmse(GaleLogits(*f32, tokens), want);
  std::printf("gpt_oss_mxfp4 (%s): max |diff| against llama.cpp %.2e, rmse %.2e, greedy %d/%zu, routing margin %.2e; "
              "the f32 file: rmse %.3f\n",
              kernels::IsaName(GetParam()), max_diff, Rmse(got, want), same_greedy, tokens.size(), margin.min_gap,
              f32_rmse);
  EXPECT_EQ(margin.routed, static_cast<int64_t>(tokens.size()));
  EXPECT_LT(max_diff, 0.1);
  EXPECT_EQ(same_greedy, static_cast<int>(tokens.size()));
  EXPECT_GT(f32_rmse, 5 * Rmse(got, want));
}

// Latent attention files as scripts/make-ggml-reference.sh writes them (deepseek2, MLA format,
// DeepSeek-V3's routing: sigmoid, selection bias, groups, a shared expert, a dense first layer).
struct MlaShape {
  const char* name;
  int64_t dim, num_layers, num_heads, kv_lora, q_lora, nope, rope, v_head, ffn, experts, used, expert_ffn, dense,
      shared, groups, groups_used;
  double yarn = 0.0;  // YaRN factor from an original context of 64, yarn_log_multiplier 0.1
};
constexpr MlaShape kMlaShapes[] = {
    {"deepseek2", 256, 3, 4, 128, 96, 32, 32, 48, 512, 8, 2, 64, 1, 1, 4, 2},
    {"deepseek2_lite", 128, 26, 2, 64, 0, 32, 16, 32, 256, 4, 2, 32, 1, 1, 0, 0},
    {"deepseek2_yarn", 256, 3, 4, 128, 96, 32, 32, 48, 512, 8, 2, 64, 1, 1, 4, 2, 4.0},
};

SynthShape ShapeOf(const MlaShape& a) {
  SynthShape s;
  s.arch = "deepseek2";
  s.dim = a.dim;
  s.num_layers = a.num_layers;
  s.num_heads = a.num_heads;
  s.num_kv_heads = 1;
  s.kv_lora_rank = a.kv_lora;
  s.q_lora_rank = a.q_lora;
  s.nope_dim = a.nope;
  s.rope_dim = a.rope;
  s.v_head_dim = a.v_head;
  s.ffn_dim = a.ffn;
  s.num_experts = a.experts;
  s.experts_used = a.used;
  s.expert_ffn = a.expert_ffn;
  s.leading_dense = a.dense;
  s.shared_experts = a.shared;
  s.expert_groups = a.groups;
  s.groups_used = a.groups_used;
  s.yarn_factor = a.yarn;
  s.yarn_orig_ctx = a.yarn > 0 ? 64 : 0;
  s.vocab_size = 512;
  s.context_length = 256;
  return s;
}

// Latent attention against llama.cpp (f32 cache, no flash attention), as the mixtures above: the
// absorbed form, one cache row per position (kv_lora_rank + rope) read as both K and V, with the
// routing margins checked; the cache's bytes per token are the latent rows', printed beside the
// same model's multi-head cache (K of nope + rope and V of v_head per head). The mutation: one
// expert fewer per token is far.
TEST_P(LlamaCppModelTest, LatentAttentionGivesLlamaCppLogits) {
  auto ref = GgufFile::Open(DataDir() + "/logits.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::vector<int32_t> tokens;
  for (const GgufValue& v : (*ref)->Find("tokens")->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  for (const MlaShape& a : kMlaShapes) {
    SCOPED_TRACE(a.name);
    const GgufTensorInfo* t = (*ref)->FindTensor(a.name);
    ASSERT_NE(t, nullptr) << "logits.gguf predates this shape: run scripts/make-ggml-reference.sh";
    const std::vector<float> want = Floats(*t);
    auto file = GgufFile::FromBytes(SynthesizeModel(ShapeOf(a), GgmlType::kF32, 7)->WriteToBytes()).value();
    {
      auto m = LoadModel(*file).value();
      KvCache kv(m->hparams(), 16);
      const double mha = static_cast<double>(a.num_heads) * (a.nope + a.rope + a.v_head) * 4.0 * a.num_layers;
      const double latent = static_cast<double>(kv.num_bytes()) / 16.0;
      std::printf("%s: f32 KV bytes per token %.0f (latent rows of %lld), %.0f as multi-head attention (1/%.1f)\n",
                  a.name, latent, static_cast<long long>(a.kv_lora + a.rope), mha, mha / latent);
      EXPECT_EQ(kv.num_bytes(), static_cast<uint64_t>(16 * a.num_layers * (a.kv_lora + a.rope) * 4));
    }
    ExpectMixtureMatches(a.name, ShapeOf(a), tokens, want, a.num_layers - a.dense);
  }
}

// The 16 tokens the reference runs read (logits.gguf's "tokens").
std::vector<int32_t> ReferenceTokens(const GgufFile& ref) {
  std::vector<int32_t> tokens;
  for (const GgufValue& v : ref.Find("tokens")->array) tokens.push_back(static_cast<int32_t>(*v.AsInt()));
  return tokens;
}

// v / |v|, as servers return embeddings.
std::vector<float> UnitVector(std::vector<float> v) {
  double n = 0.0;
  for (float x : v) n += static_cast<double>(x) * x;
  for (float& x : v) x = static_cast<float>(x / std::sqrt(n));
  return v;
}

// Embedding models (pooling_type mean, cls, last on a qwen3, as scripts/make-ggml-reference.sh
// writes them): the engine's embedding request gives llama.cpp's pooled embedding
// (llama_get_embeddings_seq over the same tokens, normalized as servers return it); with another
// pooling it is far (> 0.1). NOTE: the bound is not f32 rounding: llama.cpp's embedding context
// differs from its own logits context by ~3e-4 relative in the final hidden state (its batched
// and one-token-at-a-time embedding paths agree with each other to 1.2e-7), while gale's logits
// on the same file match llama.cpp's logits to rmse 4.5e-7, so gale's hidden states are its
// logits path's; measured 5.7e-5 to 8.5e-5 on unit vectors, bound 2e-4.
TEST_P(LlamaCppModelTest, EmbeddingsGiveLlamaCppPooledEmbeddings) {
  auto ref = GgufFile::Open(DataDir() + "/logits.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const std::vector<int32_t> tokens = ReferenceTokens(**ref);
  auto embed = [&](const GgufFile& file, Pooling pooling) {
    auto model = LoadModel(file).value();
    ThreadPool pool(2);
    EngineConfig cfg;
    cfg.kv_cache_memory_bytes = 8ull << 20;
    cfg.sched.prefill_chunk_size = 5;  // several chunks: the pooling spans them
    auto engine = Engine::Create(*model, nullptr, cfg, pool).value();
    GenerationRequest r;
    r.prompt = tokens;
    r.pooling = pooling;
    auto s = engine->Submit(r).value();
    StreamUpdate u, last;
    while (s->Next(&u)) last = u;
    return last.embedding;
  };
  const char* names[] = {"qwen3_embd_mean", "qwen3_embd_cls", "qwen3_embd_last"};
  const Pooling poolings[] = {Pooling::kMean, Pooling::kCls, Pooling::kLast};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(names[i]);
    const GgufTensorInfo* t = (*ref)->FindTensor(std::string(names[i]) + ".embd");
    ASSERT_NE(t, nullptr) << "logits.gguf predates the embedding models: run scripts/make-ggml-reference.sh";
    const std::vector<float> want = UnitVector(Floats(*t));
    SynthShape s = ShapeOf({names[i], "qwen3", 256, 2, 4, 2, 64, 512});  // the script's embedding shape
    s.pooling_type = static_cast<int64_t>(poolings[i]);
    auto file = GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 7)->WriteToBytes()).value();
    ASSERT_EQ(LoadModel(*file).value()->hparams().pooling, poolings[i]);
    const std::vector<float> got = embed(*file, poolings[i]);
    ASSERT_EQ(got.size(), want.size());
    if (const GgufTensorInfo* lt = (*ref)->FindTensor(names[i])) {
      std::printf("  logits of the same model against llama.cpp's: rmse %.2e\n", Rmse(GaleLogits(*file, tokens), Floats(*lt)));
    }
    double max_diff = 0.0;
    for (size_t d = 0; d < got.size(); ++d) max_diff = std::max<double>(max_diff, std::fabs(got[d] - want[d]));
    const std::vector<float> other = embed(*file, poolings[(i + 1) % 3]);
    double other_diff = 0.0;
    for (size_t d = 0; d < got.size(); ++d) other_diff = std::max<double>(other_diff, std::fabs(other[d] - want[d]));
    std::printf("%s (%s): max |diff| against llama.cpp %.2e; pooled another way %.3f\n", names[i],
                kernels::IsaName(GetParam()), max_diff, other_diff);
    if (const GgufTensorInfo* t1 = (*ref)->FindTensor(std::string(names[i]) + ".embd1")) {
      const std::vector<float> one = UnitVector(Floats(*t1));
      double d1 = 0.0, self = 0.0;
      for (size_t d = 0; d < got.size(); ++d) {
        d1 = std::max<double>(d1, std::fabs(got[d] - one[d]));
        self = std::max<double>(self, std::fabs(want[d] - one[d]));
      }
      std::printf("  against llama.cpp's one-token-at-a-time path %.2e; its two paths differ by %.2e\n", d1, self);
    }
    EXPECT_LT(max_diff, 2e-4);
    EXPECT_GT(other_diff, 0.1);
  }
}

// BERT encoders (as scripts/make-ggml-reference.sh writes them: learned positions, token type 0,
// LayerNorm with biases, post-norm layers, GELU, attention over the whole sequence): the engine's
// embedding request gives llama.cpp's pooled embedding of the same 16 tokens (normalized). The
// bound: llama.cpp's GELU reads its input rounded to f16 (a table), gale computes it in f32;
// measured 2.4e-5 and 8.7e-5 on unit vectors, bound 5e-4. Mutations: another pooling is far, and the CLS embedding
// moves when only the last three tokens change (attention is not causal).
TEST_P(LlamaCppModelTest, BertEncoderGivesLlamaCppPooledEmbeddings) {
  auto ref = GgufFile::Open(DataDir() + "/logits.gguf");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const std::vector<int32_t> tokens = ReferenceTokens(**ref);
  auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0.0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max<double>(d, std::fabs(a[i] - b[i]));
    return d;
  };
  struct BertShape {
    const char* name;
    int64_t dim, layers, heads, ffn;
    Pooling pooling;
  };
  for (const BertShape& b : {BertShape{"bert_mean", 256, 2, 4, 512, Pooling::kMean},
                             BertShape{"bert_cls_odd", 192, 3, 3, 320, Pooling::kCls}}) {
    SCOPED_TRACE(b.name);
    const GgufTensorInfo* t = (*ref)->FindTensor(std::string(b.name) + ".embd");
    ASSERT_NE(t, nullptr) << "logits.gguf predates the BERT models: run scripts/make-ggml-reference.sh";
    const std::vector<float> want = UnitVector(Floats(*t));
    SynthShape s = ShapeOf({b.name, "bert", b.dim, b.layers, b.heads, b.heads, 0, b.ffn});
    s.pooling_type = static_cast<int64_t>(b.pooling);
    auto file = GgufFile::FromBytes(SynthesizeModel(s, GgmlType::kF32, 7)->WriteToBytes()).value();
    auto model = LoadModel(*file).value();
    ASSERT_FALSE(model->hparams().causal);
    ASSERT_EQ(model->hparams().pooling, b.pooling);
    EXPECT_TRUE(model->load_warnings().empty());
    ThreadPool pool(2);
    EngineConfig cfg;
    cfg.kv_cache_memory_bytes = 8ull << 20;
    auto engine = Engine::Create(*model, nullptr, cfg, pool).value();
    auto embed = [&](const std::vector<int32_t>& prompt, Pooling pooling) {
      GenerationRequest r;
      r.prompt = prompt;
      r.pooling = pooling;
      auto stream = engine->Submit(r).value();
      StreamUpdate u, last;
      while (stream->Next(&u)) last = u;
      EXPECT_TRUE(last.status.ok()) << last.status.ToString();
      return last.embedding;
    };
    const std::vector<float> got = embed(tokens, b.pooling);
    ASSERT_EQ(got.size(), want.size());
    const double diff = max_diff(got, want);
    const double other = max_diff(embed(tokens, b.pooling == Pooling::kMean ? Pooling::kCls : Pooling::kMean), want);
    std::vector<int32_t> changed = tokens;
    for (size_t i = changed.size() - 3; i < changed.size(); ++i) changed[i] = changed[i] == 7 ? 8 : 7;
    const std::vector<float> first = embed(tokens, Pooling::kCls);
    const double cls_moves = max_diff(embed(changed, Pooling::kCls), first);
    std::printf("%s (%s): max |diff| against llama.cpp %.2e; pooled another way %.3f; CLS after changing the last "
                "three tokens %.3f\n", b.name, kernels::IsaName(GetParam()), diff, other, cls_moves);
    EXPECT_LT(diff, 5e-4);
    EXPECT_GT(other, 0.05);
    EXPECT_GT(cls_moves, 0.01);
    // Text requests and prompts past what one step computes are refused, clearly.
    GenerationRequest text;
    text.prompt = tokens;
    text.max_tokens = 2;
    auto refused = engine->Submit(text);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("encoder"), std::string::npos) << refused.status().ToString();
    GenerationRequest too_long;
    too_long.prompt.assign(300, 5);  // past the 256 positions
    too_long.pooling = b.pooling;
    auto long_refused = engine->Submit(too_long);
    ASSERT_FALSE(long_refused.ok());
    EXPECT_NE(long_refused.status().message().find("at most 256"), std::string::npos) << long_refused.status().ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, LlamaCppModelTest,
                         ::testing::Values(kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512),
                         [](const auto& info) { return std::string(kernels::IsaName(info.param)); });

}  // namespace
}  // namespace gale
