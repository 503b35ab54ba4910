// Whole-file reads for the libraries that take paths (calibration text, Hugging Face folders).
#pragma once

#include <string>

#include "base/status.h"

namespace gale {

// The file's bytes; an IoError naming the path when it cannot be opened or read.
StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace gale
