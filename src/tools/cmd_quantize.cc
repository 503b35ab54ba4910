// `gale quantize`: an F32/F16/BF16 GGUF to Q8_0, Q4_0, W8A8, W4A16 or W4A8 (see quant/quantize.h),
// calibrated on real samples with --calib.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "quant/calibration.h"
#include "tools/cli_common.h"
#include "tools/commands.h"
#include "quant/quantize.h"

namespace gale {

namespace {

// Runs the calibration samples through the model, with a progress bar.
StatusOr<ActivationStats> Calibrate(const LoadedModel& model, const std::string& calib, int64_t samples_max,
                                    int64_t seq_len, int64_t rows, ThreadPool& pool) {
  CalibrationOptions co;
  co.samples = samples_max;
  co.seq_len = seq_len;
  const int64_t ctx = model.model->hparams().context_length;
  if (ctx > 0 && co.seq_len > ctx) co.seq_len = ctx;
  auto samples = LoadCalibration(calib, *model.tok, co);
  if (!samples.ok()) return samples.status().WithContext("--calib");
  const bool tty = isatty(STDERR_FILENO);
  ASSIGN_OR_RETURN(ActivationStats stats,
                   CollectActivationStats(*model.model, *samples, rows, pool, [&](int64_t done, int64_t total) {
                     if (tty || done == total) {
                       const int width = 30, filled = static_cast<int>(width * done / total);
                       std::fprintf(stderr, "\rcalibration [%s%s] %lld/%lld samples",
                                    std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                                    static_cast<long long>(done), static_cast<long long>(total));
                       if (done == total) std::fputc('\n', stderr);
                     }
                   }));
  std::fprintf(stderr, "calibration: %lld samples, %lld tokens\n", static_cast<long long>(samples->size()),
               static_cast<long long>(stats.num_tokens));
  return stats;
}

}  // namespace

CommandFn RegisterQuantize(CLI::App& app) {
  struct Opts {
    std::string in, out, type = "q8_0", calib;
    std::vector<std::string> keep;
    bool embeddings = false, output = false, zero_point = false;
    int group_size = 128;
    double smooth_alpha = 0.5;
    int64_t calib_samples = 512, calib_seq_len = 512, calib_rows = 256;
    int threads = ThreadPool::DefaultNumThreads();
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-i,--input", o->in, "F32/F16/BF16 GGUF")->required();
  app.add_option("-o,--output", o->out, "output GGUF")->required();
  app.add_option("--type", o->type, "q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q4_k | q6_k | iq4_nl | iq4_xs | mxfp4 (experts; Q8_0 elsewhere) | fp8 (f8_e4m3; experts mxfp4) | w8a8 | w4a16 | w4a8")->capture_default_str();
  app.add_option("--group-size", o->group_size, "w4a16 / w4a8: weights per scale, 64 or 128")->capture_default_str();
  app.add_flag("--zero-point", o->zero_point, "w4a16: an f16 offset per group (asymmetric)");
  app.add_option("--calib", o->calib,
                 "calibration samples: text, or JSONL with a \"prompt\" or \"text\" per line (SmoothQuant for w8a8, "
                 "AWQ-style scale and clip search for w4a16 / w4a8)");
  app.add_option("--calib-samples", o->calib_samples, "most calibration samples")->capture_default_str();
  app.add_option("--calib-seq-len", o->calib_seq_len, "most tokens per sample (capped at the model's context)")
      ->capture_default_str();
  app.add_option("--calib-rows", o->calib_rows, "token rows per layer input the AWQ search measures errors on")
      ->capture_default_str();
  app.add_option("--smooth-alpha", o->smooth_alpha, "w8a8: SmoothQuant migration strength in [0, 1]")
      ->capture_default_str();
  app.add_option("--keep", o->keep, "keep tensors whose name matches this regex unquantized (repeatable), e.g. 'blk\\.0\\.'");
  app.add_flag("--quantize-embeddings", o->embeddings, "quantize token_embd.weight too");
  app.add_flag("--quantize-output", o->output, "quantize output.weight too");
  app.add_option("-t,--threads", o->threads, "threads (calibration)")->capture_default_str();
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale quantize: %s\n", s.ToString().c_str());
      return 1;
    };
    auto scheme = ParseQuantScheme(o->type);
    if (!scheme.ok()) return fail(scheme.status());
    QuantizeOptions opt;
    opt.scheme = *scheme;
    opt.group_size = o->group_size;
    opt.zero_point = o->zero_point;
    opt.smooth_alpha = o->smooth_alpha;
    opt.keep = o->keep;
    opt.quantize_embeddings = o->embeddings;
    opt.quantize_output = o->output;
    if (auto t = SchemeType(opt); !t.ok()) return fail(t.status());
    if (o->in == o->out) return fail(InvalidArgument("the output would overwrite the input"));
    if (o->threads < 1) return fail(InvalidArgument("-t must be >= 1"));
    if (o->calib_rows < 1) return fail(InvalidArgument("--calib-rows must be >= 1"));
    // With calibration the model is loaded to run it, and its file is the input; else the file
    // alone is opened.
    std::unique_ptr<LoadedModel> model;
    std::unique_ptr<GgufFile> opened;
    if (!o->calib.empty()) {
      auto m = LoadModel(o->in, LoadOptions{.keep_packed_sources = true});  // its tensors are the input
      if (!m.ok()) return fail(m.status());
      model = std::make_unique<LoadedModel>(std::move(*m));
    } else {
      auto f = GgufFile::Open(o->in);
      if (!f.ok()) return fail(f.status());
      opened = std::move(*f);
    }
    const GgufFile& in = model ? *model->file : *opened;
    ThreadPool pool(o->threads);
    opt.pool = &pool;
    ActivationStats stats;
    if (model) {
      auto st = Calibrate(*model, o->calib, o->calib_samples, o->calib_seq_len, o->calib_rows, pool);
      if (!st.ok()) return fail(st.status());
      stats = std::move(*st);
      opt.calibration = &stats;
      opt.progress = [](const std::string& line) {
        std::fprintf(stderr, isatty(STDERR_FILENO) ? "\r%s" : "%s\n", line.c_str());
      };
    }
    GgufWriter w;
    auto report = QuantizeModel(in, opt, &w);
    if (!report.ok()) return fail(report.status().WithContext(o->in));
    if (opt.calibration != nullptr && isatty(STDERR_FILENO)) std::fputc('\n', stderr);
    if (Status s = w.WriteFile(o->out); !s.ok()) return fail(s);
    for (const auto& k : report->kept) std::fprintf(stderr, "kept: %s\n", k.c_str());
    for (const auto& f : report->fallbacks) std::fprintf(stderr, "fallback (rows do not fit the block or group): %s\n", f.c_str());
    for (const auto& t : report->transforms) std::fprintf(stderr, "%s\n", t.c_str());
    const std::string others =
        report->quantized_q8 > 0 ? fmt::format(" and {} others q8_0", report->quantized_q8) : std::string();
    std::fprintf(stderr, "wrote %s: %lld tensors %s (%s)%s, %zu by fallback, %.2f MiB -> %.2f MiB\n", o->out.c_str(),
                 static_cast<long long>(report->quantized), o->type.c_str(),
                 std::string(TypeTraits(*SchemeType(opt)).name).c_str(), others.c_str(), report->fallbacks.size(),
                 report->bytes_in / 1048576.0, report->bytes_out / 1048576.0);
    return 0;
  };
}

}  // namespace gale

