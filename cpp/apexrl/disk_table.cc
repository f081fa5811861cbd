#include "apexrl/disk_table.h"

#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "apexrl/crc32c.h"
#include "apexrl/errors.h"

namespace apexrl {

namespace {

constexpr size_t kInsertHead = 24;  // key, insertion number, priority

template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// An item as the replay knows it: where its bytes lie in the log.
struct LoggedItem {
  uint64_t seq;
  double priority;
  LogPosition at;
  uint32_t size;
  const std::string* bytes = nullptr;  // an item of the compaction snapshot: its bytes (else at the log's `at`)
};

constexpr char kIndexPrefix[] = "index-";    // a compaction snapshot of the index (items' ItemRefs)
constexpr char kBytesPrefix[] = "compact-";  // one of an earlier build: the items' bytes
constexpr char kSnapshotSuffix[] = ".snap";
constexpr size_t kOpenSegments = 64;  // read-only segment descriptors kept open at once

struct SnapshotFile {
  uint64_t segment;  // the number of the segment its log continues with
  bool index;        // kIndexPrefix (else kBytesPrefix)
};

std::string SnapshotName(const char* prefix, uint64_t segment) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%016llx%s", prefix, static_cast<unsigned long long>(segment), kSnapshotSuffix);
  return name;
}

// The compaction snapshots in `dir`, oldest first.
std::vector<SnapshotFile> Snapshots(const std::string& dir) {
  std::vector<SnapshotFile> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    for (const char* prefix : {kIndexPrefix, kBytesPrefix}) {
      const size_t n = std::strlen(prefix), suffix = sizeof(kSnapshotSuffix) - 1;
      if (name.size() != n + 16 + suffix || name.compare(0, n, prefix) != 0 ||
          name.compare(n + 16, suffix, kSnapshotSuffix) != 0) {
        continue;
      }
      out.push_back(SnapshotFile{std::stoull(name.substr(n, 16), nullptr, 16), prefix == kIndexPrefix});
    }
  }
  std::sort(out.begin(), out.end(), [](const SnapshotFile& a, const SnapshotFile& b) {
    return a.segment != b.segment ? a.segment < b.segment : a.index < b.index;
  });
  return out;
}

ItemRef RefOf(const uint8_t* bytes, size_t size) {
  if (size != sizeof(ItemRef)) {
    throw IoError("a disk table's item is held as " + std::to_string(size) + " bytes, not a " +
                  std::to_string(sizeof(ItemRef)) + "-byte reference into its log");
  }
  ItemRef r;
  std::memcpy(&r, bytes, sizeof r);
  return r;
}

}  // namespace

const char* DurabilityName(Durability d) { return d == Durability::kSync ? "sync" : "interval"; }

Durability ParseDurability(const std::string& name) {
  if (name == "sync") return Durability::kSync;
  if (name == "interval") return Durability::kInterval;
  throw InvalidArgument("durability must be 'sync' or 'interval', got '" + name + "'");
}

DiskTable::DiskTable(StoreConfig config, DiskTableOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  if (!(options_.interval_s > 0)) throw InvalidArgument("a disk table's sync interval must be > 0 seconds");
  Open();
}

