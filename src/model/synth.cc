// Synthetic models, the generic part: the shape's common checks and keys, the synthetic vocab,
// the weight generators; each architecture's own keys and tensors come from its writer
// (ArchSpec::synth_write in its file under model/arch/).
#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "base/rng.h"
#include "model/arch_spec.h"

namespace gale {

std::vector<std::string> NamedSynthShapes() {
  std::vector<std::string> names;
  for (const ArchSpec* a : Architectures()) {
    if (a->synth_shapes == nullptr) continue;
    for (const SynthShape& shape : a->synth_shapes()) names.push_back(shape.name);
  }
  return names;
}

StatusOr<SynthShape> NamedSynthShape(const std::string& name) {
  for (const ArchSpec* a : Architectures()) {
    if (a->synth_shapes == nullptr) continue;
    for (const SynthShape& shape : a->synth_shapes()) {
      if (shape.name == name) return shape;
    }
  }
  return InvalidArgument("unknown model shape '{}' (known: {})", name, fmt::join(NamedSynthShapes(), ", "));
}

StatusOr<std::pair<std::string, GgufValue>> ParseSynthKey(const std::string& spec) {
  const size_t eq = spec.find('='), colon = spec.find(':', eq == std::string::npos ? 0 : eq);
  if (eq == std::string::npos || eq == 0 || colon == std::string::npos) {
    return InvalidArgument("--key '{}': expected NAME=TYPE:VALUE (TYPE u32, i32, u64, f32, bool, str, or u32s, "
                           "i32s, f32s, bools for comma-separated arrays)", spec);
  }
  const std::string name = spec.substr(0, eq), type = spec.substr(eq + 1, colon - eq - 1), text = spec.substr(colon + 1);
  auto scalar = [&](const std::string& t, const std::string& v) -> StatusOr<GgufValue> {
    try {
      size_t used = 0;
      GgufValue out;
      if (t == "u32") {
        out = GgufValue::U32(static_cast<uint32_t>(std::stoul(v, &used)));
      } else if (t == "i32") {
        out = GgufValue::I32(static_cast<int32_t>(std::stol(v, &used)));
      } else if (t == "u64") {
        out = GgufValue::U64(std::stoull(v, &used));
      } else if (t == "f32") {
        out = GgufValue::F32(std::stof(v, &used));
      } else if (t == "bool" && (v == "true" || v == "false")) {
        return GgufValue::Bool(v == "true");
      } else if (t == "str") {
        return GgufValue::String(v);
      } else {
        return InvalidArgument("--key '{}': unknown type or value '{}:{}'", spec, t, v);
      }
      if (used != v.size()) return InvalidArgument("--key '{}': '{}' is not a {}", spec, v, t);
      return out;
    } catch (const std::exception&) {
      return InvalidArgument("--key '{}': '{}' is not a {}", spec, v, t);
    }
  };
  if (type.size() > 1 && type.back() == 's' && type != "str") {
    const std::string elem = type.substr(0, type.size() - 1);
    std::vector<GgufValue> values;
    size_t start = 0;
    while (start <= text.size()) {
      const size_t end = std::min(text.find(',', start), text.size());
      ASSIGN_OR_RETURN(GgufValue v, scalar(elem, text.substr(start, end - start)));
      values.push_back(std::move(v));
      start = end + 1;
    }
    const GgufValueType elem_type = values[0].type;
    return std::make_pair(name, GgufValue::Array(elem_type, std::move(values)));
  }
  ASSIGN_OR_RETURN(GgufValue v, scalar(type, text));
  return std::make_pair(name, std::move(v));
}

void SynthVocab(int64_t vocab_size, std::vector<std::string>* tokens, std::vector<float>* scores,
                std::vector<int32_t>* types) {
  const std::string sp = "\xe2\x96\x81";
  tokens->clear();
  types->clear();
  auto add = [&](std::string t, int32_t type) {
    if (static_cast<int64_t>(tokens->size()) < vocab_size) {
      tokens->push_back(std::move(t));
      types->push_back(type);
    }
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 6);
  add(sp, 1);
  for (int c = 33; c < 127; ++c) add(std::string(1, static_cast<char>(c)), 1);
  for (int c = 33; c < 127; ++c) add(sp + static_cast<char>(c), 1);
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) add(std::string{a, b}, 1);
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) add(sp + a + b, 1);
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b)
      for (char c = 'a'; c <= 'z'; ++c) add(sp + a + b + c, 1);
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b)
      for (char c = 'a'; c <= 'z'; ++c) add(std::string{a, b, c}, 1);
  // Past 37k entries (larger custom vocabs): numbered filler tokens, never produced by merges.
  for (int64_t i = static_cast<int64_t>(tokens->size()); i < vocab_size; ++i) add(fmt::format("<extra_{}>", i), 5);
  scores->resize(tokens->size());
  // Longer pieces score higher so merges prefer them, as in a trained vocab.
  for (size_t i = 0; i < tokens->size(); ++i) {
    (*scores)[i] = (*types)[i] == 1 ? static_cast<float>(i) / static_cast<float>(tokens->size()) : 0.0f;
  }
}

