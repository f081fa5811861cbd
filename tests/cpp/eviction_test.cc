// FifoPolicy and PrioritizedPolicy, driven directly the way a Shard drives them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "apexrl/eviction/fifo.h"
#include "apexrl/eviction/prioritized.h"
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

// Draws `draws` victims without removing them; returns how often each slot came up.
std::vector<uint64_t> CountVictims(EvictionPolicy& policy, size_t slots, int draws, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint64_t> counts(slots, 0);
  for (int d = 0; d < draws; ++d) {
    const Slot s = policy.Victim(rng);
    EXPECT_LT(s, slots);
    if (s < slots) ++counts[s];
  }
  return counts;
}

std::vector<uint64_t> Oldest(const FifoPolicy& fifo, size_t k) {
  std::vector<uint64_t> out;
  fifo.OldestSeqs(k, &out);
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// FifoPolicy

TEST(FifoPolicyTest, VictimsComeInInsertionOrder) {
  FifoPolicy fifo;
  fifo.Grow(10);
  Rng rng(1);
  EXPECT_EQ(fifo.oldest(), kNoSlot);
  EXPECT_EQ(fifo.CheckConsistency(0), "");
  const std::vector<Slot> slots = {5, 2, 7, 0, 9};
  for (size_t i = 0; i < slots.size(); ++i) {
    fifo.OnInsert(slots[i], 1.0, 100 + i);
    ASSERT_EQ(fifo.CheckConsistency(i + 1), "");
  }
  EXPECT_EQ(Oldest(fifo, 10), (std::vector<uint64_t>{100, 101, 102, 103, 104}));
  for (size_t i = 0; i < slots.size(); ++i) {
    ASSERT_EQ(fifo.Victim(rng), slots[i]);
    ASSERT_EQ(fifo.oldest(), slots[i]);
    ASSERT_EQ(fifo.seq(slots[i]), 100 + i);
    fifo.OnUpdate(slots[i], 99.0);  // priorities do not matter to FIFO
    ASSERT_EQ(fifo.Victim(rng), slots[i]);
    fifo.OnErase(slots[i]);
    ASSERT_EQ(fifo.CheckConsistency(slots.size() - i - 1), "");
  }
  EXPECT_EQ(fifo.Victim(rng), kNoSlot);
  EXPECT_TRUE(Oldest(fifo, 10).empty());
}

TEST(FifoPolicyTest, EraseFromTheMiddleHeadAndTailKeepsTheRestInOrder) {
  FifoPolicy fifo;
  fifo.Grow(16);
  for (Slot s = 0; s < 10; ++s) fifo.OnInsert(s, 0.5, s + 1);  // slot s has seq s + 1
  fifo.OnErase(4);  // middle
  ASSERT_EQ(fifo.CheckConsistency(9), "");
  fifo.OnErase(0);  // head
  ASSERT_EQ(fifo.CheckConsistency(8), "");
  fifo.OnErase(9);  // tail
  ASSERT_EQ(fifo.CheckConsistency(7), "");
  fifo.OnErase(5);  // neighbour of an earlier hole
  ASSERT_EQ(fifo.CheckConsistency(6), "");
  EXPECT_EQ(Oldest(fifo, 100), (std::vector<uint64_t>{2, 3, 4, 7, 8, 9}));
  EXPECT_EQ(fifo.oldest(), 1u);
  // Appending after erasing the tail links to the new tail.
  fifo.OnInsert(9, 0.5, 50);
  fifo.OnInsert(4, 0.5, 51);  // a reused slot goes to the back, not its old place
  ASSERT_EQ(fifo.CheckConsistency(8), "");
  EXPECT_EQ(Oldest(fifo, 100), (std::vector<uint64_t>{2, 3, 4, 7, 8, 9, 50, 51}));
  // Erase everything from the back.
  for (Slot s : {4u, 9u, 8u, 7u, 6u, 3u, 2u, 1u}) fifo.OnErase(s);
  EXPECT_EQ(fifo.CheckConsistency(0), "");
  EXPECT_EQ(fifo.oldest(), kNoSlot);
}

TEST(FifoPolicyTest, OldestSeqsAppendsTheKOldestOnly) {
  FifoPolicy fifo;
  fifo.Grow(8);
  for (Slot s = 0; s < 6; ++s) fifo.OnInsert(7 - s, 1.0, 10 * (s + 1));
  std::vector<uint64_t> out = {12345};
  fifo.OldestSeqs(3, &out);
  EXPECT_EQ(out, (std::vector<uint64_t>{12345, 10, 20, 30}));
  fifo.OldestSeqs(0, &out);
  EXPECT_EQ(out.size(), 4u);
  EXPECT_EQ(Oldest(fifo, 6), (std::vector<uint64_t>{10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(Oldest(fifo, 1000).size(), 6u);
}

TEST(FifoPolicyTest, GrowKeepsTheList) {
  FifoPolicy fifo;
  fifo.Grow(2);
  fifo.OnInsert(1, 1.0, 1);
  fifo.OnInsert(0, 1.0, 2);
  fifo.Grow(1000);
  fifo.OnInsert(999, 1.0, 3);
  fifo.OnErase(0);
  EXPECT_EQ(fifo.CheckConsistency(2), "");
  EXPECT_EQ(Oldest(fifo, 5), (std::vector<uint64_t>{1, 3}));
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

TEST(PrioritizedPolicyTest, ZeroPriorityItemsAreUrgentWithNegativeAlphaEvict) {
  PrioritizedPolicy policy(-0.4);
  policy.Grow(8);
  const std::vector<double> priorities = {1.0, 0.0, 2.0, 0.0, 0.5, 3.0};
  for (Slot s = 0; s < priorities.size(); ++s) policy.OnInsert(s, priorities[s], s + 1);
  ASSERT_EQ(policy.CheckConsistency(6), "");
  EXPECT_EQ(policy.urgent(), 2u);
  double expected_mass = 0.0;
  for (double p : priorities) {
    if (p > 0.0) expected_mass += std::pow(p, -0.4);
  }
  EXPECT_NEAR(policy.mass(), expected_mass, 1e-12);

  Rng rng(3);
  std::set<Slot> first;
  for (int i = 0; i < 2; ++i) {
    const Slot v = policy.Victim(rng);
    first.insert(v);
    policy.OnErase(v);
    ASSERT_EQ(policy.CheckConsistency(5 - i), "");
  }
  EXPECT_EQ(first, (std::set<Slot>{1, 3}));
  EXPECT_EQ(policy.urgent(), 0u);
  // Only positive priorities remain: every draw now comes from them.
  for (int i = 0; i < 100; ++i) {
    const Slot v = policy.Victim(rng);
    ASSERT_TRUE(v == 0 || v == 2 || v == 4 || v == 5) << v;
  }
}

TEST(PrioritizedPolicyTest, UpdatesMoveItemsInAndOutOfTheUrgentSet) {
  PrioritizedPolicy policy(-0.4);
  policy.Grow(4);
  policy.OnInsert(0, 1.0, 1);
  policy.OnInsert(1, 2.0, 2);
  policy.OnInsert(2, 0.0, 3);
  EXPECT_EQ(policy.urgent(), 1u);
  policy.OnUpdate(2, 4.0);  // no longer urgent
  EXPECT_EQ(policy.urgent(), 0u);
  EXPECT_NEAR(policy.mass(), 1.0 + std::pow(2.0, -0.4) + std::pow(4.0, -0.4), 1e-12);
  policy.OnUpdate(1, 0.0);  // becomes urgent, and its weight leaves the tree
  EXPECT_EQ(policy.urgent(), 1u);
  EXPECT_NEAR(policy.mass(), 1.0 + std::pow(4.0, -0.4), 1e-12);
  policy.OnUpdate(1, 0.0);  // updating an urgent item to zero again keeps it listed once
  EXPECT_EQ(policy.urgent(), 1u);
  ASSERT_EQ(policy.CheckConsistency(3), "");
  Rng rng(9);
  EXPECT_EQ(policy.Victim(rng), 1u);
  policy.OnErase(1);
  ASSERT_EQ(policy.CheckConsistency(2), "");
  EXPECT_NEAR(policy.mass(), 1.0 + std::pow(4.0, -0.4), 1e-12);
}

TEST(PrioritizedPolicyTest, WeightThatOverflowsADoubleIsUrgent) {
  PrioritizedPolicy policy(-2.0);
  policy.Grow(4);
  policy.OnInsert(0, 1.0, 1);
  policy.OnInsert(1, 1e-200, 2);  // (1e-200)^-2 = 1e400: not finite
  policy.OnInsert(2, 0.5, 3);
  EXPECT_EQ(policy.urgent(), 1u);
  EXPECT_NEAR(policy.mass(), 1.0 + 4.0, 1e-12);
  Rng rng(4);
  EXPECT_EQ(policy.Victim(rng), 1u);
}

TEST(PrioritizedPolicyTest, AlphaEvictZeroDrawsUniformlyWhateverThePriorities) {
  PrioritizedPolicy policy(0.0);
  policy.Grow(4);
  const std::vector<double> priorities = {0.0, 0.01, 1.0, 100.0};
  for (Slot s = 0; s < 4; ++s) policy.OnInsert(s, priorities[s], s + 1);
  EXPECT_EQ(policy.urgent(), 0u);  // zero is not urgent without a negative exponent
  EXPECT_EQ(policy.mass(), 4.0);
  const int draws = 40000;
  const auto counts = CountVictims(policy, 4, draws, 11);
  EXPECT_LT(ChiSquare(counts, {0.25, 0.25, 0.25, 0.25}, draws), 30.0);  // 3 dof; p < 1e-5
  for (uint64_t c : counts) EXPECT_NEAR(static_cast<double>(c), draws / 4.0, 600.0);
}

TEST(PrioritizedPolicyTest, PositiveAlphaEvictWithAllZeroPrioritiesHasNoPreference) {
  PrioritizedPolicy policy(1.0);
  policy.Grow(8);
  for (Slot s = 0; s < 5; ++s) policy.OnInsert(s, 0.0, s + 1);
  EXPECT_EQ(policy.urgent(), 0u);
  EXPECT_EQ(policy.mass(), 0.0);
  Rng rng(5);
  EXPECT_EQ(policy.Victim(rng), kNoSlot);
  // One positive priority: it is the only candidate; zero-weight items are never drawn.
  policy.OnUpdate(3, 0.7);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(policy.Victim(rng), 3u);
  policy.OnUpdate(3, 0.0);
  EXPECT_EQ(policy.Victim(rng), kNoSlot);
  EXPECT_EQ(policy.CheckConsistency(5), "");
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
    EXPECT_NEAR(policy.mass(), total, 1e-9 * total);
    const int draws = 100000;
    const auto counts = CountVictims(policy, priorities.size(), draws, 1234);
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
  EXPECT_EQ(policy.mass(), 1.0);
  policy.Grow(100);  // growing keeps weights
  EXPECT_EQ(policy.mass(), 1.0);
  policy.OnInsert(0, 3.0, 3);
  EXPECT_EQ(policy.mass(), 4.0);
  const auto counts = CountVictims(policy, 2, 40000, 8);
  EXPECT_NEAR(static_cast<double>(counts[0]) / 40000, 0.75, 0.02);
  EXPECT_EQ(policy.CheckConsistency(2), "");
  EXPECT_NE(policy.CheckConsistency(3), "");
}

}  // namespace
}  // namespace apexrl
