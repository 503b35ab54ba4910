// KV-cache events for cache-aware routers (llm-d, Dynamo, SGLang's gateway), published as vLLM
// publishes them: a ZeroMQ PUB socket bound to an endpoint (`--kv-events-endpoint`, e.g.
// tcp://*:5557), each message three frames: the topic, an 8-byte big-endian sequence number, and a
// msgpack payload [timestamp, [event, ...]] where an event is
//   ["BlockStored", [block hashes], parent hash or nil, [token ids], block_size, nil, nil]
//   ["BlockRemoved", [block hashes], nil]
// (msgspec's tagged array form of vLLM's KVEventBatch, BlockStored and BlockRemoved; the nils are
// the LoRA id and the storage medium). Block hashes are gale's own (the low 64 bits of the
// chained 128-bit hash): a router compares them with each other, never with another engine's.
// With a replay endpoint (`--kv-events-replay-endpoint`), a subscriber that saw a gap in the
// sequence numbers asks, as vLLM's do, on a ROUTER socket: it sends the first sequence number it
// missed (8 bytes, big-endian) and gets every batch still kept from there ([seq, payload] each,
// the last kReplayKept batches), then an end marker [-1 as 8 bytes, empty payload].
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache_manager.h"

namespace gale::server {

class KvEventPublisher {
 public:
  static constexpr size_t kReplayKept = 10000;  // batches, as vLLM's buffer_steps
  // replay_endpoint: "" for none.
  static StatusOr<std::unique_ptr<KvEventPublisher>> Create(const std::string& endpoint, const std::string& topic,
                                                            int64_t block_size, const std::string& replay_endpoint = "");
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Sends one batch without blocking (a subscriber too slow to keep up loses messages, and sees
  // the gap in the sequence numbers). One thread at a time (the engine's).
  void Publish(const std::vector<KvCacheEvent>& events);
  // Where it listens (a wildcard port resolved, e.g. tcp://127.0.0.1:41237), and for replays.
  std::string endpoint() const;
  std::string replay_endpoint() const;
  // The msgpack payload of one batch.
  static std::string Encode(const std::vector<KvCacheEvent>& events, double timestamp, int64_t block_size);

 private:
  KvEventPublisher() = default;
  void ServeReplays();  // the replay thread: answers requests until stop_

  void* context_ = nullptr;
  void* socket_ = nullptr;
  void* replay_ = nullptr;  // ROUTER, used by the replay thread only (after Create)
  std::string topic_;
  int64_t block_size_ = 0;
  uint64_t seq_ = 0;
  std::mutex mu_;  // kept_, between Publish and the replay thread
  std::deque<std::pair<uint64_t, std::string>> kept_;  // the last batches, oldest first
  std::atomic<bool> stop_{false};
  std::thread replay_thread_;
};

}  // namespace gale::server
