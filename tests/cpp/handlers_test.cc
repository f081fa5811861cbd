// The data ops' handlers (serve/handlers.h) on their own: a real store, insert window, rate limiter and sample
// pool, requests decoded from the frames a client would send, and no socket, loop or thread.
#include "apexrl/serve/handlers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "live_loop.h"

namespace apexrl::serve::testing {
namespace {

// A decoded request and the frames it views (kept alive with it).
struct Decoded {
  Frames frames;
  std::vector<FrameView> views;
  Call call;
};

std::unique_ptr<Decoded> Make(Frames frames, uint64_t serial = 1, std::string identity = "actor:0") {
  auto d = std::make_unique<Decoded>();
  d->frames = std::move(frames);
  uint64_t total = 0;
  for (const std::string& f : d->frames) {
    d->views.push_back(FrameView{reinterpret_cast<const uint8_t*>(f.data()), f.size()});
    total += f.size();
  }
  const Refusal bad = Decode(Message{d->views.data(), d->views.size(), d->views.size(), total}, 0, &d->call.req);
  EXPECT_TRUE(bad.ok()) << bad.message;
  d->call.identity = std::move(identity);
  d->call.serial = serial;
  d->call.t_arrival = 100.0;
  return d;
}

std::string FrameOf(const Reply& r, size_t i) {
  const FrameView f = r.Frame(i);
  return std::string(reinterpret_cast<const char*>(f.data), f.size);
}
ReplyHeader HeaderOf(const Reply& r) { return ParseHeader(FrameOf(r, 0)); }

class HandlersTest : public ::testing::Test {
 protected:
  explicit HandlersTest(double spi = 0, double eb = 0, uint64_t min_size = 1)
      : store_(Store()),
        limiter_(spi, eb, min_size),
        window_(1024, 1 << 20),
        handlers_(&store_, &limiter_, &window_, &pool_, 5.0,
                  [this](const char* level, std::string text) { logged_.emplace_back(level, std::move(text)); }) {}

  static StoreConfig Store() {
    StoreConfig c;
    c.capacity = 4;
    c.max_size = 100;
    c.shards = 2;
    return c;
  }

  // Serves `d` at its arrival time; true when it was answered.
  // As the loop does once libzmq has taken the reply: a SAMPLE's take is kept (an unsent one is given back).
  bool Serve(Decoded* d, Reply* reply, double now = 100.0) {
    const bool served = handlers_.Serve(&d->call, now, reply);
    if (served && reply->lease) reply->lease->Keep();
    return served;
  }

  Reply Served(Frames frames, uint64_t serial = 1) {
    auto d = Make(std::move(frames), serial);
    Reply r;
    EXPECT_TRUE(Serve(d.get(), &r));
    return r;
  }

  uint64_t Inserted() const {
    uint64_t inserted = 0, sampled = 0;
    limiter_.Counts(&inserted, &sampled);
    return inserted;
  }

