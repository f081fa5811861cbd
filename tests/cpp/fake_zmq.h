// An in-memory stand-in for the libzmq calls of the serving loop (serve/zmq_api.h): a ROUTER socket with
// no network, so that tests and the stateful fuzz (tests/fuzz/loop_fuzz.cc) drive one live ServeLoop with
// messages and read its replies exactly as the loop hands them to libzmq, under the sanitizers.
//
//   FakeZmq& z = FakeZmq::Get();  z.Reset();
//   ServeLoop loop(FakeZmq::Api(), FakeZmq::Socket(), store, config);  loop.Start();
//   z.Push("peer", {header, ...});  z.WaitForReplies(1, 30.0);  ... z.TakeSent() ...
//
// Semantics kept from libzmq: a message arrives as [routing id, frames...]; msg_recv of the first frame
// without ZMQ_DONTWAIT is never called by the loop; a frame handed over by msg_init_data is released through
// its free function (here right after it is copied out, as libzmq does once the peer has it); ROUTER_MANDATORY:
// a reply to a peer that left fails with EHOSTUNREACH (here at its routing-id frame, or at the first data
// frame for peers marked so, to reach both of the loop's exits). The functions are plain pointers without a
// context, so there is one fake per process (Get()).
#ifndef APEXRL_TESTS_CPP_FAKE_ZMQ_H_
#define APEXRL_TESTS_CPP_FAKE_ZMQ_H_

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "apexrl/serve/zmq_api.h"

namespace apexrl::serve::testing {

// A reply as the loop sent it: the peer's routing id and its frames (copied).
struct SentReply {
  std::string peer;
  std::vector<std::string> frames;
  bool bounced = false;  // the peer had left: the loop was told EHOSTUNREACH (frames: what it got out)
};

class FakeZmq {
 public:
  static FakeZmq& Get() {
    static FakeZmq* z = new FakeZmq();  // never destroyed: libzmq-like callbacks may outlive tests
    return *z;
  }
  static void* Socket() { return &Get(); }
  static ZmqApi Api() {
    ZmqApi a;
    a.msg_init = &MsgInit;
    a.msg_init_size = &MsgInitSize;
    a.msg_init_data = &MsgInitData;
    a.msg_close = &MsgClose;
    a.msg_data = &MsgData;
    a.msg_size = &MsgSize;
    a.msg_more = &MsgMore;
    a.msg_gets = &MsgGets;
    a.msg_recv = &MsgRecv;
    a.msg_send = &MsgSend;
    a.poll = &Poll;
    a.errno_ = &Errno;
    a.strerror = &StrError;
    a.version = &Version;
    return a;
  }

  // Forget everything (no loop may be running).
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.clear();
    current_.clear();
    sent_.clear();
    gone_.clear();
    bounce_late_.clear();
    building_ = SentReply();
    building_open_ = false;
    polls_ = 0;
    events_ = 0;
  }