struct DiskTable::Segment {
  Segment(uint64_t n, int descriptor) : number(n), fd(descriptor) {}
  ~Segment() { ::close(fd); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  const uint64_t number;
  const int fd;
};

std::string DiskTable::SnapshotPath(uint64_t segment) const {
  return options_.path + "/" + SnapshotName(kIndexPrefix, segment);
}

void DiskTable::Open() {
  std::unordered_map<Key, LoggedItem> items;
  std::set<uint32_t>& epochs = epochs_;
  uint64_t records = 0;
  const std::string where = "disk table log '" + options_.path + "'";
  auto bad = [&where](const std::string& what) { return InvalidArgument(where + ": " + what); };
  // The newest compaction snapshot holds the items as of its segment's start, or later (see "Compaction").
  std::vector<Shard::Contents> base;
  uint64_t base_segment = 0;
  bool base_index = true;  // the snapshot holds ItemRefs (else the items' bytes: an earlier build's)
  if (::access(options_.path.c_str(), F_OK) == 0) {
    const std::vector<SnapshotFile> snapshots = Snapshots(options_.path);
    if (!snapshots.empty()) {
      base_segment = snapshots.back().segment;
      base_index = snapshots.back().index;
      const std::string path =
          options_.path + "/" + SnapshotName(base_index ? kIndexPrefix : kBytesPrefix, base_segment);
      try {
        const uint32_t saved = ShardedStore::SnapshotEpoch(path);
        std::unique_ptr<ShardedStore> snap = ShardedStore::Load(path, NextEpoch(saved));
        if (snap->config().shards != config_.shards) {
          throw bad("snapshot " + path + " has " + std::to_string(snap->config().shards) +
                    " shards; this table is configured with " + std::to_string(config_.shards));
        }
        base = snap->Dump();
        epochs.insert(saved);
      } catch (const SnapshotError& e) {
        throw IoError(where + ": its compaction snapshot cannot be read (" + e.what() +
                      "); the records it replaced are gone, so the table does not open without it");
      }
      for (const Shard::Contents& c : base) {
        for (size_t i = 0; i < c.keys.size(); ++i) {
          if (!base_index) {
            items[c.keys[i]] = LoggedItem{c.seqs[i], c.priorities[i], LogPosition{},
                                          static_cast<uint32_t>(c.items[i].size()), &c.items[i]};
            continue;
          }
          ItemRef r;
          try {
            r = RefOf(reinterpret_cast<const uint8_t*>(c.items[i].data()), c.items[i].size());
          } catch (const IoError& e) {
            throw bad("snapshot " + path + ": " + e.what());
          }
          items[c.keys[i]] = LoggedItem{c.seqs[i], c.priorities[i], LogPosition{r.segment, r.offset}, r.size};
        }
      }
    }
  }
  auto visit = [&](uint8_t type, const uint8_t* body, size_t size, LogPosition at) {
    if (at.segment < base_segment) return;  // the snapshot holds what these records left
    ++records;
    switch (type) {
      case kOpen: {
        if (size != 8) throw bad("an OPEN record of " + std::to_string(size) + " bytes");
        const uint32_t shards = Get<uint32_t>(body + 4);
        if (shards != config_.shards) {
          throw bad("written by a table of " + std::to_string(shards) + " shards; this one is configured with " +
                    std::to_string(config_.shards) +
                    " (keys name their shard: open it with shards=" + std::to_string(shards) + ")");
        }
        epochs.insert(Get<uint32_t>(body));
        ++opened_.lives;
        break;
      }
      case kInsert: {
        if (size < kInsertHead) throw bad("an INSERT record of " + std::to_string(size) + " bytes");
        const Key key = Get<uint64_t>(body);
        items[key] =
            LoggedItem{Get<uint64_t>(body + 8), Get<double>(body + 16),
                       LogPosition{at.segment, at.offset + kInsertHead}, static_cast<uint32_t>(size - kInsertHead)};
        break;
      }
      case kUpdate: {
        if (size % 16 != 0) throw bad("an UPDATE record of " + std::to_string(size) + " bytes");
        for (size_t i = 0; i < size; i += 16) {
          auto it = items.find(Get<uint64_t>(body + i));
          if (it != items.end()) it->second.priority = Get<double>(body + i + 8);
        }
        break;
      }
      case kErase: {
        if (size % 8 != 0) throw bad("an ERASE record of " + std::to_string(size) + " bytes");
        for (size_t i = 0; i < size; i += 8) items.erase(Get<uint64_t>(body + i));
        break;
      }
      case kClear:
        items.clear();
        break;
      case kEpochs: {
        if (size % 4 != 0) throw bad("an EPOCHS record of " + std::to_string(size) + " bytes");
        for (size_t i = 0; i < size; i += 4) epochs.insert(Get<uint32_t>(body + i));
        break;
      }
      default:
        throw bad("a record of unknown type " + std::to_string(type) + " (written by a newer apexrl?)");
    }
  };
  log_ = std::make_unique<TableLog>(options_.path, options_.log, visit);
  if (options_.cache_bytes > 0) {  // nothing written to the new segment yet: what follows is in order
    cache_ = std::make_unique<LogTailCache>(options_.cache_bytes);
    log_->MirrorTo(cache_.get());
  }
  opened_.records = records;
  opened_.log = log_->recovery();
  // A new life's keys must not repeat an earlier life's: its epoch is one no life of the log used.
  uint32_t epoch = config_.epoch;
  for (size_t tries = 0; epochs.count(epoch) != 0 && tries < kMaxEpoch; ++tries) epoch = NextEpoch(epoch);
  config_.epoch = epoch;
  opened_.epoch = epoch;
  // An item whose bytes lie beyond what the recovery kept (a snapshot's item, in a segment cut short) is dropped.
  std::map<uint64_t, uint64_t> kept;  // segment -> its bytes
  for (uint64_t n : log_->segments()) {
    kept[n] = std::filesystem::file_size(options_.path + "/" + TableLog::SegmentName(n));
  }
  std::vector<RestoredItem> restored;
  std::vector<ItemRef> refs;
  std::vector<const std::string*> bytes;  // an earlier build's snapshot: the item's bytes (else null)
  restored.reserve(items.size());
  refs.reserve(items.size());
  bytes.reserve(items.size());
  bool rewrite = false;  // items' bytes only in an earlier build's snapshot: into the log they go, now
  uint64_t oldest = std::numeric_limits<uint64_t>::max(), live_bytes = 0;
  for (const auto& [key, item] : items) {
    if (item.bytes == nullptr) {
      const auto seg = kept.find(item.at.segment);
      if (seg == kept.end() || item.at.offset < kLogHeaderBytes + kLogRecordHeaderBytes + kInsertHead ||
          item.at.offset + item.size > seg->second) {
        ++opened_.dropped_items;
        continue;
      }
      oldest = std::min(oldest, item.at.segment);
    } else {
      rewrite = true;
    }
    restored.push_back(RestoredItem{key, item.seq, item.priority, nullptr, sizeof(ItemRef)});
    refs.push_back(ItemRef{static_cast<uint32_t>(item.at.segment), item.size, item.at.offset});
    bytes.push_back(item.bytes);
    live_bytes += kLogRecordHeaderBytes + kInsertHead + item.size;
  }
  if (opened_.dropped_items != 0) {
    opened_.log.reason += std::string(opened_.log.reason.empty() ? "" : "; ") + std::to_string(opened_.dropped_items) +
                          " items of the compaction snapshot lay in what was dropped";
  }
  uint64_t log_bytes = 0;
  for (const auto& [n, size] : kept) {
    if (n != log_->segment() && n >= base_segment) log_bytes += size;
  }
  log_bytes_ = log_bytes;
  if (rewrite || (log_bytes > options_.compact_min_bytes && log_bytes > 2 * live_bytes)) {
    std::vector<size_t> order(restored.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return restored[a].seq < restored[b].seq; });
    std::vector<RestoredItem> r2;
    std::vector<ItemRef> refs2;
    std::vector<const std::string*> bytes2;
    for (size_t i : order) {
      r2.push_back(restored[i]);
      refs2.push_back(refs[i]);
      bytes2.push_back(bytes[i]);
    }
    restored.swap(r2);
    refs.swap(refs2);
    Compact(restored, &refs, bytes2, epochs);
    opened_.compacted_bytes = log_bytes;
    log_bytes_ = 0;
  } else {
    if (base_segment != 0) {  // a compaction that wrote its snapshot and stopped before deleting what it replaced
      RemoveSnapshotsBefore(base_segment);
      RemoveSegmentsBefore(std::min(base_segment, oldest));
    }
    if (!restored.empty()) WarmCache(oldest);  // (a compaction above wrote the items again, through the cache)
  }
  for (size_t i = 0; i < restored.size(); ++i) restored[i].data = reinterpret_cast<const uint8_t*>(&refs[i]);
  store_ = std::make_shared<ShardedStore>(config_);
  try {
    store_->Restore(restored);
  } catch (const InvalidArgument& e) {
    throw bad(e.what());
  }
  opened_.items = store_->Size();
  for (const ItemRef& r : refs) opened_.item_bytes += r.size;
  base.clear();
  std::unordered_map<Key, LoggedItem>().swap(items);
  restored = std::vector<RestoredItem>();
  refs = std::vector<ItemRef>();
#if defined(__GLIBC__)
  malloc_trim(0);  // the replay's key -> item map, about as large as the index, goes back to the system
#endif
  epochs.insert(epoch);
  store_->ReportRemovals(&removed_);
  std::vector<uint8_t> body;
  Put<uint32_t>(&body, epoch);
  Put<uint32_t>(&body, config_.shards);
  Write(kOpen, body.data(), body.size());
  log_->Sync();
  syncs_.fetch_add(1, std::memory_order_relaxed);
  {
    ScopedLock lock(fd_mu_);
    sync_fd_ = ::dup(log_->fd());
    if (sync_fd_ < 0) throw IoError(std::string("cannot duplicate the log's descriptor: ") + std::strerror(errno));
  }
  fd_segment_ = log_->segment();
  syncer_ = std::thread([this] { Syncer(); });
}

