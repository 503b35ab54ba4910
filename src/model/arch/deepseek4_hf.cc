// DeepSeek-V4 / V4.1 checkpoints as DeepSeek publishes them (flat names such as
// layers.N.attn.wq_a.weight, FP8 e4m3 dense weights with a UE8M0 scale per 128x128 (V4) or 32x32
// (V4.1) tile in a .scale tensor beside them, routed experts FP4 e2m1 packed two per byte, low
// nibble first, with a UE8M0 scale per 32 of a row) to gale's deepseek4 / deepseek41 GGUF with
// llama.cpp's tensor names. FP8 tensors become F8E4M3 (each row's 32-blocks take their tile's
// scale) and FP4 experts MXFP4 (the same codes and scales, nibbles in ggml's order): both exact.
// BF16/F16/F32 matrices take --outtype; vectors, the router, the hyper-connection mixes, sinks and
// positional biases are F32; the hash routing table I32. The multi-token-prediction block (mtp.*)
// is not converted (gale does not run it). V4.1's Engram: the tables and projections as they are,
// and the constants the checkpoint does not store computed as its reference computes them
// (deepseek4_engram.h), checked against the sizes the config declares.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/arch/deepseek4_engram.h"
#include "model/arch/arch.h"
#include "model/hf_checkpoint.h"
#include "model/hf_tokenizer.h"
#include "base/numpy_rng.h"

namespace gale {
namespace {

using Json = nlohmann::json;
constexpr uint32_t kGgmlI32 = 26;

StatusOr<int64_t> Int(const Json& j, const char* key, int64_t fallback = -1) {
  return HfConfigInt(j, key, fallback, 0, int64_t{1} << 26);
}

double Num(const Json& j, const char* key, double fallback) { return HfConfigNum(j, key, fallback); }

// The GGUF name of a checkpoint tensor (V4's and V4.1's), or "" for one gale does not convert.
std::string GgufName(const std::string& hf) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"embed.weight", "token_embd.weight"},  {"head.weight", "output.weight"},
      {"norm.weight", "output_norm.weight"},  {"hc_head_base", "output_hc_base.weight"},
      {"hc_head_fn", "output_hc_fn.weight"},  {"hc_head_scale", "output_hc_scale.weight"}};
  for (const auto& [a, b] : kTop) {
    if (hf == a) return b;
  }
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "attn_norm.weight"},
      {"ffn_norm.weight", "ffn_norm.weight"},
      {"attn.wq_a.weight", "attn_q_a.weight"},
      {"attn.q_norm.weight", "attn_q_a_norm.weight"},
      {"attn.wq_b.weight", "attn_q_b.weight"},
      {"attn.wkv.weight", "attn_kv.weight"},
      {"attn.kv_norm.weight", "attn_kv_a_norm.weight"},
      {"attn.attn_sink", "attn_sinks.weight"},
      {"attn.wo_a.weight", "attn_output_a.weight"},
      {"attn.wo_b.weight", "attn_output_b.weight"},
      {"hc_attn_base", "hc_attn_base.weight"},
      {"hc_attn_fn", "hc_attn_fn.weight"},
      {"hc_attn_scale", "hc_attn_scale.weight"},
      {"hc_ffn_base", "hc_ffn_base.weight"},
      {"hc_ffn_fn", "hc_ffn_fn.weight"},
      {"hc_ffn_scale", "hc_ffn_scale.weight"},
      {"ffn.gate.weight", "ffn_gate_inp.weight"},
      {"ffn.gate.bias", "exp_probs_b.bias"},
      {"ffn.gate.tid2eid", "ffn_gate_tid2eid.weight"},
      {"ffn.shared_experts.w1.weight", "ffn_gate_shexp.weight"},
      {"ffn.shared_experts.w2.weight", "ffn_down_shexp.weight"},
      {"ffn.shared_experts.w3.weight", "ffn_up_shexp.weight"},
      {"attn.compressor.wkv.weight", "attn_compressor_kv.weight"},
      {"attn.compressor.wgate.weight", "attn_compressor_gate.weight"},
      {"attn.compressor.norm.weight", "attn_compressor_norm.weight"},
      {"attn.compressor.ape", "attn_compressor_ape.weight"},
      {"attn.indexer.wq_b.weight", "indexer.attn_q_b.weight"},
      {"attn.indexer.weights_proj.weight", "indexer.proj.weight"},
      {"attn.indexer.wk.weight", "indexer.attn_k.weight"},        // V4.1's index keys
      {"attn.indexer.k_norm.weight", "indexer.k_norm.weight"},
      {"attn.indexer.compressor.wkv.weight", "indexer_compressor_kv.weight"},  // V4's
      {"attn.indexer.compressor.wgate.weight", "indexer_compressor_gate.weight"},
      {"attn.indexer.compressor.norm.weight", "indexer_compressor_norm.weight"},
      {"attn.indexer.compressor.ape", "indexer_compressor_ape.weight"},
      {"engram.embed.weight", "engram_embd.weight"},  // V4.1's Engram: the table,
      {"engram.wkv.weight", "engram_wkv.weight"},     // its key/value projection,
      {"engram.q_weight", "engram_q.weight"},         // the per-copy gate norms
      {"engram.k_weight", "engram_k.weight"}};
  // layers.<digits>.<rest> (parsed by hand: names come from an untrusted header).
  if (hf.rfind("layers.", 0) != 0) return "";
  size_t at = 7;
  while (at < hf.size() && at < 7 + 9 && hf[at] >= '0' && hf[at] <= '9') ++at;
  if (at == 7 || at >= hf.size() || hf[at] != '.') return "";
  const std::string layer = hf.substr(7, at - 7), rest = hf.substr(at + 1);
  for (const auto& [a, b] : kLayer) {
    if (rest == a) return fmt::format("blk.{}.{}", layer, b);
  }
  return "";
}

