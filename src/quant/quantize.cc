// Weight quantization: llama.cpp's Q8_0 / Q4_0 through the bit-exact reference quantizers, and
// gale's W8A8 / W4A16 / W4A8 with calibrated per-channel scales (SmoothQuant, AWQ-style search).
#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "kernels/kernels.h"
#include "model/arch_spec.h"
#include "model/hparams.h"

namespace gale {

StatusOr<QuantScheme> ParseQuantScheme(const std::string& name) {
  if (name == "q8_0") return QuantScheme::kQ8_0;
  if (name == "q4_0") return QuantScheme::kQ4_0;
  if (name == "w8a8") return QuantScheme::kW8A8;
  if (name == "w4a16") return QuantScheme::kW4A16;
  if (name == "w4a8") return QuantScheme::kW4A8;
  if (name == "q4_k") return QuantScheme::kQ4_K;
  if (name == "q6_k") return QuantScheme::kQ6_K;
  if (name == "q4_1") return QuantScheme::kQ4_1;
  if (name == "q5_0") return QuantScheme::kQ5_0;
  if (name == "q5_1") return QuantScheme::kQ5_1;
  if (name == "iq4_nl") return QuantScheme::kIQ4_NL;
  if (name == "iq4_xs") return QuantScheme::kIQ4_XS;
  if (name == "mxfp4") return QuantScheme::kMXFP4;
  if (name == "fp8") return QuantScheme::kFP8;
  return InvalidArgument(
      "--type '{}' is not one of q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k, iq4_nl, iq4_xs, mxfp4, fp8, w8a8, w4a16, "
      "w4a8",
      name);
}

const char* QuantSchemeName(QuantScheme s) {
  switch (s) {
    case QuantScheme::kQ8_0: return "q8_0";
    case QuantScheme::kQ4_0: return "q4_0";
    case QuantScheme::kW8A8: return "w8a8";
    case QuantScheme::kW4A16: return "w4a16";
    case QuantScheme::kW4A8: return "w4a8";
    case QuantScheme::kQ4_K: return "q4_k";
    case QuantScheme::kQ6_K: return "q6_k";
    case QuantScheme::kQ4_1: return "q4_1";
    case QuantScheme::kQ5_0: return "q5_0";
    case QuantScheme::kQ5_1: return "q5_1";
    case QuantScheme::kIQ4_NL: return "iq4_nl";
    case QuantScheme::kIQ4_XS: return "iq4_xs";
    case QuantScheme::kMXFP4: return "mxfp4";
    case QuantScheme::kFP8: return "fp8";
  }
  return "?";
}

StatusOr<GgmlType> SchemeType(const QuantizeOptions& o) {
  const bool w4 = o.scheme == QuantScheme::kW4A16 || o.scheme == QuantScheme::kW4A8;
  if (w4 && o.group_size != 64 && o.group_size != 128) {
    return InvalidArgument("--group-size must be 64 or 128, got {}", o.group_size);
  }
  if (o.zero_point && o.scheme != QuantScheme::kW4A16) return InvalidArgument("--zero-point is for w4a16 only");
  if (!(o.smooth_alpha >= 0.0 && o.smooth_alpha <= 1.0)) {
    return InvalidArgument("--smooth-alpha must be in [0, 1], got {}", o.smooth_alpha);
  }
  switch (o.scheme) {
    case QuantScheme::kQ8_0:
    case QuantScheme::kW8A8: return GgmlType::kQ8_0;
    case QuantScheme::kQ4_0: return GgmlType::kQ4_0;
    case QuantScheme::kQ4_K: return GgmlType::kQ4_K;
    case QuantScheme::kQ6_K: return GgmlType::kQ6_K;
    case QuantScheme::kQ4_1: return GgmlType::kQ4_1;
    case QuantScheme::kQ5_0: return GgmlType::kQ5_0;
    case QuantScheme::kQ5_1: return GgmlType::kQ5_1;
    case QuantScheme::kIQ4_NL: return GgmlType::kIQ4_NL;
    case QuantScheme::kIQ4_XS: return GgmlType::kIQ4_XS;
    case QuantScheme::kMXFP4: return GgmlType::kMXFP4;
    case QuantScheme::kFP8: return GgmlType::kF8E4M3;
    case QuantScheme::kW4A16:
      if (o.group_size == 64) return o.zero_point ? GgmlType::kW4A16ZG64 : GgmlType::kW4A16G64;
      return o.zero_point ? GgmlType::kW4A16ZG128 : GgmlType::kW4A16G128;
    case QuantScheme::kW4A8: return o.group_size == 64 ? GgmlType::kW4A8G64 : GgmlType::kW4A8G128;
  }
  return InvalidArgument("unknown scheme");
}

namespace {

constexpr uint32_t kGgmlI32 = 26;  // ggml's GGML_TYPE_I32: index tables, never quantized

// Per-channel scales applied to one tensor before it is quantized: columns multiplied by
// col_scale (the consumer side), rows divided by row_div (a producer before wo or w_down), and
// for 1-D norm weights, elements divided by row_div. clip: W4 clipping ratio.
struct Edit {
  std::vector<float> col_scale;
  std::vector<float> row_div;
  float clip = 1.0f;
};

std::vector<float> FloatRows(const GgufTensorInfo& t) {
  const GgmlType type = GetTypeTraits(t.type_id)->type;
  const int64_t cols = t.shape[0], rows = t.NumElements() / cols;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRowRef(type, t.data + r * RowBytes(type, cols), out.data() + r * cols, cols);
  }
  return out;
}

void QuantizeRow(GgmlType type, const float* src, uint8_t* dst, int64_t n, float clip) {
  if (W4FormatOf(type).group > 0) {
    QuantizeW4Row(type, src, dst, n, clip);
  } else {
    QuantizeRowRef(type, src, dst, n);
  }
}

// What the scheme's quantization makes of W (rows x cols, already column-scaled) with the
// given clip, dequantized back to floats.
std::vector<float> RoundTrip(const std::vector<float>& w, int64_t rows, int64_t cols, GgmlType type, float clip) {
  std::vector<float> out(w.size());
  std::vector<uint8_t> buf(static_cast<size_t>(RowBytes(type, cols)));
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeRow(type, w.data() + r * cols, buf.data(), cols, clip);
    DequantizeRowRef(type, buf.data(), out.data() + r * cols, cols);
  }
  return out;
}

