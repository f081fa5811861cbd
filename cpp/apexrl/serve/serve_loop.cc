#include "apexrl/serve/serve_loop.h"

#include <errno.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "apexrl/errors.h"
#include "apexrl/serve/waitlist.h"
#include "apexrl/serve/wire.h"

namespace apexrl::serve {

namespace {

constexpr int kFrontBurst = 16;  // requests read per round before finished replies are sent
constexpr uint64_t kJobsPerWorker = 8;
// A SAMPLE reply's bytes besides its items: header, the end offsets, totals, store_size, chunk_offsets' end.
constexpr uint64_t kReplyFixed = kHeaderSize + 16 + 24 + 16;
// Key, weight, probability, offset, item_chunk_offsets entry.
constexpr uint64_t kReplyPerItem = 8 + 4 + 8 + 8 + 8;
constexpr int64_t kTrimAfterBytes = 32ll << 20;  // give freed reply memory back to the OS past this
constexpr double kStopGraceS = 30.0;             // longest Stop waits for requests in service (workers, Python)

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string G(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string HexId(uint64_t v) {  // Python's f"{v:#x}"
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string Part(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

}  // namespace

// A received request: its connection, the client's identity, its frames (owned, closed on destruction) and
// their decoded view.
struct Pending {
  explicit Pending(const ZmqApi* zmq) : api(zmq) {}
  ~Pending() {
    for (size_t i = 0; i < kept; ++i) api->msg_close(&msgs[i]);
  }
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;

  Message message() const { return Message{views, kept, count, total}; }
  uint64_t bytes() const { return total; }

  const ZmqApi* api;
  std::string peer;
  std::string identity;
  ZmqMsg msgs[kMaxKeptFrames];
  FrameView views[kMaxKeptFrames];
  size_t kept = 0;
  size_t count = 0;
  uint64_t total = 0;
  Request req;
  double t_arrival = 0;
  bool waited = false;  // counted in rate_limiter_waits_* already
  uint64_t serial = 0;  // owner number for the insert window
};

Deferred::Deferred() = default;
Deferred::~Deferred() = default;

// One reply's frames and the buffers they view (sent without copies).
struct Reply {
  enum Source : uint8_t {
    kPart,
    kSampleKeys,
    kWeights,
    kProbabilities,
    kOffsets,
    kData,
    kKeys,
    kItemChunks,
    kItemChunkOffsets,
    kChunkData,
    kChunkOffsets
  };
  uint16_t op = 0;
  uint16_t status = kOk;
  std::vector<std::string> parts;
  std::unique_ptr<SampleResult> sample;
  std::vector<Key> keys;
  std::vector<std::pair<Source, size_t>> layout;
  // An INSERT the store took: its largest item's share of a SAMPLE reply (bytes, and those of the chunks it
  // references), measured on the batch the store accepted. 0 for every other reply, a repeated insert id's
  // included: the store did not see that request.
  uint64_t max_item_bytes = 0;

  void Add(std::string s) {
    layout.emplace_back(kPart, parts.size());
    parts.push_back(std::move(s));
  }
  FrameView Frame(size_t i) const {
    const auto [src, k] = layout[i];
    auto bytes = [](const auto& v) {
      return FrameView{reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0])};
    };
    switch (src) {
      case kPart:
        return FrameView{reinterpret_cast<const uint8_t*>(parts[k].data()), parts[k].size()};
      case kSampleKeys:
        return bytes(sample->keys);
      case kWeights:
        return bytes(sample->weights);
      case kProbabilities:
        return bytes(sample->probabilities);
      case kOffsets:
        return bytes(sample->offsets);
      case kData:
        return FrameView{sample->data.data(), sample->data.size()};
      case kKeys:
        return bytes(keys);
      case kItemChunks:
        return bytes(sample->item_chunks);
      case kItemChunkOffsets:
        return bytes(sample->item_chunk_offsets);
      case kChunkData:
        return FrameView{sample->chunk_data.data(), sample->chunk_data.size()};
      case kChunkOffsets:
        return bytes(sample->chunk_offsets);
    }
    return FrameView{};
  }
  uint64_t Bytes() const {
    uint64_t n = 0;
    for (size_t i = 0; i < layout.size(); ++i) n += Frame(i).size;
    return n;
  }
};

namespace {

Reply ErrorReply(uint16_t op, uint64_t rid, uint16_t status, const std::string& message) {
  Reply r;
  r.op = op;
  r.status = status;
  r.Add(EncodeHeader(op, rid, status, 0));
  r.Add(ClipMessage(message));
  return r;
}

Reply CountReply(uint16_t op, uint64_t rid, uint64_t count) {
  Reply r;
  r.op = op;
  r.Add(EncodeHeader(op, rid, kOk, static_cast<uint32_t>(std::min<uint64_t>(count, 0xFFFFFFFFu))));
  return r;
}

Reply InsertReply(uint64_t rid, std::vector<Key> keys) {
  Reply r;
  r.op = kInsert;
  r.Add(EncodeHeader(kInsert, rid, kOk, static_cast<uint32_t>(keys.size())));
  r.keys = std::move(keys);
  r.layout.emplace_back(Reply::kKeys, 0);
  return r;
}

Reply SampleReply(uint64_t rid, std::unique_ptr<SampleResult> s) {
  Reply r;
  r.op = kSample;
  r.Add(EncodeHeader(kSample, rid, kOk, static_cast<uint32_t>(s->keys.size())));
  for (auto src : {Reply::kSampleKeys, Reply::kWeights, Reply::kProbabilities, Reply::kOffsets, Reply::kData}) {
    r.layout.emplace_back(src, 0);
  }
  const double totals[2] = {s->total_mass, s->min_mass};
  r.Add(Part(totals, sizeof totals));
  const uint64_t size = s->size;
  r.Add(Part(&size, sizeof size));
  for (auto src : {Reply::kItemChunks, Reply::kItemChunkOffsets, Reply::kChunkData, Reply::kChunkOffsets}) {
    r.layout.emplace_back(src, 0);
  }
  r.sample = std::move(s);
  return r;
}

}  // namespace

// Sample results whose reply libzmq has sent, kept for the next SAMPLE: their buffers are reused as they are
// (no allocation, no fresh pages for ~n x item bytes per request). Filled by libzmq's I/O thread, emptied by
// the loop and the workers; bounded in bytes.
class SamplePool {
 public:
  // What the pool may hold: enough for a learner's prefetch of DPG-sized batches, little beside the store.
  static constexpr size_t kMaxBytes = size_t{4} << 20;
  std::unique_ptr<SampleResult> Take() EXCLUDES(mu_) {
    ScopedLock lock(mu_);
    if (free_.empty()) return std::make_unique<SampleResult>();
    auto r = std::move(free_.back());
    free_.pop_back();
    bytes_ -= Footprint(*r);
    return r;
  }
  void Give(std::unique_ptr<SampleResult> r) EXCLUDES(mu_) {
    const size_t b = Footprint(*r);
    ScopedLock lock(mu_);
    if (bytes_ + b > kMaxBytes) return;  // freed: a peer's large replies do not stay after it left
    bytes_ += b;
    free_.push_back(std::move(r));
  }

