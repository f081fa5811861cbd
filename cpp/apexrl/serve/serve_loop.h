// ServeLoop: the replay server's request path in native code.
//
//   clients (DEALER) ──tcp──► ROUTER socket ◄──► loop thread ──jobs──► worker 0..W-1 (large SAMPLEs,
//                                                   ▲   │                REMOVE_TO_FIT, ERASE)
//                                                   │   └─control──► Python thread (HELLO, STATS, CHECKPOINT)
//                                                   └──── replies (eventfd wake-up) ◄──┘
//
// Python creates and configures the socket (bind, CURVE, ZAP, HWMs, ZMQ_MAXMSGSIZE, ROUTER_MANDATORY) and
// hands it over; from Start() to the end of Stop() the loop thread alone touches it. The loop decodes and
// validates every request (wire.h), serves INSERT, UPDATE_PRIORITIES, RESET and SAMPLEs of at most
// inline_sample_max items itself (one store call, then the reply; a disk table's only when its log tail cache holds
// every drawn item), hands the other data ops to the workers,
// and the rare control ops to Python through a queue (NextControl / ControlReply), so that HELLO's spec
// handling and STATS's JSON keep one definition in Python. Every rule of the former Python loop is here: the
// spec check of each item, exactly-once insert ids (InsertWindow), the rate limiter and minimum size with
// deferred requests (bounded in count, bytes, per peer, and in time by max_wait_s), early refusals, reply
// size caps, roles per client identity. No call holds the GIL.
//
// Its parts, one concept a file: wire.h decodes and validates, table.h is one named table (its store, rate
// limiter, item layout, waiting list and handlers; a data request names its table by index in the header, found
// with one bounds check), handlers.h serves the data ops against a table's store, the window and the table's
// limiter (no socket), reply.h builds replies and keeps their buffers alive until libzmq frees them,
// waitlist.h holds the requests that wait (one list per table); this file is the loop itself (socket, dispatch,
// workers, sending, the control queue).
//
// Replies leave without copies: their buffers are handed to libzmq with a free callback, which is also how
// the loop knows exactly how many reply bytes each peer has not taken yet (sent and still queued in libzmq);
// a SAMPLE that would take a peer over max_unread_bytes is refused.
#ifndef APEXRL_SERVE_SERVE_LOOP_H_
#define APEXRL_SERVE_SERVE_LOOP_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "apexrl/mutex.h"
#include "apexrl/serve/handlers.h"
#include "apexrl/serve/insert_window.h"
#include "apexrl/serve/item_check.h"
#include "apexrl/serve/rate_limiter.h"
#include "apexrl/serve/reply.h"
#include "apexrl/serve/table.h"
#include "apexrl/serve/wire.h"
#include "apexrl/serve/zmq_api.h"
#include "apexrl/sharded_store.h"
#include "apexrl/thread_annotations.h"

namespace apexrl::serve {

struct LoopConfig {
  uint64_t max_bytes = 256ull << 20;        // largest request (0: none)
  uint64_t max_reply_bytes = 256ull << 20;  // largest SAMPLE reply
  uint32_t workers = 2;
  uint64_t inline_sample_max = 1024;
  double max_wait_s = 60.0;
  uint64_t max_waiting = 16384;
  uint64_t max_waiting_per_peer = 1024;
  uint64_t max_waiting_bytes = 256ull << 20;
  uint64_t max_unread_bytes = 256ull << 20;  // per peer
  // The rate limiter of the one table `default` when the loop is built over a single store (the first
  // constructor); the tables of the second carry their own.
  double samples_per_insert = 0.0;  // 0: no rate limit
  double error_buffer = 0.0;
  uint64_t min_size_to_sample = 1;
  uint64_t dedup_max_ids = 65536;  // per client identity
  uint64_t dedup_max_bytes = 64ull << 20;
  // Roles: the part of a client's ZAP User-Id before ':' names its role; role -> bit mask of the ops it may
  // send (bit op). Empty: every client may send everything (no CURVE, or no roles configured).
  std::map<std::string, uint32_t> role_ops;
};

// A request for Python (HELLO, STATS, CHECKPOINT) or a line to log (op 0: level in `identity`, text in frames[0]).
struct ControlRequest {
  std::string peer;
  std::string identity;
  uint16_t op = 0;
  std::vector<std::string> frames;
};

struct Pending;
struct Deferred;
class Waitlist;

class ServeLoop {
 public:
  // One table, `default`, over `store`, limited by config's samples_per_insert / error_buffer /
  // min_size_to_sample.
  ServeLoop(ZmqApi api, void* socket, std::shared_ptr<ShardedStore> store, LoopConfig config);
  // The tables in index order (at least one, names distinct; InvalidArgument otherwise).
  ServeLoop(ZmqApi api, void* socket, std::vector<TableSpec> tables, LoopConfig config);
  ~ServeLoop();
  ServeLoop(const ServeLoop&) = delete;
  ServeLoop& operator=(const ServeLoop&) = delete;

  void Start();
  // Stop reading; answer waiting and queued requests SHUTTING_DOWN; let requests in service (workers, Python)
  // finish and deliver; join every thread. The socket is then Python's again. Idempotent.
  void Stop();

  // Python's side of the control queue: the next control request (false after `timeout_s` without one,
  // or when the loop has stopped; `closed` tells which). Replies go back through ControlReply.
  bool NextControl(double timeout_s, ControlRequest* out, bool* closed) EXCLUDES(control_mu_);
  void ControlReply(const std::string& peer, std::vector<std::string> frames) EXCLUDES(done_mu_);

  // A table's item layout once known (HELLO or configuration); its inserts are checked against it from then on.
  // The first form: the table `default` (else table 0). InvalidArgument for an unknown index.
  void SetLayout(ItemLayout layout);
  void SetLayout(uint32_t table, ItemLayout layout);
  size_t num_tables() const { return tables_.size(); }