namespace gale {

CommandFn RegisterCalibrateKv(CLI::App& app) {
  struct Opts {
    std::string in, out, calib;
    int64_t calib_samples = 512, calib_seq_len = 512;
    int threads = ThreadPool::DefaultNumThreads();
  };
  auto o = std::make_shared<Opts>();
  app.add_option("-i,--input", o->in, "any GGUF gale loads (quantized or not)")->required();
  app.add_option("-o,--output", o->out, "output GGUF: the input's tensors unchanged, plus the key statistics")
      ->required();
  app.add_option("--calib", o->calib, "calibration samples: text, or JSONL with a \"prompt\" or \"text\" per line")
      ->required();
  app.add_option("--calib-samples", o->calib_samples, "most calibration samples")->capture_default_str();
  app.add_option("--calib-seq-len", o->calib_seq_len, "most tokens per sample (capped at the model's context)")
      ->capture_default_str();
  app.add_option("-t,--threads", o->threads, "threads")->capture_default_str();
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale calibrate-kv: %s\n", s.ToString().c_str());
      return 1;
    };
    if (o->in == o->out) return fail(InvalidArgument("the output would overwrite the input"));
    if (o->threads < 1) return fail(InvalidArgument("-t must be >= 1"));
    auto model = LoadModel(o->in, LoadOptions{.keep_packed_sources = true});  // its tensors are copied out
    if (!model.ok()) return fail(model.status());
    ThreadPool pool(o->threads);
    auto stats = Calibrate(*model, o->calib, o->calib_samples, o->calib_seq_len, /*rows=*/1, pool);
    if (!stats.ok()) return fail(stats.status());
    const ModelHParams& hp = model->model->hparams();
    const KeyChannels kc = KeyChannelsFromStats(*stats, hp);
    const GgufFile& in = *model->file;
    GgufWriter w;
    for (const auto& [key, value] : in.metadata()) w.SetValue(key, value);
    SetKeyChannelMetadata(kc, &w);
    for (const GgufTensorInfo& t : in.tensors()) {
      const uint8_t* data = t.data;
      const uint64_t size = t.num_bytes;
      if (Status s = w.AddTensor(t.name, t.type_id, t.shape, [data, size](uint8_t* dst, uint64_t) {
            std::memcpy(dst, data, size);
          });
          !s.ok()) {
        return fail(s);
      }
    }
    if (Status s = w.WriteFile(o->out); !s.ok()) return fail(s);
    float lo = INFINITY, hi = 0.0f;
    for (float v : kc.scale) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    std::fprintf(stderr, "wrote %s: key shift and scale for %lld layers x %lld KV channels (scales %.3g..%.3g); "
                 "int8/int4 key caches use them (--kv-key-channels)\n", o->out.c_str(),
                 static_cast<long long>(hp.num_layers), static_cast<long long>(hp.kv_dim()), lo, hi);
    return 0;
  };
}

}  // namespace gale
