// Writes gale's test references from a real llama.cpp build (libggml-base, libggml, libllama as
// shared libraries, e.g. the prebuilt ones in the npm package @node-llama-cpp/linux-x64; see
// scripts/make-ggml-reference.sh). Run by hand when the reference should change; its outputs are
// committed under tests/data/llamacpp and read by tests/gguf/llamacpp_reference_test.cc.
//
//   ggml_reference LIBDIR F32_MODEL OUTDIR TMPDIR [NAME=MODEL ...]
//   ggml_reference bench LIBDIR MODEL [PP [TG [REPS [THREADS [SEQS [KV]]]]]]
//   ggml_reference tokenize LIBDIR VOCAB INPUTS OUT
//   ggml_reference long LIBDIR OUT NTOKENS NAME=MODEL ...
//
// OUTDIR/blocks.gguf: for each ggml type, rows of test values ("<type>.src", f32), ggml's
//   quantization of them ("<type>.q": ggml_quantize_chunk, the quantizer llama-quantize runs without
//   an imatrix), its reference quantizer's ("<type>.ref": quantize_row_<type>_ref) and ggml's
//   dequantization of "<type>.q" ("<type>.deq", f32).
// OUTDIR/<ftype>.gguf: F32_MODEL quantized by llama_model_quantize (llama-quantize's mixes).
// OUTDIR/logits.gguf: llama.cpp's logits (CPU, default context: f16 KV cache) for the tokens in
//   metadata "tokens", fed one at a time; tensor "<ftype>" is [vocab, tokens], "f32" for F32_MODEL,
//   and "<ftype>.deq" for an F32 copy of <ftype>.gguf dequantized by ggml (the same weights without
//   llama.cpp's int8 rounding of activations); "<NAME>" for each further MODEL (other features and
//   architectures, e.g. Llama 3's rope_freqs, qwen3), run with an f32 KV cache (type_k, type_v
//   set to GGML_TYPE_F32) and without flash attention (which casts K and V to f16), so that the
//   only differences left are the order of f32 arithmetic.
//
// bench: llama.cpp's prompt and generation speed on MODEL, measured as llama-bench does (after a
// warm-up, pp = one decode of PP tokens from an empty cache, tg = TG one-token decodes from an
// empty cache), one JSON line per test with every repetition's tokens/s, for side-by-side figures
// with `gale bench` on the same file and machine (scripts/bench-vs-llamacpp.sh). KV "f32": an f32
// cache without flash attention (this release's deepseek4 graph only runs so; default f16).
//
// long: for architectures whose behaviour only shows past a few hundred tokens (DeepSeek-V4's
// windows and compressed rows), OUT (a GGUF) gets "tokens" (NTOKENS ids: LongTokens) and, per
// MODEL, tensor "<NAME>" [vocab, NTOKENS / 8]: llama.cpp's logits at positions 7, 15, 23, ... with
// the tokens fed one at a time (f32 cache, no flash attention), and "<NAME>.batch": the same rows
// with all tokens in one decode, llama.cpp's own prefill beside its decode.
//
// tokenize: llama.cpp's tokens for each text in INPUTS (texts separated by
// "\n__ggml_vocab_test__\n", as in llama.cpp's own .inp files), VOCAB loaded vocab-only; one line
// per text in OUT: the ids without special-token parsing, a tab, the ids with it (add_special off in
// both, as llama.cpp's test-tokenizer-0 runs).
//
// Only the C ABI is used (no llama.h): the few structs passed by value are opaque buffers filled by
// the library's own *_default_params(), and only the documented leading fields are written.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/file.h"
#include "base/rng.h"
#include "gguf/gguf_file.h"
#include "gguf/ggml_types.h"
#include "gguf/gguf_writer.h"

namespace {

struct alignas(16) Opaque {
  unsigned char bytes[1024];  // larger than any of the structs it stands for
};

void* Open(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    std::fprintf(stderr, "ggml_reference: %s\n", dlerror());
    std::exit(1);
  }
  return h;
}

template <typename F>
F Sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (p == nullptr) {
    std::fprintf(stderr, "ggml_reference: missing symbol %s\n", name);
    std::exit(1);
  }
  return reinterpret_cast<F>(p);
}

