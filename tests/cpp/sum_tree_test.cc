// SumMinTree against a brute-force reference (a plain vector of leaf values).
//
// Most tests use "dyadic" values (multiples of 1/4 below 2^20): every sum of them is exact in a double, and so
// is subtracting them from a draw mass below 2^30, which means the tree's descent has no rounding at all and
// its answers can be compared with the reference exactly, boundaries included.
#include "apexrl/sum_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "apexrl/random.h"

namespace apexrl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A brute-force model of the tree: just the leaves.
struct Reference {
  std::vector<double> v;

  explicit Reference(size_t n) : v(n, 0.0) {}
  double Total() const {
    double t = 0.0;
    for (double x : v) t += x;
    return t;
  }
  double MinPositive() const {
    double m = kInf;
    for (double x : v) {
      if (x > 0.0) m = std::min(m, x);
    }
    return m;
  }
  double Prefix(size_t leaf) const {  // sum of the leaves before `leaf`
    double t = 0.0;
    for (size_t i = 0; i < leaf; ++i) t += v[i];
    return t;
  }
  // The positive leaf whose interval [prefix, prefix + value) contains `mass` (exact arithmetic assumed).
  size_t Find(double mass) const {
    double prefix = 0.0;
    size_t last_positive = v.size();
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] > 0.0) {
        if (mass < prefix + v[i]) return i;
        last_positive = i;
      }
      prefix += v[i];
    }
    return last_positive;  // mass >= total: the last positive leaf
  }
  size_t LastPositive() const {
    for (size_t i = v.size(); i-- > 0;) {
      if (v[i] > 0.0) return i;
    }
    return v.size();
  }
};

// A random multiple of 1/4 in [0, 64], zero with probability `zero_fraction`.
double DyadicValue(Rng& rng, double zero_fraction) {
  if (rng.Uniform() < zero_fraction) return 0.0;
  return static_cast<double>(1 + rng.Below(256)) * 0.25;
}

void ExpectMatchesReference(const SumMinTree& tree, const Reference& ref) {
  ASSERT_EQ(tree.CheckConsistency(), "");
  for (size_t i = 0; i < ref.v.size(); ++i) ASSERT_EQ(tree.Get(i), ref.v[i]) << "leaf " << i;
  for (size_t i = ref.v.size(); i < tree.capacity(); ++i) ASSERT_EQ(tree.Get(i), 0.0) << "padding leaf " << i;
  EXPECT_EQ(tree.Total(), ref.Total());
  EXPECT_EQ(tree.MinPositive(), ref.MinPositive());
}

// Leaf counts that cover one block, a partial block, exact powers of the fanout and partial upper levels.
const size_t kSizes[] = {1, 5, 16, 17, 255, 256, 257, 1000, 4096, 4097, 70001};

TEST(SumTreeTest, NewTreeIsEmptyWithCapacityRoundedUpToWholeBlocks) {
  for (size_t n : kSizes) {
    SumMinTree tree(n);
    EXPECT_GE(tree.capacity(), n);
    EXPECT_EQ(tree.capacity() % SumMinTree::kFanout, 0u) << n;
    EXPECT_LT(tree.capacity(), std::max<size_t>(n, 1) + SumMinTree::kFanout) << n;
    EXPECT_EQ(tree.Total(), 0.0);
    EXPECT_EQ(tree.MinPositive(), kInf);
    EXPECT_EQ(tree.CheckConsistency(), "");
  }
  SumMinTree zero;  // capacity 0 still gives a usable (one-block) tree
  EXPECT_GE(zero.capacity(), 1u);
  EXPECT_EQ(zero.Total(), 0.0);
  EXPECT_EQ(zero.CheckConsistency(), "");
}

TEST(SumTreeTest, RandomSetsMatchBruteForceReference) {
  Rng rng(12345);
  for (size_t n : kSizes) {
    SCOPED_TRACE("leaves " + std::to_string(n));
    SumMinTree tree(n);
    Reference ref(n);
    for (int round = 0; round < 20; ++round) {
      const size_t sets = 1 + rng.Below(std::min<size_t>(n, 200));
      for (size_t k = 0; k < sets; ++k) {
        const size_t leaf = rng.Below(n);
        const double value = DyadicValue(rng, round % 4 == 3 ? 0.9 : 0.3);
        tree.Set(leaf, value);
        ref.v[leaf] = value;
      }
      ASSERT_NO_FATAL_FAILURE(ExpectMatchesReference(tree, ref));
    }
  }
}