namespace {

// FNV-1a over the name: a tensor's generator seed that does not depend on the platform.
uint64_t TensorSeed(uint64_t seed, const std::string& name) {
  for (char ch : name) seed = (seed ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
  return seed;
}

// The checks every architecture's shape passes.
Status CheckShape(const SynthShape& s, const ArchSpec& arch, GgmlType type) {
  const bool moe = s.num_experts > 0;
  if (moe && !arch.experts) return InvalidArgument("synth: {} is not written with experts", s.arch);
  const int64_t expert_ffn = s.expert_ffn > 0 ? s.expert_ffn : s.ffn_dim;
  const GgmlType etype = s.expert_type.value_or(type);
  if (!CanQuantize(etype) || s.dim % TypeTraits(etype).block_size != 0 || expert_ffn % TypeTraits(etype).block_size != 0) {
    return InvalidArgument("synth: cannot write the experts as {} (dim {}, expert width {})", TypeTraits(etype).name, s.dim,
                           expert_ffn);
  }
  if (s.expert_groups > 1 && (s.num_experts % s.expert_groups != 0 || s.groups_used <= 0 || s.groups_used > s.expert_groups)) {
    return InvalidArgument("synth: {} expert groups (using {}) must divide {} experts", s.expert_groups, s.groups_used, s.num_experts);
  }
  if (moe && (s.experts_used <= 0 || s.experts_used > s.num_experts || s.num_experts > 4096)) {
    return InvalidArgument("synth: {} experts with {} used per token", s.num_experts, s.experts_used);
  }
  if (s.dim <= 0 || s.num_heads <= 0 || (s.head_dim == 0 && s.dim % s.num_heads != 0) || s.num_kv_heads <= 0 ||
      s.head_dim < 0 || s.head_dim % 2 != 0 || s.num_layers <= 0 || s.ffn_dim <= 0 || s.vocab_size < 260) {
    return InvalidArgument("synth: inconsistent shape (dim {}, heads {}, kv heads {}, layers {}, ffn {}, vocab {} >= 260)",
                           s.dim, s.num_heads, s.num_kv_heads, s.num_layers, s.ffn_dim, s.vocab_size);
  }
  if (!CanQuantize(type)) {
    return InvalidArgument("synth: cannot write {} yet (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q6_K, iq4_nl, "
                           "iq4_xs, gale's w4 types)", TypeTraits(type).name);
  }
  const int64_t block = TypeTraits(type).block_size;
  if (s.dim % block != 0 || s.ffn_dim % block != 0) {
    return InvalidArgument("synth: dim {} and ffn {} must be multiples of the {} block size {}", s.dim, s.ffn_dim,
                           TypeTraits(type).name, block);
  }
  if (moe && expert_ffn % block != 0) {
    return InvalidArgument("synth: the expert width {} must be a multiple of the {} block size {}", expert_ffn,
                           TypeTraits(type).name, block);
  }
  if (s.yarn_factor > 0.0 && s.yarn_orig_ctx <= 0) return InvalidArgument("synth: YaRN needs the original context length");
  return Status::Ok();
}

// The standard attention's checks (every architecture but the latent ones, which check their own).
Status CheckHeads(const SynthWriter& w) {
  const SynthShape& s = w.s;
  const int64_t block = TypeTraits(w.type).block_size;
  if (s.num_heads % s.num_kv_heads != 0 || s.v_head_dim < 0 || s.v_head_dim % 2 != 0) {
    return InvalidArgument("synth: {} heads over {} KV heads, V head size {}", s.num_heads, s.num_kv_heads, s.v_head_dim);
  }
  if (w.q_dim % block != 0 || w.o_dim % block != 0) {
    return InvalidArgument("synth: heads x head size {} (V: {}) must be a multiple of the {} block size {}", w.q_dim,
                           w.o_dim, TypeTraits(w.type).name, block);
  }
  return Status::Ok();
}

}  // namespace

SynthWriter::SynthWriter(const SynthShape& shape, GgmlType t, uint64_t seed, GgufWriter* out)
    : s(shape), type(t), expert_type(shape.expert_type.value_or(t)), w(*out), p(shape.arch + "."), seed_(seed) {
  head_dim = s.head_dim > 0 ? s.head_dim : s.num_heads > 0 ? s.dim / s.num_heads : 0;
  v_head = s.v_head_dim > 0 ? s.v_head_dim : head_dim;
  q_dim = head_dim * s.num_heads;
  kv_dim = head_dim * s.num_kv_heads;
  v_dim = v_head * s.num_kv_heads;
  o_dim = v_head * s.num_heads;
  expert_ffn = s.expert_ffn > 0 ? s.expert_ffn : s.ffn_dim;
}

Status SynthWriter::Matrix(const std::string& name, int64_t in, int64_t out, GgmlType t, int64_t experts) {
  const uint64_t tensor_seed = TensorSeed(seed_ ^ 0xcbf29ce484222325ull, name);
  std::vector<int64_t> shape = {in, out};
  if (experts > 0) shape.push_back(experts);
  const int64_t rows = out * std::max<int64_t>(experts, 1);
  return w.AddTensor(name, static_cast<uint32_t>(t), shape, [in, rows, t, tensor_seed](uint8_t* dst, uint64_t) {
    Rng rng(tensor_seed);
    const float a = std::sqrt(3.0f / static_cast<float>(in));
    std::vector<float> row(in);  // [in]
    const int64_t row_bytes = RowBytes(t, in);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : row) v = rng.Uniform(-a, a);
      QuantizeRowRef(t, row.data(), dst + r * row_bytes, in);
    }
  });
}

