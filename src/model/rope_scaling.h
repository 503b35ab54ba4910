// RoPE frequency scaling schemes that checkpoints describe by parameters and GGUF files store as
// per-frequency divisors (the rope_freqs.weight tensor llama.cpp's converter writes). Computes the
// divisors; applying them is the model's (kernels::RopeAngles).
#pragma once

#include <cstdint>
#include <vector>

namespace gale {

// Llama 3.1's rule (rope_scaling {"rope_type": "llama3", "factor", "low_freq_factor",
// "high_freq_factor", "original_max_position_embeddings"}): frequencies whose wavelength is past
// original_ctx / low_freq_factor are divided by factor, those under original_ctx /
// high_freq_factor kept, those between interpolated. [head_dim / 2] divisors.
std::vector<float> Llama3RopeFreqFactors(int64_t head_dim, double freq_base, double factor, double low_freq_factor,
                                         double high_freq_factor, double original_ctx);

}  // namespace gale