 private:
  static size_t Footprint(const SampleResult& r) {
    return r.data.capacity() + r.keys.capacity() * sizeof(Key) + r.weights.capacity() * sizeof(float) +
           r.probabilities.capacity() * sizeof(double) + r.offsets.capacity() * sizeof(uint64_t) +
           r.chunk_data.capacity() +
           (r.item_chunks.capacity() + r.item_chunk_offsets.capacity() + r.chunk_offsets.capacity()) * sizeof(uint64_t);
  }
  Mutex mu_;
  std::vector<std::unique_ptr<SampleResult>> free_ GUARDED_BY(mu_);
  size_t bytes_ GUARDED_BY(mu_) = 0;
};

namespace {

// A reply in libzmq's hands: freed (its sample result back to the pool), and its bytes taken off its peer's
// unread count, when libzmq is done with its last frame (on whichever thread libzmq calls back).
struct Hold {
  Reply reply;
  std::shared_ptr<std::atomic<int64_t>> peer;
  std::shared_ptr<std::atomic<int64_t>> total;
  std::shared_ptr<SamplePool> pool;
  int64_t bytes = 0;
  std::atomic<int> refs{0};
};

void FreeFrame(void* /*data*/, void* hint) {
  auto* hold = static_cast<Hold*>(hint);
  if (hold->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    hold->peer->fetch_sub(hold->bytes, std::memory_order_relaxed);
    hold->total->fetch_sub(hold->bytes, std::memory_order_relaxed);
    if (hold->reply.sample) hold->pool->Give(std::move(hold->reply.sample));
    delete hold;
  }
}

// An aligned copy of a wire array (frames may start at any byte).
template <typename T>
std::vector<T> Aligned(const uint8_t* p, size_t n) {
  std::vector<T> v(n);
  if (n != 0) std::memcpy(v.data(), p, n * sizeof(T));
  return v;
}

}  // namespace

// ------------------------------------------------------------------------------------------------ lifecycle

ServeLoop::ServeLoop(ZmqApi api, void* socket, std::shared_ptr<ShardedStore> store, LoopConfig config)
    : api_(api),
      socket_(socket),
      store_(std::move(store)),
      config_(std::move(config)),
      limiter_(config_.samples_per_insert, config_.error_buffer, config_.min_size_to_sample),
      window_(config_.dedup_max_ids, config_.dedup_max_bytes),
      waiting_(
          std::make_unique<Waitlist>(config_.max_waiting, config_.max_waiting_per_peer, config_.max_waiting_bytes)),
      max_outstanding_(kJobsPerWorker * std::max<uint32_t>(config_.workers, 1)),
      unread_total_(std::make_shared<std::atomic<int64_t>>(0)),
      pool_(std::make_shared<SamplePool>()) {
  if (config_.workers < 1) throw InvalidArgument("workers must be >= 1");
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw IoError(std::string("eventfd: ") + std::strerror(errno));
  // The mean item of a restored store, rounded up: its largest is unknown (replies are checked after
  // sampling too).
  const StoreStats s = store_->Stats();
  max_item_ = s.size == 0 ? 0 : (s.bytes_held + s.size - 1) / s.size;
  max_item_seen_.store(max_item_);
}

ServeLoop::~ServeLoop() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

namespace {

// Names the calling thread (top -H, perf, /proc/PID/task/*/comm: bench_wire.py splits the server's CPU by
// thread name). Linux keeps at most 15 characters.
void NameThread(const char* name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#else
  (void)name;
#endif
}

}  // namespace

void ServeLoop::Start() {
  if (started_.exchange(true)) throw std::logic_error("the serving loop was already started");
  for (uint32_t i = 0; i < config_.workers; ++i) {
    workers_.emplace_back([this] {
      NameThread("apexrl-worker");
      Worker();
    });
  }
  loop_thread_ = std::thread([this] {
    NameThread("apexrl-serve");
    Run();
  });
}

void ServeLoop::Stop() {
  if (!started_.load() || stopped_.exchange(true)) return;
  stopping_.store(true);
  Wake();
  if (loop_thread_.joinable()) loop_thread_.join();
}

void ServeLoop::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);  // EAGAIN: a wake-up is pending anyway
}

