// The architectures' loaders, for the registry (model/registry.cc). Each takes the shared
// hyperparameters (ReadHParams) and reads its own keys and tensors.
#pragma once

#include <memory>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/arch_spec.h"
#include "model/model.h"

namespace gale {

StatusOr<std::unique_ptr<Model>> LoadLlama(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadQwen2(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadQwen3(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadQwen3Moe(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadQwen35(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadQwen35Moe(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadPhi3(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadGemma2(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadGemma3(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadDeepseek2(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadDeepseek4(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadGlm4Moe(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadGptOss(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadBert(const GgufFile& file, ModelHParams hp);

// DeepSeek-V4 and V4.1 checkpoints as DeepSeek publishes them: their own converter
// (deepseek4_hf.cc), one family for both.
struct HfFamily;
extern const HfFamily kDeepseek4HfFamily;
// Qwen3.5 / 3.6 checkpoints (qwen35_hf.cc), dense and MoE, one family for both.
extern const HfFamily kQwen35HfFamily;

// Each architecture's spec, defined in its file (model/registry.cc lists them).
extern const ArchSpec kLlamaArch, kQwen2Arch, kQwen3Arch, kQwen3MoeArch, kQwen35Arch, kQwen35MoeArch, kPhi3Arch, kGemma2Arch, kGemma3Arch,
    kDeepseek2Arch, kDeepseek4Arch, kDeepseek41Arch, kGlm4MoeArch, kGptOssArch, kBertArch;

}  // namespace gale
