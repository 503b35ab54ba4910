// `gale run --chat`: an interactive multi-turn chat on stdin/stdout through the engine. Each
// turn renders the whole conversation with the model's chat template and streams the reply.
#pragma once

#include <cstdint>
#include <string>

#include "engine/api.h"
#include "tools/cli_common.h"

namespace gale {

struct ChatOptions {
  std::string chat_template_file;  // "" = the model's tokenizer.chat_template
  std::string system;              // optional system message
  int64_t max_tokens = 512;        // per reply
  SamplingParams sampling;
  bool ignore_eos = false;
  int threads = 1;
};

int RunChat(const LoadedModel& m, const ChatOptions& o);

}  // namespace gale