void ServeLoop::Run() {
  double stop_since = 0;
  while (true) {
    const bool stopping = stopping_.load();
    if (stopping) {
      RefusePending();
      if (outstanding_ == 0) break;
      if (stop_since == 0) stop_since = Now();
      if (Now() - stop_since > kStopGraceS) {
        Log("ERROR", std::to_string(outstanding_) + " requests still in service after " + G(kStopGraceS) +
                         " s of stopping: their replies are not sent");
        break;
      }
    }
    long poll_ms = 100;
    if (waiting_->count() != 0) {
      ReleaseDeferred();
      if (auto deadline = waiting_->NextDeadline()) {
        poll_ms = std::clamp<long>(static_cast<long>(std::ceil((*deadline - Now()) * 1000)), 0, 100);
      }
    }
    if (stopping) poll_ms = std::min<long>(poll_ms, 10);
    const bool reading = outstanding_ < max_outstanding_ && !stopping;
    ZmqPollItem items[2] = {{socket_, 0, kZmqPollIn, 0}, {nullptr, wake_fd_, kZmqPollIn, 0}};
    const int rc = reading ? api_.poll(items, 2, poll_ms) : api_.poll(items + 1, 1, poll_ms);
    if (rc < 0) {
      const int err = api_.errno_();
      if (err == EINTR) continue;
      Log("ERROR", std::string("zmq_poll failed, the serving loop stops: ") + api_.strerror(err));
      break;
    }
    if (items[1].revents & kZmqPollIn) SendFinished();
    if (reading && (items[0].revents & kZmqPollIn)) ReadFrontBurst();
    Tidy();
  }
  {
    ScopedLock lock(jobs_mu_);
    jobs_closed_ = true;
  }
  jobs_cv_.NotifyAll();
  for (auto& t : workers_) t.join();
  {
    ScopedLock lock(control_mu_);
    control_closed_ = true;
  }
  control_cv_.NotifyAll();
}

// ---------------------------------------------------------------------------------------------- receiving

bool ServeLoop::Receive(Pending* p) {
  ZmqMsg id;
  api_.msg_init(&id);
  if (api_.msg_recv(&id, socket_, kZmqDontWait) < 0) {
    api_.msg_close(&id);
    return false;
  }
  p->peer = Part(api_.msg_data(&id), api_.msg_size(&id));
  bool more = api_.msg_more(&id) != 0;
  api_.msg_close(&id);
  ZmqMsg extra;
  while (more) {
    ZmqMsg* slot = p->kept < kMaxKeptFrames ? &p->msgs[p->kept] : &extra;
    api_.msg_init(slot);
    if (api_.msg_recv(slot, socket_, 0) < 0) {  // the rest of a multipart message is always there
      api_.msg_close(slot);
      break;
    }
    p->total += api_.msg_size(slot);
    if (p->count++ == 0) {
      const char* user = api_.msg_gets(slot, "User-Id");
      if (user != nullptr) p->identity = user;
    }
    more = api_.msg_more(slot) != 0;
    if (slot == &extra) {
      api_.msg_close(slot);
    } else {
      ++p->kept;
    }
  }
  for (size_t i = 0; i < p->kept; ++i) {
    p->views[i] = FrameView{static_cast<const uint8_t*>(api_.msg_data(&p->msgs[i])), api_.msg_size(&p->msgs[i])};
  }
  return true;
}

void ServeLoop::ReadFrontBurst() {
  for (int i = 0; i < kFrontBurst; ++i) {
    if (outstanding_ >= max_outstanding_ || stopping_.load()) break;
    auto p = std::make_unique<Pending>(&api_);
    if (!Receive(p.get())) break;
    p->t_arrival = Now();
    p->serial = ++serial_;
    const Refusal bad = Decode(p->message(), config_.max_bytes, &p->req);
    if (!bad.ok()) {
      Count(bad.op, true);
      Send(p->peer, ErrorReply(bad.op, bad.request_id, bad.status, bad.message));
      continue;
    }
    const uint16_t op = p->req.op;
    if (!config_.role_ops.empty() && !p->identity.empty()) {
      const std::string role = p->identity.substr(0, p->identity.find(':'));
      auto it = config_.role_ops.find(role);
      if (it == config_.role_ops.end() || !(it->second & (1u << op))) {
        refused_role_.fetch_add(1, std::memory_order_relaxed);
        Error(*p, kInvalidArgument,
              "permission denied: client '" + p->identity + "' (role '" + role + "') may not send " + OpName(op));
        continue;
      }
    }
    // The request's own content, checked once and before anything keeps state for it (the insert-id window,
    // the rate limiter, the waiting list): a request the store would refuse is INVALID_ARGUMENT whatever the
    // server's state, and every later step may trust its chunk references.
    if (op == kInsert && !InsertContentOk(*p)) continue;
    if (op == kHello || op == kStats) {  // served in Python
      ControlRequest c;
      c.peer = p->peer;
      c.identity = p->identity;
      c.op = op;
      for (size_t k = 0; k < p->kept; ++k) c.frames.push_back(Part(p->views[k].data, p->views[k].size));
      {
        ScopedLock lock(control_mu_);
        control_.push_back(std::move(c));
      }
      control_cv_.NotifyOne();
      in_service_.store(++outstanding_, std::memory_order_relaxed);
      continue;
    }
    Dispatch(std::move(p), false);
  }
}