void Check(const gale::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "ggml_reference: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "ggml_reference: %s\n", why.c_str());
  std::exit(1);
}

std::vector<uint8_t> Bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// Rows that exercise scales, offsets and edge cases: gaussian, uniform, outliers, one-signed
// rows (the zero-point and min types), values small enough for f16 subnormal scales, sparse rows
// and a zero row.
std::vector<float> TestRows(int rows, int n) {
  gale::Rng rng(20261204);
  std::vector<float> x(static_cast<size_t>(rows) * n);
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + static_cast<size_t>(r) * n;
    for (int i = 0; i < n; ++i) {
      const float g = rng.Normal();
      switch (r % 8) {
        case 0: row[i] = g; break;
        case 1: row[i] = rng.Uniform(-1.0f, 1.0f); break;
        case 2: row[i] = (i % 37 == 5) ? 12.0f * g : 0.5f * g; break;
        case 3: row[i] = std::exp(g); break;
        case 4: row[i] = -0.25f - std::fabs(g); break;
        case 5: row[i] = 3e-6f * g; break;
        case 6: row[i] = (i % 11 == 0) ? g : 0.0f; break;
        default: row[i] = 0.0f; break;
      }
    }
  }
  return x;
}

struct TypeCase {
  int id;
  const char* name;      // ggml's type name, also the tensor name prefix
  const char* ref_fn;    // quantize_row_<name>_ref
  const char* deq_fn;    // dequantize_row_<name>
};

constexpr TypeCase kTypes[] = {
    {2, "q4_0", "quantize_row_q4_0_ref", "dequantize_row_q4_0"},
    {3, "q4_1", "quantize_row_q4_1_ref", "dequantize_row_q4_1"},
    {6, "q5_0", "quantize_row_q5_0_ref", "dequantize_row_q5_0"},
    {7, "q5_1", "quantize_row_q5_1_ref", "dequantize_row_q5_1"},
    {8, "q8_0", "quantize_row_q8_0_ref", "dequantize_row_q8_0"},
    {10, "q2_K", "quantize_row_q2_K_ref", "dequantize_row_q2_K"},
    {11, "q3_K", "quantize_row_q3_K_ref", "dequantize_row_q3_K"},
    {12, "q4_K", "quantize_row_q4_K_ref", "dequantize_row_q4_K"},
    {13, "q5_K", "quantize_row_q5_K_ref", "dequantize_row_q5_K"},
    {14, "q6_K", "quantize_row_q6_K_ref", "dequantize_row_q6_K"},
    {20, "iq4_nl", "quantize_row_iq4_nl_ref", "dequantize_row_iq4_nl"},
    {23, "iq4_xs", "quantize_row_iq4_xs_ref", "dequantize_row_iq4_xs"},
    {39, "mxfp4", "quantize_row_mxfp4_ref", "dequantize_row_mxfp4"},
};

void WriteBlocks(void* base, const std::string& out) {
  using QuantizeChunk = size_t (*)(int, const float*, void*, int64_t, int64_t, int64_t, const float*);
  using RowFn = void (*)(const void*, void*, int64_t);
  using TypeSize = size_t (*)(int);
  using BlockSize = int64_t (*)(int);
  using Init = void (*)(int);
  auto quantize_chunk = Sym<QuantizeChunk>(base, "ggml_quantize_chunk");
  auto type_size = Sym<TypeSize>(base, "ggml_type_size");
  auto blck_size = Sym<BlockSize>(base, "ggml_blck_size");
  auto init = Sym<Init>(base, "ggml_quantize_init");

  constexpr int kRows = 8, kN = 512;
  const std::vector<float> src = TestRows(kRows, kN);
  gale::GgufWriter w;
  w.SetString("general.description", "ggml quantizer and dequantizer outputs (tools/ggml_reference.cc)");
  for (const TypeCase& t : kTypes) {
    init(t.id);
    const size_t row_bytes = type_size(t.id) * (kN / blck_size(t.id));
    const size_t bytes = row_bytes * kRows;
    std::vector<uint8_t> q(bytes), ref(bytes);
    if (quantize_chunk(t.id, src.data(), q.data(), 0, kRows, kN, nullptr) != bytes) {
      std::fprintf(stderr, "ggml_reference: ggml_quantize_chunk(%s) wrote an unexpected size\n", t.name);
      std::exit(1);
    }
    auto ref_fn = Sym<RowFn>(base, t.ref_fn);
    auto deq_fn = Sym<RowFn>(base, t.deq_fn);
    std::vector<float> deq(src.size());
    for (int r = 0; r < kRows; ++r) {
      ref_fn(src.data() + static_cast<size_t>(r) * kN, ref.data() + r * row_bytes, kN);
      deq_fn(q.data() + r * row_bytes, deq.data() + static_cast<size_t>(r) * kN, kN);
    }
    const std::string n = t.name;
    Check(w.AddTensor(n + ".src", 0, {kN, kRows}, Bytes(src.data(), src.size() * 4)));
    Check(w.AddTensor(n + ".q", static_cast<uint32_t>(t.id), {kN, kRows}, q));
    Check(w.AddTensor(n + ".ref", static_cast<uint32_t>(t.id), {kN, kRows}, ref));
    Check(w.AddTensor(n + ".deq", 0, {kN, kRows}, Bytes(deq.data(), deq.size() * 4)));
  }
  Check(w.WriteFile(out + "/blocks.gguf"));
  std::fprintf(stderr, "wrote %s/blocks.gguf\n", out.c_str());
}

