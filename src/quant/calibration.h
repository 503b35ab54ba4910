// Calibration for `gale quantize`: real samples run through the model to record what each linear
// layer sees. Per layer and input (LinearInput): each channel's largest |x| (SmoothQuant) and
// mean |x| (AWQ's scale search), and a deterministic subsample of whole token rows, on which the
// AWQ search measures each candidate's output error.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace gale {

struct CalibrationOptions {
  int64_t samples = 512;  // most samples used
  int64_t seq_len = 512;  // most tokens per sample
};

// Fewest tokens a calibration set may have.
inline constexpr int64_t kMinCalibrationTokens = 64;

// The samples of a calibration file: JSONL (the name ends in .jsonl, or the first character is
// '{': every non-empty line an object with a "prompt" or "text" string, one sample each, cut at
// seq_len tokens) or plain text (cut into samples of seq_len tokens). Errors for an empty file,
// binary content (NUL bytes or invalid UTF-8), bad JSONL lines (naming the line), or fewer than
// kMinCalibrationTokens tokens in all.
StatusOr<std::vector<std::vector<int32_t>>> ParseCalibration(const std::string& content, bool jsonl,
                                                             const Tokenizer& tok, const CalibrationOptions& options);
StatusOr<std::vector<std::vector<int32_t>>> LoadCalibration(const std::string& path, const Tokenizer& tok,
                                                            const CalibrationOptions& options);

struct ChannelStats {
  int64_t dim = 0;
  std::vector<float> absmax;   // [dim]
  std::vector<float> absmean;  // [dim]
  std::vector<float> rows;     // [num_rows, dim] token rows kept for error measurements
  int64_t num_rows = 0;
};

struct ActivationStats {
  int64_t num_layers = 0;
  int64_t num_tokens = 0;
  std::vector<ChannelStats> at;  // [num_layers * kNumLinearInputs]
  // The keys going into the cache (after RoPE): per layer and KV channel, mean and root mean
  // square over all tokens, [num_layers * kv_dim].
  std::vector<double> key_mean, key_rms;
  const ChannelStats& Get(int64_t layer, LinearInput which) const {
    return at[static_cast<size_t>(layer * kNumLinearInputs + static_cast<int>(which))];
  }
};

// Runs every sample through the model (one sequence at a time) and gathers the statistics,
// keeping up to max_rows token rows per input. progress(done, total) after each sample.
StatusOr<ActivationStats> CollectActivationStats(const Model& model,
                                                 const std::vector<std::vector<int32_t>>& samples, int64_t max_rows,
                                                 ThreadPool& pool,
                                                 const std::function<void(int64_t, int64_t)>& progress = {});

// The per-channel key transform (model/model.h KeyChannels) from calibration statistics:
// shift = the keys' mean; scale = sqrt of each channel's standard deviation (floored at 1% of
// its head's largest), normalized to a geometric mean of 1 per head, so the channels' spread
// is evened out by half (alpha 0.5, as SmoothQuant's default) and the rest left to the per-token
// quantization scales.
KeyChannels KeyChannelsFromStats(const ActivationStats& stats, const ModelHParams& hp);

// Puts the key transform into a GGUF's metadata (kKeyShiftKey, kKeyScaleKey).
void SetKeyChannelMetadata(const KeyChannels& kc, GgufWriter* out);

}  // namespace gale