bool ServeLoop::InsertContentOk(const Pending& p) {
  const Request& q = p.req;
  std::optional<std::string> why = FirstBadInsertContent(q);
  if (!why) {  // masses above the store's limit (the decoder checked finite and >= 0)
    priority_scratch_.resize(q.count);
    if (q.count != 0) std::memcpy(priority_scratch_.data(), q.priorities, q.count * sizeof(double));
    try {
      store_->CheckPriorities(priority_scratch_.data(), q.count);
    } catch (const InvalidArgument& e) {
      why = e.what();
    }
  }
  if (!why) {
    std::shared_ptr<const ItemLayout> layout;
    {
      ScopedLock lock(layout_mu_);
      layout = layout_;
    }
    if (layout && (why = FirstBadItem(*layout, q.data, q.offsets, q.count))) {
      spec_refused_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!why) return true;
  Error(p, kInvalidArgument, "INSERT refused, nothing stored: " + *why);
  return false;
}

// ---------------------------------------------------------------------------------------------- dispatching

bool ServeLoop::EarlyRefusal(const Pending& p, uint16_t* status, std::string* message) {
  const Request& q = p.req;
  if (q.op == kInsert || q.op == kSample) {
    if (auto why = limiter_.NeverAdmitted(q.op, q.count, store_->Size())) {
      *status = kInvalidArgument;
      *message = std::string(OpName(q.op)) + " of " + std::to_string(q.count) + " items refused: " + *why;
      return true;
    }
  }
  if (q.op == kSample) {
    const uint64_t estimate = kReplyFixed + q.count * (kReplyPerItem + max_item_);
    if (estimate > config_.max_reply_bytes) {
      *status = kTooLarge;
      *message = "SAMPLE of " + std::to_string(q.count) + " items refused: its reply would be about " +
                 std::to_string(estimate) + " bytes (" + std::to_string(q.count) + " x (largest item stored " +
                 std::to_string(max_item_) + " + " + std::to_string(kReplyPerItem) +
                 ") bytes), over the reply cap of " + std::to_string(config_.max_reply_bytes) +
                 " bytes (max_reply_mb); sample fewer items per request";
      return true;
    }
    auto it = unread_.find(p.peer);
    const int64_t unread = it == unread_.end() ? 0 : it->second->load(std::memory_order_relaxed);
    if (unread > 0 && static_cast<uint64_t>(unread) + estimate > config_.max_unread_bytes) {
      refused_unread_.fetch_add(1, std::memory_order_relaxed);
      *status = kTimeout;
      *message =
          "SAMPLE of " + std::to_string(q.count) + " items refused: this client has " + std::to_string(unread) +
          " bytes of replies it has not read yet, and this one (about " + std::to_string(estimate) +
          " bytes) would take it over max_unread_mb=" + G(static_cast<double>(config_.max_unread_bytes) / (1 << 20)) +
          "; read the replies first";
      return true;
    }
  }
  return false;
}

void ServeLoop::Dispatch(std::unique_ptr<Pending> p, bool front) {
  uint16_t status = kOk;
  std::string message;
  if (EarlyRefusal(*p, &status, &message)) {
    Error(*p, status, message);
    ForgetOwner(*p);
    return;
  }
  const Request& q = p->req;
  if (q.op == kInsert || q.op == kUpdatePriorities || (q.op == kSample && q.count <= config_.inline_sample_max)) {
    Reply reply;
    const bool replied = Serve(p.get(), &reply);
    recheck_ = true;
    if (replied) {
      Deliver(std::move(p), std::move(reply));
    } else {
      Defer(std::move(p), front);
    }
    return;
  }
  {
    ScopedLock lock(jobs_mu_);
    jobs_.push_back(std::move(p));
  }
  jobs_cv_.NotifyOne();
  in_service_.store(++outstanding_, std::memory_order_relaxed);
}

void ServeLoop::Deliver(std::unique_ptr<Pending> p, Reply reply) {
  const Request& q = p->req;
  if (q.op == kInsert && reply.status == kOk) {
    // From what the store took (ServeInsert), never from this request: a repeated insert id's reply stored
    // nothing, and its frames may differ from those of the request that did.
    if (reply.max_item_bytes > max_item_) {
      max_item_ = reply.max_item_bytes;
      max_item_seen_.store(max_item_, std::memory_order_relaxed);
    }
  } else if (q.op == kSample && reply.status == kOk) {
    const uint64_t size = reply.Bytes();
    if (size > config_.max_reply_bytes) {
      limiter_.Undo(0, q.count);
      replies_refused_.fetch_add(1, std::memory_order_relaxed);  // (counted as served; this tells it apart)
      Send(p->peer,
           ErrorReply(kSample, q.request_id, kTooLarge,
                      "SAMPLE of " + std::to_string(q.count) + " items refused: its reply is " + std::to_string(size) +
                          " bytes, over the reply cap of " + std::to_string(config_.max_reply_bytes) +
                          " bytes (max_reply_mb); sample fewer items per request"));
      return;
    }
  }
  Send(p->peer, std::move(reply));
}

void ServeLoop::Defer(std::unique_ptr<Pending> p, bool front) {
  auto e = std::make_shared<Deferred>();
  const Request& q = p->req;
  e->op = q.op;
  e->n = q.count;
  e->nbytes = q.op == kInsert ? p->bytes() : 0;
  e->deadline = p->t_arrival + std::min(q.timeout_ms / 1000.0, config_.max_wait_s);
  e->who = p->identity.empty() ? "peer:" + p->peer : "id:" + p->identity;
  e->peer = p->peer;
  e->seq = p->serial;
  e->p = std::move(p);
  if (e->deadline <= Now()) {  // clipped to max_wait_s and already past it
    Expire(e.get());
    return;
  }
  if (auto full = waiting_->FullReason(*e)) {
    ++waiting_->refused;
    Error(*e->p, kTimeout,
          std::string(OpName(e->op)) + " of " + std::to_string(e->n) +
              " items not queued: it would have to wait, and " + *full + "; retry later");
    ForgetOwner(*e->p);
    return;
  }
  DeferredPtr evicted = waiting_->Add(e, front);
  if (evicted) {
    Error(*evicted->p, kTimeout,
          std::string(OpName(evicted->op)) + " of " + std::to_string(evicted->n) +
              " items given up: this peer has more than max_waiting_per_peer=" + std::to_string(waiting_->max_peer()) +
              " requests waiting, the oldest is answered");
    ForgetOwner(*evicted->p);
    evicted->p.reset();  // the husk keeps no data
  }
}

void ServeLoop::Expire(Deferred* e) {
  const Request& q = e->p->req;
  const uint64_t size = store_->Size();
  std::string why;
  if (e->op == kSample && !limiter_.BigEnough(size)) {
    why = "the store holds " + std::to_string(size) +
          " items, fewer than min_size_to_sample=" + std::to_string(limiter_.need());
  } else {
    why = std::string("rate limited until the ") + (e->op == kInsert ? "samplers are" : "inserters are") +
          " caught up (" + limiter_.Describe() + ")";
  }
  const long waited_ms = std::lround((Now() - e->p->t_arrival) * 1000);
  std::string clip;
  if (q.timeout_ms / 1000.0 > config_.max_wait_s) {
    clip = ", the server's max_wait_s=" + G(config_.max_wait_s) + " (timeout_ms=" + std::to_string(q.timeout_ms) +
           " clipped)";
  }
  if (!Error(*e->p, kTimeout,
             std::string(OpName(e->op)) + " of " + std::to_string(e->n) + " items: " + why + ", after waiting " +
                 std::to_string(waited_ms) + " ms" + clip)) {
    ++waiting_->dropped;  // its peer left: counted with the others it had waiting
  }
  ForgetOwner(*e->p);
  e->p.reset();
}

void ServeLoop::ForgetOwner(const Pending& p) {
  const Request& q = p.req;
  if (q.op == kInsert && (q.insert_session != 0 || q.insert_sequence != 0)) {
    window_.Release(InsertId{p.identity, q.insert_session, q.insert_sequence}, p.serial);
  }
}

void ServeLoop::SendFinished() {
  uint64_t drained;
  [[maybe_unused]] ssize_t n = read(wake_fd_, &drained, sizeof drained);
  std::deque<Finished> done;
  {
    ScopedLock lock(done_mu_);
    done.swap(done_);
  }
  for (Finished& f : done) {
    in_service_.store(--outstanding_, std::memory_order_relaxed);
    recheck_ = true;
    if (!f.pending) {  // Python's reply to HELLO / STATS: count it by its header
      const FrameView h = f.reply->Frame(0);
      uint16_t op = 0, status = 0;
      if (h.size >= 18) {
        std::memcpy(&op, h.data + 6, 2);
        std::memcpy(&status, h.data + 16, 2);
      }
      Count(op, status != kOk);
      Send(f.peer, std::move(*f.reply));
    } else if (f.deferred) {
      Defer(std::move(f.pending), false);
    } else {
      Deliver(std::move(f.pending), std::move(*f.reply));
    }
  }
}

void ServeLoop::ReleaseDeferred() {
  for (DeferredPtr& e : waiting_->Expired(Now())) Expire(e.get());
  if (!recheck_) return;
  recheck_ = false;
  for (DeferredPtr& e : waiting_->Release(limiter_, store_->Size())) Dispatch(std::move(e->p), true);
}

void ServeLoop::RefusePending() {
  for (DeferredPtr& e : waiting_->TakeAll()) {
    Error(*e->p, kShuttingDown, "the replay server is shutting down");
    ForgetOwner(*e->p);
    e->p.reset();
  }
  while (true) {
    auto p = std::make_unique<Pending>(&api_);
    if (!Receive(p.get())) break;
    const Refusal bad = Decode(p->message(), config_.max_bytes, &p->req);
    if (!bad.ok()) {
      Count(bad.op, true);
      Send(p->peer, ErrorReply(bad.op, bad.request_id, bad.status, bad.message));
    } else {
      Error(*p, kShuttingDown, "the replay server is shutting down");
    }
  }
}

void ServeLoop::Tidy() {
  const double now = Now();
  waiting_stats_[0].store(waiting_->count(), std::memory_order_relaxed);
  waiting_stats_[1].store(waiting_->bytes(), std::memory_order_relaxed);
  waiting_stats_[2].store(waiting_->peers(), std::memory_order_relaxed);
  waiting_stats_[3].store(waiting_->dropped, std::memory_order_relaxed);
  waiting_stats_[4].store(waiting_->refused, std::memory_order_relaxed);
  waiting_stats_[5].store(waiting_->evicted, std::memory_order_relaxed);
  waiting_stats_[6].store(waiting_->examined_max, std::memory_order_relaxed);
  waiting_stats_[7].store(waiting_->examined_total, std::memory_order_relaxed);
  if (now - last_tidy_ < 1.0) return;
  last_tidy_ = now;
  // Forget peers with nothing unread and no reply in flight (libzmq tells of no departure but EHOSTUNREACH).
  for (auto it = unread_.begin(); it != unread_.end();) {
    if (it->second->load() == 0 && it->second.use_count() == 1) {
      it = unread_.erase(it);
    } else {
      ++it;
    }
  }
#if defined(__GLIBC__)
  // Replies a departed or slow peer held were freed on libzmq's thread; give large freed heaps back.
  const int64_t total = unread_total_->load();
  if (trimmed_at_ - total > kTrimAfterBytes) malloc_trim(0);
  if (total < trimmed_at_ - kTrimAfterBytes || total > trimmed_at_) trimmed_at_ = total;
#endif
}

// ------------------------------------------------------------------------------------------------ serving

bool ServeLoop::RateLimited(Pending* p, Reply* reply, bool can_wait) {
  const Request& q = p->req;
  if (can_wait) {
    if (!p->waited) limiter_.CountWait(q.op);
    p->waited = true;
    return false;
  }
  Count(q.op, true);
  *reply =
      ErrorReply(q.op, q.request_id, kTimeout,
                 std::string("rate limited: ") + OpName(q.op) + " of " + std::to_string(q.count) +
                     " items must wait until the " + (q.op == kInsert ? "samplers are" : "inserters are") +
                     " caught up (" + limiter_.Describe() + "), after waiting " + std::to_string(q.timeout_ms) + " ms");
  return true;
}

bool ServeLoop::Serve(Pending* p, Reply* reply) {
  const Request& q = p->req;
  const bool can_wait = q.timeout_ms > 0 && Now() < p->t_arrival + q.timeout_ms / 1000.0;
  try {
    switch (q.op) {
      case kInsert:
        return ServeInsert(p, reply, can_wait);
      case kSample: {
        if (!limiter_.BigEnough(store_->Size())) {
          if (can_wait) return false;
          Count(q.op, true);
          *reply = ErrorReply(q.op, q.request_id, kTimeout,
                              "store holds " + std::to_string(store_->Size()) +
                                  " items, fewer than min_size_to_sample=" + std::to_string(limiter_.need()) +
                                  ", after waiting " + std::to_string(q.timeout_ms) + " ms");
          return true;
        }
        if (!limiter_.TrySample(q.count, store_->Size())) {
          if (!limiter_.BigEnough(store_->Size()) && can_wait) return false;  // shrank meanwhile
          return RateLimited(p, reply, can_wait);
        }
        auto result = pool_->Take();
        try {
          store_->Sample(q.count, q.beta, result.get());
        } catch (...) {
          limiter_.Undo(0, q.count);
          throw;
        }
        *reply = SampleReply(q.request_id, std::move(result));
        break;
      }
      case kUpdatePriorities: {
        const auto keys = Aligned<Key>(q.keys, q.count);
        const auto priorities = Aligned<double>(q.priorities, q.count);
        *reply = CountReply(q.op, q.request_id, store_->UpdatePriorities(keys.data(), priorities.data(), q.count));
        break;
      }
      case kRemoveToFit:
        *reply = CountReply(q.op, q.request_id, store_->RemoveToFit());
        break;
      case kErase: {
        const auto keys = Aligned<Key>(q.keys, q.count);
        const size_t n = store_->Erase(keys.data(), q.count);
        erased_items_.fetch_add(n, std::memory_order_relaxed);
        *reply = CountReply(q.op, q.request_id, n);
        break;
      }
      default:
        throw std::logic_error(std::string("op ") + std::to_string(q.op) + " reached the data path");
    }
  } catch (const InvalidArgument& e) {  // the store rejected the values
    Count(q.op, true);
    *reply = ErrorReply(q.op, q.request_id, kInvalidArgument, e.what());
    return true;
  } catch (const std::exception& e) {  // the server must keep serving
    Log("ERROR", std::string("internal error serving ") + OpName(q.op) + " request " + std::to_string(q.request_id) +
                     ": " + e.what());
    Count(q.op, true);
    *reply = ErrorReply(q.op, q.request_id, kInternal, std::string("internal error: ") + e.what());
    return true;
  }
  Count(q.op, false);
  return true;
}

bool ServeLoop::ServeInsert(Pending* p, Reply* reply, bool can_wait) {
  const Request& q = p->req;
  const InsertId id{p->identity, q.insert_session, q.insert_sequence};
  const bool has_id = q.insert_session != 0 || q.insert_sequence != 0;
  if (has_id) {
    std::vector<Key> keys;
    const double deadline = p->t_arrival + std::min(q.timeout_ms / 1000.0, config_.max_wait_s);
    switch (window_.TryClaim(id, p->serial, deadline, Now(), &keys)) {
      case InsertWindow::Claim::kDone:
        Count(q.op, false);
        *reply = InsertReply(q.request_id, std::move(keys));
        return true;
      case InsertWindow::Claim::kBusy:  // its first request waits: answer this one after it
        if (can_wait) return false;
        Count(q.op, true);
        *reply =
            ErrorReply(q.op, q.request_id, kTimeout,
                       "INSERT " + HexId(q.insert_session) + "/" + std::to_string(q.insert_sequence) +
                           ": a request with this insert_id is still waiting to be served; retry with the same id");
        return true;
      case InsertWindow::Claim::kNew:
        break;
    }
  }
  bool keep_id = false;  // this request still owns its insert_id: stored, or waiting
  struct ReleaseUnlessKept {
    InsertWindow& window;
    const InsertId& id;
    uint64_t owner;
    bool active;
    bool& keep;
    ~ReleaseUnlessKept() {
      if (active && !keep) window.Release(id, owner);
    }
  } guard{window_, id, p->serial, has_id, keep_id};

  // The request's content was checked when it was decoded (InsertContentOk).
  if (!limiter_.TryInsert(q.count, store_->Size())) {
    const bool replied = RateLimited(p, reply, can_wait);
    keep_id = !replied;
    return replied;
  }
  const auto priorities = Aligned<double>(q.priorities, q.count);
  item_ptrs_.resize(q.count);
  item_sizes_.resize(q.count);
  for (uint64_t i = 0; i < q.count; ++i) {
    const uint64_t at = LoadU64(q.offsets, i);
    item_ptrs_[i] = q.data + at;
    item_sizes_[i] = LoadU64(q.offsets, i + 1) - at;
  }
  // Frame chunks, when the request has any (references checked against them when it was decoded).
  ChunkBatch chunks;
  const bool with_chunks = q.num_chunks > 0 || q.num_refs > 0;
  if (with_chunks) {
    chunk_ptrs_.resize(q.num_chunks);
    chunk_sizes_.resize(q.num_chunks);
    for (uint64_t c = 0; c < q.num_chunks; ++c) {
      const uint64_t at = LoadU64(q.chunk_offsets, c);
      chunk_ptrs_[c] = q.chunk_data + at;
      chunk_sizes_[c] = LoadU64(q.chunk_offsets, c + 1) - at;
    }
    chunk_refs_.resize(q.num_refs);
    for (uint64_t j = 0; j < q.num_refs; ++j) {
      chunk_refs_[j] = static_cast<uint32_t>(LoadU64(q.item_chunks, j));  // < num_chunks <= kMaxBatchItems
    }
    chunk_ref_offsets_ = Aligned<uint64_t>(q.item_chunk_offsets, q.count + 1);
    chunks.data = chunk_ptrs_.data();
    chunks.sizes = chunk_sizes_.data();
    chunks.count = q.num_chunks;
    chunks.item_chunks = chunk_refs_.data();
    chunks.item_chunk_offsets = chunk_ref_offsets_.data();
  }
  std::vector<Key> keys(q.count);
  try {
    store_->Insert(priorities.data(), item_ptrs_.data(), item_sizes_.data(), q.count, keys.data(),
                   with_chunks ? &chunks : nullptr);
  } catch (...) {
    limiter_.Undo(q.count, 0);
    throw;
  }
  keep_id = true;
  if (has_id) window_.Finish(id, p->serial, keys.data(), keys.size());
  // An item's share of a SAMPLE reply: its bytes, and at most every chunk it references (8 bytes of reference
  // and of chunk offset each) when no other draw of the batch brought them.
  uint64_t largest = 0;
  for (uint64_t i = 0; i < q.count; ++i) {
    uint64_t bytes = item_sizes_[i];
    if (with_chunks) {
      for (uint64_t j = chunk_ref_offsets_[i]; j < chunk_ref_offsets_[i + 1]; ++j) {
        bytes += chunk_sizes_[chunk_refs_[j]] + 16;
      }
    }
    largest = std::max(largest, bytes);
  }
  Count(q.op, false);
  *reply = InsertReply(q.request_id, std::move(keys));
  reply->max_item_bytes = largest;
  return true;
}

void ServeLoop::Worker() {
  while (true) {
    std::unique_ptr<Pending> p;
    {
      ScopedLock lock(jobs_mu_);
      while (!jobs_closed_ && jobs_.empty()) jobs_cv_.Wait(jobs_mu_);
      if (jobs_.empty()) return;
      p = std::move(jobs_.front());
      jobs_.pop_front();
    }
    auto reply = std::make_unique<Reply>();
    bool replied;
    try {
      replied = Serve(p.get(), reply.get());
    } catch (const std::exception& e) {  // Serve catches everything; belt and braces
      *reply = ErrorReply(p->req.op, p->req.request_id, kInternal, e.what());
      replied = true;
    }
    {
      ScopedLock lock(done_mu_);
      done_.push_back(Finished{std::move(p), std::string(), !replied, std::move(reply)});
    }
    Wake();
  }
}

// ------------------------------------------------------------------------------------------------ sending

bool ServeLoop::Send(const std::string& peer, Reply reply) {
  auto& slot = unread_[peer];
  if (!slot) slot = std::make_shared<std::atomic<int64_t>>(0);
  const size_t frames = reply.layout.size();
  // The byte cap on what a peer leaves unread (libzmq's high-water marks count messages, not bytes): a peer
  // that does not read loses the replies that would take it over the cap. One reply always fits.
  const int64_t bytes = static_cast<int64_t>(reply.Bytes());
  const int64_t unread = slot->load(std::memory_order_relaxed);
  if (unread > 0 && static_cast<uint64_t>(unread + bytes) > config_.max_unread_bytes) {
    replies_dropped_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  auto* hold = new Hold{std::move(reply), slot, unread_total_, pool_, bytes, {}};
  hold->refs.store(static_cast<int>(frames));
  const int64_t now_unread = slot->fetch_add(hold->bytes) + hold->bytes;
  unread_peak_peer_.store(std::max(unread_peak_peer_.load(std::memory_order_relaxed), now_unread),
                          std::memory_order_relaxed);
  const int64_t total = unread_total_->fetch_add(hold->bytes) + hold->bytes;
  if (total > trimmed_at_) trimmed_at_ = total;

  ZmqMsg id;
  api_.msg_init_size(&id, peer.size());
  std::memcpy(api_.msg_data(&id), peer.data(), peer.size());
  size_t sent = 0;
  int err = 0;
  if (api_.msg_send(&id, socket_, kZmqSndMore | kZmqDontWait) < 0) {
    err = api_.errno_();
    api_.msg_close(&id);
  } else {
    for (; sent < frames; ++sent) {
      const FrameView f = hold->reply.Frame(sent);
      static uint8_t empty = 0;
      ZmqMsg m;
      api_.msg_init_data(&m, f.size != 0 ? const_cast<uint8_t*>(f.data) : &empty, f.size, FreeFrame, hold);
      if (api_.msg_send(&m, socket_, (sent + 1 < frames ? kZmqSndMore : 0) | kZmqDontWait) < 0) {
        err = api_.errno_();
        api_.msg_close(&m);  // calls FreeFrame for this frame
        ++sent;
        break;
      }
    }
  }
  for (size_t k = sent; k < frames; ++k) FreeFrame(nullptr, hold);  // frames never handed to libzmq
  if (err == 0) return true;
  replies_dropped_.fetch_add(1, std::memory_order_relaxed);
  if (err == EHOSTUNREACH) {  // the peer left: drop what it had waiting
    auto gone = waiting_->DropPeer(peer);
    for (DeferredPtr& e : gone) {
      ForgetOwner(*e->p);
      e->p.reset();
    }
    if (!gone.empty()) Log("INFO", "a peer left: dropped its " + std::to_string(gone.size()) + " waiting requests");
    return false;
  }
  if (err != EAGAIN) Log("WARNING", std::string("a reply could not be sent: ") + api_.strerror(err));
  return true;  // EAGAIN: the peer's send queue is full (it does not read); this reply is dropped
}

bool ServeLoop::Error(const Pending& p, uint16_t status, const std::string& message) {
  Count(p.req.op, true);
  return Send(p.peer, ErrorReply(p.req.op, p.req.request_id, status, message));
}

void ServeLoop::Count(uint16_t op, bool error) {
  const size_t i = op >= 1 && op <= kMaxReplayOp ? op : 0;
  requests_[i].fetch_add(1, std::memory_order_relaxed);
  if (error) errors_[i].fetch_add(1, std::memory_order_relaxed);
}

void ServeLoop::Log(const char* level, std::string text) {
  ControlRequest c;
  c.identity = level;
  c.frames.push_back(std::move(text));
  {
    ScopedLock lock(control_mu_);
    if (control_closed_) return;
    control_.push_back(std::move(c));
  }
  control_cv_.NotifyOne();
}

// -------------------------------------------------------------------------------------- Python's side

bool ServeLoop::NextControl(double timeout_s, ControlRequest* out, bool* closed) {
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  ScopedLock lock(control_mu_);
  while (!control_closed_ && control_.empty()) {
    if (!control_cv_.WaitUntil(control_mu_, deadline)) break;
  }
  *closed = control_closed_ && control_.empty();
  if (control_.empty()) return false;
  *out = std::move(control_.front());
  control_.pop_front();
  return true;
}

void ServeLoop::ControlReply(const std::string& peer, std::vector<std::string> frames) {
  auto reply = std::make_unique<Reply>();
  for (auto& f : frames) reply->Add(std::move(f));
  if (reply->layout.empty()) throw InvalidArgument("a reply needs at least its header frame");
  {
    ScopedLock lock(done_mu_);
    done_.push_back(Finished{nullptr, peer, false, std::move(reply)});
  }
  Wake();
}

void ServeLoop::SetLayout(ItemLayout layout) {
  auto shared = std::make_shared<const ItemLayout>(std::move(layout));
  ScopedLock lock(layout_mu_);
  layout_ = std::move(shared);
}

std::vector<LoopStat> ServeLoop::Stats() const {
  std::vector<LoopStat> out;
  auto add = [&out](std::string name, double v, bool integer = true) { out.push_back({std::move(name), v, integer}); };
  uint64_t total_requests = 0, total_errors = 0;
  for (uint16_t op = 0; op <= kMaxReplayOp; ++op) {
    std::string name = op == 0 ? "unknown" : OpName(op);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    const uint64_t r = requests_[op].load(), e = errors_[op].load();
    total_requests += r;
    total_errors += e;
    add("requests_" + name, static_cast<double>(r));
    add("errors_" + name, static_cast<double>(e));
  }
  add("requests_total", static_cast<double>(total_requests));
  add("errors_total", static_cast<double>(total_errors));
  add("erased_items", static_cast<double>(erased_items_.load()));
  add("requests_in_service", static_cast<double>(in_service_.load()));
  add("workers", config_.workers);
  add("min_size_to_sample", static_cast<double>(config_.min_size_to_sample));
  uint64_t inserted, sampled, wi, ws;
  limiter_.Counts(&inserted, &sampled);
  limiter_.Waits(&wi, &ws);
  add("rate_limiter_waits_insert", static_cast<double>(wi));
  add("rate_limiter_waits_sample", static_cast<double>(ws));
  add("rate_limiter_inserted_items", static_cast<double>(inserted));
  add("rate_limiter_sampled_items", static_cast<double>(sampled));
  add("samples_per_insert", limiter_.spi(), false);
  add("error_buffer", limiter_.eb(), false);
  const char* waiting_names[8] = {
      "deferred",         "deferred_bytes",   "deferred_peers",        "deferred_dropped",
      "deferred_refused", "deferred_evicted", "deferred_examined_max", "deferred_examined_total"};
  for (int i = 0; i < 8; ++i) add(waiting_names[i], static_cast<double>(waiting_stats_[i].load()));
  add("replies_dropped", static_cast<double>(replies_dropped_.load()));
  add("replies_refused_too_large", static_cast<double>(replies_refused_.load()));
  add("replies_refused_unread", static_cast<double>(refused_unread_.load()));
  add("requests_refused_role", static_cast<double>(refused_role_.load()));
  add("unread_reply_bytes", static_cast<double>(unread_total_->load()));
  add("unread_reply_bytes_peer_max", static_cast<double>(unread_peak_peer_.load()));
  add("max_item_bytes", static_cast<double>(max_item_seen_.load()));
  add("spec_refused_inserts", static_cast<double>(spec_refused_.load()));
  const InsertWindowStats w = window_.Stats();
  add("duplicate_inserts", static_cast<double>(w.duplicates));
  add("insert_ids_remembered", static_cast<double>(w.remembered));
  add("insert_ids_forgotten", static_cast<double>(w.forgotten));
  add("insert_ids_bytes", static_cast<double>(w.bytes));
  add("insert_ids_pending", static_cast<double>(w.pending));
  add("insert_id_identities", static_cast<double>(w.identities));
  return out;
}

}  // namespace apexrl::serve
