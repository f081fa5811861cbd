// LowestPriorityPolicy: lowest priority first across the whole store (min_heap), or highest first (max_heap); an
// ordered policy, see policy.h.
#ifndef APEXRL_EVICTION_LOWEST_PRIORITY_H_
#define APEXRL_EVICTION_LOWEST_PRIORITY_H_

#include <cstdint>
#include <vector>

#include "apexrl/eviction/policy.h"

namespace apexrl {

// An item's rank is its current priority (RankOf), so the planner's "smallest ranks first" evicts the
// store's lowest priorities, deterministically (highest_first: the rank's complement, the highest first); equal
// priorities leave in no particular order. A priority update moves the item in the order. alpha_evict plays no part.
//
// A binary min-heap of (rank, slot) plus each slot's position in it. Cost: O(log n) per insert, update and
// erase, O(1) per victim, Summarize O(k log k) for k ranks.
class LowestPriorityPolicy final : public EvictionPolicy {
 public:
  explicit LowestPriorityPolicy(bool highest_first = false) : highest_first_(highest_first) {}
  // A validated priority (finite, >= 0) as a rank: for non-negative doubles the IEEE-754 bit pattern orders
  // as the value does. -0.0, which passes validation, ranks as 0.0.
  static uint64_t RankOf(double priority);

  void Grow(size_t slot_capacity) override;
  void OnInsert(Slot slot, double priority, uint64_t seq) override;
  void OnUpdate(Slot slot, double priority) override;
  void OnErase(Slot slot) override;
  void Summarize(size_t max_ranks, EvictionSummary* out) const override;
  // The first item in priority order, if its rank is at most `max_rank`.
  Slot Victim(Rng& rng, uint64_t max_rank, const std::vector<Slot>& live) override;
  void Front(size_t max_items, uint64_t max_rank, std::vector<Slot>* slots,
             std::vector<uint64_t>* ranks) const override;
  std::string CheckConsistency(size_t live_items) const override;

 private:
  uint64_t Rank(double priority) const { return highest_first_ ? ~RankOf(priority) : RankOf(priority); }
  const bool highest_first_;
  struct Entry {
    uint64_t rank;
    Slot slot;
  };
  void Put(size_t i, Entry e);  // heap_[i] = e, and its slot's position
  void SiftUp(size_t i);
  void SiftDown(size_t i);

  std::vector<Entry> heap_;
  std::vector<uint32_t> pos_;  // per slot: index in heap_, or kNoSlot
};

}  // namespace apexrl

#endif  // APEXRL_EVICTION_LOWEST_PRIORITY_H_
