// DiskTable (disk_table.h): the records of every kind of change replayed on reopening -- items back with their
// keys, priorities, bytes and insertion order; erases, evictions, a clear and pops not undone; held items given
// back logged again; a new life's epoch unlike the earlier ones; a log of another shard count refused; a write
// that fails (RLIMIT_FSIZE, as a full disk) refused with nothing of it on disk.
#include "apexrl/disk_table.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "apexrl/errors.h"
#include "temp_dir.h"

namespace apexrl {
namespace {

using testing_util::TempDir;

StoreConfig Config(uint32_t shards = 4) {
  StoreConfig c;
  c.capacity = 1000;
  c.shards = shards;
  c.eviction = EvictionKind::kFifo;
  return c;
}

DiskTableOptions Options(const TempDir& dir) {
  DiskTableOptions o;
  o.path = dir.Path("table");
  return o;
}

// Inserts items (bytes "item<i>") as the serving loop does.
std::vector<Key> Insert(DiskTable& t, const std::vector<int>& ids, double priority) {
  std::vector<std::string> bytes;
  for (int i : ids) bytes.push_back("item" + std::to_string(i));
  std::vector<const uint8_t*> data;
  std::vector<uint64_t> sizes;
  for (const auto& b : bytes) {
    data.push_back(reinterpret_cast<const uint8_t*>(b.data()));
    sizes.push_back(b.size());
  }
  std::vector<double> priorities(ids.size(), priority);
  std::vector<Key> keys(ids.size());
  t.Insert(priorities.data(), data.data(), sizes.data(), ids.size(), keys.data());
  return keys;
}

// Key -> (priority, bytes) of every live item, and the items' bytes oldest first.
struct Seen {
  std::map<Key, std::pair<double, std::string>> items;
  std::vector<std::string> order;
};

// The store holds where the items' bytes lie in the log (ItemRefs); their bytes are read back from there.
Seen Contents(const DiskTable& t) {
  Seen s;
  std::vector<std::pair<uint64_t, std::string>> by_seq;
  for (const Shard::Contents& c : t.store()->Dump()) {
    for (size_t i = 0; i < c.keys.size(); ++i) {
      EXPECT_EQ(c.items[i].size(), sizeof(ItemRef));
      const std::string bytes =
          t.ReadItem(c.keys[i], reinterpret_cast<const uint8_t*>(c.items[i].data()), c.items[i].size());
      s.items[c.keys[i]] = {c.priorities[i], bytes};
      by_seq.emplace_back(c.seqs[i], bytes);
    }
  }
  std::sort(by_seq.begin(), by_seq.end());
  for (auto& [seq, bytes] : by_seq) s.order.push_back(bytes);
  return s;
}

TEST(DiskTable, EveryChangeIsReplayedWithItsKeys) {
  TempDir dir("disk_table");
  Seen before;
  uint32_t first_epoch;
  {
    DiskTable t(Config(), Options(dir));
    first_epoch = t.opened().epoch;
    EXPECT_EQ(t.opened().items, 0u);
    const auto a = Insert(t, {0, 1, 2, 3, 4}, 1.0);
    const auto b = Insert(t, {5, 6, 7}, 2.0);
    const std::vector<Key> up = {a[1], b[0]};
    const std::vector<double> p = {7.5, 0.25};
    t.LogUpdates(up.data(), p.data(), up.size());
    t.store()->UpdatePriorities(up.data(), p.data(), up.size());
    t.LogErases(&a[2], 1);
    t.store()->Erase(&a[2], 1);
    t.store()->Validate();
    EXPECT_TRUE(t.Commit());  // (the table's syncer may have covered them already)
    EXPECT_FALSE(t.unsynced());
    EXPECT_EQ(t.synced(), t.written());
    before = Contents(t);
  }
  DiskTable again(Config(), Options(dir));
  EXPECT_EQ(again.opened().items, 7u);
  EXPECT_EQ(again.opened().lives, 1u);
  EXPECT_NE(again.opened().epoch, first_epoch);
  again.store()->Validate();
  const Seen after = Contents(again);
  EXPECT_EQ(after.items, before.items);  // keys, priorities and bytes
  EXPECT_EQ(after.order, before.order);  // insertion order (FIFO)
  EXPECT_EQ(after.order.front(), "item0");
  // Restored keys address their items; new ones differ from every restored key.
  const Key old_key = before.items.begin()->first;
  const double p = 3.0;
  EXPECT_EQ(again.store()->UpdatePriorities(&old_key, &p, 1), 1u);
  const auto fresh = Insert(again, {8}, 1.0);
  EXPECT_EQ(before.items.count(fresh[0]), 0u);
  EXPECT_EQ(again.store()->Size(), 8u);
}

TEST(DiskTable, EvictionsClearAndPopsStayDone) {
  TempDir dir("disk_table");
  StoreConfig c = Config(2);
  c.capacity = 4;
  c.max_size = 4;  // every insert past 4 items evicts the oldest
  {
    DiskTable t(c, Options(dir));
    Insert(t, {0, 1, 2, 3, 4, 5}, 1.0);  // 0 and 1 evicted by the insert itself
    EXPECT_EQ(t.store()->Size(), 4u);
    t.Commit();
  }
  {
    DiskTable t(c, Options(dir));
    EXPECT_EQ(Contents(t).order, (std::vector<std::string>{"item2", "item3", "item4", "item5"}));
    t.LogClear();
    t.store()->Clear();
    t.DropRemovals();
    Insert(t, {6, 7}, 1.0);
    t.Commit();
  }
  DiskTable t(c, Options(dir));
  EXPECT_EQ(Contents(t).order, (std::vector<std::string>{"item6", "item7"}));
}

TEST(DiskTable, HeldItemsGivenBackAreLoggedAgainInTheirPlace) {
  TempDir dir("disk_table");
  StoreConfig c = Config(1);
  c.sampler = SamplerKind::kFifo;
  c.max_times_sampled = 1;
  {
    DiskTable t(c, Options(dir));
    Insert(t, {0, 1, 2}, 1.0);
    SampleResult r;
    t.store()->Sample(2, 0.4, &r, /*hold=*/true);
    ASSERT_EQ(r.held.size(), 2u);
    t.LogErases(r.held.data(), r.held.size());  // the pops, before their reply
    t.store()->Release(&r.held[1], 1);          // the second delivered
    t.store()->GiveBack(&r.held[0], 1, &r.keys[0], 1);
    EXPECT_EQ(t.Restored(&r.held[0], 1), "");  // the first came back
    EXPECT_EQ(t.Stats().restored, 1u);
  }
  DiskTable t(c, Options(dir));
  EXPECT_EQ(Contents(t).order, (std::vector<std::string>{"item0", "item2"}));
}

TEST(DiskTable, OpeningCompactsALogOfMostlyRemovedItems) {
  TempDir dir("disk_table");
  DiskTableOptions o = Options(dir);
  o.compact_min_bytes = 0;
  std::set<uint32_t> epochs;
  Seen before;
  {
    DiskTable t(Config(), o);
    epochs.insert(t.opened().epoch);
    std::vector<Key> keys;
    for (int i = 0; i < 50; ++i) keys.push_back(Insert(t, {i}, 1.0 + i)[0]);
    t.LogErases(keys.data(), 40);
    t.store()->Erase(keys.data(), 40);
    const double p = 0.5;
    t.LogUpdates(&keys[45], &p, 1);
    t.store()->UpdatePriorities(&keys[45], &p, 1);
    t.Commit();
    before = Contents(t);
  }
  {
    DiskTable t(Config(), o);  // 50 INSERTs and the rest, for 10 items: rewritten
    EXPECT_GT(t.opened().compacted_bytes, 0u);
    EXPECT_TRUE(epochs.insert(t.opened().epoch).second);
    const Seen after = Contents(t);
    EXPECT_EQ(after.items, before.items);
    EXPECT_EQ(after.order, before.order);
  }
  DiskTable t(Config(), o);                   // the compacted log: the same items, and an epoch none of the lives had
  EXPECT_EQ(t.opened().compacted_bytes, 0u);  // 10 items' records: nothing to gain
  EXPECT_EQ(Contents(t).items, before.items);
  EXPECT_TRUE(epochs.insert(t.opened().epoch).second);
}

// The number of the newest log segment file in the table's directory (a compaction starts a new one).
uint64_t NewestSegment(const TempDir& dir) {
  uint64_t newest = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.Path("table"))) {
    const std::string name = e.path().filename().string();
    if (name.rfind("seg-", 0) == 0) newest = std::max<uint64_t>(newest, std::stoull(name.substr(4, 16), nullptr, 16));
  }
  return newest;
}

