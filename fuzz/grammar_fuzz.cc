// libFuzzer target for constrained decoding's untrusted inputs: the first byte picks one, the
// rest is the input. 0: GBNF text (parsed, compiled, then the rest of the input walked through the
// matcher byte by byte with a mask at each step); 1: a JSON Schema (to GBNF, parsed; objects open
// when bit 2 is set; also as a tool's parameters for the formats with their own value syntax); 2: a regex (to GBNF whole and searched, parsed, and to an automaton with a
// word list); 3: model output through every tool-call parser, whole and streamed. Any
// crash, exception, hang or sanitizer report is a bug; errors are fine.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/compiler.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "server/tool_calls.h"

namespace {

std::shared_ptr<const gale::grammar::TokenTrie> Trie() {
  // Single bytes plus some multi-byte tokens, as a real vocabulary mixes them.
  static auto trie = [] {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"{\"", "\":", "\",", "true", "false", "null", "\xE2\x82", "\xAC\"", " \"", "\n  "}) toks.push_back(t);
    return std::make_shared<const gale::grammar::TokenTrie>(toks, std::vector<bool>(toks.size(), true));
  }();
  return trie;
}

void Walk(const std::string& gbnf, std::string_view text) {
  auto g = gale::grammar::ParseGbnf(gbnf);
  if (!g.ok()) return;
  auto compiled = std::make_shared<const gale::grammar::CompiledGrammar>(std::move(*g), Trie(), 1 << 20);
  gale::grammar::GrammarMatcher m(compiled, {0});
  std::vector<float> logits(266, 0.0f);
  for (size_t i = 0; i < text.size() && i < 64; ++i) {
    m.MaskLogits(logits);
    if (!m.Accept(static_cast<unsigned char>(text[i])).ok()) break;
  }
  m.CanEnd();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      const size_t split = in.find('\x01');
      Walk(std::string(in.substr(0, split)), split == std::string_view::npos ? "" : in.substr(split + 1));
      break;
    }
    case 1: {
      auto j = nlohmann::ordered_json::parse(in.begin(), in.end(), nullptr, false);
      if (j.is_discarded()) break;
      gale::grammar::Constraint c{gale::grammar::Constraint::Kind::kJsonSchema, j.dump(), ""};
      if (data[0] & 4) c.objects = gale::grammar::ObjectKeys::kOpen;
      auto gbnf = gale::grammar::ConstraintToGbnf(c);
      if (gbnf.ok()) Walk(*gbnf, "{\"a\": 1}");
      // The same schema as a tool's parameters, written in the formats with their own value syntax.
      const nlohmann::ordered_json tools = {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", j}}}}};
      using gale::server::ToolCallFormat;
      for (auto f : {ToolCallFormat::kGemma4, ToolCallFormat::kGlm45, ToolCallFormat::kQwen3Coder}) {
        auto calls = gale::server::ToolCallGrammar(f, tools, "", true);
        if (calls.ok()) Walk(*calls, "<|tool_call>call:f{a:<|\"|>x<|\"|>}<tool_call|>");
      }
      break;
    }
    case 2: {
      auto e = gale::grammar::RegexToGbnf(in, gale::grammar::CharSetGbnf);
      if (e.ok()) Walk("root ::= " + *e, "abc123");
      auto j = gale::grammar::RegexToGbnf(in, gale::grammar::JsonStringCharSet, gale::grammar::RegexMatch::kSearch);
      if (j.ok()) (void)gale::grammar::ParseGbnf("root ::= " + *j);
      using gale::grammar::DfaLanguage;
      (void)gale::grammar::BuildDfa({DfaLanguage{std::string(in), gale::grammar::RegexMatch::kSearch, std::nullopt},
                                     DfaLanguage{"", gale::grammar::RegexMatch::kWhole, std::vector<std::string>{"ab", "b"}}},
                                    200);
      break;
    }
    default: {
      using gale::server::ToolCallFormat;
      for (auto f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral, ToolCallFormat::kDeepSeekV3,
                     ToolCallFormat::kKimiK2, ToolCallFormat::kQwen3Coder, ToolCallFormat::kGlm45, ToolCallFormat::kMinimaxM2,
                     ToolCallFormat::kGptOss, ToolCallFormat::kGemma4, ToolCallFormat::kFunctionary,
                     ToolCallFormat::kFunctionaryV32}) {
        gale::server::ParseToolCalls(f, in);
        gale::server::MessageStream ms(f, f == ToolCallFormat::kGemma4 ? gale::server::kGemma4Thought : gale::server::kThinkTags,
                                       in.size() % 2 == 0);
        for (size_t i = 0; i < in.size(); i += 5) ms.Push(in.substr(i, 5));
        ms.Finish();
      }
      gale::server::SplitReasoning(in, false);
      gale::server::SplitReasoning(in, true, gale::server::kGemma4Thought);
    }
  }
  return 0;
}
