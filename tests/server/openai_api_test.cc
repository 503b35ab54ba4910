// The OpenAI request fields the agent API added (src/server/openai_api.h): unknown fields,
// structured-output fields, tool_choice, logit_bias, and /v1/embeddings' request and response.
#include "server/openai_api.h"

#include <cstring>

#include <gtest/gtest.h>

namespace gale::server {
namespace {

TEST(OpenAiRequest, UnknownFieldsAreIgnoredUnlessStrict) {
  const std::string body = R"({"messages": [{"role": "user", "content": "hi"}], "store": true, "metadata": {"a": "b"},
      "service_tier": "auto", "reasoning_effort": "low", "parallel_tool_calls": false, "max_completion_tokens": 5,
      "modalities": ["text"], "prediction": null})";
  auto r = ParseCompletionRequest(body, /*chat=*/true);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<CompletionRequest>(r);
  EXPECT_EQ(req.max_tokens, 5);
  EXPECT_FALSE(req.parallel_tool_calls);
  EXPECT_EQ(req.ignored_fields, (std::vector<std::string>{"store", "metadata", "service_tier", "reasoning_effort", "modalities", "prediction"}));
  auto strict = ParseCompletionRequest(body, true, /*strict=*/true);
  ASSERT_TRUE(std::holds_alternative<ApiError>(strict));
  EXPECT_EQ(std::get<ApiError>(strict).param, "store");
  // Completions take max_completion_tokens too.
  auto c = ParseCompletionRequest(R"({"prompt": "x", "max_completion_tokens": 7, "store": false})", false);
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(c));
  EXPECT_EQ(std::get<CompletionRequest>(c).max_tokens, 7);
}

TEST(OpenAiRequest, StructuredOutputFields) {
  using Kind = grammar::Constraint::Kind;
  auto parse = [](const std::string& extra) {
    return ParseCompletionRequest(R"({"prompt": "x", )" + extra + "}", false);
  };
  auto kind = [&](const std::string& extra) {
    auto r = parse(extra);
    if (!std::holds_alternative<CompletionRequest>(r)) return std::string("error: ") + std::get<ApiError>(r).message;
    const auto& c = std::get<CompletionRequest>(r).constraint;
    return c ? std::to_string(static_cast<int>(c->kind)) + ":" + c->text : std::string("none");
  };
  const auto k = [](Kind x) { return std::to_string(static_cast<int>(x)); };
  EXPECT_EQ(kind(R"("response_format": {"type": "json_object"})"), k(Kind::kJsonObject) + ":");
  EXPECT_EQ(kind(R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": "object", "b": 1, "a": 2}}})"),
            k(Kind::kJsonSchema) + R"(:{"type":"object","b":1,"a":2})");
  EXPECT_EQ(kind(R"("response_format": {"type": "text"})"), "none");
  // "strict": false reads objects without additionalProperties as JSON Schema does (open).
  auto objects = [&](const std::string& strict) {
    auto r = parse(R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", )" + strict +
                   R"("schema": {"type": "object"}}})");
    return std::get<CompletionRequest>(r).constraint->objects;
  };
  EXPECT_EQ(objects(R"("strict": false, )"), grammar::ObjectKeys::kOpen);
  EXPECT_EQ(objects(R"("strict": true, )"), grammar::ObjectKeys::kClosed);
  EXPECT_EQ(objects(""), grammar::ObjectKeys::kClosed);
  EXPECT_EQ(kind(R"("guided_json": "{\"type\": \"integer\"}")"), k(Kind::kJsonSchema) + R"(:{"type":"integer"})");
  EXPECT_EQ(kind(R"("guided_regex": "a+")"), k(Kind::kRegex) + ":a+");
  EXPECT_EQ(kind(R"("guided_choice": ["x", "y"])"), k(Kind::kChoice) + R"(:["x","y"])");
  EXPECT_EQ(kind(R"("guided_grammar": "root ::= \"a\"")"), k(Kind::kGbnf) + ":root ::= \"a\"");
  EXPECT_EQ(kind(R"("structured_outputs": {"regex": "b", "backend": "xgrammar"})"), k(Kind::kRegex) + ":b");
  EXPECT_EQ(kind(R"("grammar": "root ::= \"a\"")"), k(Kind::kGbnf) + ":root ::= \"a\"");
  EXPECT_EQ(kind(R"("json_schema": {"type": "boolean"})"), k(Kind::kJsonSchema) + R"(:{"type":"boolean"})");
  EXPECT_NE(kind(R"("guided_regex": "a", "guided_choice": ["b"])").find("both constrain"), std::string::npos);
  EXPECT_NE(kind(R"("response_format": {"type": "json_schema"})").find("needs a 'json_schema'"), std::string::npos);
  EXPECT_NE(kind(R"("response_format": {"type": "yaml"})").find("unknown response_format type"), std::string::npos);
  EXPECT_NE(kind(R"("guided_choice": [])").find("non-empty array"), std::string::npos);
  EXPECT_NE(kind(R"("structured_outputs": {"wat": 1})").find("structured_outputs.wat"), std::string::npos);
  EXPECT_NE(kind(R"("logit_bias": {"12": 200})").find("[-100, 100]"), std::string::npos);
  EXPECT_NE(kind(R"("logit_bias": {"x": 1})").find("not a token id"), std::string::npos);
  auto lb = parse(R"("logit_bias": {"12": -100, "7": 2.5})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(lb));
  EXPECT_EQ(std::get<CompletionRequest>(lb).sampling.logit_bias.size(), 2u);
}

TEST(OpenAiRequest, ToolChoice) {
  auto parse = [](const std::string& extra) {
    return ParseCompletionRequest(R"({"messages": [{"role": "user", "content": "x"}], )" + extra + "}", true);
  };
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}])";
  auto r = parse(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r));
  EXPECT_EQ(std::get<CompletionRequest>(r).tool_choice, "function");
  EXPECT_EQ(std::get<CompletionRequest>(r).tool_choice_name, "f");
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse(R"("tool_choice": "required")")));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse(tools + R"(, "tool_choice": "sometimes")")));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse(R"("tools": [{"type": "function"}])")));
  // An assistant message with tool calls and no content, then the tool's answer.
  auto rt = parse(tools + R"(, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null,
      "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "3"}])");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(rt)) << std::get<ApiError>(rt).message;
}