struct FileType {
  int ftype;  // llama_ftype
  const char* name;
};

// llama-quantize's mixes whose main types are K-quants and IQ4 (the legacy types are covered
// block by block in blocks.gguf).
constexpr FileType kFileTypes[] = {
    {10, "q2_k"}, {12, "q3_k_m"}, {15, "q4_k_m"}, {17, "q5_k_m"}, {18, "q6_k"}, {25, "iq4_nl"}, {30, "iq4_xs"},
};

// An F32 copy of a quantized model file, every tensor dequantized by ggml (gale only splits the
// file into tensors and writes them back).
void WriteDequantized(void* base, const std::string& in, const std::string& out) {
  using TypeName = const char* (*)(int);
  using RowFn = void (*)(const void*, float*, int64_t);
  auto type_name = Sym<TypeName>(base, "ggml_type_name");
  auto file = gale::GgufFile::Open(in);
  if (!file.ok()) Check(file.status());
  gale::GgufWriter w;
  for (const auto& [key, value] : (*file)->metadata()) w.SetValue(key, value);
  w.SetU32("general.file_type", 0);
  for (const gale::GgufTensorInfo& t : (*file)->tensors()) {
    const int64_t n = t.NumElements();
    std::vector<float> v(static_cast<size_t>(n));
    if (t.type_id == 0) {
      std::memcpy(v.data(), t.data, n * sizeof(float));
    } else if (t.type_id == 1) {
      Sym<RowFn>(base, "ggml_fp16_to_fp32_row")(t.data, v.data(), n);
    } else {
      Sym<RowFn>(base, (std::string("dequantize_row_") + type_name(static_cast<int>(t.type_id))).c_str())(
          t.data, v.data(), n);
    }
    Check(w.AddTensor(t.name, 0, t.shape, Bytes(v.data(), v.size() * sizeof(float))));
  }
  Check(w.WriteFile(out));
}

constexpr int32_t kTokens[] = {1, 300, 72, 401, 299, 66, 5, 510, 257, 400, 88, 1, 123, 456, 311, 259};

// The parts of llama.cpp's C API used here.
struct LlamaApi {
  using DefaultParams = Opaque (*)();
  DefaultParams quantize_defaults, model_defaults, context_defaults;
  uint32_t (*quantize)(const char*, const char*, const void*);
  void* (*load)(const char*, Opaque);
  void* (*init_context)(void*, Opaque);
  Opaque (*batch_one)(int32_t*, int32_t);
  int32_t (*decode)(void*, Opaque);
  float* (*logits_ith)(void*, int32_t);
  void (*free_context)(void*);
  void (*free_model)(void*);
  const void* (*vocab_of)(const void*);
  int32_t (*n_tokens)(const void*);
  void (*set_threads)(void*, int32_t, int32_t);
  void* (*get_memory)(void*);
  void (*memory_clear)(void*, bool);
  void (*synchronize)(void*);
  void (*set_embeddings)(void*, bool);
  float* (*embeddings_seq)(void*, int32_t);
  int32_t (*n_embd)(const void*);
  int32_t (*tokenize)(const void*, const char*, int32_t, int32_t*, int32_t, bool, bool);