TEST(SumTreeTest, SetBatchWithRepeatedIndicesKeepsTheLastValue) {
  SumMinTree tree(300);
  Reference ref(300);
  const std::vector<uint32_t> idx = {7, 250, 7, 3, 250, 7, 299, 3};
  const std::vector<double> values = {1.0, 2.0, 3.0, 4.0, 0.0, 5.5, 0.25, 0.0};
  tree.SetBatch(idx.data(), values.data(), idx.size());
  ref.v[7] = 5.5;
  ref.v[250] = 0.0;
  ref.v[299] = 0.25;
  ref.v[3] = 0.0;
  ExpectMatchesReference(tree, ref);
  EXPECT_EQ(tree.Total(), 5.75);
  EXPECT_EQ(tree.MinPositive(), 0.25);
}

TEST(SumTreeTest, SetBatchMatchesOneSetPerLeaf) {
  Rng rng(99);
  for (size_t n : kSizes) {
    SCOPED_TRACE("leaves " + std::to_string(n));
    SumMinTree batched(n), single(n);
    Reference ref(n);
    for (int round = 0; round < 10; ++round) {
      const size_t m = 1 + rng.Below(3 * n);  // more entries than leaves: plenty of repeats
      std::vector<uint32_t> idx(m);
      std::vector<double> values(m);
      for (size_t k = 0; k < m; ++k) {
        idx[k] = static_cast<uint32_t>(rng.Below(n));
        values[k] = DyadicValue(rng, 0.4);
        single.Set(idx[k], values[k]);
        ref.v[idx[k]] = values[k];
      }
      batched.SetBatch(idx.data(), values.data(), m);
      ASSERT_NO_FATAL_FAILURE(ExpectMatchesReference(batched, ref));
      ASSERT_EQ(batched.Total(), single.Total());
      ASSERT_EQ(batched.MinPositive(), single.MinPositive());
    }
  }
}

TEST(SumTreeTest, SetBatchOfNothingChangesNothing) {
  SumMinTree tree(40);
  tree.Set(3, 2.0);
  tree.SetBatch(nullptr, nullptr, 0);
  EXPECT_EQ(tree.Total(), 2.0);
  EXPECT_EQ(tree.CheckConsistency(), "");
}

TEST(SumTreeTest, GrowKeepsEveryValue) {
  Rng rng(7);
  SumMinTree tree(20);
  Reference ref(20);
  for (size_t i = 0; i < 20; ++i) {
    ref.v[i] = DyadicValue(rng, 0.3);
    tree.Set(i, ref.v[i]);
  }
  for (size_t n : {size_t{33}, size_t{256}, size_t{257}, size_t{5000}, size_t{70001}}) {
    SCOPED_TRACE("grown to " + std::to_string(n));
    tree.Grow(n);
    ASSERT_GE(tree.capacity(), n);
    ref.v.resize(n, 0.0);
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesReference(tree, ref));
    // The new leaves work like the old ones.
    tree.Set(n - 1, 1.5);
    ref.v[n - 1] = 1.5;
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesReference(tree, ref));
    EXPECT_EQ(tree.Find(ref.Total() - 1.0), n - 1);
  }
  // Never shrinks.
  const size_t capacity = tree.capacity();
  tree.Grow(10);
  EXPECT_EQ(tree.capacity(), capacity);
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesReference(tree, ref));
}

TEST(SumTreeTest, MinPositiveIgnoresZerosAndIsInfinityWhenAllZero) {
  for (size_t n : {size_t{16}, size_t{300}, size_t{70001}}) {
    SCOPED_TRACE("leaves " + std::to_string(n));
    SumMinTree tree(n);
    EXPECT_EQ(tree.MinPositive(), kInf);
    tree.Set(n - 1, 8.0);
    tree.Set(0, 0.0);
    tree.Set(n / 2, 3.0);
    EXPECT_EQ(tree.MinPositive(), 3.0);
    tree.Set(1 % n, 1e-300);  // tiny but positive still counts
    EXPECT_EQ(tree.MinPositive(), 1e-300);
    tree.Set(1 % n, 0.0);  // back to zero: no longer the minimum
    EXPECT_EQ(tree.MinPositive(), 3.0);
    tree.Set(n / 2, 0.0);
    EXPECT_EQ(tree.MinPositive(), 8.0);
    tree.Set(n - 1, 0.0);
    EXPECT_EQ(tree.MinPositive(), kInf);
    EXPECT_EQ(tree.Total(), 0.0);
    EXPECT_EQ(tree.CheckConsistency(), "");
  }
}