  ShardedStore store_;
  RateLimiter limiter_;
  InsertWindow window_;
  SamplePool pool_;
  std::vector<std::pair<std::string, std::string>> logged_;
  Handlers handlers_;
};

TEST_F(HandlersTest, AnInsertWithAFreshIdIsStoredAndAnsweredWithItsKeys) {
  const Reply r = Served(Insert(7, {"a", "bbb"}, {1, 2}, 0xA, 1));
  const ReplyHeader h = HeaderOf(r);
  EXPECT_EQ(h.status, kOk);
  EXPECT_EQ(h.op, kInsert);
  EXPECT_EQ(h.rid, 7u);
  EXPECT_EQ(h.count, 2u);
  EXPECT_EQ(KeysOf(FrameOf(r, 1)).size(), 2u);
  EXPECT_EQ(store_.Size(), 2u);
  EXPECT_EQ(r.max_item_bytes, 3u);  // the largest item the store took
  EXPECT_EQ(Inserted(), 2u);
}

TEST_F(HandlersTest, ARepeatedInsertIdIsAnsweredFromTheWindowWithTheFirstKeys) {
  const Reply first = Served(Insert(1, {"a", "bb"}, {1, 1}, 0xA, 1), 1);
  const std::vector<Key> keys = KeysOf(FrameOf(first, 1));
  // The retry may carry other frames: the store never sees it, and it is answered with the first request's keys.
  const Reply again = Served(Insert(2, {"zzzzzz"}, {1}, 0xA, 1), 2);
  EXPECT_EQ(HeaderOf(again).status, kOk);
  EXPECT_EQ(HeaderOf(again).rid, 2u);
  EXPECT_EQ(KeysOf(FrameOf(again, 1)), keys);
  EXPECT_EQ(again.max_item_bytes, 0u);  // nothing stored
  EXPECT_EQ(store_.Size(), 2u);
  EXPECT_EQ(Inserted(), 2u);
  EXPECT_EQ(window_.Stats().duplicates, 1u);
  // The same id from another identity is another insert.
  auto other = Make(Insert(3, {"c"}, {1}, 0xA, 1), 3, "actor:1");
  Reply r;
  ASSERT_TRUE(Serve(other.get(), &r));
  EXPECT_EQ(HeaderOf(r).status, kOk);
  EXPECT_EQ(store_.Size(), 3u);
}

TEST_F(HandlersTest, InvalidContentIsRefusedBeforeAnythingIsAdmitted) {
  // A reference to chunk 5 of 2.
  auto bad = Make(Insert(1, {"a"}, {1}, 0xA, 1, 0, {{5}}, {"xx", "yy"}));
  bool spec = true;
  EXPECT_TRUE(handlers_.InsertContentProblem(bad->call.req, nullptr, &spec).has_value());
  EXPECT_FALSE(spec);
  // An item that does not fit the run's layout.
  ItemLayout layout;
  layout.fields = {{"x", 60, false}};  // 64-byte items
  auto small = Make(Insert(2, {"a"}, {1}, 0xA, 2));
  EXPECT_FALSE(handlers_.InsertContentProblem(small->call.req, nullptr, &spec).has_value());
  EXPECT_TRUE(handlers_.InsertContentProblem(small->call.req, &layout, &spec).has_value());
  EXPECT_TRUE(spec);
  // The check kept nothing: no items admitted by the limiter, the insert id still free.
  EXPECT_EQ(Inserted(), 0u);
  EXPECT_EQ(store_.Size(), 0u);
  EXPECT_EQ(window_.Stats().pending, 0u);
  const Reply r = Served(Insert(3, {"a"}, {1}, 0xA, 1), 3);
  EXPECT_EQ(HeaderOf(r).status, kOk);
  EXPECT_EQ(store_.Size(), 1u);
}

class RateLimitedHandlersTest : public HandlersTest {
 protected:
  RateLimitedHandlersTest() : HandlersTest(/*spi=*/1.0, /*eb=*/1.0, /*min_size=*/1) {}
};

TEST_F(RateLimitedHandlersTest, ARateLimitedInsertWaitsWhileItMayThenTimesOut) {
  ASSERT_EQ(HeaderOf(Served(Insert(1, {"a"}, {1}))).status, kOk);  // filling up is never limited
  // (1 + 2 - 1) * spi - 0 = 2 > eb: this INSERT must wait for the samplers.
  auto d = Make(Insert(2, {"b", "c"}, {1, 1}, 0xB, 1, /*timeout_ms=*/1000), 2);
  Reply r;
  EXPECT_FALSE(Serve(d.get(), &r, 100.0));  // within its timeout: it waits
  EXPECT_TRUE(d->call.waited);
  EXPECT_FALSE(Serve(d.get(), &r, 100.5));
  uint64_t wi = 0, ws = 0;
  limiter_.Waits(&wi, &ws);
  EXPECT_EQ(wi, 1u);  // counted once per request
  // While it waits it owns its insert id: a retry with the same id that cannot wait is TIMEOUT.
  auto retry = Make(Insert(3, {"b", "c"}, {1, 1}, 0xB, 1), 3);
  ASSERT_TRUE(Serve(retry.get(), &r));
  EXPECT_EQ(HeaderOf(r).status, kTimeout);
  EXPECT_NE(FrameOf(r, 1).find("still waiting"), std::string::npos);
  // Past its timeout it is answered TIMEOUT, and gives its id back.
  ASSERT_TRUE(Serve(d.get(), &r, 101.5));
  EXPECT_EQ(HeaderOf(r).status, kTimeout);
  EXPECT_EQ(HeaderOf(r).rid, 2u);
  EXPECT_NE(FrameOf(r, 1).find("rate limited"), std::string::npos);
  EXPECT_EQ(store_.Size(), 1u);
  EXPECT_EQ(window_.Stats().pending, 0u);
  // Once sampled from, the same insert fits.
  ASSERT_EQ(HeaderOf(Served(Sample(4, 1))).status, kOk);
  auto later = Make(Insert(5, {"b"}, {1}, 0xB, 1), 5);
  ASSERT_TRUE(Serve(later.get(), &r));
  EXPECT_EQ(HeaderOf(r).status, kOk);
  EXPECT_EQ(store_.Size(), 2u);
}

TEST_F(HandlersTest, ASampleDrawsFromTheStore) {
  ASSERT_EQ(HeaderOf(Served(Insert(1, {"aa", "bb", "cc"}, {1, 1, 1}))).status, kOk);
  const Reply r = Served(Sample(2, 5));
  const ReplyHeader h = HeaderOf(r);
  EXPECT_EQ(h.status, kOk);
  EXPECT_EQ(h.op, kSample);
  EXPECT_EQ(h.count, 5u);
  EXPECT_EQ(KeysOf(FrameOf(r, 1)).size(), 5u);
  const std::string data = FrameOf(r, 5);  // 5 items of 2 bytes, each one of those stored
  ASSERT_EQ(data.size(), 10u);
  for (size_t i = 0; i < 10; i += 2) {
    EXPECT_TRUE(data.substr(i, 2) == "aa" || data.substr(i, 2) == "bb" || data.substr(i, 2) == "cc");
  }
}

TEST_F(HandlersTest, ASampleOfAnEmptyStoreWaitsOrTimesOut) {
  auto d = Make(Sample(1, 1, /*timeout_ms=*/1000));
  Reply r;
  EXPECT_FALSE(Serve(d.get(), &r, 100.0));
  ASSERT_TRUE(Serve(d.get(), &r, 102.0));
  EXPECT_EQ(HeaderOf(r).status, kTimeout);
  EXPECT_NE(FrameOf(r, 1).find("min_size_to_sample=1"), std::string::npos);
}

// Workers serve concurrently: an ERASE on one can empty the store between a SAMPLE's size check and its draw
// on another. That SAMPLE found the store too small (TIMEOUT, or a wait), not a bad request (INVALID_ARGUMENT),
// and the limiter counts only the samples that were served.
TEST_F(HandlersTest, ASampleRacingAnEraseThatEmptiesTheStoreIsNeverInvalid) {
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    for (uint64_t rid = 1; !stop.load(); rid += 2) {
      auto ins = Make(Insert(rid, {"x"}, {1}), rid);
      Reply r;
      if (!Serve(ins.get(), &r) || HeaderOf(r).status != kOk) continue;
      auto del = Make(Erase(rid + 1, KeysOf(FrameOf(r, 1))), rid + 1);
      Serve(del.get(), &r);
    }
  });
  // Until both outcomes were seen many times (the churn thread may start late on a loaded machine), within a
  // deadline far beyond what it takes.
  uint64_t ok = 0, timeouts = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (uint64_t i = 0; (ok < 20000 || timeouts < 20000) && std::chrono::steady_clock::now() < deadline; ++i) {
    auto d = Make(Sample(i, 2));
    Reply r;
    if (!Serve(d.get(), &r)) {  // a sample with timeout 0 never waits
      ADD_FAILURE() << "sample " << i << " was not answered";
      break;  // (the churn thread is joined below either way)
    }
    const ReplyHeader h = HeaderOf(r);
    if (h.status != kOk && h.status != kTimeout) {
      ADD_FAILURE() << "status " << h.status << ": " << FrameOf(r, 1);
      break;
    }
    (h.status == kOk ? ok : timeouts) += 1;
  }
  stop = true;
  churn.join();
  uint64_t inserted = 0, sampled = 0;
  limiter_.Counts(&inserted, &sampled);
  EXPECT_EQ(sampled, 2 * ok);
  EXPECT_GE(ok, 20000u);
  EXPECT_GE(timeouts, 20000u);
}

