// The eviction policies, driven directly the way a Shard drives them; the planners that split a store-wide
// eviction into per-shard quotas; and the table of kinds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/eviction/fifo.h"
#include "apexrl/eviction/kinds.h"
#include "apexrl/eviction/lowest_priority.h"
#include "apexrl/eviction/planner.h"
#include "apexrl/eviction/prioritized.h"
#include "apexrl/eviction/uniform.h"
#include "apexrl/random.h"

namespace apexrl {
namespace {

// Pearson's chi-square statistic of observed counts against expected probabilities.
double ChiSquare(const std::vector<uint64_t>& observed, const std::vector<double>& p, uint64_t draws) {
  double chi2 = 0.0;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double expected = p[i] * static_cast<double>(draws);
    const double d = static_cast<double>(observed[i]) - expected;
    chi2 += d * d / expected;
  }
  return chi2;
}

std::vector<Slot> Range(Slot n) {
  std::vector<Slot> v(n);
  std::iota(v.begin(), v.end(), Slot{0});
  return v;
}

// Draws `draws` victims among `live` without removing them; returns how often each slot came up.
std::vector<uint64_t> CountVictims(EvictionPolicy& policy, const std::vector<Slot>& live, size_t slots, int draws,
                                   uint64_t seed) {
  Rng rng(seed);
  std::vector<uint64_t> counts(slots, 0);
  for (int d = 0; d < draws; ++d) {
    const Slot s = policy.Victim(rng, kAnyRank, live);
    EXPECT_LT(s, slots);
    if (s < slots) ++counts[s];
  }
  return counts;
}

EvictionSummary Summary(const EvictionPolicy& policy, size_t max_ranks = 0) {
  EvictionSummary out;
  policy.Summarize(max_ranks, &out);
  return out;
}

std::vector<uint64_t> Ranks(const EvictionPolicy& policy, size_t k) { return Summary(policy, k).ranks; }

// ---------------------------------------------------------------------------------------------------------
// FifoPolicy

TEST(FifoPolicyTest, VictimsComeInInsertionOrderAndRankByInsertionNumber) {
  FifoPolicy fifo;
  fifo.Grow(10);
  Rng rng(1);
  EXPECT_TRUE(Ranks(fifo, 10).empty());
  EXPECT_EQ(fifo.CheckConsistency(0), "");
  const std::vector<Slot> slots = {5, 2, 7, 0, 9};
  for (size_t i = 0; i < slots.size(); ++i) {
    fifo.OnInsert(slots[i], 1.0, 100 + i);
    ASSERT_EQ(fifo.CheckConsistency(i + 1), "");
  }
  EXPECT_EQ(Ranks(fifo, 10), (std::vector<uint64_t>{100, 101, 102, 103, 104}));
  std::vector<Slot> live = slots;
  for (size_t i = 0; i < slots.size(); ++i) {
    ASSERT_EQ(fifo.Victim(rng, kAnyRank, live), slots[i]);
    ASSERT_EQ(Ranks(fifo, 1), std::vector<uint64_t>{100 + i});
    fifo.OnUpdate(slots[i], 99.0);  // priorities do not matter to FIFO
    ASSERT_EQ(fifo.Victim(rng, kAnyRank, live), slots[i]);
    fifo.OnErase(slots[i]);
    live.erase(live.begin());
    ASSERT_EQ(fifo.CheckConsistency(slots.size() - i - 1), "");
  }
  EXPECT_TRUE(Ranks(fifo, 10).empty());
}

TEST(FifoPolicyTest, EraseFromTheMiddleHeadAndTailKeepsTheRestInOrder) {
  FifoPolicy fifo;
  fifo.Grow(16);
  for (Slot s = 0; s < 10; ++s) fifo.OnInsert(s, 0.5, s + 1);  // slot s has seq s + 1
  fifo.OnErase(4);                                             // middle
  ASSERT_EQ(fifo.CheckConsistency(9), "");
  fifo.OnErase(0);  // head
  ASSERT_EQ(fifo.CheckConsistency(8), "");
  fifo.OnErase(9);  // tail
  ASSERT_EQ(fifo.CheckConsistency(7), "");
  fifo.OnErase(5);  // neighbour of an earlier hole
  ASSERT_EQ(fifo.CheckConsistency(6), "");
  EXPECT_EQ(Ranks(fifo, 100), (std::vector<uint64_t>{2, 3, 4, 7, 8, 9}));
  Rng rng(3);
  EXPECT_EQ(fifo.Victim(rng, kAnyRank, {1, 2, 3, 6, 7, 8}), 1u);
  // Appending after erasing the tail links to the new tail.
  fifo.OnInsert(9, 0.5, 50);
  fifo.OnInsert(4, 0.5, 51);  // a reused slot goes to the back, not its old place
  ASSERT_EQ(fifo.CheckConsistency(8), "");
  EXPECT_EQ(Ranks(fifo, 100), (std::vector<uint64_t>{2, 3, 4, 7, 8, 9, 50, 51}));
  // Erase everything from the back.
  for (Slot s : {4u, 9u, 8u, 7u, 6u, 3u, 2u, 1u}) fifo.OnErase(s);
  EXPECT_EQ(fifo.CheckConsistency(0), "");
  EXPECT_TRUE(Ranks(fifo, 100).empty());
}

TEST(FifoPolicyTest, SummaryListsTheRanksOfTheKOldestOnlyAndNoMass) {
  FifoPolicy fifo;
  fifo.Grow(8);
  for (Slot s = 0; s < 6; ++s) fifo.OnInsert(7 - s, 1.0, 10 * (s + 1));
  EXPECT_EQ(Ranks(fifo, 3), (std::vector<uint64_t>{10, 20, 30}));
  EXPECT_TRUE(Ranks(fifo, 0).empty());
  EXPECT_EQ(Ranks(fifo, 6), (std::vector<uint64_t>{10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(Ranks(fifo, 1000).size(), 6u);
  const EvictionSummary s = Summary(fifo, 2);
  EXPECT_EQ(s.mass, 0.0);  // the drawn shape's fields stay as the shard reset them
  EXPECT_EQ(s.urgent, 0u);
}

TEST(FifoPolicyTest, CheckConsistencyReportsAWrongItemCount) {
  FifoPolicy fifo;
  fifo.Grow(4);
  fifo.OnInsert(0, 1.0, 1);
  fifo.OnInsert(1, 1.0, 2);
  EXPECT_EQ(fifo.CheckConsistency(2), "");
  EXPECT_NE(fifo.CheckConsistency(1), "");
  EXPECT_NE(fifo.CheckConsistency(3), "");
}

// ---------------------------------------------------------------------------------------------------------
// PrioritizedPolicy

// Urgent count and mass as the policy reports them to the planner.
size_t Urgent(const EvictionPolicy& p) { return Summary(p).urgent; }
double Mass(const EvictionPolicy& p) { return Summary(p).mass; }

TEST(PrioritizedPolicyTest, ZeroPriorityItemsAreUrgentWithNegativeAlphaEvict) {
  PrioritizedPolicy policy(-0.4);
  policy.Grow(8);
  const std::vector<double> priorities = {1.0, 0.0, 2.0, 0.0, 0.5, 3.0};
  for (Slot s = 0; s < priorities.size(); ++s) policy.OnInsert(s, priorities[s], s + 1);
  ASSERT_EQ(policy.CheckConsistency(6), "");
  EXPECT_EQ(Urgent(policy), 2u);
  double expected_mass = 0.0;
  for (double p : priorities) {
    if (p > 0.0) expected_mass += std::pow(p, -0.4);
  }
  EXPECT_NEAR(Mass(policy), expected_mass, 1e-12);
  EXPECT_TRUE(Summary(policy, 100).ranks.empty());  // drawn victims have no ranks

  Rng rng(3);
  std::vector<Slot> live = Range(6);
  std::set<Slot> first;
  for (int i = 0; i < 2; ++i) {
    const Slot v = policy.Victim(rng, kAnyRank, live);
    first.insert(v);
    policy.OnErase(v);
    live.erase(std::find(live.begin(), live.end(), v));
    ASSERT_EQ(policy.CheckConsistency(5 - i), "");
  }
  EXPECT_EQ(first, (std::set<Slot>{1, 3}));
  EXPECT_EQ(Urgent(policy), 0u);
  // Only positive priorities remain: every draw now comes from them.
  for (int i = 0; i < 100; ++i) {
    const Slot v = policy.Victim(rng, kAnyRank, live);
    ASSERT_TRUE(v == 0 || v == 2 || v == 4 || v == 5) << v;
  }
}

TEST(PrioritizedPolicyTest, UpdatesMoveItemsInAndOutOfTheUrgentSet) {
  PrioritizedPolicy policy(-0.4);
  policy.Grow(4);
  policy.OnInsert(0, 1.0, 1);
  policy.OnInsert(1, 2.0, 2);
  policy.OnInsert(2, 0.0, 3);
  EXPECT_EQ(Urgent(policy), 1u);
  policy.OnUpdate(2, 4.0);  // no longer urgent
  EXPECT_EQ(Urgent(policy), 0u);
  EXPECT_NEAR(Mass(policy), 1.0 + std::pow(2.0, -0.4) + std::pow(4.0, -0.4), 1e-12);
  policy.OnUpdate(1, 0.0);  // becomes urgent, and its weight leaves the tree
  EXPECT_EQ(Urgent(policy), 1u);
  EXPECT_NEAR(Mass(policy), 1.0 + std::pow(4.0, -0.4), 1e-12);
  policy.OnUpdate(1, 0.0);  // updating an urgent item to zero again keeps it listed once
  EXPECT_EQ(Urgent(policy), 1u);
  ASSERT_EQ(policy.CheckConsistency(3), "");
  Rng rng(9);
  EXPECT_EQ(policy.Victim(rng, kAnyRank, Range(3)), 1u);
  policy.OnErase(1);
  ASSERT_EQ(policy.CheckConsistency(2), "");
  EXPECT_NEAR(Mass(policy), 1.0 + std::pow(4.0, -0.4), 1e-12);
}

TEST(PrioritizedPolicyTest, WeightThatOverflowsADoubleIsUrgent) {
  PrioritizedPolicy policy(-2.0);
  policy.Grow(4);
  policy.OnInsert(0, 1.0, 1);
  policy.OnInsert(1, 1e-200, 2);  // (1e-200)^-2 = 1e400: not finite
  policy.OnInsert(2, 0.5, 3);
  EXPECT_EQ(Urgent(policy), 1u);
  EXPECT_NEAR(Mass(policy), 1.0 + 4.0, 1e-12);
  Rng rng(4);
  EXPECT_EQ(policy.Victim(rng, kAnyRank, Range(3)), 1u);
}

TEST(PrioritizedPolicyTest, AlphaEvictZeroDrawsUniformlyWhateverThePriorities) {
  PrioritizedPolicy policy(0.0);
  policy.Grow(4);
  const std::vector<double> priorities = {0.0, 0.01, 1.0, 100.0};
  for (Slot s = 0; s < 4; ++s) policy.OnInsert(s, priorities[s], s + 1);
  EXPECT_EQ(Urgent(policy), 0u);  // zero is not urgent without a negative exponent
  EXPECT_EQ(Mass(policy), 4.0);
  const int draws = 40000;
  const auto counts = CountVictims(policy, Range(4), 4, draws, 11);
  EXPECT_LT(ChiSquare(counts, {0.25, 0.25, 0.25, 0.25}, draws), 30.0);  // 3 dof; p < 1e-5
  for (uint64_t c : counts) EXPECT_NEAR(static_cast<double>(c), draws / 4.0, 600.0);
}

TEST(PrioritizedPolicyTest, WithNoPreferenceItPicksUniformlyFromTheLiveSlots) {
  // alpha_evict > 0 and every priority 0: no urgent item and no mass.
  PrioritizedPolicy policy(1.0);
  policy.Grow(16);
  const std::vector<Slot> live = {3, 7, 8, 12, 15};
  for (Slot s : live) policy.OnInsert(s, 0.0, s + 1);
  EXPECT_EQ(Urgent(policy), 0u);
  EXPECT_EQ(Mass(policy), 0.0);
  const int draws = 50000;
  const auto counts = CountVictims(policy, live, 16, draws, 5);
  std::vector<uint64_t> on_live;
  for (Slot s = 0; s < 16; ++s) {
    if (std::find(live.begin(), live.end(), s) != live.end()) {
      on_live.push_back(counts[s]);
    } else {
      EXPECT_EQ(counts[s], 0u) << "picked slot " << s << ", which is not live";
    }
  }
  EXPECT_LT(ChiSquare(on_live, std::vector<double>(5, 0.2), draws), 30.0);  // 4 dof
  // One uniform pick is one rng.Below(live.size()), as the shard drew it before the policy did.
  Rng a(77), b(77);
  for (int i = 0; i < 20; ++i) ASSERT_EQ(policy.Victim(a, kAnyRank, live), live[b.Below(live.size())]);
  // One positive priority: it is the only candidate; zero-weight items are never drawn.
  policy.OnUpdate(8, 0.7);
  Rng rng(6);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(policy.Victim(rng, kAnyRank, live), 8u);
  policy.OnUpdate(8, 0.0);
  EXPECT_EQ(Mass(policy), 0.0);
  EXPECT_EQ(policy.CheckConsistency(5), "");
}

TEST(PrioritizedPolicyTest, TheRankBoundDoesNotApplyToDrawnVictims) {
  PrioritizedPolicy policy(-0.4);
  policy.Grow(4);
  policy.OnInsert(0, 0.0, 1);  // urgent
  policy.OnInsert(1, 1.0, 2);
  Rng rng(10);
  EXPECT_EQ(policy.Victim(rng, 0, Range(2)), 0u);
  policy.OnErase(0);
  EXPECT_EQ(policy.Victim(rng, 0, {1}), 1u);
}

TEST(PrioritizedPolicyTest, DrawFrequenciesAreProportionalToPriorityToTheAlphaEvict) {
  const std::vector<double> priorities = {0.1, 0.5, 1.0, 2.0, 5.0, 0.05};
  for (double alpha_evict : {-0.4, -1.0, 0.5, 1.0, 2.0}) {
    SCOPED_TRACE("alpha_evict " + std::to_string(alpha_evict));
    PrioritizedPolicy policy(alpha_evict);
    policy.Grow(priorities.size());
    std::vector<double> p(priorities.size());
    double total = 0.0;
    for (Slot s = 0; s < priorities.size(); ++s) {
      policy.OnInsert(s, priorities[s], s + 1);
      p[s] = std::pow(priorities[s], alpha_evict);
      total += p[s];
    }
    for (double& x : p) x /= total;
    EXPECT_NEAR(Mass(policy), total, 1e-9 * total);
    const int draws = 100000;
    const auto counts =
        CountVictims(policy, Range(static_cast<Slot>(priorities.size())), priorities.size(), draws, 1234);
    // 5 degrees of freedom: chi2 > 40 has probability ~1e-7 under the right distribution.
    EXPECT_LT(ChiSquare(counts, p, draws), 40.0);
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(static_cast<double>(counts[i]) / draws, p[i], 0.01) << "slot " << i;
    }
  }
}

TEST(PrioritizedPolicyTest, ErasedAndReinsertedSlotsCarryTheirNewWeight) {
  PrioritizedPolicy policy(1.0);
  policy.Grow(3);
  policy.OnInsert(0, 1.0, 1);
  policy.OnInsert(1, 1.0, 2);
  policy.OnErase(0);
  EXPECT_EQ(Mass(policy), 1.0);
  policy.Grow(100);  // growing keeps weights
  EXPECT_EQ(Mass(policy), 1.0);
  policy.OnInsert(0, 3.0, 3);
  EXPECT_EQ(Mass(policy), 4.0);
  const auto counts = CountVictims(policy, Range(2), 2, 40000, 8);
  EXPECT_NEAR(static_cast<double>(counts[0]) / 40000, 0.75, 0.02);
  EXPECT_EQ(policy.CheckConsistency(2), "");
  EXPECT_NE(policy.CheckConsistency(3), "");
}

// ---------------------------------------------------------------------------------------------------------
// LowestPriorityPolicy

uint64_t R(double priority) { return LowestPriorityPolicy::RankOf(priority); }

TEST(LowestPriorityPolicyTest, RanksOrderAsThePrioritiesDo) {
  const std::vector<double> ascending = {0.0, 4.9e-324,           1e-300, 0.001, 0.5,
                                         1.0, 1.0000000000000002, 3.0,    1e300, 1.7976931348623157e308};
  for (size_t i = 1; i < ascending.size(); ++i) EXPECT_LT(R(ascending[i - 1]), R(ascending[i])) << ascending[i];
  EXPECT_EQ(R(-0.0), R(0.0));  // -0.0 passes the store's validation and is the lowest priority, not the highest
  EXPECT_EQ(R(0.0), 0u);
}

TEST(LowestPriorityPolicyTest, VictimsComeInIncreasingPriorityAndFollowUpdates) {
  LowestPriorityPolicy policy;
  policy.Grow(8);
  const std::vector<double> priorities = {3.0, 0.5, 2.0, -0.0, 7.0, 1.0};
  for (Slot s = 0; s < priorities.size(); ++s) policy.OnInsert(s, priorities[s], 100 + s);
  ASSERT_EQ(policy.CheckConsistency(6), "");
  EXPECT_EQ(Ranks(policy, 4), (std::vector<uint64_t>{R(0.0), R(0.5), R(1.0), R(2.0)}));
  EXPECT_EQ(Summary(policy, 3).mass, 0.0);
  policy.OnUpdate(4, 0.25);  // 7 -> 0.25: now second
  policy.OnUpdate(3, 5.0);   // 0 -> 5: now second to last
  ASSERT_EQ(policy.CheckConsistency(6), "");
  std::vector<Slot> live = Range(6);
  Rng rng(1);
  const Rng before = rng;
  std::vector<Slot> order;
  while (!live.empty()) {
    const Slot v = policy.Victim(rng, kAnyRank, live);
    ASSERT_NE(v, kNoSlot);
    order.push_back(v);
    policy.OnErase(v);
    live.erase(std::find(live.begin(), live.end(), v));
    ASSERT_EQ(policy.CheckConsistency(live.size()), "");
  }
  EXPECT_EQ(order, (std::vector<Slot>{4, 1, 5, 2, 0, 3}));
  Rng untouched = before;
  EXPECT_EQ(rng.Next(), untouched.Next()) << "lowest-priority eviction drew from the generator";
}

TEST(LowestPriorityPolicyTest, MatchesASortedModelThroughRandomInsertsUpdatesAndErases) {
  LowestPriorityPolicy policy;
  Rng rng(3);
  std::map<Slot, double> model;  // live slot -> priority
  std::vector<Slot> free_slots;
  Slot next = 0;
  size_t capacity = 0;
  for (int step = 0; step < 4000; ++step) {
    const uint64_t op = model.empty() ? 0 : rng.Below(4);
    // Few distinct priorities, so ties are common.
    const double priority = static_cast<double>(rng.Below(20)) / 4.0;
    if (op <= 1) {
      Slot s;
      if (!free_slots.empty() && rng.Below(2) == 0) {
        s = free_slots.back();
        free_slots.pop_back();
      } else {
        s = next++;
      }
      if (s >= capacity) policy.Grow(capacity = 2 * capacity + 1);
      policy.OnInsert(s, priority, static_cast<uint64_t>(step) + 1);
      model[s] = priority;
    } else {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng.Below(model.size())));
      if (op == 2) {
        policy.OnUpdate(it->first, priority);
        it->second = priority;
      } else {
        policy.OnErase(it->first);
        free_slots.push_back(it->first);
        model.erase(it);
      }
    }
    ASSERT_EQ(policy.CheckConsistency(model.size()), "") << "step " << step;
    std::vector<uint64_t> sorted;
    std::vector<Slot> live;
    for (const auto& kv : model) {
      sorted.push_back(R(kv.second));
      live.push_back(kv.first);
    }
    std::sort(sorted.begin(), sorted.end());
    const size_t k = rng.Below(12);
    ASSERT_EQ(Ranks(policy, k), std::vector<uint64_t>(sorted.begin(), sorted.begin() + std::min(k, sorted.size())))
        << "step " << step;
    if (!live.empty()) {
      const Slot v = policy.Victim(rng, kAnyRank, live);
      ASSERT_TRUE(model.count(v)) << "victim is not live";
      ASSERT_EQ(R(model[v]), sorted[0]) << "victim is not of the lowest priority";
    }
  }
}

// An ordered policy gives its first victim only while that victim's rank is within the bound (inclusive),
// never a later one in its place, and never draws from the generator.
TEST(OrderedPoliciesTest, VictimIsTheFirstInOrderAndOnlyWithinTheRankBound) {
  FifoPolicy fifo;
  LowestPriorityPolicy lowest;
  struct Case {
    EvictionPolicy* policy;
    uint64_t first, second;  // the ranks of the two items below
  };
  for (const Case& c : {Case{&fifo, 20, 30}, Case{&lowest, R(0.5), R(1.5)}}) {
    EvictionPolicy& policy = *c.policy;
    policy.Grow(4);
    policy.OnInsert(3, 0.5, 20);  // first in both orders: older and of lower priority
    policy.OnInsert(1, 1.5, 30);
    Rng rng(2);
    const Rng before = rng;
    EXPECT_EQ(policy.Victim(rng, c.first, {3, 1}), 3u);
    EXPECT_EQ(policy.Victim(rng, c.first + 1, {3, 1}), 3u);
    EXPECT_EQ(policy.Victim(rng, c.first - 1, {3, 1}), kNoSlot);
    policy.OnErase(3);
    EXPECT_EQ(policy.Victim(rng, c.second - 1, {1}), kNoSlot);
    EXPECT_EQ(policy.Victim(rng, c.second, {1}), 1u);
    Rng untouched = before;
    EXPECT_EQ(rng.Next(), untouched.Next()) << "an ordered policy drew from the generator";
  }
}

// Growing keeps what an ordered policy holds, and CheckConsistency counts its items, whichever policy it is.
TEST(OrderedPoliciesTest, GrowKeepsTheOrderAndCheckConsistencyCountsItems) {
  FifoPolicy fifo;
  LowestPriorityPolicy lowest;
  for (EvictionPolicy* policy : {static_cast<EvictionPolicy*>(&fifo), static_cast<EvictionPolicy*>(&lowest)}) {
    policy->Grow(2);
    policy->OnInsert(1, 2.0, 1);
    policy->OnInsert(0, 1.0, 2);
    policy->Grow(1000);
    policy->OnInsert(999, 0.5, 3);
    policy->OnErase(0);
    EXPECT_EQ(policy->CheckConsistency(2), "");
    EXPECT_NE(policy->CheckConsistency(1), "");
    EXPECT_NE(policy->CheckConsistency(3), "");
  }
  EXPECT_EQ(Ranks(fifo, 5), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(Ranks(lowest, 5), (std::vector<uint64_t>{R(0.5), R(2.0)}));
  Rng rng(4);
  EXPECT_EQ(lowest.Victim(rng, kAnyRank, {1, 999}), 999u);
}

// ---------------------------------------------------------------------------------------------------------
// Planners

EvictionSummary Ordered(size_t size, std::vector<uint64_t> ranks) {
  EvictionSummary s;
  s.size = size;
  s.ranks = std::move(ranks);
  return s;
}

EvictionSummary Drawn(size_t size, double mass, size_t urgent) {
  EvictionSummary s;
  s.size = size;
  s.mass = mass;
  s.urgent = urgent;
  return s;
}

std::vector<size_t> Counts(const std::vector<EvictionQuota>& quotas) {
  std::vector<size_t> out;
  for (const EvictionQuota& q : quotas) out.push_back(q.count);
  return out;
}

std::vector<EvictionQuota> Plan(const EvictionPlanner& planner, size_t excess,
                                const std::vector<EvictionSummary>& shards, Rng& rng) {
  std::vector<EvictionQuota> quotas = {EvictionQuota{99, 99}};  // stale content must be replaced
  planner.Plan(excess, shards, rng, &quotas);
  EXPECT_EQ(quotas.size(), shards.size());
  return quotas;
}

TEST(OrderedPlannerTest, TakesTheGloballySmallestRanksAcrossShards) {
  const EvictionPlanner& planner = OrderedEvictionPlanner();
  EXPECT_EQ(planner.RanksPerShard(5), 5u);
  EXPECT_EQ(planner.RanksPerShard(size_t{1} << 40), kOrderedRound);
  // Shard 0 holds the oldest two, shard 2 the next, shard 1 nothing old enough.
  const std::vector<EvictionSummary> shards = {Ordered(9, {1, 2, 9, 11}), Ordered(4, {10, 12, 13, 14}),
                                               Ordered(3, {3, 8, 15})};
  Rng rng(1);
  const Rng before = rng;
  auto quotas = Plan(planner, 4, shards, rng);
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{2, 0, 2}));
  for (const EvictionQuota& q : quotas) EXPECT_EQ(q.max_rank, 8u);  // bounded by the 4th smallest rank
  quotas = Plan(planner, 7, shards, rng);                           // 1 2 3 8 9 10 11
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{4, 1, 2}));
  EXPECT_EQ(quotas[1].max_rank, 11u);
  Rng untouched = before;
  EXPECT_EQ(rng.Next(), untouched.Next()) << "the ordered planner drew from the generator";
}

