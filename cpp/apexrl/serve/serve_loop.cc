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
#include <limits>
#include <optional>

#include "apexrl/errors.h"
#include "apexrl/serve/reply.h"
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

std::string Part(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

}  // namespace

// A received request: its connection, its frames (owned, closed on destruction) and their decoded view, with
// what the handlers read (Call: the decoded request, the client's identity, its arrival).
struct Pending : Call {
  explicit Pending(const ZmqApi* zmq) : api(zmq) {}
  ~Pending() {
    for (size_t i = 0; i < kept; ++i) api->msg_close(&msgs[i]);
  }
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;

  Message message() const { return Message{views, kept, count, total}; }
  uint64_t bytes() const { return total; }

  const ZmqApi* api;
  Table* table = nullptr;  // the data op's table (FindTable), for the whole of its service
  bool logged = false;     // a disk table's: serving it wrote records to the table's log
  std::string peer;
  ZmqMsg msgs[kMaxKeptFrames];
  FrameView views[kMaxKeptFrames];
  size_t kept = 0;
  size_t count = 0;
  uint64_t total = 0;
};

Deferred::Deferred() = default;
Deferred::~Deferred() = default;

// ------------------------------------------------------------------------------------------------ lifecycle

namespace {

std::vector<TableSpec> OneTable(std::shared_ptr<ShardedStore> store, const LoopConfig& config) {
  LimiterConfig limiter;
  limiter.kind = config.samples_per_insert > 0 ? LimiterKind::kSampleToInsertRatio : LimiterKind::kMinSize;
  limiter.spi = config.samples_per_insert > 0 ? config.samples_per_insert : 0.0;
  limiter.eb = config.samples_per_insert > 0 ? config.error_buffer : 0.0;
  limiter.min_size = config.min_size_to_sample;
  std::vector<TableSpec> tables;
  tables.push_back(TableSpec{"default", std::move(store), limiter});
  return tables;
}

}  // namespace

ServeLoop::ServeLoop(ZmqApi api, void* socket, std::shared_ptr<ShardedStore> store, LoopConfig config)
    : ServeLoop(api, socket, OneTable(std::move(store), config), config) {}

ServeLoop::ServeLoop(ZmqApi api, void* socket, std::vector<TableSpec> tables, LoopConfig config)
    : api_(api),
      socket_(socket),
      config_(std::move(config)),
      window_(config_.dedup_max_ids, config_.dedup_max_bytes),
      pool_(std::make_shared<SamplePool>()),
      max_outstanding_(kJobsPerWorker * std::max<uint32_t>(config_.workers, 1)),
      unread_total_(std::make_shared<std::atomic<int64_t>>(0)) {
  if (config_.workers < 1) throw InvalidArgument("workers must be >= 1");
  if (tables.empty()) throw InvalidArgument("a replay server needs at least one table");
  if (tables.size() > std::numeric_limits<uint32_t>::max()) throw InvalidArgument("too many tables");
  const WaitBounds bounds{config_.max_waiting, config_.max_waiting_per_peer, config_.max_waiting_bytes,
                          config_.max_wait_s};
  for (size_t i = 0; i < tables.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (tables[j].name == tables[i].name) throw InvalidArgument("two tables are named '" + tables[i].name + "'");
    }
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    tables_.push_back(
        std::make_unique<Table>(static_cast<uint32_t>(i), std::move(tables[i]), bounds, &window_, pool_.get(),
                                [this](const char* level, std::string text) { Log(level, std::move(text)); }));
    if (tables_.back()->name() == "default") default_ = i;
    any_disk_ = any_disk_ || tables_.back()->disk() != nullptr;
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw IoError(std::string("eventfd: ") + std::strerror(errno));
}

ServeLoop::~ServeLoop() {
  Stop();
  for (const auto& t : tables_) {
    if (t->disk() != nullptr) t->disk()->SetOnSynced(nullptr);  // before wake_fd_ goes
  }
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
  for (const auto& t : tables_) {  // a sync table's syncer wakes the loop to send the replies it held
    if (t->disk() != nullptr) t->disk()->SetOnSynced([this] { Wake(); });
  }
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
    bool any_waiting = false;
    for (const auto& t : tables_) any_waiting |= t->waiting().count() != 0;
    if (any_waiting) {
      ReleaseDeferred();
      for (const auto& t : tables_) {
        if (auto deadline = t->waiting().NextDeadline()) {
          poll_ms =
              std::min(poll_ms, std::clamp<long>(static_cast<long>(std::ceil((*deadline - Now()) * 1000)), 0, 100));
        }
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
    if (any_disk_) CommitDisk(false);
    Tidy();
  }
  if (any_disk_) CommitDisk(true);
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
    if (NamesTable(op) && !FindTable(p.get())) continue;
    // The request's own content, checked once and before anything keeps state for it (the insert-id window,
    // the rate limiter, the waiting list): a request the store would refuse is INVALID_ARGUMENT whatever the
    // server's state, and every later step may trust its chunk references.
    if (op == kInsert && !InsertContentOk(*p)) continue;
    if (ServedInPython(op)) {
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
      ++outstanding_;
      CountInService();
      continue;
    }
    Dispatch(std::move(p), false);
  }
}

