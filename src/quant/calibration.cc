// Calibration samples and activation statistics.
#include "quant/calibration.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/file.h"

namespace gale {
namespace {

// Byte offset of the first invalid or incomplete UTF-8 character, or npos.
size_t InvalidUtf8At(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const int len = Utf8CharLength(std::string_view(s).substr(i));
    if (len <= 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::string::npos;
}

class StatsObserver : public ActivationObserver {
 public:
  StatsObserver(ActivationStats* stats, int64_t stride) : stats_(stats), stride_(stride) {}
  void set_first_token(int64_t t) { first_token_ = t; }
  void Observe(int64_t layer, LinearInput which, const float* x, int64_t num_tokens, int64_t dim) override {
    ChannelStats& c = stats_->at[static_cast<size_t>(layer * kNumLinearInputs + static_cast<int>(which))];
    if (c.dim == 0) {
      c.dim = dim;
      c.absmax.assign(dim, 0.0f);
      c.absmean.assign(dim, 0.0f);  // sums until Finish
    }
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* row = x + t * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const float a = std::fabs(row[j]);
        c.absmax[j] = std::max(c.absmax[j], a);
        c.absmean[j] += a;
      }
      if ((first_token_ + t) % stride_ == 0) {
        c.rows.insert(c.rows.end(), row, row + dim);
        ++c.num_rows;
      }
    }
  }

  void ObserveKeys(int64_t layer, const float* k, int64_t num_tokens, int64_t kv_dim) override {
    if (key_sum_.empty()) {
      key_sum_.assign(static_cast<size_t>(stats_->num_layers * kv_dim), 0.0);
      key_sq_.assign(key_sum_.size(), 0.0);
    }
    double* sum = key_sum_.data() + layer * kv_dim;
    double* sq = key_sq_.data() + layer * kv_dim;
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t c = 0; c < kv_dim; ++c) {
        const double x = k[t * kv_dim + c];
        sum[c] += x;
        sq[c] += x * x;
      }
    }
  }
  // Fills stats' key mean and RMS over num_tokens tokens.
  void FinishKeys(int64_t num_tokens) {
    stats_->key_mean.resize(key_sum_.size());
    stats_->key_rms.resize(key_sum_.size());
    const double n = static_cast<double>(std::max<int64_t>(1, num_tokens));
    for (size_t i = 0; i < key_sum_.size(); ++i) {
      stats_->key_mean[i] = key_sum_[i] / n;
      stats_->key_rms[i] = std::sqrt(key_sq_[i] / n);
    }
  }

 private:
  ActivationStats* stats_;
  std::vector<double> key_sum_, key_sq_;
  int64_t stride_;
  int64_t first_token_ = 0;
};

}  // namespace

