// Tool-call parsing per family on recorded model outputs, the streaming splitter against the
// whole-text parse, reasoning blocks, and the tool-call grammars (src/server/tool_calls.h).
#include "server/tool_calls.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "jinja/template.h"
#include "../grammar/byte_trie.h"
#include "../test_util.h"

namespace gale::server {
namespace {

using Json = nlohmann::ordered_json;

struct Expected {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments (any JSON spacing)
};

// Arguments are sent as the model wrote them: compared as JSON values.
// (Text that is not JSON, such as a cut call's raw arguments, is compared as text.)
Json Args(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? Json(text) : j;
}

// A message pushed to a stream in pieces of `piece` bytes, then finished: what came out.
struct Streamed {
  std::string content, reasoning;
  std::vector<CallDelta> calls;  // every call delta, those of Finish last
  ParsedMessage tail;            // what Finish returned (its content and reasoning are in the above too)
};
Streamed StreamInPieces(MessageStream& ms, const std::string& text, size_t piece) {
  Streamed out;
  for (size_t at = 0; at < text.size(); at += piece) {
    MessageStream::Delta d = ms.Push(text.substr(at, piece));
    out.content += d.content;
    out.reasoning += d.reasoning;
    out.calls.insert(out.calls.end(), d.calls.begin(), d.calls.end());
  }
  std::vector<CallDelta> rest;
  out.tail = ms.Finish(&rest);
  out.calls.insert(out.calls.end(), rest.begin(), rest.end());
  out.content += out.tail.content;
  out.reasoning += out.tail.reasoning;
  return out;
}

void ExpectParsed(ToolCallFormat f, const std::string& text, const Expected& want) {
  SCOPED_TRACE(std::string(ToolCallFormatName(f)) + ": " + text);
  const ParsedMessage got = ParseToolCalls(f, text);
  EXPECT_EQ(got.content, want.content);
  ASSERT_EQ(got.calls.size(), want.calls.size());
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, want.calls[i].first);
    EXPECT_EQ(Args(got.calls[i].arguments), Args(want.calls[i].second)) << got.calls[i].arguments;
  }
  // Streamed in pieces of every size up to 7 bytes: the same message, and the calls' deltas (as
  // they come and what Finish adds) add up to the same calls.
  for (size_t piece = 1; piece <= 7; ++piece) {
    MessageStream ms(f, /*reasoning=*/std::nullopt, /*starts_thinking=*/false);
    std::vector<std::pair<std::string, std::string>> streamed;
    auto take = [&](const std::vector<CallDelta>& deltas) {
      for (const CallDelta& d : deltas) {
        if (d.index == streamed.size()) {
          EXPECT_FALSE(d.name.empty()) << "piece " << piece << ": a call's first delta names it";
          streamed.push_back({d.name, ""});
        }
        ASSERT_LT(d.index, streamed.size());
        if (d.index + 1 == streamed.size() && !d.name.empty()) continue;
        EXPECT_TRUE(d.name.empty() || d.index + 1 == streamed.size());
      }
      for (const CallDelta& d : deltas) streamed[d.index].second += d.arguments;
    };
    const Streamed out = StreamInPieces(ms, text, piece);
    take(out.calls);
    const std::string& content = out.content;
    const ParsedMessage& tail = out.tail;
    ASSERT_EQ(tail.calls.size(), want.calls.size()) << "piece " << piece;
    for (size_t i = 0; i < want.calls.size(); ++i) EXPECT_EQ(tail.calls[i].arguments, got.calls[i].arguments);
    // (A call that began streaming and then did not parse has been sent in part: nothing to check.)
    if (!want.calls.empty()) {
      ASSERT_EQ(streamed.size(), want.calls.size()) << "piece " << piece;
      for (size_t i = 0; i < want.calls.size(); ++i) {
        EXPECT_EQ(streamed[i].first, want.calls[i].first) << "piece " << piece;
        EXPECT_EQ(streamed[i].second, got.calls[i].arguments) << "piece " << piece;
      }
    }
    if (want.calls.empty()) {
      EXPECT_EQ(content, text) << "piece " << piece;
    }
  }
}

// One tool, ping(n: integer).
nlohmann::ordered_json PingTool() {
  return nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}])");
}

// Whether the text is in the grammar, byte by byte.
bool GrammarAccepts(const std::string& gbnf, const std::string& text) {
  auto g = grammar::ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << gbnf;
  if (!g.ok()) return false;
  return test::AcceptsText(std::make_shared<const grammar::CompiledGrammar>(std::move(*g), test::ByteTrie()), text);
}

TEST(ToolCalls, HermesAndQwen) {
  const auto f = ToolCallFormat::kHermes;
  ExpectParsed(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
               {"", {{"get_weather", R"({"city":"Paris","days":2})"}}});
  // Text before, two calls.
  ExpectParsed(f,
               "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
               "{\"name\": \"b\", \"arguments\": {\"x\": [1, \"</tool_call>\"]}}\n</tool_call>",
               {"Let me check both.", {{"a", "{}"}, {"b", R"({"x":[1,"</tool_call>"]})"}}});
  // Malformed JSON stays as text; a good call after it is still a call.
  ExpectParsed(f, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }\n</tool_call>",
               {"<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": }\n</tool_call>", {}});
  // Arguments given as a JSON string (encoded twice), and a missing closing tag at the end.
  ExpectParsed(f, "<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": true}\"}", {"", {{"a", R"({"k":true})"}}});
  // No call at all: content untouched, including a '<' that is not a tag.
  ExpectParsed(f, "x < y and <b>bold</b>", {"x < y and <b>bold</b>", {}});
  // Qwen3-Coder's XML form.
  ExpectParsed(ToolCallFormat::kQwen3Coder,
               "<tool_call>\n<function=search>\n<parameter=query>\nbest pizza\n</parameter>\n<parameter=limit>\n5\n</parameter>\n"
               "</function>\n</tool_call>",
               {"", {{"search", R"({"query":"best pizza","limit":5})"}}});
}

// Streamed calls go out as they are written: the name once it is complete, then the arguments
// in pieces, each format's text pushed a byte at a time.
TEST(ToolCalls, CallsStreamAsTheyAreWritten) {
  struct Case {
    ToolCallFormat f;
    std::string text;
    std::string arguments;
  };
  const std::vector<Case> cases = {
      {ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"path\": \"a.txt\", \"text\": \"x y\"}}\n</tool_call>",
       R"({"path": "a.txt", "text": "x y"})"},
      {ToolCallFormat::kQwen3Coder,
       "<tool_call>\n<function=write>\n<parameter=path>\na.txt\n</parameter>\n<parameter=text>\nx y\n</parameter>\n</function>\n</tool_call>",
       R"({"path":"a.txt","text":"x y"})"},  // built from the parameters
      {ToolCallFormat::kLlama3Json, "{\"name\": \"write\", \"parameters\": {\"path\": \"a.txt\", \"text\": \"x y\"}}",
       R"({"path": "a.txt", "text": "x y"})"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS]write[ARGS]{\"path\": \"a.txt\", \"text\": \"x y\"}", R"({"path": "a.txt", "text": "x y"})"},
      {ToolCallFormat::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write<｜tool▁sep｜>{\"path\": \"a.txt\", \"text\": \"x y\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       R"({"path": "a.txt", "text": "x y"})"},
      {ToolCallFormat::kKimiK2,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>{\"path\": \"a.txt\", "
       "\"text\": \"x y\"}<|tool_call_end|><|tool_calls_section_end|>",
       R"({"path": "a.txt", "text": "x y"})"},
      {ToolCallFormat::kFunctionary, "<function=write>{\"path\": \"a.txt\", \"text\": \"x y\"}</function>", R"({"path": "a.txt", "text": "x y"})"},
      {ToolCallFormat::kGemma4, "<|tool_call>call:write{path:<|\"|>a.txt<|\"|>,text:<|\"|>x y<|\"|>}<tool_call|>",
       R"({"path":"a.txt","text":"x y"})"},  // converted as it is read
      {ToolCallFormat::kGptOss,
       "<|channel|>commentary to=functions.write <|constrain|>json<|message|>{\"path\": \"a.txt\", \"text\": \"x y\"}<|call|>",
       R"({"path": "a.txt", "text": "x y"})"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ToolCallFormatName(c.f));
    MessageStream ms(c.f, std::nullopt, false);
    size_t named_at = 0, pieces = 0, closed_at = c.text.size();
    std::string args;
    for (size_t at = 0; at < c.text.size(); ++at) {
      for (const CallDelta& d : ms.Push(c.text.substr(at, 1)).calls) {
        EXPECT_EQ(d.index, 0u);
        if (!d.name.empty()) {
          EXPECT_EQ(d.name, "write");
          named_at = at;
        }
        if (!d.arguments.empty()) ++pieces;
        args += d.arguments;
      }
      if (args == c.arguments && closed_at == c.text.size()) closed_at = at;
    }
    std::vector<CallDelta> rest;
    ms.Finish(&rest);
    EXPECT_TRUE(rest.empty());
    EXPECT_EQ(args, c.arguments);
    EXPECT_GT(named_at, 0u);
    EXPECT_LT(named_at + 8, closed_at);  // named well before the arguments are complete
    EXPECT_GE(pieces, 2u);
  }
}

TEST(ToolCalls, Qwen3CoderXmlEdges) {
  const auto f = ToolCallFormat::kQwen3Coder;
  // <function=...> without <tool_call> around it, a stray </tool_call> after it.
  ExpectParsed(f, "Checking.\n<function=search>\n<parameter=query>\ncats\n</parameter>\n</function>\n</tool_call>",
               {"Checking.", {{"search", R"({"query":"cats"})"}}});
  // A parameter missing its </parameter> ends at the next parameter.
  ExpectParsed(f, "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>",
               {"", {{"f", R"({"a":"x","b":2})"}}});
  // A Python dict for a value is an object.
  ExpectParsed(f, "<tool_call>\n<function=f>\n<parameter=o>\n{'k': True, 'n': None}\n</parameter>\n</function>\n</tool_call>",
               {"", {{"f", R"({"o":{"k":true,"n":null}})"}}});
  // Without </function> it is not a call.
  const std::string cut = "<tool_call>\n<function=f>\n<parameter=a>\n1";
  ExpectParsed(f, cut, {cut, {}});
}

TEST(ToolCalls, Qwen3CoderValuesFollowTheDeclaredTypes) {
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}, "on": {"type": "boolean"},
      "tag": {"enum": ["1", "2"]}, "o": {"type": "object"}, "maybe": {"type": ["string", "null"]}}}}}])");
  const ToolParamTypes types = ParamTypesOf(tools);
  const std::string text =
      "<tool_call>\n<function=f>\n<parameter=zip>\n02139\n</parameter>\n<parameter=n>\n7\n</parameter>\n"
      "<parameter=on>\nTrue\n</parameter>\n<parameter=tag>\n2\n</parameter>\n<parameter=o>\n{'a': [1, 'b']}\n</parameter>\n"
      "<parameter=maybe>\n42\n</parameter>\n<parameter=other>\n3.5\n</parameter>\n</function>\n</tool_call>";
  const ParsedMessage p = ParseToolCalls(ToolCallFormat::kQwen3Coder, text, &types);
  ASSERT_EQ(p.calls.size(), 1u);
  // Declared strings stay strings ("02139", "2", "42"); an undeclared value is JSON where it parses.
  EXPECT_EQ(p.calls[0].arguments, R"({"zip":"02139","n":7,"on":true,"tag":"2","o":{"a":[1,"b"]},"maybe":"42","other":3.5})");
  // Without the tools: JSON where it parses.
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kQwen3Coder, text).calls[0].arguments,
            R"({"zip":"02139","n":7,"on":"True","tag":2,"o":{"a":[1,"b"]},"maybe":42,"other":3.5})");
  // Streamed, with the types: the same.
  MessageStream ms(ToolCallFormat::kQwen3Coder, std::nullopt, false, false, std::make_shared<const ToolParamTypes>(types));
  for (char c : text) EXPECT_EQ(ms.Push(std::string(1, c)).content, "");
  EXPECT_EQ(ms.Finish().calls[0].arguments, p.calls[0].arguments);
}