bool ServeLoop::FindTable(Pending* p) {
  const uint32_t t = p->req.table;
  if (t < tables_.size()) {  // the hot path: a bounds check and a read
    p->table = tables_[t].get();
    return true;
  }
  refused_table_.fetch_add(1, std::memory_order_relaxed);
  std::string names;
  for (const auto& table : tables_) {
    names += (names.empty() ? "" : ", ") + std::to_string(table->index()) + " '" + table->name() + "'";
  }
  Error(*p, kInvalidArgument,
        std::string(OpName(p->req.op)) + " refused: unknown table index " + std::to_string(t) + "; this server has " +
            std::to_string(tables_.size()) + (tables_.size() == 1 ? " table" : " tables") + " (" + names +
            "), listed by HELLO");
  return false;
}

bool ServeLoop::InsertContentOk(const Pending& p) {
  const std::shared_ptr<const ItemLayout> layout = p.table->layout();
  bool spec_refused = false;
  const std::optional<std::string> why = p.table->handlers().InsertContentProblem(p.req, layout.get(), &spec_refused);
  if (!why) return true;
  if (spec_refused) p.table->CountSpecRefused();
  Error(p, kInvalidArgument, "INSERT refused, nothing stored: " + *why);
  return false;
}

// ---------------------------------------------------------------------------------------------- dispatching

