// llama2.c checkpoint layout (run.c, legacy format): a header of 7 int32 (dim, hidden_dim,
// n_layers, n_heads, n_kv_heads, vocab_size, seq_len; negative vocab_size = separate classifier),
// then float32 tensors in this order: token_embedding [vocab, dim], rms_att [L, dim],
// wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim],
// w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim], rms_final [dim],
// freq_cis_real/imag [seq_len, head_size/2] (unused), then wcls [vocab, dim] if not shared.
// Row-major [out, in] is exactly ggml's {in, out}, so tensors copy through unchanged; llama2.c
// rotates adjacent pairs, which is llama.cpp's normal RoPE, so no permutation is needed either.
#include "convert/llama2c_convert.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace gale {
namespace {

StatusOr<std::vector<uint8_t>> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError("cannot open '{}'", path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return bytes;
}

}  // namespace

StatusOr<GgufWriter> ConvertLlama2c(const std::string& model_path, const std::string& tokenizer_path,
                                    Llama2cConfig* config_out) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> model, ReadAll(model_path));
  if (model.size() < 28) return DataLoss("{}: too small for a llama2.c header ({} bytes)", model_path, model.size());
  int32_t h[7];
  std::memcpy(h, model.data(), sizeof(h));
  Llama2cConfig c{h[0], h[1], h[2], h[3], h[4], h[5] < 0 ? -h[5] : h[5], h[6], h[5] > 0};
  if (c.dim <= 0 || c.hidden_dim <= 0 || c.num_layers <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 ||
      c.vocab_size <= 0 || c.seq_len <= 0 || c.dim % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0 ||
      c.dim > (1 << 16) || c.hidden_dim > (1 << 18) || c.num_layers > 1024 || c.vocab_size > (1 << 20) ||
      c.seq_len > (1 << 22)) {
    return InvalidArgument("{}: implausible llama2.c header (dim {}, hidden {}, layers {}, heads {}, kv heads {}, vocab {}, seq_len {})",
                           model_path, c.dim, c.hidden_dim, c.num_layers, c.num_heads, c.num_kv_heads, c.vocab_size, c.seq_len);
  }
  const int64_t head = c.dim / c.num_heads;
  const int64_t kv_dim = head * c.num_kv_heads;
  const int64_t L = c.num_layers, D = c.dim, H = c.hidden_dim, V = c.vocab_size;
  const int64_t expected_floats = V * D + L * D * 2 + L * D * D * 2 + L * kv_dim * D * 2 + L * H * D * 3 + D +
                                  c.seq_len * head + (c.shared_classifier ? 0 : V * D);
  const uint64_t expected = 28 + static_cast<uint64_t>(expected_floats) * 4;
  if (model.size() != expected) {
    return DataLoss("{}: {} bytes, but the header describes a checkpoint of {} bytes", model_path, model.size(), expected);
  }

  // Tokenizer: int32 max_token_length, then per token: float score, int32 len, len bytes.
  ASSIGN_OR_RETURN(std::vector<uint8_t> tok, ReadAll(tokenizer_path));
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  size_t pos = 4;
  if (tok.size() < 4) return DataLoss("{}: too small for a llama2.c tokenizer", tokenizer_path);
  for (int64_t i = 0; i < V; ++i) {
    float score;
    int32_t len;
    if (pos + 8 > tok.size()) return DataLoss("{}: truncated at token {} of {}", tokenizer_path, i, V);
    std::memcpy(&score, tok.data() + pos, 4);
    std::memcpy(&len, tok.data() + pos + 4, 4);
    pos += 8;
    if (len < 0 || static_cast<size_t>(len) > tok.size() - pos) {
      return DataLoss("{}: token {} has length {} past the end of the file", tokenizer_path, i, len);
    }
    std::string piece(reinterpret_cast<const char*>(tok.data() + pos), len);
    pos += len;
    // llama2.c stores SentencePiece's '▁' as a plain space; GGUF keeps the marker.
    // Its special tokens read "\n<s>\n" and "\n</s>\n"; GGUF vocabs use the bare names.
    if (i == 0) piece = "<unk>";
    if (i == 1) piece = "<s>";
    if (i == 2) piece = "</s>";
    std::string text;
    for (char ch : piece) text += ch == ' ' ? std::string("\xe2\x96\x81") : std::string(1, ch);
    int32_t type = 1;  // normal
    if (i == 0) type = 2;                  // <unk>
    else if (i == 1 || i == 2) type = 3;   // <s>, </s>: control
    else if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') type = 6;  // byte
    tokens.push_back(std::move(text));
    scores.push_back(score);
    types.push_back(type);
  }

  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("general.name", "llama2.c " + model_path.substr(model_path.find_last_of('/') + 1));
  w.SetU32("general.file_type", 0);  // all f32
  w.SetU32("llama.context_length", c.seq_len);
  w.SetU32("llama.embedding_length", c.dim);
  w.SetU32("llama.feed_forward_length", c.hidden_dim);
  w.SetU32("llama.attention.head_count", c.num_heads);
  w.SetU32("llama.attention.head_count_kv", c.num_kv_heads);
  w.SetU32("llama.block_count", c.num_layers);
  w.SetU32("llama.rope.dimension_count", static_cast<uint32_t>(head));
  w.SetF32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.SetF32("llama.rope.freq_base", 10000.0f);
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetValue("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
  w.SetValue("tokenizer.ggml.scores", GgufValue::F32Array(scores));
  w.SetValue("tokenizer.ggml.token_type", GgufValue::I32Array(types));
  w.SetU32("tokenizer.ggml.unknown_token_id", 0);
  w.SetU32("tokenizer.ggml.bos_token_id", 1);
  w.SetU32("tokenizer.ggml.eos_token_id", 2);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetBool("tokenizer.ggml.add_eos_token", false);

  // Walk the checkpoint in file order, slicing per-layer tensors out of the stacked arrays.
  const uint8_t* p = model.data() + 28;
  auto take = [&](int64_t num_floats) {
    std::vector<uint8_t> bytes(p, p + num_floats * 4);
    p += num_floats * 4;
    return bytes;
  };
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    return w.AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), std::move(shape), std::move(bytes));
  };
  std::vector<uint8_t> embd = take(V * D);
  struct Stacked { const char* name; std::vector<int64_t> shape; };
  const Stacked stacked[] = {
      {"attn_norm", {D}},        {"attn_q", {D, D}},        {"attn_k", {D, kv_dim}}, {"attn_v", {D, kv_dim}},
      {"attn_output", {D, D}},   {"ffn_norm", {D}},         {"ffn_gate", {D, H}},    {"ffn_down", {H, D}},
      {"ffn_up", {D, H}}};
  // per_layer[s][l] = bytes of stacked tensor s for layer l
  std::vector<std::vector<std::vector<uint8_t>>> per_layer(std::size(stacked));
  for (size_t s = 0; s < std::size(stacked); ++s) {
    int64_t n = 1;
    for (int64_t d : stacked[s].shape) n *= d;
    for (int64_t l = 0; l < L; ++l) per_layer[s].push_back(take(n));
  }
  std::vector<uint8_t> final_norm = take(D);
  p += c.seq_len * head * 4;  // freq_cis_real + freq_cis_imag, recomputed at run time
  RETURN_IF_ERROR(add("token_embd.weight", {D, V}, std::move(embd)));
  RETURN_IF_ERROR(add("output_norm.weight", {D}, std::move(final_norm)));
  if (!c.shared_classifier) RETURN_IF_ERROR(add("output.weight", {D, V}, take(V * D)));
  for (int64_t l = 0; l < L; ++l) {
    for (size_t s = 0; s < std::size(stacked); ++s) {
      RETURN_IF_ERROR(add(fmt::format("blk.{}.{}.weight", l, stacked[s].name), stacked[s].shape,
                          std::move(per_layer[s][l])));
    }
  }
  if (config_out != nullptr) *config_out = c;
  return w;
}

}  // namespace gale
