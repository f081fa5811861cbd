// A table of the replay server: a name, its store, its rate limiter, the item layout its inserts are checked
// against, its waiting list and its counters. The serving loop (serve_loop.h) holds one or more, in the order
// the server was configured with; a data request names its table by that index in the header's `table` field
// (docs/protocol.md, "Tables"), so finding it is one bounds check and one vector read, with no allocation.
//
// What a table does not share with the others: its items (every table has its own store, and its own key
// epoch, so a key of one table is stale on another, never another table's item), its admission rule, its
// waiting requests and their per-client caps. What the tables share: the socket, the workers, the reply pool,
// the per-client unread-reply caps and the exactly-once insert-id window (insert ids are per client identity,
// server-wide).
#ifndef APEXRL_SERVE_TABLE_H_
#define APEXRL_SERVE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apexrl/disk_table.h"
#include "apexrl/item_layout.h"
#include "apexrl/mutex.h"
#include "apexrl/serve/handlers.h"
#include "apexrl/serve/insert_window.h"
#include "apexrl/serve/rate_limiter.h"
#include "apexrl/serve/reply.h"
#include "apexrl/serve/waitlist.h"
#include "apexrl/sharded_store.h"
#include "apexrl/slices/slice_table.h"
#include "apexrl/thread_annotations.h"

namespace apexrl::serve {

struct LoopStat {
  std::string name;
  double value;
  bool integer;
};

// What a table is made of (Python's TableConfig, its store already built).
struct TableSpec {
  std::string name;
  std::shared_ptr<ShardedStore> store;
  LimiterConfig limiter;
  // storage="disk": the table's log, whose store `store` must be (null: a memory table).
  std::shared_ptr<DiskTable> disk = nullptr;
  // kind="slices": episodes sampled as windows (then `store` is null, the limiter a MinSize counted in windows,
  // and the table in memory).
  std::shared_ptr<SliceTable> slices = nullptr;
};

// The waiting list's bounds and the longest wait (the loop's configuration; each table applies them to its own
// waiting requests).
struct WaitBounds {
  uint64_t max_waiting = 16384;
  uint64_t max_waiting_per_peer = 1024;
  uint64_t max_waiting_bytes = 256ull << 20;
  double max_wait_s = 60.0;
};

class Table {
 public:
  // InvalidArgument for an empty name, a missing store, or a limiter configuration RateLimiter refuses.
  // `window` and `pool` are the loop's (shared by every table) and must outlive the table.
  Table(uint32_t index, TableSpec spec, const WaitBounds& bounds, InsertWindow* window, SamplePool* pool,
        Handlers::LogFn log);
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  uint32_t index() const { return index_; }
  const std::string& name() const { return name_; }
  ShardedStore* store() const { return store_.get(); }  // null for a slices table
  SliceTable* slices() const { return slices_.get(); }  // null for a table of items
  DiskTable* disk() const { return disk_.get(); }       // null for a memory table
  // What the rate limiter counts (the items held; a slices table's windows) and the items SAMPLE replies not yet
  // sent hold (ShardedStore::Held; none in a slices table).
  uint64_t Size() const { return slices_ ? slices_->NumWindows() : store_->Size(); }
  uint64_t Held() const { return slices_ ? 0 : store_->Held(); }
  RateLimiter& limiter() { return limiter_; }
  const RateLimiter& limiter() const { return limiter_; }
  Waitlist& waiting() { return *waiting_; }
  Handlers& handlers() { return handlers_; }

  // The layout this table's inserts are checked against (null: none known yet). Set by Python, read by the
  // loop thread per INSERT.
  void SetLayout(ItemLayout layout) EXCLUDES(layout_mu_);
  std::shared_ptr<const ItemLayout> layout() const EXCLUDES(layout_mu_);

  // Loop thread only: the largest item (with its chunks) stored, for the SAMPLE reply estimate.
  uint64_t max_item() const { return max_item_; }
  void SawItem(uint64_t bytes);
  void CountSpecRefused() { spec_refused_.fetch_add(1, std::memory_order_relaxed); }
  // Loop thread only: copies the waiting list's counters where Stats (any thread) reads them.
  void PublishWaiting();

  // This table's counters under their STATS names, each prefixed with `prefix` (any thread).
  void Stats(const std::string& prefix, std::vector<LoopStat>* out) const;

 private:
  const uint32_t index_;
  const std::string name_;
  const std::shared_ptr<ShardedStore> store_;
  const std::shared_ptr<DiskTable> disk_;
  const std::shared_ptr<SliceTable> slices_;
  const uint64_t min_size_;  // as configured (STATS reports it; the limiter raises 0 to 1)
  RateLimiter limiter_;
  std::unique_ptr<Waitlist> waiting_;
  Handlers handlers_;  // after the store and limiter it points to

  mutable Mutex layout_mu_;
  std::shared_ptr<const ItemLayout> layout_ GUARDED_BY(layout_mu_);

  uint64_t max_item_ = 0;  // loop thread only
  std::atomic<uint64_t> max_item_seen_{0};
  std::atomic<uint64_t> spec_refused_{0};
  std::atomic<uint64_t> waiting_stats_[8] = {};
};

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_TABLE_H_