TEST_F(HandlersTest, UpdatePrioritiesAnswersHowManyKeysItFound) {
  const std::vector<Key> keys = KeysOf(FrameOf(Served(Insert(1, {"a", "b"}, {1, 1})), 1));
  const Reply r = Served(Update(2, {keys[0], keys[1], Key{~0ull}}, {3, 4, 5}));
  EXPECT_EQ(HeaderOf(r).status, kOk);
  EXPECT_EQ(HeaderOf(r).op, kUpdatePriorities);
  EXPECT_EQ(HeaderOf(r).count, 2u);
}

// kFlagMaxPriority: each item gets the largest priority the table was given so far (1.0 before any); the flag
// rides in the header, the priorities frame is ignored.
Frames MaxPriorityInsert(uint64_t rid, const std::vector<std::string>& items) {
  Frames f = Insert(rid, items, std::vector<double>(items.size(), 0.0));
  std::memcpy(f[0].data() + 18, &kFlagMaxPriority, 2);
  return f;
}

TEST_F(HandlersTest, AnInsertFlaggedMaxPriorityGetsTheLargestPrioritySoFar) {
  const double alpha = store_.config().alpha;
  EXPECT_EQ(handlers_.MaxPriority(), 1.0);
  EXPECT_EQ(HeaderOf(Served(MaxPriorityInsert(1, {"a"}))).status, kOk);
  EXPECT_NEAR(store_.TotalMass(), 1.0, 1e-12);
  EXPECT_EQ(handlers_.MaxPriority(), 1.0);  // a flagged insert raises nothing
  const std::vector<Key> keys = KeysOf(FrameOf(Served(Insert(2, {"b", "c"}, {0.5, 0.25})), 1));
  EXPECT_EQ(handlers_.MaxPriority(), 0.5);  // the largest given, even below 1.0
  const double before = store_.TotalMass();
  EXPECT_EQ(HeaderOf(Served(MaxPriorityInsert(3, {"d", "e"}))).status, kOk);
  EXPECT_NEAR(store_.TotalMass() - before, 2 * std::pow(0.5, alpha), 1e-12);
  EXPECT_EQ(HeaderOf(Served(Update(4, {keys[0]}, {9.0}))).count, 1u);
  EXPECT_EQ(handlers_.MaxPriority(), 9.0);  // updates count too
  EXPECT_EQ(HeaderOf(Served(Update(5, {keys[0]}, {2.0}))).count, 1u);
  EXPECT_EQ(handlers_.MaxPriority(), 9.0);  // and it never goes down
  const double mass = store_.TotalMass();
  EXPECT_EQ(HeaderOf(Served(MaxPriorityInsert(6, {"f"}))).status, kOk);
  EXPECT_NEAR(store_.TotalMass() - mass, std::pow(9.0, alpha), 1e-9);
}

