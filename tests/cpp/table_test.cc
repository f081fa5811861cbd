// Several tables in one live serving loop (serve/table.h), on the in-memory socket of fake_zmq.h: a request
// reaches the table its header names and no other; keys of one table are stale on another; an unknown table
// index is refused and the loop serves on; each table's limiter holds back and releases its own requests.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apexrl/errors.h"
#include "live_loop.h"

namespace apexrl::serve::testing {
namespace {

std::shared_ptr<ShardedStore> Store(uint32_t epoch) {
  StoreConfig c;
  c.capacity = 1000;
  c.shards = 2;
  c.epoch = epoch;  // every table its own: a key of one is never another's item
  return std::make_shared<ShardedStore>(c);
}

LoopConfig Config() {
  LoopConfig c;
  c.workers = 1;
  c.max_wait_s = 5;
  return c;
}

LimiterConfig MinSize(uint64_t n) {
  LimiterConfig c;
  c.min_size = n;
  return c;
}

LimiterConfig Queue(uint64_t size) {
  LimiterConfig c;
  c.kind = LimiterKind::kQueue;
  c.queue_size = size;
  return c;
}

std::vector<TableSpec> ThreeTables() {
  std::vector<TableSpec> t;
  t.push_back(TableSpec{"default", Store(11), MinSize(1)});
  t.push_back(TableSpec{"aux", Store(12), MinSize(2)});
  t.push_back(TableSpec{"queue", Store(13), Queue(2)});
  return t;
}

// Waits (generously) until the loop's counter `name` reads `value`.
bool StatReaches(LiveLoop& live, const std::string& name, double value) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < end) {
    if (live.Stat(name) == value) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

uint16_t StatusOf(const Frames& r) { return r.empty() ? 0xffff : ParseHeader(r[0]).status; }

TEST(Tables, EachRequestReachesItsTableAndKeysOfOneTableAreStaleOnAnother) {
  LiveLoop live(ThreeTables(), Config());
  ASSERT_EQ(live.loop->num_tables(), 3u);
  const Frames a = live.Request("p", ToTable(0, Insert(1, {"a1", "a2"}, {1, 1})));
  const Frames b = live.Request("p", ToTable(1, Insert(2, {"b1"}, {1})));
  ASSERT_EQ(StatusOf(a), kOk);
  ASSERT_EQ(StatusOf(b), kOk);
  const std::vector<Key> ka = KeysOf(a[1]), kb = KeysOf(b[1]);
  ASSERT_EQ(ka.size(), 2u);
  EXPECT_EQ(live.Stat("table.default.rate_limiter_inserted_items"), 2);
  EXPECT_EQ(live.Stat("table.aux.rate_limiter_inserted_items"), 1);
  EXPECT_EQ(live.Stat("table.queue.rate_limiter_inserted_items"), 0);
  // Table 0's keys sent to table 1: nothing there is touched, and table 0 keeps its items.
  const Frames erased = live.Request("p", ToTable(1, Erase(3, ka)));
  ASSERT_EQ(StatusOf(erased), kOk);
  EXPECT_EQ(ParseHeader(erased[0]).count, 0u);
  const Frames updated = live.Request("p", ToTable(1, Update(4, ka, {5, 5})));
  ASSERT_EQ(StatusOf(updated), kOk);
  EXPECT_EQ(ParseHeader(updated[0]).count, 0u);
  const Frames updated_b = live.Request("p", ToTable(1, Update(5, kb, {5})));
  EXPECT_EQ(ParseHeader(updated_b[0]).count, 1u);
  // A SAMPLE of table 0 draws table 0's keys only.
  const Frames s = live.Request("p", ToTable(0, Sample(6, 8)));
  ASSERT_EQ(StatusOf(s), kOk);
  for (Key k : KeysOf(s[1])) EXPECT_TRUE(k == ka[0] || k == ka[1]);
  const Frames erased_a = live.Request("p", ToTable(0, Erase(7, ka)));
  EXPECT_EQ(ParseHeader(erased_a[0]).count, 2u);
  EXPECT_EQ(live.Stat("table.default.erased_items"), 2);
  EXPECT_EQ(live.Stat("table.aux.erased_items"), 0);
  EXPECT_EQ(live.Stat("erased_items"), 2);  // today's name: the table `default`
}

TEST(Tables, AnUnknownTableIndexIsRefusedWithTheTablesAndTheLoopServesOn) {
  LiveLoop live(ThreeTables(), Config());
  for (uint32_t bad : {3u, 7u, 0xffffffffu}) {
    const Frames r = live.Request("p", ToTable(bad, Insert(1, {"x"}, {1})));
    ASSERT_EQ(StatusOf(r), kInvalidArgument);
    const std::string msg = r.size() > 1 ? r[1] : "";
    EXPECT_NE(msg.find("unknown table index " + std::to_string(bad)), std::string::npos) << msg;
    EXPECT_NE(msg.find("2 'queue'"), std::string::npos) << msg;
    EXPECT_EQ(StatusOf(live.Request("p", ToTable(bad, Sample(2, 1)))), kInvalidArgument);
    EXPECT_EQ(StatusOf(live.Request("p", ToTable(bad, Erase(3, {1})))), kInvalidArgument);
    EXPECT_EQ(StatusOf(live.Request("p", ToTable(bad, RemoveToFit(4)))), kInvalidArgument);
  }
  EXPECT_EQ(live.Stat("requests_refused_table"), 12);
  EXPECT_EQ(live.store->Size(), 0u);
  EXPECT_EQ(StatusOf(live.Request("p", ToTable(2, Insert(5, {"x"}, {1})))), kOk);
  // A request that names no table must carry 0 there.
  const Frames stats = live.Request("p", ToTable(1, Stats(6)));
  EXPECT_EQ(StatusOf(stats), kBadMessage);
}

TEST(Tables, EachTablesLimiterHoldsBackAndReleasesItsOwnRequests) {
  LiveLoop live(ThreeTables(), Config());
  // aux needs 2 items to sample: a waiting sample there is released by aux's inserts, not by default's.
  FakeZmq::Get().Push("s", ToTable(1, Sample(1, 1, 4000)));
  EXPECT_EQ(StatusOf(live.Request("p", ToTable(0, Insert(2, {"a", "b", "c"}, {1, 1, 1})))), kOk);
  EXPECT_EQ(StatusOf(live.Request("p", ToTable(1, Insert(3, {"x"}, {1})))), kOk);
  EXPECT_TRUE(StatReaches(live, "table.aux.deferred", 1));
  EXPECT_EQ(live.Stat("table.default.deferred"), 0);
  EXPECT_EQ(StatusOf(live.Request("p", ToTable(1, Insert(4, {"y"}, {1})))), kOk);
  SentReply r;
  ASSERT_TRUE(live.Next([](const SentReply& x) { return x.peer == "s"; }, &r));
  EXPECT_EQ(ParseHeader(r.frames[0]).status, kOk);
}

TEST(Tables, AQueueTableHoldsInsertsBackWhenFullRefusesOversizedOnesAndTimesOutWithItsReason) {
  LiveLoop live(ThreeTables(), Config());
  const Frames big = live.Request("p", ToTable(2, Insert(1, {"a", "b", "c"}, {1, 1, 1}, 0, 0, 1000)));
  ASSERT_EQ(StatusOf(big), kInvalidArgument);
  EXPECT_NE(big[1].find("Queue(size=2)"), std::string::npos) << big[1];
  EXPECT_EQ(StatusOf(live.Request("p", ToTable(2, Insert(2, {"a", "b"}, {1, 1})))), kOk);
  // Full: an insert without a wait is refused at once, one with a wait times out saying why.
  const Frames now = live.Request("p", ToTable(2, Insert(3, {"c"}, {1})));
  EXPECT_EQ(StatusOf(now), kTimeout);
  const Frames waited = live.Request("p", ToTable(2, Insert(4, {"c"}, {1}, 0, 0, 50)));
  ASSERT_EQ(StatusOf(waited), kTimeout);
  EXPECT_NE(waited[1].find("queue holds 2 of at most 2"), std::string::npos) << waited[1];
}

TEST(Tables, AnEmptyQueuesSampleWaitsAndIsAnsweredOnceAnItemArrives) {
  LiveLoop live(ThreeTables(), Config());
  FakeZmq::Get().Push("s", ToTable(2, Sample(1, 1, 4000)));
  EXPECT_EQ(StatusOf(live.Request("p", ToTable(0, Insert(2, {"a"}, {1})))), kOk);  // another table's
  EXPECT_TRUE(StatReaches(live, "table.queue.deferred", 1));
  EXPECT_EQ(StatusOf(live.Request("p", ToTable(2, Insert(3, {"q"}, {1})))), kOk);
  SentReply r;
  ASSERT_TRUE(live.Next([](const SentReply& x) { return x.peer == "s"; }, &r));
  ASSERT_EQ(ParseHeader(r.frames[0]).status, kOk);
  EXPECT_EQ(r.frames[5], "q");
}

TEST(Tables, TwoTablesOfOneNameAreRefused) {
  std::vector<TableSpec> t;
  t.push_back(TableSpec{"x", Store(1), MinSize(1)});
  t.push_back(TableSpec{"x", Store(2), MinSize(1)});
  EXPECT_THROW(ServeLoop(FakeZmq::Api(), FakeZmq::Socket(), std::move(t), Config()), InvalidArgument);
  EXPECT_THROW(ServeLoop(FakeZmq::Api(), FakeZmq::Socket(), std::vector<TableSpec>{}, Config()), InvalidArgument);
}

}  // namespace
}  // namespace apexrl::serve::testing