// X [n, cols] times W^T [cols, rows] -> [n, rows], through the f32 GEMM.
std::vector<float> Product(const std::vector<float>& w, int64_t rows, int64_t cols, const std::vector<float>& x,
                           int64_t n, ThreadPool& pool) {
  TensorView v;
  v.type = GgmlType::kF32;
  v.shape = {cols, rows};
  v.data = reinterpret_cast<const uint8_t*>(w.data());
  v.num_bytes = w.size() * sizeof(float);
  std::vector<float> y(static_cast<size_t>(n * rows));
  kernels::MatMul(v, x.data(), n, y.data(), pool);
  return y;
}

double SquaredError(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0.0;
  for (size_t i = 0; i < a.size(); ++i) e += static_cast<double>(a[i] - b[i]) * (a[i] - b[i]);
  return e;
}

// One group of matrices reading the same input, and where its scales fold.
struct Group {
  LinearInput input;
  std::vector<std::string> consumers;
  std::string producer;  // a norm (elementwise) or a matrix whose rows make the input's channels
  bool producer_is_norm;
  // A fused producer (Phi-3's attn_qkv, ffn_up): the input's channels are rows
  // [producer_offset, producer_offset + producer_rows) of it; producer_rows 0: all its rows.
  int64_t producer_offset = 0;
  int64_t producer_rows = 0;
};

class Transformer {
 public:
  Transformer(const GgufFile& in, const QuantizeOptions& o, GgmlType type, const ModelHParams& hp,
              const std::function<bool(const std::string&)>& quantized)
      : in_(in), o_(o), type_(type), hp_(hp), quantized_(quantized) {}

