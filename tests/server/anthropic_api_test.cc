// Anthropic's Messages API translation: bodies into chat completions bodies, results into
// Messages and Anthropic's event stream, errors in Anthropic's shape.
#include "server/anthropic_api.h"

#include <gtest/gtest.h>

namespace gale::server {
namespace {

Json Chat(const std::string& body, bool count = false) {
  auto r = AnthropicToChat(body, count);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << ": " << e->message;
    return nullptr;
  }
  return std::get<Json>(r);
}

ApiError Refused(const std::string& body) {
  auto r = AnthropicToChat(body, false);
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  ADD_FAILURE() << body << " was accepted";
  return {};
}

TEST(AnthropicApi, MessagesBecomeAChatCompletionsBody) {
  const Json c = Chat(R"({
    "model": "claude-sonnet-4-5", "max_tokens": 64, "temperature": 0.2, "top_k": 5, "stream": true,
    "stop_sequences": ["END"], "metadata": {"user_id": "u"},
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Really."}],
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [
      {"role": "user", "content": "Weather in Lima?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                                        {"type": "text", "text": "Checking."},
                                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Lima"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                                   {"type": "text", "text": "And tomorrow?"}]}]})");
  EXPECT_FALSE(c.contains("model"));  // the server's model answers, whatever the client names
  EXPECT_EQ(c["max_tokens"], 64);
  EXPECT_EQ(c["temperature"], 0.2);
  EXPECT_EQ(c["top_k"], 5);
  EXPECT_EQ(c["stream"], true);
  EXPECT_EQ(c["stop"], Json::array({"END"}));
  EXPECT_EQ(c["chat_template_kwargs"]["enable_thinking"], true);
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["tool_choice"]["function"]["name"], "get_weather");
  EXPECT_EQ(c["tools"][0]["function"]["parameters"]["properties"]["city"]["type"], "string");
  const Json& m = c["messages"];
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], Json({{"role", "system"}, {"content", "Be brief.\nReally."}}));
  EXPECT_EQ(m[1]["content"], "Weather in Lima?");
  EXPECT_EQ(m[2]["content"], "Checking.");
  EXPECT_EQ(m[2]["reasoning_content"], "Use the tool.");
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(Json::parse(m[2]["tool_calls"][0]["function"]["arguments"].get<std::string>()), Json({{"city", "Lima"}}));
  EXPECT_EQ(m[3], Json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "Sunny"}}));
  EXPECT_EQ(m[4], Json({{"role", "user"}, {"content", "And tomorrow?"}}));
  // tool_choice any/auto/none, and thinking disabled.
  EXPECT_EQ(Chat(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t", "input_schema": {}}],
                     "tool_choice": {"type": "any"}})")["tool_choice"], "required");
  EXPECT_EQ(Chat(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "none"}})")["tool_choice"],
            "none");
  EXPECT_EQ(Chat(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "disabled"}})")
                ["chat_template_kwargs"]["enable_thinking"], false);
  // count_tokens bodies have no max_tokens, and never stream.
  const Json count = Chat(R"({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]})", true);
  EXPECT_EQ(count["max_tokens"], 1);
  EXPECT_FALSE(count.contains("stream"));
}

TEST(AnthropicApi, BadBodiesAre400sNamingTheField) {
  auto expect = [](const std::string& body, const std::string& param, const std::string& says) {
    const ApiError e = Refused(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_NE(e.message.find(says), std::string::npos) << body << ": " << e.message;
  };
  expect("{", "", "not valid JSON");
  expect("[]", "", "must be a JSON object");
  expect(R"({"messages": [{"role": "user", "content": "x"}]})", "max_tokens", "'max_tokens' is required");
  expect(R"({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]})", "max_tokens", "positive integer");
  expect(R"({"max_tokens": 5})", "messages", "must be an array");
  expect(R"({"max_tokens": 5, "messages": []})", "messages", "must not be empty");
  expect(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "messages[0].role", "'user' or 'assistant'");
  expect(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})", "messages[0].content[0]",
         "'image' blocks are not supported");
  expect(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}]})",
         "messages[0].content[0]", "a user message cannot hold a 'tool_use' block");
  expect(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "s"}]})",
         "tools[0].type", "server tools");
  expect(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t"}]})", "tools[0].input_schema",
         "input_schema");
  expect(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}})", "tool_choice.type",
         "auto, any, tool or none");
  expect(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "system": [{"type": "image"}]})", "system", "text only");
  // Errors come back in Anthropic's shape, typed by status.
  const Json body = Json::parse(AnthropicErrorBody({400, "bad", "invalid_request_error", "x"}));
  EXPECT_EQ(body, Json::parse(R"({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})"));
  EXPECT_EQ(Json::parse(AnthropicErrorBody({401, "k", "", ""}))["error"]["type"], "authentication_error");
  EXPECT_EQ(Json::parse(AnthropicErrorBody({429, "k", "", ""}))["error"]["type"], "rate_limit_error");
  EXPECT_EQ(Json::parse(AnthropicErrorBody({503, "k", "", ""}))["error"]["type"], "overloaded_error");
  EXPECT_EQ(Json::parse(AnthropicErrorBody({500, "k", "", ""}))["error"]["type"], "api_error");
}

