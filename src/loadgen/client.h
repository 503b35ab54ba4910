// One streaming request to an OpenAI-compatible server, timed on the client: when each SSE event
// arrived (time to first token, inter-token gaps, end to end), usage, and what went wrong
// (timeout, connection, HTTP status, malformed stream). Blocking; the load generator runs many.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gale::loadgen {

using Clock = std::chrono::steady_clock;

struct Target {
  std::string host = "127.0.0.1";
  std::string port = "8080";
  std::string base_path = "/v1";
  std::string api_key;
};

// Parses http://HOST:PORT[/base] (no TLS); base defaults to /v1.
bool ParseUrl(const std::string& url, Target* out);

enum class Outcome { kOk, kTimeout, kConnectError, kHttpError, kStreamError };
const char* OutcomeName(Outcome o);

struct RequestResult {
  double start_s = 0.0;   // since the test began
  double ttft_s = -1.0;   // first event with text
  double e2e_s = -1.0;
  std::vector<double> itl_s;  // gaps between text events after the first
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;  // from usage when the server sends it, else text events
  int64_t input_len = 0, output_len = 0;  // what was asked
  Outcome outcome = Outcome::kOk;
  int http_status = 0;
  std::string error;
};

// POSTs body to base_path + path with stream: true and reads the event stream to the end.
RequestResult PostStreaming(const Target& target, const std::string& path, const std::string& body,
                            double timeout_s, Clock::time_point test_start);

// GETs path (absolute, e.g. "/metrics") and returns the body; false on any error or non-200.
bool GetText(const Target& target, const std::string& path, double timeout_s, std::string* body);

// Prometheus text format -> {"name" or "name{labels}": value}; comments and bad lines skipped.
std::map<std::string, double> ParsePrometheus(const std::string& text);

}  // namespace gale::loadgen
