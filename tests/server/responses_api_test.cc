// OpenAI's Responses API translation: bodies into chat completions bodies (with a stored
// response's conversation), results into Responses and the Responses event stream, and the
// bounded store.
#include "server/responses_api.h"

#include <thread>

#include <gtest/gtest.h>

namespace gale::server {
namespace {

ResponsesRequest Translate(const std::string& body, ResponseStore& store) {
  auto r = ResponsesToChat(body, store);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << ": " << e->message;
    return {};
  }
  return std::get<ResponsesRequest>(r);
}

ApiError Refused(const std::string& body, ResponseStore& store) {
  auto r = ResponsesToChat(body, store);
  if (auto* e = std::get_if<ApiError>(&r)) return *e;
  ADD_FAILURE() << body << " was accepted";
  return {};
}

TEST(ResponsesApi, InputItemsBecomeChatMessages) {
  ResponseStore store;
  const ResponsesRequest r = Translate(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.5, "store": false, "stream": true,
    "tools": [{"type": "function", "name": "get_weather", "description": "W", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": false,
    "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}},
    "reasoning": {"effort": "low"},
    "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Lima?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}], "content": [{"type": "reasoning_text", "text": "Call it."}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Lima\"}"},
      {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
      {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Rain"}]}]})",
                                       store);
  const Json& c = r.chat;
  EXPECT_EQ(c["max_tokens"], 50);
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["tools"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(c["tools"][0]["function"]["strict"], true);
  EXPECT_EQ(c["tool_choice"]["function"]["name"], "get_weather");
  EXPECT_EQ(c["response_format"]["json_schema"]["name"], "w");
  EXPECT_EQ(c["chat_template_kwargs"]["enable_thinking"], true);
  EXPECT_FALSE(r.store);
  EXPECT_TRUE(r.stream);
  const Json& m = c["messages"];
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0], Json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1], Json({{"role", "system"}, {"content", "Use tools."}}));
  EXPECT_EQ(m[2]["content"], "Weather in Lima?");
  EXPECT_EQ(m[3]["content"], "Checking.");
  EXPECT_EQ(m[3]["reasoning_content"], "Call it.");
  ASSERT_EQ(m[3]["tool_calls"].size(), 2u);
  EXPECT_EQ(m[3]["tool_calls"][1]["id"], "c2");
  EXPECT_EQ(m[4], Json({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "Sunny"}}));
  EXPECT_EQ(m[5]["content"], "Rain");
  // The stored conversation leaves the instructions out (they are not carried over).
  EXPECT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.echo["instructions"], "Be brief.");
  EXPECT_EQ(Translate(R"({"input": "Hi"})", store).chat["messages"], Json::parse(R"([{"role": "user", "content": "Hi"}])"));
}

TEST(ResponsesApi, BadBodiesAreRefusedNamingTheField) {
  ResponseStore store;
  auto expect = [&](const std::string& body, int status, const std::string& param, const std::string& says) {
    const ApiError e = Refused(body, store);
    EXPECT_EQ(e.status, status) << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_NE(e.message.find(says), std::string::npos) << body << ": " << e.message;
  };
  expect("{", 400, "", "not valid JSON");
  expect(R"({"model": "m"})", 400, "input", "'input' is required");
  expect(R"({"input": 3})", 400, "input", "a string or an array");
  expect(R"({"input": [{"role": "robot", "content": "x"}]})", 400, "input[0].role", "'role' must be");
  expect(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})", 400, "input[0].content[0]",
         "'input_image' content is not supported");
  expect(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", 400, "input[0].call_id", "needs 'call_id'");
  expect(R"({"input": [{"type": "item_reference", "id": "x"}]})", 400, "input[0].type", "'item_reference' are not supported");
  expect(R"({"input": "x", "tools": [{"type": "web_search"}]})", 400, "tools[0].type", "only function tools");
  expect(R"({"input": "x", "tool_choice": {"type": "file_search"}})", 400, "tool_choice", "must be auto");
  expect(R"({"input": "x", "text": {"format": {"type": "yaml"}}})", 400, "text.format.type", "text, json_object or json_schema");
  expect(R"({"input": "x", "previous_response_id": "resp_nope"})", 404, "previous_response_id", "no stored response 'resp_nope'");
}