  std::vector<LoopStat> Stats() const;

 private:
  friend class Waitlist;
  // The loop thread's steps (the former Python broker's methods).
  void Run() EXCLUDES(jobs_mu_, control_mu_);
  void ReadFrontBurst() EXCLUDES(control_mu_);
  bool Receive(Pending* p);
  void Dispatch(std::unique_ptr<Pending> p, bool front) EXCLUDES(jobs_mu_);
  void ToWorkers(std::unique_ptr<Pending> p) EXCLUDES(jobs_mu_);  // queues `p` for the workers
  bool FindTable(Pending* p);
  bool InsertContentOk(const Pending& p);
  bool EarlyRefusal(const Pending& p, uint16_t* status, std::string* message);
  void Deliver(std::unique_ptr<Pending> p, Reply reply);
  // A disk table's SAMPLE that popped items (drawn for the last time): their ERASE record written before the reply
  // may leave; a log that cannot take it turns the reply into an error and gives the items back.
  void LogPops(Pending* p, Reply* reply);
  // Disk tables (disk_table.h): sends the replies held for a sync table (those that acknowledge a change) once its
  // syncer's fdatasync has covered the writes made before each was ready (the syncer wakes the loop); a failed sync
  // answers them INTERNAL instead. Lets each table compact, and logs a table's failure once. `last` (the loop
  // stops): every disk table is synced here, and every held reply leaves.
  void CommitDisk(bool last);
  void Defer(std::unique_ptr<Pending> p, bool front);
  void Expire(Deferred* e);
  void SendFinished() EXCLUDES(done_mu_);
  void ReleaseDeferred();
  void RefusePending();
  void Tidy();
  // Serving (loop thread or a worker; handlers.h): the reply, counted, or nothing when the request must wait.
  bool Serve(Pending* p, Reply* reply);
  void Worker() EXCLUDES(jobs_mu_, done_mu_);
  // Sending (loop thread only): false when the peer left (its waiting requests are dropped).
  bool Send(const std::string& peer, Reply reply);
  bool Error(const Pending& p, uint16_t status, const std::string& message);
  void Count(uint16_t op, bool error);
  void Log(const char* level, std::string text) EXCLUDES(control_mu_);
  void Wake();
  void ForgetOwner(const Pending& p);

  const ZmqApi api_;
  void* const socket_;
  const LoopConfig config_;
  InsertWindow window_;
  std::shared_ptr<SamplePool> pool_;  // shared with the replies libzmq still holds
  // The tables, by index (fixed from construction on, so any thread may read the vector); default_: the
  // table today's STATS names describe (`default`, else table 0).
  std::vector<std::unique_ptr<Table>> tables_;
  size_t default_ = 0;
  int wake_fd_ = -1;

  std::thread loop_thread_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};

  // Jobs for the workers, and what comes back to the loop thread (workers' results, Python's replies).
  // jobs_mu_: the loop thread pushes, the workers pop (waiting on jobs_cv_ while there is none).
  Mutex jobs_mu_;
  CondVar jobs_cv_;
  std::deque<std::unique_ptr<Pending>> jobs_ GUARDED_BY(jobs_mu_);
  bool jobs_closed_ GUARDED_BY(jobs_mu_) = false;
  // done_mu_: the workers and Python push, the loop thread swaps the whole queue out (after an eventfd wake-up).
  Mutex done_mu_;
  struct Finished {
    std::unique_ptr<Pending> pending;  // null: a control reply
    std::string peer;
    bool deferred = false;
    std::unique_ptr<Reply> reply;
  };
  std::deque<Finished> done_ GUARDED_BY(done_mu_);
  // control_mu_: the loop thread (and any thread that logs) pushes, Python pops (waiting on control_cv_).
  Mutex control_mu_;
  CondVar control_cv_;
  std::deque<ControlRequest> control_ GUARDED_BY(control_mu_);
  bool control_closed_ GUARDED_BY(control_mu_) = false;

  // Loop thread only.
  bool any_disk_ = false;  // a table is on disk
  struct HeldReply {
    std::string peer;
    Table* table;
    uint16_t op;
    uint64_t request_id;
    uint64_t written;  // the table's DiskTable::written() when the reply was ready: it leaves once synced() is there
    Reply reply;
  };
  std::vector<HeldReply> held_replies_;  // replies waiting for their disk table's sync, in the order they were ready
  uint64_t outstanding_ = 0;             // requests with the workers or Python
  uint64_t max_outstanding_;
  bool recheck_ = false;
  uint64_t serial_ = 0;
  std::map<std::string, std::shared_ptr<std::atomic<int64_t>>> unread_;  // per peer routing id
  double last_tidy_ = 0;
  int64_t trimmed_at_ = 0;

  // Counters (any thread).
  std::atomic<uint64_t> requests_[kMaxReplayOp + 1] = {};
  std::atomic<uint64_t> errors_[kMaxReplayOp + 1] = {};
  // Requests not yet answered, for Stats: outstanding_ (with the workers or Python) and the held replies.
  std::atomic<uint64_t> in_service_{0};
  void CountInService() { in_service_.store(outstanding_ + held_replies_.size(), std::memory_order_relaxed); }
  std::atomic<uint64_t> replies_dropped_{0};
  std::atomic<uint64_t> replies_refused_{0};
  std::atomic<uint64_t> refused_unread_{0};
  std::atomic<uint64_t> refused_role_{0};
  std::atomic<uint64_t> refused_table_{0};
  std::shared_ptr<std::atomic<int64_t>> unread_total_;
  std::atomic<int64_t> unread_peak_peer_{0};
};

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_SERVE_LOOP_H_
