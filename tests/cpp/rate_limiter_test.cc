// The rate limiter's kinds (serve/rate_limiter.h): MinSize and Queue beside SampleToInsertRatio, their rules,
// their refusals of requests that could never be admitted, and the waiting list releasing through them.
#include "apexrl/serve/rate_limiter.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "apexrl/errors.h"
#include "apexrl/serve/waitlist.h"
#include "apexrl/serve/wire.h"

namespace apexrl::serve {
namespace {

LimiterConfig Queue(uint64_t size) {
  LimiterConfig c;
  c.kind = LimiterKind::kQueue;
  c.queue_size = size;
  return c;
}

LimiterConfig MinSize(uint64_t n) {
  LimiterConfig c;
  c.kind = LimiterKind::kMinSize;
  c.min_size = n;
  return c;
}

TEST(RateLimiterKinds, MinSizeHoldsSamplesBackUntilTheTableHoldsEnoughAndNeverInserts) {
  RateLimiter rl(MinSize(3));
  EXPECT_EQ(rl.kind(), LimiterKind::kMinSize);
  EXPECT_FALSE(rl.limited());
  for (uint64_t size : {0, 1, 2}) {
    EXPECT_FALSE(rl.SampleOk(1, size, 0, 0)) << size;
    EXPECT_TRUE(rl.InsertOk(1000, size, 0, 0)) << size;
  }
  EXPECT_TRUE(rl.SampleOk(100, 3, 0, 0));  // with replacement: any n once big enough
  EXPECT_TRUE(rl.TrySample(5, 3));
  EXPECT_FALSE(rl.NeverAdmitted(kSample, 1000, 0).has_value());
  EXPECT_FALSE(rl.NeverAdmitted(kInsert, 1000, 0).has_value());
}

TEST(RateLimiterKinds, AQueueAdmitsInsertsUpToItsSizeAndSamplesWhileItHoldsAnything) {
  RateLimiter rl(Queue(4));
  EXPECT_EQ(rl.kind(), LimiterKind::kQueue);
  EXPECT_EQ(rl.queue_size(), 4u);
  EXPECT_TRUE(rl.InsertOk(4, 0, 0, 0));
  EXPECT_TRUE(rl.InsertOk(1, 3, 0, 0));
  EXPECT_FALSE(rl.InsertOk(2, 3, 0, 0));  // would hold 5 > 4
  EXPECT_FALSE(rl.InsertOk(1, 4, 0, 0));
  EXPECT_TRUE(rl.InsertOk(0, 4, 0, 0));
  EXPECT_FALSE(rl.SampleOk(1, 0, 0, 0));  // empty
  EXPECT_TRUE(rl.SampleOk(7, 1, 0, 0));
  EXPECT_TRUE(rl.BigEnough(1));
  EXPECT_FALSE(rl.BigEnough(0));
  EXPECT_TRUE(rl.TryInsert(3, 0));
  EXPECT_FALSE(rl.TryInsert(2, 3));
  uint64_t inserted, sampled;
  rl.Counts(&inserted, &sampled);
  EXPECT_EQ(inserted, 3u);  // the refused one counted nothing
  EXPECT_NE(rl.Describe().find("Queue(size=4)"), std::string::npos);
}

TEST(RateLimiterKinds, ResetCountsFromZeroAgainAndALateUndoStopsAtZero) {
  RateLimiter rl(1.0, 2.0, 1);  // SampleToInsertRatio: spi 1, error buffer 2, min size 1
  ASSERT_TRUE(rl.TryInsert(10, 0));
  ASSERT_TRUE(rl.TrySample(4, 10));
  uint64_t inserted, sampled;
  rl.Reset();
  rl.Counts(&inserted, &sampled);
  EXPECT_EQ(inserted, 0u);
  EXPECT_EQ(sampled, 0u);
  rl.Undo(0, 4);  // a SAMPLE admitted before the reset gives its count back after it
  rl.Counts(&inserted, &sampled);
  EXPECT_EQ(sampled, 0u);
  // The ratio is measured from the new counts: 3 inserted allow (3 - 1) * 1 + 2 = 4 samples.
  ASSERT_TRUE(rl.TryInsert(3, 0));
  EXPECT_TRUE(rl.TrySample(4, 3));
  EXPECT_FALSE(rl.TrySample(1, 3));
}

TEST(RateLimiterKinds, AQueueRefusesAnInsertLargerThanItselfWithTheReasonAndNothingElse) {
  RateLimiter rl(Queue(4));
  const auto why = rl.NeverAdmitted(kInsert, 5, 0);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("Queue(size=4)"), std::string::npos) << *why;
  EXPECT_FALSE(rl.NeverAdmitted(kInsert, 4, 4).has_value());  // full now, admitted later
  EXPECT_FALSE(rl.NeverAdmitted(kSample, 1000, 0).has_value());
}

TEST(RateLimiterKinds, InvalidConfigurationsAreRefused) {
  EXPECT_THROW(RateLimiter{Queue(0)}, InvalidArgument);
  LimiterConfig ratio;
  ratio.kind = LimiterKind::kSampleToInsertRatio;
  ratio.spi = 0;
  EXPECT_THROW(RateLimiter{ratio}, InvalidArgument);
  ratio.spi = 2;
  ratio.eb = -1;
  EXPECT_THROW(RateLimiter{ratio}, InvalidArgument);
  ratio.eb = 4;
  ratio.min_size = 2;
  RateLimiter rl(ratio);
  EXPECT_EQ(rl.kind(), LimiterKind::kSampleToInsertRatio);
  EXPECT_DOUBLE_EQ(rl.spi(), 2.0);
  EXPECT_EQ(rl.need(), 2u);
}

TEST(RateLimiterKinds, TheRatioKindFromItsConfigurationMatchesTheClassicConstructor) {
  LimiterConfig c;
  c.kind = LimiterKind::kSampleToInsertRatio;
  c.spi = 1.5;
  c.eb = 3;
  c.min_size = 4;
  RateLimiter a(c), b(1.5, 3, 4);
  for (uint64_t n = 0; n < 6; ++n) {
    for (uint64_t size = 0; size < 8; ++size) {
      for (uint64_t i = 0; i < 10; ++i) {
        for (uint64_t s = 0; s < 12; ++s) {
          EXPECT_EQ(a.InsertOk(n, size, i, s), b.InsertOk(n, size, i, s));
          EXPECT_EQ(a.SampleOk(n, size, i, s), b.SampleOk(n, size, i, s));
        }
      }
    }
  }
}

DeferredPtr Wait(uint16_t op, uint64_t n, uint64_t seq) {
  auto e = std::make_shared<Deferred>();
  e->op = op;
  e->n = n;
  e->seq = seq;
  e->deadline = 1e9;
  e->who = "a";
  e->peer = "a";
  return e;
}

TEST(RateLimiterKinds, TheWaitlistReleasesQueuedInsertsOnlyWhileTheyFitAndSamplesOnceAnythingIsThere) {
  RateLimiter rl(Queue(3));
  Waitlist w(100, 100, 1 << 20);
  auto s1 = Wait(kSample, 2, 1), i1 = Wait(kInsert, 2, 2), i2 = Wait(kInsert, 2, 3);
  for (auto& e : {s1, i1, i2}) ASSERT_EQ(w.Add(e, false), nullptr);
  // Empty queue: i1 fits (2 <= 3), then the sample may go (size 2 simulated), i2 would make it 4 > 3.
  auto ready = w.Release(rl, 0);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0], i1);
  EXPECT_EQ(ready[1], s1);
  EXPECT_EQ(w.count(), 1u);
  EXPECT_TRUE(w.Release(rl, 2).empty());  // still 2 + 2 > 3
  ready = w.Release(rl, 1);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0], i2);
}

}  // namespace
}  // namespace apexrl::serve