  explicit LlamaApi(void* lib) {
    auto get = [lib](auto& fn, const char* name) { fn = Sym<std::remove_reference_t<decltype(fn)>>(lib, name); };
    get(quantize_defaults, "llama_model_quantize_default_params");
    get(model_defaults, "llama_model_default_params");
    get(context_defaults, "llama_context_default_params");
    get(quantize, "llama_model_quantize");
    get(load, "llama_model_load_from_file");
    get(init_context, "llama_init_from_model");
    get(batch_one, "llama_batch_get_one");
    get(decode, "llama_decode");
    get(logits_ith, "llama_get_logits_ith");
    get(free_context, "llama_free");
    get(free_model, "llama_model_free");
    get(vocab_of, "llama_model_get_vocab");
    get(n_tokens, "llama_vocab_n_tokens");
    get(set_threads, "llama_set_n_threads");
    get(get_memory, "llama_get_memory");
    get(memory_clear, "llama_memory_clear");
    get(synchronize, "llama_synchronize");
    get(set_embeddings, "llama_set_embeddings");
    get(embeddings_seq, "llama_get_embeddings_seq");
    get(n_embd, "llama_model_n_embd");
    get(tokenize, "llama_tokenize");
    Sym<void (*)()>(lib, "llama_backend_init")();
  }
};