// Tensors kept F32 whatever --outtype says (as llama.cpp's converter and gale's loader keep them).
bool KeepF32(const std::string& gguf) {
  for (const char* s : {"_fn.weight", "_base.weight", "_scale.weight", "ffn_gate_inp.weight", "ape.weight",
                        "engram_q.weight", "engram_k.weight"}) {
    if (gguf.size() >= std::strlen(s) && gguf.compare(gguf.size() - std::strlen(s), std::strlen(s), s) == 0) return true;
  }
  return false;
}

// One UE8M0 exponent from a scale tensor's element: F8_E8M0 bytes as they are, F32 scales only
// when they are powers of two (a scale_inv in another format would be an error here).
StatusOr<uint8_t> ScaleExponent(const SafetensorsTensor& s, int64_t i) {
  if (s.dtype == "F8_E8M0") return s.data[i];
  if (s.dtype == "F32") {
    float v;
    std::memcpy(&v, s.data + 4 * i, 4);
    int e = 0;
    const float m = std::frexp(v, &e);
    if (m != 0.5f || e - 1 < -127 || e - 1 > 127) return InvalidArgument("tensor '{}': scale {} is not a power of two", s.name, v);
    return static_cast<uint8_t>(e - 1 + 127);
  }
  return InvalidArgument("tensor '{}' is {}: block scales are F8_E8M0 (or F32 powers of two)", s.name, s.dtype);
}

// One row of a BF16/F16/F32 tensor as `target`. Safetensors packs tensors back to back: after an
// FP8 tensor of odd size a BF16 one starts at an odd address, so the row is copied to aligned
// memory (raw, RowBytes(src, cols) bytes at least) first.
void ConvertRow(GgmlType src, const uint8_t* bytes, int64_t cols, GgmlType target, uint8_t* dst,
                std::vector<float>* raw, std::vector<float>* row) {
  std::memcpy(raw->data(), bytes, static_cast<size_t>(RowBytes(src, cols)));
  DequantizeRowRef(src, raw->data(), row->data(), cols);
  QuantizeRowRef(target, row->data(), dst, cols);
}

// One FP8 row as F8E4M3 blocks: each 32-block takes the exponent of its tile, tile_exps being the
// row's band of tiles (one exponent per tile_cols columns).
void F8Row(const uint8_t* codes, const uint8_t* tile_exps, int64_t cols, int64_t tile_cols, BlockF8E4M3* dst) {
  for (int64_t c = 0; c < cols; c += 32, ++dst) {
    dst->e = tile_exps[c / tile_cols];
    std::memcpy(dst->qs, codes + c, 32);
  }
}

class Converter {
 public:
  Converter(HfTensors tensors, GgmlType type, int64_t block_rows, int64_t block_cols, GgufWriter* out)
      : tensors_(std::move(tensors)), type_(type), br_(block_rows), bc_(block_cols), out_(out) {}