Status SynthWriter::Vector(const std::string& name, int64_t n, float base, float spread, int64_t rows) {
  Rng rng(TensorSeed(seed_ ^ 0x84222325cbf29ce4ull, name));
  std::vector<float> v(n * std::max<int64_t>(rows, 1));  // [rows, n]
  for (float& x : v) x = base + (spread > 0.0f ? rng.Uniform(-spread, spread) : 0.0f);
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  std::vector<int64_t> shape = {n};
  if (rows > 0) shape.push_back(rows);
  return w.AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), shape, std::move(bytes));
}

Status SynthWriter::Floats(const std::string& name, const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return w.AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), {static_cast<int64_t>(v.size())}, std::move(bytes));
}

Status SynthWriter::Qkv(const std::string& b, bool biases) {
  RETURN_IF_ERROR(Matrix(b + "attn_q.weight", s.dim, q_dim, type));
  RETURN_IF_ERROR(Matrix(b + "attn_k.weight", s.dim, kv_dim, type));
  RETURN_IF_ERROR(Matrix(b + "attn_v.weight", s.dim, v_dim, type));
  if (!biases) return Status::Ok();
  RETURN_IF_ERROR(Vector(b + "attn_q.bias", q_dim, 0.0f, 0.5f));
  RETURN_IF_ERROR(Vector(b + "attn_k.bias", kv_dim, 0.0f, 0.5f));
  return Vector(b + "attn_v.bias", v_dim, 0.0f, 0.5f);
}

Status SynthWriter::Router(const std::string& b) { return Matrix(b + "ffn_gate_inp.weight", s.dim, s.num_experts, GgmlType::kF32); }

