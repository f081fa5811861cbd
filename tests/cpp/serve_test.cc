// The serving loop's pure parts, without sockets: waiting requests and their release through the rate
// limiter's rules, the decoder's refusals, the item check and the insert window.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "apexrl/serve/insert_window.h"
#include "apexrl/serve/item_check.h"
#include "apexrl/serve/rate_limiter.h"
#include "apexrl/serve/waitlist.h"
#include "apexrl/serve/wire.h"

namespace apexrl::serve {
namespace {

DeferredPtr Wait(uint16_t op, uint64_t n, uint64_t seq, const std::string& who = "a", double deadline = 1e9) {
  auto e = std::make_shared<Deferred>();
  e->op = op;
  e->n = n;
  e->seq = seq;
  e->deadline = deadline;
  e->who = who;
  e->peer = who;
  return e;
}

TEST(Waitlist, ReleaseLooksOnlyAtTheHeadsAndSimulatesAdmissionsInOrder) {
  RateLimiter rl(1.0, 4.0, 1);
  ASSERT_TRUE(rl.TryInsert(5, 10));  // I = 5, S = 0: samples of up to (5 - 1) + 4 = 8 items in all may go
  Waitlist w(100, 100, 1 << 20);
  auto s1 = Wait(kSample, 5, 1), s2 = Wait(kSample, 5, 2), s3 = Wait(kSample, 3, 3), i1 = Wait(kInsert, 1, 4);
  for (auto& e : {s1, s2, s3, i1}) EXPECT_EQ(w.Add(e, false), nullptr);
  // i1 must wait for a sample ((5 + 1 - 1) - 0 > 4); s1 goes (S = 5), then i1 (I = 6); s2 (10 > 9) blocks the
  // queue.
  auto ready = w.Release(rl, 10);
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0], s1);
  EXPECT_EQ(ready[1], i1);
  EXPECT_EQ(w.count(), 2u);
  EXPECT_EQ(w.examined_max, 4u);  // released + the two heads that stayed: s3 was never looked at
  uint64_t inserted, sampled;
  rl.Counts(&inserted, &sampled);
  EXPECT_EQ(inserted, 5u);  // nothing is counted until a request is served
  EXPECT_EQ(sampled, 0u);
}

TEST(Waitlist, RetriesBehindAnInsertIdWaitApartAndNeverBlockOrTakeAnAdmission) {
  RateLimiter rl(1.0, 0.0, 1);
  ASSERT_TRUE(rl.TryInsert(1, 10));  // I = 1, S = 0: no insert may go until a sample does
  Waitlist w(100, 100, 1 << 20);
  auto first = Wait(kInsert, 2, 1), retry = Wait(kInsert, 2, 2), other = Wait(kInsert, 1, 3);
  retry->behind_id = true;
  for (auto& e : {first, retry, other}) EXPECT_EQ(w.Add(e, false), nullptr);
  EXPECT_EQ(w.behind(), 1u);
  bool busy = true;
  const auto still_behind = [&](const Deferred& e) {
    EXPECT_EQ(&e, retry.get());  // asked of the retries alone
    return busy;
  };
  EXPECT_TRUE(w.Release(rl, 10, still_behind).empty());  // its id's owner still waits: so does it
  busy = false;                                          // the owner was stored (or gave up)
  auto ready = w.Release(rl, 10, still_behind);
  ASSERT_EQ(ready.size(), 1u);  // the limiter still holds `first` and `other` back
  EXPECT_EQ(ready[0], retry);
  EXPECT_EQ(w.count(), 2u);
  EXPECT_EQ(w.behind(), 0u);
  uint64_t inserted, sampled;
  rl.Counts(&inserted, &sampled);
  EXPECT_EQ(inserted, 1u);
}

TEST(Waitlist, CapsPerClientEvictTheOldestAndDeparturesDropTheirRequests) {
  Waitlist w(100, 2, 1 << 20);
  auto a1 = Wait(kSample, 1, 1, "a"), a2 = Wait(kSample, 1, 2, "a"), a3 = Wait(kSample, 1, 3, "a");
  auto b1 = Wait(kSample, 1, 4, "b", 5.0);
  EXPECT_EQ(w.Add(a1, false), nullptr);
  EXPECT_EQ(w.Add(a2, false), nullptr);
  EXPECT_EQ(w.Add(a3, false), a1);  // over max_waiting_per_peer: its oldest goes
  EXPECT_EQ(w.Add(b1, false), nullptr);
  EXPECT_EQ(w.NextDeadline().value(), 5.0);
  EXPECT_EQ(w.Expired(6.0), std::vector<DeferredPtr>{b1});
  EXPECT_EQ(w.DropPeer("a").size(), 2u);
  EXPECT_EQ(w.count(), 0u);
  EXPECT_FALSE(w.NextDeadline().has_value());
}

TEST(Waitlist, TotalAndByteCapsSayWhy) {
  Waitlist w(1, 10, 100);
  auto big = Wait(kInsert, 1, 1);
  big->nbytes = 101;
  EXPECT_NE(w.FullReason(*big)->find("max_waiting_mb"), std::string::npos);
  EXPECT_EQ(w.Add(Wait(kSample, 1, 2), false), nullptr);
  EXPECT_NE(w.FullReason(*Wait(kSample, 1, 3))->find("max_waiting=1"), std::string::npos);
}

