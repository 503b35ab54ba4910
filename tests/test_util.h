// Shared helpers for tests: paths to the source tree and ../shared, random data.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/rng.h"

namespace gale::test {

inline std::string SharedDir() { return GALE_SHARED_DIR; }
inline std::string SourceDir() { return GALE_SOURCE_DIR; }

inline std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& f : v) f = rng.Uniform(lo, hi);
  return v;
}

// A whole file's bytes ("" when it cannot be read; tests check what they expect in it).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace gale::test