TEST(SumTreeTest, FindLandsOnTheLeafWhosePrefixIntervalContainsTheMass) {
  Rng rng(2024);
  for (size_t n : kSizes) {
    SCOPED_TRACE("leaves " + std::to_string(n));
    SumMinTree tree(n);
    Reference ref(n);
    for (size_t i = 0; i < n; ++i) {
      ref.v[i] = DyadicValue(rng, 0.5);
      tree.Set(i, ref.v[i]);
    }
    if (ref.Total() == 0.0) {
      ref.v[0] = 1.0;
      tree.Set(0, 1.0);
    }
    const double total = tree.Total();
    ASSERT_EQ(total, ref.Total());
    for (int k = 0; k < 2000; ++k) {
      const double mass = rng.Uniform() * total;
      const size_t leaf = tree.Find(mass);
      ASSERT_LT(leaf, n);
      ASSERT_GT(ref.v[leaf], 0.0) << "mass " << mass;
      const double prefix = ref.Prefix(leaf);
      ASSERT_LE(prefix, mass) << "leaf " << leaf;
      ASSERT_LT(mass, prefix + ref.v[leaf]) << "leaf " << leaf;
      ASSERT_EQ(leaf, ref.Find(mass));
    }
    // Every interval boundary: a mass exactly at a prefix sum belongs to the next positive leaf.
    if (n <= 4097) {
      double prefix = 0.0;
      for (size_t i = 0; i < n; ++i) {
        if (ref.v[i] > 0.0) {
          ASSERT_EQ(tree.Find(prefix), i) << "boundary " << prefix;
          ASSERT_EQ(tree.Find(prefix + ref.v[i] * 0.5), i);
        }
        prefix += ref.v[i];
      }
    }
  }
}

TEST(SumTreeTest, FindWithRealValuedLeavesStaysWithinRoundingOfTheReferenceInterval) {
  Rng rng(77);
  const size_t n = 5000;
  SumMinTree tree(n);
  Reference ref(n);
  for (size_t i = 0; i < n; ++i) {
    ref.v[i] = rng.Uniform() < 0.2 ? 0.0 : std::pow(rng.Uniform() + 1e-3, 3.0);
    tree.Set(i, ref.v[i]);
  }
  ASSERT_NEAR(tree.Total(), ref.Total(), 1e-9 * ref.Total());
  ASSERT_EQ(tree.MinPositive(), ref.MinPositive());
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + ref.v[i];
  const double eps = 1e-9 * ref.Total();
  for (int k = 0; k < 20000; ++k) {
    const double mass = rng.Uniform() * tree.Total();
    const size_t leaf = tree.Find(mass);
    ASSERT_LT(leaf, n);
    ASSERT_GT(ref.v[leaf], 0.0);
    ASSERT_LE(prefix[leaf], mass + eps) << "leaf " << leaf;
    ASSERT_LT(mass, prefix[leaf + 1] + eps) << "leaf " << leaf;
  }
}

TEST(SumTreeTest, FindBatchAgreesWithFindForUnsortedMasses) {
  Rng rng(5);
  for (size_t n : kSizes) {
    SCOPED_TRACE("leaves " + std::to_string(n));
    SumMinTree tree(n);
    for (size_t i = 0; i < n; ++i) tree.Set(i, DyadicValue(rng, 0.6));
    tree.Set(n - 1, 2.0);
    const double total = tree.Total();
    std::vector<double> masses(513);
    for (double& m : masses) m = rng.Uniform() * total;
    masses[0] = 0.0;
    masses[1] = total;        // at the total: clamps
    masses[2] = total * 1.5;  // past it: clamps
    std::vector<uint32_t> leaves(masses.size(), 0xDEADBEEFu);
    tree.FindBatch(masses.data(), masses.size(), leaves.data());
    for (size_t k = 0; k < masses.size(); ++k) {
      ASSERT_EQ(leaves[k], tree.Find(masses[k])) << "mass " << masses[k];
      ASSERT_GT(tree.Get(leaves[k]), 0.0);
    }
    std::sort(masses.begin(), masses.end());  // sorted masses must give the same answers
    tree.FindBatch(masses.data(), masses.size(), leaves.data());
    for (size_t k = 0; k < masses.size(); ++k) ASSERT_EQ(leaves[k], tree.Find(masses[k]));
  }
}