std::vector<FrameView> Views(const std::vector<std::string>& f) {
  std::vector<FrameView> v;
  for (const auto& s : f) v.push_back({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  return v;
}

Refusal DecodeFrames(const std::vector<std::string>& f, Request* q, uint64_t max_bytes = 0) {
  auto v = Views(f);
  Message m{v.data(), v.size(), v.size(), 0};
  for (const auto& s : f) m.total_bytes += s.size();
  return Decode(m, max_bytes, q);
}

TEST(Wire, DecodesASampleAndRefusesBadHeadersWithTheirIds) {
  Request q;
  std::string h = EncodeHeader(kSample, 42, 0, 8);
  const double beta = 0.4;
  std::memcpy(h.data() + 24, &beta, 8);
  ASSERT_TRUE(DecodeFrames({h}, &q).ok());
  EXPECT_EQ(q.count, 8u);
  EXPECT_EQ(q.beta, 0.4);
  std::string bad = h;
  bad[18] = 1;  // flags
  Refusal r = DecodeFrames({bad}, &q);
  EXPECT_EQ(r.status, kBadMessage);
  EXPECT_EQ(r.op, kSample);
  EXPECT_EQ(r.request_id, 42u);
  EXPECT_EQ(r.message, "header flags is 0x0001, must be 0");
  // An INSERT may set FLAG_MAX_PRIORITY (and only that flag); HELLO names a table (the one whose spec it
  // declares), STATS none.
  Request hq;
  std::string insert = EncodeHeader(kInsert, 43, 0, 0);
  insert[18] = static_cast<char>(kFlagMaxPriority);
  EXPECT_EQ(DecodeFrames({insert}, &hq).message.find("flags"), std::string::npos);  // refused for its frames only
  insert[18] = 2;
  EXPECT_EQ(DecodeFrames({insert}, &hq).message, "header flags is 0x0002, must be 0 or 0x0001");
  std::string hello = EncodeHeader(kHello, 44, 0, 0);
  hello[36] = 3;
  ASSERT_TRUE(DecodeFrames({hello, "{}"}, &hq).ok());
  EXPECT_EQ(hq.table, 3u);
  std::string stats = EncodeHeader(kStats, 45, 0, 0);
  stats[36] = 3;
  EXPECT_EQ(DecodeFrames({stats}, &hq).status, kBadMessage);
  EXPECT_EQ(DecodeFrames({h, "extra"}, &q).status, kBadMessage);
  EXPECT_EQ(DecodeFrames({h}, &q, 39).status, kTooLarge);
  EXPECT_EQ(DecodeFrames({"APX"}, &q).message,
            "header magic is 415058 (frame of 3 bytes), expected 41505852 (b'APXR')");
}

TEST(Wire, FloatsInTheFewestDigitsThatReadBackTheSame) {
  for (double v : {1.0, -0.5, 1e16, 123.25, 0.0001, 0.00001, 1e300, 0.1, 1.7976931348623157e308}) {
    EXPECT_EQ(std::stod(FormatDouble(v)), v) << FormatDouble(v);
  }
  EXPECT_EQ(FormatDouble(1.0), "1");
  EXPECT_EQ(FormatDouble(0.1), "0.1");
  EXPECT_EQ(FormatDouble(std::nan("")), "nan");
  EXPECT_EQ(FormatDouble(-std::numeric_limits<double>::infinity()), "-inf");
  const uint8_t bytes[] = {0x41, 0x00, 0xff};
  EXPECT_EQ(HexBytes(bytes, 3), "4100ff");
}

TEST(ItemCheck, NamesTheFirstBadItemInTheCodecsRuleOrder) {
  ItemLayout l;
  l.fingerprint = 0x01020304;
  l.fields = {{"obs", 16, true}};
  l.repr = "Spec";
  auto item = [](uint32_t fp, uint32_t len, size_t body) {
    std::string s(reinterpret_cast<const char*>(&fp), 4);
    s += std::string(reinterpret_cast<const char*>(&len), 4) + std::string(body, 'x');
    return s;
  };
  const std::string data = item(0x01020304, 3, 3) + item(0x01020304, 9, 3);
  const uint64_t offsets[3] = {0, 11, 22};
  auto why = FirstBadItem(l, reinterpret_cast<const uint8_t*>(data.data()),
                          ItemSpans::Offsets(reinterpret_cast<const uint8_t*>(offsets), 2));
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why, "item 1: field 'obs': block of 9 bytes overruns the item");
  const uint64_t first_only[2] = {0, 11};
  EXPECT_FALSE(FirstBadItem(l, reinterpret_cast<const uint8_t*>(data.data()),
                            ItemSpans::Offsets(reinterpret_cast<const uint8_t*>(first_only), 1)));
}

TEST(InsertWindow, ReleasedOnEveryExitAndBoundedPerIdentity) {
  InsertWindow w(2, 1 << 20);
  std::vector<Key> keys;
  const InsertId a{"actor:x", 1, 1};
  EXPECT_EQ(w.TryClaim(a, 1, 10.0, 0.0, &keys), InsertWindow::Claim::kNew);
  EXPECT_EQ(w.TryClaim(a, 2, 10.0, 0.0, &keys), InsertWindow::Claim::kBusy);
  w.Release(a, 1);
  EXPECT_EQ(w.Stats().pending, 0u);
  EXPECT_EQ(w.TryClaim(a, 2, 10.0, 0.0, &keys), InsertWindow::Claim::kNew);
  const Key k[1] = {77};
  w.Finish(a, 2, k, 1);
  EXPECT_EQ(w.TryClaim(a, 3, 10.0, 0.0, &keys), InsertWindow::Claim::kDone);
  EXPECT_EQ(keys, std::vector<Key>{77});
  for (uint64_t s = 10; s < 20; ++s) w.Finish(InsertId{"actor:y", s, 0}, 0, k, 1);  // another identity
  EXPECT_EQ(w.TryClaim(a, 4, 10.0, 0.0, &keys), InsertWindow::Claim::kDone);
}

}  // namespace
}  // namespace apexrl::serve