// A model and a context on it; n_ctx 0 keeps the default context size (and batch sizes),
// otherwise llama_context_params' leading { n_ctx, n_batch, n_ubatch, n_seq_max } are set to n_ctx,
// batch, batch and seqs.
struct LlamaSession {
  const LlamaApi& api;
  void* model = nullptr;
  void* ctx = nullptr;
  int32_t vocab = 0;
  LlamaSession(const LlamaApi& a, const std::string& path, uint32_t n_ctx = 0, uint32_t batch = 0, uint32_t seqs = 1,
               bool f32_kv = false)
      : api(a) {
    model = api.load(path.c_str(), api.model_defaults());
    if (model == nullptr) Fail("llama.cpp could not load " + path);
    Opaque cp = api.context_defaults();
    if (f32_kv) {
      SetF32Kv(cp);
      DisableFlashAttention(cp);
    }
    if (n_ctx > 0) {
      uint32_t sizes[4];
      std::memcpy(sizes, cp.bytes, sizeof(sizes));
      if (sizes[3] != 1) Fail("unexpected llama_context_params layout");
      sizes[0] = n_ctx;
      sizes[1] = sizes[2] = std::max(sizes[2], batch);
      sizes[3] = seqs;
      std::memcpy(cp.bytes, sizes, sizeof(sizes));
    }
    ctx = api.init_context(model, cp);
    if (ctx == nullptr) Fail("no llama.cpp context for " + path);
    vocab = api.n_tokens(api.vocab_of(model));
  }
  // llama_context_params' type_k and type_v follow the callback pointer pair cb_eval,
  // cb_eval_user_data (null by default); both default to GGML_TYPE_F16 (1). Found by that pattern
  // (exactly one place must match) rather than by an offset that moves between releases.
  static void SetF32Kv(Opaque& cp) {
    int found = -1;
    for (int off = 8; off + 24 <= 256; off += 8) {
      uint64_t ptrs[2];
      int32_t types[2];
      std::memcpy(ptrs, cp.bytes + off, sizeof(ptrs));
      std::memcpy(types, cp.bytes + off + 16, sizeof(types));
      if (ptrs[0] == 0 && ptrs[1] == 0 && types[0] == 1 && types[1] == 1) {
        if (found >= 0) Fail("llama_context_params: type_k/type_v not found unambiguously");
        found = off + 16;
      }
    }
    if (found < 0) Fail("llama_context_params: type_k/type_v not found");
    const int32_t f32[2] = {0, 0};
    std::memcpy(cp.bytes + found, f32, sizeof(f32));
  }
  // With flash attention llama.cpp casts f32 K and V to f16 before attending, so an f32 cache alone
  // does not make attention f32. In llama_context_params the enums rope_scaling_type,
  // pooling_type, attention_type and flash_attn_type follow each other, all -1 (unspecified /
  // auto) by default, then the float rope_freq_base (0 by default); the fields before them differ
  // between releases, so the run of four -1 is searched for (exactly one must be found) and
  // flash_attn_type set to 0 (disabled).
  static void DisableFlashAttention(Opaque& cp) {
    int found = -1;
    for (int off = 16; off + 20 <= 256; off += 4) {
      int32_t v[5];
      std::memcpy(v, cp.bytes + off, sizeof(v));
      if (v[0] == -1 && v[1] == -1 && v[2] == -1 && v[3] == -1 && v[4] == 0) {
        if (found >= 0) Fail("llama_context_params: flash_attn_type not found unambiguously");
        found = off + 12;
      }
    }
    if (found < 0) Fail("llama_context_params: flash_attn_type not found");
    const int32_t disabled = 0;
    std::memcpy(cp.bytes + found, &disabled, sizeof(disabled));
  }
  ~LlamaSession() {
    api.free_context(ctx);
    api.free_model(model);
  }
  void Decode(int32_t* tokens, int32_t n) const {
    if (api.decode(ctx, api.batch_one(tokens, n)) != 0) Fail("llama_decode failed");
  }
  // n tokens of sequence 0 at positions 0..n-1 in one decode, every row's logits wanted.
  void DecodeAll(int32_t* tokens, int32_t n) const {
    std::vector<int32_t> positions(n), seqs(n, 0);
    for (int32_t i = 0; i < n; ++i) positions[i] = i;
    DecodeRows(tokens, n, positions.data(), seqs.data());
  }
  // One token for each of n sequences (sequence s: tokens[s] at position pos), all with logits.
  void DecodeParallel(int32_t* tokens, int32_t n, int32_t pos) const {
    std::vector<int32_t> positions(n, pos), seqs(n);
    for (int32_t i = 0; i < n; ++i) seqs[i] = i;
    DecodeRows(tokens, n, positions.data(), seqs.data());
  }
  // One decode of n tokens, token i at positions[i] of sequence seqs[i], every row's logits wanted.
  void DecodeRows(int32_t* tokens, int32_t n, int32_t* positions, int32_t* seqs) const {
    struct Batch {  // struct llama_batch
      int32_t n_tokens;
      int32_t* token;
      float* embd;
      int32_t* pos;
      int32_t* n_seq_id;
      int32_t** seq_id;
      int8_t* logits;
    };
    std::vector<int32_t> n_seq_id(n, 1);
    std::vector<int32_t*> seq_id(n);
    std::vector<int8_t> logits(n, 1);
    for (int32_t i = 0; i < n; ++i) seq_id[i] = &seqs[i];
    const Batch b{n, tokens, nullptr, positions, n_seq_id.data(), seq_id.data(), logits.data()};
    Opaque o{};
    std::memcpy(o.bytes, &b, sizeof(b));
    if (api.decode(ctx, o) != 0) Fail("llama_decode failed");
  }

};

