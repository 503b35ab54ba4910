// libFuzzer target for the safetensors reader (`gale convert --hf` maps downloaded checkpoints):
// parse arbitrary bytes and, when they parse, touch every tensor's first and last byte, which the
// reader promises are inside the file. Any crash or sanitizer report is a bug; errors are fine.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gguf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = gale::SafetensorsFile::FromBytes(std::vector<uint8_t>(data, data + size));
  if (!file.ok()) return 0;
  for (const auto& t : (*file)->tensors()) {
    (void)t.NumElements();
    (void)(*file)->Find(t.name);
    if (t.num_bytes > 0) {
      volatile uint8_t sink = t.data[0] ^ t.data[t.num_bytes - 1];
      (void)sink;
    }
  }
  return 0;
}