  // The checkpoint tensor (and its .scale for FP8) as GGUF tensor `gguf`, dims reversed.
  Status Add(const std::string& hf, const std::string& gguf) {
    const SafetensorsTensor& t = *tensors_.at(hf).second;
    std::shared_ptr<SafetensorsFile> file = tensors_.at(hf).first;
    used_.insert(hf);
    std::vector<int64_t> shape(t.shape.rbegin(), t.shape.rend());
    if (shape.empty()) return InvalidArgument("tensor '{}' is a scalar", hf);
    const int64_t cols = shape[0], rows = t.NumElements() / std::max<int64_t>(cols, 1);
    ++num_tensors_;
    if (t.dtype == "F8_E4M3") {
      if (t.shape.size() != 2 || cols % 32 != 0) {
        return InvalidArgument("tensor '{}': FP8 tensors must be matrices with rows a multiple of 32 wide", hf);
      }
      ASSIGN_OR_RETURN(std::vector<uint8_t> exps, TileExponents(hf, rows, cols));
      const int64_t br = br_, bc = bc_, sc = (cols + bc_ - 1) / bc_;
      return out_->AddTensor(gguf, static_cast<uint32_t>(GgmlType::kF8E4M3), shape,
                             [=, file = file, exps = std::move(exps)](uint8_t* dst, uint64_t) {
                               for (int64_t r = 0; r < rows; ++r) {
                                 F8Row(t.data + r * cols, exps.data() + (r / br) * sc, cols, bc,
                                       reinterpret_cast<BlockF8E4M3*>(dst) + r * (cols / 32));
                               }
                             });
    }
    if (t.dtype == "I64" || t.dtype == "I32") {  // the hash routing table
      return out_->AddTensor(gguf, kGgmlI32, shape, [=, file = file](uint8_t* dst, uint64_t) {
        for (int64_t i = 0; i < rows * cols; ++i) {
          int64_t v;
          if (t.dtype == "I64") {
            std::memcpy(&v, t.data + 8 * i, 8);
          } else {
            int32_t v32;
            std::memcpy(&v32, t.data + 4 * i, 4);
            v = v32;
          }
          const int32_t w = static_cast<int32_t>(v);
          std::memcpy(dst + 4 * i, &w, 4);
        }
      });
    }
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
      return InvalidArgument("tensor '{}' is {}; expected BF16, F16, F32 or FP8 (F8_E4M3)", hf, t.dtype);
    }
    const GgmlType src = t.dtype == "F32" ? GgmlType::kF32 : t.dtype == "F16" ? GgmlType::kF16 : GgmlType::kBF16;
    const GgmlType target = shape.size() >= 2 && !KeepF32(gguf) ? type_ : GgmlType::kF32;
    if (target == src) {
      return out_->AddTensor(gguf, static_cast<uint32_t>(target), shape, [=, file = file](uint8_t* dst, uint64_t n) {
        std::memcpy(dst, t.data, n);
      });
    }
    const int64_t src_row = RowBytes(src, cols), dst_row = RowBytes(target, cols);
    return out_->AddTensor(gguf, static_cast<uint32_t>(target), shape, [=, file = file](uint8_t* dst, uint64_t) {
      std::vector<float> row(static_cast<size_t>(cols)), raw(static_cast<size_t>((src_row + 3) / 4));
      for (int64_t r = 0; r < rows; ++r) ConvertRow(src, t.data + r * src_row, cols, target, dst + r * dst_row, &raw, &row);
    });
  }

  // Layer l's routed experts (layers.l.ffn.experts.E.w1/w2/w3) stacked into ffn_{gate,down,up}_exps.
  Status AddExperts(int64_t l, int64_t experts, int64_t dim, int64_t ffn) {
    const struct {
      const char* proj;
      const char* gguf;
      int64_t out, in;
    } kProj[] = {{"w1", "ffn_gate_exps", ffn, dim}, {"w2", "ffn_down_exps", dim, ffn}, {"w3", "ffn_up_exps", ffn, dim}};
    for (const auto& p : kProj) {
      std::vector<const SafetensorsTensor*> ws, ss;
      std::vector<std::shared_ptr<SafetensorsFile>> files;
      std::string dtype;
      for (int64_t e = 0; e < experts; ++e) {
        const std::string hf = fmt::format("layers.{}.ffn.experts.{}.{}.weight", l, e, p.proj);
        auto it = tensors_.find(hf);
        if (it == tensors_.end()) return InvalidArgument("tensor '{}' is missing from the checkpoint", hf);
        const SafetensorsTensor& t = *it->second.second;
        if (e == 0) dtype = t.dtype;
        if (t.dtype != dtype) return InvalidArgument("tensor '{}' is {}, expert 0's is {}", hf, t.dtype, dtype);
        used_.insert(hf);
        files.push_back(it->second.first);
        ws.push_back(&t);
        if (t.dtype == "I8" || t.dtype == "U8") {
          ASSIGN_OR_RETURN(const SafetensorsTensor* s, ScaleOf(hf));
          ss.push_back(s);
        }
      }
      const std::string gguf = fmt::format("blk.{}.{}.weight", l, p.gguf);
      const std::vector<int64_t> shape = {p.in, p.out, experts};
      const int64_t in = p.in, out = p.out;
      ++num_tensors_;
      if (dtype == "I8" || dtype == "U8") {  // FP4 e2m1, two per byte (low nibble first), a scale per 32
        if (in % 32 != 0) return InvalidArgument("layer {} {}: FP4 rows of {} are not whole 32-blocks", l, p.proj, in);
        for (int64_t e = 0; e < experts; ++e) {
          if (ws[e]->shape != std::vector<int64_t>{out, in / 2} || ss[e]->shape != std::vector<int64_t>{out, in / 32}) {
            return InvalidArgument("tensor '{}' ([{}], scale [{}]): expected FP4 [{}, {}] with scales [{}, {}]",
                                   ws[e]->name, fmt::join(ws[e]->shape, ", "), fmt::join(ss[e]->shape, ", "), out,
                                   in / 2, out, in / 32);
          }
          if (ss[e]->dtype != "F8_E8M0") return InvalidArgument("tensor '{}' is {}, expected F8_E8M0", ss[e]->name, ss[e]->dtype);
        }
        RETURN_IF_ERROR(out_->AddTensor(gguf, static_cast<uint32_t>(GgmlType::kMXFP4), shape,
                                        [=](uint8_t* dst, uint64_t) {
                                          (void)files;
                                          auto* b = reinterpret_cast<BlockMXFP4*>(dst);
                                          for (int64_t e = 0; e < experts; ++e) {
                                            for (int64_t r = 0; r < out; ++r) {
                                              const uint8_t* packed = ws[e]->data + r * (in / 2);
                                              for (int64_t k = 0; k < in / 32; ++k, ++b) {
                                                b->e = ss[e]->data[r * (in / 32) + k];
                                                const uint8_t* p16 = packed + 16 * k;
                                                auto code = [&](int j) { return (p16[j / 2] >> (4 * (j % 2))) & 15; };
                                                for (int j = 0; j < 16; ++j) {
                                                  b->qs[j] = static_cast<uint8_t>(code(j) | code(j + 16) << 4);
                                                }
                                              }
                                            }
                                          }
                                        }));
        continue;
      }
      // FP8 or BF16/F16/F32 experts: the dense path's conversion per expert, one after the other.
      for (int64_t e = 0; e < experts; ++e) {
        if (ws[e]->shape != std::vector<int64_t>{out, in}) {
          return InvalidArgument("tensor '{}' has shape [{}], expected [{}, {}]", ws[e]->name,
                                 fmt::join(ws[e]->shape, ", "), out, in);
        }
      }
      if (dtype != "F8_E4M3" && dtype != "BF16" && dtype != "F16" && dtype != "F32") {
        return InvalidArgument("tensor '{}' is {}; experts are FP4 (I8), FP8, BF16, F16 or F32", ws[0]->name, dtype);
      }
      const GgmlType target = dtype == "F8_E4M3" ? GgmlType::kF8E4M3 : type_;
      const int64_t row_bytes = RowBytes(target, in);
      std::vector<uint8_t> exps;  // FP8: every expert's tile exponents, one after the other
      if (target == GgmlType::kF8E4M3) {
        for (int64_t e = 0; e < experts; ++e) {
          ASSIGN_OR_RETURN(const std::vector<uint8_t> x, TileExponents(ws[e]->name, out, in));
          exps.insert(exps.end(), x.begin(), x.end());
        }
      }
      const int64_t br = br_, bc = bc_, sc = (in + bc_ - 1) / bc_, tiles = ((out + br_ - 1) / br_) * sc;
      const GgmlType wtype = dtype == "F32" ? GgmlType::kF32 : dtype == "F16" ? GgmlType::kF16 : GgmlType::kBF16;
      RETURN_IF_ERROR(out_->AddTensor(
          gguf, static_cast<uint32_t>(target), shape, [=, exps = std::move(exps)](uint8_t* dst, uint64_t) {
            (void)files;
            std::vector<float> row(static_cast<size_t>(in)), raw(static_cast<size_t>((RowBytes(wtype, in) + 3) / 4));
            for (int64_t e = 0; e < experts; ++e) {
              for (int64_t r = 0; r < out; ++r) {
                uint8_t* d = dst + (e * out + r) * row_bytes;
                if (target == GgmlType::kF8E4M3) {
                  F8Row(ws[e]->data + r * in, exps.data() + e * tiles + (r / br) * sc, in, bc,
                        reinterpret_cast<BlockF8E4M3*>(d));
                } else {
                  ConvertRow(wtype, ws[e]->data + r * RowBytes(wtype, in), in, target, d, &raw, &row);
                }
              }
            }
          }));
    }
    return Status::Ok();
  }

  bool Has(const std::string& hf) const { return tensors_.count(hf) != 0; }
  const HfTensors& tensors() const { return tensors_; }
  bool Used(const std::string& hf) const { return used_.count(hf) != 0; }
  int64_t num_tensors() const { return num_tensors_; }

 private:
  // The UE8M0 exponents of FP8 weight `hf`'s tiles ([ceil(rows / br), ceil(cols / bc)], from its
  // scale tensor), read and checked here so that the writer's fill only copies.
  StatusOr<std::vector<uint8_t>> TileExponents(const std::string& hf, int64_t rows, int64_t cols) {
    ASSIGN_OR_RETURN(const SafetensorsTensor* scale, ScaleOf(hf));
    const int64_t sr = (rows + br_ - 1) / br_, sc = (cols + bc_ - 1) / bc_;
    if (scale->shape != std::vector<int64_t>{sr, sc}) {
      return InvalidArgument("tensor '{}': scale shape [{}], expected [{}, {}] for {}x{} tiles", scale->name,
                             fmt::join(scale->shape, ", "), sr, sc, br_, bc_);
    }
    std::vector<uint8_t> exps(static_cast<size_t>(sr * sc));
    for (int64_t i = 0; i < sr * sc; ++i) {
      ASSIGN_OR_RETURN(exps[i], ScaleExponent(*scale, i));
    }
    return exps;
  }

  // weight "X.weight" -> "X.scale" (DeepSeek's name) or "X.weight_scale_inv".
  StatusOr<const SafetensorsTensor*> ScaleOf(const std::string& hf) {
    const std::string base = hf.substr(0, hf.size() - std::string(".weight").size());
    for (const std::string& n : {base + ".scale", base + ".weight_scale_inv", base + ".weight_scale"}) {
      auto it = tensors_.find(n);
      if (it != tensors_.end()) {
        used_.insert(n);
        return it->second.second;
      }
    }
    return InvalidArgument("tensor '{}' is quantized but '{}.scale' is missing", hf, base);
  }

  HfTensors tensors_;
  GgmlType type_;
  int64_t br_, bc_;
  GgufWriter* out_;
  std::set<std::string> used_;
  int64_t num_tensors_ = 0;
};

