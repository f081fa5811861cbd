#include "apexrl/disk_table.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <unordered_map>
#include <utility>

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

constexpr char kSnapshotPrefix[] = "compact-";
constexpr char kSnapshotSuffix[] = ".snap";

// The compaction snapshots in `dir`, by the number of the segment each one's log continues with.
std::vector<uint64_t> Snapshots(const std::string& dir) {
  std::vector<uint64_t> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const size_t prefix = sizeof(kSnapshotPrefix) - 1, suffix = sizeof(kSnapshotSuffix) - 1;
    if (name.size() != prefix + 16 + suffix || name.compare(0, prefix, kSnapshotPrefix) != 0 ||
        name.compare(prefix + 16, suffix, kSnapshotSuffix) != 0) {
      continue;
    }
    out.push_back(std::stoull(name.substr(prefix, 16), nullptr, 16));
  }
  std::sort(out.begin(), out.end());
  return out;
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

std::string DiskTable::SnapshotPath(uint64_t segment) const {
  char name[64];
  std::snprintf(name, sizeof name, "%s%016llx%s", kSnapshotPrefix, static_cast<unsigned long long>(segment),
                kSnapshotSuffix);
  return options_.path + "/" + name;
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
  if (::access(options_.path.c_str(), F_OK) == 0) {
    const std::vector<uint64_t> snapshots = Snapshots(options_.path);
    if (!snapshots.empty()) {
      base_segment = snapshots.back();
      const std::string path = SnapshotPath(base_segment);
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
          items[c.keys[i]] = LoggedItem{c.seqs[i], c.priorities[i], LogPosition{},
                                        static_cast<uint32_t>(c.items[i].size()), &c.items[i]};
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
  opened_.records = records;
  opened_.log = log_->recovery();
  // A new life's keys must not repeat an earlier life's: its epoch is one no life of the log used.
  uint32_t epoch = config_.epoch;
  for (size_t tries = 0; epochs.count(epoch) != 0 && tries < kMaxEpoch; ++tries) epoch = NextEpoch(epoch);
  config_.epoch = epoch;
  opened_.epoch = epoch;
  std::vector<RestoredItem> restored;
  restored.reserve(items.size());
  uint64_t total = 0;
  for (const auto& [key, item] : items) total += item.size;
  std::vector<uint8_t> bytes(total);
  uint64_t offset = 0;
  for (const auto& [key, item] : items) {
    if (item.bytes != nullptr) {
      if (item.size != 0) std::memcpy(bytes.data() + offset, item.bytes->data(), item.size);
    } else if (item.size != 0) {
      log_->Read(item.at, item.size, bytes.data() + offset);
    }
    restored.push_back(RestoredItem{key, item.seq, item.priority, bytes.data() + offset, item.size});
    offset += item.size;
  }
  store_ = std::make_shared<ShardedStore>(config_);
  try {
    store_->Restore(restored);
  } catch (const InvalidArgument& e) {
    throw bad(e.what());
  }
  opened_.items = store_->Size();
  base.clear();
  if (base_segment != 0) {  // a compaction that wrote its snapshot and stopped before deleting what it replaced
    RemoveSnapshotsBefore(base_segment);
    log_->RemoveSegmentsBefore(base_segment);
  }
  uint64_t log_bytes = 0, live_bytes = 0;
  for (uint64_t n : log_->segments()) {
    if (n != log_->segment() && n >= base_segment) {
      log_bytes += std::filesystem::file_size(options_.path + "/" + TableLog::SegmentName(n));
    }
  }
  log_bytes_ = log_bytes;
  for (const RestoredItem& item : restored) live_bytes += kLogRecordHeaderBytes + kInsertHead + item.size;
  if (log_bytes > options_.compact_min_bytes && log_bytes > 2 * live_bytes) {
    std::sort(restored.begin(), restored.end(),
              [](const RestoredItem& a, const RestoredItem& b) { return a.seq < b.seq; });
    Compact(restored, epochs);
    opened_.compacted_bytes = log_bytes;
    log_bytes_ = 0;
  }
  epochs.insert(epoch);
  store_->ReportRemovals(&removed_);
  std::vector<uint8_t> body;
  Put<uint32_t>(&body, epoch);
  Put<uint32_t>(&body, config_.shards);
  Write(kOpen, body.data(), body.size());
  log_->Sync();
  unsynced_ = false;
  syncs_.fetch_add(1, std::memory_order_relaxed);
  if (options_.durability == Durability::kInterval) {
    {
      ScopedLock lock(fd_mu_);
      sync_fd_ = ::dup(log_->fd());
      if (sync_fd_ < 0) throw IoError(std::string("cannot duplicate the log's descriptor: ") + std::strerror(errno));
    }
    fd_segment_ = log_->segment();
    syncer_ = std::thread([this] { Syncer(); });
  }
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
  if (options_.durability == Durability::kSync) {
    unsynced_ = true;
    return;
  }
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
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.interval_s));
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
    if (!error.empty()) {
      Fail(error);
      return;
    }
    synced_.store(covered);
    syncs_.fetch_add(1, std::memory_order_relaxed);
  }
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

