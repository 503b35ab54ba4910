// Streaming client on Boost.Beast (synchronous, one connection per request).
#include "loadgen/client.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <utility>  // Boost 1.74's awaitable.hpp needs std::exchange declared first

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace gale::loadgen {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

bool ParseUrl(const std::string& url, Target* out) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return false;
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) {
    out->host = hostport;
    out->port = "80";
  } else {
    out->host = hostport.substr(0, colon);
    out->port = hostport.substr(colon + 1);
  }
  while (!path.empty() && path.back() == '/') path.pop_back();
  out->base_path = path.empty() ? "/v1" : path;
  return !out->host.empty() && !out->port.empty();
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kOk: return "ok";
    case Outcome::kTimeout: return "timeout";
    case Outcome::kConnectError: return "connect_error";
    case Outcome::kHttpError: return "http_error";
    case Outcome::kStreamError: return "stream_error";
  }
  return "?";
}

namespace {

// Bounds each blocking call on the socket (synchronous Beast calls ignore tcp_stream's expiry).
void SetSocketTimeouts(beast::tcp_stream& stream, int64_t us) {
  timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  const int fd = stream.socket().native_handle();
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

RequestResult PostStreaming(const Target& target, const std::string& path, const std::string& body,
                            double timeout_s, Clock::time_point test_start) {
  RequestResult r;
  const auto t0 = Clock::now();
  r.start_s = std::chrono::duration<double>(t0 - test_start).count();
  auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  const auto deadline = t0 + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
  // Synchronous socket calls ignore tcp_stream's expiry: bound each blocking call with the
  // socket's own receive/send timeouts set to the time left.
  auto arm = [&]() -> bool {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    SetSocketTimeouts(stream, left);
    return true;
  };
  auto fail = [&](Outcome o, const std::string& what) {
    const bool late = Clock::now() >= deadline || ec == net::error::would_block || ec == net::error::try_again ||
                      ec == net::error::timed_out;
    r.outcome = late ? Outcome::kTimeout : o;
    r.error = what + ": " + (late ? std::string("no answer within the timeout") : ec.message());
    r.e2e_s = since(Clock::now());
    return r;
  };
  tcp::resolver resolver(ioc);
  auto endpoints = resolver.resolve(target.host, target.port, ec);
  if (ec) return fail(Outcome::kConnectError, "resolve");
  stream.connect(endpoints, ec);
  if (ec) return fail(Outcome::kConnectError, "connect");
  arm();
  http::request<http::string_body> req{http::verb::post, target.base_path + path, 11};
  req.set(http::field::host, target.host);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  if (!target.api_key.empty()) req.set(http::field::authorization, "Bearer " + target.api_key);
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req, ec);
  if (ec) return fail(Outcome::kConnectError, "write");

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  if (!arm()) return fail(Outcome::kStreamError, "read header");
  http::read_header(stream, buffer, parser, ec);
  if (ec) return fail(Outcome::kStreamError, "read header");
  r.http_status = static_cast<int>(parser.get().result_int());
  std::string pending;  // SSE bytes not yet split into events
  std::string whole;    // error bodies
  bool done = false, first = true;
  Clock::time_point last_text;
  char chunk[8192];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    if (!arm()) return fail(Outcome::kTimeout, "read body");
    http::read_some(stream, buffer, parser, ec);  // returns as soon as some body arrived
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return fail(Outcome::kStreamError, "read body");
    const size_t n = sizeof(chunk) - parser.get().body().size;
    const auto now = Clock::now();
    if (r.http_status != 200) {
      whole.append(chunk, n);
      continue;
    }
    pending.append(chunk, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string data = event.substr(6);
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      auto j = nlohmann::json::parse(data, nullptr, false);
      if (j.is_discarded()) {
        r.outcome = Outcome::kStreamError;
        r.error = "an event is not JSON";
        continue;
      }
      if (j.contains("error")) {
        r.outcome = Outcome::kStreamError;
        r.error = j["error"].dump();
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        r.prompt_tokens = j["usage"].value("prompt_tokens", 0);
        r.output_tokens = j["usage"].value("completion_tokens", 0);
      }
      bool has_text = false;
      if (j.contains("choices") && j["choices"].is_array()) {
        for (const auto& c : j["choices"]) {
          if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) has_text = true;
          if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
              c["delta"]["content"].is_string() && !c["delta"]["content"].get<std::string>().empty()) {
            has_text = true;
          }
        }
      }
      if (!has_text) continue;
      if (first) {
        r.ttft_s = since(now);
        first = false;
      } else {
        r.itl_s.push_back(std::chrono::duration<double>(now - last_text).count());
      }
      last_text = now;
    }
  }
  r.e2e_s = since(Clock::now());
  if (r.http_status != 200) {
    r.outcome = Outcome::kHttpError;
    r.error = "HTTP " + std::to_string(r.http_status) + ": " + whole.substr(0, 300);
    return r;
  }
  if (r.output_tokens == 0) r.output_tokens = static_cast<int64_t>(r.itl_s.size()) + (first ? 0 : 1);
  if (!done && r.outcome == Outcome::kOk) {
    r.outcome = Outcome::kStreamError;
    r.error = "the stream ended without [DONE]";
  }
  beast::error_code ignore;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignore);
  return r;
}

bool GetText(const Target& target, const std::string& path, double timeout_s, std::string* body) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  auto endpoints = resolver.resolve(target.host, target.port, ec);
  if (ec) return false;
  stream.connect(endpoints, ec);
  if (ec) return false;
  SetSocketTimeouts(stream, static_cast<int64_t>(timeout_s * 1e6));
  http::request<http::string_body> req{http::verb::get, path, 11};
  req.set(http::field::host, target.host);
  if (!target.api_key.empty()) req.set(http::field::authorization, "Bearer " + target.api_key);
  http::write(stream, req, ec);
  if (ec) return false;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(16u << 20);
  // Only a 200 with a text/plain body (Prometheus' format) is read on.
  http::read_header(stream, buffer, parser, ec);
  if (ec || parser.get().result_int() != 200) return false;
  if (std::string(parser.get()[http::field::content_type]).rfind("text/plain", 0) != 0) return false;
  http::read(stream, buffer, parser, ec);
  if (ec) return false;
  *body = parser.get().body();
  return true;
}

std::map<std::string, double> ParsePrometheus(const std::string& text) {
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos || space == 0) continue;
    try {
      size_t used = 0;
      const std::string num = line.substr(space + 1);
      const double v = std::stod(num, &used);
      if (used == num.size()) out[line.substr(0, space)] = v;
    } catch (const std::exception&) {
      // not a sample line
    }
  }
  return out;
}

}  // namespace gale::loadgen
