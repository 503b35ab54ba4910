// The one table of architectures: general.architecture -> its loader. Explicit on purpose (static
// self-registration is dropped by static libraries); adding an architecture = one line here, one
// file under model/arch/ and its test.
#include <fmt/format.h>

#include "model/arch/arch.h"
#include "model/model.h"

namespace gale {
namespace {

struct Architecture {
  const char* name;  // as llama.cpp's converters write general.architecture
  StatusOr<std::unique_ptr<Model>> (*load)(const GgufFile& file, ModelHParams hp);
  bool experts = false;  // runs a mixture of experts where the file has one ({arch}.expert_count)
};

constexpr Architecture kArchitectures[] = {
    {"llama", LoadLlama, /*experts=*/true},
    {"qwen2", LoadQwen2},
    {"qwen3", LoadQwen3},
    {"qwen3moe", LoadQwen3Moe, /*experts=*/true},
    {"phi3", LoadPhi3},
    {"gemma2", LoadGemma2},
    {"gemma3", LoadGemma3},
    {"deepseek2", LoadDeepseek2, /*experts=*/true},
    {"deepseek4", LoadDeepseek4, /*experts=*/true},
    {"deepseek41", LoadDeepseek4, /*experts=*/true},
    {"glm4moe", LoadGlm4Moe, /*experts=*/true},
    {"gpt-oss", LoadGptOss, /*experts=*/true},
    {"bert", LoadBert},
};

}  // namespace

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (const Architecture& a : kArchitectures) names.emplace_back(a.name);
  return names;
}

StatusOr<std::unique_ptr<Model>> LoadModel(const GgufFile& file) {
  ASSIGN_OR_RETURN(std::string arch, file.GetString("general.architecture"));
  for (const Architecture& a : kArchitectures) {
    if (arch != a.name) continue;
    ASSIGN_OR_RETURN(ModelHParams hp, ReadHParams(file));
    if (hp.moe.enabled() && !a.experts) {
      return Unimplemented("{}: the file has {} experts, and a mixture of experts in this architecture is not supported", arch,
                           hp.moe.num_experts);
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model, a.load(file, std::move(hp)));
    RETURN_IF_ERROR(CheckLoadedHParams(model->hparams()));
    // A key the loader read with a default because its value was of another kind: the file asks
    // for something, just not in a form gale reads; running with the default would be wrong.
    if (const std::vector<std::string> mistyped = file.MistypedKeys(); !mistyped.empty()) {
      return InvalidArgument("metadata key '{}' has a value of the wrong kind for what it means (a number was expected)",
                             mistyped[0]);
    }
    return model;
  }
  return Unimplemented("architecture '{}' is not supported yet (gale runs {})", arch,
                       fmt::join(SupportedArchitectures(), ", "));
}

}  // namespace gale