Status SynthWriter::Experts(const std::string& b) {
  RETURN_IF_ERROR(Matrix(b + "ffn_gate_exps.weight", s.dim, expert_ffn, expert_type, s.num_experts));
  RETURN_IF_ERROR(Matrix(b + "ffn_up_exps.weight", s.dim, expert_ffn, expert_type, s.num_experts));
  return Matrix(b + "ffn_down_exps.weight", expert_ffn, s.dim, expert_type, s.num_experts);
}

Status SynthWriter::BiasedExperts(const std::string& b) {
  RETURN_IF_ERROR(Router(b));
  RETURN_IF_ERROR(Vector(b + "exp_probs_b.bias", s.num_experts, 0.0f, 0.1f));
  RETURN_IF_ERROR(Experts(b));
  if (s.shared_experts > 0) {
    const int64_t shared = expert_ffn * s.shared_experts;
    RETURN_IF_ERROR(Matrix(b + "ffn_gate_shexp.weight", s.dim, shared, type));
    RETURN_IF_ERROR(Matrix(b + "ffn_up_shexp.weight", s.dim, shared, type));
    RETURN_IF_ERROR(Matrix(b + "ffn_down_shexp.weight", shared, s.dim, type));
  }
  return Status::Ok();
}

Status SynthWriter::GatedFfn(const std::string& b, int64_t width, const std::string& suffix) {
  RETURN_IF_ERROR(Matrix(b + "ffn_gate" + suffix + ".weight", s.dim, width, type));
  RETURN_IF_ERROR(Matrix(b + "ffn_up" + suffix + ".weight", s.dim, width, type));
  return Matrix(b + "ffn_down" + suffix + ".weight", width, s.dim, type);
}