TEST(ResponsesApi, PreviousResponsesCarryTheConversation) {
  ResponseStore store;
  Choice c;
  c.text = "Checking.";
  c.tool_calls = {{"get_weather", R"({"city":"Lima"})", ""}};
  c.finish_reason = FinishReason::kEos;
  ResponsesRequest first = Translate(R"({"instructions": "Be brief.", "input": "Weather in Lima?"})", store);
  Usage u;
  u.prompt_tokens = 9;
  u.completion_tokens = 4;
  const Json response = ResponseObject("resp_ab", 100, "m", first, c, u);
  EXPECT_EQ(response["status"], "completed");
  ASSERT_EQ(response["output"].size(), 2u);
  EXPECT_EQ(response["output"][0]["content"][0]["text"], "Checking.");
  EXPECT_EQ(response["output"][1]["call_id"], "call_ab_0");
  EXPECT_EQ(response["output"][1]["id"], "fc_ab_0");
  EXPECT_EQ(response["usage"]["total_tokens"], 13);
  EXPECT_EQ(response["instructions"], "Be brief.");
  Json messages = first.messages;
  messages.push_back(AssistantChatMessage("resp_ab", c));
  store.Put("resp_ab", {response, messages});
  const ResponsesRequest next = Translate(
      R"({"previous_response_id": "resp_ab", "input": [{"type": "function_call_output", "call_id": "call_ab_0", "output": "Sunny"}]})", store);
  const Json& m = next.chat["messages"];
  ASSERT_EQ(m.size(), 3u) << m.dump();  // no instructions: they are not carried over
  EXPECT_EQ(m[0]["content"], "Weather in Lima?");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "call_ab_0");
  EXPECT_EQ(m[2]["tool_call_id"], "call_ab_0");
  // Cut by max_output_tokens: incomplete, saying why.
  c.finish_reason = FinishReason::kLength;
  EXPECT_EQ(ResponseObject("resp_x", 1, "m", first, c, u)["incomplete_details"]["reason"], "max_output_tokens");
}

TEST(ResponsesApi, TheStoreIsBoundedAndExpires) {
  ResponseStore by_count({/*max_responses=*/2, /*max_bytes=*/1 << 20, std::chrono::seconds(3600)});
  for (const char* id : {"a", "b", "c"}) by_count.Put(id, {Json{{"id", id}}, Json::array()});
  EXPECT_FALSE(by_count.Get("a"));
  EXPECT_TRUE(by_count.Get("b") && by_count.Get("c"));
  EXPECT_TRUE(by_count.Delete("b"));
  EXPECT_FALSE(by_count.Delete("b"));
  EXPECT_EQ(by_count.size(), 1u);
  ResponseStore by_bytes({100, /*max_bytes=*/200, std::chrono::seconds(3600)});
  for (int i = 0; i < 10; ++i) by_bytes.Put(std::to_string(i), {Json{{"text", std::string(60, 'x')}}, Json::array()});
  EXPECT_LE(by_bytes.size(), 3u);
  EXPECT_TRUE(by_bytes.Get("9"));
  ResponseStore by_age({100, 1 << 20, std::chrono::seconds(0)});
  by_age.Put("old", {Json::object(), Json::array()});
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_FALSE(by_age.Get("old"));
}

TEST(ResponsesApi, TheEventStreamFollowsTheResponsesSequence) {
  ResponseStore store;
  const ResponsesRequest r = Translate(R"({"input": "x", "stream": true})", store);
  ResponsesEvents ev("resp_ab", 1, "m");
  std::string out = ev.Start(r);  // (one call per statement: their order is the events')
  out += ev.Thinking("hm");
  out += ev.Text("Hi");
  out += ev.Text(" there");
  out += ev.Calls({{0, "f", "{\"a\""}, {0, "", ": 1}"}});
  Choice c;
  c.reasoning = "hm";
  c.text = "Hi there";
  c.tool_calls = {{"f", "{\"a\": 1}", ""}};
  c.finish_reason = FinishReason::kEos;
  out += ev.End(ResponseObject("resp_ab", 1, "m", r, c, Usage{}));
  std::vector<Json> events;
  for (size_t at = 0; at < out.size();) {
    const size_t end = out.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    const std::string e = out.substr(at, end - at);
    const size_t nl = e.find('\n');
    events.push_back(Json::parse(e.substr(nl + 7)));
    EXPECT_EQ(e.substr(7, nl - 7), events.back()["type"]);
    EXPECT_EQ(events.back()["sequence_number"], events.size() - 1);
    at = end + 2;
  }
  std::vector<std::string> types;
  for (const Json& e : events) types.push_back(e["type"]);
  EXPECT_EQ(types, (std::vector<std::string>{
                       "response.created", "response.in_progress", "response.output_item.added", "response.reasoning_text.delta",
                       "response.reasoning_text.done", "response.output_item.done", "response.output_item.added",
                       "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                       "response.output_text.done", "response.content_part.done", "response.output_item.done",
                       "response.output_item.added", "response.function_call_arguments.delta",
                       "response.function_call_arguments.delta", "response.function_call_arguments.done",
                       "response.output_item.done", "response.completed"}));
  EXPECT_EQ(events[10]["text"], "Hi there");
  EXPECT_EQ(events[12]["item"]["id"], "msg_ab");
  EXPECT_EQ(events[16]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(events[17]["item"]["call_id"], "call_ab_0");
  // The final response names its items as the stream did.
  EXPECT_EQ(events[18]["response"]["output"][2]["id"], events[17]["item"]["id"]);
  EXPECT_EQ(events[18]["response"]["output"][1]["id"], events[12]["item"]["id"]);
}

}  // namespace
}  // namespace gale::server
