// The chat loop: read a line, render, tokenize, stream the reply, remember it.
#include "tools/chat.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "model/chat_template.h"

namespace gale {

int RunChat(const LoadedModel& m, const ChatOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "gale run --chat: %s\n", s.ToString().c_str());
    return 1;
  };
  auto tmpl = o.chat_template_file.empty() ? ChatTemplate::FromGguf(*m.file) : ChatTemplate::FromFile(o.chat_template_file);
  if (!tmpl.ok()) return fail(tmpl.status());
  const Tokenizer& tok = *m.tok;
  const std::string bos = tok.bos_id() >= 0 ? tok.TokenText(tok.bos_id()) : "";
  const std::string eos = tok.eos_id() >= 0 ? tok.TokenText(tok.eos_id()) : "";
  ThreadPool pool(o.threads);
  EngineConfig cfg;
  cfg.sched.max_batch_size = 1;
  auto engine = Engine::Create(*m.model, &tok, cfg, pool);
  if (!engine.ok()) return fail(engine.status());
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  const bool interactive = isatty(STDIN_FILENO);
  if (interactive) std::fprintf(stderr, "chat: type a message and press Enter; Ctrl-D or /exit to quit\n");
  std::string line;
  uint64_t turn = 0;
  while (true) {
    if (interactive) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto text = tmpl->Apply(MarkLiteralSpecialTexts(tok, messages), /*add_generation_prompt=*/true, bos, eos);
    if (!text.ok()) return fail(text.status());
    GenerationRequest req;
    req.prompt = TokenizeChatPrompt(tok, *text);
    req.max_tokens = o.max_tokens;
    req.sampling = o.sampling;
    req.sampling.seed = o.sampling.seed + turn++;
    req.truncate = true;  // a long conversation keeps its start and its latest turns
    if (!o.ignore_eos) {
      req.stop_ids = tok.eog_ids();
    }
    if (static_cast<int64_t>(req.prompt.size()) + req.max_tokens > (*engine)->max_request_tokens()) {
      req.max_tokens = std::max<int64_t>(1, (*engine)->max_request_tokens() / 4);
    }
    auto stream = (*engine)->Submit(std::move(req));
    if (!stream.ok()) return fail(stream.status());
    std::string reply;
    StreamUpdate u;
    while ((*stream)->Next(&u)) {
      std::fwrite(u.text.data(), 1, u.text.size(), stdout);
      std::fflush(stdout);
      reply += u.text;
      if (u.finished && u.finish_reason == FinishReason::kError) return fail(u.status);
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

}  // namespace gale
