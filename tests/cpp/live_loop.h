// One live ServeLoop on the in-memory socket of fake_zmq.h, with a real store and a stand-in for Python's
// side of the control queue (HELLO and STATS answered with an OK header, log lines kept), plus builders of
// request frames. Used by serve_loop_test.cc and the stateful fuzz (tests/fuzz/loop_fuzz.cc).
#ifndef APEXRL_TESTS_CPP_LIVE_LOOP_H_
#define APEXRL_TESTS_CPP_LIVE_LOOP_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apexrl/serve/serve_loop.h"
#include "apexrl/serve/wire.h"
#include "apexrl/sharded_store.h"
#include "fake_zmq.h"

namespace apexrl::serve::testing {

using Frames = std::vector<std::string>;

inline std::string Header(uint16_t op, uint64_t rid, uint32_t count, double param = 0, uint32_t timeout_ms = 0) {
  std::string h = EncodeHeader(op, rid, kOk, count);
  std::memcpy(h.data() + 24, &param, 8);
  std::memcpy(h.data() + 32, &timeout_ms, 4);
  return h;
}

// The same request addressed to table `table` (the header's table field).
inline std::vector<std::string> ToTable(uint32_t table, std::vector<std::string> frames) {
  std::memcpy(frames[0].data() + 36, &table, 4);
  return frames;
}

template <typename T>
std::string Array(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// An INSERT of `items` with priorities; item i references chunks refs[i] (any u64) of `chunks` (refs empty:
// no chunks at all).
inline Frames Insert(uint64_t rid, const std::vector<std::string>& items, const std::vector<double>& priorities,
                     uint64_t session = 0, uint64_t sequence = 0, uint32_t timeout_ms = 0,
                     const std::vector<std::vector<uint64_t>>& refs = {}, const std::vector<std::string>& chunks = {}) {
  std::string data;
  std::vector<uint64_t> offsets{0};
  for (const auto& it : items) {
    data += it;
    offsets.push_back(data.size());
  }
  std::vector<uint64_t> flat, ref_offsets{0};
  for (size_t i = 0; i < items.size(); ++i) {
    if (i < refs.size()) flat.insert(flat.end(), refs[i].begin(), refs[i].end());
    ref_offsets.push_back(flat.size());
  }
  std::string chunk_data;
  std::vector<uint64_t> chunk_offsets{0};
  for (const auto& c : chunks) {
    chunk_data += c;
    chunk_offsets.push_back(chunk_data.size());
  }
  return {Header(kInsert, rid, static_cast<uint32_t>(items.size()), 0, timeout_ms),
          Array(priorities),
          Array(offsets),
          data,
          Array(std::vector<uint64_t>{session, sequence}),
          Array(flat),
          Array(ref_offsets),
          chunk_data,
          Array(chunk_offsets)};
}

inline Frames Sample(uint64_t rid, uint32_t n, uint32_t timeout_ms = 0, double beta = 0.4) {
  return {Header(kSample, rid, n, beta, timeout_ms)};
}
inline Frames Update(uint64_t rid, const std::vector<Key>& keys, const std::vector<double>& priorities) {
  return {Header(kUpdatePriorities, rid, static_cast<uint32_t>(keys.size())), Array(keys), Array(priorities)};
}
inline Frames Erase(uint64_t rid, const std::vector<Key>& keys) {
  return {Header(kErase, rid, static_cast<uint32_t>(keys.size())), Array(keys)};
}
inline Frames RemoveToFit(uint64_t rid) { return {Header(kRemoveToFit, rid, 0)}; }
inline Frames Stats(uint64_t rid) { return {Header(kStats, rid, 0)}; }

// A reply's header fields.
struct ReplyHeader {
  uint16_t op = 0, status = 0;
  uint64_t rid = 0;
  uint32_t count = 0;
};
inline ReplyHeader ParseHeader(const std::string& f) {
  ReplyHeader h;
  if (f.size() < kHeaderSize) return h;
  std::memcpy(&h.op, f.data() + 6, 2);
  std::memcpy(&h.rid, f.data() + 8, 8);
  std::memcpy(&h.status, f.data() + 16, 2);
  std::memcpy(&h.count, f.data() + 20, 4);
  return h;
}
inline std::vector<Key> KeysOf(const std::string& f) {
  std::vector<Key> k(f.size() / 8);
  if (!k.empty()) std::memcpy(k.data(), f.data(), k.size() * 8);
  return k;
}

class LiveLoop {
 public:
  LiveLoop(const StoreConfig& store_config, const LoopConfig& config)
      : store(std::make_shared<ShardedStore>(store_config)) {
    FakeZmq::Get().Reset();
    loop = std::make_unique<ServeLoop>(FakeZmq::Api(), FakeZmq::Socket(), store, config);
    loop->Start();
    control_ = std::thread([this] { Control(); });
  }
  // Several tables (their stores in `tables`).
  LiveLoop(std::vector<TableSpec> tables, const LoopConfig& config) {
    FakeZmq::Get().Reset();
    store = tables.at(0).store;
    loop = std::make_unique<ServeLoop>(FakeZmq::Api(), FakeZmq::Socket(), std::move(tables), config);
    loop->Start();
    control_ = std::thread([this] { Control(); });
  }
  ~LiveLoop() { Stop(); }

  void Stop() {
    if (!loop) return;
    loop->Stop();
    control_.join();
    loop.reset();
  }

  double Stat(const std::string& name) const {
    for (const LoopStat& s : loop->Stats()) {
      if (s.name == name) return s.value;
    }
    return -1;
  }

  // Sends one request and returns the next reply `peer` gets (empty frames after timeout_s); replies to other
  // peers stay for Next.
  Frames Request(const std::string& peer, Frames frames, double timeout_s = 30.0) {
    FakeZmq::Get().Push(peer, std::move(frames));
    SentReply r;
    if (!Next([&](const SentReply& x) { return x.peer == peer && !x.bounced; }, &r, timeout_s)) return {};
    return r.frames;
  }

  // The first reply sent (bounced ones included) that `match`es, waited for up to timeout_s.
  template <typename Match>
  bool Next(Match match, SentReply* out, double timeout_s = 30.0) {
    FakeZmq& z = FakeZmq::Get();
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (true) {
      for (auto& r : z.TakeSent()) backlog_.push_back(std::move(r));
      for (auto it = backlog_.begin(); it != backlog_.end(); ++it) {
        if (match(*it)) {
          *out = std::move(*it);
          backlog_.erase(it);
          return true;
        }
      }
      if (std::chrono::steady_clock::now() >= end) return false;
      z.WaitForReplies(1, 0.05);
    }
  }

  std::vector<std::string> Logs(const std::string& level) {
    std::lock_guard<std::mutex> lock(logs_mu_);
    return logs_[level];
  }

  std::shared_ptr<ShardedStore> store;
  std::unique_ptr<ServeLoop> loop;

 private:
  void Control() {  // Python's side: answers HELLO and STATS, keeps log lines
    while (true) {
      ControlRequest c;
      bool closed = false;
      if (!loop->NextControl(0.05, &c, &closed)) {
        if (closed) return;
        continue;
      }
      if (c.op == 0) {
        std::lock_guard<std::mutex> lock(logs_mu_);
        logs_[c.identity].push_back(c.frames.empty() ? std::string() : c.frames[0]);
        continue;
      }
      const ReplyHeader h = ParseHeader(c.frames.empty() ? std::string() : c.frames[0]);
      std::vector<std::string> reply{EncodeHeader(c.op, h.rid, kOk, 0), "{}"};
      if (c.op == kHello) reply.push_back("");
      loop->ControlReply(c.peer, std::move(reply));
    }
  }

  std::vector<SentReply> backlog_;
  std::thread control_;
  std::mutex logs_mu_;
  std::map<std::string, std::vector<std::string>> logs_;
};

}  // namespace apexrl::serve::testing

#endif  // APEXRL_TESTS_CPP_LIVE_LOOP_H_
