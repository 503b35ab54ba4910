// Tool calls and reasoning in a chat model's text: each model family writes a call its own way,
// and the API returns them as OpenAI `tool_calls` (and `<think>` blocks as `reasoning_content`).
//   hermes       <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>  (Qwen 2.5/3, Hermes, QwQ)
//   llama3_json  {"name": ..., "parameters": {...}}, optionally after <|python_tag|>, several
//                joined by ';' (Llama 3.1-3.3)
//   mistral      [TOOL_CALLS]name[ARGS]{...} or [TOOL_CALLS][{"name": ..., "arguments": {...}}]
//                (the marker is a control token, so a bare leading JSON array counts too)
//   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
//                (V3.1+), or function<｜tool▁sep｜>name\n```json\n{...}\n```  (V3)
//   kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}
//                <|tool_call_end|>...<|tool_calls_section_end|> (Kimi-K2, K2-Thinking): control
//                tokens, rendered into the text as gpt_oss's are
//   qwen3_coder  <tool_call>\n<function=name>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
//   glm45        <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>value</arg_value>\n</tool_call> (GLM-4.5 to
//                4.7, which writes no line breaks; Laguna): a value is text, or JSON where its
//                parameter is not a string
//   minimax_m2   <minimax:tool_call>\n<invoke name="name"><parameter name="p">value</parameter>...</invoke>
//                ...</minimax:tool_call> (MiniMax-M2, M2.1): values as glm45's
//   gpt_oss      OpenAI's harmony messages: <|channel|>analysis<|message|>... (reasoning),
//                <|channel|>final<|message|>... (content), <|channel|>commentary to=functions.name
//                <|constrain|>json<|message|>{...}<|call|> (a call); the control tokens must be in
//                the text (the server asks the engine to render them for this format)
//   gemma4       <|tool_call>call:name{key:value,...}<tool_call|>... (Gemma 4): values in Gemma's own
//                syntax (strings between <|"|> marks, keys bare, objects and arrays as JSON's),
//                control tokens rendered into the text; reasoning in <|channel>thought...<channel|>
//   functionary  <function=name>{...}</function> (Functionary v3.1; Granite 4 writes hermes)
//   functionary_v3_2  the prompt ends with ">>>"; parts "all\ntext" (content) and "name\n{...}" (a
//                call; python's may be raw code), joined by ">>>" (Functionary v3.2)
// A call whose JSON does not parse stays in the content, as text (except where vLLM's parsers
// return it as written: mistral's cut-off arguments, a harmony call's body). The format is chosen from the
// chat template (`--tool-call-parser` overrides). For tool_choice "required" or a named function,
// ToolCallGrammar writes a grammar that only lets the model write valid calls in its format.
// Pure functions and one streaming parser; no sockets, no engine.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace gale::server {

// Compact JSON text, invalid UTF-8 replaced: what the server sends (a call's arguments, answers).
inline std::string JsonText(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

enum class ToolCallFormat {
  kHermes, kLlama3Json, kMistral, kDeepSeekV3, kKimiK2, kQwen3Coder, kGlm45, kMinimaxM2, kGptOss, kGemma4, kFunctionary, kFunctionaryV32
};
const char* ToolCallFormatName(ToolCallFormat f);
StatusOr<ToolCallFormat> ParseToolCallFormat(const std::string& name);
// From a chat template's source: the markers it writes calls with; hermes when it shows none.
ToolCallFormat DetectToolCallFormat(std::string_view template_source);
// Whether the format's markers are control tokens, which the engine must then render into the
// text it returns (gpt_oss, kimi_k2, gemma4).
inline bool RendersControlTokens(ToolCallFormat f) {
  return f == ToolCallFormat::kGptOss || f == ToolCallFormat::kKimiK2 || f == ToolCallFormat::kGemma4;
}

// How a model marks its reasoning: a block from `open` to `close` at the start of its message.
struct ReasoningMarkers {
  std::string_view open, close;
};
inline constexpr ReasoningMarkers kThinkTags{"<think>", "</think>"};
inline constexpr ReasoningMarkers kGemma4Thought{"<|channel>thought", "<channel|>"};
// From a chat template's source: the reasoning markers its model writes, if any.
std::optional<ReasoningMarkers> DetectReasoning(std::string_view template_source);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
  std::string id;         // set by the server ("call_...")
};

