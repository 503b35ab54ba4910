// libFuzzer target for tokenizer.json import (`gale convert --hf`): the input is a tokenizer.json
// (or, after a line "\n---\n", a tokenizer_config.json too); when it imports, the GGUF keys are
// written, the file read back and a tokenizer built from it encodes and decodes a text. Any crash,
// exception or sanitizer report is a bug; errors are fine.
#include <cstddef>
#include <cstdint>
#include <string>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/tokenizer.h"
#include "model/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t sep = in.find("\n---\n");
  const auto tj = nlohmann::json::parse(in.substr(0, sep), nullptr, false);
  const auto tcfg = sep == std::string::npos ? nlohmann::json() : nlohmann::json::parse(in.substr(sep + 5), nullptr, false);
  if (tj.is_discarded()) return 0;
  static const nlohmann::json config = {{"bos_token_id", 1}, {"eos_token_id", 2}};
  auto t = gale::ImportHfTokenizer(tj, tcfg.is_discarded() ? nlohmann::json() : tcfg, config, 300);
  if (!t.ok()) return 0;
  gale::GgufWriter w;
  w.SetString("general.architecture", "llama");
  gale::WriteHfTokenizer(*t, &w);
  const std::vector<uint8_t> bytes = w.WriteToBytes();
  auto file = gale::GgufFile::FromBytes(std::span<const uint8_t>(bytes.data(), bytes.size()));
  if (!file.ok()) return 0;
  auto tok = gale::Tokenizer::FromGguf(**file);
  if (tok.ok()) {
    auto ids = (*tok)->Encode("Hello world \xe6\x97\xa5 </s>", true, true);
    (void)(*tok)->Decode(ids);
  }
  return 0;
}