TEST(ToolCalls, Glm45) {
  const auto f = ToolCallFormat::kGlm45;
  // GLM-4.5/4.6 write line breaks, with text before the call.
  ExpectParsed(f,
               "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
               "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
               {"Let me check.", {{"get_weather", R"({"city":"Paris","days":3})"}}});
  // GLM-4.7 writes none; a call without arguments.
  ExpectParsed(f, "<tool_call>a<arg_key>x</arg_key><arg_value>[1, 2]</arg_value></tool_call><tool_call>b</tool_call>",
               {"", {{"a", R"({"x":[1,2]})"}, {"b", "{}"}}});
  // A Python dict for a value is an object; keys and values are trimmed.
  ExpectParsed(f, "<tool_call>f\n<arg_key> o </arg_key>\n<arg_value>\n{'k': True}\n</arg_value>\n</tool_call>",
               {"", {{"f", R"({"o":{"k":true}})"}}});
  // Cut off before </tool_call>, or with other text inside: no call, the text stays content.
  const std::string cut = "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1";
  ExpectParsed(f, cut, {cut, {}});
  const std::string stray = "<tool_call>f\nhello</tool_call>";
  ExpectParsed(f, stray, {stray, {}});
  const std::string hermes = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  ExpectParsed(f, hermes, {hermes, {}});
}

TEST(ToolCalls, Glm45ValuesFollowTheDeclaredTypes) {
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "properties": {"zip": {"type": "string"}, "n": {"type": "integer"},
      "maybe": {"type": ["string", "null"]}, "tag": {"enum": ["1", "2"]}}}}}])");
  const ToolParamTypes types = ParamTypesOf(tools);
  const std::string text =
      "<tool_call>f\n<arg_key>zip</arg_key>\n<arg_value>02139</arg_value>\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n"
      "<arg_key>maybe</arg_key>\n<arg_value>42</arg_value>\n<arg_key>tag</arg_key>\n<arg_value>2</arg_value>\n"
      "<arg_key>s</arg_key>\n<arg_value>\"q\"</arg_value>\n</tool_call>";
  const ParsedMessage p = ParseToolCalls(ToolCallFormat::kGlm45, text, &types);
  ASSERT_EQ(p.calls.size(), 1u);
  // Declared strings stay text; anything else is JSON where it parses (an undeclared "q" too).
  EXPECT_EQ(p.calls[0].arguments, R"({"zip":"02139","n":7,"maybe":"42","tag":"2","s":"q"})");
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kGlm45, text).calls[0].arguments,
            R"({"zip":"02139","n":7,"maybe":42,"tag":2,"s":"q"})");
  MessageStream ms(ToolCallFormat::kGlm45, std::nullopt, false, false, std::make_shared<const ToolParamTypes>(types));
  std::string streamed;
  for (char c : text) {
    const MessageStream::Delta d = ms.Push(std::string(1, c));
    EXPECT_EQ(d.content, "");
    for (const CallDelta& cd : d.calls) streamed += cd.arguments;
  }
  EXPECT_EQ(streamed, p.calls[0].arguments);
  EXPECT_EQ(ms.Finish().calls[0].arguments, p.calls[0].arguments);
}

TEST(ToolCalls, Glm45RequiredCallIsItsOwnArgPairs) {
  const auto f = ToolCallFormat::kGlm45;
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {"name": "find", "parameters": {"type": "object", "properties": {
          "query": {"type": "string"}, "limit": {"type": "integer"}, "zone": {"enum": ["utc", "local"]},
          "tags": {"type": "array", "items": {"type": "string"}}, "near": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
          "required": ["query", "zone"]}}}])");
  auto g = ToolCallGrammar(f, tools, "", /*parallel=*/true);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::string call = "<tool_call>find\n<arg_key>query</arg_key>\n<arg_value>best\npizza <b></arg_value>\n"
                           "<arg_key>zone</arg_key>\n<arg_value>local</arg_value>\n<arg_key>tags</arg_key>\n"
                           "<arg_value>[\"a\"]</arg_value>\n<arg_key>near</arg_key>\n<arg_value>null</arg_value>\n</tool_call>";
  EXPECT_TRUE(GrammarAccepts(*g, call));
  EXPECT_TRUE(GrammarAccepts(*g, call + "\n" + call));  // parallel calls
  // GLM-4.7's form, without line breaks.
  EXPECT_TRUE(GrammarAccepts(*g, "<tool_call>find<arg_key>query</arg_key><arg_value>x</arg_value><arg_key>limit</arg_key>"
                                 "<arg_value>3</arg_value><arg_key>zone</arg_key><arg_value>utc</arg_value></tool_call>"));
  // A required parameter left out, a value off the enum or of the wrong type, hermes JSON.
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>find\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>find\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n<arg_key>zone"
                                  "</arg_key>\n<arg_value>mars</arg_value>\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>find\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n<arg_key>limit"
                                  "</arg_key>\n<arg_value>many</arg_value>\n<arg_key>zone</arg_key>\n<arg_value>utc"
                                  "</arg_value>\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>\n{\"name\":\"find\",\"arguments\":{\"query\":\"x\",\"zone\":\"utc\"}}\n</tool_call>"));
  // Named: exactly one call.
  auto one = ToolCallGrammar(f, tools, "find", /*parallel=*/true);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_TRUE(GrammarAccepts(*one, call));
  EXPECT_FALSE(GrammarAccepts(*one, call + "\n" + call));
  // What the grammar lets through parses back to arguments valid for the schema.
  const ToolParamTypes types = ParamTypesOf(tools);
  const ParsedMessage p = ParseToolCalls(f, call, &types);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"query":"best\npizza <b>","zone":"local","tags":["a"],"near":null})");
  // A string with a format has no <arg_value> form: refused, naming the tool.
  const auto mail = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "mail", "parameters": {
      "type": "object", "properties": {"to": {"type": "string", "format": "email"}}}}}])");
  auto refused = ToolCallGrammar(f, mail, "", false);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'mail'"), std::string::npos) << refused.status().message();
}