  Status Run(std::map<std::string, Edit>* edits, std::vector<std::string>* report) {
    for (int64_t l = 0; l < hp_.num_layers; ++l) {
      const std::string b = fmt::format("blk.{}.", l);
      // Separate Q, K, V and gate, up matrices, or fused ones (Phi-3: V's rows last in attn_qkv,
      // up's rows second in ffn_up).
      const bool fused_qkv = in_.FindTensor(b + "attn_qkv.weight") != nullptr;
      const bool fused_up = in_.FindTensor(b + "ffn_gate.weight") == nullptr;
      const Group groups[] = {
          fused_qkv ? Group{LinearInput::kAttnIn, {b + "attn_qkv.weight"}, b + "attn_norm.weight", true}
                    : Group{LinearInput::kAttnIn, {b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"},
                            b + "attn_norm.weight", true},
          fused_qkv ? Group{LinearInput::kAttnOut, {b + "attn_output.weight"}, b + "attn_qkv.weight", false,
                            hp_.q_dim() + hp_.kv_dim(), hp_.v_dim()}
                    : Group{LinearInput::kAttnOut, {b + "attn_output.weight"}, b + "attn_v.weight", false},
          fused_up ? Group{LinearInput::kFfnIn, {b + "ffn_up.weight"}, b + "ffn_norm.weight", true}
                   : Group{LinearInput::kFfnIn, {b + "ffn_gate.weight", b + "ffn_up.weight"}, b + "ffn_norm.weight", true},
          fused_up ? Group{LinearInput::kFfnMid, {b + "ffn_down.weight"}, b + "ffn_up.weight", false, hp_.ffn_dim, hp_.ffn_dim}
                   : Group{LinearInput::kFfnMid, {b + "ffn_down.weight"}, b + "ffn_up.weight", false},
      };
      for (const Group& g : groups) {
        std::string line;
        RETURN_IF_ERROR(DoGroup(l, g, edits, &line));
        if (!line.empty()) report->push_back(line);
      }
      if (o_.progress) o_.progress(fmt::format("calibrated scales: layer {}/{}", l + 1, hp_.num_layers));
    }
    return Status::Ok();
  }

 private:
  // Input channel j of wo reads attention output channel j = head h, element d, made from V's
  // channel (h / group) * v_head + d (V's head size): scales are per KV channel there.
  int64_t ProducerChannel(LinearInput in, int64_t j) const {
    if (in != LinearInput::kAttnOut) return j;
    const int64_t group = hp_.num_heads / hp_.num_kv_heads, v_head = hp_.value_head();
    return (j / v_head) / group * v_head + j % v_head;
  }

  Status DoGroup(int64_t layer, const Group& g, std::map<std::string, Edit>* edits, std::string* line) {
    bool any = false;
    for (const auto& c : g.consumers) any = any || quantized_(c);
    if (!any) return Status::Ok();
    const ChannelStats& st = o_.calibration->Get(layer, g.input);
    std::vector<const GgufTensorInfo*> cons;
    for (const auto& c : g.consumers) {
      const GgufTensorInfo* t = in_.FindTensor(c);
      if (t == nullptr) return InvalidArgument("tensor '{}' is missing", c);
      if (t->shape[0] != st.dim) {
        return InvalidArgument("tensor '{}' has {} columns, calibration saw {} channels", c, t->shape[0], st.dim);
      }
      cons.push_back(t);
    }
    const GgufTensorInfo* prod = in_.FindTensor(g.producer);
    if (prod == nullptr) return InvalidArgument("tensor '{}' is missing", g.producer);
    const int64_t dim = st.dim;
    const int64_t prod_rows = g.producer_is_norm ? prod->shape[0] : prod->shape[1];
    const int64_t pdim = g.producer_rows > 0 ? g.producer_rows : prod_rows;
    if (g.producer_offset + pdim > prod_rows) {
      return InvalidArgument("tensor '{}' has {} rows, fewer than the {} + {} expected", g.producer, prod_rows,
                             g.producer_offset, pdim);
    }
    // Channel statistics folded to the producer's channels (max over the heads sharing one).
    std::vector<float> amax(pdim, 0.0f), amean(pdim, 0.0f);
    for (int64_t j = 0; j < dim; ++j) {
      const int64_t p = ProducerChannel(g.input, j);
      amax[p] = std::max(amax[p], st.absmax[j]);
      amean[p] = std::max(amean[p], st.absmean[j]);
    }
    std::vector<std::vector<float>> w;
    for (const auto* t : cons) w.push_back(FloatRows(*t));
    std::vector<float> s(pdim, 1.0f);
    if (o_.scheme == QuantScheme::kW8A8) {
      // SmoothQuant: s = max|x|^a / max|W|^(1-a), weights' max over every consumer's column.
      std::vector<float> wmax(pdim, 0.0f);
      for (size_t c = 0; c < cons.size(); ++c) {
        const int64_t rows = cons[c]->shape[1];
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < dim; ++j) {
            const int64_t p = ProducerChannel(g.input, j);
            wmax[p] = std::max(wmax[p], std::fabs(w[c][r * dim + j]));
          }
        }
      }
      const double a = o_.smooth_alpha;
      for (int64_t p = 0; p < pdim; ++p) {
        if (amax[p] <= 0.0f || wmax[p] <= 0.0f) continue;
        s[p] = static_cast<float>(std::clamp(std::pow(amax[p], a) / std::pow(wmax[p], 1.0 - a), 1e-3, 1e3));
      }
      *line = fmt::format("blk.{} {}: smoothquant alpha {:g}, scales {:.3g}..{:.3g}", layer, InputName(g.input),
                          a, *std::min_element(s.begin(), s.end()), *std::max_element(s.begin(), s.end()));
    } else {
      // AWQ: s = mean|x|^a (normalized), a from a grid, by the output error on calibration rows.
      double best_err = -1.0, best_a = 0.0, rtn = 0.0;  // rtn: a = 0 (s = 1) is round to nearest
      std::vector<float> best_s(pdim, 1.0f);
      std::vector<std::vector<float>> ref(cons.size());
      for (size_t c = 0; c < cons.size(); ++c) {
        if (quantized_(g.consumers[c])) ref[c] = Product(w[c], cons[c]->shape[1], dim, st.rows, st.num_rows, *o_.pool);
      }
      for (int step = 0; step <= 10; ++step) {
        const double a = step / 10.0;
        std::vector<float> cand(pdim, 1.0f);
        if (step > 0) {
          float lo = INFINITY, hi = 0.0f;
          for (int64_t p = 0; p < pdim; ++p) {
            cand[p] = static_cast<float>(std::pow(std::max(amean[p], 1e-8f), a));
            lo = std::min(lo, cand[p]);
            hi = std::max(hi, cand[p]);
          }
          const float norm = std::sqrt(lo * hi);
          for (float& v : cand) v /= norm;
        }
        const double err = GroupError(g, cons, w, ref, st, cand, nullptr);
        if (step == 0) rtn = err;
        if (best_err < 0.0 || err < best_err) {
          best_err = err;
          best_a = a;
          best_s = cand;
        }
      }
      s = best_s;
      // Then a clipping ratio per quantized consumer, with the scales chosen; the error returned is
      // that of the clips chosen.
      std::vector<float> clips(cons.size(), 1.0f);
      const double final_err = GroupError(g, cons, w, ref, st, s, &clips);
      std::string clip_text;
      for (size_t c = 0; c < cons.size(); ++c) clip_text += fmt::format("{}{:g}", c ? "/" : "", clips[c]);
      *line = fmt::format("blk.{} {}: awq alpha {:g}, clip {}; output error {:.3g} of round-to-nearest", layer,
                          InputName(g.input), best_a, clip_text, rtn > 0 ? final_err / rtn : 1.0);
      for (size_t c = 0; c < cons.size(); ++c) (*edits)[g.consumers[c]].clip = clips[c];
    }
    // Fold: consumers' columns times s, the producer's channels divided by s.
    for (const auto& c : g.consumers) {
      Edit& e = (*edits)[c];
      e.col_scale.resize(static_cast<size_t>(dim));
      for (int64_t j = 0; j < dim; ++j) e.col_scale[j] = s[ProducerChannel(g.input, j)];
    }
    Edit& pe = (*edits)[g.producer];
    if (pe.row_div.empty()) pe.row_div.assign(static_cast<size_t>(prod_rows), 1.0f);
    for (int64_t p = 0; p < pdim; ++p) pe.row_div[g.producer_offset + p] *= s[p];
    // A producer matrix with a bias (Qwen2's attn_v): its outputs are divided by s only if the
    // bias is too.
    if (!g.producer_is_norm && g.producer.ends_with(".weight")) {
      const std::string bias = g.producer.substr(0, g.producer.size() - 7) + ".bias";
      if (in_.FindTensor(bias) != nullptr) {
        Edit& be = (*edits)[bias];
        if (be.row_div.empty()) be.row_div.assign(static_cast<size_t>(prod_rows), 1.0f);
        for (int64_t p = 0; p < pdim; ++p) be.row_div[g.producer_offset + p] *= s[p];
      }
    }
    return Status::Ok();
  }

  // Output error over the calibration rows of quantizing the group's consumers with scales s, at
  // clip 1; with choose_clips, at each consumer's best clip from a grid (filled in).
  double GroupError(const Group& g, const std::vector<const GgufTensorInfo*>& cons,
                    const std::vector<std::vector<float>>& w, const std::vector<std::vector<float>>& ref,
                    const ChannelStats& st, const std::vector<float>& s, std::vector<float>* choose_clips) {
    const int64_t dim = st.dim;
    std::vector<float> xs(st.rows.size());  // the input as the scaled model sees it: x / s
    for (int64_t t = 0; t < st.num_rows; ++t) {
      for (int64_t j = 0; j < dim; ++j) xs[t * dim + j] = st.rows[t * dim + j] / s[ProducerChannel(g.input, j)];
    }
    double total = 0.0;
    for (size_t c = 0; c < cons.size(); ++c) {
      if (!quantized_(g.consumers[c])) continue;
      const int64_t rows = cons[c]->shape[1];
      std::vector<float> ws(w[c].size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < dim; ++j) ws[r * dim + j] = w[c][r * dim + j] * s[ProducerChannel(g.input, j)];
      }
      auto err_at = [&](float clip) {
        return SquaredError(Product(RoundTrip(ws, rows, dim, type_, clip), rows, dim, xs, st.num_rows, *o_.pool), ref[c]);
      };
      if (choose_clips != nullptr && W4FormatOf(type_).group > 0) {
        double best = -1.0;
        for (float clip : {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.75f}) {
          const double e = err_at(clip);
          if (best < 0.0 || e < best) {
            best = e;
            (*choose_clips)[c] = clip;
          }
        }
        total += best;
      } else {
        total += err_at(1.0f);
      }
    }
    return total;
  }

  static const char* InputName(LinearInput in) {
    switch (in) {
      case LinearInput::kAttnIn: return "attn_in";
      case LinearInput::kAttnOut: return "attn_out";
      case LinearInput::kFfnIn: return "ffn_in";
      case LinearInput::kFfnMid: return "ffn_mid";
    }
    return "?";
  }

  const GgufFile& in_;
  const QuantizeOptions& o_;
  GgmlType type_;
  const ModelHParams& hp_;
  std::function<bool(const std::string&)> quantized_;
};

}  // namespace