void WriteModels(void* base, const LlamaApi& api, const std::string& f32_model, const std::string& out,
                 const std::string& tmp, const std::vector<std::pair<std::string, std::string>>& extra) {
  // llama_model_quantize_params starts { int32_t nthread; enum llama_ftype ftype; ... } and its
  // default ftype is LLAMA_FTYPE_MOSTLY_Q8_0 (7; Q5_1, 9, in older releases): a check that the
  // layout is the one assumed.
  Opaque qp = api.quantize_defaults();
  int32_t fields[2];
  std::memcpy(fields, qp.bytes, sizeof(fields));
  if (fields[1] != 7 && fields[1] != 9) Fail("unexpected llama_model_quantize_params layout");

  std::vector<std::pair<std::string, std::string>> models = {{"f32", f32_model}};
  const size_t num_default_kv = 1 + 2 * std::size(kFileTypes);
  for (const FileType& f : kFileTypes) {
    const std::string path = out + "/" + f.name + ".gguf";
    fields[0] = 2;
    fields[1] = f.ftype;
    std::memcpy(qp.bytes, fields, sizeof(fields));
    if (api.quantize(f32_model.c_str(), path.c_str(), qp.bytes) != 0) Fail(std::string("llama_model_quantize failed: ") + f.name);
    models.emplace_back(f.name, path);
    const std::string deq = tmp + "/" + f.name + ".deq.gguf";
    WriteDequantized(base, path, deq);
    models.emplace_back(std::string(f.name) + ".deq", deq);
  }
  models.insert(models.end(), extra.begin(), extra.end());

  gale::GgufWriter w;
  w.SetString("general.description", "llama.cpp logits, one token at a time (tools/ggml_reference.cc)");
  w.SetValue("tokens", gale::GgufValue::I32Array(std::vector<int32_t>(std::begin(kTokens), std::end(kTokens))));
  constexpr int kNumTokens = static_cast<int>(std::size(kTokens));
  for (size_t m = 0; m < models.size(); ++m) {
    const auto& [name, path] = models[m];
    // An encoder (bert*) has no logits and no cache: only its pooled embedding, below.
    const bool encoder = name.rfind("bert", 0) == 0;
    if (!encoder) {
      const LlamaSession s(api, path, 0, 0, 1, /*f32_kv=*/m >= num_default_kv);
      std::vector<float> logits(static_cast<size_t>(s.vocab) * kNumTokens);
      for (int i = 0; i < kNumTokens; ++i) {
        int32_t token = kTokens[i];
        s.Decode(&token, 1);
        std::memcpy(logits.data() + static_cast<size_t>(i) * s.vocab, api.logits_ith(s.ctx, -1), s.vocab * sizeof(float));
      }
      Check(w.AddTensor(name, 0, {s.vocab, kNumTokens}, Bytes(logits.data(), logits.size() * 4)));
    }
    if (encoder || name.find("_embd") != std::string::npos) {
      // An embedding model (its file's pooling_type): the pooled embedding of all the tokens in
      // one batch, as llama_get_embeddings_seq gives it (before any normalization).
      const LlamaSession e(api, path, 0, 0, 1, /*f32_kv=*/true);
      api.set_embeddings(e.ctx, true);
      std::vector<int32_t> tokens(std::begin(kTokens), std::end(kTokens));
      e.Decode(tokens.data(), kNumTokens);
      const float* embd = api.embeddings_seq(e.ctx, 0);
      if (embd == nullptr) Fail("no pooled embedding for " + name);
      const int32_t dim = api.n_embd(e.model);
      Check(w.AddTensor(name + ".embd", 0, {dim}, Bytes(embd, static_cast<size_t>(dim) * 4)));
      if (name.find("_last") != std::string::npos) {
        // Last-token pooling again, the tokens decoded one at a time (llama.cpp's single-token path).
        const LlamaSession e1(api, path, 0, 0, 1, /*f32_kv=*/true);
        api.set_embeddings(e1.ctx, true);
        for (int i = 0; i < kNumTokens; ++i) e1.Decode(&tokens[i], 1);
        const float* one = api.embeddings_seq(e1.ctx, 0);
        if (one == nullptr) Fail("no pooled embedding for " + name);
        Check(w.AddTensor(name + ".embd1", 0, {dim}, Bytes(one, static_cast<size_t>(dim) * 4)));
      }
    }
  }
  Check(w.WriteFile(out + "/logits.gguf"));
  std::fprintf(stderr, "wrote %s/logits.gguf\n", out.c_str());
}

constexpr int kLongStride = 8;  // the long runs keep every 8th position's logits

// Token i of the long runs: a fixed pseudo-random walk over the vocabulary (never id 0).
std::vector<int32_t> LongTokens(int n, int32_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t x = 12345;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t[static_cast<size_t>(i)] = static_cast<int32_t>(1 + (x >> 8) % static_cast<uint32_t>(vocab - 1));
  }
  return t;
}