// A template's own rendering of an assistant message with one get_weather call (llama.cpp's
// models/templates, derived at set-up): the format is detected, the call (from the last `open` to
// its `close`) parses back to its arguments, and the named-call grammar allows it.
void ExpectTemplateCallParsesBack(const std::string& file, ToolCallFormat f, const std::string& open,
                                  const std::string& close) {
  SCOPED_TRACE(file);
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}, "units": {"type": "array", "items": {"type": "string"}}}, "required": ["city"]}}}])");
  const auto args = nlohmann::ordered_json::parse(R"({"city": "São Paulo", "days": 3, "units": ["c"]})");
  const std::string path = test::DataDir() + "/chat-templates/templates/" + file;
  GALE_SKIP_UNLESS_FILE(path);
  std::ifstream in(path);
  std::stringstream src;
  src << in.rdbuf();
  EXPECT_EQ(DetectToolCallFormat(src.str()), f);
  auto tmpl = jinja::Template::Parse(src.str());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
  nlohmann::ordered_json ctx = {{"tools", tools}, {"add_generation_prompt", false}};
  ctx["messages"] = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "Weather?"}},
       {{"role", "assistant"}, {"content", ""},
        {"tool_calls", {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", args}}}}}}}});
  auto text = tmpl->Render(ctx);
  ASSERT_TRUE(text.ok()) << text.status().message();
  const size_t start = text->rfind(open), end = text->find(close, start);
  ASSERT_NE(end, std::string::npos) << *text;
  const std::string rendered = text->substr(start, end + close.size() - start);
  const ToolParamTypes types = ParamTypesOf(tools);
  const ParsedMessage p = ParseToolCalls(f, rendered, &types);
  ASSERT_EQ(p.calls.size(), 1u) << rendered;
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::ordered_json::parse(p.calls[0].arguments), args) << rendered;
  auto g = ToolCallGrammar(f, tools, "get_weather", false);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(GrammarAccepts(*g, rendered)) << rendered;
}

TEST(ToolCalls, Glm45ReadsWhatTheRealTemplatesWrite) {
  for (const char* name : {"GLM-4.6.jinja", "GLM-4.7-Flash.jinja"}) {
    ExpectTemplateCallParsesBack(name, ToolCallFormat::kGlm45, "<tool_call>get_weather", "</tool_call>");
  }
}

TEST(ToolCalls, MinimaxM2) {
  const auto f = ToolCallFormat::kMinimaxM2;
  // Text before a block of two calls (one without parameters), with the template's line breaks.
  ExpectParsed(f,
               "Let me check.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n"
               "<parameter name=\"days\">3</parameter>\n</invoke>\n<invoke name=\"now\"></invoke>\n</minimax:tool_call>",
               {"Let me check.", {{"get_weather", R"({"city":"Paris","days":3})"}, {"now", "{}"}}});
  // Single quotes, no line breaks, two blocks; a Python dict is an object; values are trimmed.
  ExpectParsed(f,
               "<minimax:tool_call><invoke name='a'><parameter name='x'>[1, 2]</parameter></invoke></minimax:tool_call>"
               "<minimax:tool_call><invoke name=\"b\"><parameter name=\"o\">\n{'k': True}\n</parameter></invoke>"
               "</minimax:tool_call>",
               {"", {{"a", R"({"x":[1,2]})"}, {"b", R"({"o":{"k":true}})"}}});
  // Cut off before </minimax:tool_call>, or other text inside an invoke: no call, the text stays.
  const std::string cut = "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">1";
  ExpectParsed(f, cut, {cut, {}});
  const std::string stray = "<minimax:tool_call><invoke name=\"f\">hello</invoke></minimax:tool_call>";
  ExpectParsed(f, stray, {stray, {}});
  EXPECT_EQ(*ParseToolCallFormat("minimax_m2"), f);
  EXPECT_EQ(DetectToolCallFormat("{%- set t = '<minimax:tool_call>' -%}<invoke name=\"{{ n }}\">"), f);
}

TEST(ToolCalls, MinimaxM2RequiredCallIsItsOwnInvoke) {
  const auto f = ToolCallFormat::kMinimaxM2;
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {"name": "find", "parameters": {"type": "object", "properties": {
          "query": {"type": "string"}, "limit": {"type": "integer"}, "zone": {"enum": ["utc", "local"]},
          "near": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["query", "zone"]}}}])");
  auto g = ToolCallGrammar(f, tools, "", /*parallel=*/true);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::string invoke = "<invoke name=\"find\">\n<parameter name=\"query\">best\npizza <b></parameter>\n"
                             "<parameter name=\"limit\">3</parameter>\n<parameter name=\"zone\">local</parameter>\n"
                             "<parameter name=\"near\">null</parameter>\n</invoke>";
  const std::string call = "<minimax:tool_call>\n" + invoke + "\n</minimax:tool_call>";
  EXPECT_TRUE(GrammarAccepts(*g, call));
  EXPECT_TRUE(GrammarAccepts(*g, "<minimax:tool_call>\n" + invoke + "\n" + invoke + "\n</minimax:tool_call>"));
  // A required parameter left out, a value off the enum or of the wrong type.
  EXPECT_FALSE(GrammarAccepts(*g, "<minimax:tool_call>\n<invoke name=\"find\">\n<parameter name=\"query\">x</parameter>\n"
                                  "</invoke>\n</minimax:tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<minimax:tool_call>\n<invoke name=\"find\"><parameter name=\"query\">x</parameter>"
                                  "<parameter name=\"zone\">mars</parameter></invoke>\n</minimax:tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<minimax:tool_call>\n<invoke name=\"find\"><parameter name=\"query\">x</parameter>"
                                  "<parameter name=\"limit\">many</parameter><parameter name=\"zone\">utc</parameter>"
                                  "</invoke>\n</minimax:tool_call>"));
  // Named: exactly one call.
  auto one = ToolCallGrammar(f, tools, "find", /*parallel=*/true);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_TRUE(GrammarAccepts(*one, call));
  EXPECT_FALSE(GrammarAccepts(*one, "<minimax:tool_call>\n" + invoke + "\n" + invoke + "\n</minimax:tool_call>"));
  // What the grammar lets through parses back to arguments valid for the schema.
  const ToolParamTypes types = ParamTypesOf(tools);
  const ParsedMessage p = ParseToolCalls(f, call, &types);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"query":"best\npizza <b>","limit":3,"zone":"local","near":null})");
  // Streamed with the types, a parameter at a time: the same arguments.
  MessageStream ms(f, std::nullopt, false, false, std::make_shared<const ToolParamTypes>(types));
  std::string streamed;
  for (char c : call) {
    const MessageStream::Delta d = ms.Push(std::string(1, c));
    EXPECT_EQ(d.content, "");
    for (const CallDelta& cd : d.calls) streamed += cd.arguments;
  }
  EXPECT_EQ(streamed, p.calls[0].arguments);
  // A string with a format has no form: refused, naming the tool.
  const auto mail = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "mail", "parameters": {
      "type": "object", "properties": {"to": {"type": "string", "format": "email"}}}}}])");
  auto refused = ToolCallGrammar(f, mail, "", false);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'mail'"), std::string::npos) << refused.status().message();
}

TEST(ToolCalls, MinimaxM2ReadsWhatTheRealTemplateWrites) {
  ExpectTemplateCallParsesBack("MiniMax-M2.jinja", ToolCallFormat::kMinimaxM2, "<minimax:tool_call>", "</minimax:tool_call>");
}

TEST(ToolCalls, Llama3Json) {
  const auto f = ToolCallFormat::kLlama3Json;
  ExpectParsed(f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", {"", {{"get_weather", R"({"city":"Oslo"})"}}});
  ExpectParsed(f, "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"x;y\"}}; {\"name\": \"b\", \"parameters\": {}}",
               {"", {{"a", R"({"s":"x;y"})"}, {"b", "{}"}}});
  ExpectParsed(f, "The answer is {\"name\": 1}", {"The answer is {\"name\": 1}", {}});
  // A call followed by prose: the call (the prose goes, as in vLLM's parser).
  ExpectParsed(f, "{\"name\": \"a\", \"parameters\": {}} and then text", {"", {{"a", "{}"}}});
  // A name without parameters is not a call.
  ExpectParsed(f, "{\"name\": \"a\"}", {"{\"name\": \"a\"}", {}});
  // Calls inside prose, when the whole message is parsed at once (streaming has sent the prose
  // by then, as vLLM's does).
  const ParsedMessage p = ParseToolCalls(f, "Results: {\"name\": \"s\", \"parameters\": {\"q\": 1}}; {\"name\": \"t\", "
                                            "\"parameters\": {}} Anything else?");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].name, "t");
  EXPECT_EQ(p.content, "");
}

