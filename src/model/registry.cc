// The one table of architectures: general.architecture -> its spec (loader, synthetic-model writer,
// quantization and conversion rules). Explicit on purpose (static self-registration is dropped by
// static libraries); adding an architecture = one line here, one file under model/arch/ and its
// test.
#include <fmt/format.h>

#include "model/arch/arch.h"
#include "model/model.h"

namespace gale {
namespace {

// The one table of architectures; each spec is defined in the architecture's own file.
constexpr const ArchSpec* kArchitectures[] = {
    &kLlamaArch, &kQwen2Arch, &kQwen3Arch, &kQwen3MoeArch, &kQwen35Arch, &kQwen35MoeArch, &kPhi3Arch, &kGemma2Arch, &kGemma3Arch,
    &kDeepseek2Arch, &kDeepseek4Arch, &kDeepseek41Arch, &kGlm4MoeArch, &kGptOssArch, &kBertArch,
};

}  // namespace

std::span<const ArchSpec* const> Architectures() { return kArchitectures; }

const ArchSpec* FindArchitecture(std::string_view name) {
  for (const ArchSpec* a : kArchitectures) {
    if (name == a->name) return a;
  }
  return nullptr;
}

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (const ArchSpec* a : kArchitectures) names.emplace_back(a->name);
  return names;
}

StatusOr<std::unique_ptr<Model>> LoadModel(const GgufFile& file) {
  ASSIGN_OR_RETURN(std::string arch, file.GetString("general.architecture"));
  if (const ArchSpec* a = FindArchitecture(arch)) {
    ASSIGN_OR_RETURN(ModelHParams hp, ReadHParams(file));
    if (hp.moe.enabled() && !a->experts) {
      return Unimplemented("{}: the file has {} experts, and a mixture of experts in this architecture is not supported", arch,
                           hp.moe.num_experts);
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model, a->load(file, std::move(hp)));
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