DiskTable::~DiskTable() {
  if (compactor_.joinable()) compactor_.join();
  if (!syncer_.joinable()) return;
  {
    ScopedLock lock(wake_mu_);
    stop_ = true;
  }
  wake_cv_.NotifyAll();
  syncer_.join();
  if (!failed() && written_.load() != synced_.load()) {
    try {
      log_->Sync();
    } catch (const IoError&) {  // at exit: the next opening finds the log as far as it got
    }
  }
  ScopedLock lock(fd_mu_);
  if (sync_fd_ >= 0) ::close(sync_fd_);
}

void DiskTable::Written() {
  if (log_->segment() != fd_segment_) {  // a new segment (the log synced the one before when it closed it)
    ScopedLock lock(fd_mu_);
    if (sync_fd_ >= 0) ::close(sync_fd_);
    sync_fd_ = ::dup(log_->fd());
    sync_dir_ = true;
    fd_segment_ = log_->segment();
  }
  written_.fetch_add(1);
  if (idle_.load()) {  // seq_cst with the syncer's idle_ store and recheck: one of the two sees the other
    ScopedLock lock(wake_mu_);
    wake_cv_.NotifyOne();
  }
}

void DiskTable::Syncer() {
  // kSync: at once (the writes' replies wait for it); kInterval: at most one fdatasync an interval.
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.durability == Durability::kSync ? 0.0 : options_.interval_s));
  auto last = std::chrono::steady_clock::now() - interval;
  while (true) {
    {
      ScopedLock lock(wake_mu_);
      while (!stop_ && written_.load() == synced_.load()) {
        idle_.store(true);
        if (written_.load() != synced_.load()) break;  // a write that did not see idle_
        wake_cv_.Wait(wake_mu_);
      }
      idle_.store(false);
      const auto next = last + interval;  // at most one fdatasync an interval
      while (!stop_ && std::chrono::steady_clock::now() < next) wake_cv_.WaitUntil(wake_mu_, next);
      if (stop_) return;
    }
    const uint64_t covered = written_.load();
    std::string error;
    {
      ScopedLock lock(fd_mu_);
      if (::fdatasync(sync_fd_) != 0) {
        error =
            std::string("cannot sync log segment ") + TableLog::SegmentName(fd_segment_) + ": " + std::strerror(errno);
      } else if (sync_dir_) {
        const int dir = ::open(options_.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0 || ::fsync(dir) != 0) {
          error = "cannot sync the log directory '" + options_.path + "': " + std::strerror(errno);
        } else {
          sync_dir_ = false;
        }
        if (dir >= 0) ::close(dir);
      }
    }
    last = std::chrono::steady_clock::now();
    if (error.empty()) {
      RaiseSynced(covered);
      syncs_.fetch_add(1, std::memory_order_relaxed);
    } else {
      Fail(error);
    }
    // The replies held for these writes (kSync) may leave, or be answered as failed; an interval table's loop has
    // none to send, so it is woken for a failure only.
    if (options_.durability == Durability::kSync || !error.empty()) {
      ScopedLock lock(wake_mu_);
      if (on_synced_) on_synced_();
    }
    if (!error.empty()) return;
  }
}