struct ParsedMessage {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> calls;
};

// The JSON Schema type each tool declares for each parameter ("string", "integer", ...), by function
// name: Qwen3-Coder's XML values are text, converted by them (a string parameter "42" stays a
// string; an object parameter written as a Python literal becomes an object).
using ToolParamTypes = std::map<std::string, std::map<std::string, std::string>, std::less<>>;
ToolParamTypes ParamTypesOf(const nlohmann::ordered_json& tools);

// The whole text of a message (reasoning already split off). types: the request's tools' (may be
// null: a value is then taken as JSON where it parses, else as a string).
ParsedMessage ParseToolCalls(ToolCallFormat f, std::string_view text, const ToolParamTypes* types = nullptr);

// `<think>...</think>` (or other markers): the reasoning and the rest. starts_thinking: the prompt
// ended inside a think block (the template opened it), so the text starts with reasoning.
std::pair<std::string, std::string> SplitReasoning(std::string_view text, bool starts_thinking,
                                                   ReasoningMarkers markers = kThinkTags);

// Reads Gemma 4's argument syntax a character at a time and writes the same value as JSON text:
// strings between <|"|> marks (raw text, no escapes), object keys bare (or marked), numbers,
// true, false and null as JSON's; a bare word that is none of these is read as a string (None,
// True, False as Python's). Output is written as soon as it is certain, so a stream sends it as
// it is read. The value must be an object.
class GemmaArgsReader {
 public:
  enum class State { kMore, kDone, kError };
  State Feed(char c, std::string* out);
  State state() const { return state_; }

 private:
  enum class Mode { kStart, kValue, kValueOrClose, kKey, kKeyOrClose, kBareKey, kAfterKey, kString, kBare, kAfterValue };
  void Char(char c, std::string* out);
  void Mark(std::string* out);  // a <|"|> mark
  void EndBare(std::string* out);
  void Close(char c, std::string* out);
  State state_ = State::kMore;
  Mode mode_ = Mode::kStart;
  bool key_string_ = false;  // kString: the string is a key
  std::string stack_;        // open containers: 'o' object, 'a' array
  std::string held_;         // the start of a possible <|"|> mark
  std::string word_;         // a key or bare value being read
};

// A piece of a streamed call, as OpenAI's tool_calls deltas carry it: the first of a call names it
// (its arguments may be empty), later ones add to its arguments' text.
struct CallDelta {
  size_t index = 0;
  std::string name;  // set in the call's first delta only
  std::string arguments;
};

// Streams a message: Push gives what may be sent now as content or reasoning, and of the calls
// their names as soon as they are written and their arguments as they grow (hermes, qwen3_coder
// XML or JSON, glm45 and minimax_m2 (a parameter at a time), llama3_json, mistral, deepseek_v3, kimi_k2, gemma4,
// functionary, gpt_oss (a harmony message at a time), functionary_v3_2 (a part at a time)). Text that
// could be (the start of) a call is not content.
class MessageStream {
 public:
  // tools: parse tool calls; reasoning: split reasoning blocks (starts_thinking as above).
  // forced_calls: the output was constrained to calls (tool_choice required or named): it has no
  // content, so what of a call did not parse (a call cut by max_tokens) and the newlines between
  // a thought and the calls are dropped, never returned as content.
  MessageStream(std::optional<ToolCallFormat> tools, std::optional<ReasoningMarkers> reasoning, bool starts_thinking,
                bool forced_calls = false,
                std::shared_ptr<const ToolParamTypes> types = nullptr);
  // The same, reasoning in <think> blocks or none (the form tools outside the server call).
  MessageStream(std::optional<ToolCallFormat> tools, bool think_tags, bool starts_thinking, bool forced_calls = false,
                std::shared_ptr<const ToolParamTypes> types = nullptr)
      : MessageStream(tools, think_tags ? std::optional<ReasoningMarkers>(kThinkTags) : std::nullopt, starts_thinking,
                      forced_calls, std::move(types)) {}
  struct Delta {
    std::string content, reasoning;
    std::vector<CallDelta> calls;
  };
  Delta Push(std::string_view text);
  // The end: what was held back, and the calls, whole. rest (may be null): what of the calls was
  // not sent yet as deltas (a streamed call's remaining arguments; a call not yet streamed whole).
  ParsedMessage Finish(std::vector<CallDelta>* rest = nullptr);