TEST(ToolCalls, Mistral) {
  const auto f = ToolCallFormat::kMistral;
  ExpectParsed(f, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"n\": 1}}, {\"name\": \"b\", \"arguments\": {}}]",
               {"", {{"a", R"({"n":1})"}, {"b", "{}"}}});
  ExpectParsed(f, "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}", {"Sure.", {{"get_weather", R"({"city":"Rome"})"}}});
  ExpectParsed(f, "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}", {"", {{"a", R"({"x":1})"}, {"b", "{}"}}});
  // The control token missing from the text: a bare leading array of calls.
  ExpectParsed(f, "[{\"name\": \"a\", \"arguments\": {}}]", {"", {{"a", "{}"}}});
  ExpectParsed(f, "[1, 2, 3] are numbers", {"[1, 2, 3] are numbers", {}});
  // v11+ text whose [ARGS] the decoder dropped: NAME{...}, one per [TOOL_CALLS].
  ExpectParsed(f, "Ok[TOOL_CALLS]add{\"a\": 1}[TOOL_CALLS]mul{\"b\": 2}", {"Ok", {{"add", R"({"a":1})"}, {"mul", R"({"b":2})"}}});
  // Arguments cut off come back as written; a name alone is no call.
  ExpectParsed(f, "[TOOL_CALLS]sh{\"cmd\": \"ls", {"", {{"sh", "{\"cmd\": \"ls"}}});
  EXPECT_EQ(ParseToolCalls(f, "[TOOL_CALLS]just_a_name").content, "");
  EXPECT_TRUE(ParseToolCalls(f, "[TOOL_CALLS]just_a_name").calls.empty());
  // Before v11: the array past any junk, and text that is no call loses the marker only.
  ExpectParsed(f, "[TOOL_CALLS] oh [{\"name\": \"a\", \"arguments\": {}}] trailing", {"", {{"a", "{}"}}});
  EXPECT_EQ(ParseToolCalls(f, "[TOOL_CALLS] not json").content, "not json");
}

TEST(ToolCalls, DeepSeek) {
  const auto f = ToolCallFormat::kDeepSeekV3;
  ExpectParsed(f,
               "I will look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Lima\"}"
               "<｜tool▁call▁end｜><｜tool▁call▁begin｜>b<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
               {"I will look.", {{"get_weather", R"({"city":"Lima"})"}, {"b", "{}"}}});
  // V3's form: function<sep>name, then fenced JSON.
  ExpectParsed(f,
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1, \"b\": 2}\n```"
               "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
               {"", {{"add", R"({"a":1,"b":2})"}}});
  const std::string broken = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{oops<｜tool▁call▁end｜>";
  ExpectParsed(f, broken, {broken, {}});
  // Text after the closed block of calls goes.
  ExpectParsed(f, "Hi<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜> bye",
               {"Hi", {{"a", "{}"}}});
}

TEST(ToolCalls, GptOssHarmony) {
  const auto f = ToolCallFormat::kGptOss;
  // Reasoning, then a call (the generation stopped at <|call|>, which is not in the text).
  ParsedMessage p = ParseToolCalls(f,
      "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}");
  EXPECT_EQ(p.reasoning, "Need the weather.");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Oslo"})");
  // The recipient in the role's header, a preamble, and a final answer.
  p = ParseToolCalls(f,
      "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
      "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{\"a\": 1}<|call|>");
  EXPECT_EQ(p.content, "Checking.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "add");
  p = ParseToolCalls(f, "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Four.");
  EXPECT_EQ(p.reasoning, "think");
  EXPECT_EQ(p.content, "Four.");
  EXPECT_TRUE(p.calls.empty());
  // A call whose body is not JSON keeps its body as the arguments, as vLLM returns it; plain text
  // without channels is content.
  p = ParseToolCalls(f, "<|channel|>commentary to=functions.x<|message|>{oops<|call|>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{oops");
  EXPECT_EQ(p.content, "");
  // Recipients without functions. (bare, dotted) are calls; one addressed to the assistant is dropped.
  p = ParseToolCalls(f, " to=math.sum<|channel|>commentary json<|message|>{\"a\": 2}<|call|><|start|>assistant to=now"
                        "<|channel|>commentary<|message|>{}<|call|>");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "math.sum");
  EXPECT_EQ(p.calls[1].name, "now");
  p = ParseToolCalls(f, " to=assistant<|channel|>commentary<|message|>echo<|call|><|start|>assistant<|channel|>final"
                        "<|message|>Done.<|end|>");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "Done.");
  EXPECT_EQ(ParseToolCalls(f, "Hello").content, "Hello");
  // Streamed: each message as it comes (the last one's end is the stop token, not in the text).
  MessageStream ms(f, kThinkTags, false);
  const MessageStream::Delta first = ms.Push("<|channel|>analysis<|message|>hm<|end|>");
  EXPECT_TRUE(first.content.empty());
  EXPECT_EQ(first.reasoning, "hm");
  EXPECT_EQ(ms.Push("<|start|>assistant<|channel|>final<|message|>Yes.").content, "Yes.");
  ParsedMessage tail = ms.Finish();
  EXPECT_EQ(tail.reasoning, "");
  EXPECT_EQ(tail.content, "");
  EXPECT_EQ(DetectToolCallFormat("{{- '<|start|>assistant<|channel|>final<|message|>' }}"), f);
  EXPECT_FALSE(ToolCallGrammar(f, nlohmann::ordered_json::array(), "", true).ok());
}

// tool_choice required for Qwen3-Coder: calls in its own XML, each value by its parameter's
// schema (raw text for strings, one of the texts for string enums, JSON for the rest); a tool
// whose schema XML cannot hold is written as JSON inside <tool_call>, which the parser takes too.
TEST(ToolCalls, Qwen3CoderRequiredCallIsItsOwnXml) {
  const auto f = ToolCallFormat::kQwen3Coder;
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {"name": "find", "parameters": {"type": "object", "properties": {
          "query": {"type": "string", "description": "what"}, "limit": {"type": "integer"},
          "zone": {"enum": ["utc", "local"]}, "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["query", "zone"]}}},
      {"type": "function", "function": {"name": "mail", "parameters": {"type": "object", "properties": {
          "to": {"type": "string", "format": "email"}}, "required": ["to"]}}}])");
  auto g = ToolCallGrammar(f, tools, "", /*parallel=*/false);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::string call = "<tool_call>\n<function=find>\n<parameter=query>\nbest\npizza <b>\n</parameter>\n"
                           "<parameter=zone>\nlocal\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(GrammarAccepts(*g, call));
  EXPECT_TRUE(GrammarAccepts(*g, "<tool_call>\n<function=find>\n<parameter=query>\nx\n</parameter>\n<parameter=limit>\n3\n"
                                 "</parameter>\n<parameter=zone>\nutc\n</parameter>\n</function>\n</tool_call>"));
  // A required parameter left out, a value off the enum or of the wrong type, or JSON for this tool.
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>\n<function=find>\n<parameter=query>\nx\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>\n<function=find>\n<parameter=query>\nx\n</parameter>\n<parameter=zone>\nmars\n"
                                  "</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>\n<function=find>\n<parameter=query>\nx\n</parameter>\n<parameter=limit>\nmany\n"
                                  "</parameter>\n<parameter=zone>\nutc\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>\n{\"name\":\"find\",\"arguments\":{\"query\":\"x\",\"zone\":\"utc\"}}\n</tool_call>"));
  // The e-mail format needs JSON's string rules: that tool is JSON inside the tags.
  EXPECT_TRUE(GrammarAccepts(*g, "<tool_call>\n{\"name\":\"mail\",\"arguments\":{\"to\":\"a@b.org\"}}\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>\n{\"name\":\"mail\",\"arguments\":{\"to\":\"nobody\"}}\n</tool_call>"));
  // What the grammar lets through parses back to arguments valid for the schema.
  const ToolParamTypes types = ParamTypesOf(tools);
  const ParsedMessage p = ParseToolCalls(f, call, &types);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"query":"best\npizza <b>","zone":"local","tags":["a"]})");
}

// tool_choice required under harmony: the grammar names <|channel|>, <|constrain|>, <|message|> and
// <|call|> by id (control tokens no text spells), so the call is those tokens around text, and the
// arguments are valid against the schema; nothing else may start the output.
// The 256 bytes as text tokens, then control tokens (ids from 256 on, not usable as text): the
// vocabulary a format made of control tokens is constrained over.
struct ControlVocab {
  std::vector<std::string> toks;
  std::shared_ptr<const grammar::TokenTrie> trie;
  explicit ControlVocab(const std::vector<std::string>& control) {
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
    toks.insert(toks.end(), control.begin(), control.end());
    std::vector<bool> usable(toks.size(), true);
    for (size_t i = 256; i < toks.size(); ++i) usable[i] = false;
    trie = std::make_shared<const grammar::TokenTrie>(toks, usable);
  }
  int32_t Id(std::string_view text) const {
    for (size_t i = 256; i < toks.size(); ++i) if (toks[i] == text) return static_cast<int32_t>(i);
    return -1;
  }
  std::function<int32_t(std::string_view)> IdFn() const { return [this](std::string_view t) { return Id(t); }; }
  // A grammar compiled over this vocabulary; null (the failure reported) when it does not parse.
  std::shared_ptr<const grammar::CompiledGrammar> Compile(const std::string& gbnf) const {
    auto parsed = grammar::ParseGbnf(gbnf);
    if (!parsed.ok()) {
      ADD_FAILURE() << parsed.status().message() << "\n" << gbnf;
      return nullptr;
    }
    return std::make_shared<const grammar::CompiledGrammar>(std::move(*parsed), trie);
  }
  // Whether the grammar takes the parts in order, control tokens by id and text byte by byte.
  static bool Accepts(const ControlVocab& v, const std::shared_ptr<const grammar::CompiledGrammar>& g,
                      const std::vector<std::string>& parts) {
    grammar::GrammarMatcher m(g, {});
    for (const std::string& p : parts) {
      if (v.Id(p) >= 0) {
        if (!m.Accept(v.Id(p)).ok()) return false;
        continue;
      }
      for (unsigned char b : p) {
        if (!m.Accept(b).ok()) return false;
      }
    }
    return m.Done();
  }
};