TEST(OrderedPlannerTest, AnExcessBeyondWhatWasListedTakesEverythingListed) {
  const std::vector<EvictionSummary> shards = {Ordered(2, {5, 6}), Ordered(0, {}), Ordered(1, {4})};
  Rng rng(2);
  const auto quotas = Plan(OrderedEvictionPlanner(), 100, shards, rng);
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{2, 0, 1}));
  EXPECT_EQ(quotas[0].max_rank, 6u);
}

TEST(OrderedPlannerTest, NothingListedOrNothingToEvictGivesZeroQuotas) {
  Rng rng(3);
  EXPECT_EQ(Counts(Plan(OrderedEvictionPlanner(), 5, {Ordered(0, {}), Ordered(0, {})}, rng)),
            (std::vector<size_t>{0, 0}));
  EXPECT_EQ(Counts(Plan(OrderedEvictionPlanner(), 0, {Ordered(1, {1}), Ordered(1, {2})}, rng)),
            (std::vector<size_t>{0, 0}));
  EXPECT_TRUE(Plan(OrderedEvictionPlanner(), 5, {}, rng).empty());
}

TEST(OrderedPlannerTest, TiesAtTheCutoffGoToTheLowerShardsAndNeverCrowdOutSmallerRanks) {
  // Rank 1 in shard 1 must leave even though shard 0 lists two ranks equal to the cutoff first.
  Rng rng(4);
  auto quotas = Plan(OrderedEvictionPlanner(), 2, {Ordered(2, {5, 5}), Ordered(2, {1, 5})}, rng);
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{1, 1}));
  EXPECT_EQ(quotas[0].max_rank, 5u);
  // Three tied at the cutoff, two of them needed: shard 0's first, then shard 2's.
  quotas = Plan(OrderedEvictionPlanner(), 4, {Ordered(3, {2, 7, 9}), Ordered(1, {8}), Ordered(2, {7, 7})}, rng);
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{2, 0, 2}));
  quotas = Plan(OrderedEvictionPlanner(), 3, {Ordered(3, {2, 7, 9}), Ordered(1, {8}), Ordered(2, {7, 7})}, rng);
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{2, 0, 1}));
}

