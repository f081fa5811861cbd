// SumMinTree: a 16-ary sum tree over non-negative leaf values that also tracks the smallest positive leaf.
#ifndef APEXRL_SUM_TREE_H_
#define APEXRL_SUM_TREE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "apexrl/aligned_vector.h"

namespace apexrl {

// Leaves hold the sampling masses (priority^alpha) of one shard's slots; each internal node holds the sum
// and the smallest positive value of its 16 children.
//
// Why 16-ary: a binary tree over 250k leaves is 18 levels of dependent cache misses per draw; with 16
// children per node (two cache lines of doubles) it is 5 levels, and FindBatch() walks a whole batch level by
// level with prefetches, so the misses of different draws overlap.
//
// Why no drift: every internal node is recomputed from its children (never adjusted by a delta), so the tree
// stays exactly consistent however many updates it sees; there is no periodic rebuild to schedule.
//
// Cost: Set O(16 log16 n); SetBatch shares the work of common ancestors; Find O(16 log16 n).
// Thread-safety: none; the owning Shard's mutex guards it.
class SumMinTree {
 public:
  static constexpr size_t kFanout = 16;

  explicit SumMinTree(size_t capacity = 0);

  size_t capacity() const { return capacity_; }
  // Grows to hold at least `capacity` leaves, keeping every value. Never shrinks.
  void Grow(size_t capacity);
  // Sets every leaf to 0.
  void Clear();

  double Get(size_t leaf) const { return sums_[0][leaf]; }
  // Requests the 16-leaf block holding `leaf` (two cache lines), ahead of a Set/SetBatch on it.
  void PrefetchLeaf(size_t leaf) const {
    const double* block = &sums_[0][leaf / kFanout * kFanout];
    __builtin_prefetch(block, 1);
    __builtin_prefetch(block + 8, 1);
  }
  // `value` must be finite and >= 0 (callers validate); a 0 leaf is never found and not a minimum.
  void Set(size_t leaf, double value);
  // Sets leaves[idx[i]] = values[i] in order (a repeated index keeps its last value), then recomputes each
  // touched ancestor once.
  void SetBatch(const uint32_t* idx, const double* values, size_t n);

  double Total() const;
  // Smallest positive leaf value, +infinity if every leaf is 0.
  double MinPositive() const;

  // The leaf where the running prefix sum first exceeds `mass`, for 0 <= mass < Total(). Only positive leaves
  // are ever returned; a mass at or past the total (rounding) returns the last positive leaf.
  size_t Find(double mass) const;
  // Find() for n masses at once; `masses` need not be sorted, but sorted masses share cached top nodes.
  void FindBatch(const double* masses, size_t n, uint32_t* leaves) const;

  // Recomputes every internal node from the leaves (after writing leaves in bulk with SetLeafUnsafe).
  void Rebuild();
  void SetLeafUnsafe(size_t leaf, double value) { sums_[0][leaf] = value; }

  // Checks that every internal node equals the sum/min of its children; returns a description of the first
  // mismatch, or "" if the tree is consistent (for tests and Validate()).
  std::string CheckConsistency() const;

 private:
  void RecomputeNode(size_t level, size_t node);  // node at `level` (>= 1) from its children at level-1
  size_t num_levels() const { return sums_.size(); }

  size_t capacity_ = 0;
  // sums_[0] are the leaves; sums_[l][j] = sum of sums_[l-1][16j .. 16j+15]. The top level is one block of 16.
  std::vector<AlignedVector<double>> sums_;
  // mins_[l][j] (l >= 1): smallest positive value below node j of level l; mins_[0] is unused.
  std::vector<AlignedVector<double>> mins_;
  std::vector<uint64_t> scratch_;  // dirty node lists for SetBatch
  std::vector<uint64_t> scratch2_;
};

}  // namespace apexrl

#endif  // APEXRL_SUM_TREE_H_