TEST(ToolCalls, GptOssRequiredCallIsItsControlTokensAroundValidArguments) {
  const auto f = ToolCallFormat::kGptOss;
  const ControlVocab v({"<|channel|>", "<|constrain|>", "<|message|>", "<|call|>"});  // ids 256-259
  const auto& toks = v.toks;
  auto id = [&](std::string_view text) { return v.Id(text); };
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
          {"type": "function", "function": {"name": "pong", "parameters": {"type": "object", "properties": {}}}}])");
  EXPECT_FALSE(ToolCallGrammar(f, tools, "", true).ok());  // no vocabulary to name the tokens by
  auto gbnf = ToolCallGrammar(f, tools, "", true, id);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  const auto compiled = v.Compile(*gbnf);
  ASSERT_NE(compiled, nullptr);
  auto accepts = [&](const std::vector<std::string>& parts) { return ControlVocab::Accepts(v, compiled, parts); };
  EXPECT_TRUE(accepts({"<|channel|>", "commentary to=functions.ping ", "<|constrain|>", "json", "<|message|>", R"({"n":3})", "<|call|>"}));
  EXPECT_TRUE(accepts({"<|channel|>", "commentary to=functions.pong ", "<|constrain|>", "json", "<|message|>", "{}", "<|call|>"}));
  EXPECT_FALSE(accepts({"<|channel|>", "commentary to=functions.ping ", "<|constrain|>", "json", "<|message|>", R"({"n":"3"})", "<|call|>"}));
  EXPECT_FALSE(accepts({"<|channel|>", "commentary to=functions.ping ", "<|constrain|>", "json", "<|message|>", R"({"n":3})"}));
  EXPECT_FALSE(accepts({"<|channel|>", "final", "<|message|>", "hi"}));
  EXPECT_FALSE(accepts({"<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{\"n\": 3}<|call|>"}));  // as text
  grammar::GrammarMatcher start(compiled, {});
  const auto mask = start.Mask();
  for (int32_t t = 0; t < static_cast<int32_t>(toks.size()); ++t) {
    EXPECT_EQ(((*mask)[t >> 6] >> (t & 63)) & 1, t == id("<|channel|>") ? 1u : 0u) << t;
  }
  // A named function: only that one.
  auto named = ToolCallGrammar(f, tools, "pong", true, id);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->find("ping"), std::string::npos);
  // A vocabulary without the tokens: a clear error.
  auto none = ToolCallGrammar(f, tools, "", true, [](std::string_view) { return -1; });
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("<|channel|>"), std::string::npos);
}

// gpt-oss's harmony messages stream as they are written: the analysis as reasoning and the final
// message as content before the message ends, each piece once.
TEST(ToolCalls, GptOssStreamsEachMessageAsItIsWritten) {
  const std::string text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>final"
                           "<|message|>It is sunny in Lima.<|return|>";
  MessageStream ms(ToolCallFormat::kGptOss, std::nullopt, false);
  std::string reasoning, content;
  size_t reasoning_done_at = 0, content_started_at = 0;
  for (size_t at = 0; at < text.size(); ++at) {
    const MessageStream::Delta d = ms.Push(text.substr(at, 1));
    reasoning += d.reasoning;
    content += d.content;
    if (reasoning == "Need the weather." && reasoning_done_at == 0) reasoning_done_at = at;
    if (!content.empty() && content_started_at == 0) content_started_at = at;
    EXPECT_EQ(content.find('<'), std::string::npos) << content;  // no marker's start sent as text
  }
  const ParsedMessage tail = ms.Finish();
  EXPECT_EQ(reasoning + tail.reasoning, "Need the weather.");
  EXPECT_EQ(content + tail.content, "It is sunny in Lima.");
  EXPECT_GT(reasoning_done_at, 0u);
  EXPECT_LT(content_started_at + 15, text.size());  // the final message streams, not at the end
}

TEST(ToolCalls, KimiK2) {
  const auto f = ToolCallFormat::kKimiK2;
  // Text, then a block of two calls whose ids carry the names.
  ExpectParsed(f,
               "Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               "<|tool_call_argument_begin|>{\"city\": \"Lima\"}<|tool_call_end|><|tool_call_begin|> functions.now:1 "
               "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
               {"Let me look.", {{"get_weather", R"({"city":"Lima"})"}, {"now", "{}"}}});
  // An id without the prefix or the index is the name as written; text after the block goes.
  ExpectParsed(f,
               "<|tool_calls_section_begin|>\n<|tool_call_begin|>add<|tool_call_argument_begin|>{\"a\": 1}"
               "<|tool_call_end|>\n<|tool_calls_section_end|> done",
               {"", {{"add", R"({"a":1})"}}});
  // Arguments that are no JSON, or an empty name: no call, the text stays.
  const std::string broken = "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>"
                             "{oops<|tool_call_end|>";
  ExpectParsed(f, broken, {broken, {}});
  const std::string nameless = "<|tool_calls_section_begin|><|tool_call_begin|>functions.:0<|tool_call_argument_begin|>"
                               "{}<|tool_call_end|><|tool_calls_section_end|>";
  ExpectParsed(f, nameless, {nameless, {}});
  EXPECT_EQ(*ParseToolCallFormat("kimi_k2"), f);
  EXPECT_EQ(DetectToolCallFormat("{{ '<|tool_calls_section_begin|>' }}<|tool_call_begin|>"), f);
  EXPECT_TRUE(RendersControlTokens(f));
  EXPECT_FALSE(RendersControlTokens(ToolCallFormat::kDeepSeekV3));
}

// Kimi-K2's real templates are detected; the call the template writes for an assistant message
// parses back to the same call, and the required-call grammar accepts the same call written
// compactly. (Kimi-K2-Instruct's and K2-Thinking's templates cannot render a call: they append to
// a list, which Jinja2's sandbox, as transformers runs templates, refuses, and gale's as well.)
TEST(ToolCalls, KimiK2ReadsWhatTheRealTemplatesWrite) {
  for (const char* file : {"Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja", "moonshotai-Kimi-K2.jinja"}) {
    SCOPED_TRACE(file);
    const std::string path = test::DataDir() + "/chat-templates/templates/" + file;
    GALE_SKIP_UNLESS_FILE(path);
    std::ifstream in(path);
    std::stringstream src;
    src << in.rdbuf();
    EXPECT_EQ(DetectToolCallFormat(src.str()), ToolCallFormat::kKimiK2);
    if (std::string(file) != "moonshotai-Kimi-K2.jinja") continue;
    auto tmpl = jinja::Template::Parse(src.str());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
    const auto args = nlohmann::ordered_json::parse(R"({"city": "São Paulo", "days": 3})");
    nlohmann::ordered_json ctx = {{"add_generation_prompt", false}};
    ctx["messages"] = nlohmann::ordered_json::array(
        {{{"role", "user"}, {"content", "Weather?"}},
         {{"role", "assistant"}, {"content", ""},
          {"tool_calls", {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", args}}}},
                          {{"type", "function"}, {"function", {{"name", "now"}, {"arguments", "{}"}}}}}}}});
    auto text = tmpl->Render(ctx);
    ASSERT_TRUE(text.ok()) << text.status().message();
    const size_t start = text->find("<|tool_calls_section_begin|>");
    const size_t end = text->find("<|tool_calls_section_end|>", start);
    ASSERT_NE(end, std::string::npos) << *text;
    const ParsedMessage p = ParseToolCalls(ToolCallFormat::kKimiK2, text->substr(start, end + 26 - start));
    ASSERT_EQ(p.calls.size(), 2u) << *text;
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(nlohmann::ordered_json::parse(p.calls[0].arguments), args);
    EXPECT_EQ(p.calls[1].name, "now");
    EXPECT_EQ(p.calls[1].arguments, "{}");
  }
  const auto tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
      "required": ["city"]}}}, {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}])");
  auto g = ToolCallGrammar(ToolCallFormat::kKimiK2, tools, "", /*parallel=*/true);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const std::string call = "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\":\"Lima\"}"
                           "<|tool_call_end|>";
  const std::string now = "<|tool_call_begin|>functions.now:12<|tool_call_argument_begin|>{}<|tool_call_end|>";
  EXPECT_TRUE(GrammarAccepts(*g, "<|tool_calls_section_begin|>" + call + "<|tool_calls_section_end|>"));
  EXPECT_TRUE(GrammarAccepts(*g, "<|tool_calls_section_begin|>" + call + now + "<|tool_calls_section_end|>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<|tool_calls_section_begin|>" + call));  // the block must close
  EXPECT_FALSE(GrammarAccepts(*g, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                                  "<|tool_call_argument_begin|>{\"days\":2}<|tool_call_end|><|tool_calls_section_end|>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:"
                                  "<|tool_call_argument_begin|>{\"city\":\"x\"}<|tool_call_end|><|tool_calls_section_end|>"));
}

