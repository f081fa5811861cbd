// DiskTable: a table whose every acknowledged change is in a log on disk (storage="disk"), so that a server
// killed (kill -9) or a machine that loses power reopens the table with what it acknowledged, keys included.
//
// Design. The table's store (sum trees, key slots, eviction orders) stays in memory as a memory table's, but
// each item's bytes there are an ItemRef (16 bytes: where its INSERT record's bytes lie in the log), so the
// server's memory is bounded by the index and a fixed cache, not by the data: a SAMPLE reads the drawn items'
// bytes back (ReadCached on the serving loop's thread, ReadItems on its workers) from the log's newest bytes kept in
// memory (LogTailCache, up to cache_bytes: a copy) or else from the segment files (one pread an item, from the page
// cache or the disk), checking that the record there is the item's (its type, size and key; and a file's, its
// checksum too: the cache's bytes are the ones written, never read back). The serving loop's rate limiter counts stay
// in memory too (a reopened table starts them afresh from its size). Every change is appended to the table's TableLog
// (table_log.h: checksummed records in segment files under `path`, a LOCK against a second server) as one of
// these records (little-endian):
//   1 OPEN    u32 epoch | u32 shards          a server life began, issuing keys of `epoch`
//   2 INSERT  u64 key | u64 insertion number | f64 priority | the item's bytes
//   3 UPDATE  n x (u64 key | f64 priority)    an UPDATE_PRIORITIES request (keys that address nothing included)
//   4 ERASE   n x u64 key                     items gone: ERASE requests, evictions (RemoveToFit, the max_size
//                                             ceiling, any remover), and a queue's pops (an item drawn for the last
//                                             time, logged when its SAMPLE is served, before the reply leaves)
//   5 CLEAR   (empty)                         a RESET
//   6 EPOCHS  n x u32 epoch                   the epochs of the lives a compaction dropped the OPENs of
// An INSERT's records are placed before its items enter the store (TableLog::Reserve), so the store holds their
// final ItemRefs; a reader that draws an item whose record is not written yet (microseconds: the loop writes it
// right after) or was cut back by a failed write (the insert is then refused and its items erased) finds a
// record that is not the item's, waits for it a little and then fails the read.
// A SAMPLE reply that is not delivered gives its held items back to the store; they are logged again as INSERTs
// with their old keys and insertion numbers (so a queue's order survives), and synced at once.
// Opening replays the log in order into a key -> item map (an INSERT of a live key replaces it, an UPDATE or
// ERASE of a key that is not there does nothing, as the store did), then restores the items, with their keys,
// insertion numbers and ItemRefs, into a new store of `config` (ShardedStore::Restore), whose epoch differs from
// every life the log recorded; no item's bytes are read (but the log's last cache_bytes, into the cache). The log
// recovery's truncation (a torn or corrupt record ends the log) is what the table opens at; recovery() reports what was
// dropped, and an item whose bytes lay in the dropped part is dropped too (opened().dropped_items). Compaction, so that
// the log holds about what the table holds:
//  * while serving (MaybeCompact, between the loop's turns): once the records a reopening would replay pass
//    compact_min_bytes and twice the records of the items left (their INSERTs, bytes included, estimated from the
//    mean item written since open), and no item is held (a
//    pop pending a reply), the log starts a new segment N with an EPOCHS record, and a thread writes the store's
//    snapshot -- its index: keys, priorities, ItemRefs -- (ShardedStore::Save: shard by shard under each shard's
//    lock, so the loop serves on) to index-N.snap and notes the oldest segment an item's bytes lie in; once the
//    snapshot is whole (written, synced, renamed), older snapshots are deleted, and the segments before N and
//    before that oldest one. Segments whose items are all gone go; one an old live item lies in stays (a table
//    whose remover keeps old items, e.g. by priority, keeps more of its log than it holds).
//    Opening then loads the newest snapshot and replays the segments from N on, which may repeat changes the
//    snapshot already holds: each record type gives the same end state applied once or twice in order, so the
//    snapshot's instant (after N began) does not matter. A snapshot that cannot be read stops the opening. A
//    compact-N.snap (items' bytes in the snapshot, as earlier builds wrote) is read too and rewritten at once.
//  * on opening, when the segments read hold more than twice the records of the items left (and at least
//    compact_min_bytes): the new segment starts with EPOCHS and an INSERT of every item (their bytes read
//    from where they lay), is synced, and the snapshots and segments before it are deleted (oldest first). A
//    crash anywhere reopens the same items.
//
// Items with chunks (trajectories, Atari frame chunks) are not stored on disk: the loop refuses such an INSERT.
// Not done yet, and said where it matters: an item's draw count (max_times_sampled above 1) starts again from 0
// after a restart.
//
// Durability. Every change is written (write(2), to the page cache) before the request's reply is built, one
// write per request, so a killed process loses nothing it acknowledged. A thread of the table's own (the syncer)
// fdatasyncs the segment being written, through a dup of its descriptor, while the loop goes on serving: the loop
// never waits for the disk. kSync: the syncer fdatasyncs as soon as there are writes to cover (each fdatasync
// covers every write before it began: group commit), and the loop holds every reply that acknowledges a change
// until one has covered the writes made before the reply was ready. kInterval: replies leave at once; the syncer
// fdatasyncs at most every `interval_s`, and within `interval_s` of a write that follows a quiet spell, so a power
// cut loses at most about that much.
// A write that fails (disk full, EFBIG past RLIMIT_FSIZE, EIO) changes nothing on disk (TableLog cuts back); the
// caller undoes the request's change in memory and answers it with an error. A failed fdatasync leaves the
// disk's state unknown: the table fails (failed()), every later change to it is refused until a restart.
//
// Thread-safety: the serving loop's thread alone writes its log (the loop serves every request of a disk table
// that changes it there; a SAMPLE reads its items there from the cache, or on a worker; a queue's pops, which the
// store holds meanwhile, are logged by the loop before their reply leaves); ReadItems, ReadCached, ReadItem,
// Stats(), failed() and failure() may be called from any thread; the syncer shares the descriptor under fd_mu_ and
// reports through atomics and on_synced.
#ifndef APEXRL_DISK_TABLE_H_
#define APEXRL_DISK_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/log_tail_cache.h"
#include "apexrl/mutex.h"
#include "apexrl/sharded_store.h"
#include "apexrl/table_log.h"
#include "apexrl/thread_annotations.h"