TEST(SumTreeTest, ZeroLeavesAreNeverReturned) {
  // Positive leaves separated by long runs of zeros, some spanning whole blocks and whole subtrees.
  const size_t n = 70001;
  SumMinTree tree(n);
  Reference ref(n);
  const std::vector<size_t> positive = {0, 17, 255, 256, 4095, 4096, 4097, 30000, 65535, 70000};
  for (size_t i : positive) {
    ref.v[i] = 1.0;
    tree.Set(i, 1.0);
  }
  tree.Set(18, 0.0);  // explicit zero writes too
  tree.Set(0, 0.0);
  ref.v[0] = 0.0;
  std::vector<double> masses;
  for (double m = 0.0; m <= tree.Total() + 1.0; m += 0.125) masses.push_back(m);
  std::vector<uint32_t> leaves(masses.size());
  tree.FindBatch(masses.data(), masses.size(), leaves.data());
  for (size_t k = 0; k < masses.size(); ++k) {
    const size_t leaf = tree.Find(masses[k]);
    ASSERT_GT(ref.v[leaf], 0.0) << "mass " << masses[k] << " found zero leaf " << leaf;
    ASSERT_EQ(leaf, ref.Find(masses[k]));
    ASSERT_EQ(leaves[k], leaf);
  }
}

TEST(SumTreeTest, MassAtOrPastTotalClampsToTheLastPositiveLeaf) {
  // The last positive leaf sits early, so the clamp has to pick it at every level above it.
  for (size_t n : {size_t{16}, size_t{300}, size_t{4096}, size_t{70001}}) {
    SCOPED_TRACE("leaves " + std::to_string(n));
    SumMinTree tree(n);
    Reference ref(n);
    for (size_t i : {size_t{0}, size_t{3}, std::min<size_t>(n - 1, 9)}) {
      ref.v[i] = 0.5 + static_cast<double>(i);
      tree.Set(i, ref.v[i]);
    }
    const size_t last = ref.LastPositive();
    const double total = tree.Total();
    ASSERT_EQ(total, ref.Total());
    for (double mass : {total, std::nextafter(total, kInf), total + 1.0, 2.0 * total, 1e300}) {
      EXPECT_EQ(tree.Find(mass), last) << "mass " << mass;
      uint32_t leaf = 0;
      tree.FindBatch(&mass, 1, &leaf);
      EXPECT_EQ(leaf, last) << "mass " << mass;
    }
    // Just below the total still lands on the last positive leaf.
    EXPECT_EQ(tree.Find(std::nextafter(total, 0.0)), last);
  }
}

TEST(SumTreeTest, ClearSetsEveryLeafToZero) {
  SumMinTree tree(1000);
  for (size_t i = 0; i < 1000; i += 3) tree.Set(i, 2.0);
  tree.Clear();
  Reference ref(1000);
  ExpectMatchesReference(tree, ref);
  tree.Set(999, 4.0);
  EXPECT_EQ(tree.Find(1.0), 999u);
  EXPECT_EQ(tree.MinPositive(), 4.0);
}

TEST(SumTreeTest, RebuildAfterUnsafeLeafWritesMatchesSet) {
  Rng rng(31);
  const size_t n = 5000;
  SumMinTree bulk(n), incremental(n);
  Reference ref(n);
  for (size_t i = 0; i < n; ++i) {
    ref.v[i] = DyadicValue(rng, 0.5);
    bulk.SetLeafUnsafe(i, ref.v[i]);
    incremental.Set(i, ref.v[i]);
  }
  bulk.Rebuild();
  ExpectMatchesReference(bulk, ref);
  EXPECT_EQ(bulk.Total(), incremental.Total());
  for (int k = 0; k < 500; ++k) {
    const double mass = rng.Uniform() * bulk.Total();
    ASSERT_EQ(bulk.Find(mass), incremental.Find(mass));
  }
}

TEST(SumTreeTest, CheckConsistencyReportsAStaleInternalNode) {
  SumMinTree tree(1000);
  tree.Set(10, 1.0);
  ASSERT_EQ(tree.CheckConsistency(), "");
  tree.SetLeafUnsafe(500, 3.0);  // leaf written without updating its ancestors
  EXPECT_NE(tree.CheckConsistency(), "");
  tree.Rebuild();
  EXPECT_EQ(tree.CheckConsistency(), "");
  EXPECT_EQ(tree.Total(), 4.0);
}

}  // namespace
}  // namespace apexrl