TEST(OrderedPlannerTest, OneRoundTakesAtMostKOrderedRound) {
  std::vector<uint64_t> ranks(kOrderedRound + 10);
  std::iota(ranks.begin(), ranks.end(), uint64_t{1});
  Rng rng(5);
  const auto quotas = Plan(OrderedEvictionPlanner(), ranks.size(), {Ordered(ranks.size(), ranks)}, rng);
  EXPECT_EQ(quotas[0].count, kOrderedRound);
  EXPECT_EQ(quotas[0].max_rank, kOrderedRound);
}

TEST(DrawnPlannerTest, UrgentItemsGoFirstInShardOrder) {
  const EvictionPlanner& planner = DrawnEvictionPlanner();
  EXPECT_EQ(planner.RanksPerShard(1000), 0u);
  const std::vector<EvictionSummary> shards = {Drawn(10, 1.0, 2), Drawn(10, 1.0, 0), Drawn(10, 1.0, 5)};
  Rng rng(6);
  const Rng before = rng;
  auto quotas = Plan(planner, 4, shards, rng);  // all from urgent items: no draw
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{2, 0, 2}));
  for (const EvictionQuota& q : quotas) EXPECT_EQ(q.max_rank, kAnyRank);
  Rng untouched = before;
  EXPECT_EQ(rng.Next(), untouched.Next()) << "urgent items need no draw";
  quotas = Plan(planner, 7, shards, rng);
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{2, 0, 5}));
}

