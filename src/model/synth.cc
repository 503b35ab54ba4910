// Synthetic models: weights uniform in +-sqrt(3/fan_in) (unit-variance activations through the
// projections), norms 1. Each tensor's generator is seeded from the seed and the tensor name, so
// tensors are independent of write order.
#include "model/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/rng.h"
#include "model/rope_scaling.h"

namespace gale {
namespace {
constexpr uint32_t kGgmlTypeI32 = 26;  // ggml's GGML_TYPE_I32 (an index table, not a weight type)
}  // namespace

StatusOr<SynthShape> NamedSynthShape(const std::string& name) {
  SynthShape s;
  s.name = name;
  if (name == "110m") {
    s.dim = 768; s.num_layers = 12; s.num_heads = 12; s.num_kv_heads = 12; s.ffn_dim = 2048; s.vocab_size = 32000;
  } else if (name == "tinyllama-1.1b") {
    s.dim = 2048; s.num_layers = 22; s.num_heads = 32; s.num_kv_heads = 4; s.ffn_dim = 5632; s.vocab_size = 32000;
  } else if (name == "tiny") {
    s.dim = 128; s.num_layers = 2; s.num_heads = 4; s.num_kv_heads = 2; s.ffn_dim = 256; s.vocab_size = 2048;
    s.context_length = 512;
  } else if (name == "qwen2.5-0.5b") {
    s.arch = "qwen2";
    s.dim = 896; s.num_layers = 24; s.num_heads = 14; s.num_kv_heads = 2; s.ffn_dim = 4864; s.vocab_size = 151936;
    s.context_length = 32768;
  } else if (name == "phi3-mini") {
    s.arch = "phi3";
    s.dim = 3072; s.num_layers = 32; s.num_heads = 32; s.num_kv_heads = 32; s.ffn_dim = 8192; s.vocab_size = 32064;
    s.context_length = 4096;
  } else if (name == "gemma3-1b") {
    s.arch = "gemma3";
    s.dim = 1152; s.num_layers = 26; s.num_heads = 4; s.num_kv_heads = 1; s.head_dim = 256; s.ffn_dim = 6912;
    s.vocab_size = 262144; s.context_length = 32768; s.sliding_window = 512;
  } else if (name == "qwen3-0.6b") {
    s.arch = "qwen3";
    s.dim = 1024; s.num_layers = 28; s.num_heads = 16; s.num_kv_heads = 8; s.head_dim = 128; s.ffn_dim = 3072;
    s.vocab_size = 151936; s.context_length = 40960;
  } else if (name == "gpt-oss-20b") {
    s.arch = "gpt-oss";
    s.dim = 2880; s.num_layers = 12; s.num_heads = 64; s.num_kv_heads = 8; s.head_dim = 64; s.ffn_dim = 2880;
    s.vocab_size = 201088; s.context_length = 131072; s.sliding_window = 128;
    s.num_experts = 32; s.experts_used = 4; s.expert_ffn = 2880;
    s.yarn_factor = 32.0; s.yarn_orig_ctx = 4096;
    s.expert_type = GgmlType::kMXFP4;
  } else if (name == "qwen3-30b-a3b") {
    s.arch = "qwen3moe";
    s.dim = 2048; s.num_layers = 12; s.num_heads = 32; s.num_kv_heads = 4; s.head_dim = 128; s.ffn_dim = 6144;
    s.vocab_size = 151936; s.context_length = 40960;
    s.num_experts = 128; s.experts_used = 8; s.expert_ffn = 768;
  } else if (name == "deepseek-v4-flash") {
    // DeepSeek-V4-Flash's per-layer shapes (its config as llama.cpp reads it), 3 of its 43 layers:
    // a window-only layer, a ratio-4 layer with the indexer, a ratio-128 layer; the first routed
    // by token id. Experts MXFP4 (the release stores them as FP4).
    s.arch = "deepseek4";
    s.dim = 4096; s.num_layers = 3; s.num_heads = 64; s.num_kv_heads = 1; s.head_dim = 512; s.rope_dim = 64;
    s.q_lora_rank = 1024; s.sliding_window = 128; s.compress_ratios = {0, 4, 128}; s.hash_layers = 1;
    s.indexer_heads = 64; s.indexer_dim = 128; s.indexer_top_k = 512; s.out_groups = 8; s.out_lora_rank = 1024;
    s.ffn_dim = 2048; s.num_experts = 256; s.experts_used = 6; s.expert_ffn = 2048; s.shared_experts = 1;
    s.swiglu_clamp = 10.0f; s.vocab_size = 129280; s.context_length = 65536;
    s.expert_type = GgmlType::kMXFP4;
  } else if (name == "deepseek-v4.1-flash") {
    // DeepSeek-V4.1-Flash's per-layer shapes (its reference config), 2 of its 40 layers: a
    // window-only layer with Engram (as its layer 1) and a ratio-2 KV and index source with Engram
    // (as its layer 14). Engram: 8 heads of 256 per n-gram size up to 4, as the release; tables of
    // about 4M rows per layer instead of 384M (a token reads 24 rows either way). Experts MXFP4.
    s.arch = "deepseek41";
    s.dim = 5120; s.num_layers = 2; s.num_heads = 64; s.num_kv_heads = 1; s.head_dim = 512; s.rope_dim = 64;
    s.q_lora_rank = 1280; s.sliding_window = 128; s.compress_ratios = {0, 2};
    s.indexer_heads = 32; s.indexer_dim = 128; s.indexer_top_k = 512; s.out_groups = 8; s.out_lora_rank = 1024;
    s.engram_layers = {0, 1}; s.engram_heads = 8; s.engram_dim = 256; s.engram_ngram = 4; s.engram_rows = 170000;
    s.ffn_dim = 2304; s.num_experts = 384; s.experts_used = 6; s.expert_ffn = 2304; s.shared_experts = 1;
    s.swiglu_clamp = 10.0f; s.vocab_size = 129280; s.context_length = 65536;
    s.expert_type = GgmlType::kMXFP4;
  } else {
    return InvalidArgument("unknown model shape '{}' (known: 110m, tinyllama-1.1b, tiny, qwen2.5-0.5b, qwen3-0.6b, phi3-mini, gemma3-1b, qwen3-30b-a3b, gpt-oss-20b, deepseek-v4-flash, deepseek-v4.1-flash)", name);
  }
  return s;
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

StatusOr<GgufWriter> SynthesizeModel(const SynthShape& s, GgmlType type, uint64_t seed,
                                     const std::function<void(GgufWriter&)>& write_tokenizer) {
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3" && s.arch != "qwen3moe" && s.arch != "phi3" &&
      s.arch != "gemma2" && s.arch != "gemma3" && s.arch != "deepseek2" && s.arch != "deepseek4" && s.arch != "glm4moe" &&
      s.arch != "gpt-oss" && s.arch != "bert" && s.arch != "deepseek41") {
    return InvalidArgument("synth: unknown architecture '{}' (llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, deepseek2, deepseek4, "
                           "deepseek41, glm4moe, gpt-oss, bert)", s.arch);
  }
  const bool bert = s.arch == "bert";
  if (bert && (s.num_kv_heads != s.num_heads || s.num_experts > 0)) {
    return InvalidArgument("synth: bert has as many KV heads as heads and no experts");
  }
  const bool gpt = s.arch == "gpt-oss";
  const bool glm = s.arch == "glm4moe";
  if (glm && (s.nextn_layers < 0 || s.nextn_layers >= s.num_layers || s.leading_dense < 0 ||
              s.leading_dense > s.num_layers - s.nextn_layers || s.shared_experts < 0)) {
    return InvalidArgument("synth: glm4moe: {} layers with {} dense and {} nextn", s.num_layers, s.leading_dense, s.nextn_layers);
  }
  const bool mla = s.arch == "deepseek2";
  if (mla && (s.kv_lora_rank <= 0 || s.rope_dim <= 0 || s.rope_dim % 2 != 0 || s.nope_dim < 0 || s.v_head_dim <= 0 ||
              s.q_lora_rank < 0 || s.leading_dense < 0 || s.leading_dense > s.num_layers || s.shared_experts < 0)) {
    return InvalidArgument("synth: deepseek2 needs --kv-lora-rank, an even --rope-dim, --v-head-dim (and --nope-dim, --q-lora-rank)");
  }
  const bool ds41 = s.arch == "deepseek41";
  const bool ds4 = s.arch == "deepseek4" || ds41;  // and V4.1, which shares most of it
  if (ds4 && (s.q_lora_rank <= 0 || s.rope_dim <= 0 || s.rope_dim % 2 != 0 || s.head_dim < s.rope_dim ||
              s.num_kv_heads != 1 || s.sliding_window <= 0 || s.indexer_heads <= 0 || s.indexer_dim < s.rope_dim ||
              s.indexer_top_k <= 0 || s.out_groups <= 0 || s.num_heads % s.out_groups != 0 || s.out_lora_rank <= 0 ||
              s.hc_count != 4 || s.hash_layers < 0 || s.hash_layers > s.num_layers || s.shared_experts != 1)) {
    return InvalidArgument("synth: deepseek4 needs --q-lora-rank, an even --rope-dim, --head-dim >= it, one KV head, a "
                           "--window, the indexer's --indexer-heads/--indexer-dim/--indexer-top-k, --out-groups dividing the "
                           "heads, --out-lora-rank, one shared expert");
  }
  for (int64_t r : s.compress_ratios) {
    if (!ds41 && r != 0 && r != 4 && r != 128) return InvalidArgument("synth: deepseek4 compression ratios are 0, 4 or 128, not {}", r);
    if (ds41 && (r < 0 || (r > 2 && r % 4 != 0))) {
      return InvalidArgument("synth: deepseek41 compression ratios are 0, 1, 2 or multiples of 4, not {}", r);
    }
  }
  if (ds41 && !s.engram_layers.empty() &&
      (s.engram_heads <= 0 || s.engram_dim <= 0 || s.engram_ngram < 2 || s.engram_ngram > 8 || s.engram_rows <= 0)) {
    return InvalidArgument("synth: deepseek41's Engram needs --engram-heads, --engram-dim, --engram-ngram (2..8), --engram-rows");
  }
  if (ds41 && !s.engram_layers.empty() && s.engram_dim % TypeTraits(type).block_size != 0) {
    return InvalidArgument("synth: --engram-dim {} is not a multiple of {}'s block of {}", s.engram_dim,
                           TypeTraits(type).name, TypeTraits(type).block_size);
  }
  const bool moe = s.num_experts > 0;
  const int64_t expert_ffn = s.expert_ffn > 0 ? s.expert_ffn : s.ffn_dim;
  const GgmlType etype = s.expert_type.value_or(type);
  if (!CanQuantize(etype) || s.dim % TypeTraits(etype).block_size != 0 || expert_ffn % TypeTraits(etype).block_size != 0) {
    return InvalidArgument("synth: cannot write the experts as {} (dim {}, expert width {})", TypeTraits(etype).name, s.dim,
                           expert_ffn);
  }
  if (s.arch == "qwen3moe" && !moe) return InvalidArgument("synth: qwen3moe needs experts (--experts, --experts-used)");
  if ((mla || glm || gpt || ds4) && !moe) return InvalidArgument("synth: {} needs experts (--experts, --experts-used)", s.arch);
  if (moe && (s.arch != "llama" && s.arch != "qwen3moe" && !mla && !glm && !gpt && !ds4)) {
    return InvalidArgument("synth: experts are written for llama (Mixtral-style), qwen3moe, deepseek2, glm4moe and gpt-oss only");
  }
  if (s.expert_groups > 1 && (s.num_experts % s.expert_groups != 0 || s.groups_used <= 0 || s.groups_used > s.expert_groups)) {
    return InvalidArgument("synth: {} expert groups (using {}) must divide {} experts", s.expert_groups, s.groups_used, s.num_experts);
  }
  if (moe && (s.experts_used <= 0 || s.experts_used > s.num_experts || s.num_experts > 4096)) {
    return InvalidArgument("synth: {} experts with {} used per token", s.num_experts, s.experts_used);
  }
  if (s.dim <= 0 || s.num_heads <= 0 || (s.head_dim == 0 && s.dim % s.num_heads != 0) || s.num_kv_heads <= 0 ||
      s.head_dim < 0 || s.head_dim % 2 != 0 || (!mla && (s.v_head_dim < 0 || s.v_head_dim % 2 != 0)) ||
      (s.num_heads % s.num_kv_heads != 0 && s.arch != "deepseek2") || s.num_layers <= 0 || s.ffn_dim <= 0 || s.vocab_size < 260) {
    return InvalidArgument("synth: inconsistent shape (dim {}, heads {}, kv heads {}, layers {}, ffn {}, vocab {} >= 260)",
                           s.dim, s.num_heads, s.num_kv_heads, s.num_layers, s.ffn_dim, s.vocab_size);
  }
  if (!CanQuantize(type)) {
    return InvalidArgument("synth: cannot write {} yet (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q6_K, iq4_nl, iq4_xs, gale's w4 types)", TypeTraits(type).name);
  }
  const int64_t block = TypeTraits(type).block_size;
  if (s.dim % block != 0 || s.ffn_dim % block != 0) {
    return InvalidArgument("synth: dim {} and ffn {} must be multiples of the {} block size {}", s.dim, s.ffn_dim,
                           TypeTraits(type).name, block);
  }
  const int64_t head_dim = mla ? s.kv_lora_rank + s.rope_dim : s.head_dim > 0 ? s.head_dim : s.dim / s.num_heads;
  const int64_t q_dim = head_dim * s.num_heads;
  const int64_t kv_dim = head_dim * s.num_kv_heads;
  // V's head size where it differs (v_head_dim outside latent attention): V's rows and the
  // output projection's input.
  const int64_t v_head = !mla && s.v_head_dim > 0 ? s.v_head_dim : head_dim;
  const int64_t v_dim = v_head * s.num_kv_heads, o_dim = v_head * s.num_heads;
  const bool qwen = s.arch == "qwen2" || s.arch == "qwen3" || s.arch == "qwen3moe";
  if (moe && expert_ffn % block != 0) {
    return InvalidArgument("synth: the expert width {} must be a multiple of the {} block size {}", expert_ffn,
                           TypeTraits(type).name, block);
  }
  const bool gemma = s.arch == "gemma3" || s.arch == "gemma2";
  if ((q_dim % block != 0 || o_dim % block != 0) && !mla) {
    return InvalidArgument("synth: heads x head size {} (V: {}) must be a multiple of the {} block size {}", q_dim,
                           o_dim, TypeTraits(type).name, block);
  }
  GgufWriter w;
  const std::string p = s.arch + ".";
  w.SetString("general.architecture", s.arch);
  w.SetString("general.name", "gale-synth-" + (s.arch == "llama" ? "" : s.arch + "-") + s.name + "-" + std::string(TypeTraits(type).name));
  w.SetU32("general.file_type", LlamaFileType(type));
  w.SetU32(p + "context_length", static_cast<uint32_t>(s.context_length));
  w.SetU32(p + "embedding_length", static_cast<uint32_t>(s.dim));
  w.SetU32(p + "feed_forward_length", static_cast<uint32_t>(s.ffn_dim));
  w.SetU32(p + "attention.head_count", static_cast<uint32_t>(s.num_heads));
  w.SetU32(p + "attention.head_count_kv", static_cast<uint32_t>(mla ? 1 : s.num_kv_heads));
  w.SetU32(p + "block_count", static_cast<uint32_t>(s.num_layers));
  if (mla) {  // llama.cpp's MLA format: the cache row is the key, its latent part the value
    w.SetU32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.SetU32(p + "attention.value_length", static_cast<uint32_t>(s.kv_lora_rank));
    w.SetU32(p + "attention.key_length_mla", static_cast<uint32_t>(s.nope_dim + s.rope_dim));
    w.SetU32(p + "attention.value_length_mla", static_cast<uint32_t>(s.v_head_dim));
    w.SetU32(p + "attention.kv_lora_rank", static_cast<uint32_t>(s.kv_lora_rank));
    if (s.q_lora_rank > 0) w.SetU32(p + "attention.q_lora_rank", static_cast<uint32_t>(s.q_lora_rank));
    w.SetU32(p + "leading_dense_block_count", static_cast<uint32_t>(s.leading_dense));
    w.SetU32(p + "expert_shared_count", static_cast<uint32_t>(s.shared_experts));
    w.SetF32(p + "expert_weights_scale", 2.5f);
    w.SetBool(p + "expert_weights_norm", true);
    w.SetU32(p + "expert_gating_func", 2);  // sigmoid
    if (s.expert_groups > 1) {
      w.SetU32(p + "expert_group_count", static_cast<uint32_t>(s.expert_groups));
      w.SetU32(p + "expert_group_used_count", static_cast<uint32_t>(s.groups_used));
    }
  } else if (s.head_dim > 0 || v_head != head_dim) {
    w.SetU32(p + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.SetU32(p + "attention.value_length", static_cast<uint32_t>(v_head));
  }
  if (glm) {
    w.SetU32(p + "leading_dense_block_count", static_cast<uint32_t>(s.leading_dense));
    w.SetU32(p + "expert_shared_count", static_cast<uint32_t>(s.shared_experts));
    w.SetF32(p + "expert_weights_scale", 1.5f);
    w.SetBool(p + "expert_weights_norm", true);
    w.SetU32(p + "expert_gating_func", 2);  // sigmoid
    w.SetU32(p + "nextn_predict_layers", static_cast<uint32_t>(s.nextn_layers));
  }
  const int64_t rope_dims = mla || ds4 ? s.rope_dim : glm ? (s.rope_dim > 0 ? s.rope_dim : head_dim / 2) : head_dim;
  w.SetU32(p + "rope.dimension_count", static_cast<uint32_t>(rope_dims));
  // Qwen's own values (rms epsilon 1e-6, RoPE base 1e6); llama's defaults otherwise.
  w.SetF32(p + "attention.layer_norm_rms_epsilon", qwen || gemma || glm || ds4 ? 1e-6f : 1e-5f);
  w.SetF32(p + "rope.freq_base", qwen || gemma || glm ? 1000000.0f : gpt ? 150000.0f : 10000.0f);
  if (s.pooling_type > 0 || bert) w.SetU32(p + "pooling_type", static_cast<uint32_t>(s.pooling_type > 0 ? s.pooling_type : 1));
  if (bert) {  // an encoder: LayerNorm's epsilon, bidirectional attention, two token types
    w.SetF32(p + "attention.layer_norm_epsilon", 1e-12f);
    w.SetBool(p + "attention.causal", false);
    w.SetU32("tokenizer.ggml.token_type_count", 2);
  }
  // The window: Gemma's and gpt-oss's always (512, 128 unless set), a llama file's when set.
  const int64_t window = s.sliding_window > 0 ? s.sliding_window : gemma ? 512 : gpt ? 128 : 0;
  if ((gemma || gpt || s.arch == "llama") && window > 0) w.SetU32(p + "attention.sliding_window", static_cast<uint32_t>(window));
  if (s.arch == "gemma2") {
    w.SetF32(p + "attn_logit_softcapping", s.attn_softcap);
    w.SetF32(p + "final_logit_softcapping", s.final_softcap);
  }
  w.SetU32(p + "vocab_size", static_cast<uint32_t>(s.vocab_size));
  if (moe) {
    w.SetU32(p + "expert_count", static_cast<uint32_t>(s.num_experts));
    w.SetU32(p + "expert_used_count", static_cast<uint32_t>(s.experts_used));
    if (s.arch == "qwen3moe" || mla || glm || gpt || ds4) w.SetU32(p + "expert_feed_forward_length", static_cast<uint32_t>(expert_ffn));
  }
  if (s.yarn_factor > 0.0) {
    if (s.yarn_orig_ctx <= 0) return InvalidArgument("synth: YaRN needs the original context length");
    w.SetString(p + "rope.scaling.type", "yarn");
    w.SetF32(p + "rope.scaling.factor", static_cast<float>(s.yarn_factor));
    w.SetU32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(s.yarn_orig_ctx));
    if (mla) w.SetF32(p + "rope.scaling.yarn_log_multiplier", 0.1f);  // DeepSeek-V3's converter: 0.1 * mscale_all_dim
  }
  // DeepSeek-V4's keys (as llama.cpp's loader reads them): per-layer compression ratios, the
  // indexer, the grouped low-rank output, hyper-connections, hash routing, sqrt-softplus scores.
  auto ratio_of = [&](int64_t l) -> int64_t {
    if (s.compress_ratios.empty()) return 0;
    return s.compress_ratios[std::min<size_t>(static_cast<size_t>(l), s.compress_ratios.size() - 1)];
  };
  if (ds4) {
    w.SetU32(p + "attention.q_lora_rank", static_cast<uint32_t>(s.q_lora_rank));
    w.SetU32(p + "attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
    w.SetU32(p + "expert_shared_count", static_cast<uint32_t>(s.shared_experts));
    w.SetF32(p + "expert_weights_scale", 1.5f);
    w.SetBool(p + "expert_weights_norm", true);
    w.SetU32(p + "expert_gating_func", 4);  // sqrt(softplus)
    std::vector<float> clamp(s.num_layers, s.swiglu_clamp);
    w.SetValue(p + "swiglu_clamp_exp", GgufValue::F32Array(clamp));
    w.SetU32(p + "attention.indexer.head_count", static_cast<uint32_t>(s.indexer_heads));
    w.SetU32(p + "attention.indexer.key_length", static_cast<uint32_t>(s.indexer_dim));
    w.SetU32(p + "attention.indexer.top_k", static_cast<uint32_t>(s.indexer_top_k));
    if (ds41 && s.candidate_layer >= 0) {
      w.SetU32(p + "attention.indexer.candidate_source_layer", static_cast<uint32_t>(s.candidate_layer));
      w.SetU32(p + "attention.indexer.candidate_top_k_blocks", static_cast<uint32_t>(s.candidate_blocks));
      w.SetU32(p + "attention.indexer.candidate_block_size", static_cast<uint32_t>(s.candidate_block_size));
    }
    w.SetU32(p + "attention.output_group_count", static_cast<uint32_t>(s.out_groups));
    w.SetU32(p + "attention.output_lora_rank", static_cast<uint32_t>(s.out_lora_rank));
    w.SetF32(p + "attention.compress_rope_freq_base", 160000.0f);
    w.SetU32(p + "hyper_connection.count", static_cast<uint32_t>(s.hc_count));
    w.SetU32(p + "hyper_connection.sinkhorn_iterations", 20);
    w.SetF32(p + "hyper_connection.epsilon", 1e-6f);
    w.SetU32(p + "hash_layer_count", static_cast<uint32_t>(s.hash_layers));
    std::vector<int32_t> ratios(s.num_layers);
    for (int64_t l = 0; l < s.num_layers; ++l) ratios[l] = static_cast<int32_t>(ratio_of(l));
    w.SetValue(p + "attention.compress_ratios", GgufValue::I32Array(ratios));
  }
  // DeepSeek-V4.1's roles and Engram constants (as llama.cpp's deepseek41 port reads them): the
  // multipliers odd, each head's bucket a distinct prime from about engram_rows up, the buckets of
  // a layer's table side by side; the token map folds the top quarter of the vocab onto the rest.
  std::vector<int64_t> sources = s.kv_source_layers, pickers = s.index_source_layers;
  std::vector<std::vector<uint64_t>> eng_primes;  // per site
  if (ds41) {
    if (sources.empty()) {
      for (int64_t l = 0; l < s.num_layers; ++l) {
        if (ratio_of(l) != 0 && (l == 0 || ratio_of(l - 1) != ratio_of(l))) sources.push_back(l);
      }
    }
    if (pickers.empty()) pickers = sources;
    if (!s.engram_layers.empty()) {
      const int64_t cols = (s.engram_ngram - 1) * s.engram_heads;
      auto is_prime = [](uint64_t v) {
        if (v < 2) return false;
        for (uint64_t d = 2; d * d <= v; ++d) {
          if (v % d == 0) return false;
        }
        return true;
      };
      std::vector<GgufValue> ids, mult, primes, offsets, map;
      uint64_t candidate = static_cast<uint64_t>(s.engram_rows);
      Rng rng(seed ^ 0x5eed5eedull);
      for (int64_t e = 0; e < static_cast<int64_t>(s.engram_layers.size()); ++e) {
        ids.push_back(GgufValue::U32(static_cast<uint32_t>(s.engram_layers[e])));
        for (int64_t k = 0; k < s.engram_ngram; ++k) {
          mult.push_back(GgufValue::U64(2 * static_cast<uint64_t>(rng.Uniform(0.0f, 1.0f) * (1 << 20)) + 1));
        }
        uint64_t offset = 0;
        eng_primes.emplace_back();
        for (int64_t c = 0; c < cols; ++c) {
          do ++candidate; while (!is_prime(candidate));
          primes.push_back(GgufValue::U64(candidate));
          offsets.push_back(GgufValue::U64(offset));
          eng_primes.back().push_back(candidate);
          offset += candidate;
        }
      }
      const int64_t folded = std::max<int64_t>(3, s.vocab_size - s.vocab_size / 4);
      for (int64_t t = 0; t < s.vocab_size; ++t) map.push_back(GgufValue::U32(static_cast<uint32_t>(t % folded)));
      w.SetValue(p + "engram.layer_ids", GgufValue::Array(GgufValueType::kUint32, std::move(ids)));
      w.SetU32(p + "engram.head_count", static_cast<uint32_t>(s.engram_heads));
      w.SetU32(p + "engram.key_length", static_cast<uint32_t>(s.engram_dim));
      w.SetU32(p + "engram.max_ngram_size", static_cast<uint32_t>(s.engram_ngram));
      w.SetU32(p + "engram.pad_id", 2);
      w.SetValue(p + "engram.multipliers", GgufValue::Array(GgufValueType::kUint64, std::move(mult)));
      w.SetValue(p + "engram.primes", GgufValue::Array(GgufValueType::kUint64, std::move(primes)));
      w.SetValue(p + "engram.offsets", GgufValue::Array(GgufValueType::kUint64, std::move(offsets)));
      w.SetValue(p + "engram.token_map", GgufValue::Array(GgufValueType::kUint32, std::move(map)));
    }
  }
  auto listed = [](const std::vector<int64_t>& v, int64_t l) { return std::find(v.begin(), v.end(), l) != v.end(); };
  if (write_tokenizer) {
    write_tokenizer(w);
  } else {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t> types;
    SynthVocab(s.vocab_size, &tokens, &scores, &types);
    if (s.arch == "phi3") {
      // Phi-3's chat control tokens in the last ids (llama.cpp's loader looks some of them up).
      const char* specials[] = {"<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"};
      for (size_t i = 0; i < std::size(specials); ++i) {
        const size_t id = tokens.size() - std::size(specials) + i;
        tokens[id] = specials[i];
        types[id] = 3;
        scores[id] = 0.0f;
      }
    }
    w.SetString("tokenizer.ggml.model", "llama");
    w.SetValue("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
    w.SetValue("tokenizer.ggml.scores", GgufValue::F32Array(scores));
    w.SetValue("tokenizer.ggml.token_type", GgufValue::I32Array(types));
    w.SetU32("tokenizer.ggml.unknown_token_id", 0);
    w.SetU32("tokenizer.ggml.bos_token_id", 1);
    w.SetU32("tokenizer.ggml.eos_token_id", 2);
    w.SetBool("tokenizer.ggml.add_bos_token", true);
    w.SetBool("tokenizer.ggml.add_eos_token", false);
  }
  for (const auto& [name, value] : s.keys) w.SetValue(p + name, value);

  // experts > 0: a 3-D tensor of that many matrices, one after the other.
  auto matrix = [&](const std::string& name, int64_t in, int64_t out, GgmlType t, int64_t experts = 0) {
    uint64_t tensor_seed = seed ^ 0xcbf29ce484222325ull;  // FNV-1a over the name: portable
    for (char ch : name) tensor_seed = (tensor_seed ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
    std::vector<int64_t> shape = {in, out};
    if (experts > 0) shape.push_back(experts);
    const int64_t rows = out * std::max<int64_t>(experts, 1);
    return w.AddTensor(name, static_cast<uint32_t>(t), shape, [in, rows, t, tensor_seed](uint8_t* dst, uint64_t) {
      Rng rng(tensor_seed);
      const float a = std::sqrt(3.0f / static_cast<float>(in));
      std::vector<float> row(in);
      const int64_t row_bytes = RowBytes(t, in);
      for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = rng.Uniform(-a, a);
        QuantizeRowRef(t, row.data(), dst + r * row_bytes, in);
      }
    });
  };
  // An f32 tensor of base + uniform(-spread, spread) (norm weights 1, or around 1 where a test
  // should see that each element is applied to its own channel; biases around 0), one-dimensional
  // of n, or [n, rows] (gpt-oss's expert biases: a row per expert).
  auto vector = [&](const std::string& name, int64_t n, float base, float spread, int64_t rows = 0) {
    uint64_t tensor_seed = seed ^ 0x84222325cbf29ce4ull;
    for (char ch : name) tensor_seed = (tensor_seed ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
    Rng rng(tensor_seed);
    std::vector<float> v(n * std::max<int64_t>(rows, 1));
    for (float& x : v) x = base + (spread > 0.0f ? rng.Uniform(-spread, spread) : 0.0f);
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    std::vector<int64_t> shape = {n};
    if (rows > 0) shape.push_back(rows);
    return w.AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), shape, std::move(bytes));
  };
  auto ones = [&](const std::string& name, int64_t n) { return vector(name, n, 1.0f, 0.0f); };
  // Q, K and V with their biases (glm4moe, gpt-oss).
  auto biased_qkv = [&](const std::string& b) -> Status {
    RETURN_IF_ERROR(matrix(b + "attn_q.weight", s.dim, q_dim, type));
    RETURN_IF_ERROR(matrix(b + "attn_k.weight", s.dim, kv_dim, type));
    RETURN_IF_ERROR(matrix(b + "attn_v.weight", s.dim, v_dim, type));
    RETURN_IF_ERROR(vector(b + "attn_q.bias", q_dim, 0.0f, 0.5f));
    RETURN_IF_ERROR(vector(b + "attn_k.bias", kv_dim, 0.0f, 0.5f));
    return vector(b + "attn_v.bias", v_dim, 0.0f, 0.5f);
  };
  // DeepSeek-V3's and GLM's mixture: the f32 router, the selection bias, the experts, the shared ones.
  auto biased_experts = [&](const std::string& b) -> Status {
    RETURN_IF_ERROR(matrix(b + "ffn_gate_inp.weight", s.dim, s.num_experts, GgmlType::kF32));
    RETURN_IF_ERROR(vector(b + "exp_probs_b.bias", s.num_experts, 0.0f, 0.1f));
    RETURN_IF_ERROR(matrix(b + "ffn_gate_exps.weight", s.dim, expert_ffn, etype, s.num_experts));
    RETURN_IF_ERROR(matrix(b + "ffn_up_exps.weight", s.dim, expert_ffn, etype, s.num_experts));
    RETURN_IF_ERROR(matrix(b + "ffn_down_exps.weight", expert_ffn, s.dim, etype, s.num_experts));
    if (s.shared_experts > 0) {
      const int64_t shared = expert_ffn * s.shared_experts;
      RETURN_IF_ERROR(matrix(b + "ffn_gate_shexp.weight", s.dim, shared, type));
      RETURN_IF_ERROR(matrix(b + "ffn_up_shexp.weight", s.dim, shared, type));
      RETURN_IF_ERROR(matrix(b + "ffn_down_shexp.weight", shared, s.dim, type));
    }
    return Status::Ok();
  };
  RETURN_IF_ERROR(matrix("token_embd.weight", s.dim, s.vocab_size, type));
  if (bert) {
    // Learned positions and token types (f32, as llama.cpp's converter keeps them), the input's
    // LayerNorm, and post-norm layers with biases everywhere; no output norm or head.
    RETURN_IF_ERROR(matrix("position_embd.weight", s.dim, s.context_length, GgmlType::kF32));
    RETURN_IF_ERROR(matrix("token_types.weight", s.dim, 2, GgmlType::kF32));
    RETURN_IF_ERROR(vector("token_embd_norm.weight", s.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(vector("token_embd_norm.bias", s.dim, 0.0f, 0.5f));
    for (int64_t l = 0; l < s.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      RETURN_IF_ERROR(matrix(b + "attn_q.weight", s.dim, q_dim, type));
      RETURN_IF_ERROR(matrix(b + "attn_k.weight", s.dim, kv_dim, type));
      RETURN_IF_ERROR(matrix(b + "attn_v.weight", s.dim, v_dim, type));
      RETURN_IF_ERROR(vector(b + "attn_q.bias", q_dim, 0.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "attn_k.bias", kv_dim, 0.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "attn_v.bias", v_dim, 0.0f, 0.5f));
      RETURN_IF_ERROR(matrix(b + "attn_output.weight", o_dim, s.dim, type));
      RETURN_IF_ERROR(vector(b + "attn_output.bias", s.dim, 0.0f, 0.2f));
      RETURN_IF_ERROR(vector(b + "attn_output_norm.weight", s.dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "attn_output_norm.bias", s.dim, 0.0f, 0.2f));
      RETURN_IF_ERROR(matrix(b + "ffn_up.weight", s.dim, s.ffn_dim, type));
      RETURN_IF_ERROR(vector(b + "ffn_up.bias", s.ffn_dim, 0.0f, 0.5f));
      RETURN_IF_ERROR(matrix(b + "ffn_down.weight", s.ffn_dim, s.dim, type));
      RETURN_IF_ERROR(vector(b + "ffn_down.bias", s.dim, 0.0f, 0.2f));
      RETURN_IF_ERROR(vector(b + "layer_output_norm.weight", s.dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "layer_output_norm.bias", s.dim, 0.0f, 0.2f));
    }
    return w;
  }
  if (ds4) {
    // Norm weights around 1 and small biases, so that each element visibly reaches its channel;
    // the hyper-connections' scales and bases small enough that the Sinkhorn mix is not a
    // permutation; the hash routing table a fixed function of the token id.
    const int64_t hc = s.hc_count, mix = (2 + hc) * hc, qk = head_dim;
    RETURN_IF_ERROR(vector("output_norm.weight", s.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(matrix("output.weight", s.dim, s.vocab_size, type));
    if (!ds41) {  // V4.1 collapses with the last FFN's mix
      RETURN_IF_ERROR(matrix("output_hc_fn.weight", hc * s.dim, hc, GgmlType::kF32));
      RETURN_IF_ERROR(vector("output_hc_base.weight", hc, 0.0f, 0.5f));
      RETURN_IF_ERROR(vector("output_hc_scale.weight", 1, 0.5f, 0.2f));
    }
    for (int64_t l = 0; l < s.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const int64_t ratio = ratio_of(l);
      RETURN_IF_ERROR(vector(b + "attn_norm.weight", s.dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "attn_sinks.weight", s.num_heads, 0.0f, 2.0f));
      RETURN_IF_ERROR(matrix(b + "attn_q_a.weight", s.dim, s.q_lora_rank, type));
      RETURN_IF_ERROR(vector(b + "attn_q_a_norm.weight", s.q_lora_rank, 1.0f, 0.5f));
      RETURN_IF_ERROR(matrix(b + "attn_q_b.weight", s.q_lora_rank, s.num_heads * qk, type));
      RETURN_IF_ERROR(matrix(b + "attn_kv.weight", s.dim, qk, type));
      RETURN_IF_ERROR(vector(b + "attn_kv_a_norm.weight", qk, 1.0f, 0.5f));
      // f32: llama.cpp's CPU backend (the prebuilt release the tests compare with) runs its
      // grouped product of this matrix on f32 only (q8_0 and f16 fail its scheduler's assert).
      // (V4.1, which that llama.cpp cannot run: the file's type.)
      RETURN_IF_ERROR(matrix(b + "attn_output_a.weight", s.num_heads * qk / s.out_groups, s.out_lora_rank * s.out_groups,
                             ds41 ? type : GgmlType::kF32));
      RETURN_IF_ERROR(matrix(b + "attn_output_b.weight", s.out_groups * s.out_lora_rank, s.dim, type));
      for (const char* sub : {"attn", "ffn"}) {
        RETURN_IF_ERROR(matrix(b + "hc_" + sub + "_fn.weight", hc * s.dim, mix, GgmlType::kF32));
        RETURN_IF_ERROR(vector(b + "hc_" + sub + "_base.weight", mix, 0.0f, 0.5f));
        RETURN_IF_ERROR(vector(b + "hc_" + sub + "_scale.weight", 3, 0.5f, 0.2f));
      }
      if (ds41) {
        if (listed(sources, l) && ratio != 0) {  // a KV source: compressor and index keys
          RETURN_IF_ERROR(matrix(b + "attn_compressor_kv.weight", s.dim, qk, type));
          if (ratio != 1) RETURN_IF_ERROR(matrix(b + "attn_compressor_gate.weight", s.dim, qk, type));
          RETURN_IF_ERROR(vector(b + "attn_compressor_norm.weight", qk, 1.0f, 0.5f));
          RETURN_IF_ERROR(matrix(b + "indexer.attn_k.weight", qk, s.indexer_dim, type));
          RETURN_IF_ERROR(vector(b + "indexer.k_norm.weight", s.indexer_dim, 1.0f, 0.5f));
        }
        if (listed(pickers, l) && ratio != 0) {
          RETURN_IF_ERROR(matrix(b + "indexer.proj.weight", s.dim, s.indexer_heads, type));
          RETURN_IF_ERROR(matrix(b + "indexer.attn_q_b.weight", s.q_lora_rank, s.indexer_heads * s.indexer_dim, type));
        }
        const auto site = std::find(s.engram_layers.begin(), s.engram_layers.end(), l);
        if (site != s.engram_layers.end()) {
          const std::vector<uint64_t>& pr = eng_primes[site - s.engram_layers.begin()];
          int64_t rows = 0;
          for (uint64_t v : pr) rows += static_cast<int64_t>(v);
          const int64_t cols = (s.engram_ngram - 1) * s.engram_heads;
          RETURN_IF_ERROR(matrix(b + "engram_embd.weight", s.engram_dim, rows, type));
          RETURN_IF_ERROR(matrix(b + "engram_wkv.weight", cols * s.engram_dim, (hc + 1) * s.dim, type));
          RETURN_IF_ERROR(vector(b + "engram_q.weight", s.dim, 1.0f, 0.5f, hc));
          RETURN_IF_ERROR(vector(b + "engram_k.weight", s.dim, 1.0f, 0.5f, hc));
        }
      } else if (ratio != 0) {
        const int64_t coff = ratio == 4 ? 2 : 1;
        RETURN_IF_ERROR(matrix(b + "attn_compressor_kv.weight", s.dim, coff * qk, type));
        RETURN_IF_ERROR(matrix(b + "attn_compressor_gate.weight", s.dim, coff * qk, type));
        RETURN_IF_ERROR(matrix(b + "attn_compressor_ape.weight", coff * qk, ratio, GgmlType::kF32));
        RETURN_IF_ERROR(vector(b + "attn_compressor_norm.weight", qk, 1.0f, 0.5f));
      }
      if (!ds41 && ratio == 4) {
        RETURN_IF_ERROR(matrix(b + "indexer.proj.weight", s.dim, s.indexer_heads, type));
        RETURN_IF_ERROR(matrix(b + "indexer.attn_q_b.weight", s.q_lora_rank, s.indexer_heads * s.indexer_dim, type));
        RETURN_IF_ERROR(matrix(b + "indexer_compressor_kv.weight", s.dim, 2 * s.indexer_dim, type));
        RETURN_IF_ERROR(matrix(b + "indexer_compressor_gate.weight", s.dim, 2 * s.indexer_dim, type));
        RETURN_IF_ERROR(matrix(b + "indexer_compressor_ape.weight", 2 * s.indexer_dim, ratio, GgmlType::kF32));
        RETURN_IF_ERROR(vector(b + "indexer_compressor_norm.weight", s.indexer_dim, 1.0f, 0.5f));
      }
      RETURN_IF_ERROR(vector(b + "ffn_norm.weight", s.dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(matrix(b + "ffn_gate_inp.weight", s.dim, s.num_experts, GgmlType::kF32));
      if (l < s.hash_layers) {
        // [num_used, vocab] i32: token t's experts, distinct, from a per-layer stride.
        std::vector<int32_t> ids(static_cast<size_t>(s.experts_used * s.vocab_size));
        for (int64_t t = 0; t < s.vocab_size; ++t) {
          for (int64_t k = 0; k < s.experts_used; ++k) {
            ids[t * s.experts_used + k] = static_cast<int32_t>((t * (2 * l + 3) + k) % s.num_experts);
          }
        }
        std::vector<uint8_t> bytes(ids.size() * 4);
        std::memcpy(bytes.data(), ids.data(), bytes.size());
        RETURN_IF_ERROR(w.AddTensor(b + "ffn_gate_tid2eid.weight", kGgmlTypeI32,
                                    {s.experts_used, s.vocab_size}, std::move(bytes)));
      } else {
        RETURN_IF_ERROR(vector(b + "exp_probs_b.bias", s.num_experts, 0.0f, 0.1f));
      }
      RETURN_IF_ERROR(matrix(b + "ffn_gate_exps.weight", s.dim, expert_ffn, etype, s.num_experts));
      RETURN_IF_ERROR(matrix(b + "ffn_up_exps.weight", s.dim, expert_ffn, etype, s.num_experts));
      RETURN_IF_ERROR(matrix(b + "ffn_down_exps.weight", expert_ffn, s.dim, etype, s.num_experts));
      RETURN_IF_ERROR(matrix(b + "ffn_gate_shexp.weight", s.dim, expert_ffn, type));
      RETURN_IF_ERROR(matrix(b + "ffn_up_shexp.weight", s.dim, expert_ffn, type));
      RETURN_IF_ERROR(matrix(b + "ffn_down_shexp.weight", expert_ffn, s.dim, type));
    }
    return w;
  }
  RETURN_IF_ERROR(ones("output_norm.weight", s.dim));
  if (!gemma) RETURN_IF_ERROR(matrix("output.weight", s.dim, s.vocab_size, type));  // Gemma ties it
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    RETURN_IF_ERROR(ones(b + "attn_norm.weight", s.dim));
    if (mla) {
      const int64_t qk = s.nope_dim + s.rope_dim;
      if (s.q_lora_rank > 0) {
        RETURN_IF_ERROR(matrix(b + "attn_q_a.weight", s.dim, s.q_lora_rank, type));
        RETURN_IF_ERROR(vector(b + "attn_q_a_norm.weight", s.q_lora_rank, 1.0f, 0.5f));
        RETURN_IF_ERROR(matrix(b + "attn_q_b.weight", s.q_lora_rank, s.num_heads * qk, type));
      } else {
        RETURN_IF_ERROR(matrix(b + "attn_q.weight", s.dim, s.num_heads * qk, type));
      }
      RETURN_IF_ERROR(matrix(b + "attn_kv_a_mqa.weight", s.dim, head_dim, type));
      RETURN_IF_ERROR(vector(b + "attn_kv_a_norm.weight", s.kv_lora_rank, 1.0f, 0.5f));
      RETURN_IF_ERROR(matrix(b + "attn_k_b.weight", s.nope_dim, s.kv_lora_rank, type, s.num_heads));
      RETURN_IF_ERROR(matrix(b + "attn_v_b.weight", s.kv_lora_rank, s.v_head_dim, type, s.num_heads));
      RETURN_IF_ERROR(matrix(b + "attn_output.weight", s.num_heads * s.v_head_dim, s.dim, type));
      RETURN_IF_ERROR(ones(b + "ffn_norm.weight", s.dim));
      if (l < s.leading_dense) {
        RETURN_IF_ERROR(matrix(b + "ffn_gate.weight", s.dim, s.ffn_dim, type));
        RETURN_IF_ERROR(matrix(b + "ffn_up.weight", s.dim, s.ffn_dim, type));
        RETURN_IF_ERROR(matrix(b + "ffn_down.weight", s.ffn_dim, s.dim, type));
        continue;
      }
      RETURN_IF_ERROR(biased_experts(b));
      continue;
    }
    if (glm) {
      RETURN_IF_ERROR(biased_qkv(b));
      RETURN_IF_ERROR(vector(b + "attn_q_norm.weight", head_dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "attn_k_norm.weight", head_dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(matrix(b + "attn_output.weight", o_dim, s.dim, type));
      RETURN_IF_ERROR(vector(b + "post_attention_norm.weight", s.dim, 1.0f, 0.5f));
      if (l < s.leading_dense) {
        RETURN_IF_ERROR(matrix(b + "ffn_gate.weight", s.dim, s.ffn_dim, type));
        RETURN_IF_ERROR(matrix(b + "ffn_up.weight", s.dim, s.ffn_dim, type));
        RETURN_IF_ERROR(matrix(b + "ffn_down.weight", s.ffn_dim, s.dim, type));
      } else {
        RETURN_IF_ERROR(biased_experts(b));
      }
      if (l >= s.num_layers - s.nextn_layers) {  // multi-token prediction: never run
        RETURN_IF_ERROR(matrix(b + "nextn.eh_proj.weight", 2 * s.dim, s.dim, type));
        RETURN_IF_ERROR(ones(b + "nextn.enorm.weight", s.dim));
        RETURN_IF_ERROR(ones(b + "nextn.hnorm.weight", s.dim));
        RETURN_IF_ERROR(ones(b + "nextn.shared_head_norm.weight", s.dim));
      }
      continue;
    }
    if (gpt) {
      // Biases everywhere, a sink logit per query head, the FFN norm as post_attention_norm, and
      // the router's and every expert's biases.
      RETURN_IF_ERROR(biased_qkv(b));
      RETURN_IF_ERROR(matrix(b + "attn_output.weight", o_dim, s.dim, type));
      RETURN_IF_ERROR(vector(b + "attn_output.bias", s.dim, 0.0f, 0.2f));
      RETURN_IF_ERROR(vector(b + "attn_sinks.weight", s.num_heads, 0.0f, 2.0f));
      RETURN_IF_ERROR(vector(b + "post_attention_norm.weight", s.dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(matrix(b + "ffn_gate_inp.weight", s.dim, s.num_experts, GgmlType::kF32));
      RETURN_IF_ERROR(vector(b + "ffn_gate_inp.bias", s.num_experts, 0.0f, 0.5f));
      RETURN_IF_ERROR(matrix(b + "ffn_gate_exps.weight", s.dim, expert_ffn, etype, s.num_experts));
      RETURN_IF_ERROR(matrix(b + "ffn_up_exps.weight", s.dim, expert_ffn, etype, s.num_experts));
      RETURN_IF_ERROR(matrix(b + "ffn_down_exps.weight", expert_ffn, s.dim, etype, s.num_experts));
      RETURN_IF_ERROR(vector(b + "ffn_gate_exps.bias", expert_ffn, 0.0f, 0.5f, s.num_experts));
      RETURN_IF_ERROR(vector(b + "ffn_up_exps.bias", expert_ffn, 0.0f, 0.5f, s.num_experts));
      RETURN_IF_ERROR(vector(b + "ffn_down_exps.bias", s.dim, 0.0f, 0.2f, s.num_experts));
      continue;
    }
    if (s.arch == "phi3") {  // fused: Q, K, V rows in one matrix
      RETURN_IF_ERROR(matrix(b + "attn_qkv.weight", s.dim, q_dim + kv_dim + v_dim, type));
    } else {
      RETURN_IF_ERROR(matrix(b + "attn_q.weight", s.dim, q_dim, type));
      RETURN_IF_ERROR(matrix(b + "attn_k.weight", s.dim, kv_dim, type));
      RETURN_IF_ERROR(matrix(b + "attn_v.weight", s.dim, v_dim, type));
    }
    if (s.arch == "qwen2") {
      RETURN_IF_ERROR(vector(b + "attn_q.bias", q_dim, 0.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "attn_k.bias", kv_dim, 0.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "attn_v.bias", v_dim, 0.0f, 0.5f));
    } else if (s.arch == "qwen3" || s.arch == "qwen3moe" || s.arch == "gemma3") {
      RETURN_IF_ERROR(vector(b + "attn_q_norm.weight", head_dim, 1.0f, 0.5f));
      RETURN_IF_ERROR(vector(b + "attn_k_norm.weight", head_dim, 1.0f, 0.5f));
    }
    RETURN_IF_ERROR(matrix(b + "attn_output.weight", o_dim, s.dim, type));
    if (gemma) RETURN_IF_ERROR(vector(b + "post_attention_norm.weight", s.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(ones(b + "ffn_norm.weight", s.dim));
    if (moe) {
      RETURN_IF_ERROR(matrix(b + "ffn_gate_inp.weight", s.dim, s.num_experts, GgmlType::kF32));
      RETURN_IF_ERROR(matrix(b + "ffn_gate_exps.weight", s.dim, expert_ffn, etype, s.num_experts));
      RETURN_IF_ERROR(matrix(b + "ffn_up_exps.weight", s.dim, expert_ffn, etype, s.num_experts));
      RETURN_IF_ERROR(matrix(b + "ffn_down_exps.weight", expert_ffn, s.dim, etype, s.num_experts));
      continue;
    }
    if (s.arch == "phi3") {  // fused: the gate's rows, then up's
      RETURN_IF_ERROR(matrix(b + "ffn_up.weight", s.dim, 2 * s.ffn_dim, type));
    } else {
      RETURN_IF_ERROR(matrix(b + "ffn_gate.weight", s.dim, s.ffn_dim, type));
      RETURN_IF_ERROR(matrix(b + "ffn_up.weight", s.dim, s.ffn_dim, type));
    }
    RETURN_IF_ERROR(matrix(b + "ffn_down.weight", s.ffn_dim, s.dim, type));
    if (gemma) RETURN_IF_ERROR(vector(b + "post_ffw_norm.weight", s.dim, 1.0f, 0.5f));
  }
  if (s.rope_freqs_ctx > 0 && s.arch == "phi3") {
    // LongRoPE as Phi-3.5's converter writes it: long and short divisors per frequency (here
    // rising from 1 to 8 and to 1.5), the original context, and the attention factor
    // sqrt(1 + ln(context / original) / ln(original)).
    const int64_t half = head_dim / 2;
    for (const auto& [name, top] : {std::pair<const char*, float>{"rope_factors_long.weight", 8.0f},
                                    std::pair<const char*, float>{"rope_factors_short.weight", 1.5f}}) {
      std::vector<float> f(half);
      for (int64_t i = 0; i < half; ++i) f[i] = 1.0f + (top - 1.0f) * static_cast<float>(i) / static_cast<float>(half);
      std::vector<uint8_t> bytes(f.size() * 4);
      std::memcpy(bytes.data(), f.data(), bytes.size());
      RETURN_IF_ERROR(w.AddTensor(name, static_cast<uint32_t>(GgmlType::kF32), {half}, std::move(bytes)));
    }
    w.SetU32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(s.rope_freqs_ctx));
    const double scale = static_cast<double>(s.context_length) / static_cast<double>(s.rope_freqs_ctx);
    w.SetF32(p + "rope.scaling.attn_factor",
             static_cast<float>(std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(s.rope_freqs_ctx)))));
  } else if (s.rope_freqs_ctx > 0) {
    const std::vector<float> factors =
        Llama3RopeFreqFactors(head_dim, 10000.0, 8.0, 1.0, 4.0, static_cast<double>(s.rope_freqs_ctx));
    std::vector<uint8_t> bytes(factors.size() * 4);
    std::memcpy(bytes.data(), factors.data(), bytes.size());
    RETURN_IF_ERROR(w.AddTensor("rope_freqs.weight", static_cast<uint32_t>(GgmlType::kF32), {head_dim / 2}, std::move(bytes)));
  }
  return w;
}

}  // namespace gale
