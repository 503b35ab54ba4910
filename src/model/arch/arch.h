// The architectures' loaders, for the registry (model/registry.cc). Each takes the shared
// hyperparameters (ReadHParams) and reads its own keys and tensors.
#pragma once

#include <memory>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/model.h"

namespace gale {

StatusOr<std::unique_ptr<Model>> LoadLlama(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadQwen2(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadQwen3(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadQwen3Moe(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadPhi3(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadGemma2(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadGemma3(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadDeepseek2(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadDeepseek4(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadGlm4Moe(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadGptOss(const GgufFile& file, ModelHParams hp);
StatusOr<std::unique_ptr<Model>> LoadBert(const GgufFile& file, ModelHParams hp);

}  // namespace gale