TEST(AnthropicApi, ResultsBecomeMessages) {
  Choice c;
  c.text = "Checking.";
  c.reasoning = "Use the tool.";
  c.tool_calls = {{"get_weather", R"({"city": "Lima"})", "call_1"}};
  c.finish_reason = FinishReason::kEos;
  Usage u;
  u.prompt_tokens = 30;
  u.cached_tokens = 16;
  u.completion_tokens = 9;
  const Json m = AnthropicMessage("msg_ab", "m", c, u);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["stop_sequence"], nullptr);
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][1], Json({{"type", "text"}, {"text", "Checking."}}));
  EXPECT_EQ(m["content"][2]["id"], "toolu_ab_0");
  EXPECT_EQ(m["content"][2]["input"], Json({{"city", "Lima"}}));
  EXPECT_EQ(m["usage"]["input_tokens"], 14);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 16);
  EXPECT_EQ(m["usage"]["output_tokens"], 9);
  Choice s;
  s.finish_reason = FinishReason::kStop;
  s.stop_string = "END";
  EXPECT_EQ(AnthropicMessage("msg_x", "m", s, u)["stop_sequence"], "END");
  EXPECT_EQ(AnthropicStopReason(s), "stop_sequence");
  s.stop_string.clear();  // a grammar that completed
  EXPECT_EQ(AnthropicStopReason(s), "end_turn");
  s.finish_reason = FinishReason::kLength;
  EXPECT_EQ(AnthropicStopReason(s), "max_tokens");
}

// The event stream: one block per kind in writing order, each started, given deltas and stopped;
// thinking signed (empty) before its stop; a call's arguments as input_json_delta.
TEST(AnthropicApi, TheEventStreamFollowsAnthropicsSequence) {
  AnthropicEvents ev("msg_ab", "m");
  Usage start;
  start.prompt_tokens = 7;
  std::string out = ev.Start(start);  // (one call per statement: their order is the events')
  out += ev.Thinking("hm");
  out += ev.Thinking(" ok");
  out += ev.Text("Hi");
  out += ev.Text("");
  out += ev.Calls({{0, "get_weather", "{\"ci"}, {0, "", "ty\": 1}"}});
  out += ev.Calls({{1, "now", ""}});
  Choice c;
  c.finish_reason = FinishReason::kEos;
  c.tool_calls = {{"get_weather", "{}", ""}, {"now", "{}", ""}};
  Usage end;
  end.prompt_tokens = 7;
  end.completion_tokens = 12;
  out += ev.End(c, end);
  std::vector<std::pair<std::string, Json>> events;
  for (size_t at = 0; at < out.size();) {
    const size_t end_of = out.find("\n\n", at);
    ASSERT_NE(end_of, std::string::npos);
    const std::string e = out.substr(at, end_of - at);
    const size_t nl = e.find('\n');
    ASSERT_EQ(e.substr(0, 7), "event: ");
    ASSERT_EQ(e.substr(nl + 1, 6), "data: ");
    events.emplace_back(e.substr(7, nl - 7), Json::parse(e.substr(nl + 7)));
    EXPECT_EQ(events.back().first, events.back().second["type"]);
    at = end_of + 2;
  }
  std::vector<std::string> types;
  for (const auto& [t, d] : events) types.push_back(t == "content_block_delta" ? d["delta"]["type"].get<std::string>() : t);
  EXPECT_EQ(types, (std::vector<std::string>{"message_start", "ping", "content_block_start", "thinking_delta", "thinking_delta",
                                             "signature_delta", "content_block_stop", "content_block_start", "text_delta",
                                             "content_block_stop", "content_block_start", "input_json_delta", "input_json_delta",
                                             "content_block_stop", "content_block_start", "content_block_stop", "message_delta",
                                             "message_stop"}));
  EXPECT_EQ(events[0].second["message"]["usage"]["input_tokens"], 7);
  EXPECT_EQ(events[10].second["index"], 2);
  EXPECT_EQ(events[10].second["content_block"]["name"], "get_weather");
  EXPECT_EQ(events[10].second["content_block"]["id"], "toolu_ab_0");
  EXPECT_EQ(events[11].second["delta"]["partial_json"].get<std::string>() + events[12].second["delta"]["partial_json"].get<std::string>(),
            "{\"city\": 1}");
  EXPECT_EQ(events[14].second["content_block"]["id"], "toolu_ab_1");
  EXPECT_EQ(events[16].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(events[16].second["usage"]["output_tokens"], 12);
  const std::string err = AnthropicEvents::Error({500, "boom", "server_error", ""});
  EXPECT_EQ(err.substr(0, 13), "event: error\n");
}

}  // namespace
}  // namespace gale::server
