#include "apexrl/serve/table.h"

#include <utility>

#include "apexrl/errors.h"

namespace apexrl::serve {

namespace {

const TableSpec& Checked(const TableSpec& spec) {
  if (spec.name.empty()) throw InvalidArgument("a table needs a name");
  if (spec.slices) {
    if (spec.store || spec.disk) throw InvalidArgument("table '" + spec.name + "': a slices table has no store");
    if (spec.limiter.kind != LimiterKind::kMinSize) {
      throw InvalidArgument("table '" + spec.name +
                            "': a slices table's rate limiter is a MinSize (counted in windows)");
    }
    return spec;
  }
  if (!spec.store) throw InvalidArgument("table '" + spec.name + "' has no store");
  if (spec.disk && spec.disk->store() != spec.store) {
    throw InvalidArgument("table '" + spec.name + "': its store is not its disk table's");
  }
  return spec;
}

}  // namespace

Table::Table(uint32_t index, TableSpec spec, const WaitBounds& bounds, InsertWindow* window, SamplePool* pool,
             Handlers::LogFn log)
    : index_(index),
      name_(Checked(spec).name),
      store_(std::move(spec.store)),
      disk_(std::move(spec.disk)),
      slices_(std::move(spec.slices)),
      min_size_(spec.limiter.kind == LimiterKind::kQueue ? 1 : spec.limiter.min_size),
      limiter_(spec.limiter),
      waiting_(std::make_unique<Waitlist>(bounds.max_waiting, bounds.max_waiting_per_peer, bounds.max_waiting_bytes)),
      handlers_(store_.get(), &limiter_, window, pool, bounds.max_wait_s, std::move(log), disk_.get(), slices_.get()) {
  if (slices_) return;  // starts empty: its first INSERT tells a window's size
  // The mean item of a restored store, rounded up: its largest is unknown (replies are checked after sampling
  // too).
  const StoreStats s = store_->Stats();
  const uint64_t bytes = disk_ ? disk_->opened().item_bytes : s.bytes_held;  // a disk table holds refs, 16 bytes
  max_item_ = s.size == 0 ? 0 : (bytes + s.size - 1) / s.size;
  max_item_seen_.store(max_item_);
}

void Table::SetLayout(ItemLayout layout) {
  auto shared = std::make_shared<const ItemLayout>(std::move(layout));
  ScopedLock lock(layout_mu_);
  layout_ = std::move(shared);
}

std::shared_ptr<const ItemLayout> Table::layout() const {
  ScopedLock lock(layout_mu_);
  return layout_;
}

void Table::SawItem(uint64_t bytes) {
  if (bytes <= max_item_) return;
  max_item_ = bytes;
  max_item_seen_.store(bytes, std::memory_order_relaxed);
}

void Table::PublishWaiting() {
  const Waitlist& w = *waiting_;
  const uint64_t values[8] = {w.count(), w.bytes(), w.peers(),      w.dropped,
                              w.refused, w.evicted, w.examined_max, w.examined_total};
  for (int i = 0; i < 8; ++i) waiting_stats_[i].store(values[i], std::memory_order_relaxed);
}

void Table::Stats(const std::string& prefix, std::vector<LoopStat>* out) const {
  auto add = [&](const char* name, double v, bool integer = true) { out->push_back({prefix + name, v, integer}); };
  add("erased_items", static_cast<double>(handlers_.erased_items()));
  add("resets", static_cast<double>(handlers_.resets()));
  add("items_returned", static_cast<double>(handlers_.items_returned()));
  add("min_size_to_sample", static_cast<double>(min_size_));
  uint64_t inserted, sampled, wi, ws;
  limiter_.Counts(&inserted, &sampled);
  limiter_.Waits(&wi, &ws);
  add("rate_limiter_waits_insert", static_cast<double>(wi));
  add("rate_limiter_waits_sample", static_cast<double>(ws));
  add("rate_limiter_inserted_items", static_cast<double>(inserted));
  add("rate_limiter_sampled_items", static_cast<double>(sampled));
  add("samples_per_insert", limiter_.spi(), false);
  add("error_buffer", limiter_.eb(), false);
  add("queue_size", static_cast<double>(limiter_.queue_size()));
  static const char* kWaitingNames[8] = {
      "deferred",         "deferred_bytes",   "deferred_peers",        "deferred_dropped",
      "deferred_refused", "deferred_evicted", "deferred_examined_max", "deferred_examined_total"};
  for (int i = 0; i < 8; ++i) add(kWaitingNames[i], static_cast<double>(waiting_stats_[i].load()));
  add("max_item_bytes", static_cast<double>(max_item_seen_.load()));
  add("spec_refused_inserts", static_cast<double>(spec_refused_.load()));
  if (slices_) {  // kind="slices": its SliceTable's counters
    const SliceStats s = slices_->Stats();
    add("slice_episodes", static_cast<double>(s.episodes));
    add("slice_steps", static_cast<double>(s.steps));
    add("slice_windows", static_cast<double>(s.windows));
    add("slice_chunk_bytes", static_cast<double>(s.chunk_bytes));
    add("slice_metadata_bytes", static_cast<double>(s.metadata_bytes));
    add("slice_inserted_episodes", static_cast<double>(s.inserted_episodes));
    add("slice_evicted_episodes", static_cast<double>(s.evicted_episodes));
    add("slice_sampled_windows", static_cast<double>(s.sampled));
    add("slice_updated_windows", static_cast<double>(s.updated));
    add("slice_stale_updates", static_cast<double>(s.stale_updates));
    add("slice_total_mass", s.total_mass, false);
  }
  if (disk_) {  // storage="disk" (disk_table.h)
    const DiskTableStats d = disk_->Stats();
    const DiskTableOpened& o = disk_->opened();
    add("disk_records", static_cast<double>(d.records));
    add("disk_record_bytes", static_cast<double>(d.bytes));
    add("disk_syncs", static_cast<double>(d.syncs));
    add("disk_write_errors", static_cast<double>(d.write_errors));
    add("disk_items_logged_again", static_cast<double>(d.restored));
    add("disk_compactions", static_cast<double>(d.compactions));
    add("disk_compaction_errors", static_cast<double>(d.compact_errors));
    add("disk_unsynced_writes", static_cast<double>(d.unsynced_writes));
    add("disk_failed", d.failed ? 1.0 : 0.0);
    add("disk_cache_hits", static_cast<double>(d.cache_hits));
    add("disk_cache_misses", static_cast<double>(d.cache_misses));
    add("disk_cache_bytes", static_cast<double>(d.cache_bytes));
    add("disk_opened_items", static_cast<double>(o.items));
    add("disk_opened_records", static_cast<double>(o.records));
    add("disk_dropped_bytes", static_cast<double>(o.log.dropped_bytes));
    add("disk_dropped_segments", static_cast<double>(o.log.dropped_segments));
  }
}

}  // namespace apexrl::serve
