// libFuzzer target for everything that parses an untrusted GGUF: the reader, then (when it
// parses) the model loader and the tokenizer, which read metadata and tensor shapes from it.
#include <cstddef>
#include <cstdint>
#include <span>

#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = gale::GgufFile::FromBytes(std::span<const uint8_t>(data, size));
  if (!file.ok()) return 0;
  for (const auto& t : (*file)->tensors()) {
    auto view = (*file)->Tensor(t.name);
    if (view.ok() && view->num_bytes > 0) {
      volatile uint8_t sink = view->data[view->num_bytes - 1];  // in bounds by construction
      (void)sink;
    }
  }
  auto model = gale::LoadModel(**file);
  auto tok = gale::Tokenizer::FromGguf(**file);
  if (tok.ok()) {
    auto ids = (*tok)->Encode("Hello world \xe6\x97\xa5 </s>", true, true);
    (void)(*tok)->Decode(ids);
  }
  return 0;
}