TEST_F(HandlersTest, TheLargestPriorityIsNeverLostToConcurrentUpdates) {
  const std::vector<Key> keys = KeysOf(FrameOf(Served(Insert(1, {"a", "b"}, {1, 1})), 1));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        auto d = Make(Update(10 + i, {keys[i % 2]}, {static_cast<double>(t * 1000 + i)}), 2 + t);
        Reply r;
        EXPECT_TRUE(Serve(d.get(), &r));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(handlers_.MaxPriority(), 3499.0);
}

TEST_F(HandlersTest, EraseAnswersAndCountsWhatItRemoved) {
  const std::vector<Key> keys = KeysOf(FrameOf(Served(Insert(1, {"a", "b", "c"}, {1, 1, 1})), 1));
  const Reply r = Served(Erase(2, {keys[1], keys[1]}));
  EXPECT_EQ(HeaderOf(r).status, kOk);
  EXPECT_EQ(HeaderOf(r).count, 1u);
  EXPECT_EQ(handlers_.erased_items(), 1u);
  EXPECT_EQ(store_.Size(), 2u);
}

TEST_F(HandlersTest, RemoveToFitTrimsTheStoreToItsCapacity) {
  ASSERT_EQ(HeaderOf(Served(Insert(1, {"a", "b", "c", "d", "e", "f"}, {1, 1, 1, 1, 1, 1}))).status, kOk);
  ASSERT_EQ(store_.Size(), 6u);
  const Reply r = Served(RemoveToFit(2));
  EXPECT_EQ(HeaderOf(r).status, kOk);
  EXPECT_EQ(HeaderOf(r).count, 2u);
  EXPECT_EQ(store_.Size(), 4u);
}

