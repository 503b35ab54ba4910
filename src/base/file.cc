#include "base/file.h"

#include <fstream>
#include <sstream>

namespace gale {

StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot open '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("reading '{}' failed", path);
  return ss.str();
}

}  // namespace gale