// V4.1's Engram keys (llama.cpp's deepseek41 names) from the config's engram_* block, the
// tokenizer and the reference's seeds; nothing when the config has no Engram layers.
Status WriteEngram(const Json& cfg, const HfTokenizerFiles& tokenizer_files, const HfTensors& tensors, int64_t vocab,
                   int64_t num_layers, const std::string& p, GgufWriter* out) {
  if (!cfg.contains("engram_layer_ids") || !cfg["engram_layer_ids"].is_array() || cfg["engram_layer_ids"].empty()) {
    for (const auto& [name, t] : tensors) {
      if (name.find(".engram.") != std::string::npos) {
        return InvalidArgument("tensor '{}': the checkpoint has Engram tensors but config.json no engram_layer_ids", name);
      }
    }
    return Status::Ok();
  }
  std::vector<int64_t> layers;
  for (const Json& l : cfg["engram_layer_ids"]) {
    if (!l.is_number_integer() || l.get<int64_t>() < 0) return InvalidArgument("config.json: engram_layer_ids must be layer ids");
    layers.push_back(l.get<int64_t>());
  }
  ASSIGN_OR_RETURN(const int64_t max_ngram, Int(cfg, "engram_max_ngram_size"));
  ASSIGN_OR_RETURN(const int64_t heads, Int(cfg, "engram_n_heads"));
  ASSIGN_OR_RETURN(const int64_t head_dim, Int(cfg, "engram_head_dim"));
  ASSIGN_OR_RETURN(const int64_t pad_token, Int(cfg, "engram_pad_token_id", 0));
  ASSIGN_OR_RETURN(const int64_t seed, Int(cfg, "engram_seed", 0));
  for (int64_t l : layers) {
    if (l >= num_layers) return InvalidArgument("config.json: Engram layer {} of {} layers", l, num_layers);
  }
  if (max_ngram < 2 || max_ngram > 8 || heads < 1 || heads > 4096 || head_dim < 1) {
    return InvalidArgument("config.json: Engram n-grams up to {} with {} heads of {}", max_ngram, heads, head_dim);
  }
  const int64_t orders = max_ngram - 1;
  // engram_vocab_size: one for every order, or a list (the demo's form).
  std::vector<int64_t> per_order;
  if (cfg.contains("engram_vocab_size") && cfg["engram_vocab_size"].is_array()) {
    for (const Json& v : cfg["engram_vocab_size"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 2 || v.get<int64_t>() > (int64_t{1} << 34)) {
        return InvalidArgument("config.json: engram_vocab_size entries must be 2 .. 2^34");
      }
      per_order.push_back(v.get<int64_t>());
    }
    if (static_cast<int64_t>(per_order.size()) != orders) {
      return InvalidArgument("config.json: engram_vocab_size lists {} sizes for {} n-gram orders", per_order.size(), orders);
    }
  } else {
    ASSIGN_OR_RETURN(const int64_t v, Int(cfg, "engram_vocab_size"));
    if (v < 2) return InvalidArgument("config.json: engram_vocab_size {}", v);
    per_order.assign(static_cast<size_t>(orders), v);
  }
  const Json& tcfg = tokenizer_files.config;
  const bool clean_up = tcfg.is_object() ? tcfg.value("clean_up_tokenization_spaces", true) : true;
  int64_t compressed = 0;
  ASSIGN_OR_RETURN(const std::vector<uint32_t> map,
                   EngramTokenMap(tokenizer_files.tokenizer, clean_up, vocab, &compressed));
  if (compressed < 1) return InvalidArgument("tokenizer.json: no tokens to map for Engram");
  if (cfg.contains("engram_compressed_vocab_size")) {
    ASSIGN_OR_RETURN(const int64_t want, Int(cfg, "engram_compressed_vocab_size"));
    if (want != compressed) {
      return InvalidArgument("the tokenizer compresses to {} Engram ids, config.json says {}: it is not the checkpoint's "
                             "tokenizer, and every hash would index the wrong rows", compressed, want);
    }
  }
  if (pad_token >= vocab) return InvalidArgument("config.json: engram_pad_token_id {} past the vocab", pad_token);
  const int64_t half = std::max<int64_t>(1, std::numeric_limits<int64_t>::max() / compressed / 2);
  const std::vector<uint64_t> primes = EngramPrimes(static_cast<int64_t>(layers.size()), orders, heads, per_order);
  std::vector<GgufValue> ids, mult, pr, offsets, tmap;
  const int64_t cols = orders * heads;
  for (size_t e = 0; e < layers.size(); ++e) {
    ids.push_back(GgufValue::U32(static_cast<uint32_t>(layers[e])));
    NumpyPcg64 g(static_cast<uint64_t>(seed + 10007 * layers[e]));
    ASSIGN_OR_RETURN(const std::vector<int64_t> r, g.Integers(half, max_ngram));
    for (int64_t v : r) mult.push_back(GgufValue::U64(static_cast<uint64_t>(v) * 2 + 1));
    uint64_t offset = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t prime = primes[e * cols + c];
      pr.push_back(GgufValue::U64(prime));
      offsets.push_back(GgufValue::U64(offset));
      offset += prime;
    }
    // The table must have the rows the layout gives (and the config declares).
    if (cfg.contains("engram_num_embeddings") && cfg["engram_num_embeddings"].is_array() &&
        e < cfg["engram_num_embeddings"].size()) {
      const Json& n = cfg["engram_num_embeddings"][e];
      if (!n.is_number_integer() || n.get<uint64_t>() != offset) {
        return InvalidArgument("Engram layer {}: the hash heads give {} table rows, config.json declares {}", layers[e],
                               offset, n.dump());
      }
    }
    const std::string table = fmt::format("layers.{}.engram.embed.weight", layers[e]);
    auto it = tensors.find(table);
    if (it == tensors.end()) return InvalidArgument("tensor '{}' is missing from the checkpoint", table);
    const SafetensorsTensor& t = *it->second.second;
    if (t.shape.size() != 2 || t.shape[0] != static_cast<int64_t>(offset) || t.shape[1] != head_dim) {
      return InvalidArgument("tensor '{}' has shape [{}], expected [{}, {}] (the hash heads' rows)", table,
                             fmt::join(t.shape, ", "), offset, head_dim);
    }
  }
  for (uint32_t v : map) tmap.push_back(GgufValue::U32(v));
  out->SetValue(p + "engram.layer_ids", GgufValue::Array(GgufValueType::kUint32, std::move(ids)));
  out->SetU32(p + "engram.head_count", static_cast<uint32_t>(heads));
  out->SetU32(p + "engram.key_length", static_cast<uint32_t>(head_dim));
  out->SetU32(p + "engram.max_ngram_size", static_cast<uint32_t>(max_ngram));
  out->SetU32(p + "engram.pad_id", map[static_cast<size_t>(pad_token)]);
  out->SetValue(p + "engram.multipliers", GgufValue::Array(GgufValueType::kUint64, std::move(mult)));
  out->SetValue(p + "engram.primes", GgufValue::Array(GgufValueType::kUint64, std::move(pr)));
  out->SetValue(p + "engram.offsets", GgufValue::Array(GgufValueType::kUint64, std::move(offsets)));
  out->SetValue(p + "engram.token_map", GgufValue::Array(GgufValueType::kUint32, std::move(tmap)));
  return Status::Ok();
}