TEST(DrawnPlannerTest, SplitsTheRestByMassWithOneUniformPerVictim) {
  // Masses 1 : 0 : 3. Stratified: of 4 victims, exactly 1 and 3 (segment j of the mass holds victim j).
  const std::vector<EvictionSummary> shards = {Drawn(100, 1.0, 0), Drawn(100, 0.0, 0), Drawn(100, 3.0, 0)};
  Rng rng(7), replay(7);
  const auto quotas = Plan(DrawnEvictionPlanner(), 4, shards, rng);
  EXPECT_EQ(Counts(quotas), (std::vector<size_t>{1, 0, 3}));
  for (int j = 0; j < 4; ++j) replay.Uniform();
  EXPECT_EQ(rng.Next(), replay.Next()) << "the split must draw exactly one uniform per victim";
  // Over many plans, a single victim lands on a shard in proportion to its mass.
  std::vector<uint64_t> hits(3, 0);
  const int plans = 40000;
  for (int i = 0; i < plans; ++i) {
    const auto q = Plan(DrawnEvictionPlanner(), 1, shards, rng);
    for (size_t s = 0; s < 3; ++s) hits[s] += q[s].count;
  }
  EXPECT_EQ(hits[1], 0u);
  EXPECT_NEAR(static_cast<double>(hits[0]) / plans, 0.25, 0.01);
}

