#include "apexrl/sum_tree.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace apexrl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kF = SumMinTree::kFanout;

size_t RoundUpToBlock(size_t n) { return std::max(kF, (n + kF - 1) / kF * kF); }

// Sum of a 16-value block with four independent accumulators (vectorisable, and a fixed order, so the same
// children always give the same parent).
inline double BlockSum(const double* b) {
  double a0 = b[0] + b[4] + b[8] + b[12];
  double a1 = b[1] + b[5] + b[9] + b[13];
  double a2 = b[2] + b[6] + b[10] + b[14];
  double a3 = b[3] + b[7] + b[11] + b[15];
  return (a0 + a1) + (a2 + a3);
}

inline double BlockMinPositive(const double* b) {
  double m = kInf;
  for (size_t i = 0; i < kF; ++i) {
    const double v = b[i] > 0.0 ? b[i] : kInf;  // branch-free: compiles to a compare-select and a min
    m = v < m ? v : m;
  }
  return m;
}

inline double BlockMin(const double* b) {
  double m = b[0];
  for (size_t i = 1; i < kF; ++i) m = b[i] < m ? b[i] : m;
  return m;
}

// Picks the child of a 16-value block where the running sum first exceeds `mass`, and subtracts the
// children skipped. Rounding can leave mass >= the block's sum: then the last positive child is taken with
// a mass just inside it, so a descent always ends on a positive leaf.
inline size_t PickChild(const double* block, double& mass) {
  size_t last_positive = kF;
  for (size_t c = 0; c < kF; ++c) {
    const double s = block[c];
    if (s > 0.0) {
      if (mass < s) return c;
      last_positive = c;
    }
    mass -= s;
  }
  if (last_positive == kF) return 0;  // an all-zero block: only reachable when Total() == 0 (caller's error)
  mass = std::nextafter(block[last_positive], 0.0);
  return last_positive;
}

}  // namespace

SumMinTree::SumMinTree(size_t capacity) { Grow(std::max<size_t>(capacity, 1)); }

void SumMinTree::Grow(size_t capacity) {
  if (capacity <= capacity_ && !sums_.empty()) return;
  AlignedVector<double> leaves = sums_.empty() ? AlignedVector<double>() : std::move(sums_[0]);
  const size_t leaf_size = RoundUpToBlock(capacity);
  leaves.resize(leaf_size, 0.0);
  capacity_ = leaf_size;
  sums_.clear();
  mins_.clear();
  sums_.push_back(std::move(leaves));
  mins_.emplace_back();
  while (sums_.back().size() > kF) {
    const size_t parent_size = RoundUpToBlock(sums_.back().size() / kF);
    sums_.emplace_back(parent_size, 0.0);
    mins_.emplace_back(parent_size, kInf);
  }
  Rebuild();
}

void SumMinTree::Clear() {
  for (auto& level : sums_) std::fill(level.begin(), level.end(), 0.0);
  for (size_t l = 1; l < mins_.size(); ++l) std::fill(mins_[l].begin(), mins_[l].end(), kInf);
}

void SumMinTree::RecomputeNode(size_t level, size_t node) {
  const double* children = &sums_[level - 1][node * kF];
  sums_[level][node] = BlockSum(children);
  mins_[level][node] = level == 1 ? BlockMinPositive(children) : BlockMin(&mins_[level - 1][node * kF]);
}

void SumMinTree::Rebuild() {
  for (size_t l = 1; l < num_levels(); ++l) {
    const size_t n = sums_[l - 1].size() / kF;
    for (size_t j = 0; j < n; ++j) RecomputeNode(l, j);
  }
}

void SumMinTree::Set(size_t leaf, double value) {
  sums_[0][leaf] = value;
  size_t node = leaf;
  for (size_t l = 1; l < num_levels(); ++l) {
    node /= kF;
    RecomputeNode(l, node);
  }
}