// The trigger counts what the items left would take in a fresh log, their bytes included: a table that holds
// about what its log holds is not snapshotted again and again (counting only the index, 100 items of 1,000 bytes
// were compacted at once), and one whose log is mostly removed items is.
TEST(DiskTable, ServingCompactsOnceTheLogIsTwiceWhatItsItemsTake) {
  TempDir dir("disk_table");
  DiskTableOptions o = Options(dir);
  o.compact_min_bytes = 1;  // every call reads the store's totals
  DiskTable t(Config(), o);
  const std::string body(1000, 'x');
  std::vector<const uint8_t*> data(100, reinterpret_cast<const uint8_t*>(body.data()));
  std::vector<uint64_t> sizes(100, body.size());
  std::vector<double> priorities(100, 1.0);
  std::vector<Key> keys(100);
  t.Insert(priorities.data(), data.data(), sizes.data(), 100, keys.data());
  t.Commit();
  const uint64_t segment = NewestSegment(dir);
  t.MaybeCompact();
  EXPECT_EQ(NewestSegment(dir), segment);  // 100 items' records, 100 items: nothing to gain
  t.LogErases(keys.data(), 45);            // 55 left: the log is not yet twice their records
  t.store()->Erase(keys.data(), 45);
  t.MaybeCompact();
  EXPECT_EQ(NewestSegment(dir), segment);
  t.LogErases(&keys[45], 10);  // 45 left: it is
  t.store()->Erase(&keys[45], 10);
  t.MaybeCompact();
  EXPECT_EQ(NewestSegment(dir), segment + 1);  // started: a new segment, the snapshot written by a thread
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (t.Stats().compactions == 0 && std::chrono::steady_clock::now() < deadline) {
    t.MaybeCompact();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(t.Stats().compactions, 1u);
}

TEST(DiskTable, ServingCompactsIntoASnapshotAndTheRecordsAfterIt) {
  TempDir dir("disk_table");
  DiskTableOptions o = Options(dir);
  o.compact_min_bytes = 1024;
  o.log.segment_bytes = 1024;  // several segments to delete
  Seen before;
  uint64_t oldest = 0;  // the segment the oldest live item's bytes lie in
  {
    DiskTable t(Config(), o);
    std::vector<Key> keys;
    for (int i = 0; i < 100; ++i) keys.push_back(Insert(t, {i}, 1.0 + i)[0]);
    t.LogErases(keys.data(), 90);
    t.store()->Erase(keys.data(), 90);
    t.MaybeCompact();  // starts: a new segment, the snapshot written by a thread of its own
    const auto after = Insert(t, {100, 101}, 5.0);  // records after the compaction point
    t.LogErases(&keys[95], 1);
    t.store()->Erase(&keys[95], 1);
    const double p = 0.25;
    t.LogUpdates(&after[0], &p, 1);
    t.store()->UpdatePriorities(&after[0], &p, 1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (t.Stats().compactions == 0 && std::chrono::steady_clock::now() < deadline) {
      t.MaybeCompact();  // finishes once the snapshot is whole
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(t.Stats().compactions, 1u);
    EXPECT_EQ(t.Stats().compact_errors, 0u);
    t.Commit();
    before = Contents(t);
    oldest = ~0ull;
    t.store()->ForEachItem([&oldest](const uint8_t* ref, uint32_t) {
      ItemRef r;
      std::memcpy(&r, ref, sizeof r);
      oldest = std::min<uint64_t>(oldest, r.segment);
    });
  }
  ASSERT_GT(oldest, 1u);
  size_t snapshots = 0;
  std::set<uint64_t> segments;
  for (const auto& e : std::filesystem::directory_iterator(dir.Path("table"))) {
    const std::string name = e.path().filename().string();
    snapshots += name.rfind("index-", 0) == 0;
    if (name.rfind("seg-", 0) == 0) segments.insert(std::stoull(name.substr(4, 16), nullptr, 16));
  }
  EXPECT_EQ(snapshots, 1u);
  // The segments before the oldest live item's went; its and those after it stay (its bytes are read there).
  ASSERT_FALSE(segments.empty());
  EXPECT_EQ(*segments.begin(), oldest);
  DiskTable t(Config(), o);
  EXPECT_EQ(Contents(t).items, before.items);
  EXPECT_EQ(Contents(t).order, before.order);
  EXPECT_EQ(t.store()->Size(), 11u);
}

TEST(DiskTable, SyncDurabilitySyncsOnItsOwnThreadAtOnceAndCallsBack) {
  TempDir dir("disk_table");
  DiskTable t(Config(), Options(dir));  // kSync
  Mutex mu;
  CondVar cv;
  int calls = 0;
  t.SetOnSynced([&] {
    ScopedLock lock(mu);
    ++calls;
    cv.NotifyAll();
  });
  const uint64_t opened_syncs = t.Stats().syncs;
  for (int i = 0; i < 3; ++i) Insert(t, {i}, 1.0);
  const uint64_t written = t.written();
  EXPECT_EQ(written, 3u);  // one write a request
  {                        // no Commit: the syncer covers the writes on its own, without waiting out an interval
    ScopedLock lock(mu);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((t.synced() < written || calls == 0) && std::chrono::steady_clock::now() < deadline) {
      cv.WaitUntil(mu, deadline);
    }
    EXPECT_GE(calls, 1);
  }
  EXPECT_GE(t.synced(), written);
  EXPECT_FALSE(t.holds_replies());  // nothing left to wait for
  EXPECT_GT(t.Stats().syncs, opened_syncs);
  EXPECT_EQ(t.Stats().unsynced_writes, 0u);
  t.SetOnSynced(nullptr);
}

TEST(DiskTable, IntervalDurabilitySyncsOnItsOwnThread) {
  TempDir dir("disk_table");
  DiskTableOptions o = Options(dir);
  o.durability = Durability::kInterval;
  o.interval_s = 0.005;
  {
    DiskTable t(Config(), o);
    const uint64_t opened_syncs = t.Stats().syncs;
    for (int i = 0; i < 3; ++i) Insert(t, {i}, 1.0);
    EXPECT_FALSE(t.holds_replies());  // replies never wait for an interval table's sync
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (t.Stats().syncs == opened_syncs && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GT(t.Stats().syncs, opened_syncs);  // by the syncer, the caller never asked
    Insert(t, {3}, 1.0);                       // synced, at the latest, when the table closes
  }
  DiskTable t(Config(), o);
  EXPECT_EQ(t.opened().items, 4u);
}

TEST(DiskTable, ALogOfAnotherShardCountIsRefused) {
  TempDir dir("disk_table");
  {
    DiskTable t(Config(4), Options(dir));
  }
  EXPECT_THROW(DiskTable(Config(2), Options(dir)), InvalidArgument);
  DiskTable t(Config(4), Options(dir));  // unchanged by the refusal
  EXPECT_EQ(t.opened().lives, 1u);
}

TEST(DiskTable, AFailedWriteIsRefusedAndLeavesNothingOnDisk) {
  TempDir dir("disk_table");
  struct rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = signal(SIGXFSZ, SIG_IGN);  // writes past the limit fail with EFBIG
  std::vector<Key> stored;
  uint64_t refused = 0;
  {
    DiskTable t(Config(), Options(dir));
    struct rlimit lim = old;
    lim.rlim_cur = 4096;  // room for about 90 records of these items
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    for (int i = 0; i < 200; ++i) {
      std::vector<Key> keys;
      try {
        keys = Insert(t, {i}, 1.0);  // refused: neither stored nor on disk
      } catch (const IoError&) {
        ++refused;
        continue;
      }
      stored.push_back(keys[0]);
    }
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
    EXPECT_EQ(t.Stats().write_errors, refused);
    EXPECT_EQ(t.store()->Size(), stored.size());
    t.Commit();
  }
  signal(SIGXFSZ, old_handler);
  ASSERT_GT(refused, 0u);
  ASSERT_GT(stored.size(), 0u);
  DiskTable t(Config(), Options(dir));
  const Seen s = Contents(t);
  ASSERT_EQ(s.items.size(), stored.size());
  for (Key k : stored) EXPECT_EQ(s.items.count(k), 1u);
}

// Changes byte `at` of item `key`'s bytes in its log segment (behind the table's back); returns the ItemRef the
// store holds for it.
std::string DamageOnDisk(const DiskTable& t, const TempDir& dir, Key key, uint64_t at) {
  uint64_t seq;
  double priority;
  std::string ref;
  EXPECT_TRUE(t.store()->Peek(key, &seq, &priority, &ref));
  ItemRef where;
  std::memcpy(&where, ref.data(), sizeof where);
  std::fstream f(dir.Path("table") + "/" + TableLog::SegmentName(where.segment),
                 std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(where.offset + at));
  f.put('X');
  return ref;
}

TEST(DiskTable, ItemsAreReadBackFromTheLogAndChecked) {
  TempDir dir("disk_table");
  DiskTableOptions o = Options(dir);
  o.read_wait_s = 0.01;  // a damaged record is not waited for long
  o.cache_bytes = 0;     // every read from the file
  DiskTable t(Config(), o);
  std::map<Key, std::string> bytes;
  for (int i = 0; i < 20; ++i) bytes[Insert(t, {i}, 1.0)[0]] = "item" + std::to_string(i);
  // The store holds 16 bytes an item, whatever its size: memory bounded by the index.
  EXPECT_EQ(t.store()->Stats().bytes_held, 20 * sizeof(ItemRef));
  SampleResult r;
  t.store()->Sample(64, 0.4, &r);
  t.ReadItems(&r);
  ASSERT_EQ(r.keys.size(), 64u);
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const std::string got(reinterpret_cast<const char*>(r.data.data() + r.offsets[i]), r.offsets[i + 1] - r.offsets[i]);
    EXPECT_EQ(got, bytes.at(r.keys[i]));
  }
  // A record whose bytes changed on disk is refused, never returned.
  const Key key = bytes.begin()->first;
  const std::string ref = DamageOnDisk(t, dir, key, 0);
  EXPECT_THROW(t.ReadItem(key, reinterpret_cast<const uint8_t*>(ref.data()), ref.size()), IoError);
}

// Item i's bytes: 100 bytes, "item<i>" and then a pattern of i.
std::string Item100(int i) {
  std::string b = "item" + std::to_string(i);
  while (b.size() < 100) b.push_back(static_cast<char>('a' + (i + b.size()) % 26));
  return b;
}

std::map<Key, std::string> Insert100(DiskTable& t, int from, int to) {
  std::map<Key, std::string> out;
  for (int i = from; i < to; ++i) {
    const std::string b = Item100(i);
    const uint8_t* data = reinterpret_cast<const uint8_t*>(b.data());
    const uint64_t size = b.size();
    const double priority = 1.0;
    Key key;
    t.Insert(&priority, &data, &size, 1, &key);
    out[key] = b;
  }
  return out;
}

// Samples 256 items and checks each one's bytes; returns the cache's hits and misses it added.
std::pair<uint64_t, uint64_t> SampleAndCheck(const DiskTable& t, const std::map<Key, std::string>& bytes) {
  const DiskTableStats before = t.Stats();
  SampleResult r;
  t.store()->Sample(256, 0.4, &r);
  t.ReadItems(&r);
  EXPECT_EQ(r.keys.size(), 256u);
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const std::string got(reinterpret_cast<const char*>(r.data.data() + r.offsets[i]), r.offsets[i + 1] - r.offsets[i]);
    EXPECT_EQ(got, bytes.at(r.keys[i]));
  }
  const DiskTableStats after = t.Stats();
  EXPECT_EQ(after.cache_hits + after.cache_misses - before.cache_hits - before.cache_misses, 256u);
  return {after.cache_hits - before.cache_hits, after.cache_misses - before.cache_misses};
}

TEST(DiskTable, TheNewestItemsAreReadFromTheLogsTailInMemoryTheOthersFromTheFiles) {
  TempDir dir("disk_table");
  DiskTableOptions o = Options(dir);
  o.read_wait_s = 0.01;
  std::map<Key, std::string> bytes;
  {
    DiskTable t(Config(), o);  // the default cache: the whole log fits
    EXPECT_EQ(o.cache_bytes, DiskTableOptions::kDefaultCacheBytes);
    bytes = Insert100(t, 0, 200);
    EXPECT_EQ(SampleAndCheck(t, bytes), std::make_pair(uint64_t{256}, uint64_t{0}));
    EXPECT_GT(t.Stats().cache_bytes, 0u);
    EXPECT_LE(t.Stats().cache_bytes, o.cache_bytes);
  }
  {
    // Reopened: the cache is filled from the log's end at once.
    DiskTable t(Config(), o);
    EXPECT_EQ(SampleAndCheck(t, bytes), std::make_pair(uint64_t{256}, uint64_t{0}));
  }
  // A cache of 16 KiB (4 blocks of 4 KiB) holds the newest ~50 of the 200 records of 133 bytes (the two earlier
  // lives' OPEN records, each in a segment and so a block of its own, take two): the others are read from the
  // files, every item's bytes right either way.
  o.cache_bytes = 16 << 10;
  {
    DiskTable t(Config(), o);  // filled from the end of the log
    const auto [hits, misses] = SampleAndCheck(t, bytes);
    EXPECT_GT(hits, 0u);
    EXPECT_GT(misses, hits);
    EXPECT_LE(t.Stats().cache_bytes, o.cache_bytes);
  }
  // A record damaged on disk after the cache took its bytes: the cache's copy, the bytes written, is read (a
  // read from the file finds the damage: ItemsAreReadBackFromTheLogAndChecked; so does a reopening's recovery).
  o.cache_bytes = DiskTableOptions::kDefaultCacheBytes;
  DiskTable t(Config(), o);
  const Key damaged = bytes.begin()->first;
  const std::string ref = DamageOnDisk(t, dir, damaged, 50);
  EXPECT_EQ(t.ReadItem(damaged, reinterpret_cast<const uint8_t*>(ref.data()), ref.size()), bytes.at(damaged));
}

// A cache hit checks the record's header (its type, size and key), not its checksum (the cache's bytes are the ones
// written, never read back from a file): a reference that points at another item's record is still refused, from
// the cache as from the file.
TEST(DiskTable, ACachedRecordThatIsNotTheItemsIsRefused) {
  TempDir dir("disk_table");
  DiskTableOptions o = Options(dir);
  o.read_wait_s = 0.01;
  DiskTable t(Config(), o);
  const Key a = Insert(t, {1}, 1.0)[0];
  const Key b = Insert(t, {2}, 1.0)[0];
  uint64_t seq;
  double priority;
  std::string ref_a, ref_b;
  ASSERT_TRUE(t.store()->Peek(a, &seq, &priority, &ref_a));
  ASSERT_TRUE(t.store()->Peek(b, &seq, &priority, &ref_b));
  EXPECT_EQ(t.ReadItem(a, reinterpret_cast<const uint8_t*>(ref_a.data()), ref_a.size()), "item1");
  const DiskTableStats before = t.Stats();
  EXPECT_THROW(t.ReadItem(b, reinterpret_cast<const uint8_t*>(ref_a.data()), ref_a.size()), IoError);
  EXPECT_EQ(t.Stats().cache_hits, before.cache_hits);  // not taken from the cache
  // A batch that names b at a's record: ReadCached leaves it as drawn, ReadItems refuses it.
  SampleResult r;
  r.keys = {b};
  r.data.clear();
  std::memcpy(r.data.Extend(ref_a.size()), ref_a.data(), ref_a.size());
  r.offsets = {0, ref_a.size()};
  EXPECT_FALSE(t.ReadCached(&r));
  EXPECT_THROW(t.ReadItems(&r), IoError);
}

// ReadCached, the serving loop's read: every item from the cache, or nothing changed (the batch's ItemRefs kept for
// a ReadItems on a worker, which then returns every item's bytes).
TEST(DiskTable, ReadCachedReadsAWholeBatchFromTheCacheOrLeavesItAsDrawn) {
  TempDir dir("disk_table");
  DiskTableOptions o = Options(dir);
  o.cache_bytes = 16 << 10;  // the newest ~100 of 200 records
  DiskTable t(Config(), o);
  const std::map<Key, std::string> bytes = Insert100(t, 0, 200);
  auto check = [&](const SampleResult& r) {
    for (size_t i = 0; i < r.keys.size(); ++i) {
      const std::string got(reinterpret_cast<const char*>(r.data.data() + r.offsets[i]),
                            r.offsets[i + 1] - r.offsets[i]);
      EXPECT_EQ(got, bytes.at(r.keys[i]));
    }
  };
  // Batches of 2 drawn from all 200: some in the cache whole, some not (the store's seed fixes which).
  SampleResult r;
  bool some_whole = false, some_not = false;
  for (int round = 0; round < 50 && !(some_whole && some_not); ++round) {
    t.store()->Sample(2, 0.4, &r);
    const std::vector<uint8_t> drawn(r.data.data(), r.data.data() + r.data.size());
    const DiskTableStats before = t.Stats();
    if (t.ReadCached(&r)) {
      some_whole = true;
      check(r);
      EXPECT_EQ(t.Stats().cache_hits, before.cache_hits + 2);
    } else {
      some_not = true;
      EXPECT_EQ(std::vector<uint8_t>(r.data.data(), r.data.data() + r.data.size()), drawn);  // as drawn
      EXPECT_EQ(r.offsets, (std::vector<uint64_t>{0, 16, 32}));
      EXPECT_EQ(t.Stats().cache_hits + t.Stats().cache_misses, before.cache_hits + before.cache_misses);
      t.ReadItems(&r);
      check(r);
    }
  }
  EXPECT_TRUE(some_whole);
  EXPECT_TRUE(some_not);
  // Without a cache nothing is read there.
  o.cache_bytes = 0;
  o.path = dir.Path("nocache");
  DiskTable none(Config(), o);
  Insert100(none, 0, 10);
  none.store()->Sample(4, 0.4, &r);
  EXPECT_FALSE(none.ReadCached(&r));
}

TEST(DiskTable, AnEarlierBuildsSnapshotOfItemBytesIsRewrittenIntoTheLog) {
  TempDir dir("disk_table");
  std::filesystem::create_directory(dir.Path("table"));
  std::map<Key, std::string> saved;
  {
    ShardedStore s(Config());
    const std::vector<std::string> items = {"a", "bb", "ccc"};
    std::vector<const uint8_t*> data;
    std::vector<uint64_t> sizes;
    for (const auto& b : items) {
      data.push_back(reinterpret_cast<const uint8_t*>(b.data()));
      sizes.push_back(b.size());
    }
    const std::vector<double> p(3, 1.0);
    std::vector<Key> keys(3);
    s.Insert(p.data(), data.data(), sizes.data(), 3, keys.data());
    for (size_t i = 0; i < 3; ++i) saved[keys[i]] = items[i];
    s.Save(dir.Path("table") + "/compact-0000000000000001.snap");
  }
  for (int life = 0; life < 2; ++life) {
    DiskTable t(Config(), Options(dir));
    const Seen seen = Contents(t);
    ASSERT_EQ(seen.items.size(), 3u);
    for (const auto& [key, b] : saved) EXPECT_EQ(seen.items.at(key).second, b);
  }
  for (const auto& e : std::filesystem::directory_iterator(dir.Path("table"))) {
    EXPECT_NE(e.path().filename().string().rfind("compact-", 0), 0u);
  }
}

}  // namespace
}  // namespace apexrl