void DiskTable::RaiseSynced(uint64_t covered) {
  uint64_t was = synced_.load();
  while (was < covered && !synced_.compare_exchange_weak(was, covered)) {
  }
}

void DiskTable::SetOnSynced(std::function<void()> on_synced) {
  ScopedLock lock(wake_mu_);
  on_synced_ = std::move(on_synced);
}

void DiskTable::Fail(const std::string& why) {
  {
    ScopedLock lock(failure_mu_);
    if (failed()) return;
    failure_ = why;
  }
  failed_.store(true, std::memory_order_release);
}

std::string DiskTable::failure() const {
  ScopedLock lock(failure_mu_);
  return failure_;
}

void DiskTable::Compact(const std::vector<RestoredItem>& items, std::vector<ItemRef>* refs,
                        const std::vector<const std::string*>& bytes, const std::set<uint32_t>& epochs) {
  const uint64_t first = log_->segment();
  const std::vector<uint32_t> all(epochs.begin(), epochs.end());
  if (!all.empty()) Write(kEpochs, all.data(), all.size() * sizeof(uint32_t));
  std::vector<uint8_t> data;
  std::shared_ptr<Segment> file;
  for (size_t i = 0; i < items.size(); ++i) {
    ItemRef& ref = (*refs)[i];
    const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes[i] != nullptr ? bytes[i]->data() : nullptr);
    if (bytes[i] == nullptr) {
      data.resize(ref.size);
      uint64_t hits = 0, misses = 0;  // not a SAMPLE's: not counted
      Read(items[i].key, ref, data.data(), &file, LogTailCache::Reader(), &hits, &misses);
      p = data.data();
    }
    const LogPosition at = LogItem(items[i].key, items[i].seq, items[i].priority, p, ref.size);
    ref.segment = static_cast<uint32_t>(at.segment);
    ref.offset = at.offset;
    if (log_->buffered_bytes() > (8u << 20)) log_->Flush();  // a table larger than memory is not buffered whole
  }
  log_->Sync();                  // the rewrite is whole on disk before any old record goes
  RemoveSnapshotsBefore(first);  // before the segments: a snapshot never outlives the records after it
  RemoveSegmentsBefore(first);
}

void DiskTable::RemoveSnapshotsBefore(uint64_t segment) {
  for (const SnapshotFile& f : Snapshots(options_.path)) {
    if (f.segment < segment || !f.index) {  // an earlier build's snapshot: its items are in the log by now
      ::unlink((options_.path + "/" + SnapshotName(f.index ? kIndexPrefix : kBytesPrefix, f.segment)).c_str());
    }
  }
}

void DiskTable::RemoveSegmentsBefore(uint64_t segment) {
  log_->RemoveSegmentsBefore(segment);
  ScopedLock lock(readers_mu_);
  readers_.erase(readers_.begin(), readers_.lower_bound(segment));
}