namespace apexrl {

enum class Durability { kSync, kInterval };

struct DiskTableOptions {
  std::string path;  // the log's directory (created if missing; its parent must exist)
  Durability durability = Durability::kSync;
  double interval_s = 0.010;                 // kInterval: the longest a written record waits for its fdatasync
  uint64_t compact_min_bytes = 64ull << 20;  // a log is compacted past this (and twice its items' records)
  // ReadItems: how long a record that is not the drawn item's is waited for (its INSERT being written) before
  // the read fails.
  double read_wait_s = 1.0;
  // The log's newest bytes kept in memory too (LogTailCache), up to this many: a SAMPLE copies the items it finds
  // there instead of reading each from the file (0: none; every read goes to the file). Filled as the log is
  // written, and on opening from the end of the segments an item lies in.
  uint64_t cache_bytes = kDefaultCacheBytes;
  LogOptions log;
  static constexpr uint64_t kDefaultCacheBytes = 1ull << 30;
};

// What a disk table's store holds as an item's bytes: where its bytes lie in the log (the body of its INSERT
// record, after the 24-byte head).
struct ItemRef {
  uint32_t segment;
  uint32_t size;  // the item's bytes
  uint64_t offset;
};
static_assert(sizeof(ItemRef) == 16, "an ItemRef is 16 bytes in the store and in index snapshots");

// What opening found.
struct DiskTableOpened {
  uint64_t items = 0;            // restored
  uint64_t records = 0;          // read
  uint32_t epoch = 0;            // the new life's
  uint64_t lives = 0;            // OPEN records before this one
  uint64_t compacted_bytes = 0;  // the bytes of the segments the opening compaction deleted (0: none)
  uint64_t dropped_items = 0;    // items whose bytes lay in what the log's recovery dropped
  uint64_t item_bytes = 0;       // the restored items' bytes (in the log, not in memory)
  LogRecovery log;               // what the log's recovery dropped, and why
};

// Counters (STATS: table.<name>.disk_*).
struct DiskTableStats {
  uint64_t records = 0;       // appended since open
  uint64_t bytes = 0;         // their bytes
  uint64_t syncs = 0;         // fdatasyncs
  uint64_t write_errors = 0;  // requests refused because their records could not be written
  uint64_t restored = 0;      // items given back (undelivered SAMPLE replies) and logged again
  uint64_t compactions = 0;   // while serving (MaybeCompact)
  uint64_t compact_errors = 0;
  // Writes not yet covered by an fdatasync: kInterval, what a power cut could take; kSync, the writes whose
  // replies wait for the fdatasync under way.
  uint64_t unsynced_writes = 0;
  bool failed = false;
  // Items a SAMPLE (or a read of the contents) found in the log tail cache, and those read from the files; the
  // cache's memory now.
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;
  uint64_t cache_bytes = 0;
};

class DiskTable {
 public:
  static constexpr uint8_t kOpen = 1, kInsert = 2, kUpdate = 3, kErase = 4, kClear = 5, kEpochs = 6;