TEST(DrawnPlannerTest, WithNoMassAnywhereSplitsByTheItemsNotAlreadyTakenAsUrgent) {
  // 4 items each; shard 0's are all urgent, so the 4 drawn victims split evenly over shards 1 and 2.
  const std::vector<EvictionSummary> shards = {Drawn(4, 0.0, 4), Drawn(4, 0.0, 0), Drawn(4, 0.0, 0)};
  Rng rng(8);
  EXPECT_EQ(Counts(Plan(DrawnEvictionPlanner(), 8, shards, rng)), (std::vector<size_t>{4, 2, 2}));
}

TEST(DrawnPlannerTest, AQuotaNeverExceedsTheShardsSize) {
  // Shard 0 has nearly all the mass but only 2 items: the rest is left to the store's next round.
  const std::vector<EvictionSummary> shards = {Drawn(2, 1000.0, 0), Drawn(50, 1e-9, 0)};
  Rng rng(9);
  EXPECT_EQ(Counts(Plan(DrawnEvictionPlanner(), 10, shards, rng)), (std::vector<size_t>{2, 0}));
  EXPECT_EQ(Counts(Plan(DrawnEvictionPlanner(), 10, {Drawn(0, 0.0, 0)}, rng)), (std::vector<size_t>{0}));
}