TEST_F(HandlersTest, AnOpOffTheDataPathIsAnInternalErrorAndLogged) {
  auto d = Make(Stats(9));
  Reply r;
  ASSERT_TRUE(Serve(d.get(), &r));
  EXPECT_EQ(HeaderOf(r).status, kInternal);
  ASSERT_EQ(logged_.size(), 1u);
  EXPECT_EQ(logged_[0].first, "ERROR");
}

// A slices table's handlers (handlers_slices.cc): episodes in by record, windows out as window items.
class SliceHandlersTest : public ::testing::Test {
 protected:
  SliceHandlersTest()
      : slices_(Config()),
        limiter_(0, 0, 1),
        window_(1024, 1 << 20),
        handlers_(nullptr, &limiter_, &window_, &pool_, 5.0, [](const char*, std::string) {}, nullptr, &slices_) {}

  static SliceConfig Config() {
    SliceConfig c;
    c.capacity_steps = 20;
    c.length = 2;
    c.burn_in = 1;
    c.span = 1;
    c.strict_length = false;
    return c;
  }

  // An episode's record over chunks of `steps` steps, one raw field of one byte per step.
  static std::string Record(const std::vector<uint64_t>& steps, const char* magic = "APXE") {
    std::string r(magic, 4);
    const uint16_t version = 1, flags = 0;
    const uint32_t c = static_cast<uint32_t>(steps.size()), f = 1;
    const uint64_t fp = 0x77;
    r +=
        std::string(reinterpret_cast<const char*>(&version), 2) + std::string(reinterpret_cast<const char*>(&flags), 2);
    r += std::string(reinterpret_cast<const char*>(&c), 4) + std::string(reinterpret_cast<const char*>(&f), 4);
    r += std::string(reinterpret_cast<const char*>(&fp), 8) + Array(steps);
    std::vector<uint64_t> columns;
    for (uint64_t k : steps) columns.insert(columns.end(), {0, k, 0});
    return r + Array(columns);
  }
  static std::vector<std::string> Chunks(const std::vector<uint64_t>& steps) {
    std::vector<std::string> chunks;
    char next = 'a';
    for (uint64_t k : steps) {
      std::string c;
      for (uint64_t j = 0; j < k; ++j) c += next++;
      chunks.push_back(c);
    }
    return chunks;
  }
  Frames Episode(uint64_t rid, const std::vector<uint64_t>& steps, uint64_t sequence = 0, const char* magic = "APXE") {
    std::vector<uint64_t> refs;
    for (uint64_t k = 0; k < steps.size(); ++k) refs.push_back(k);
    return Insert(rid, {Record(steps, magic)}, {2.0}, sequence ? 0xE : 0, sequence, 0, {refs}, Chunks(steps));
  }
  std::optional<std::string> Problem(const Frames& frames) {
    auto d = Make(frames);
    bool spec_refused = false;
    return handlers_.InsertContentProblem(d->call.req, nullptr, &spec_refused);
  }
  Reply Served(Frames frames, uint64_t serial = 1) {
    auto d = Make(std::move(frames), serial);
    Reply r;
    EXPECT_TRUE(handlers_.Serve(&d->call, 100.0, &r));
    if (r.lease) r.lease->Keep();
    return r;
  }

