// KV-cache events (kv/kv_cache_manager.h, server/kv_events.h): what the prefix cache stores and
// evicts, as vLLM publishes it (ZeroMQ PUB, msgpack), read back by a real ZeroMQ subscriber.
#include "server/kv_events.h"

#include <zmq.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include "../test_util.h"
#include "base/thread_pool.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace gale::server {
namespace {

std::vector<int32_t> Range(int32_t from, int32_t n) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

// Stored: one event per run of newly cached blocks, chained by parent hashes, with their tokens;
// a block cached already is not news; evictions come out as one removal of the stored hashes.
TEST(KvEventsTest, TheCacheManagerRecordsStoredAndEvictedBlocks) {
  KvCacheManager kv(4, 4, /*enable_prefix_caching=*/true);
  kv.set_record_events(true);
  const std::vector<int32_t> a = Range(10, 9);  // two full blocks and one token
  ASSERT_TRUE(kv.AllocateSlots(1, 9));
  kv.CacheFullBlocks(1, a, 9, "");
  std::vector<KvCacheEvent> ev = kv.TakeEvents();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KvCacheEvent::Kind::kStored);
  ASSERT_EQ(ev[0].hashes.size(), 2u);
  EXPECT_FALSE(ev[0].parent.has_value());
  EXPECT_EQ(ev[0].tokens, Range(10, 8));
  const std::vector<uint64_t> stored = ev[0].hashes;
  EXPECT_TRUE(kv.TakeEvents().empty());
  // The same prompt again: its blocks come from the cache, nothing new is stored; a third block
  // continues the chain from the second.
  kv.Free(1);
  std::vector<int32_t> b = a;
  for (int32_t t : Range(40, 4)) b.insert(b.end() - 1, t);  // [10..17] + [40..43] + [18]
  EXPECT_EQ(kv.AllocateCachedPrefix(2, b, ""), 8);
  ASSERT_TRUE(kv.AllocateSlots(2, 13));
  kv.CacheFullBlocks(2, b, 13, "");
  ev = kv.TakeEvents();
  ASSERT_EQ(ev.size(), 1u);
  ASSERT_EQ(ev[0].hashes.size(), 1u);
  EXPECT_EQ(ev[0].parent, stored[1]);
  EXPECT_EQ(ev[0].tokens, Range(40, 4));
  // Another request takes every block: the cached ones are evicted.
  kv.Free(2);
  ASSERT_TRUE(kv.AllocateSlots(3, 16));
  ev = kv.TakeEvents();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KvCacheEvent::Kind::kRemoved);
  std::vector<uint64_t> removed = ev[0].hashes;
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed.size(), 3u);
  for (uint64_t h : stored) EXPECT_TRUE(std::binary_search(removed.begin(), removed.end(), h));
}

// The frames of one multipart message (a message is waiting).
std::vector<std::string> ReceiveFrames(void* socket) {
  std::vector<std::string> frames;
  int more = 1;
  while (more) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    zmq_msg_recv(&msg, socket, 0);
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
  }
  return frames;
}

// One ZeroMQ subscriber: connects, and waits (publishing `events` until it hears one, since a
// PUB socket drops what it sends before the subscription arrives) for a message.
struct Message {
  std::string topic;
  uint64_t seq = 0;
  std::string payload;
};
Message ReceiveOne(KvEventPublisher& pub, const std::vector<KvCacheEvent>& events) {
  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  EXPECT_EQ(zmq_connect(sub, pub.endpoint().c_str()), 0) << pub.endpoint();
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
  Message m;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::string> frames;
  while (frames.empty() && std::chrono::steady_clock::now() < deadline) {
    pub.Publish(events);
    zmq_pollitem_t item{sub, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 50) <= 0) continue;
    frames = ReceiveFrames(sub);
  }
  zmq_close(sub);
  zmq_ctx_term(ctx);
  EXPECT_EQ(frames.size(), 3u);
  if (frames.size() != 3) return m;
  m.topic = frames[0];
  EXPECT_EQ(frames[1].size(), 8u);
  for (unsigned char c : frames[1]) m.seq = (m.seq << 8) | c;
  m.payload = frames[2];
  return m;
}

TEST(KvEventsTest, PublishedAsVllmsThreeFramesAndMsgpackBatch) {
  auto pub = KvEventPublisher::Create("tcp://127.0.0.1:*", "kv-events", 16);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  KvCacheEvent stored;
  stored.hashes = {7, 8};
  stored.parent = 5;
  stored.tokens = Range(0, 32);
  KvCacheEvent removed;
  removed.kind = KvCacheEvent::Kind::kRemoved;
  removed.hashes = {3};
  const Message m = ReceiveOne(**pub, {stored, removed});
  EXPECT_EQ(m.topic, "kv-events");
  msgpack::object_handle oh = msgpack::unpack(m.payload.data(), m.payload.size());
  const msgpack::object& batch = oh.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 2u);
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_GT(batch.via.array.ptr[0].as<double>(), 1.7e9);  // a Unix time
  const msgpack::object& evs = batch.via.array.ptr[1];
  ASSERT_EQ(evs.via.array.size, 2u);
  const msgpack::object& s = evs.via.array.ptr[0];
  ASSERT_EQ(s.via.array.size, 7u);
  EXPECT_EQ(s.via.array.ptr[0].as<std::string>(), "BlockStored");
  EXPECT_EQ(s.via.array.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(s.via.array.ptr[2].as<uint64_t>(), 5u);
  EXPECT_EQ(s.via.array.ptr[3].as<std::vector<int32_t>>(), Range(0, 32));
  EXPECT_EQ(s.via.array.ptr[4].as<int64_t>(), 16);
  EXPECT_EQ(s.via.array.ptr[5].type, msgpack::type::NIL);
  EXPECT_EQ(s.via.array.ptr[6].type, msgpack::type::NIL);
  const msgpack::object& r = evs.via.array.ptr[1];
  ASSERT_EQ(r.via.array.size, 3u);
  EXPECT_EQ(r.via.array.ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(r.via.array.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{3}));
  EXPECT_EQ(r.via.array.ptr[2].type, msgpack::type::NIL);
  // A bad endpoint is a clear error.
  auto bad = KvEventPublisher::Create("nonsense://x", "", 16);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--kv-events-endpoint"), std::string::npos);
}