void DiskTable::Compact(const std::vector<RestoredItem>& items, const std::set<uint32_t>& epochs) {
  const uint64_t first = log_->segment();
  const std::vector<uint32_t> all(epochs.begin(), epochs.end());
  if (!all.empty()) Write(kEpochs, all.data(), all.size() * sizeof(uint32_t));
  for (const RestoredItem& item : items) LogItem(item.key, item.seq, item.priority, item.data, item.size);
  log_->Sync();                  // the rewrite is whole on disk before any old record goes
  RemoveSnapshotsBefore(first);  // before the segments: a snapshot never outlives the records after it
  log_->RemoveSegmentsBefore(first);
}

void DiskTable::RemoveSnapshotsBefore(uint64_t segment) {
  for (uint64_t n : Snapshots(options_.path)) {
    if (n < segment) ::unlink(SnapshotPath(n).c_str());
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
      log_->RemoveSegmentsBefore(compact_segment_);
      compactions_.fetch_add(1, std::memory_order_relaxed);
    } catch (const IoError&) {  // left for the next compaction; the snapshot and the records agree meanwhile
      compact_errors_.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  if (failed() || log_bytes_ < options_.compact_min_bytes || log_bytes_ < next_check_) return;
  next_check_ = log_bytes_ + options_.compact_min_bytes / 4;  // the store's totals read now and then, not per turn
  const StoreStats s = store_->Stats();
  if (log_bytes_ <= 2 * (s.bytes_held + s.size * (kLogRecordHeaderBytes + kInsertHead))) return;
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
    } catch (const std::exception& e) {
      compact_error_ = e.what();
    }
    compact_done_.store(true, std::memory_order_release);
  });
}

void DiskTable::LogItem(Key key, uint64_t seq, double priority, const uint8_t* data, size_t size) {
  uint8_t head[kInsertHead];
  std::memcpy(head, &key, 8);
  std::memcpy(head + 8, &seq, 8);
  std::memcpy(head + 16, &priority, 8);
  Write(kInsert, head, sizeof head, data, size);
}

void DiskTable::CheckUsable() const {
  if (failed())
    throw IoError("the table's log failed (" + failure() + "); it takes no change until the server restarts");
}

void DiskTable::Write(uint8_t type, const void* head, size_t head_size, const void* tail, size_t tail_size) {
  log_->Append(type, head, head_size, tail, tail_size);
  log_bytes_ += kLogRecordHeaderBytes + head_size + tail_size;
  records_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(kLogRecordHeaderBytes + head_size + tail_size, std::memory_order_relaxed);
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

void DiskTable::LogInserts(const Key* keys, uint64_t first_seq, const double* priorities, const uint8_t* const* data,
                           const uint64_t* sizes, size_t n) {
  CheckUsable();
  WriteAll([&] {
    for (size_t i = 0; i < n; ++i) LogItem(keys[i], first_seq + i, priorities[i], data[i], sizes[i]);
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
      LogItem(keys[i], seq, priority, reinterpret_cast<const uint8_t*>(data.data()), data.size());
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
  try {
    log_->Sync();
  } catch (const IoError& e) {
    Fail(e.what());
    return false;
  }
  unsynced_ = false;
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
  s.failed = failed();
  return s;
}

}  // namespace apexrl
