// vLLM-format KV-cache events over ZeroMQ (see kv_events.h).
#include "server/kv_events.h"

#include <zmq.h>

#include <chrono>
#include <cstring>

#include <msgpack.hpp>

namespace gale::server {

StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(const std::string& endpoint, const std::string& topic,
                                                                     int64_t block_size) {
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
  return p;
}

std::string KvEventPublisher::endpoint() const {
  char buf[256] = {0};
  size_t len = sizeof(buf);
  if (zmq_getsockopt(socket_, ZMQ_LAST_ENDPOINT, buf, &len) != 0) return "";
  return std::string(buf);
}

KvEventPublisher::~KvEventPublisher() {
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
  uint8_t seq[8];
  for (int i = 0; i < 8; ++i) seq[i] = static_cast<uint8_t>(seq_ >> (56 - 8 * i));
  ++seq_;
  // A PUB socket drops rather than blocks when a subscriber's queue is full.
  zmq_send(socket_, topic_.data(), topic_.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(socket_, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(socket_, payload.data(), payload.size(), ZMQ_DONTWAIT);
}

}  // namespace gale::server