std::shared_ptr<DiskTable::Segment> DiskTable::SegmentFile(uint64_t segment) const {
  ScopedLock lock(readers_mu_);
  auto it = readers_.find(segment);
  if (it != readers_.end()) return it->second;
  const std::string path = options_.path + "/" + TableLog::SegmentName(segment);
  // O_NOATIME: a read would otherwise update the inode's access time (relatime does, the file being written).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOATIME);
  if (fd < 0 && errno == EPERM) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // not the file's owner
  if (fd < 0) {
    throw IoError("cannot open log segment '" + path + "' to read an item: " + std::strerror(errno) +
                  (errno == ENOENT ? " (its items were removed while being read)" : ""));
  }
  auto file = std::make_shared<Segment>(segment, fd);
  if (readers_.size() >= kOpenSegments) readers_.erase(readers_.begin());  // a reader still using it keeps it open
  readers_.emplace(segment, file);
  return file;
}

namespace {

// Whether `head` (an INSERT record's header and head) and `body` (ref.size bytes) are item `key`'s record: its
// type, size and key, and with `checksum` its CRC too. Bytes read from a file are checked whole (the disk, or a
// torn or cut-back write, may have changed them); the log tail cache's are a copy this process made of what it
// wrote, never read back from a file, so its header alone says whether the record there is the item's (a
// checksum over every sampled byte cost the serving loop about 4 % of its time under the Ape-X mix).
bool IsItsRecord(Key key, const ItemRef& ref, const uint8_t* head, const uint8_t* body, bool checksum) {
  constexpr size_t kHead = kLogRecordHeaderBytes + kInsertHead;
  const uint32_t crc = Get<uint32_t>(head), size = Get<uint32_t>(head + 4);
  if (size != kInsertHead + ref.size || head[8] != DiskTable::kInsert ||
      Get<uint64_t>(head + kLogRecordHeaderBytes) != key) {
    return false;
  }
  return !checksum || Crc32cExtend(Crc32cExtend(0, head + 4, kHead - 4), body, ref.size) == crc;
}

}  // namespace

bool DiskTable::TryRead(Key key, const ItemRef& ref, uint8_t* out, std::shared_ptr<Segment>* file) const {
  constexpr size_t kHead = kLogRecordHeaderBytes + kInsertHead;
  if (ref.offset < kHead) return false;
  if (!*file || (*file)->number != ref.segment) *file = SegmentFile(ref.segment);
  uint8_t head[kHead];
  iovec iov[2] = {{head, kHead}, {out, ref.size}};
  const size_t want = kHead + ref.size;
  ssize_t n;
  do {
    n = ::preadv((*file)->fd, iov, 2, static_cast<off_t>(ref.offset - kHead));
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    throw IoError("cannot read log segment " + TableLog::SegmentName(ref.segment) + ": " + std::strerror(errno));
  }
  if (static_cast<size_t>(n) < want) return false;  // not written yet, or cut back
  return IsItsRecord(key, ref, head, out, /*checksum=*/true);
}

bool DiskTable::TryCached(Key key, const ItemRef& ref, uint8_t* out, const LogTailCache::Reader& cached) {
  constexpr size_t kHead = kLogRecordHeaderBytes + kInsertHead;
  if (cached.empty() || ref.offset < kHead) return false;
  uint8_t head[kHead];
  return cached.Read(ref.segment, ref.offset - kHead, kHead, head) &&
         cached.Read(ref.segment, ref.offset, ref.size, out) && IsItsRecord(key, ref, head, out, /*checksum=*/false);
}

void DiskTable::Read(Key key, const ItemRef& ref, uint8_t* out, std::shared_ptr<Segment>* file,
                     const LogTailCache::Reader& cached, uint64_t* hits, uint64_t* misses) const {
  if (TryCached(key, ref, out, cached)) {
    ++*hits;
    return;
  }
  ++*misses;
  if (TryRead(key, ref, out, file)) return;
  // The loop writes an INSERT's records right after its items enter the store: a reader may be between the two.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.read_wait_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (TryRead(key, ref, out, file)) return;
  }
  char what[160];
  std::snprintf(what, sizeof what,
                "item %#llx: the record at %s byte %llu is not its own (corrupt, or its insert "
                "was refused)",
                static_cast<unsigned long long>(key), TableLog::SegmentName(ref.segment).c_str(),
                static_cast<unsigned long long>(ref.offset));
  throw IoError(what);
}

void DiskTable::ReadItems(SampleResult* batch) const { ReadBatch(batch, /*cached_only=*/false); }

bool DiskTable::ReadCached(SampleResult* batch) const { return cache_ != nullptr && ReadBatch(batch, true); }