  // Opens the log at options.path (IoError: unusable directory, another process holds it, a segment of an
  // unknown version; InvalidArgument: a log of another shard count, or records that contradict each other),
  // restores its items into a new store of `config` and records this life's OPEN (synced). config.epoch is
  // taken unless an earlier life of the log used it (then the next one that none did).
  DiskTable(StoreConfig config, DiskTableOptions options);
  ~DiskTable();  // stops the syncer; what it had not synced yet is synced (kInterval)
  DiskTable(const DiskTable&) = delete;
  DiskTable& operator=(const DiskTable&) = delete;

  const std::shared_ptr<ShardedStore>& store() const { return store_; }
  const DiskTableOpened& opened() const { return opened_; }
  const DiskTableOptions& options() const { return options_; }

  // Stores n items (ShardedStore::Insert: n keys written) and logs them; IoError when they cannot be written
  // (nothing of them stored or on disk), InvalidArgument as the store's Insert (nothing changed).
  void Insert(const double* priorities, const uint8_t* const* data, const uint64_t* sizes, size_t n, Key* keys);
  // Each logs one request's change and writes it (with the removals the store reported since the last call,
  // in order) before returning; IoError when it cannot (nothing of it written: the caller undoes and refuses).
  // Called before the change itself.
  void LogUpdates(const Key* keys, const double* priorities, size_t n);
  void LogErases(const Key* keys, size_t n);  // erased by request, or a queue's pops
  void LogClear();
  // The removals the store reported (evictions) alone; a failure keeps them for the next write and is not the
  // request's (an eviction not logged yet brings an item back after a restart; it loses none).
  void LogRemovals();
  // Drops the removals reported since the last call (a RESET's, which its CLEAR record covers).
  void DropRemovals() { removed_.clear(); }
  // Held items that came back to the store (their SAMPLE reply was not sent): logged again as INSERTs and
  // synced. Never throws (it runs where the reply is settled); a failure is counted and returned as text.
  std::string Restored(const Key* keys, size_t n);

  // A sampled batch of this table's store (its items' bytes are ItemRefs): replaces them with the items' bytes,
  // read from the log, `keys` naming the items. IoError when an item's record cannot be read or is not the
  // item's. Any thread.
  void ReadItems(SampleResult* batch) const;
  // ReadItems from the log tail cache alone: true when it held every item whole (each checked), else false with
  // `batch` as it was (its ItemRefs, for a ReadItems elsewhere: the serving loop's thread reads no file). Any
  // thread.
  bool ReadCached(SampleResult* batch) const;
  // One item's bytes, from its ItemRef (`ref`, `ref_size` bytes as the store holds it). Any thread.
  std::string ReadItem(Key key, const uint8_t* ref, size_t ref_size) const;
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() const EXCLUDES(failure_mu_);
  // True once, after the table failed: the loop logs it then.
  bool TakeFailure() { return failed() && !failure_told_.exchange(true); }
  // Written records not yet covered by an fdatasync (the syncer's, or a Commit's).
  bool unsynced() const { return synced_.load() != written_.load(); }
  uint64_t records() const { return records_.load(std::memory_order_relaxed); }  // appended since open
  // kSync with writes not yet synced: a reply that acknowledges a change waits until synced() reaches written()
  // as it was when the reply was ready (the loop holds it; the syncer fdatasyncs at once and calls on_synced).
  // Always false for kInterval, whose replies leave at once.
  bool holds_replies() const { return options_.durability == Durability::kSync && unsynced(); }
  // Writes since open, and how many of them (the first ones) an fdatasync has covered.
  uint64_t written() const { return written_.load(); }
  uint64_t synced() const { return synced_.load(); }
  // Called by the syncer's thread after each fdatasync of a kSync table, and after a failed one (the serving loop
  // wakes up to send, or refuse, the replies it held). Empty: none. Set before serving and unset before the callee
  // goes.
  void SetOnSynced(std::function<void()> on_synced) EXCLUDES(wake_mu_);
  // fdatasync now, on the calling thread (the loop's, at its end; a restored item's; tests). False (the table
  // failed: failed(), failure()) when it cannot.
  bool Commit();
  // Compaction while serving (see "Compaction"); the loop calls it between turns. Finishes a compaction whose
  // snapshot is written, or starts one when the log is over compact_min_bytes and twice its items' records (their
  // bytes included) and no item is held.
  void MaybeCompact();

