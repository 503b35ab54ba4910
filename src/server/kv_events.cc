// vLLM-format KV-cache events over ZeroMQ (see kv_events.h).
#include "server/kv_events.h"

#include <zmq.h>

#include <chrono>
#include <cstring>

#include <msgpack.hpp>

namespace gale::server {
namespace {

// A sequence number as vLLM's frames carry it: 8 bytes, big-endian.
std::string SeqBytes(uint64_t v) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (56 - 8 * i));
  return b;
}

}  // namespace

StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(const std::string& endpoint, const std::string& topic,
                                                                     int64_t block_size, const std::string& replay_endpoint) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher());
  p->topic_ = topic;
  p->block_size_ = block_size;
  p->context_ = zmq_ctx_new();
  if (p->context_ == nullptr) return Internal("zmq_ctx_new failed: {}", zmq_strerror(zmq_errno()));
  p->socket_ = zmq_socket(p->context_, ZMQ_PUB);
  if (p->socket_ == nullptr) return Internal("zmq_socket failed: {}", zmq_strerror(zmq_errno()));
  const int linger = 0;  // at exit, what was not sent yet is dropped rather than waited for
  zmq_setsockopt(p->socket_, ZMQ_LINGER, &linger, sizeof(linger));
  if (zmq_bind(p->socket_, endpoint.c_str()) != 0) {
    return InvalidArgument("--kv-events-endpoint {}: {}", endpoint, zmq_strerror(zmq_errno()));
  }
  if (!replay_endpoint.empty()) {
    p->replay_ = zmq_socket(p->context_, ZMQ_ROUTER);
    if (p->replay_ == nullptr) return Internal("zmq_socket failed: {}", zmq_strerror(zmq_errno()));
    zmq_setsockopt(p->replay_, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(p->replay_, replay_endpoint.c_str()) != 0) {
      return InvalidArgument("--kv-events-replay-endpoint {}: {}", replay_endpoint, zmq_strerror(zmq_errno()));
    }
    p->replay_thread_ = std::thread([raw = p.get()] { raw->ServeReplays(); });
  }
  return p;
}

void KvEventPublisher::ServeReplays() {
  auto send = [&](const std::string& client, const std::string& seq, const std::string& payload) {
    zmq_send(replay_, client.data(), client.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(replay_, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(replay_, seq.data(), seq.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(replay_, payload.data(), payload.size(), ZMQ_DONTWAIT);
  };
  while (!stop_.load()) {
    zmq_pollitem_t item{replay_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0) continue;
    // A request: the client's identity, an empty delimiter (REQ/DEALER), the first sequence.
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, replay_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&msg);
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
    }
    if (frames.size() < 2 || frames.back().size() != 8) continue;  // not a request: ignored
    uint64_t start = 0;
    for (unsigned char c : frames.back()) start = (start << 8) | c;
    std::vector<std::pair<uint64_t, std::string>> batches;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& b : kept_) {
        if (b.first >= start) batches.push_back(b);
      }
    }
    for (const auto& [seq, payload] : batches) send(frames[0], SeqBytes(seq), payload);
    send(frames[0], SeqBytes(~uint64_t{0}), "");  // the end: -1, nothing
  }
}

std::string KvEventPublisher::replay_endpoint() const {
  if (replay_ == nullptr) return "";
  char buf[256] = {0};
  size_t len = sizeof(buf);
  if (zmq_getsockopt(replay_, ZMQ_LAST_ENDPOINT, buf, &len) != 0) return "";
  return std::string(buf);
}

std::string KvEventPublisher::endpoint() const {
  char buf[256] = {0};
  size_t len = sizeof(buf);
  if (zmq_getsockopt(socket_, ZMQ_LAST_ENDPOINT, buf, &len) != 0) return "";
  return std::string(buf);
}

KvEventPublisher::~KvEventPublisher() {
  stop_ = true;
  if (replay_thread_.joinable()) replay_thread_.join();
  if (replay_ != nullptr) zmq_close(replay_);
  if (socket_ != nullptr) zmq_close(socket_);
  if (context_ != nullptr) zmq_ctx_term(context_);
}

std::string KvEventPublisher::Encode(const std::vector<KvCacheEvent>& events, double timestamp, int64_t block_size) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(2);
  pk.pack_double(timestamp);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvCacheEvent& e : events) {
    const bool stored = e.kind == KvCacheEvent::Kind::kStored;
    pk.pack_array(stored ? 7 : 3);
    pk.pack(std::string(stored ? "BlockStored" : "BlockRemoved"));
    pk.pack(e.hashes);
    if (stored) {
      if (e.parent) {
        pk.pack(*e.parent);
      } else {
        pk.pack_nil();
      }
      pk.pack(e.tokens);
      pk.pack(block_size);
      pk.pack_nil();  // lora_id
    }
    pk.pack_nil();  // medium
  }
  return std::string(buf.data(), buf.size());
}

void KvEventPublisher::Publish(const std::vector<KvCacheEvent>& events) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string payload = Encode(events, now, block_size_);
  const std::string seq = SeqBytes(seq_);
  if (replay_ != nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_.emplace_back(seq_, payload);
    if (kept_.size() > kReplayKept) kept_.pop_front();
  }
  ++seq_;
  // A PUB socket drops rather than blocks when a subscriber's queue is full.
  zmq_send(socket_, topic_.data(), topic_.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(socket_, seq.data(), seq.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(socket_, payload.data(), payload.size(), ZMQ_DONTWAIT);
}

}  // namespace gale::server