void WriteLong(const LlamaApi& api, const std::string& out, int n,
               const std::vector<std::pair<std::string, std::string>>& models) {
  gale::GgufWriter w;
  w.SetString("general.description", "llama.cpp logits of long sequences (tools/ggml_reference.cc long)");
  std::vector<int32_t> tokens;
  for (const auto& [name, path] : models) {
    // One thread: ggml's spinning barrier between this graph's ~800 small nodes costs seconds per
    // token once its threads outnumber the free cores.
    const LlamaSession s(api, path, static_cast<uint32_t>(n + 16), static_cast<uint32_t>(n), 1, /*f32_kv=*/true);
    api.set_threads(s.ctx, 1, 1);
    if (tokens.empty()) {
      tokens = LongTokens(n, s.vocab);
      w.SetValue("tokens", gale::GgufValue::I32Array(tokens));
    }
    const int rows = n / kLongStride;
    std::vector<float> logits(static_cast<size_t>(s.vocab) * rows);
    for (int i = 0; i < n; ++i) {
      int32_t token = tokens[static_cast<size_t>(i)];
      s.Decode(&token, 1);
      if (i % kLongStride != kLongStride - 1 || i / kLongStride >= rows) continue;
      std::memcpy(logits.data() + static_cast<size_t>(i / kLongStride) * s.vocab, api.logits_ith(s.ctx, -1),
                  s.vocab * sizeof(float));
    }
    Check(w.AddTensor(name, 0, {s.vocab, rows}, Bytes(logits.data(), logits.size() * 4)));
    const LlamaSession b(api, path, static_cast<uint32_t>(n + 16), static_cast<uint32_t>(n), 1, /*f32_kv=*/true);
    api.set_threads(b.ctx, 1, 1);
    b.DecodeAll(tokens.data(), n);
    for (int r = 0; r < rows; ++r) {
      std::memcpy(logits.data() + static_cast<size_t>(r) * s.vocab, api.logits_ith(b.ctx, r * kLongStride + kLongStride - 1),
                  s.vocab * sizeof(float));
    }
    Check(w.AddTensor(name + ".batch", 0, {s.vocab, rows}, Bytes(logits.data(), logits.size() * 4)));
    std::fprintf(stderr, "%s: %d tokens\n", name.c_str(), n);
  }
  Check(w.WriteFile(out));
}

// seqs > 1: generation only, tg steps of one token for each of seqs sequences (aggregate tokens/s,
// as gale bench --batch).
int Bench(const LlamaApi& api, const std::string& path, int pp, int tg, int reps, int threads, int seqs, bool f32_kv) {
  if (seqs > 1) pp = 0;
  const LlamaSession s(api, path, static_cast<uint32_t>((pp + tg + 16) * seqs), static_cast<uint32_t>(std::max(pp, seqs)),
                       static_cast<uint32_t>(seqs), f32_kv);
  api.set_threads(s.ctx, threads, threads);
  void* memory = api.get_memory(s.ctx);
  std::vector<int32_t> tokens(static_cast<size_t>(std::max({pp, tg * seqs, 1})));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(1 + (i * 7919) % (s.vocab - 1));
  // Seconds for pp tokens in one decode, or tg steps of one token per sequence, from an empty cache.
  auto timed = [&](bool prompt) {
    api.memory_clear(memory, true);
    const auto t0 = std::chrono::steady_clock::now();
    if (prompt) {
      s.Decode(tokens.data(), pp);
    } else if (seqs == 1) {
      for (int i = 0; i < tg; ++i) s.Decode(&tokens[i], 1);
    } else {
      for (int i = 0; i < tg; ++i) s.DecodeParallel(&tokens[static_cast<size_t>(i) * seqs], seqs, i);
    }
    api.synchronize(s.ctx);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (pp > 0) timed(true);  // warm-up
  if (tg > 0) timed(false);
  for (const bool prompt : {true, false}) {
    const int n = prompt ? pp : tg;
    if (n <= 0) continue;
    std::string rates;
    for (int r = 0; r < reps; ++r) rates += (r ? ", " : "") + std::to_string(n * (prompt ? 1 : seqs) / timed(prompt));
    std::printf("{\"engine\": \"llama.cpp\", \"model\": \"%s\", \"test\": \"%s%d\", \"batch\": %d, \"threads\": %d, "
                "\"tokens_per_second\": [%s]}\n",
                path.c_str(), prompt ? "pp" : "tg", n, prompt ? 1 : seqs, threads, rates.c_str());
    std::fflush(stdout);
  }
  return 0;
}

// llama_model_params in this release: nine pointer-sized fields and three int32 before its bools
// (devices, buffer-type overrides, n_gpu_layers -1, split_mode 1, main_gpu -1, ..., kv_overrides),
// vocab_only the first bool, at byte 72 (false by default, as are the pointers). Checked, then set;
// the result is checked against llama.cpp's own .inp/.out vectors by the caller's script.
void Tokenize(const LlamaApi& api, const std::string& vocab_path, const std::string& inputs, const std::string& out) {
  Opaque mp = api.model_defaults();
  constexpr size_t kVocabOnly = 72;
  const uint64_t* words = reinterpret_cast<const uint64_t*>(mp.bytes);
  int32_t ints[4];
  std::memcpy(ints, mp.bytes + 16, sizeof(ints));
  if (words[0] != 0 || words[1] != 0 || words[4] != 0 || words[7] != 0 || words[8] != 0 || ints[0] != -1 ||
      mp.bytes[kVocabOnly] != 0) {
    Fail("unexpected llama_model_params layout");
  }
  mp.bytes[kVocabOnly] = 1;
  void* model = api.load(vocab_path.c_str(), mp);
  if (model == nullptr) Fail("llama.cpp could not load " + vocab_path);
  const void* vocab = api.vocab_of(model);
  auto read = gale::ReadTextFile(inputs);
  Check(read.status());
  const std::string& text = *read;
  FILE* o = std::fopen(out.c_str(), "wb");
  if (o == nullptr) Fail("cannot write " + out);
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t at = 0; at < text.size();) {
    size_t next = text.find(sep, at);
    if (next == std::string::npos) next = text.size();
    const std::string t = text.substr(at, next - at);
    for (bool special : {false, true}) {
      std::vector<int32_t> ids(t.size() * 2 + 16);
      const int32_t n = api.tokenize(vocab, t.data(), static_cast<int32_t>(t.size()), ids.data(),
                                     static_cast<int32_t>(ids.size()), false, special);
      if (n < 0) Fail("llama_tokenize needs more room");
      for (int32_t i = 0; i < n; ++i) std::fprintf(o, i == 0 ? "%d" : " %d", ids[static_cast<size_t>(i)]);
      std::fputc(special ? '\n' : '\t', o);
    }
    at = next + sep.size();
  }
  std::fclose(o);
  api.free_model(model);
}

}  // namespace