  DiskTableStats Stats() const;

 private:
  struct Segment;  // a segment's read-only descriptor (readers_)
  void Open();
  // Rewrites `items` (sorted by insertion number; their bytes read from where `refs` say, or from `bytes`
  // where not null) and `epochs` into the segment being written, points `refs` at the new records, and deletes
  // the segments before it (see "Compaction" above).
  void Compact(const std::vector<RestoredItem>& items, std::vector<ItemRef>* refs,
               const std::vector<const std::string*>& bytes, const std::set<uint32_t>& epochs);
  void RemoveSnapshotsBefore(uint64_t segment);
  void RemoveSegmentsBefore(uint64_t segment);       // the log's, and their descriptors
  std::string SnapshotPath(uint64_t segment) const;  // index-<16 hex digits>.snap
  // LogItem: an INSERT record; returns where its item's bytes lie. LogInserts: a new batch's, at `planned`.
  LogPosition LogItem(Key key, uint64_t seq, double priority, const uint8_t* data, size_t size);
  void LogInserts(const Key* keys, uint64_t first_seq, const double* priorities, const uint8_t* const* data,
                  const uint64_t* sizes, size_t n);
  // Reads an item's bytes into `out` (ref->size bytes), checking its record; false when the record there is not
  // the item's (yet), IoError when the segment cannot be read. `file`: the segment last read (kept for the next
  // item of a batch; replaced when the item lies in another).
  bool TryRead(Key key, const ItemRef& ref, uint8_t* out, std::shared_ptr<Segment>* file) const;
  // The item's record from the log tail cache (`cached`, a view of it), checked as TryRead checks; false when
  // the cache does not hold it whole, or what it holds there is not the item's record.
  static bool TryCached(Key key, const ItemRef& ref, uint8_t* out, const LogTailCache::Reader& cached);
  // ReadItems (cached_only false) or ReadCached.
  bool ReadBatch(SampleResult* batch, bool cached_only) const;
  // TryCached, then TryRead, waiting a little, else IoError. Counts a hit or a miss in `hits` / `misses`.
  void Read(Key key, const ItemRef& ref, uint8_t* out, std::shared_ptr<Segment>* file,
            const LogTailCache::Reader& cached, uint64_t* hits, uint64_t* misses) const;
  // Fills the cache from the end of the log's earlier segments, from segment `oldest` on (the oldest a live
  // item lies in), oldest bytes first, up to its capacity: a reopened table's newest items are read from memory
  // at once. Best effort: a read that fails stops it (the items are then read from the files).
  void WarmCache(uint64_t oldest);
  void CountCacheReads(uint64_t hits, uint64_t misses) const;  // into Stats()' cache_hits / cache_misses
  std::shared_ptr<Segment> SegmentFile(uint64_t segment) const EXCLUDES(readers_mu_);
  // Append, counted (a body in two parts: `head`, then `tail`).
  LogPosition Write(uint8_t type, const void* head, size_t head_size, const void* tail = nullptr, size_t tail_size = 0);
  void AppendRemovals();  // pending_ and removed_, as one ERASE record
  void Flush();
  // Runs `append` (Write calls), then writes the buffer; on a failure nothing of it is on disk (TableLog cut
  // back), the removals it carried wait in pending_ for the next write, and the IoError goes on.
  template <typename Append>
  void WriteAll(Append append) {
    try {
      append();
      Flush();
    } catch (const IoError&) {
      write_errors_.fetch_add(1, std::memory_order_relaxed);
      pending_.insert(pending_.begin(), erasing_.begin(), erasing_.end());
      erasing_.clear();
      throw;
    }
  }
  void CheckUsable() const;  // IoError once the table failed
  void Fail(const std::string& why) EXCLUDES(failure_mu_);
  void Written() EXCLUDES(fd_mu_, wake_mu_);  // after a write: counts it and wakes the syncer
  void Syncer() EXCLUDES(fd_mu_, wake_mu_);   // the syncer's thread
  void RaiseSynced(uint64_t covered);         // synced_ to `covered`, unless it is past it already

