// RoPE frequency scaling divisors.
#include "model/rope_scaling.h"

#include <cmath>

namespace gale {

std::vector<float> Llama3RopeFreqFactors(int64_t head_dim, double freq_base, double factor, double low_freq_factor,
                                         double high_freq_factor, double original_ctx) {
  const double low_wavelen = original_ctx / low_freq_factor;
  const double high_wavelen = original_ctx / high_freq_factor;
  std::vector<float> out(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(freq_base, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    const double wavelen = 2.0 * M_PI / freq;
    double f = 1.0;
    if (wavelen > low_wavelen) {
      f = factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    out[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return out;
}

}  // namespace gale