// ---------------------------------------------------------------------------------------------------------
// Kinds

TEST(EvictionKindsTest, NamesParseBackAndPickTheirPolicyAndPlanner) {
  EXPECT_EQ(ParseEvictionKind("fifo"), EvictionKind::kFifo);
  EXPECT_EQ(ParseEvictionKind("prioritized"), EvictionKind::kPrioritized);
  EXPECT_EQ(ParseEvictionKind("lowest_priority"), EvictionKind::kLowestPriority);
  EXPECT_EQ(ParseEvictionKind("min_heap"), EvictionKind::kLowestPriority);
  EXPECT_EQ(ParseEvictionKind("lifo"), EvictionKind::kLifo);
  EXPECT_EQ(ParseEvictionKind("uniform"), EvictionKind::kUniform);
  EXPECT_EQ(ParseEvictionKind("max_heap"), EvictionKind::kMaxHeap);
  EXPECT_STREQ(EvictionKindName(EvictionKind::kLowestPriority), "lowest_priority");
  for (EvictionKind kind : {EvictionKind::kFifo, EvictionKind::kPrioritized, EvictionKind::kLowestPriority,
                            EvictionKind::kLifo, EvictionKind::kUniform, EvictionKind::kMaxHeap}) {
    EXPECT_TRUE(IsEvictionKind(kind));
    EXPECT_EQ(ParseEvictionKind(EvictionKindName(kind)), kind);
    EXPECT_NE(MakeEvictionPolicy(kind, -0.4), nullptr);
  }
  EXPECT_NE(dynamic_cast<FifoPolicy*>(MakeEvictionPolicy(EvictionKind::kFifo, -0.4).get()), nullptr);
  EXPECT_NE(dynamic_cast<PrioritizedPolicy*>(MakeEvictionPolicy(EvictionKind::kPrioritized, -0.4).get()), nullptr);
  EXPECT_EQ(&EvictionPlannerFor(EvictionKind::kFifo), &OrderedEvictionPlanner());
  EXPECT_NE(dynamic_cast<LowestPriorityPolicy*>(MakeEvictionPolicy(EvictionKind::kLowestPriority, -0.4).get()),
            nullptr);
  EXPECT_EQ(&EvictionPlannerFor(EvictionKind::kPrioritized), &DrawnEvictionPlanner());
  EXPECT_EQ(&EvictionPlannerFor(EvictionKind::kLowestPriority), &OrderedEvictionPlanner());
  EXPECT_EQ(&EvictionPlannerFor(EvictionKind::kLifo), &OrderedEvictionPlanner());
  EXPECT_EQ(&EvictionPlannerFor(EvictionKind::kMaxHeap), &OrderedEvictionPlanner());
  EXPECT_EQ(&EvictionPlannerFor(EvictionKind::kUniform), &DrawnEvictionPlanner());
}