// config.json's DeepSeek-V4 sizes (flat in V4, under text_config in V4.1).
struct Ds4Config {
  bool v41 = false;
  int64_t dim, layers, heads, kv_heads, head_dim, rope_dim, q_rank, o_rank, o_groups, idx_heads, idx_dim, idx_topk;
  int64_t experts, used, expert_ffn, shared, hash_layers, hc, sinkhorn, window, vocab, ctx;
  std::vector<int32_t> ratios;  // per layer
};

StatusOr<Ds4Config> ReadDs4Config(const Json& cfg, bool v41) {
  Ds4Config c;
  c.v41 = v41;
  ASSIGN_OR_RETURN(c.dim, Int(cfg, "hidden_size"));
  ASSIGN_OR_RETURN(c.layers, Int(cfg, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.heads, Int(cfg, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.kv_heads, Int(cfg, "num_key_value_heads", 1));
  ASSIGN_OR_RETURN(c.head_dim, Int(cfg, "head_dim"));
  ASSIGN_OR_RETURN(c.rope_dim, Int(cfg, "qk_rope_head_dim"));
  ASSIGN_OR_RETURN(c.q_rank, Int(cfg, "q_lora_rank"));
  ASSIGN_OR_RETURN(c.o_rank, Int(cfg, "o_lora_rank"));
  ASSIGN_OR_RETURN(c.o_groups, Int(cfg, "o_groups"));
  ASSIGN_OR_RETURN(c.idx_heads, Int(cfg, "index_n_heads"));
  ASSIGN_OR_RETURN(c.idx_dim, Int(cfg, "index_head_dim"));
  ASSIGN_OR_RETURN(c.idx_topk, Int(cfg, "index_topk"));
  ASSIGN_OR_RETURN(c.experts, Int(cfg, "n_routed_experts"));
  ASSIGN_OR_RETURN(c.used, Int(cfg, "num_experts_per_tok"));
  ASSIGN_OR_RETURN(c.expert_ffn, Int(cfg, "moe_intermediate_size"));
  ASSIGN_OR_RETURN(c.shared, Int(cfg, "n_shared_experts", 1));
  ASSIGN_OR_RETURN(c.hash_layers, Int(cfg, "num_hash_layers", 0));
  ASSIGN_OR_RETURN(c.hc, Int(cfg, "hc_mult"));
  ASSIGN_OR_RETURN(c.sinkhorn, Int(cfg, "hc_sinkhorn_iters", 20));
  ASSIGN_OR_RETURN(c.window, Int(cfg, "sliding_window"));
  ASSIGN_OR_RETURN(c.vocab, Int(cfg, "vocab_size"));
  ASSIGN_OR_RETURN(c.ctx, Int(cfg, "max_position_embeddings", 4096));
  if (c.dim == 0 || c.layers == 0 || c.heads == 0 || c.kv_heads != 1 || c.head_dim == 0 || c.rope_dim > c.head_dim ||
      c.experts == 0 || c.used == 0 || c.used > c.experts || c.hc == 0 || c.vocab == 0 || c.o_groups == 0 ||
      c.heads % c.o_groups != 0) {
    return InvalidArgument("config.json: not a DeepSeek-V4 shape (hidden {}, {} layers, {} heads of {} with {} KV, "
                           "{} of {} experts, hc_mult {}, o_groups {})", c.dim, c.layers, c.heads, c.head_dim,
                           c.kv_heads, c.used, c.experts, c.hc, c.o_groups);
  }
  const std::string scoring = cfg.value("scoring_func", "sqrtsoftplus");
  if (scoring != "sqrtsoftplus") return InvalidArgument("config.json: scoring_func '{}' (DeepSeek-V4's is sqrtsoftplus)", scoring);
  if (!cfg.contains("compress_ratios") || !cfg["compress_ratios"].is_array() ||
      static_cast<int64_t>(cfg["compress_ratios"].size()) < c.layers) {
    return InvalidArgument("config.json: compress_ratios must list a ratio per layer");
  }
  for (int64_t l = 0; l < c.layers; ++l) {
    const Json& r = cfg["compress_ratios"][l];
    if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() > 65536) {
      return InvalidArgument("config.json: compress_ratios[{}] is not a ratio", l);
    }
    c.ratios.push_back(static_cast<int32_t>(r.get<int64_t>()));
  }
  return c;
}

// FP8 tiles: quantization_config.weight_block_size (V4: 128 x 128, V4.1: 32 x 32).
StatusOr<std::pair<int64_t, int64_t>> ReadTileShape(const Json& outer, const Json& cfg) {
  const Json* quant = outer.contains("quantization_config") ? &outer["quantization_config"]
                      : cfg.contains("quantization_config") ? &cfg["quantization_config"] : nullptr;
  if (quant == nullptr || !quant->is_object() || !quant->contains("weight_block_size")) return std::pair<int64_t, int64_t>{128, 128};
  const Json& b = (*quant)["weight_block_size"];
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
      b[0].get<int64_t>() < 1 || b[1].get<int64_t>() < 32 || b[1].get<int64_t>() % 32 != 0) {
    return InvalidArgument("config.json: weight_block_size must be [rows, cols] with cols a multiple of 32");
  }
  return std::pair<int64_t, int64_t>{b[0].get<int64_t>(), b[1].get<int64_t>()};
}