// Kimi-K2's markers are control tokens: where the vocabulary has them, the grammar names them by id
// and their text is refused.
TEST(ToolCalls, KimiK2RequiredCallUsesTheControlTokens) {
  const ControlVocab v({"<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                        "<|tool_call_end|>", "<|tool_calls_section_end|>"});
  const auto tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}])");
  auto gbnf = ToolCallGrammar(ToolCallFormat::kKimiK2, tools, "ping", false, v.IdFn());
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  const auto compiled = v.Compile(*gbnf);
  ASSERT_NE(compiled, nullptr);
  auto accepts = [&](const std::vector<std::string>& parts) { return ControlVocab::Accepts(v, compiled, parts); };
  EXPECT_TRUE(accepts({"<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.ping:0", "<|tool_call_argument_begin|>",
                       R"({"n":3})", "<|tool_call_end|>", "<|tool_calls_section_end|>"}));
  EXPECT_FALSE(accepts({"<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.ping:0", "<|tool_call_argument_begin|>",
                        R"({"n":3})", "<|tool_call_end|>"}));  // one call: the block closes after it
  EXPECT_FALSE(accepts({"<|tool_calls_section_begin|><|tool_call_begin|>functions.ping:0<|tool_call_argument_begin|>{\"n\":3}"
                        "<|tool_call_end|><|tool_calls_section_end|>"}));  // the markers as text
}

TEST(ToolCalls, Gemma4) {
  const auto f = ToolCallFormat::kGemma4;
  const std::string q = "<|\"|>";
  // Text, then a call; the message ends where the model expects the tools' answers.
  ExpectParsed(f, "Let me check.<|tool_call>call:get_weather{city:" + q + "São Paulo" + q + ",days:3}<tool_call|><|tool_response>",
               {"Let me check.", {{"get_weather", R"({"city":"São Paulo","days":3})"}}});
  // Two calls; nested objects and arrays; quotes and backslashes in a string escaped as JSON.
  ExpectParsed(f,
               "<|tool_call>call:a{n:-1.5e3,opts:{deep:true,tags:[" + q + "x" + q + "," + q + "y \"q\"\\" + q +
                   "]}}<tool_call|><|tool_call>call:b{}<tool_call|>",
               {"", {{"a", R"({"n":-1.5e3,"opts":{"deep":true,"tags":["x","y \"q\"\\"]}})"}, {"b", "{}"}}});
  // A string is raw text: '<', '<|' and line breaks are its own.
  ExpectParsed(f, "<|tool_call>call:run{code:" + q + "if a<b:\n  print(\"<|x\")" + q + "}<tool_call|>",
               {"", {{"run", R"j({"code":"if a<b:\n  print(\"<|x\")"})j"}}});
  // Marked keys; Python's None and True; a bare word is a string.
  ExpectParsed(f, "<|tool_call>call:f{" + q + "my key" + q + ":None,flag:True,word:hello}<tool_call|>",
               {"", {{"f", R"({"my key":null,"flag":true,"word":"hello"})"}}});
  // The end marker cut off: the call is whole without it.
  ExpectParsed(f, "<|tool_call>call:f{a:1}", {"", {{"f", R"({"a":1})"}}});
  // A string never closed, arguments that are not an object, a name missing: no call, the text stays.
  for (const std::string& broken : {"<|tool_call>call:f{a:" + q + "open}<tool_call|>", std::string("<|tool_call>call:f[1]<tool_call|>"),
                                    std::string("<|tool_call>call:{a:1}<tool_call|>"), std::string("<|tool_call>call:f{a:1,}<tool_call|>")}) {
    ExpectParsed(f, broken, {broken, {}});
  }
  EXPECT_EQ(*ParseToolCallFormat("gemma4"), f);
  EXPECT_TRUE(RendersControlTokens(f));
  // Deeper than the arguments' bound: no call.
  std::string deep = "<|tool_call>call:f{a:";
  for (int i = 0; i < 100; ++i) deep += "[";
  EXPECT_TRUE(ParseToolCalls(f, deep + "]<tool_call|>").calls.empty());
}

// Gemma 4 thinks in <|channel>thought ... <channel|>: split off as reasoning, whole or streamed.
TEST(ToolCalls, Gemma4Reasoning) {
  const std::string text = "<|channel>thought\nThe user wants X.<channel|>Here is X.";
  auto [r, rest] = SplitReasoning(text, false, kGemma4Thought);
  EXPECT_EQ(r, "\nThe user wants X.");
  EXPECT_EQ(rest, "Here is X.");
  for (size_t piece = 1; piece <= 7; ++piece) {
    MessageStream ms(ToolCallFormat::kGemma4, kGemma4Thought, false);
    const Streamed got = StreamInPieces(ms, text + "<|tool_call>call:f{}<tool_call|>", piece);
    EXPECT_EQ(got.reasoning, "\nThe user wants X.");
    EXPECT_EQ(got.content, "Here is X.");
    ASSERT_FALSE(got.calls.empty());
    EXPECT_EQ(got.calls[0].name, "f");
    std::string args;
    for (const CallDelta& d : got.calls) args += d.arguments;
    EXPECT_EQ(args, "{}");
  }
  EXPECT_FALSE(DetectReasoning("{{ messages }}").has_value());
  EXPECT_EQ(DetectReasoning("{{ '</think>' }}")->close, "</think>");
}

// Gemma 4's real template: detected, its thinking markers too; the calls it writes for an
// assistant message parse back to the same arguments, and the required-call grammar accepts
// exactly that text (keys sorted as the template's dictsort writes them).
TEST(ToolCalls, Gemma4ReadsWhatTheRealTemplateWrites) {
  const std::string path = test::DataDir() + "/chat-templates/templates/google-gemma-4-31B-it.jinja";
  GALE_SKIP_UNLESS_FILE(path);
  std::ifstream in(path);
  std::stringstream src;
  src << in.rdbuf();
  EXPECT_EQ(DetectToolCallFormat(src.str()), ToolCallFormat::kGemma4);
  ASSERT_TRUE(DetectReasoning(src.str()).has_value());
  EXPECT_EQ(DetectReasoning(src.str())->open, kGemma4Thought.open);
  auto tmpl = jinja::Template::Parse(src.str());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
  const auto args = Json::parse(R"({"city": "São Paulo", "Days": 3, "opts": {"units": "C", "hourly": false},
                                    "tags": ["a \"b\"", "c\nd"]})");
  Json ctx = {{"add_generation_prompt", false}, {"bos_token", "<bos>"}};
  ctx["messages"] = Json::array({{{"role", "user"}, {"content", "Weather?"}},
                                 {{"role", "assistant"}, {"content", ""},
                                  {"tool_calls", {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", args}}}},
                                                  {{"type", "function"}, {"function", {{"name", "now"}, {"arguments", Json::object()}}}}}}}});
  auto text = tmpl->Render(ctx);
  ASSERT_TRUE(text.ok()) << text.status().message();
  const size_t start = text->find("<|tool_call>");
  const size_t end = text->rfind("<tool_call|>");
  ASSERT_NE(end, std::string::npos) << *text;
  const std::string calls = text->substr(start, end + 12 - start);
  const ParsedMessage p = ParseToolCalls(ToolCallFormat::kGemma4, calls);
  ASSERT_EQ(p.calls.size(), 2u) << calls;
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(p.calls[0].arguments), nlohmann::json(args)) << calls;  // keys sorted
  EXPECT_EQ(p.calls[1].name, "now");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  const auto tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "Days": {"type": "integer", "minimum": 1},
        "opts": {"type": "object", "properties": {"units": {"enum": ["C", "F"]}, "hourly": {"type": "boolean"}}},
        "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["city"]}}}, {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}])");
  auto g = ToolCallGrammar(ToolCallFormat::kGemma4, tools, "", /*parallel=*/true);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(GrammarAccepts(*g, calls)) << calls;
  const std::string q = "<|\"|>";
  auto call = [&](const std::string& body) { return "<|tool_call>call:get_weather{" + body + "}<tool_call|>"; };
  EXPECT_TRUE(GrammarAccepts(*g, call("city:" + q + "Lima" + q)));
  EXPECT_TRUE(GrammarAccepts(*g, call("city:" + q + "Lima" + q + ",tags:[]")));
  EXPECT_FALSE(GrammarAccepts(*g, call("Days:2")));                                       // city is required
  EXPECT_FALSE(GrammarAccepts(*g, call("city:" + q + "Lima" + q + ",Days:0")));           // below the minimum
  EXPECT_FALSE(GrammarAccepts(*g, call("city:" + q + "Lima" + q + ",Days:" + q + "2" + q)));  // a string
  EXPECT_FALSE(GrammarAccepts(*g, call("Days:2,city:" + q + "Lima" + q)));                // not the template's order
  EXPECT_FALSE(GrammarAccepts(*g, call("city:" + q + "Lima" + q + ",zone:1")));           // undeclared
  EXPECT_FALSE(GrammarAccepts(*g, call("city:" + q + "Lima" + q + ",opts:{units:" + q + "K" + q + "}")));
  EXPECT_FALSE(GrammarAccepts(*g, "<|tool_call>call:now{a:1}<tool_call|>"));
  // Named: exactly one call of it.
  auto one = ToolCallGrammar(ToolCallFormat::kGemma4, tools, "now", /*parallel=*/true);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_TRUE(GrammarAccepts(*one, "<|tool_call>call:now{}<tool_call|>"));
  EXPECT_FALSE(GrammarAccepts(*one, "<|tool_call>call:now{}<tool_call|><|tool_call>call:now{}<tool_call|>"));
  // A free-form object parameter takes any Gemma value; a string with a pattern is refused, by name.
  auto free = ToolCallGrammar(ToolCallFormat::kGemma4, Json::parse(R"([{"type": "function", "function": {"name": "put",
      "parameters": {"type": "object", "properties": {"doc": {"type": "object"}}, "required": ["doc"]}}}])"), "", false);
  ASSERT_TRUE(free.ok()) << free.status().message();
  EXPECT_TRUE(GrammarAccepts(*free, "<|tool_call>call:put{doc:{a:[1,{b:" + q + "x" + q + "}],c:null}}<tool_call|>"));
  auto refused = ToolCallGrammar(ToolCallFormat::kGemma4, Json::parse(R"([{"type": "function", "function": {"name": "mail",
      "parameters": {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}}}}])"), "", false);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'mail'"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("to: 'format'"), std::string::npos) << refused.status().message();
}