TEST(LifoPolicyTest, VictimsComeNewestFirstAndRankByTheInsertionNumbersComplement) {
  FifoPolicy p(/*newest_first=*/true);
  p.Grow(8);
  for (Slot s : {3, 1, 6}) p.OnInsert(s, 1.0, 10 + s);  // seqs 13, 11, 16: in insertion order here
  EvictionSummary out;
  p.Summarize(8, &out);
  EXPECT_EQ(out.ranks, (std::vector<uint64_t>{~uint64_t{16}, ~uint64_t{11}, ~uint64_t{13}}));
  Rng rng(1, 0);
  const std::vector<Slot> live{3, 1, 6};
  EXPECT_EQ(p.Victim(rng, kAnyRank, live), 6u);
  EXPECT_EQ(p.Victim(rng, ~uint64_t{16} - 1, live), kNoSlot);  // above the bound
  p.OnErase(6);
  EXPECT_EQ(p.Victim(rng, kAnyRank, live), 1u);
  p.OnErase(3);  // from the middle
  EXPECT_EQ(p.CheckConsistency(1), "");
  EXPECT_EQ(p.Victim(rng, kAnyRank, live), 1u);
}

TEST(MaxHeapPolicyTest, VictimsComeInDecreasingPriorityAndFollowUpdates) {
  LowestPriorityPolicy p(/*highest_first=*/true);
  p.Grow(8);
  p.OnInsert(0, 2.0, 1);
  p.OnInsert(1, 5.0, 2);
  p.OnInsert(2, 0.5, 3);
  Rng rng(1, 0);
  const std::vector<Slot> live{0, 1, 2};
  EXPECT_EQ(p.Victim(rng, kAnyRank, live), 1u);
  p.OnUpdate(2, 9.0);
  EXPECT_EQ(p.Victim(rng, kAnyRank, live), 2u);
  EvictionSummary out;
  p.Summarize(3, &out);
  ASSERT_EQ(out.ranks.size(), 3u);
  EXPECT_EQ(out.ranks[0], ~LowestPriorityPolicy::RankOf(9.0));
  EXPECT_LT(out.ranks[1], out.ranks[2]);  // 5.0 before 2.0
  EXPECT_EQ(p.CheckConsistency(3), "");
}