StatusOr<std::vector<std::vector<int32_t>>> ParseCalibration(const std::string& content, bool jsonl,
                                                             const Tokenizer& tok, const CalibrationOptions& options) {
  if (options.samples < 1) return InvalidArgument("--calib-samples must be >= 1, got {}", options.samples);
  if (options.seq_len < 2) return InvalidArgument("--calib-seq-len must be >= 2, got {}", options.seq_len);
  if (content.find_first_not_of(" \t\r\n") == std::string::npos) {
    return InvalidArgument("the calibration file is empty");
  }
  if (content.find('\0') != std::string::npos) {
    return InvalidArgument("the calibration file is binary (it has NUL bytes), not text or JSONL");
  }
  if (const size_t at = InvalidUtf8At(content); at != std::string::npos) {
    return InvalidArgument("the calibration file is not UTF-8 text (invalid bytes at offset {})", at);
  }
  std::vector<std::vector<int32_t>> samples;
  if (jsonl) {
    std::istringstream in(content);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line) && static_cast<int64_t>(samples.size()) < options.samples) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) return InvalidArgument("calibration line {}: not a JSON object", line_no);
      const char* key = j.contains("prompt") ? "prompt" : j.contains("text") ? "text" : nullptr;
      if (key == nullptr || !j[key].is_string()) {
        return InvalidArgument("calibration line {}: needs a \"prompt\" or \"text\" string", line_no);
      }
      std::vector<int32_t> ids = tok.Encode(j[key].get<std::string>());
      if (static_cast<int64_t>(ids.size()) > options.seq_len) ids.resize(static_cast<size_t>(options.seq_len));
      if (ids.size() >= 2) samples.push_back(std::move(ids));
    }
  } else {
    const std::vector<int32_t> ids = tok.Encode(content);
    for (size_t i = 0; i + 1 < ids.size() && static_cast<int64_t>(samples.size()) < options.samples;
         i += static_cast<size_t>(options.seq_len)) {
      const size_t end = std::min(ids.size(), i + static_cast<size_t>(options.seq_len));
      if (end - i >= 2) samples.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  int64_t total = 0;
  for (const auto& s : samples) total += static_cast<int64_t>(s.size());
  if (total < kMinCalibrationTokens) {
    return InvalidArgument("the calibration set is too short: {} tokens, at least {} are needed", total,
                           kMinCalibrationTokens);
  }
  return samples;
}

StatusOr<std::vector<std::vector<int32_t>>> LoadCalibration(const std::string& path, const Tokenizer& tok,
                                                            const CalibrationOptions& options) {
  auto read = ReadTextFile(path);
  if (!read.ok()) return IoError("cannot open calibration file '{}'", path);
  const std::string& content = *read;
  const size_t first = content.find_first_not_of(" \t\r\n");
  const bool jsonl = (path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0) ||
                     (first != std::string::npos && content[first] == '{');
  auto r = ParseCalibration(content, jsonl, tok, options);
  if (!r.ok()) return r.status().WithContext(path);
  return r;
}

StatusOr<ActivationStats> CollectActivationStats(const Model& model,
                                                 const std::vector<std::vector<int32_t>>& samples, int64_t max_rows,
                                                 ThreadPool& pool, const std::function<void(int64_t, int64_t)>& progress) {
  const ModelHParams& hp = model.hparams();
  ActivationStats stats;
  stats.num_layers = hp.num_layers;
  stats.at.resize(static_cast<size_t>(hp.num_layers * kNumLinearInputs));
  int64_t total = 0;
  for (const auto& s : samples) total += static_cast<int64_t>(s.size());
  const int64_t stride = std::max<int64_t>(1, (total + max_rows - 1) / std::max<int64_t>(1, max_rows));
  StatsObserver observer(&stats, stride);
  Workspace ws;
  int64_t seen = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    KvCache kv(hp, static_cast<int64_t>(s.size()));
    ForwardBatch b;
    b.tokens = s;
    for (size_t p = 0; p < s.size(); ++p) b.positions.push_back(static_cast<int32_t>(p));
    b.observer = &observer;
    observer.set_first_token(seen);
    RETURN_IF_ERROR(model.Forward(b, kv, ws, pool).WithContext(fmt::format("calibration sample {}", i + 1)));
    seen += static_cast<int64_t>(s.size());
    if (progress) progress(static_cast<int64_t>(i + 1), static_cast<int64_t>(samples.size()));
  }
  stats.num_tokens = seen;
  observer.FinishKeys(seen);
  for (ChannelStats& c : stats.at) {
    for (float& m : c.absmean) m /= static_cast<float>(std::max<int64_t>(1, seen));
  }
  return stats;
}

KeyChannels KeyChannelsFromStats(const ActivationStats& stats, const ModelHParams& hp) {
  KeyChannels kc;
  const int64_t hd = hp.head_dim, n = hp.num_layers * hp.kv_dim();
  if (static_cast<int64_t>(stats.key_mean.size()) != n || static_cast<int64_t>(stats.key_rms.size()) != n) return kc;
  kc.shift.resize(static_cast<size_t>(n));
  kc.scale.resize(static_cast<size_t>(n));
  std::vector<double> sd(static_cast<size_t>(hd));
  for (int64_t h0 = 0; h0 < n; h0 += hd) {  // one layer's KV head at a time
    double top = 0.0;
    for (int64_t d = 0; d < hd; ++d) {
      const double m = stats.key_mean[h0 + d], r = stats.key_rms[h0 + d];
      sd[d] = std::sqrt(std::max(0.0, r * r - m * m));
      top = std::max(top, sd[d]);
      kc.shift[h0 + d] = static_cast<float>(m);
    }
    if (top <= 0.0) top = 1.0;  // a head whose keys never vary: scales of 1
    double log_sum = 0.0;
    for (int64_t d = 0; d < hd; ++d) {
      sd[d] = std::sqrt(std::max(sd[d], 0.01 * top));
      log_sum += std::log(sd[d]);
    }
    const double norm = std::exp(log_sum / static_cast<double>(hd));
    for (int64_t d = 0; d < hd; ++d) kc.scale[h0 + d] = static_cast<float>(sd[d] / norm);
  }
  return kc;
}

void SetKeyChannelMetadata(const KeyChannels& kc, GgufWriter* out) {
  out->SetValue(kKeyShiftKey, GgufValue::F32Array(kc.shift));
  out->SetValue(kKeyScaleKey, GgufValue::F32Array(kc.scale));
}

}  // namespace gale