int main(int argc, char** argv) {
  const bool bench = argc >= 4 && std::string(argv[1]) == "bench";
  const bool tokenize = argc >= 2 && std::string(argv[1]) == "tokenize";
  const bool long_runs = argc >= 2 && std::string(argv[1]) == "long";
  if ((!bench && argc < 5) || (tokenize && argc != 6) || (long_runs && argc < 6)) {
    std::fprintf(stderr, "usage: ggml_reference LIBDIR F32_MODEL OUTDIR TMPDIR [NAME=MODEL ...]\n"
                         "       ggml_reference bench LIBDIR MODEL [PP [TG [REPS [THREADS [SEQS [KV]]]]]]\n"
                         "       ggml_reference tokenize LIBDIR VOCAB INPUTS OUT\n"
                         "       ggml_reference long LIBDIR OUT NTOKENS NAME=MODEL ...\n");
    return 2;
  }
  const std::string dir = argv[bench || tokenize || long_runs ? 2 : 1];
  void* base = Open(dir + "/libggml-base.so");
  void* ggml = Open(dir + "/libggml.so");
  void* llama = Open(dir + "/libllama.so");
  Sym<void (*)(const char*)>(ggml, "ggml_backend_load_all_from_path")(dir.c_str());
  const LlamaApi api(llama);
  if (bench) {
    auto arg = [&](int i, int def) { return argc > i ? std::atoi(argv[i]) : def; };
    const bool f32_kv = argc > 9 && std::string(argv[9]) == "f32";
    return Bench(api, argv[3], arg(4, 512), arg(5, 128), arg(6, 3), arg(7, 2), std::max(arg(8, 1), 1), f32_kv);
  }
  if (tokenize) {
    Tokenize(api, argv[3], argv[4], argv[5]);
    return 0;
  }
  std::vector<std::pair<std::string, std::string>> extra;
  for (int i = 5; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos || eq == 0) Fail("expected NAME=MODEL, got " + a);
    extra.emplace_back(a.substr(0, eq), a.substr(eq + 1));
  }
  if (long_runs) {
    WriteLong(api, argv[3], std::atoi(argv[4]), extra);
    return 0;
  }
  WriteBlocks(base, argv[3]);
  WriteModels(base, api, argv[2], argv[3], argv[4], extra);
  return 0;
}