bool DiskTable::ReadBatch(SampleResult* batch, bool cached_only) const {
  const size_t n = batch->keys.size();
  thread_local std::vector<ItemRef> refs;
  refs.resize(n);
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    refs[i] = RefOf(batch->data.data() + batch->offsets[i], batch->offsets[i + 1] - batch->offsets[i]);
    total += refs[i].size;
  }
  batch->data.clear();
  uint8_t* out = batch->data.Extend(total);
  uint64_t at = 0, hits = 0, misses = 0;
  std::shared_ptr<Segment> file;  // the last one read, while the next item is in it too
  const LogTailCache::Reader cached = cache_ != nullptr ? cache_->Snapshot() : LogTailCache::Reader();
  // Where each item's record lies in the cache (null: not whole in one block), so that the next items' bytes
  // are fetched from memory (prefetched) while one is copied: a batch's items lie all over the cache, and a copy
  // that waits for each cache line in turn costs several times one that finds them on their way.
  constexpr size_t kHead = kLogRecordHeaderBytes + kInsertHead, kAhead = 4, kPrefetchBytes = 1024;
  thread_local std::vector<const uint8_t*> where;
  where.assign(n, nullptr);
  if (!cached.empty()) {
    for (size_t i = 0; i < n; ++i) {
      if (refs[i].offset < kHead) continue;
      where[i] = cached.Find(refs[i].segment, refs[i].offset - kHead, kHead + refs[i].size);
      if (where[i] != nullptr) __builtin_prefetch(where[i]);  // every record's first line on its way (Shard::CopyOut)
    }
  }
  auto prefetch = [&](size_t i) {
    if (i >= n || where[i] == nullptr) return;
    const size_t bytes = std::min<size_t>(kHead + refs[i].size, kPrefetchBytes);
    for (size_t b = 64; b < bytes; b += 64) __builtin_prefetch(where[i] + b);
  };
  auto from_cache = [&](size_t i, uint8_t* to) {
    if (where[i] == nullptr) return false;
    std::memcpy(to, where[i] + kHead, refs[i].size);
    return IsItsRecord(batch->keys[i], refs[i], where[i], to, /*checksum=*/false);
  };
  for (size_t i = 0; i < kAhead; ++i) prefetch(i);
  try {
    for (size_t i = 0; i < n; ++i) {
      prefetch(i + kAhead);
      if (from_cache(i, out + at)) {
        ++hits;
      } else if (!cached_only) {
        Read(batch->keys[i], refs[i], out + at, &file, cached, &hits, &misses);
      } else if (TryCached(batch->keys[i], refs[i], out + at, cached)) {
        ++hits;
      } else {  // the batch as it was drawn, for a read that may go to the files (its hits counted then)
        batch->data.clear();
        std::memcpy(batch->data.Extend(n * sizeof(ItemRef)), refs.data(), n * sizeof(ItemRef));
        for (size_t k = 0; k <= n; ++k) batch->offsets[k] = k * sizeof(ItemRef);
        return false;
      }
      batch->offsets[i] = at;
      at += refs[i].size;
    }
  } catch (...) {
    CountCacheReads(hits, misses);
    throw;
  }
  CountCacheReads(hits, misses);
  batch->offsets[n] = at;
  return true;
}

std::string DiskTable::ReadItem(Key key, const uint8_t* ref, size_t ref_size) const {
  const ItemRef r = RefOf(ref, ref_size);
  std::string out(r.size, '\0');
  std::shared_ptr<Segment> file;
  uint64_t hits = 0, misses = 0;
  const LogTailCache::Reader cached = cache_ != nullptr ? cache_->Snapshot() : LogTailCache::Reader();
  Read(key, r, reinterpret_cast<uint8_t*>(out.data()), &file, cached, &hits, &misses);
  CountCacheReads(hits, misses);
  return out;
}

void DiskTable::CountCacheReads(uint64_t hits, uint64_t misses) const {
  cache_hits_.fetch_add(hits, std::memory_order_relaxed);
  cache_misses_.fetch_add(misses, std::memory_order_relaxed);
}

void DiskTable::WarmCache(uint64_t oldest) {
  if (cache_ == nullptr) return;
  // From the newest earlier segment back, the bytes that fit: [from_segment at from_offset, the end).
  std::vector<std::pair<uint64_t, uint64_t>> segments;  // (number, bytes), oldest first
  for (uint64_t n : log_->segments()) {
    if (n < oldest || n >= log_->segment()) continue;
    std::error_code error;
    const uint64_t size = std::filesystem::file_size(options_.path + "/" + TableLog::SegmentName(n), error);
    if (error) return;  // (the reads will find out)
    segments.emplace_back(n, size);
  }
  uint64_t room = cache_->capacity();
  size_t first = segments.size();
  uint64_t from_offset = kLogHeaderBytes;
  while (first > 0 && room > 0) {
    const auto& [n, size] = segments[first - 1];
    const uint64_t body = size > kLogHeaderBytes ? size - kLogHeaderBytes : 0;
    --first;
    if (body >= room) {
      from_offset = size - room;
      break;
    }
    room -= body;
    from_offset = kLogHeaderBytes;
  }
  std::vector<uint8_t> buffer(std::min<uint64_t>(cache_->block_bytes(), 4u << 20));
  for (size_t i = first; i < segments.size(); ++i) {
    const auto& [n, size] = segments[i];
    uint64_t at = i == first ? from_offset : kLogHeaderBytes;
    std::shared_ptr<Segment> file;
    try {
      file = SegmentFile(n);
    } catch (const IoError&) {
      return;
    }
    while (at < size) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), size - at));
      const ssize_t got = ::pread(file->fd, buffer.data(), want, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return;
      cache_->Append(n, at, buffer.data(), static_cast<size_t>(got));
      at += static_cast<uint64_t>(got);
    }
  }
}