 private:
  Delta PushText(std::string_view text);
  // Follows the calls in call_text_ from scan_pos_ on, adding what can be sent to `out`.
  void ScanCalls(std::vector<CallDelta>* out);
  bool ScanXmlParameter(std::string_view s, std::vector<CallDelta>* out);
  bool ScanPair(std::string_view s, std::vector<CallDelta>* out);
  void ScanHarmony(Delta* d);
  void ScanFunctionaryV32(Delta* d);
  void StreamPartCall(std::string_view name, std::string_view body, Delta* d);
  void SendArguments(std::string_view piece, std::vector<CallDelta>* out);

  std::optional<ToolCallFormat> tools_;
  std::shared_ptr<const ToolParamTypes> types_;
  std::optional<ReasoningMarkers> reasoning_;
  bool forced_calls_;
  bool thinking_;          // inside a think block now
  bool seen_content_ = false;
  std::string pending_;    // held back: a possible reasoning marker's start
  std::string call_text_;  // from the first call marker on
  bool in_calls_ = false;
  std::string reasoning_all_, content_all_;
  // The call scanner: where it is in call_text_, and in what.
  enum class Scan { kSeek, kJsonArguments, kWrapperEnd, kXmlParameters, kGlmArguments, kGemmaArguments, kCallEnd, kStopped };
  Scan scan_ = Scan::kSeek;
  size_t scan_pos_ = 0;
  int scan_depth_ = 0;  // kJsonArguments: brackets open
  bool scan_in_string_ = false, scan_escape_ = false;
  bool scan_wrapped_ = false;    // the arguments are a member of {"name": ..., "arguments": ...}
  bool scan_any_param_ = false;  // kXmlParameters, kGlmArguments: a parameter was sent
  bool scan_array_ = false;      // mistral's [{...}, {...}]
  GemmaArgsReader gemma_;        // kGemmaArguments
  // gpt_oss and functionary_v3_2 (ScanHarmony, ScanFunctionaryV32): where the message (part) being
  // written starts, how much of its body was sent, whether its call was named, and how much content
  // and reasoning went out in all.
  size_t part_pos_ = 0, part_sent_ = 0, parts_content_ = 0, parts_reasoning_ = 0;
  bool part_call_open_ = false;
  bool parts_stopped_ = false;  // functionary_v3_2: a part that is neither text nor a call; the rest goes at the end
  std::vector<CallDelta> streamed_;  // per call: its name and the arguments sent so far
};

// The most calls one constrained answer may hold (tool_choice required with parallel calls): the
// grammar is complete after them and generation ends, so a small model cannot repeat calls until
// max_tokens.
inline constexpr int kMaxParallelToolCalls = 8;

// A grammar (GBNF) for tool_choice "required" (name empty: any of the tools, one or more calls
// if parallel, at most kMaxParallelToolCalls) or a named function (name set: exactly one call of it), in the format's syntax,
// with each call's arguments valid against its function's parameters. Errors name the tool.
// token_id: a control token's id by its text (-1: not in the vocabulary), for formats whose
// calls are made of control tokens (gpt_oss: <|channel|>commentary to=functions.NAME
// <|constrain|>json<|message|>{...}<|call|>, one call, the grammar ending with <|call|>, which
// must then not be a stop token; kimi_k2 and gemma4: their markers, written as text where the
// vocabulary has no such token).
StatusOr<std::string> ToolCallGrammar(ToolCallFormat f, const nlohmann::ordered_json& tools, const std::string& name,
                                      bool parallel, const std::function<int32_t(std::string_view)>& token_id = nullptr);

}  // namespace gale::server