// Gemma 4's markers are control tokens: the grammar names them by id, and their text is refused.
TEST(ToolCalls, Gemma4RequiredCallUsesTheControlTokens) {
  const ControlVocab v({"<|tool_call>", "<tool_call|>", "<|\"|>"});
  const auto tools = Json::parse(
      R"([{"type": "function", "function": {"name": "say", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}])");
  auto gbnf = ToolCallGrammar(ToolCallFormat::kGemma4, tools, "say", false, v.IdFn());
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  const auto compiled = v.Compile(*gbnf);
  ASSERT_NE(compiled, nullptr);
  auto accepts = [&](const std::vector<std::string>& parts) { return ControlVocab::Accepts(v, compiled, parts); };
  EXPECT_TRUE(accepts({"<|tool_call>", "call:say{text:", "<|\"|>", "hi there", "<|\"|>", "}", "<tool_call|>"}));
  EXPECT_FALSE(accepts({"<|tool_call>", "call:say{text:", "<|\"|>", "hi", "<|\"|>", "}"}));  // the end marker
  EXPECT_FALSE(accepts({"<|tool_call>call:say{text:<|\"|>hi<|\"|>}<tool_call|>"}));           // the markers as text
}

TEST(ToolCalls, Functionary) {
  const auto f = ToolCallFormat::kFunctionary;
  ExpectParsed(f, "Let me see.<function=get_weather>{\"city\": \"Lima\"}</function>",
               {"Let me see.", {{"get_weather", R"({"city":"Lima"})"}}});
  ExpectParsed(f, "<function=a>{}</function><function=b>{\"s\": \"</function>\"}</function>",
               {"", {{"a", "{}"}, {"b", R"({"s":"</function>"})"}}});
  ExpectParsed(f, "x <function=broken>{oops</function>", {"x <function=broken>{oops</function>", {}});
  const nlohmann::ordered_json tools = PingTool();
  auto g = ToolCallGrammar(f, tools, "", true);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(GrammarAccepts(*g, "<function=ping>{\"n\":3}</function>"));
  EXPECT_FALSE(GrammarAccepts(*g, "<function=ping>{\"n\": \"3\"}</function>"));
  EXPECT_EQ(DetectToolCallFormat("{{- '<function=' + name + '>' }}"), f);
}