void DiskTable::MaybeCompact() {
  if (compactor_.joinable()) {
    if (!compact_done_.load(std::memory_order_acquire)) return;
    compactor_.join();
    if (!compact_error_.empty()) {  // the segments stay; a later compaction tries again
      compact_errors_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    try {
      RemoveSnapshotsBefore(compact_segment_);
      RemoveSegmentsBefore(std::min(compact_segment_, compact_oldest_));  // an old live item's segment stays
      compactions_.fetch_add(1, std::memory_order_relaxed);
    } catch (const IoError&) {  // left for the next compaction; the snapshot and the records agree meanwhile
      compact_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  if (failed() || log_bytes_ < options_.compact_min_bytes || log_bytes_ < next_check_) return;
  next_check_ = log_bytes_ + options_.compact_min_bytes / 4;  // the store's totals read now and then, not per turn
  // Twice what the items left would take in a fresh log, as opening decides: the snapshot's cost (the whole
  // index) then stays a small part of the writes. Against the index alone (an earlier trigger), a table of
  // 632-byte items snapshotted its whole index 12 times in 15 s under an Ape-X load.
  const StoreStats s = store_->Stats();
  const uint64_t mean_item = item_records_ != 0   ? item_body_bytes_ / item_records_
                             : opened_.items != 0 ? opened_.item_bytes / opened_.items
                                                  : 0;
  if (log_bytes_ <= 2 * s.size * (kLogRecordHeaderBytes + kInsertHead + mean_item)) return;
  // A held item's pop must be logged after the new segment starts (the snapshot keeps held items).
  if (store_->Held() != 0) return;
  try {
    log_->Rotate();
    const std::vector<uint32_t> all(epochs_.begin(), epochs_.end());
    WriteAll([&] { Write(kEpochs, all.data(), all.size() * sizeof(uint32_t)); });
  } catch (const IoError&) {
    compact_errors_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  compact_segment_ = log_->segment();
  log_bytes_ = 0;
  next_check_ = 0;
  compact_error_.clear();
  compact_done_.store(false, std::memory_order_relaxed);
  compactor_ = std::thread([this, path = SnapshotPath(compact_segment_)] {
    try {
      store_->Save(path);  // shard by shard, each under its own lock: the loop serves on meanwhile
      uint64_t oldest = std::numeric_limits<uint64_t>::max();
      store_->ForEachItem([&oldest](const uint8_t* ref, uint32_t size) {
        if (size == sizeof(ItemRef)) oldest = std::min<uint64_t>(oldest, RefOf(ref, size).segment);
      });
      compact_oldest_ = oldest;
    } catch (const std::exception& e) {
      compact_error_ = e.what();
    }
    compact_done_.store(true, std::memory_order_release);
  });
}

LogPosition DiskTable::LogItem(Key key, uint64_t seq, double priority, const uint8_t* data, size_t size) {
  uint8_t head[kInsertHead];
  std::memcpy(head, &key, 8);
  std::memcpy(head + 8, &seq, 8);
  std::memcpy(head + 16, &priority, 8);
  const LogPosition at = Write(kInsert, head, sizeof head, data, size);
  item_body_bytes_ += size;
  ++item_records_;
  return LogPosition{at.segment, at.offset + kInsertHead};
}

void DiskTable::CheckUsable() const {
  if (failed())
    throw IoError("the table's log failed (" + failure() + "); it takes no change until the server restarts");
}

LogPosition DiskTable::Write(uint8_t type, const void* head, size_t head_size, const void* tail, size_t tail_size) {
  const LogPosition at = log_->Append(type, head, head_size, tail, tail_size);
  log_bytes_ += kLogRecordHeaderBytes + head_size + tail_size;
  records_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(kLogRecordHeaderBytes + head_size + tail_size, std::memory_order_relaxed);
  return at;
}

void DiskTable::AppendRemovals() {
  erasing_.insert(erasing_.end(), pending_.begin(), pending_.end());
  erasing_.insert(erasing_.end(), removed_.begin(), removed_.end());
  pending_.clear();
  removed_.clear();
  if (!erasing_.empty()) Write(kErase, erasing_.data(), erasing_.size() * sizeof(Key));
}

void DiskTable::Flush() {
  log_->Flush();
  erasing_.clear();
  Written();
}

void DiskTable::Insert(const double* priorities, const uint8_t* const* data, const uint64_t* sizes, size_t n,
                       Key* keys) {
  CheckUsable();
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    if (sizes[i] > kLogMaxBody - kInsertHead) {
      throw InvalidArgument("an item of " + std::to_string(sizes[i]) + " bytes is over the " +
                            std::to_string(kLogMaxBody - kInsertHead) + "-byte limit of a disk table's items");
    }
    bytes += kLogRecordHeaderBytes + kInsertHead + sizes[i];
  }
  LogPosition at;
  try {
    at = log_->Reserve(bytes);  // the batch's records in one segment, where the store's ItemRefs say
  } catch (const IoError&) {
    write_errors_.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  if (at.segment > std::numeric_limits<uint32_t>::max()) throw IoError("the log has used up its segment numbers");
  planned_.resize(n);
  planned_ptrs_.resize(n);
  planned_sizes_.assign(n, sizeof(ItemRef));
  for (size_t i = 0; i < n; ++i) {
    at.offset += kLogRecordHeaderBytes + kInsertHead;
    planned_[i] = ItemRef{static_cast<uint32_t>(at.segment), static_cast<uint32_t>(sizes[i]), at.offset};
    planned_ptrs_[i] = reinterpret_cast<const uint8_t*>(&planned_[i]);
    at.offset += sizes[i];
  }
  const uint64_t first_seq = store_->last_seq() + 1;  // the loop's thread alone inserts: numbered in order
  store_->Insert(priorities, planned_ptrs_.data(), planned_sizes_.data(), n, keys);
  try {
    LogInserts(keys, first_seq, priorities, data, sizes, n);
  } catch (const IoError&) {
    store_->Erase(keys, n);  // not on disk: not stored (evictions it made stay done)
    throw;
  }
}

void DiskTable::LogInserts(const Key* keys, uint64_t first_seq, const double* priorities, const uint8_t* const* data,
                           const uint64_t* sizes, size_t n) {
  WriteAll([&] {
    for (size_t i = 0; i < n; ++i) {
      const LogPosition at = LogItem(keys[i], first_seq + i, priorities[i], data[i], sizes[i]);
      if (at.segment != planned_[i].segment || at.offset != planned_[i].offset) {
        throw std::logic_error("a disk table's INSERT record is not where its reservation placed it");
      }
    }
    AppendRemovals();  // after the items: the max_size ceiling may have evicted some of them
  });
}

void DiskTable::LogUpdates(const Key* keys, const double* priorities, size_t n) {
  CheckUsable();
  WriteAll([&] {
    AppendRemovals();
    scratch_.resize(n * 16);
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(scratch_.data() + 16 * i, &keys[i], 8);
      std::memcpy(scratch_.data() + 16 * i + 8, &priorities[i], 8);
    }
    Write(kUpdate, scratch_.data(), scratch_.size());
  });
}

void DiskTable::LogErases(const Key* keys, size_t n) {
  CheckUsable();
  WriteAll([&] {
    AppendRemovals();
    Write(kErase, keys, n * sizeof(Key));
  });
}

void DiskTable::LogClear() {
  CheckUsable();
  WriteAll([&] {
    AppendRemovals();
    Write(kClear, nullptr, 0);
  });
}

void DiskTable::LogRemovals() {
  if ((removed_.empty() && pending_.empty()) || failed()) return;
  try {
    WriteAll([this] { AppendRemovals(); });
  } catch (const IoError&) {  // kept in pending_ for the next write
  }
}

std::string DiskTable::Restored(const Key* keys, size_t n) {
  try {
    CheckUsable();
    std::string data;
    uint64_t seq = 0;
    double priority = 0;
    uint64_t count = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!store_->Peek(keys[i], &seq, &priority, &data)) continue;
      const std::string bytes = ReadItem(keys[i], reinterpret_cast<const uint8_t*>(data.data()), data.size());
      LogItem(keys[i], seq, priority, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++count;
    }
    Flush();
    restored_.fetch_add(count, std::memory_order_relaxed);
    if (!Commit()) return failure();
    return std::string();
  } catch (const std::exception& e) {
    write_errors_.fetch_add(1, std::memory_order_relaxed);
    return e.what();
  }
}

bool DiskTable::Commit() {
  if (failed()) return false;
  const uint64_t covered = written_.load();
  try {
    log_->Sync();
  } catch (const IoError& e) {
    Fail(e.what());
    return false;
  }
  RaiseSynced(covered);
  syncs_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

DiskTableStats DiskTable::Stats() const {
  DiskTableStats s;
  s.records = records_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.syncs = syncs_.load(std::memory_order_relaxed);
  s.write_errors = write_errors_.load(std::memory_order_relaxed);
  s.restored = restored_.load(std::memory_order_relaxed);
  s.compactions = compactions_.load(std::memory_order_relaxed);
  s.compact_errors = compact_errors_.load(std::memory_order_relaxed);
  const uint64_t synced = synced_.load(), written = written_.load();  // synced_ first: never above written_
  s.unsynced_writes = written - synced;
  s.failed = failed();
  s.cache_hits = cache_hits_.load(std::memory_order_relaxed);
  s.cache_misses = cache_misses_.load(std::memory_order_relaxed);
  s.cache_bytes = cache_ != nullptr ? cache_->bytes() : 0;
  return s;
}

}  // namespace apexrl