// A subscriber that missed batches asks the replay socket from a sequence number on: it gets
// every kept batch from there ([seq, payload]) and then the end marker (-1, empty).
TEST(KvEventsTest, MissedBatchesAreReplayedFromTheirSequenceNumber) {
  auto pub = KvEventPublisher::Create("tcp://127.0.0.1:*", "", 16, "tcp://127.0.0.1:*");
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  std::vector<std::string> payloads;
  for (uint64_t i = 0; i < 3; ++i) {
    KvCacheEvent e;
    e.kind = KvCacheEvent::Kind::kRemoved;
    e.hashes = {100 + i};
    (*pub)->Publish({e});  // nobody subscribes: only the replay buffer keeps them
  }
  void* ctx = zmq_ctx_new();
  void* req = zmq_socket(ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(req, (*pub)->replay_endpoint().c_str()), 0) << (*pub)->replay_endpoint();
  const unsigned char start[8] = {0, 0, 0, 0, 0, 0, 0, 1};
  zmq_send(req, "", 0, ZMQ_SNDMORE);
  zmq_send(req, start, 8, 0);
  std::vector<std::pair<int64_t, std::string>> got;  // (seq, payload)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    zmq_pollitem_t item{req, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0) continue;
    const std::vector<std::string> frames = ReceiveFrames(req);
    ASSERT_EQ(frames.size(), 3u);  // delimiter, seq, payload
    EXPECT_TRUE(frames[0].empty());
    ASSERT_EQ(frames[1].size(), 8u);
    uint64_t seq = 0;
    for (unsigned char c : frames[1]) seq = (seq << 8) | c;
    got.emplace_back(static_cast<int64_t>(seq), frames[2]);
    if (frames[2].empty()) break;
  }
  zmq_close(req);
  zmq_ctx_term(ctx);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].first, 1);
  EXPECT_EQ(got[1].first, 2);
  EXPECT_EQ(got[2].first, -1);
  EXPECT_TRUE(got[2].second.empty());
  msgpack::object_handle oh = msgpack::unpack(got[1].second.data(), got[1].second.size());
  EXPECT_EQ(oh.get().via.array.ptr[1].via.array.ptr[0].via.array.ptr[1].as<std::vector<uint64_t>>(),
            (std::vector<uint64_t>{102}));
}

// Through the engine: a prompt's full blocks are announced once, with its tokens; a second request
// sharing the prefix adds only its own blocks.
TEST(KvEventsTest, TheEngineAnnouncesWhatItsPrefixCacheHolds) {
  auto file = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  auto model = LoadModel(*file).value();
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.kv_cache_memory_bytes = 4ull << 20;
  std::mutex mu;
  std::vector<KvCacheEvent> seen;
  cfg.kv_events = [&](std::vector<KvCacheEvent> events) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& e : events) seen.push_back(std::move(e));
  };
  auto engine = Engine::Create(*model, nullptr, cfg, pool).value();
  auto run = [&](const std::vector<int32_t>& prompt) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_tokens = 2;
    auto s = engine->Submit(r).value();
    StreamUpdate u;
    while (s->Next(&u)) {
    }
  };
  std::vector<int32_t> first = Range(20, 40);  // 2 full blocks of 16 (+ 8 tokens, + 2 generated)
  run(first);
  std::vector<int32_t> second = Range(20, 32);
  for (int32_t t : Range(200, 20)) second.push_back(t);  // the same 2 blocks, then a block of its own
  run(second);
  engine.reset();  // the events of the last step are out
  std::vector<int32_t> tokens;
  std::vector<uint64_t> hashes;
  for (const KvCacheEvent& e : seen) {
    ASSERT_EQ(e.kind, KvCacheEvent::Kind::kStored);
    tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
    hashes.insert(hashes.end(), e.hashes.begin(), e.hashes.end());
  }
  // first: blocks [20..35], [36..51] (the rest of its 40 tokens and 2 generated do not fill a third); second:
  // its third block [200..215].
  std::vector<int32_t> want = Range(20, 32);
  for (int32_t t : Range(200, 16)) want.push_back(t);
  EXPECT_EQ(tokens, want);
  EXPECT_EQ(hashes.size(), 3u);
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.back().parent, seen.front().hashes.back());
}

}  // namespace
}  // namespace gale::server
