// What the generic drivers (the loader, gale synth, gale quantize, gale convert --hf, the CLI)
// know of an architecture: everything comes from the architecture's own file under model/arch/
// through this struct, and the registry (model/registry.cc) lists one per architecture. A driver
// that needs something of a family adds a field here, never a test of its name.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/model.h"

namespace gale {

struct SynthShape;
class SynthWriter;
struct HfFamily;

struct ArchSpec {
  const char* name = "";  // general.architecture, as llama.cpp's converters write it
  StatusOr<std::unique_ptr<Model>> (*load)(const GgufFile& file, ModelHParams hp) = nullptr;
  bool experts = false;  // runs a mixture of experts where the file has one ({arch}.expert_count)
  // Latent attention (one compressed row per position, its own head sizes): the generic checks of
  // heads and head sizes do not apply, and calibrated quantization does not know its layers.
  bool latent_attention = false;

  // gale synth (model/synth.h): the checks of a shape beyond the generic ones (errors name the
  // flag), then the architecture's keys and tensors, written after the common keys.
  Status (*synth_check)(const SynthShape& s) = nullptr;
  Status (*synth_write)(SynthWriter& w) = nullptr;
  // Named shapes of real models of this architecture (gale synth --shape NAME).
  std::vector<SynthShape> (*synth_shapes)() = nullptr;

  // gale quantize: why a tensor stays as it is ("" when the generic rules decide).
  const char* (*keep_unquantized)(const GgufTensorInfo& t) = nullptr;
  // Calibrated quantization (SmoothQuant / AWQ transforms) knows its layers.
  bool calibrated_quantization = true;

  // gale convert --hf: the Hugging Face checkpoints of this architecture (null: none).
  const HfFamily* hf = nullptr;
};

// Every architecture, in the registry's order.
std::span<const ArchSpec* const> Architectures();
// The one named `name` (general.architecture), or null.
const ArchSpec* FindArchitecture(std::string_view name);

}  // namespace gale