TEST(OpenAiEmbeddings, RequestShapesAndErrors) {
  auto parse = [](const std::string& body) { return ParseEmbeddingRequest(body, 64); };
  auto r = parse(R"({"input": ["a", "b"], "model": "m", "encoding_format": "base64", "dimensions": 64, "user": "u", "x": 1})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<CompletionRequest>(r);
  EXPECT_TRUE(req.embeddings);
  EXPECT_TRUE(req.base64);
  EXPECT_EQ(req.prompts.size(), 2u);
  EXPECT_EQ(req.ignored_fields, std::vector<std::string>{"x"});
  auto ids = parse(R"({"input": [[1, 2], [3]]})");
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(ids));
  EXPECT_EQ(std::get<CompletionRequest>(ids).prompt_ids.size(), 2u);
  for (const char* bad : {R"({})", R"({"input": []})", R"({"input": ""})", R"({"input": [1, "a"]})", R"({"input": [-1]})",
                          R"({"input": "a", "encoding_format": "int8"})", R"({"input": "a", "dimensions": 32})", "[1]"}) {
    EXPECT_TRUE(std::holds_alternative<ApiError>(parse(bad))) << bad;
  }
  EXPECT_TRUE(std::holds_alternative<ApiError>(ParseEmbeddingRequest(R"({"input": "a", "x": 1})", 64, /*strict=*/true)));
}

TEST(OpenAiEmbeddings, Base64IsLittleEndianFloat32) {
  CompletionRequest req;
  req.embeddings = true;
  req.model.assign(1, 'm');
  const std::vector<std::vector<float>> v = {{1.0f, -2.5f, 0.125f}, {3.0f}};
  req.base64 = false;
  const Json plain = EmbeddingResponse(req, v, 7);
  EXPECT_EQ(plain["data"][1]["embedding"][0], 3.0);
  EXPECT_EQ(plain["usage"]["prompt_tokens"], 7);
  req.base64 = true;
  const Json b = EmbeddingResponse(req, v, 7);
  // Decode by hand and compare bytes.
  const std::string s = b["data"][0]["embedding"].get<std::string>();
  static const std::string kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i + 4 <= s.size(); i += 4) {
    uint32_t x = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i + k];
      x <<= 6;
      if (c == '=') {
        ++pad;
      } else {
        x |= static_cast<uint32_t>(kB64.find(c));
      }
    }
    bytes.push_back(static_cast<uint8_t>(x >> 16));
    if (pad < 2) bytes.push_back(static_cast<uint8_t>(x >> 8));
    if (pad < 1) bytes.push_back(static_cast<uint8_t>(x));
  }
  ASSERT_EQ(bytes.size(), 12u);
  float f[3];
  std::memcpy(f, bytes.data(), 12);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -2.5f);
  EXPECT_EQ(f[2], 0.125f);
}

}  // namespace
}  // namespace gale::server