  // A message from `peer` (its routing id) with `frames`; `user_id`: the ZAP User-Id the loop reads from its
  // first frame (empty: none).
  void Push(const std::string& peer, std::vector<std::string> frames, const std::string& user_id = "") {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Incoming m;
      m.frames.push_back(peer);
      for (auto& f : frames) m.frames.push_back(std::move(f));
      m.user_id = user_id;
      inbox_.push_back(std::move(m));
    }
    Kick();
  }

  // The peer leaves: every later reply to it fails with EHOSTUNREACH (at its first data frame if `late`).
  void Vanish(const std::string& peer, bool late = false) {
    std::lock_guard<std::mutex> lock(mu_);
    gone_.insert(peer);
    if (late) bounce_late_.insert(peer);
  }

  // Replies sent since the last call (bounced ones included), in order.
  std::vector<SentReply> TakeSent() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SentReply> out(std::make_move_iterator(sent_.begin()), std::make_move_iterator(sent_.end()));
    sent_.clear();
    return out;
  }

  // Waits until at least `n` replies are waiting in TakeSent (false after timeout_s).
  bool WaitForReplies(size_t n, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return sent_.size() >= n; });
  }

  // Makes the loop's poll return now (it then goes round once more).
  void Kick() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(kick_fd_, &one, sizeof one);
  }

  // How often the loop has entered poll, and how many messages it has read or replies it has tried to send.
  // Two poll entries with nothing read or sent in between, an empty inbox and no request with the workers or
  // Python mean the loop is idle (what it waits for can only expire).
  uint64_t polls() const { return polls_.load(); }
  uint64_t events() const { return events_.load(); }
  bool inbox_empty() {
    std::lock_guard<std::mutex> lock(mu_);
    return inbox_.empty() && current_.empty();
  }
  // Waits until the loop has entered poll `k` more times (false after timeout_s).
  bool WaitPolls(uint64_t k, double timeout_s) {
    const uint64_t target = polls_.load() + k;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::unique_lock<std::mutex> lock(mu_);
    while (polls_.load() < target) {
      lock.unlock();
      Kick();
      lock.lock();
      // Kicked again each millisecond: the loop goes round once per kick (a poll entry), else it would sit
      // out its poll timeout.
      if (cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return polls_.load() >= target; })) break;
      if (std::chrono::steady_clock::now() >= end) return false;
    }
    return true;
  }

 private:
  struct Msg {  // what a ZmqMsg holds (its first 8 bytes point here)
    std::string own;
    void* ext = nullptr;
    size_t ext_size = 0;
    ZmqFreeFn* ffn = nullptr;
    void* hint = nullptr;
    bool more = false;
    std::string user_id;
    bool has_user = false;
  };
  struct Incoming {
    std::vector<std::string> frames;  // routing id first
    std::string user_id;
  };

  FakeZmq() { kick_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

  static Msg*& Of(ZmqMsg* m) { return *reinterpret_cast<Msg**>(m->opaque); }
  static Msg* Of(const ZmqMsg* m) { return *reinterpret_cast<Msg* const*>(m->opaque); }
  static thread_local int err_;

  static int MsgInit(ZmqMsg* m) {
    std::memset(m->opaque, 0, sizeof m->opaque);
    Of(m) = new Msg();
    return 0;
  }
  static int MsgInitSize(ZmqMsg* m, size_t n) {
    MsgInit(m);
    Of(m)->own.assign(n, '\0');
    return 0;
  }
  static int MsgInitData(ZmqMsg* m, void* data, size_t n, ZmqFreeFn* ffn, void* hint) {
    MsgInit(m);
    Msg* x = Of(m);
    x->ext = data;
    x->ext_size = n;
    x->ffn = ffn;
    x->hint = hint;
    return 0;
  }
  static void Release(Msg* x) {
    if (x == nullptr) return;
    if (x->ffn != nullptr) x->ffn(x->ext, x->hint);
    delete x;
  }
  static int MsgClose(ZmqMsg* m) {
    Release(Of(m));
    Of(m) = nullptr;
    return 0;
  }
  static void* MsgData(ZmqMsg* m) {
    Msg* x = Of(m);
    return x->ext != nullptr ? x->ext : static_cast<void*>(x->own.data());
  }
  static size_t MsgSize(const ZmqMsg* m) {
    const Msg* x = Of(m);
    return x->ext != nullptr || x->ffn != nullptr ? x->ext_size : x->own.size();
  }
  static int MsgMore(const ZmqMsg* m) { return Of(m)->more ? 1 : 0; }
  static const char* MsgGets(const ZmqMsg* m, const char* prop) {
    const Msg* x = Of(m);
    if (std::strcmp(prop, "User-Id") != 0 || !x->has_user) return nullptr;
    return x->user_id.c_str();
  }
  static int MsgRecv(ZmqMsg* m, void* socket, int /*flags*/) {
    FakeZmq& z = *static_cast<FakeZmq*>(socket);
    std::lock_guard<std::mutex> lock(z.mu_);
    if (z.current_.empty()) {
      if (z.inbox_.empty()) {
        err_ = EAGAIN;
        return -1;
      }
      Incoming in = std::move(z.inbox_.front());
      z.inbox_.pop_front();
      for (size_t i = 0; i < in.frames.size(); ++i) {
        Msg x;
        x.own = std::move(in.frames[i]);
        x.more = i + 1 < in.frames.size();
        x.has_user = i == 1 && !in.user_id.empty();  // libzmq: the data frames carry the User-Id
        x.user_id = in.user_id;
        z.current_.push_back(std::move(x));
      }
      z.events_.fetch_add(1);
    }
    Msg* x = Of(m);
    *x = std::move(z.current_.front());
    z.current_.pop_front();
    return static_cast<int>(x->own.size());
  }
  static int MsgSend(ZmqMsg* m, void* socket, int flags) {
    FakeZmq& z = *static_cast<FakeZmq*>(socket);
    Msg* x = Of(m);
    const std::string bytes(static_cast<const char*>(MsgData(m)), MsgSize(m));
    {
      std::lock_guard<std::mutex> lock(z.mu_);
      if (!z.building_open_) {  // the routing id
        z.events_.fetch_add(1);
        z.building_ = SentReply();
        z.building_.peer = bytes;
        if (z.gone_.count(bytes) != 0 && z.bounce_late_.count(bytes) == 0) {
          z.building_.bounced = true;
          z.sent_.push_back(std::move(z.building_));
          z.cv_.notify_all();
          err_ = EHOSTUNREACH;
          return -1;  // the caller still owns (and closes) the message
        }
        z.building_open_ = true;
      } else {
        if (z.gone_.count(z.building_.peer) != 0) {
          z.building_.bounced = true;
          z.building_.frames.push_back(bytes);
          z.building_open_ = false;
          z.sent_.push_back(std::move(z.building_));
          z.cv_.notify_all();
          err_ = EHOSTUNREACH;
          return -1;
        }
        z.building_.frames.push_back(bytes);
      }
      if (!(flags & kZmqSndMore) && z.building_open_ && !z.building_.frames.empty()) {
        z.building_open_ = false;
        z.sent_.push_back(std::move(z.building_));
        z.cv_.notify_all();
      }
    }
    Release(x);  // sent: libzmq owns the message now and lets go of it once delivered
    Of(m) = nullptr;
    return static_cast<int>(bytes.size());
  }
  static int Poll(ZmqPollItem* items, int n, long timeout_ms) {
    FakeZmq& z = Get();
    {
      std::lock_guard<std::mutex> lock(z.mu_);
      z.polls_.fetch_add(1);
    }
    z.cv_.notify_all();
    pollfd fds[3];
    int nfds = 0;
    int item_of[3];
    for (int i = 0; i < n; ++i) {
      items[i].revents = 0;
      if (items[i].socket == nullptr) {
        fds[nfds] = pollfd{items[i].fd, POLLIN, 0};
        item_of[nfds++] = i;
      }
    }
    fds[nfds] = pollfd{z.kick_fd_, POLLIN, 0};
    item_of[nfds++] = -1;
    auto ready = [&] {
      int count = 0;
      std::lock_guard<std::mutex> lock(z.mu_);
      for (int i = 0; i < n; ++i) {
        if (items[i].socket != nullptr && (!z.inbox_.empty() || !z.current_.empty())) {
          items[i].revents = kZmqPollIn;
          ++count;
        }
      }
      return count;
    };
    int count = ready();
    const int rc = ::poll(fds, nfds, count > 0 ? 0 : static_cast<int>(timeout_ms));
    if (rc < 0) {
      err_ = errno;
      return -1;
    }
    for (int k = 0; k < nfds; ++k) {
      if (!(fds[k].revents & POLLIN)) continue;
      if (item_of[k] < 0) {
        uint64_t drained;
        [[maybe_unused]] ssize_t r = read(z.kick_fd_, &drained, sizeof drained);
      } else {
        items[item_of[k]].revents = kZmqPollIn;
        ++count;
      }
    }
    if (count == 0) count = ready();
    return count;
  }
  static int Errno() { return err_; }
  static const char* StrError(int e) { return std::strerror(e); }
  static void Version(int* major, int* minor, int* patch) {
    *major = 4;
    *minor = 3;
    *patch = 5;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Incoming> inbox_;
  std::deque<Msg> current_;  // the rest of the message being read
  std::deque<SentReply> sent_;
  SentReply building_;
  bool building_open_ = false;
  std::set<std::string> gone_, bounce_late_;
  std::atomic<uint64_t> polls_{0};
  std::atomic<uint64_t> events_{0};
  int kick_fd_ = -1;
};

inline thread_local int FakeZmq::err_ = 0;

}  // namespace apexrl::serve::testing

#endif  // APEXRL_TESTS_CPP_FAKE_ZMQ_H_
