// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) as a translation layer over
// the chat completions path: a Messages body becomes a chat completions body (system, text,
// tool_use and tool_result blocks, thinking, tools with input_schema, tool_choice, stop
// sequences), and a chat's result becomes a Message (content blocks, stop_reason, usage) or
// Anthropic's stream of events. Errors in Anthropic's shape. Pure functions and one stream
// writer; no sockets, no engine.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/openai_api.h"
#include "server/tool_calls.h"

namespace gale::server {

// The chat completions body (as ParseCompletionRequest reads it) for a Messages body, or a 400
// naming the field. count_tokens: the body of /v1/messages/count_tokens (no max_tokens).
std::variant<Json, ApiError> AnthropicToChat(const std::string& body, bool count_tokens);

// {"type": "error", "error": {"type", "message"}}, the type from the HTTP status as Anthropic's
// API names it (invalid_request_error, authentication_error, not_found_error, rate_limit_error,
// api_error, overloaded_error, ...).
std::string AnthropicErrorBody(const ApiError& e);

// stop_reason: tool_use when the answer holds calls and ended by itself, max_tokens, stop_sequence
// (a stop string ended it), end_turn otherwise.
std::string AnthropicStopReason(const Choice& c);

// The whole Message of a chat's one choice.
Json AnthropicMessage(const std::string& id, const std::string& model, const Choice& c, const Usage& usage);

// Anthropic's server-sent events for one streamed message: message_start (with a ping), a content
// block per kind in the order the model writes them (thinking, text, each tool_use), each opened,
// given deltas (thinking_delta, text_delta, input_json_delta) and stopped, then message_delta with
// the stop reason and usage, and message_stop. Each call returns the events' text to send.
class AnthropicEvents {
 public:
  AnthropicEvents(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}
  std::string Start(const Usage& usage);
  std::string Thinking(std::string_view text);
  std::string Text(std::string_view text);
  // Calls as MessageStream gives them: a call's first delta names it (its block opens), the
  // rest add to its arguments.
  std::string Calls(const std::vector<CallDelta>& deltas);
  std::string End(const Choice& c, const Usage& usage);
  static std::string Error(const ApiError& e);

 private:
  enum class Block { kNone, kThinking, kText, kTool };
  std::string Open(Block kind, Json content_block);
  std::string Close();
  std::string id_, model_;
  int index_ = -1;          // the last block opened
  Block open_ = Block::kNone;
  size_t open_call_ = 0;    // kTool: the call's index among the message's calls
};

}  // namespace gale::server