// The GGUF keys of llama.cpp's deepseek4 / deepseek41 layout (and gale's two-level index keys).
Status WriteDs4Keys(const Json& cfg, const Ds4Config& c, const std::string& p, GgufWriter* out) {
  out->SetU32(p + "context_length", static_cast<uint32_t>(c.ctx));
  out->SetU32(p + "embedding_length", static_cast<uint32_t>(c.dim));
  out->SetU32(p + "feed_forward_length", static_cast<uint32_t>(c.expert_ffn));
  out->SetU32(p + "block_count", static_cast<uint32_t>(c.layers));
  out->SetU32(p + "attention.head_count", static_cast<uint32_t>(c.heads));
  out->SetU32(p + "attention.head_count_kv", 1);
  out->SetU32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  out->SetU32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  out->SetU32(p + "rope.dimension_count", static_cast<uint32_t>(c.rope_dim));
  out->SetF32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(Num(cfg, "rms_norm_eps", 1e-6)));
  out->SetF32(p + "rope.freq_base", static_cast<float>(Num(cfg, "rope_theta", 10000.0)));
  out->SetU32(p + "vocab_size", static_cast<uint32_t>(c.vocab));
  out->SetU32(p + "expert_count", static_cast<uint32_t>(c.experts));
  out->SetU32(p + "expert_used_count", static_cast<uint32_t>(c.used));
  out->SetU32(p + "expert_feed_forward_length", static_cast<uint32_t>(c.expert_ffn));
  out->SetU32(p + "expert_shared_count", static_cast<uint32_t>(c.shared));
  out->SetF32(p + "expert_weights_scale", static_cast<float>(Num(cfg, "routed_scaling_factor", 1.0)));
  out->SetBool(p + "expert_weights_norm", cfg.value("norm_topk_prob", true));
  out->SetU32(p + "expert_gating_func", 4);  // sqrt(softplus)
  out->SetU32(p + "attention.q_lora_rank", static_cast<uint32_t>(c.q_rank));
  out->SetU32(p + "attention.sliding_window", static_cast<uint32_t>(c.window));
  out->SetValue(p + "swiglu_clamp_exp",
                GgufValue::F32Array(std::vector<float>(c.layers, static_cast<float>(Num(cfg, "swiglu_limit", 0.0)))));
  out->SetU32(p + "attention.indexer.head_count", static_cast<uint32_t>(c.idx_heads));
  out->SetU32(p + "attention.indexer.key_length", static_cast<uint32_t>(c.idx_dim));
  out->SetU32(p + "attention.indexer.top_k", static_cast<uint32_t>(c.idx_topk));
  out->SetU32(p + "attention.output_group_count", static_cast<uint32_t>(c.o_groups));
  out->SetU32(p + "attention.output_lora_rank", static_cast<uint32_t>(c.o_rank));
  out->SetF32(p + "attention.compress_rope_freq_base", static_cast<float>(Num(cfg, "compress_rope_theta", 160000.0)));
  out->SetU32(p + "hyper_connection.count", static_cast<uint32_t>(c.hc));
  out->SetU32(p + "hyper_connection.sinkhorn_iterations", static_cast<uint32_t>(c.sinkhorn));
  out->SetF32(p + "hyper_connection.epsilon", static_cast<float>(Num(cfg, "hc_eps", 1e-6)));
  out->SetU32(p + "hash_layer_count", static_cast<uint32_t>(c.hash_layers));
  out->SetValue(p + "attention.compress_ratios", GgufValue::I32Array(c.ratios));
  // V4.1's two-level index (candidate_source_layer_id null or absent: none).
  if (c.v41 && cfg.contains("candidate_source_layer_id") && !cfg["candidate_source_layer_id"].is_null()) {
    ASSIGN_OR_RETURN(const int64_t layer, Int(cfg, "candidate_source_layer_id"));
    ASSIGN_OR_RETURN(const int64_t blocks, Int(cfg, "candidate_topk_blocks"));
    ASSIGN_OR_RETURN(const int64_t block_size, Int(cfg, "candidate_block_size"));
    out->SetU32(p + "attention.indexer.candidate_source_layer", static_cast<uint32_t>(layer));
    out->SetU32(p + "attention.indexer.candidate_top_k_blocks", static_cast<uint32_t>(blocks));
    out->SetU32(p + "attention.indexer.candidate_block_size", static_cast<uint32_t>(block_size));
  }
  if (cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object()) {
    const Json& rs = cfg["rope_scaling"];
    // DeepSeek's configs name it "yarn"; one without a type is read as yarn too.
    const std::string kind = rs.value("type", rs.value("rope_type", "yarn"));
    if (kind != "yarn") return InvalidArgument("config.json: rope_scaling '{}' (DeepSeek-V4 uses yarn)", kind);
    out->SetString(p + "rope.scaling.type", "yarn");
    out->SetF32(p + "rope.scaling.factor", static_cast<float>(Num(rs, "factor", 1.0)));
    ASSIGN_OR_RETURN(const int64_t orig, Int(rs, "original_max_position_embeddings"));
    out->SetU32(p + "rope.scaling.original_context_length", static_cast<uint32_t>(orig));
    out->SetF32(p + "rope.scaling.yarn_beta_fast", static_cast<float>(Num(rs, "beta_fast", 32.0)));
    out->SetF32(p + "rope.scaling.yarn_beta_slow", static_cast<float>(Num(rs, "beta_slow", 1.0)));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<HfConvertReport> ConvertDeepseek4Hf(const std::filesystem::path& dir, const Json& outer, GgmlType type,
                                             GgufWriter* out) {
  const bool nested = outer.contains("text_config") && outer["text_config"].is_object();
  const Json& cfg = nested ? outer["text_config"] : outer;
  const bool v41 = nested || cfg.contains("kv_source_layer_ids") || cfg.value("model_type", "") == "deepseek_v41";
  const std::string arch = v41 ? "deepseek41" : "deepseek4";
  ASSIGN_OR_RETURN(const Ds4Config c, ReadDs4Config(cfg, v41));
  ASSIGN_OR_RETURN(const auto tile, ReadTileShape(outer, cfg));
  ASSIGN_OR_RETURN(HfTensors tensors, LoadHfTensors(dir));
  ASSIGN_OR_RETURN(const HfFileStart start, StartHfFile(dir, cfg, c.vocab, arch, 1024, out));
  HfConvertReport report;
  report.pre = start.tokenizer.pre;
  RETURN_IF_ERROR(WriteDs4Keys(cfg, c, arch + ".", out));
  WriteHfTokenizer(start.tokenizer, out);
  RETURN_IF_ERROR(WriteEngram(cfg, start.files, tensors, c.vocab, c.layers, arch + ".", out));

  Converter conv(std::move(tensors), type, tile.first, tile.second, out);
  for (const char* required : {"embed.weight", "head.weight", "norm.weight"}) {
    if (!conv.Has(required)) return InvalidArgument("tensor '{}' is missing from the checkpoint", required);
  }
  // Every tensor with a GGUF name, by name; the loader checks shapes and which layers carry what
  // (compressors, indexers, hash tables) against the ratios.
  for (const auto& [hf, t] : conv.tensors()) {
    const std::string gguf = GgufName(hf);
    if (!gguf.empty()) RETURN_IF_ERROR(conv.Add(hf, gguf));
  }
  for (int64_t l = 0; l < c.layers; ++l) RETURN_IF_ERROR(conv.AddExperts(l, c.experts, c.dim, c.expert_ffn));
  for (const auto& [hf, t] : conv.tensors()) {
    if (!conv.Used(hf)) report.skipped.push_back(hf);
  }
  report.num_tensors = conv.num_tensors();
  report.vocab = c.vocab;
  report.layers = c.layers;
  return report;
}

const HfFamily kDeepseek4HfFamily = {
    .names = {"DeepseekV4ForCausalLM", "deepseek_v4", "DeepseekV41ForCausalLM", "deepseek_v41",
              "DeepseekV41ForConditionalGeneration"},
    .convert = ConvertDeepseek4Hf,
};

}  // namespace gale