StatusOr<QuantizeReport> QuantizeModel(const GgufFile& in, const QuantizeOptions& options, GgufWriter* out) {
  ASSIGN_OR_RETURN(const GgmlType type, SchemeType(options));
  std::vector<std::regex> keep;
  for (const auto& k : options.keep) {
    try {
      keep.emplace_back(k, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return InvalidArgument("--keep '{}' is not a valid regular expression: {}", k, e.what());
    }
  }
  const bool calibrated = options.calibration != nullptr;
  const bool rtn_only = options.scheme != QuantScheme::kW8A8 && options.scheme != QuantScheme::kW4A16 &&
                        options.scheme != QuantScheme::kW4A8;
  if (calibrated && rtn_only) {
    return InvalidArgument("calibration (--calib) is for w8a8, w4a16 and w4a8; llama.cpp's types are round to nearest");
  }
  if (calibrated && options.pool == nullptr) return InvalidArgument("calibration needs a thread pool");
  for (const auto& [key, value] : in.metadata()) out->SetValue(key, value);
  out->SetU32("general.file_type", LlamaFileType(type));
  out->SetU32("general.quantization_version", 2);
  out->SetString("gale.quantization.scheme", QuantSchemeName(options.scheme));
  const int64_t block = TypeTraits(type).block_size;

  // Why a tensor is not quantized ("" when it is); F16 fallback when its rows do not fit. The
  // architecture says what of its own stays as it is (ArchSpec::keep_unquantized).
  ASSIGN_OR_RETURN(const std::string arch_name, in.GetString("general.architecture"));
  const ArchSpec* arch = FindArchitecture(arch_name);
  auto reason = [&](const GgufTensorInfo& t) -> std::string {
    if (t.type_id == kGgmlI32) return "index table";  // token -> experts (hash routing)
    if (arch != nullptr && arch->keep_unquantized != nullptr) {
      if (const char* why = arch->keep_unquantized(t); *why != '\0') return why;
    }
    if (t.shape.size() != 2 && t.shape.size() != 3) return "not a matrix";  // 3-D: a mixture's experts
    if (t.name.find("ffn_gate_inp") != std::string::npos) return "expert router";  // f32, as llama.cpp keeps it
    if (t.name.ends_with(".bias")) return "bias";  // gpt-oss's experts' biases are [width, experts]
    if (t.name == "token_embd.weight" && !options.quantize_embeddings) return "token embedding";
    if (t.name == "output.weight" && !options.quantize_output) return "output layer";
    for (size_t i = 0; i < keep.size(); ++i) {
      if (std::regex_search(t.name, keep[i])) return "--keep " + options.keep[i];
    }
    return "";
  };
  auto is_quantized = [&](const std::string& name) {
    const GgufTensorInfo* t = in.FindTensor(name);
    return t != nullptr && reason(*t).empty() && t->shape[0] % block == 0;
  };
  for (const GgufTensorInfo& t : in.tensors()) {
    if (t.type_id == kGgmlI32) continue;  // an index table, copied as it is
    const auto traits = GetTypeTraits(t.type_id);
    const bool is_float = traits && (traits->type == GgmlType::kF32 || traits->type == GgmlType::kF16 ||
                                     traits->type == GgmlType::kBF16);
    if ((t.shape.size() == 2 || t.shape.size() == 3) && !is_float) {
      return InvalidArgument("tensor '{}' is {}: quantize needs an F32, F16 or BF16 model (requantizing compounds "
                             "the error)", t.name, TypeName(t.type_id));
    }
  }

  QuantizeReport report;
  std::map<std::string, Edit> edits;
  if (calibrated && !rtn_only) {
    ASSIGN_OR_RETURN(const ModelHParams hp, ReadHParams(in));
    if (hp.moe.enabled() || (arch != nullptr && !arch->calibrated_quantization)) {
      return Unimplemented("calibrated quantization (--calib) of a mixture of experts or latent attention is not supported "
                           "yet: quantize it without --calib (round to nearest)");
    }
    if (options.calibration->num_layers != hp.num_layers) {
      return InvalidArgument("calibration statistics are for {} layers, the model has {}",
                             options.calibration->num_layers, hp.num_layers);
    }
    Transformer tr(in, options, type, hp, is_quantized);
    RETURN_IF_ERROR(tr.Run(&edits, &report.transforms));
    // The transforms leave the keys as they were (wk's columns and the norm before it scale
    // inversely), so the calibration's key statistics hold for the output.
    if (const KeyChannels kc = KeyChannelsFromStats(*options.calibration, hp); !kc.empty()) {
      SetKeyChannelMetadata(kc, out);
      report.transforms.push_back("key channels: calibrated shift and scale for quantized KV caches");
    }
  }

  for (const GgufTensorInfo& t : in.tensors()) {
    report.bytes_in += t.num_bytes;
    const auto traits = GetTypeTraits(t.type_id);
    const std::string why = reason(t);
    const auto edit_it = edits.find(t.name);
    const Edit* edit = edit_it != edits.end() ? &edit_it->second : nullptr;
    GgmlType target = options.transform_only ? GgmlType::kF32 : type;
    // MXFP4 is for the experts, as llama.cpp's MXFP4_MOE: every other matrix becomes Q8_0.
    if (target == GgmlType::kMXFP4 && t.shape.size() != 3) target = GgmlType::kQ8_0;
    // FP8 as DeepSeek-V4 / V4.1 release their weights: the experts FP4 (MXFP4), the rest FP8.
    if (target == GgmlType::kF8E4M3 && t.shape.size() == 3) target = GgmlType::kMXFP4;
    if (why.empty() && t.shape[0] % block != 0) {
      // As llama.cpp: a 256-element type's 32-element counterpart where the rows allow, else F16.
      const GgmlType alt = type == GgmlType::kQ4_K    ? GgmlType::kQ5_0
                           : type == GgmlType::kQ6_K  ? GgmlType::kQ8_0
                           : type == GgmlType::kIQ4_XS ? GgmlType::kIQ4_NL
                                                       : type;
      target = alt != type && t.shape[0] % 32 == 0 ? alt : GgmlType::kF16;
      report.fallbacks.push_back(fmt::format("{} (rows of {}): {}", t.name, t.shape[0], TypeTraits(target).name));
    }
    if (!why.empty()) {
      if (t.shape.size() >= 2) report.kept.push_back(fmt::format("{} ({})", t.name, why));
      if (edit == nullptr) {
        RETURN_IF_ERROR(out->AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)));
        report.bytes_out += t.num_bytes;
        continue;
      }
      target = traits->type;  // a kept tensor (or a norm) with folded scales: same type, scaled
    }
    const GgmlType src = traits->type;
    const int64_t cols = t.shape[0], rows = t.NumElements() / cols;
    const int64_t src_row = RowBytes(src, cols), dst_row = RowBytes(target, cols);
    const uint8_t* data = t.data;
    const Edit e = edit != nullptr ? *edit : Edit{};
    const bool is_1d = t.shape.size() == 1;
    RETURN_IF_ERROR(out->AddTensor(t.name, static_cast<uint32_t>(target), t.shape,
                                   [=](uint8_t* dst, uint64_t) {
                                     std::vector<float> row(static_cast<size_t>(cols));
                                     for (int64_t r = 0; r < rows; ++r) {
                                       DequantizeRowRef(src, data + r * src_row, row.data(), cols);
                                       if (is_1d && !e.row_div.empty()) {
                                         for (int64_t j = 0; j < cols; ++j) row[j] /= e.row_div[j];
                                       }
                                       if (!is_1d && !e.row_div.empty()) {
                                         for (int64_t j = 0; j < cols; ++j) row[j] /= e.row_div[r];
                                       }
                                       if (!e.col_scale.empty()) {
                                         for (int64_t j = 0; j < cols; ++j) row[j] *= e.col_scale[j];
                                       }
                                       QuantizeRow(target, row.data(), dst + r * dst_row, cols, e.clip);
                                     }
                                   }));
    report.bytes_out += static_cast<uint64_t>(rows * dst_row);
    if (why.empty() && (target == type || (type == GgmlType::kF8E4M3 && target == GgmlType::kMXFP4))) {
      ++report.quantized;
    }
    if (why.empty() && type == GgmlType::kMXFP4 && target == GgmlType::kQ8_0) ++report.quantized_q8;
  }
  return report;
}

}  // namespace gale
