// Weight quantization to Q8_0 / Q4_0 through the bit-exact reference quantizers.
#include "tools/quantize.h"

#include <regex>

#include <fmt/format.h>

namespace gale {

StatusOr<QuantizeReport> QuantizeModel(const GgufFile& in, const QuantizeOptions& options, GgufWriter* out) {
  if (options.type != GgmlType::kQ8_0 && options.type != GgmlType::kQ4_0) {
    return InvalidArgument("quantize supports q8_0 and q4_0, not {}", TypeTraits(options.type).name);
  }
  std::vector<std::regex> keep;
  for (const auto& k : options.keep) {
    try {
      keep.emplace_back(k, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return InvalidArgument("--keep '{}' is not a valid regular expression: {}", k, e.what());
    }
  }
  for (const auto& [key, value] : in.metadata()) out->SetValue(key, value);
  // llama.cpp's file types: 7 mostly Q8_0, 2 mostly Q4_0.
  out->SetU32("general.file_type", options.type == GgmlType::kQ8_0 ? 7 : 2);
  out->SetU32("general.quantization_version", 2);

  QuantizeReport report;
  const int64_t block = TypeTraits(options.type).block_size;
  for (const GgufTensorInfo& t : in.tensors()) {
    report.bytes_in += t.num_bytes;
    const auto traits = GetTypeTraits(t.type_id);
    const bool is_float = traits && (traits->type == GgmlType::kF32 || traits->type == GgmlType::kF16 ||
                                     traits->type == GgmlType::kBF16);
    const bool matrix = t.shape.size() == 2;
    if (matrix && !is_float) {
      return InvalidArgument("tensor '{}' is {}: quantize needs an F32, F16 or BF16 model (requantizing compounds "
                             "the error)", t.name, TypeName(t.type_id));
    }
    std::string why;
    if (!matrix) {
      why = "not a matrix";
    } else if (t.name == "token_embd.weight" && !options.quantize_embeddings) {
      why = "token embedding";
    } else if (t.name == "output.weight" && !options.quantize_output) {
      why = "output layer";
    } else {
      for (size_t i = 0; i < keep.size(); ++i) {
        if (std::regex_search(t.name, keep[i])) why = "--keep " + options.keep[i];
      }
    }
    GgmlType target = options.type;
    if (why.empty() && t.shape[0] % block != 0) {
      target = GgmlType::kF16;
      report.to_f16.push_back(fmt::format("{} (rows of {})", t.name, t.shape[0]));
    }
    if (!why.empty()) {
      if (matrix) report.kept.push_back(fmt::format("{} ({})", t.name, why));
      RETURN_IF_ERROR(out->AddTensor(t.name, t.type_id, t.shape, std::vector<uint8_t>(t.data, t.data + t.num_bytes)));
      report.bytes_out += t.num_bytes;
      continue;
    }
    const GgmlType src = traits->type;
    const int64_t cols = t.shape[0], rows = t.NumElements() / cols;
    const int64_t src_row = RowBytes(src, cols), dst_row = RowBytes(target, cols);
    const uint8_t* data = t.data;
    RETURN_IF_ERROR(out->AddTensor(t.name, static_cast<uint32_t>(target), t.shape,
                                   [=](uint8_t* dst, uint64_t) {
                                     std::vector<float> row(static_cast<size_t>(cols));
                                     for (int64_t r = 0; r < rows; ++r) {
                                       DequantizeRowRef(src, data + r * src_row, row.data(), cols);
                                       QuantizeRowRef(target, row.data(), dst + r * dst_row, cols);
                                     }
                                   }));
    report.bytes_out += static_cast<uint64_t>(rows * dst_row);
    if (target == options.type) ++report.quantized;
  }
  return report;
}

}  // namespace gale