  StoreConfig config_;
  DiskTableOptions options_;
  std::unique_ptr<LogTailCache> cache_;  // before log_, which appends to it until it is gone
  std::unique_ptr<TableLog> log_;
  std::shared_ptr<ShardedStore> store_;
  DiskTableOpened opened_;
  std::vector<Key> removed_;  // the store's removal sink
  std::vector<Key> pending_;  // removals whose ERASE record a failed write dropped
  std::vector<Key> erasing_;  // the removals in the buffer now (pending_ again if the write fails)
  std::vector<uint8_t> scratch_;
  std::vector<ItemRef> planned_;  // Insert: the batch's ItemRefs, and the store's view of them
  std::vector<const uint8_t*> planned_ptrs_;
  std::vector<uint64_t> planned_sizes_;
  // Read-only descriptors of the segments, opened when first read (at most kOpenSegments at once).
  mutable Mutex readers_mu_;
  mutable std::map<uint64_t, std::shared_ptr<Segment>> readers_ GUARDED_BY(readers_mu_);
  mutable Mutex failure_mu_;
  std::string failure_ GUARDED_BY(failure_mu_);
  std::atomic<bool> failed_{false};
  std::atomic<bool> failure_told_{false};
  // The syncer fdatasyncs sync_fd_ (a dup of the segment being written, swapped by the loop when a new segment
  // starts) while the loop goes on writing; `written_` counts writes, `synced_` the count it (or a Commit)
  // covered.
  Mutex fd_mu_;
  int sync_fd_ GUARDED_BY(fd_mu_) = -1;
  bool sync_dir_ GUARDED_BY(fd_mu_) = false;  // a new segment: its directory entry too
  uint64_t fd_segment_ = 0;                   // loop thread: the segment sync_fd_ is of
  Mutex wake_mu_;
  CondVar wake_cv_;
  bool stop_ GUARDED_BY(wake_mu_) = false;
  std::function<void()> on_synced_ GUARDED_BY(wake_mu_);
  std::atomic<bool> idle_{false};
  std::atomic<uint64_t> written_{0}, synced_{0};
  std::thread syncer_;
  // Compaction while serving: the bytes a reopening would replay, the epochs of every life, and the thread that
  // writes the snapshot (compact_error_ is its, until compact_done_).
  uint64_t log_bytes_ = 0;
  uint64_t next_check_ = 0;  // log_bytes_ at which MaybeCompact reads the store's totals again
  // The bodies of the INSERT records written since open, and their count: the mean item's bytes, which MaybeCompact
  // takes for every live item's (the store holds ItemRefs, not the items' sizes).
  uint64_t item_body_bytes_ = 0, item_records_ = 0;
  std::set<uint32_t> epochs_;
  uint64_t compact_segment_ = 0;
  uint64_t compact_oldest_ = 0;  // the oldest segment an item's bytes lay in when the snapshot was written
  std::thread compactor_;
  std::atomic<bool> compact_done_{false};
  std::string compact_error_;
  std::atomic<uint64_t> compactions_{0}, compact_errors_{0};
  std::atomic<uint64_t> records_{0}, bytes_{0}, syncs_{0}, write_errors_{0}, restored_{0};
  mutable std::atomic<uint64_t> cache_hits_{0}, cache_misses_{0};
};

const char* DurabilityName(Durability d);
// "sync" or "interval"; InvalidArgument naming both otherwise.
Durability ParseDurability(const std::string& name);

}  // namespace apexrl

#endif  // APEXRL_DISK_TABLE_H_
