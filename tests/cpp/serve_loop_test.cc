// The serving loop itself, live, on the in-memory socket of fake_zmq.h: requests whose harm depends on the
// server's state. A repeated insert id whose chunk frames reference a chunk the request lacks
// crashed the loop (the reply-size accounting read the request's chunk offsets at that reference although the
// store never saw the request); an invalid chunk reference under the rate limiter was TIMEOUT instead of
// INVALID_ARGUMENT. Both are refused when the request is decoded, before the insert-id window and the limiter.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "live_loop.h"

namespace apexrl::serve::testing {
namespace {

StoreConfig SmallStore() {
  StoreConfig c;
  c.capacity = 1000;
  c.shards = 2;
  return c;
}

LoopConfig Config() {
  LoopConfig c;
  c.workers = 1;
  c.max_wait_s = 5;
  return c;
}

const std::vector<std::string> kChunks{std::string(64, 'a'), std::string(64, 'b')};

TEST(ServeLoop, ARepeatedInsertIdWithABadChunkReferenceIsRefusedAndTheLoopServesOn) {
  LiveLoop live(SmallStore(), Config());
  const Frames first = live.Request("p", Insert(1, {"x", "yy"}, {1, 1}, 0xA, 1, 0, {{0}, {0, 1}}, kChunks));
  ASSERT_EQ(first.size(), 3u);  // header, keys, chunk keys
  ASSERT_EQ(ParseHeader(first[0]).status, kOk);
  const std::vector<Key> keys = KeysOf(first[1]);
  ASSERT_EQ(keys.size(), 2u);
  const double max_item = live.Stat("max_item_bytes");
  const StoreStats before = live.store->Stats();

  // 2^40 read far outside the frame (SIGSEGV); 2 just past it (a wrong estimate). (Since protocol 6 a
  // reference past the request's chunks may be a chunk key; these are not: their tags are invalid.)
  uint64_t rid = 2;
  for (uint64_t bad : {uint64_t{1} << 40, uint64_t{2}, uint64_t{1} << 32}) {
    const Frames again = live.Request("p", Insert(rid, {"x", "yy"}, {1, 1}, 0xA, 1, 0, {{0}, {1, bad}}, kChunks));
    ASSERT_EQ(again.size(), 2u) << bad;
    const ReplyHeader h = ParseHeader(again[0]);
    EXPECT_EQ(h.rid, rid);
    EXPECT_EQ(h.status, kInvalidArgument) << again[1];
    EXPECT_NE(again[1].find("items[1] references chunk " + std::to_string(bad) +
                            ": neither one of the 2 chunks sent nor a chunk key"),
              std::string::npos)
        << again[1];
    ++rid;
  }
  EXPECT_EQ(live.Stat("max_item_bytes"), max_item);
  EXPECT_EQ(live.store->Stats().size, before.size);
  EXPECT_EQ(live.store->Stats().bytes_held, before.bytes_held);

  // A repeated id with larger (valid) items: the first request's keys, and no estimate from this request.
  const Frames bigger =
      live.Request("p", Insert(rid++, {std::string(5000, 'x'), "yy"}, {1, 1}, 0xA, 1, 0, {{0}, {0, 1}}, kChunks));
  ASSERT_EQ(bigger.size(), 3u);
  EXPECT_EQ(ParseHeader(bigger[0]).status, kOk);
  EXPECT_EQ(KeysOf(bigger[1]), keys);
  EXPECT_EQ(KeysOf(bigger[2]), KeysOf(first[2]));  // the chunk keys too
  EXPECT_EQ(live.Stat("max_item_bytes"), max_item);
  EXPECT_EQ(live.store->Stats().size, before.size);

  const Frames sample = live.Request("p", Sample(rid++, 4));
  ASSERT_FALSE(sample.empty());
  EXPECT_EQ(ParseHeader(sample[0]).status, kOk);
  EXPECT_TRUE(live.Logs("ERROR").empty());
}

TEST(ServeLoop, TheReplyEstimateCountsWhatTheStoreTook) {
  LiveLoop live(SmallStore(), Config());
  const Frames r = live.Request("p", Insert(1, {"x", "yy"}, {1, 1}, 0, 0, 0, {{0}, {0, 1}}, kChunks));
  ASSERT_EQ(ParseHeader(r[0]).status, kOk);
  // Item 1: 2 bytes and both chunks, 16 bytes of reference and offset each.
  EXPECT_EQ(live.Stat("max_item_bytes"), 2 + 64 + 16 + 64 + 16);
}

TEST(ServeLoop, AnInvalidChunkReferenceUnderTheRateLimiterIsInvalidArgumentAtOnce) {
  LoopConfig config = Config();
  config.samples_per_insert = 1;
  config.error_buffer = 10;
  LiveLoop live(SmallStore(), config);
  const Frames filled = live.Request("p", Insert(1, std::vector<std::string>(11, "item"), std::vector<double>(11, 1)));
  ASSERT_EQ(ParseHeader(filled[0]).status, kOk);
  const Frames held = live.Request("p", Insert(2, {"one"}, {1}));
  ASSERT_EQ(held.size(), 2u);
  ASSERT_EQ(ParseHeader(held[0]).status, kTimeout) << held[1];  // the limiter holds inserts back

  uint64_t rid = 3;
  for (uint32_t timeout_ms : {0u, 60000u}) {
    const Frames bad = live.Request("p", Insert(rid, {"a", "b"}, {1, 1}, 0, 0, timeout_ms, {{0, 1}, {2}}, kChunks));
    ASSERT_EQ(bad.size(), 2u) << timeout_ms;  // at once: a wait would outlast Request's deadline
    EXPECT_EQ(ParseHeader(bad[0]).rid, rid);
    EXPECT_EQ(ParseHeader(bad[0]).status, kInvalidArgument) << bad[1];
    EXPECT_NE(bad[1].find("items[1] references chunk 2: neither one of the 2 chunks sent nor a chunk key"),
              std::string::npos)
        << bad[1];
    ++rid;
  }
  EXPECT_EQ(live.Stat("rate_limiter_waits_insert"), 0);
  EXPECT_EQ(live.Stat("deferred"), 0);
  EXPECT_EQ(live.store->Size(), 11u);
}

TEST(ServeLoop, EveryRuleOfTheChunksIsCheckedBeforeAdmission) {
  LoopConfig config = Config();
  config.samples_per_insert = 1;
  config.error_buffer = 1;
  LiveLoop live(SmallStore(), config);
  ASSERT_EQ(ParseHeader(live.Request("p", Insert(1, {"a", "b"}, {1, 1}))[0]).status, kOk);
  struct Case {
    std::vector<std::vector<uint64_t>> refs;
    std::vector<std::string> chunks;
    std::string why;
  };
  const std::vector<Case> cases{
      {{{0}, {0}}, kChunks, "chunks[1] is referenced by no item"},
      {{{0, 0}, {1}}, kChunks, "items[0] references chunk 0 twice"},
      {{std::vector<uint64_t>(4097), {}}, {"c"}, "items[0] references 4097 chunks; an item may reference at most 4096"},
      {{{0, 12345}, {1}}, kChunks, "items[0] references chunk 12345: neither one of the 2 chunks sent nor a chunk key"},
      {{{0, MakeKey(0, 1, MakeTag(1, 1))}, {1, MakeKey(1, 1, MakeTag(1, 1))}},
       kChunks,
       "items[1] references stored chunks of shards 0 and 1; the items of one call and all their chunks live on one "
       "shard"},
  };
  uint64_t rid = 2;
  for (const Case& c : cases) {
    const Frames r = live.Request("p", Insert(rid++, {"a", "b"}, {1, 1}, 0, 0, 60000, c.refs, c.chunks));
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(ParseHeader(r[0]).status, kInvalidArgument) << r[1];
    EXPECT_NE(r[1].find(c.why), std::string::npos) << r[1];
  }
  // Chunks without items.
  const Frames none = live.Request("p", Insert(rid++, {}, {}, 0, 0, 60000, {}, {"c"}));
  ASSERT_EQ(none.size(), 2u);
  EXPECT_EQ(ParseHeader(none[0]).status, kInvalidArgument);
  EXPECT_NE(none[1].find("chunks sent without items"), std::string::npos) << none[1];
  EXPECT_EQ(live.Stat("deferred"), 0);
}

TEST(ServeLoop, APriorityTheStoreWouldRefuseIsInvalidArgumentUnderTheRateLimiterToo) {
  StoreConfig store = SmallStore();
  store.alpha = 1.0;  // a mass is the priority itself: 1e300 is above MAX_MASS = 1e250
  LoopConfig config = Config();
  config.samples_per_insert = 1;
  config.error_buffer = 2;
  LiveLoop live(store, config);
  ASSERT_EQ(ParseHeader(live.Request("p", Insert(1, {"a", "b"}, {1, 1}))[0]).status, kOk);
  ASSERT_EQ(ParseHeader(live.Request("p", Insert(2, {"c", "d", "e"}, {1, 1, 1}))[0]).status, kTimeout);
  const Frames r = live.Request("p", Insert(3, {"c", "d"}, {1, 1e300}, 0, 0, 60000));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(ParseHeader(r[0]).status, kInvalidArgument) << r[1];
  EXPECT_NE(r[1].find("priorities[1] = 1e+300 has mass"), std::string::npos) << r[1];
  EXPECT_EQ(live.Stat("deferred"), 0);
  // At the limit itself the store takes it (once the limiter does).
  EXPECT_NO_THROW(live.store->CheckPriorities(std::vector<double>{1e250, 0, 3}.data(), 3));
}

// A retry of an INSERT whose first request waits for the rate limiter waits for that request, not for the
// limiter: once the first is stored, the retry is answered with its keys, though the limiter would hold a new
// insert back (it used to wait for an admission it does not need, up to max_wait_s, then TIMEOUT).
TEST(ServeLoop, ARetryWaitingBehindItsInsertIdIsAnsweredWhenTheFirstIsStored) {
  LoopConfig config = Config();
  config.samples_per_insert = 1;
  config.error_buffer = 10;
  config.max_wait_s = 600;  // far past every deadline below: only the first request's keys can answer it
  LiveLoop live(SmallStore(), config);
  const Frames filled = live.Request("p", Insert(1, std::vector<std::string>(11, "item"), std::vector<double>(11, 1)));
  ASSERT_EQ(ParseHeader(filled[0]).status, kOk);
  FakeZmq& z = FakeZmq::Get();
  z.Push("p", Insert(2, {"one"}, {1}, 0xA, 1, 60000));  // held back by the limiter
  z.Push("p", Insert(3, {"one"}, {1}, 0xA, 1, 60000));  // its retry: waits behind the insert id
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (live.Stat("deferred") != 2 && std::chrono::steady_clock::now() < end) z.WaitPolls(1, 1.0);
  ASSERT_EQ(live.Stat("deferred"), 2);

  const Frames sample = live.Request("q", Sample(4, 1));  // room for one insert of 1, not two
  ASSERT_FALSE(sample.empty());
  ASSERT_EQ(ParseHeader(sample[0]).status, kOk);
  SentReply first, retry;
  ASSERT_TRUE(live.Next([](const SentReply& x) { return x.peer == "p" && ParseHeader(x.frames[0]).rid == 2; }, &first));
  ASSERT_TRUE(live.Next([](const SentReply& x) { return x.peer == "p" && ParseHeader(x.frames[0]).rid == 3; }, &retry));
  ASSERT_EQ(ParseHeader(first.frames[0]).status, kOk);
  ASSERT_EQ(ParseHeader(retry.frames[0]).status, kOk) << retry.frames[1];
  EXPECT_EQ(KeysOf(retry.frames[1]), KeysOf(first.frames[1]));
  EXPECT_EQ(live.store->Size(), 12u);
  const auto settled = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (live.Stat("deferred") != 0 && std::chrono::steady_clock::now() < settled) z.WaitPolls(1, 1.0);
  EXPECT_EQ(live.Stat("deferred"), 0);

  // The limiter's count is the stored items': one more insert of 1 is still held back.
  const Frames held = live.Request("p", Insert(5, {"two"}, {1}));
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(ParseHeader(held[0]).status, kTimeout) << held[1];
}

TEST(ServeLoop, APeerThatLeavesWhileWaitingLosesItsRequestsAndTheLoopServesOn) {
  LoopConfig config = Config();
  config.min_size_to_sample = 3;
  LiveLoop live(SmallStore(), config);
  FakeZmq& z = FakeZmq::Get();
  z.Push("gone", Sample(1, 1, 60000));
  z.Push("gone", Sample(2, 1, 60000));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (live.Stat("deferred") != 2 && std::chrono::steady_clock::now() < end) z.WaitPolls(1, 1.0);
  ASSERT_EQ(live.Stat("deferred"), 2);
  z.Vanish("gone");
  z.Push("gone", Update(3, {}, {}));  // its reply bounces: the loop learns that the peer left
  SentReply bounced;
  ASSERT_TRUE(live.Next([](const SentReply& x) { return x.peer == "gone"; }, &bounced));
  EXPECT_TRUE(bounced.bounced);
  EXPECT_EQ(ParseHeader(bounced.frames.empty() ? std::string() : bounced.frames[0]).rid, 0u);  // at its id
  const Frames r = live.Request("p", Insert(4, {"a", "b", "c"}, {1, 1, 1}));
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(ParseHeader(r[0]).status, kOk);
  const Frames s = live.Request("p", Sample(5, 2));
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(ParseHeader(s[0]).status, kOk);
  SentReply more;
  EXPECT_FALSE(live.Next([](const SentReply& x) { return x.peer == "gone"; }, &more, 0.2));
  EXPECT_EQ(live.Stat("deferred"), 0);
  EXPECT_EQ(live.Stat("deferred_dropped"), 2);
  EXPECT_EQ(live.store->Size(), 3u);
}

// A queue consumer that vanishes while its SAMPLE waits. The server learns at the send that the
// reply cannot go out (EHOSTUNREACH, at the routing id or at the first data frame), and gives the item back: the
// next consumer gets every item, once, in order. Inline and worker-served SAMPLEs alike.
TEST(ServeLoop, AQueueItemWhoseReplyCannotBeSentGoesBackToTheFrontInOrder) {
  for (const bool late : {false, true}) {
    for (const uint64_t inline_max : {uint64_t{1024}, uint64_t{0}}) {
      SCOPED_TRACE(std::string(late ? "late" : "at the id") + (inline_max == 0 ? ", worker" : ", inline"));
      StoreConfig store = SmallStore();
      store.sampler = SamplerKind::kFifo;
      store.eviction = EvictionKind::kFifo;
      store.max_times_sampled = 1;
      LimiterConfig queue;
      queue.kind = LimiterKind::kQueue;
      queue.queue_size = 3;
      std::vector<TableSpec> tables;
      tables.push_back(TableSpec{"queue", std::make_shared<ShardedStore>(store), queue});
      LoopConfig config = Config();
      config.inline_sample_max = inline_max;
      LiveLoop live(std::move(tables), config);
      FakeZmq& z = FakeZmq::Get();
      z.Push("gone", Sample(1, 1, 60000));
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (live.Stat("deferred") != 1 && std::chrono::steady_clock::now() < end) z.WaitPolls(1, 1.0);
      ASSERT_EQ(live.Stat("deferred"), 1);
      z.Vanish("gone", late);
      const Frames r = live.Request("p", Insert(2, {"A", "B", "C"}, {1, 1, 1}));
      ASSERT_EQ(r.size(), 3u);
      ASSERT_EQ(ParseHeader(r[0]).status, kOk);
      const std::vector<Key> keys = KeysOf(r[1]);
      SentReply bounced;
      ASSERT_TRUE(live.Next([](const SentReply& x) { return x.peer == "gone"; }, &bounced));
      EXPECT_TRUE(bounced.bounced);
      while (live.Stat("items_returned") != 1 && std::chrono::steady_clock::now() < end) z.WaitPolls(1, 1.0);
      EXPECT_EQ(live.Stat("items_returned"), 1);
      EXPECT_EQ(live.Stat("replies_dropped"), 1);
      EXPECT_EQ(live.Stat("rate_limiter_sampled_items"), 0);  // its count taken back too
      EXPECT_EQ(live.store->Size(), 3u);
      EXPECT_EQ(live.store->Held(), 0u);
      ASSERT_NO_THROW(live.store->Validate());
      const Frames s = live.Request("p", Sample(3, 3));
      ASSERT_GE(s.size(), 6u);
      ASSERT_EQ(ParseHeader(s[0]).status, kOk);
      EXPECT_EQ(s[5], "ABC");  // data: every item once, in order
      EXPECT_EQ(KeysOf(s[1]), keys);
      // Its items leave for good once the loop has seen the send succeed (just after the fake copied it out).
      while (live.store->Held() != 0 && std::chrono::steady_clock::now() < end) z.WaitPolls(1, 1.0);
      EXPECT_EQ(live.store->Size(), 0u);
      EXPECT_EQ(live.store->Stats().removed_by_sampling, 3u);
      EXPECT_EQ(live.store->Held(), 0u);
    }
  }
}

TEST(ServeLoop, StoredChunksAreReferencedByKeyAndAGoneOneIsStaleChunksWithNothingStored) {
  LiveLoop live(SmallStore(), Config());
  const Frames first = live.Request("p", Insert(1, {"x"}, {1}, 0xB, 1, 0, {{0, 1}}, kChunks));
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(ParseHeader(first[0]).status, kOk);
  const std::vector<Key> ck = KeysOf(first[2]);
  ASSERT_EQ(ck.size(), 2u);
  // A later request references them by key (and brings a chunk of its own): stored on their shard.
  const Frames second = live.Request("p", Insert(2, {"y"}, {1}, 0xB, 2, 0, {{ck[1], 0}}, {"c"}));
  ASSERT_EQ(ParseHeader(second[0]).status, kOk) << second[1];
  const std::vector<Key> k2 = KeysOf(second[1]);
  ASSERT_EQ(k2.size(), 1u);
  EXPECT_EQ(SplitKey(k2[0]).shard, SplitKey(ck[1]).shard);
  EXPECT_EQ(KeysOf(second[2]).size(), 1u);
  EXPECT_EQ(live.store->Stats().chunks, 3u);
  const std::vector<Key> k1 = KeysOf(first[1]);
  ASSERT_EQ(live.store->Erase(k1.data(), 1), 1u);  // chunk 0 goes with its only item; chunk 1 stays (item y)
  const StoreStats before = live.store->Stats();
  EXPECT_EQ(before.chunks, 2u);
  // A reference to the gone chunk: STALE_CHUNKS naming it, nothing stored; the live one alone is fine.
  const Frames stale = live.Request("p", Insert(3, {"z"}, {1}, 0xB, 3, 0, {{ck[1], ck[0]}}, {}));
  ASSERT_EQ(stale.size(), 2u);
  EXPECT_EQ(ParseHeader(stale[0]).status, kStaleChunks);
  EXPECT_NE(stale[1].find(std::to_string(ck[0])), std::string::npos) << stale[1];
  EXPECT_EQ(stale[1].find(std::to_string(ck[1])), std::string::npos) << stale[1];
  EXPECT_EQ(live.store->Stats().size, before.size);
  EXPECT_EQ(live.store->Stats().chunks, before.chunks);
  // A well-formed key of a shard the store does not have is as stale.
  const Frames foreign = live.Request("p", Insert(4, {"z"}, {1}, 0, 0, 0, {{MakeKey(200, 0, MakeTag(1, 1))}}, {}));
  EXPECT_EQ(ParseHeader(foreign[0]).status, kStaleChunks) << foreign[1];
  // The same insert id again, now with the chunk sent inline: stored (a refused request does not keep its id).
  const Frames fixed = live.Request("p", Insert(5, {"z"}, {1}, 0xB, 3, 0, {{ck[1], 0}}, {std::string(64, 'a')}));
  ASSERT_EQ(ParseHeader(fixed[0]).status, kOk) << fixed[1];
  EXPECT_EQ(live.store->Stats().size, before.size + 1);
  live.store->Validate();
  EXPECT_TRUE(live.Logs("ERROR").empty());
}

}  // namespace
}  // namespace apexrl::serve::testing
