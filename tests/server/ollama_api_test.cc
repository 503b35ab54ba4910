// Ollama's API translation: bodies into OpenAI bodies, answers into Ollama's shapes.
#include "server/ollama_api.h"

#include <gtest/gtest.h>

namespace gale::server {
namespace {

OllamaModel Served() {
  OllamaModel m;
  m.name = "qwen3";
  m.architecture = "qwen3";
  m.quantization = "Q4_0";
  m.parameters = 596049920;
  m.file_bytes = 400 << 20;
  m.context_length = 4096;
  m.chat = m.tools = m.thinking = true;
  return m;
}

OllamaRequest Translate(OllamaEndpoint ep, const std::string& body) {
  auto r = OllamaToOpenAi(ep, body, Served());
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << ": " << e->message;
    return {};
  }
  return std::get<OllamaRequest>(r);
}

TEST(OllamaApi, BodiesBecomeOpenAiBodies) {
  const OllamaRequest chat = Translate(OllamaEndpoint::kChat, R"({
    "model": "qwen3:latest", "keep_alive": "5m", "think": false,
    "options": {"num_predict": 20, "temperature": 0.3, "top_k": 4, "repeat_penalty": 1.1, "stop": ["END"], "num_ctx": 8192, "num_gpu": 1},
    "format": {"type": "object"},
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "messages": [{"role": "user", "content": "Weather?"},
                 {"role": "assistant", "content": "", "thinking": "call it", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Lima"}}}]},
                 {"role": "tool", "content": "Sunny", "tool_name": "get_weather"}]})");
  EXPECT_EQ(chat.model, "qwen3:latest");  // echoed as named
  EXPECT_TRUE(chat.chat);
  EXPECT_TRUE(chat.stream);  // Ollama streams unless told not to
  const Json& c = chat.body;
  EXPECT_EQ(c["max_tokens"], 20);
  EXPECT_EQ(c["repetition_penalty"], 1.1);
  EXPECT_EQ(c["stop"], Json::array({"END"}));
  EXPECT_FALSE(c.contains("num_ctx"));
  EXPECT_EQ(c["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_EQ(c["response_format"]["type"], "json_schema");
  EXPECT_EQ(c["messages"][1]["reasoning_content"], "call it");
  const Json& call = c["messages"][1]["tool_calls"][0];
  EXPECT_EQ(Json::parse(call["function"]["arguments"].get<std::string>()), Json({{"city", "Lima"}}));
  EXPECT_EQ(c["messages"][2]["tool_call_id"], call["id"]);
  const OllamaRequest gen = Translate(OllamaEndpoint::kGenerate, R"({"model": "qwen3", "prompt": "Hi", "system": "Be brief.", "stream": false, "format": "json"})");
  EXPECT_FALSE(gen.stream);
  EXPECT_EQ(gen.body["messages"], Json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(gen.body["response_format"]["type"], "json_object");
  const OllamaRequest raw = Translate(OllamaEndpoint::kGenerate, R"({"model": "qwen3", "prompt": "Hi", "raw": true})");
  EXPECT_FALSE(raw.chat);
  EXPECT_EQ(raw.body["prompt"], "Hi");
  EXPECT_TRUE(raw.all_that_fits);  // no num_predict: Ollama generates until the end or the context
  EXPECT_FALSE(Translate(OllamaEndpoint::kGenerate, R"({"model": "qwen3", "prompt": "Hi", "raw": true, "options": {"num_predict": 3}})").all_that_fits);
  EXPECT_TRUE(Translate(OllamaEndpoint::kChat, R"({"model": "qwen3"})").load_only);
  EXPECT_TRUE(Translate(OllamaEndpoint::kGenerate, R"({"model": "qwen3", "prompt": ""})").load_only);
  EXPECT_EQ(Translate(OllamaEndpoint::kEmbed, R"({"model": "qwen3", "input": ["a", "b"]})").body["input"], Json::array({"a", "b"}));
  EXPECT_EQ(Translate(OllamaEndpoint::kEmbeddings, R"({"model": "qwen3", "prompt": "a"})").body["input"], "a");
}

TEST(OllamaApi, BadBodiesAreRefused) {
  auto refused = [](OllamaEndpoint ep, const std::string& body, int status, const std::string& says) {
    auto r = OllamaToOpenAi(ep, body, Served());
    const ApiError* e = std::get_if<ApiError>(&r);
    ASSERT_NE(e, nullptr) << body;
    EXPECT_EQ(e->status, status) << body;
    EXPECT_NE(e->message.find(says), std::string::npos) << body << ": " << e->message;
  };
  refused(OllamaEndpoint::kChat, "{", 400, "not valid JSON");
  refused(OllamaEndpoint::kChat, R"({"messages": []})", 400, "model is required");
  refused(OllamaEndpoint::kChat, R"({"model": "llama3", "messages": []})", 404, "model 'llama3' not found");
  refused(OllamaEndpoint::kChat, R"({"model": "qwen3", "messages": [{"role": "user", "content": "x", "images": ["AA"]}]})", 400, "images");
  refused(OllamaEndpoint::kChat, R"({"model": "qwen3", "stream": "yes", "messages": []})", 400, "'stream' must be a boolean");
  refused(OllamaEndpoint::kChat, R"({"model": "qwen3", "format": 3, "messages": []})", 400, "'format'");
  refused(OllamaEndpoint::kGenerate, R"({"model": "qwen3", "prompt": "x", "suffix": "y"})", 400, "'suffix' is not supported");
  refused(OllamaEndpoint::kGenerate, R"({"model": "qwen3", "prompt": "x", "context": [1, 2]})", 400, "'context' is not supported");
  refused(OllamaEndpoint::kGenerate, R"({"model": "qwen3", "prompt": "x", "options": {"num_predict": 0}})", 400, "num_predict");
  refused(OllamaEndpoint::kEmbed, R"({"model": "qwen3", "input": [1]})", 400, "string or an array of strings");
  EXPECT_EQ(Json::parse(OllamaErrorBody("boom")), Json({{"error", "boom"}}));
}

TEST(OllamaApi, AnswersInOllamasShape) {
  Choice c;
  c.text = "Hi";
  c.reasoning = "hm";
  c.tool_calls = {{"get_weather", R"({"city": "Lima"})", ""}};
  c.finish_reason = FinishReason::kEos;
  Usage u;
  u.prompt_tokens = 5;
  u.completion_tokens = 3;
  const Json whole = OllamaFinal(OllamaEndpoint::kChat, "qwen3", c, u, {30, 10, 20}, true);
  EXPECT_EQ(whole["message"]["content"], "Hi");
  EXPECT_EQ(whole["message"]["thinking"], "hm");
  EXPECT_EQ(whole["message"]["tool_calls"][0]["function"]["arguments"], Json({{"city", "Lima"}}));
  EXPECT_EQ(whole["done"], true);
  EXPECT_EQ(whole["done_reason"], "stop");
  EXPECT_EQ(whole["prompt_eval_count"], 5);
  EXPECT_EQ(whole["eval_duration"], 20);
  const std::string line = OllamaDeltaLine(OllamaEndpoint::kGenerate, "qwen3", "He", "", {});
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(Json::parse(line)["response"], "He");
  EXPECT_EQ(Json::parse(line)["done"], false);
  c.finish_reason = FinishReason::kLength;
  const Json last = OllamaFinal(OllamaEndpoint::kGenerate, "qwen3", c, u, {}, false);
  EXPECT_EQ(last["response"], "");
  EXPECT_EQ(last["done_reason"], "length");
  const Json tags = OllamaTags(Served());
  EXPECT_EQ(tags["models"][0]["name"], "qwen3:latest");
  EXPECT_EQ(tags["models"][0]["details"]["parameter_size"], "596.0M");
  EXPECT_EQ(tags["models"][0]["digest"].get<std::string>().size(), 64u);
  EXPECT_EQ(OllamaShow(Served())["capabilities"], Json::array({"completion", "tools", "thinking"}));
  EXPECT_EQ(OllamaPs(Served())["models"][0]["context_length"], 4096);
  EXPECT_TRUE(OllamaModelMatches("qwen3:latest", Served()));
  EXPECT_FALSE(OllamaModelMatches("qwen3:8b", Served()));
}

}  // namespace
}  // namespace gale::server
