// The data ops -- INSERT, SAMPLE, UPDATE_PRIORITIES, ERASE, REMOVE_TO_FIT, RESET -- against a store, the insert-id
// window and the rate limiter, without a socket: what the loop (serve_loop.cc) does with a decoded request
// once it has decided to serve it now. Unit-tested on their own (tests/cpp/handlers_test.cc).
#ifndef APEXRL_SERVE_HANDLERS_H_
#define APEXRL_SERVE_HANDLERS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apexrl/disk_table.h"
#include "apexrl/serve/insert_window.h"
#include "apexrl/serve/item_check.h"
#include "apexrl/serve/rate_limiter.h"
#include "apexrl/serve/reply.h"
#include "apexrl/serve/wire.h"
#include "apexrl/sharded_store.h"
#include "apexrl/slices/slice_table.h"

namespace apexrl::serve {

// What a handler reads of a request: its decoded fields (viewing frames someone else keeps alive) and what
// the loop knows of its sender and arrival. The loop's Pending is a Call with the frames.
struct Call {
  Request req;
  std::string identity;    // the client's ZAP User-Id; insert ids are per identity
  double t_arrival = 0;    // seconds, steady clock
  uint64_t serial = 0;     // owner number for the insert window
  bool waited = false;     // counted in rate_limiter_waits_* already
  bool behind_id = false;  // waits for the first request of its insert id, not for the rate limiter
  // A disk table's SAMPLE served on the loop's thread reads its items from the table's log tail cache only
  // (cached_only); when the cache lacks one, Serve leaves the drawn batch here and returns false, and a worker
  // serves the call again: it reads that batch (from the files too) instead of drawing another.
  bool cached_only = false;
  std::unique_ptr<SampleResult> drawn;
};

class Handlers {
 public:
  // `log` takes an internal error's line (level, text); the loop sends it to Python's log.
  using LogFn = std::function<void(const char* level, std::string text)>;
  // Every pointer must outlive the Handlers; the store, limiter, window and pool are shared with the loop.
  // `disk`: the table's log when the table is on disk (null: a memory table); every change is logged there
  // before its reply (disk_table.h), and a change that cannot be written is undone and answered INTERNAL.
  // `slices`: the table's SliceTable when it is a slices table (then `store` is null): episodes in, windows out
  // (handlers_slices.cc; docs/protocol.md, "Slices tables").
  Handlers(ShardedStore* store, RateLimiter* limiter, InsertWindow* window, SamplePool* pool, double max_wait_s,
           LogFn log, DiskTable* disk = nullptr, SliceTable* slices = nullptr);

  // Why an INSERT's own content is refused whatever the server's state (then nothing of it may be admitted or
  // kept: the loop checks it before the window, the limiter or the waiting list see the request), or nothing.
  // `layout`: the run's item layout, null while unknown; *spec_refused is set when its check was the one that
  // failed. Loop thread only (it uses the handlers' scratch).
  std::optional<std::string> InsertContentProblem(const Request& q, const ItemLayout* layout, bool* spec_refused);

  // Serves `c` (a data op whose content passed the checks above) at time `now`: true with the reply, or false
  // when it must wait -- rate limited, too small a store, or its insert id's first request still waiting --
  // and may (its timeout_ms is not past). Every failure is an error reply, never an exception. INSERTs on the
  // loop thread only (scratch); the others on any thread.
  bool Serve(Call* c, double now, Reply* reply);

  uint64_t erased_items() const { return erased_items_.load(std::memory_order_relaxed); }
  uint64_t resets() const { return resets_.load(std::memory_order_relaxed); }  // RESETs served
  // Items SAMPLE replies that were not sent gave back to the store (SampleLease).
  uint64_t items_returned() const { return items_returned_.load(std::memory_order_relaxed); }
  // The priority an INSERT with kFlagMaxPriority gives each item: the largest priority this table was given so
  // far (INSERT or UPDATE_PRIORITIES, since the server started or the table's last RESET), 1.0 before any.
  double MaxPriority() const;

 private:
  bool ServeInsert(Call* c, double now, bool can_wait, Reply* reply);
  bool ServeSample(Call* c, bool can_wait, Reply* reply);
  bool RateLimited(Call* c, bool can_wait, Reply* reply);
  void GiveBackHeld(const SampleResult& result);  // a failed SAMPLE's items drawn for the last time
  // A slices table's ops (handlers_slices.cc). EpisodeProblem: InsertContentProblem's check of an episode
  // record and the chunks it describes; StoreEpisode: stores the (checked) episode -> its episode number, and
  // *window_bytes, a window's share of a SAMPLE reply at most; ServeSlices: every op but INSERT.
  std::optional<std::string> EpisodeProblem(const Request& q);
  uint64_t StoreEpisode(const Request& q, uint64_t* window_bytes);
  bool ServeSlices(Call* c, bool can_wait, Reply* reply);
  bool ServeSliceSample(Call* c, bool can_wait, Reply* reply);

  ShardedStore* const store_;
  RateLimiter* const limiter_;
  DiskTable* const disk_;
  SliceTable* const slices_;
  InsertWindow* const window_;
  SamplePool* const pool_;
  const double max_wait_s_;
  const LogFn log_;
  std::atomic<uint64_t> erased_items_{0};
  std::atomic<uint64_t> resets_{0};
  std::atomic<uint64_t> items_returned_{0};
  // The largest priority given so far, -1 before any. Raised (never lowered) by INSERTs on the loop thread and
  // by UPDATE_PRIORITIES on any thread: an atomic max, no lock.
  std::atomic<double> max_priority_{-1.0};
  void NoteMaxPriority(const double* priorities, uint64_t n);
  // An INSERT's scratch, reused (loop thread only, like every INSERT).
  std::vector<const uint8_t*> item_ptrs_;
  std::vector<uint64_t> item_sizes_;
  std::vector<const uint8_t*> chunk_ptrs_;
  std::vector<uint64_t> chunk_sizes_;
  std::vector<uint64_t> chunk_refs_;
  std::vector<uint64_t> chunk_ref_offsets_;
  std::vector<double> priority_scratch_;  // its priorities, aligned, for the store's check
};

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_HANDLERS_H_