Status SynthWriter::DecoderLayers(const DecoderLayout& o) {
  RETURN_IF_ERROR(Ones("output_norm.weight", s.dim));
  if (!o.tied_output) RETURN_IF_ERROR(Matrix("output.weight", s.dim, s.vocab_size, type));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    RETURN_IF_ERROR(Ones(b + "attn_norm.weight", s.dim));
    if (o.fused_qkv) {
      RETURN_IF_ERROR(Matrix(b + "attn_qkv.weight", s.dim, q_dim + kv_dim + v_dim, type));
    } else {
      RETURN_IF_ERROR(Qkv(b, o.qkv_bias));
    }
    if (o.qk_norm) {
      RETURN_IF_ERROR(Vector(b + "attn_q_norm.weight", head_dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(Vector(b + "attn_k_norm.weight", head_dim, 1.0f, 0.5f));
    }
    RETURN_IF_ERROR(Matrix(b + "attn_output.weight", o_dim, s.dim, type));
    if (o.post_norms) RETURN_IF_ERROR(Vector(b + "post_attention_norm.weight", s.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(Ones(b + "ffn_norm.weight", s.dim));
    if (s.num_experts > 0) {
      RETURN_IF_ERROR(Router(b));
      RETURN_IF_ERROR(Experts(b));
      continue;
    }
    if (o.fused_gate_up) {
      RETURN_IF_ERROR(Matrix(b + "ffn_up.weight", s.dim, 2 * s.ffn_dim, type));
      RETURN_IF_ERROR(Matrix(b + "ffn_down.weight", s.ffn_dim, s.dim, type));
    } else {
      RETURN_IF_ERROR(GatedFfn(b, s.ffn_dim));
    }
    if (o.post_norms) RETURN_IF_ERROR(Vector(b + "post_ffw_norm.weight", s.dim, 1.0f, 0.5f));
  }
  return Status::Ok();
}

StatusOr<GgufWriter> SynthesizeModel(const SynthShape& s, GgmlType type, uint64_t seed,
                                     const std::function<void(GgufWriter&)>& write_tokenizer) {
  const ArchSpec* arch = FindArchitecture(s.arch);
  if (arch == nullptr || arch->synth_write == nullptr) {
    std::vector<std::string> names;
    for (const ArchSpec* a : Architectures()) {
      if (a->synth_write != nullptr) names.emplace_back(a->name);
    }
    return InvalidArgument("synth: unknown architecture '{}' ({})", s.arch, fmt::join(names, ", "));
  }
  RETURN_IF_ERROR(CheckShape(s, *arch, type));
  if (arch->synth_check != nullptr) RETURN_IF_ERROR(arch->synth_check(s));
  GgufWriter out;
  SynthWriter w(s, type, seed, &out);
  if (!arch->latent_attention) RETURN_IF_ERROR(CheckHeads(w));
  const std::string& p = w.p;
  // The keys every architecture has; its writer adds its own and replaces these where it differs
  // (a replaced key keeps its place in the file).
  out.SetString("general.architecture", s.arch);
  out.SetString("general.name", "gale-synth-" + s.arch + "-" + s.name + "-" + std::string(TypeTraits(type).name));
  out.SetU32("general.file_type", LlamaFileType(type));
  out.SetU32(p + "context_length", static_cast<uint32_t>(s.context_length));
  out.SetU32(p + "embedding_length", static_cast<uint32_t>(s.dim));
  out.SetU32(p + "feed_forward_length", static_cast<uint32_t>(s.ffn_dim));
  out.SetU32(p + "attention.head_count", static_cast<uint32_t>(s.num_heads));
  out.SetU32(p + "attention.head_count_kv", static_cast<uint32_t>(s.num_kv_heads));
  out.SetU32(p + "block_count", static_cast<uint32_t>(s.num_layers));
  if (s.head_dim > 0 || w.v_head != w.head_dim) {
    out.SetU32(p + "attention.key_length", static_cast<uint32_t>(w.head_dim));
    out.SetU32(p + "attention.value_length", static_cast<uint32_t>(w.v_head));
  }
  out.SetU32(p + "rope.dimension_count", static_cast<uint32_t>(w.head_dim));
  out.SetF32(p + "attention.layer_norm_rms_epsilon", 1e-5f);
  out.SetF32(p + "rope.freq_base", 10000.0f);
  if (s.pooling_type > 0) out.SetU32(p + "pooling_type", static_cast<uint32_t>(s.pooling_type));
  out.SetU32(p + "vocab_size", static_cast<uint32_t>(s.vocab_size));
  if (s.num_experts > 0) {
    out.SetU32(p + "expert_count", static_cast<uint32_t>(s.num_experts));
    out.SetU32(p + "expert_used_count", static_cast<uint32_t>(s.experts_used));
  }
  if (s.yarn_factor > 0.0) {
    out.SetString(p + "rope.scaling.type", "yarn");
    out.SetF32(p + "rope.scaling.factor", static_cast<float>(s.yarn_factor));
    out.SetU32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(s.yarn_orig_ctx));
  }
  RETURN_IF_ERROR(w.Matrix("token_embd.weight", s.dim, s.vocab_size, type));
  RETURN_IF_ERROR(arch->synth_write(w));
  if (write_tokenizer) {
    write_tokenizer(out);
  } else {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    SynthVocab(s.vocab_size, &tokens, &scores, &types);
    // The architecture's control tokens (Phi-3's chat tokens) in the last ids.
    for (size_t i = 0; i < w.control_tokens.size(); ++i) {
      const size_t id = tokens.size() - w.control_tokens.size() + i;
      tokens[id] = w.control_tokens[i];
      types[id] = 3;
      scores[id] = 0.0f;
    }
    out.SetString("tokenizer.ggml.model", "llama");
    out.SetValue("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
    out.SetValue("tokenizer.ggml.scores", GgufValue::F32Array(scores));
    out.SetValue("tokenizer.ggml.token_type", GgufValue::I32Array(types));
    out.SetU32("tokenizer.ggml.unknown_token_id", 0);
    out.SetU32("tokenizer.ggml.bos_token_id", 1);
    out.SetU32("tokenizer.ggml.eos_token_id", 2);
    out.SetBool("tokenizer.ggml.add_bos_token", true);
    out.SetBool("tokenizer.ggml.add_eos_token", false);
  }
  for (const auto& [name, value] : s.keys) out.SetValue(p + name, value);
  return out;
}

}  // namespace gale