bool ServeLoop::EarlyRefusal(const Pending& p, uint16_t* status, std::string* message) {
  const Request& q = p.req;
  Table& table = *p.table;
  if (q.op == kInsert || q.op == kSample) {
    if (auto why = table.limiter().NeverAdmitted(q.op, q.count, table.Size())) {
      *status = kInvalidArgument;
      *message = std::string(OpName(q.op)) + " of " + std::to_string(q.count) + " items refused: " + *why;
      return true;
    }
  }
  if (q.op == kSample) {
    const uint64_t max_item = table.max_item();
    const uint64_t estimate = kReplyFixed + q.count * (kReplyPerItem + max_item);
    if (estimate > config_.max_reply_bytes) {
      *status = kTooLarge;
      *message = "SAMPLE of " + std::to_string(q.count) + " items refused: its reply would be about " +
                 std::to_string(estimate) + " bytes (" + std::to_string(q.count) + " x (largest item stored " +
                 std::to_string(max_item) + " + " + std::to_string(kReplyPerItem) + ") bytes), over the reply cap of " +
                 std::to_string(config_.max_reply_bytes) + " bytes (max_reply_mb); sample fewer items per request";
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
  // RESET is served here too, so that it falls between two INSERTs or UPDATE_PRIORITIES, never inside one.
  // A disk table's requests too, as its log is written by this thread alone (disk_table.h). Its SAMPLEs of at
  // most inline_sample_max items are drawn here and read from its log tail cache; a batch the cache does not
  // hold whole goes to a worker, which reads it from the files (this thread never waits for the disk). A queue's
  // pops are logged when the reply is delivered.
  const bool disk = p->table->disk() != nullptr;
  const bool small_sample = q.op == kSample && q.count <= config_.inline_sample_max;
  if (disk ? q.op != kSample || small_sample
           : (q.op == kInsert || q.op == kUpdatePriorities || q.op == kReset || small_sample)) {
    p->cached_only = disk && small_sample;
    Reply reply;
    const bool replied = Serve(p.get(), &reply);
    recheck_ = true;
    if (replied) {
      Deliver(std::move(p), std::move(reply));
    } else if (p->drawn != nullptr) {
      ToWorkers(std::move(p));
    } else {
      Defer(std::move(p), front);
    }
    return;
  }
  ToWorkers(std::move(p));
}

void ServeLoop::ToWorkers(std::unique_ptr<Pending> p) {
  p->cached_only = false;  // a worker may read the files
  {
    ScopedLock lock(jobs_mu_);
    jobs_.push_back(std::move(p));
  }
  jobs_cv_.NotifyOne();
  ++outstanding_;
  CountInService();
}

void ServeLoop::Deliver(std::unique_ptr<Pending> p, Reply reply) {
  const Request& q = p->req;
  DiskTable* disk = p->table->disk();
  if (disk != nullptr && q.op == kSample && reply.lease && reply.lease->held() > 0) LogPops(p.get(), &reply);
  if (q.op == kInsert && reply.status == kOk) {
    // From what the store took (Handlers::ServeInsert), never from this request: a repeated insert id's reply stored
    // nothing, and its frames may differ from those of the request that did.
    p->table->SawItem(reply.max_item_bytes);
  } else if (q.op == kSample && reply.status == kOk) {
    const uint64_t size = reply.Bytes();
    if (size > config_.max_reply_bytes) {
      // Not sent: the batch goes back (the front of a queue), unless it is one item, which no reply under this
      // cap can ever carry: that one stays taken (else it would block a queue for good), and is logged.
      const size_t n = reply.sample ? reply.sample->keys.size() : q.count;
      if (reply.lease && n == 1 && reply.lease->held() > 0) {
        p->table->limiter().Undo(0, n);
        reply.lease->Keep();
        char key[32];
        std::snprintf(key, sizeof key, "%#llx", static_cast<unsigned long long>(reply.sample->keys[0]));
        Log("WARNING", "table '" + p->table->name() + "': item " + key + " removed undelivered: its SAMPLE reply is " +
                           std::to_string(size) + " bytes, over the reply cap of " +
                           std::to_string(config_.max_reply_bytes) + " bytes (max_reply_mb)");
      } else if (reply.lease) {
        reply.lease->GiveBack();
      } else {
        p->table->limiter().Undo(0, n);
      }
      recheck_ = true;
      replies_refused_.fetch_add(1, std::memory_order_relaxed);  // (counted as served; this tells it apart)
      Send(p->peer,
           ErrorReply(kSample, q.request_id, kTooLarge,
                      "SAMPLE of " + std::to_string(q.count) + " items refused: its reply is " + std::to_string(size) +
                          " bytes, over the reply cap of " + std::to_string(config_.max_reply_bytes) +
                          " bytes (max_reply_mb); sample fewer items per request"));
      return;
    }
  }
  // A sync table's reply that acknowledges a change waits for an fdatasync that covers the table's writes so far:
  // one whose request wrote records, and every INSERT (a retry answered from the insert-id window acknowledges
  // its first request's items, which may be unsynced still). A SAMPLE that popped nothing goes at once.
  if (disk != nullptr && (p->logged || q.op == kInsert) && disk->holds_replies()) {
    held_replies_.push_back(HeldReply{p->peer, p->table, q.op, q.request_id, disk->written(), std::move(reply)});
    CountInService();
    return;
  }
  Send(p->peer, std::move(reply));
}

void ServeLoop::LogPops(Pending* p, Reply* reply) {
  // A queue's pops are on disk before the reply can leave, so that no restart hands them out again. Logged here,
  // on the loop's thread, which alone writes the log; the worker that drew the batch held the items meanwhile
  // (a compaction waits for no item to be held, disk_table.h).
  DiskTable* disk = p->table->disk();
  try {
    disk->LogErases(reply->lease->held_keys().data(), reply->lease->held());
  } catch (const IoError& e) {
    reply->lease->GiveBack();  // nothing logged: the items go back to the front of the queue, unlogged
    *reply = LogRefusal(kSample, p->req.request_id, e.what());
    return;
  }
  reply->lease->LoggedIn(disk);
  p->logged = true;
}

void ServeLoop::CommitDisk(bool last) {
  for (const auto& t : tables_) {
    DiskTable* disk = t->disk();
    if (disk == nullptr) continue;
    if (last) disk->Commit();  // else the table's syncer fdatasyncs, off this thread
    if (!last) disk->MaybeCompact();
    if (disk->TakeFailure()) {
      Log("ERROR", "table '" + t->name() + "': its log on disk cannot be synced (" + disk->failure() +
                       "); the table takes no change until the server restarts, which opens it at its last "
                       "consistent state");
    }
  }
  if (held_replies_.empty()) return;
  std::vector<HeldReply> held;
  held.swap(held_replies_);
  for (HeldReply& h : held) {
    const DiskTable* disk = h.table->disk();
    if (!disk->failed() && disk->synced() < h.written) {  // its writes not synced yet: held on, in order
      held_replies_.push_back(std::move(h));
      continue;
    }
    if (disk->failed() && h.reply.status == kOk) {
      // Not known to be on disk: the request is answered as failed (its change stays in memory this life).
      errors_[h.op].fetch_add(1, std::memory_order_relaxed);
      Send(h.peer, ErrorReply(h.op, h.request_id, kInternal,
                              std::string(OpName(h.op)) +
                                  " not known to be stored: the table's log on disk cannot be "
                                  "synced (" +
                                  h.table->disk()->failure() + ")"));
    } else {
      Send(h.peer, std::move(h.reply));
    }
  }
  CountInService();
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
  e->behind_id = q.op == kInsert && p->behind_id;
  Waitlist& waiting = p->table->waiting();
  e->p = std::move(p);
  if (e->deadline <= Now()) {  // clipped to max_wait_s and already past it
    Expire(e.get());
    return;
  }
  if (auto full = waiting.FullReason(*e)) {
    ++waiting.refused;
    Error(*e->p, kTimeout,
          std::string(OpName(e->op)) + " of " + std::to_string(e->n) +
              " items not queued: it would have to wait, and " + *full + "; retry later");
    ForgetOwner(*e->p);
    return;
  }
  DeferredPtr evicted = waiting.Add(e, front);
  if (evicted) {
    Error(*evicted->p, kTimeout,
          std::string(OpName(evicted->op)) + " of " + std::to_string(evicted->n) +
              " items given up: this peer has more than max_waiting_per_peer=" + std::to_string(waiting.max_peer()) +
              " requests waiting, the oldest is answered");
    ForgetOwner(*evicted->p);
    evicted->p.reset();  // the husk keeps no data
  }
}

void ServeLoop::Expire(Deferred* e) {
  const Request& q = e->p->req;
  Table& table = *e->p->table;
  const RateLimiter& limiter = table.limiter();
  const uint64_t size = table.Size();
  std::string why;
  if (limiter.kind() == LimiterKind::kQueue) {
    why = e->op == kSample ? "the queue is empty"
                           : "the queue holds " + std::to_string(limiter.InsertSize(size, table.Held())) +
                                 " of at most " + std::to_string(limiter.queue_size()) +
                                 " items (Queue(size=" + std::to_string(limiter.queue_size()) + "))";
  } else if (e->op == kSample && !limiter.BigEnough(size)) {
    why = "the store holds " + std::to_string(size) + (table.slices() ? " windows" : " items") +
          ", fewer than min_size_to_sample=" + std::to_string(limiter.need());
  } else {
    why = std::string("rate limited until the ") + (e->op == kInsert ? "samplers are" : "inserters are") +
          " caught up (" + limiter.Describe() + ")";
  }
  if (tables_.size() > 1) why = "table '" + table.name() + "': " + why;
  const long waited_ms = std::lround((Now() - e->p->t_arrival) * 1000);
  std::string clip;
  if (q.timeout_ms / 1000.0 > config_.max_wait_s) {
    clip = ", the server's max_wait_s=" + G(config_.max_wait_s) + " (timeout_ms=" + std::to_string(q.timeout_ms) +
           " clipped)";
  }
  if (!Error(*e->p, kTimeout,
             std::string(OpName(e->op)) + " of " + std::to_string(e->n) + " items: " + why + ", after waiting " +
                 std::to_string(waited_ms) + " ms" + clip)) {
    ++table.waiting().dropped;  // its peer left: counted with the others it had waiting
  }
  ForgetOwner(*e->p);
  e->p.reset();
}

void ServeLoop::ForgetOwner(const Pending& p) {
  const Request& q = p.req;
  if (q.op == kInsert && (q.insert_session != 0 || q.insert_sequence != 0)) {
    window_.Release(InsertId{p.identity, q.insert_session, q.insert_sequence}, p.serial);
    recheck_ = true;  // a retry waiting behind this id takes it over
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
    --outstanding_;
    CountInService();
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
  for (const auto& t : tables_) {
    for (DeferredPtr& e : t->waiting().Expired(Now())) Expire(e.get());
  }
  const auto still_behind = [this](const Deferred& e) {
    const Pending& p = *e.p;
    return window_.Busy(InsertId{p.identity, p.req.insert_session, p.req.insert_sequence}, p.serial, Now());
  };
  // A second pass answers the retries whose first request the first pass stored, without a poll between.
  for (int pass = 0; pass < 2 && recheck_; ++pass) {
    recheck_ = false;
    uint64_t behind = 0;
    for (const auto& t : tables_) {
      if (t->waiting().count() == 0 && t->waiting().behind() == 0) continue;
      for (DeferredPtr& e : t->waiting().Release(t->limiter(), t->Size(), still_behind, t->Held())) {
        Dispatch(std::move(e->p), true);
      }
      behind += t->waiting().behind();
    }
    if (behind == 0) break;
  }
}

void ServeLoop::RefusePending() {
  for (const auto& t : tables_) {
    for (DeferredPtr& e : t->waiting().TakeAll()) {
      Error(*e->p, kShuttingDown, "the replay server is shutting down");
      ForgetOwner(*e->p);
      e->p.reset();
    }
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
  for (const auto& t : tables_) t->PublishWaiting();
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

bool ServeLoop::Serve(Pending* p, Reply* reply) {
  const DiskTable* disk = p->table->disk();
  const uint64_t records = disk != nullptr ? disk->records() : 0;
  if (!p->table->handlers().Serve(p, Now(), reply)) return false;  // it waits
  // (A SAMPLE logs nothing here: it is served on a worker while the loop writes; its pops are logged by Deliver.)
  if (disk != nullptr) p->logged = p->req.op != kSample && disk->records() != records;
  Count(p->req.op, reply->status != kOk);
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
  // A SAMPLE's take from its table is settled here, where the loop learns whether libzmq took the reply: kept
  // when it did, given back (items at the front of a queue, the limiter's count) when it did not.
  const std::unique_ptr<SampleLease> lease = std::move(reply.lease);
  auto settle = [this, &lease](bool sent) {
    if (!lease) return;
    // A kept reply without held items changes nothing a waiting request waits on; a released hold frees a
    // queue's room, a give-back brings items and takes the limiter's count back.
    if (!sent || lease->held() > 0) recheck_ = true;
    if (sent) {
      lease->Keep();
    } else {
      lease->GiveBack();
    }
  };
  auto& slot = unread_[peer];
  if (!slot) slot = std::make_shared<std::atomic<int64_t>>(0);
  const size_t frames = reply.layout.size();
  // The byte cap on what a peer leaves unread (libzmq's high-water marks count messages, not bytes): a peer
  // that does not read loses the replies that would take it over the cap. One reply always fits.
  const int64_t bytes = static_cast<int64_t>(reply.Bytes());
  const int64_t unread = slot->load(std::memory_order_relaxed);
  if (unread > 0 && static_cast<uint64_t>(unread + bytes) > config_.max_unread_bytes) {
    replies_dropped_.fetch_add(1, std::memory_order_relaxed);
    settle(false);
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
  // libzmq reports a failure of a ROUTER send at the routing id (a message it takes is delivered whole or not
  // at all), so a failed reply reached no one. A peer that leaves after libzmq took its reply loses it: libzmq
  // does not tell.
  settle(err == 0);
  if (err == 0) return true;
  replies_dropped_.fetch_add(1, std::memory_order_relaxed);
  if (err == EHOSTUNREACH) {  // the peer left: drop what it had waiting
    size_t dropped = 0;
    for (const auto& t : tables_) {
      auto gone = t->waiting().DropPeer(peer);
      for (DeferredPtr& e : gone) {
        ForgetOwner(*e->p);
        e->p.reset();
      }
      dropped += gone.size();
    }
    if (dropped != 0) Log("INFO", "a peer left: dropped its " + std::to_string(dropped) + " waiting requests");
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

void ServeLoop::SetLayout(ItemLayout layout) { tables_[default_]->SetLayout(std::move(layout)); }

void ServeLoop::SetLayout(uint32_t table, ItemLayout layout) {
  if (table >= tables_.size()) throw InvalidArgument("no table of index " + std::to_string(table));
  tables_[table]->SetLayout(std::move(layout));
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
  add("requests_in_service", static_cast<double>(in_service_.load()));
  add("workers", config_.workers);
  add("tables", static_cast<double>(tables_.size()));
  add("requests_refused_table", static_cast<double>(refused_table_.load()));
  // Today's names describe the table `default` (else table 0); every table's under "table.<name>.".
  tables_[default_]->Stats("", &out);
  for (const auto& t : tables_) t->Stats("table." + t->name() + ".", &out);
  add("replies_dropped", static_cast<double>(replies_dropped_.load()));
  add("replies_refused_too_large", static_cast<double>(replies_refused_.load()));
  add("replies_refused_unread", static_cast<double>(refused_unread_.load()));
  add("requests_refused_role", static_cast<double>(refused_role_.load()));
  add("unread_reply_bytes", static_cast<double>(unread_total_->load()));
  add("unread_reply_bytes_peer_max", static_cast<double>(unread_peak_peer_.load()));
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