// Functionary v3.2: the prompt ends with ">>>", so a message starts with its recipient line
// (outputs as llama.cpp's tests record them).
TEST(ToolCalls, FunctionaryV32) {
  const auto f = ToolCallFormat::kFunctionaryV32;
  ExpectParsed(f, "all\nHello, world!\nnono\nWhat's up?>>>special_function\n{\"arg1\": 1}\n",
               {"Hello, world!\nnono\nWhat's up?", {{"special_function", R"({"arg1":1})"}}});
  ExpectParsed(f, "special_function\n{\"arg1\": 1} \n                    ", {"", {{"special_function", R"({"arg1":1})"}}});
  ExpectParsed(f, "python\n# This is a program:\nprint('hey')",
               {"", {{"python", R"j({"code":"# This is a program:\nprint('hey')"})j"}}});
  ExpectParsed(f, "get_weather\n{\"city\": \"Lima\"}>>>get_time\n{}", {"", {{"get_weather", R"({"city":"Lima"})"}, {"get_time", "{}"}}});
  // Text only: "all" is not content; a part that is no call stays as written.
  for (const auto& [text, content] : std::vector<std::pair<std::string, std::string>>{
           {"all\nHello, world!\nWhat's up?", "Hello, world!\nWhat's up?"},
           {">>>all\nHi", "Hi"},
           {"all\nA>>>broken\n{oops", "A>>>broken\n{oops"},
           {"no recipient at all", "no recipient at all"}}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(ParseToolCalls(f, text).content, content);
    EXPECT_TRUE(ParseToolCalls(f, text).calls.empty());
    MessageStream ms(f, std::nullopt, false);
    std::string streamed;
    for (size_t at = 0; at < text.size(); at += 3) streamed += ms.Push(text.substr(at, 3)).content;
    const ParsedMessage tail = ms.Finish();
    EXPECT_EQ(streamed + tail.content, content);
  }
  const nlohmann::ordered_json tools = PingTool();
  auto g = ToolCallGrammar(f, tools, "", true);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(GrammarAccepts(*g, "ping\n{\"n\":3}"));
  EXPECT_TRUE(GrammarAccepts(*g, "ping\n{\"n\":3}>>>ping\n{}"));
  EXPECT_FALSE(GrammarAccepts(*g, "ping\n{\"n\": \"3\"}"));
  EXPECT_FALSE(GrammarAccepts(*g, "all\nhello"));
  auto one = ToolCallGrammar(f, tools, "", false);
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(GrammarAccepts(*one, "ping\n{\"n\":3}>>>ping\n{}"));
  EXPECT_EQ(DetectToolCallFormat("{{- '>>>all\\n' + message['content'] }}"), f);
  EXPECT_EQ(*ParseToolCallFormat("functionary_v3_2"), f);
}

// Functionary v3.2 streams a part at a time: text as content, a call's name once its recipient
// line is whole and its arguments as they grow; what was sent and what the end adds make the
// whole reading, in pieces of any size.
TEST(ToolCalls, FunctionaryV32StreamsEachPartAsItIsWritten) {
  const auto f = ToolCallFormat::kFunctionaryV32;
  const std::string text = "all\nLet me check the weather first.>>>get_weather\n{\"city\": \"Lima\", \"days\": 3}\n>>>"
                           "python\nprint(1)>>>all\nDone.";
  const ParsedMessage whole = ParseToolCalls(f, text);
  ASSERT_EQ(whole.calls.size(), 2u);
  for (size_t piece : {1, 2, 5, 64}) {
    SCOPED_TRACE(piece);
    MessageStream ms(f, std::nullopt, false);
    std::string content;
    std::vector<std::string> names, args;
    size_t named_at = 0, args_at = 0;
    for (size_t at = 0; at < text.size(); at += piece) {
      const MessageStream::Delta d = ms.Push(text.substr(at, piece));
      content += d.content;
      EXPECT_EQ(content.find('>'), std::string::npos) << content;  // no separator's start as text
      for (const CallDelta& c : d.calls) {
        if (c.index >= names.size()) names.resize(c.index + 1), args.resize(c.index + 1);
        if (!c.name.empty()) names[c.index] = c.name, named_at = named_at ? named_at : at;
        if (!c.arguments.empty() && c.index == 0 && args_at == 0) args_at = at;
        args[c.index] += c.arguments;
      }
    }
    std::vector<CallDelta> rest;
    const ParsedMessage tail = ms.Finish(&rest);
    for (const CallDelta& c : rest) {
      if (c.index >= names.size()) names.resize(c.index + 1), args.resize(c.index + 1);
      if (!c.name.empty()) names[c.index] = c.name;
      args[c.index] += c.arguments;
    }
    EXPECT_EQ(content + tail.content, "Let me check the weather first.Done.");
    ASSERT_EQ(names, (std::vector<std::string>{"get_weather", "python"}));
    EXPECT_EQ(args[0], whole.calls[0].arguments);
    EXPECT_EQ(args[1], whole.calls[1].arguments);
    if (piece < 10) {
      EXPECT_LT(named_at, text.find("{\"city"));     // named before its arguments are written
      EXPECT_LT(args_at, text.find("\"days"));       // arguments go out as they are written
      EXPECT_FALSE(content.empty());
    }
  }
  // A part that is neither text nor a call stops the stream there; the end gives the rest as the
  // whole reading does.
  const std::string odd = "all\nA>>>broken\n{oops>>>all\nB>>>get_time\n{}";
  MessageStream ms(f, std::nullopt, false);
  std::string content;
  for (char ch : odd) content += ms.Push(std::string(1, ch)).content;
  std::vector<CallDelta> rest;
  const ParsedMessage tail = ms.Finish(&rest);
  EXPECT_EQ(content + tail.content, ParseToolCalls(f, odd).content);
  EXPECT_EQ(content, "A");
  ASSERT_EQ(tail.calls.size(), 1u);
  EXPECT_EQ(tail.calls[0].name, "get_time");
}

TEST(ToolCalls, FormatFromTheChatTemplate) {
  EXPECT_EQ(DetectToolCallFormat("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("<tool_call>\\n<function=example>"), ToolCallFormat::kQwen3Coder);
  EXPECT_EQ(DetectToolCallFormat("'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(DetectToolCallFormat("{{- '[TOOL_CALLS]' + name }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("{{- \"<|python_tag|>\" + name }}"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(DetectToolCallFormat("{{ messages }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{{ '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key>"), ToolCallFormat::kGlm45);
  EXPECT_TRUE(ParseToolCallFormat("mistral").ok());
  EXPECT_TRUE(ParseToolCallFormat("glm45").ok());
  EXPECT_FALSE(ParseToolCallFormat("pythonic").ok());
}

TEST(ToolCalls, ReasoningIsSplitStreamedOrNot) {
  auto [r, rest] = SplitReasoning("<think>\nHmm, 2+2.\n</think>\n\nFour.", false);
  EXPECT_EQ(r, "\nHmm, 2+2.\n");
  EXPECT_EQ(rest, "\n\nFour.");
  std::tie(r, rest) = SplitReasoning("Hmm.</think>Four.", /*starts_thinking=*/true);
  EXPECT_EQ(r, "Hmm.");
  EXPECT_EQ(rest, "Four.");
  std::tie(r, rest) = SplitReasoning("<think>still going", false);
  EXPECT_EQ(r, "still going");
  EXPECT_EQ(rest, "");
  const std::string text = "<think>plan: call a</think>Calling.<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>";
  for (size_t piece = 1; piece <= 9; ++piece) {
    MessageStream ms(ToolCallFormat::kHermes, kThinkTags, false);
    const Streamed out = StreamInPieces(ms, text, piece);
    EXPECT_EQ(out.reasoning, "plan: call a") << piece;
    EXPECT_EQ(out.content, "Calling.") << piece;
    ASSERT_EQ(out.tail.calls.size(), 1u) << piece;
    EXPECT_EQ(out.tail.calls[0].name, "a");
  }
}


TEST(ToolCalls, GrammarsAcceptValidCallsOnlyAndTheParserReadsThem) {
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "tree", "parameters": {"$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v", "kids"]}}, "$ref": "#/$defs/node"}}},
    {"type": "function", "function": {"name": "ping"}}])");
  // Calls as the grammars write them: compact JSON.
  const std::string weather = R"({"name":"get_weather","arguments":{"city":"Paris","unit":"c"}})";
  const std::string bad_unit = R"({"name":"get_weather","arguments":{"city":"Paris","unit":"k"}})";
  const std::string tree = R"({"name":"tree","arguments":{"v":1,"kids":[{"v":2,"kids":[]}]}})";
  const std::string ping = R"({"name":"ping","arguments":{}})";
  {
    auto g = ToolCallGrammar(ToolCallFormat::kHermes, tools, "", /*parallel=*/true);
    ASSERT_TRUE(g.ok()) << g.status().message();
    auto block = [](const std::string& c) { return "<tool_call>\n" + c + "\n</tool_call>"; };
    EXPECT_TRUE(GrammarAccepts(*g, block(weather)));
    EXPECT_TRUE(GrammarAccepts(*g, block(tree) + "\n" + block(ping)));
    EXPECT_FALSE(GrammarAccepts(*g, block(bad_unit)));
    EXPECT_FALSE(GrammarAccepts(*g, "Sure! " + block(weather)));
    EXPECT_FALSE(GrammarAccepts(*g, block(R"({"name":"nope","arguments":{}})")));
    // Spaced JSON is not the grammar's, and parallel calls stop at kMaxParallelToolCalls.
    EXPECT_FALSE(GrammarAccepts(*g, block(R"({"name": "ping", "arguments": {}})")));
    std::string most = block(ping), too_many;
    for (int i = 1; i < kMaxParallelToolCalls; ++i) most += "\n" + block(ping);
    too_many = most + "\n" + block(ping);
    EXPECT_TRUE(GrammarAccepts(*g, most));
    EXPECT_FALSE(GrammarAccepts(*g, too_many));
    const ParsedMessage p = ParseToolCalls(ToolCallFormat::kHermes, block(tree) + "\n" + block(ping));
    ASSERT_EQ(p.calls.size(), 2u);
    EXPECT_EQ(p.calls[0].arguments, R"({"v":1,"kids":[{"v":2,"kids":[]}]})");
  }
  {
    auto g = ToolCallGrammar(ToolCallFormat::kHermes, tools, "ping", /*parallel=*/true);
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE(GrammarAccepts(*g, "<tool_call>\n" + ping + "\n</tool_call>"));
    EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>\n" + ping + "\n</tool_call>\n<tool_call>\n" + ping + "\n</tool_call>"));
    EXPECT_FALSE(GrammarAccepts(*g, "<tool_call>\n" + weather + "\n</tool_call>"));
  }
  {
    auto g = ToolCallGrammar(ToolCallFormat::kLlama3Json, tools, "", false);
    ASSERT_TRUE(g.ok());
    EXPECT_TRUE(GrammarAccepts(*g, R"({"name":"get_weather","parameters":{"city":"Oslo","unit":"f"}})"));
    EXPECT_FALSE(GrammarAccepts(*g, R"({"name":"ping","parameters":{}}; {"name":"ping","parameters":{}})"));
  }
  {
    auto g = ToolCallGrammar(ToolCallFormat::kMistral, tools, "", true);
    ASSERT_TRUE(g.ok());
    const std::string text = "[" + ping + ", " + weather + "]";
    EXPECT_TRUE(GrammarAccepts(*g, text));
    EXPECT_EQ(ParseToolCalls(ToolCallFormat::kMistral, text).calls.size(), 2u);
  }
  {
    auto g = ToolCallGrammar(ToolCallFormat::kDeepSeekV3, tools, "", true);
    ASSERT_TRUE(g.ok());
    const std::string text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>ping<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    EXPECT_TRUE(GrammarAccepts(*g, text));
    EXPECT_EQ(ParseToolCalls(ToolCallFormat::kDeepSeekV3, text).calls.size(), 1u);
  }
  EXPECT_FALSE(ToolCallGrammar(ToolCallFormat::kHermes, tools, "missing", true).ok());
  const Json bad = Json::parse(R"([{"type": "function", "function": {"name": "x", "parameters": {"type": "array", "uniqueItems": true}}}])");
  auto e = ToolCallGrammar(ToolCallFormat::kHermes, bad, "", true);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("uniqueItems"), std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace gale::server

namespace gale::server {
namespace {

// A constrained answer (tool_choice required or named) cut by max_tokens inside a call: the calls
// that completed come back, the cut one is dropped (never content). Unconstrained, the same text
// stays content: it may be what the model meant to say.
TEST(ToolCalls, AForcedAnswerCutInACallDropsTheCutCall) {
  const std::string text = "<tool_call>\n{\"name\":\"ping\",\"arguments\":{}}\n</tool_call>\n<tool_call>\n{\"name\":\"pi";
  for (bool forced : {true, false}) {
    MessageStream ms(ToolCallFormat::kHermes, /*reasoning=*/std::nullopt, /*starts_thinking=*/false, forced);
    std::string content = ms.Push(text).content;
    const ParsedMessage tail = ms.Finish();
    content += tail.content;
    ASSERT_EQ(tail.calls.size(), 1u) << forced;
    EXPECT_EQ(tail.calls[0].name, "ping");
    if (forced) {
      EXPECT_EQ(content, "");
    } else {
      EXPECT_NE(content.find("<tool_call>"), std::string::npos) << content;
    }
  }
}

}  // namespace
}  // namespace gale::server

namespace gale::server {
namespace {

// A thinking template's forced call: the thought is reasoning_content, the call after </think> a
// tool call, the content null (streamed piece by piece or whole).
TEST(ToolCalls, AForcedCallAfterTheThoughtIsACallNotReasoning) {
  const std::string text = "I should call ping.</think>\n\n<tool_call>\n{\"name\":\"ping\",\"arguments\":{}}\n</tool_call>";
  for (size_t piece : {size_t{1}, size_t{3}, text.size()}) {
    MessageStream ms(ToolCallFormat::kHermes, kThinkTags, /*starts_thinking=*/true, /*forced_calls=*/true);
    const Streamed out = StreamInPieces(ms, text, piece);
    EXPECT_EQ(out.reasoning, "I should call ping.") << piece;
    EXPECT_EQ(out.content, "") << piece;
    ASSERT_EQ(out.tail.calls.size(), 1u) << piece;
    EXPECT_EQ(out.tail.calls[0].name, "ping");
  }
}

}  // namespace
}  // namespace gale::server
