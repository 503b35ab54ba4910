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
};

constexpr Architecture kArchitectures[] = {
    {"llama", LoadLlama},
    {"qwen2", LoadQwen2},
    {"qwen3", LoadQwen3},
    {"phi3", LoadPhi3},
    {"gemma3", LoadGemma3},
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
    return a.load(file, std::move(hp));
  }
  return Unimplemented("architecture '{}' is not supported yet (gale runs {})", arch,
                       fmt::join(SupportedArchitectures(), ", "));
}

}  // namespace gale