TEST(UniformPolicyTest, EveryLiveSlotIsEquallyLikelyAndNothingIsTracked) {
  UniformPolicy p;
  EvictionSummary out;
  p.Summarize(8, &out);
  EXPECT_TRUE(out.ranks.empty());
  EXPECT_EQ(out.mass, 0.0);
  EXPECT_EQ(out.urgent, 0u);
  Rng rng(7, 0);
  const std::vector<Slot> live{4, 9, 2, 7};
  std::map<Slot, int> seen;
  for (int i = 0; i < 40000; ++i) ++seen[p.Victim(rng, 0, live)];
  ASSERT_EQ(seen.size(), 4u);
  for (const auto& [slot, n] : seen) EXPECT_NEAR(n, 10000, 400) << slot;  // > 4 sigma
}

TEST(EvictionKindsTest, UnknownKindsAndNamesAreRejected) {
  const auto bad = static_cast<EvictionKind>(7);
  EXPECT_FALSE(IsEvictionKind(bad));
  EXPECT_THROW(MakeEvictionPolicy(bad, 0.0), InvalidArgument);
  EXPECT_THROW(EvictionPlannerFor(bad), InvalidArgument);
  EXPECT_THROW(EvictionKindName(bad), InvalidArgument);
  for (const char* name : {"lru", "FIFO", "", "fifo "}) {
    try {
      ParseEvictionKind(name);
      ADD_FAILURE() << "parsed '" << name << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()),
                "unknown eviction policy '" + std::string(name) +
                    "'; use 'fifo', 'prioritized', 'lowest_priority' ('min_heap'), 'lifo', 'uniform' or 'max_heap'");
    }
  }
}

}  // namespace
}  // namespace apexrl