  SliceTable slices_;
  RateLimiter limiter_;
  InsertWindow window_;
  SamplePool pool_;
  Handlers handlers_;
};

TEST_F(SliceHandlersTest, HostileRecordsAreRefusedBeforeAnythingIsStored) {
  EXPECT_FALSE(Problem(Episode(1, {3, 2})));
  EXPECT_NE(Problem(Episode(1, {3, 2}, 0, "APXQ"))->find("magic"), std::string::npos);
  Frames swapped = Episode(1, {3, 2});
  swapped[5] = Array(std::vector<uint64_t>{1, 0});  // the chunks out of step order
  EXPECT_NE(Problem(swapped)->find("chunk reference 0 is 1"), std::string::npos);
  Frames shorter = Episode(1, {3, 2});
  shorter[3].pop_back();  // the record one byte short (its offsets follow it)
  shorter[2] = Array(std::vector<uint64_t>{0, shorter[3].size()});
  EXPECT_TRUE(Problem(shorter));
  EXPECT_NE(Problem(Episode(1, {20, 1}))->find("does not fit"), std::string::npos);
  EXPECT_EQ(slices_.Stats().inserted_episodes, 0u);
}

TEST_F(SliceHandlersTest, EpisodesGoInOnceAndWindowsComeOutAsWindowItems) {
  const Reply first = Served(Episode(1, {3, 2}, 5), 1);
  ASSERT_EQ(HeaderOf(first).status, kOk);
  EXPECT_EQ(KeysOf(FrameOf(first, 1)), std::vector<Key>{0});
  const Reply again = Served(Episode(2, {3, 2}, 5), 2);  // the same insert id: answered, not stored again
  EXPECT_EQ(KeysOf(FrameOf(again, 1)), std::vector<Key>{0});
  EXPECT_EQ(slices_.Stats().episodes, 1u);
  EXPECT_EQ(slices_.StepPriorities(0), std::vector<double>(5, 2.0));
  const Reply r = Served(Sample(3, 6, 0, 0.0));
  ASSERT_EQ(HeaderOf(r).status, kOk);
  ASSERT_EQ(HeaderOf(r).count, 6u);
  // Frames: keys, weights, probabilities, offsets, data, totals, size, item_chunks, item_chunk_offsets, chunk_data,
  // chunk_offsets. Each item a window item (slices/window_item.h) of t = burn_in + length = 3 steps.
  const std::string data = FrameOf(r, 5);
  EXPECT_EQ(data.substr(0, 4), "APXW");
  uint64_t t;
  std::memcpy(&t, data.data() + 40, 8);
  EXPECT_EQ(t, 3u);
  uint64_t windows;
  std::memcpy(&windows, FrameOf(r, 7).data(), 8);
  EXPECT_EQ(windows, 4u);  // starts 0..3 of 5 steps (span 1)
  const std::string chunk_data = FrameOf(r, 10);
  EXPECT_LE(chunk_data.size(), 5u);  // each chunk once
  EXPECT_EQ(Served(Erase(4, {0})).status, kInvalidArgument);
  EXPECT_EQ(Served(RemoveToFit(5)).status, kInvalidArgument);
  EXPECT_EQ(HeaderOf(Served(Update(6, {1}, {9.0}))).count, 1u);
  EXPECT_EQ(slices_.StepPriorities(0), (std::vector<double>{2.0, 2.0, 9.0, 9.0, 2.0}));  // window 1's trained steps
  EXPECT_EQ(HeaderOf(Served({Header(kReset, 7, 0)})).count, 1u);
  EXPECT_EQ(slices_.NumWindows(), 0u);
}

}  // namespace
}  // namespace apexrl::serve::testing