void SumMinTree::SetBatch(const uint32_t* idx, const double* values, size_t n) {
  if (n == 0) return;
  if (n == 1) return Set(idx[0], values[0]);
  double* leaves = sums_[0].data();
  for (size_t i = 0; i < n; ++i) PrefetchLeaf(idx[i]);
  for (size_t i = 0; i < n; ++i) leaves[idx[i]] = values[i];
  // Dirty nodes of the level being recomputed, as (node << 1 | min_changed): a parent's minimum is
  // recomputed only when the minimum of one of its dirty children changed (exact, and it skips most reads of
  // the min blocks: a random update changes its block's minimum about once in eight).
  auto& dirty = scratch_;
  auto& next = scratch2_;
  // Sorted once here: the parents of a sorted list come out sorted, so each level only merges neighbours.
  dirty.resize(n);
  for (size_t i = 0; i < n; ++i) dirty[i] = (static_cast<uint64_t>(idx[i]) << 1) | 1u;
  std::sort(dirty.begin(), dirty.end());
  for (size_t l = 1; l < num_levels(); ++l) {
    next.clear();
    for (uint64_t d : dirty) next.push_back((((d >> 1) / kF) << 1) | (d & 1u));
    size_t m = 0;  // merge entries of one node, OR-ing their flags
    for (size_t i = 0; i < next.size(); ++i) {
      if (m > 0 && (next[m - 1] >> 1) == (next[i] >> 1)) {
        next[m - 1] |= next[i] & 1u;
      } else {
        next[m++] = next[i];
      }
    }
    next.resize(m);
    // Each recompute reads a block of children that is likely cold: request all of them first.
    const double* child_sums = sums_[l - 1].data();
    const double* child_mins = mins_[l - 1].data();
    for (uint64_t d : next) {
      const size_t node = static_cast<size_t>(d >> 1);
      __builtin_prefetch(&child_sums[node * kF]);
      __builtin_prefetch(&child_sums[node * kF + 8]);
      if (l > 1 && (d & 1u)) {
        __builtin_prefetch(&child_mins[node * kF]);
        __builtin_prefetch(&child_mins[node * kF + 8]);
      }
      __builtin_prefetch(&sums_[l][node], 1);  // the node itself is written (and its min compared) below
      __builtin_prefetch(&mins_[l][node], 1);
    }
    for (uint64_t& d : next) {
      const size_t node = static_cast<size_t>(d >> 1);
      sums_[l][node] = BlockSum(&child_sums[node * kF]);
      if (d & 1u) {
        const double m_new = l == 1 ? BlockMinPositive(&child_sums[node * kF]) : BlockMin(&child_mins[node * kF]);
        if (m_new == mins_[l][node]) {
          d &= ~uint64_t{1};
        } else {
          mins_[l][node] = m_new;
        }
      }
    }
    dirty.swap(next);
  }
}

double SumMinTree::Total() const { return BlockSum(sums_.back().data()); }

double SumMinTree::MinPositive() const {
  if (num_levels() == 1) return BlockMinPositive(sums_[0].data());
  return BlockMin(mins_.back().data());
}

size_t SumMinTree::Find(double mass) const {
  size_t node = 0;
  for (size_t l = num_levels(); l-- > 0;) {
    node = node * kF + PickChild(&sums_[l][node * kF], mass);
  }
  return node;
}

void SumMinTree::FindBatch(const double* masses, size_t n, uint32_t* leaves) const {
  // Level-major walk: all draws advance one level before any goes deeper, and each prefetches the block it
  // will read next, so up to n cache misses are in flight at once instead of one.
  thread_local std::vector<double> mass;
  mass.assign(masses, masses + n);
  std::fill(leaves, leaves + n, 0u);
  for (size_t l = num_levels(); l-- > 0;) {
    const double* level = sums_[l].data();
    const double* below = l > 0 ? sums_[l - 1].data() : nullptr;
    for (size_t i = 0; i < n; ++i) {
      const size_t node = static_cast<size_t>(leaves[i]) * kF + PickChild(&level[leaves[i] * kF], mass[i]);
      leaves[i] = static_cast<uint32_t>(node);
      if (below != nullptr) {
        __builtin_prefetch(&below[node * kF]);
        __builtin_prefetch(&below[node * kF + 8]);
      }
    }
  }
}

std::string SumMinTree::CheckConsistency() const {
  for (size_t l = 1; l < num_levels(); ++l) {
    const size_t n = sums_[l - 1].size() / kF;
    if (sums_[l].size() < n) return "level " + std::to_string(l) + " too small";
    for (size_t j = 0; j < sums_[l].size(); ++j) {
      double s = 0.0, m = kInf;
      if (j < n) {
        s = BlockSum(&sums_[l - 1][j * kF]);
        m = l == 1 ? BlockMinPositive(&sums_[l - 1][j * kF]) : BlockMin(&mins_[l - 1][j * kF]);
      }
      if (s != sums_[l][j] || m != mins_[l][j]) {
        return "node " + std::to_string(j) + " of level " + std::to_string(l) + " holds sum " +
               std::to_string(sums_[l][j]) + ", children give " + std::to_string(s);
      }
    }
  }
  for (double v : sums_[0]) {
    if (!(v >= 0.0) || !std::isfinite(v)) return "leaf value " + std::to_string(v) + " is not finite and >= 0";
  }
  return "";
}

}  // namespace apexrl
