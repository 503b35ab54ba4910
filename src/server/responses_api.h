// OpenAI's Responses API (/v1/responses) as a translation layer over the chat completions path:
// input (a string or items: messages, function_call, function_call_output, reasoning), instructions,
// function tools, tool_choice, text.format, max_output_tokens and previous_response_id become a
// chat completions body; a chat's result becomes a Response (reasoning, message and function_call
// output items) or the Responses event stream. Stored responses (store, the default) are kept in a
// bounded store with expiry, for previous_response_id and GET / DELETE. No sockets, no engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/openai_api.h"
#include "server/tool_calls.h"

namespace gale::server {

// Responses kept for previous_response_id and GET: at most this many, this many bytes of JSON in
// all, each for this long; past a bound the oldest go first.
struct ResponseStoreLimits {
  size_t max_responses = 1024;
  size_t max_bytes = size_t{64} << 20;
  std::chrono::seconds ttl{3600};
};

class ResponseStore {
 public:
  explicit ResponseStore(ResponseStoreLimits limits = {}) : limits_(limits) {}
  struct Entry {
    Json response;  // the Response object, as GET returns it
    Json messages;  // the conversation through this response's output, as chat messages
  };
  void Put(const std::string& id, Entry entry);
  std::optional<Entry> Get(const std::string& id);
  bool Delete(const std::string& id);
  size_t size();

 private:
  void Evict(std::chrono::steady_clock::time_point now);  // (mu_ held)
  struct Slot {
    Entry entry;
    size_t bytes = 0;
    std::chrono::steady_clock::time_point at;
  };
  ResponseStoreLimits limits_;
  std::mutex mu_;
  std::map<std::string, Slot> slots_;
  std::deque<std::string> order_;  // ids, oldest first (a deleted one is skipped when reached)
  size_t bytes_ = 0;
};

// A Responses request, translated.
struct ResponsesRequest {
  Json chat;      // the chat completions body (ParseCompletionRequest reads it)
  Json messages;  // the conversation sent, as chat messages (stored with the answer)
  Json echo;      // the request's fields a Response repeats (instructions, tools, text, ...)
  bool store = true;
  bool stream = false;
};

// The chat completions body for a Responses body, or a 400 naming the field (a 404 for an unknown
// previous_response_id).
std::variant<ResponsesRequest, ApiError> ResponsesToChat(const std::string& body, ResponseStore& store);

// The Response for a chat's one choice: status completed (incomplete when max_output_tokens cut
// it), output items in order (reasoning, message, function calls), usage.
Json ResponseObject(const std::string& id, int64_t created, const std::string& model, const ResponsesRequest& r,
                    const Choice& c, const Usage& usage);
// The assistant's turn as a chat message (stored after the conversation).
Json AssistantChatMessage(const std::string& id, const Choice& c);

// The Responses event stream of one response: response.created and response.in_progress, then per
// output item output_item.added, its deltas (reasoning_text, output_text with its content part,
// function_call_arguments), its done events and output_item.done, then response.completed (or
// response.incomplete). Every event carries a sequence_number.
class ResponsesEvents {
 public:
  ResponsesEvents(std::string id, int64_t created, std::string model) : id_(std::move(id)), created_(created), model_(std::move(model)) {}
  std::string Start(const ResponsesRequest& r);
  std::string Thinking(std::string_view text);
  std::string Text(std::string_view text);
  std::string Calls(const std::vector<CallDelta>& deltas);
  // The final event; `response` is ResponseObject's.
  std::string End(const Json& response);
  std::string Error(const ApiError& e);

 private:
  enum class Item { kNone, kReasoning, kMessage, kCall };
  std::string Event(const std::string& type, Json data);
  std::string Open(Item kind, Json item);
  std::string Close();
  std::string id_;
  int64_t created_;
  std::string model_;
  int64_t sequence_ = 0;
  int output_index_ = -1;
  Item open_ = Item::kNone;
  Json item_;           // the open item, growing
  std::string text_;    // its text so far (reasoning, message) or arguments (call)
  size_t open_call_ = 0;
};

}  // namespace gale::server
