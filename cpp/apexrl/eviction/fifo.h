// FifoPolicy: oldest item first, in store-wide insertion order, or newest first (LIFO); an ordered policy, see
// policy.h.
#ifndef APEXRL_EVICTION_FIFO_H_
#define APEXRL_EVICTION_FIFO_H_

#include <vector>

#include "apexrl/eviction/policy.h"

namespace apexrl {

// An item's rank is its store-wide insertion number, so the planner's "smallest ranks first" is "globally
// oldest first"; with newest_first (LIFO) the rank is the number's complement, so it is "globally newest first". The
// shard's items sit in an intrusive doubly-linked list in insertion order, so erasing one from the middle (erase() by
// key) is O(1). Every method is O(1) except Summarize, O(max_ranks).
class FifoPolicy final : public EvictionPolicy {
 public:
  explicit FifoPolicy(bool newest_first = false) : newest_first_(newest_first) {}
  void Grow(size_t slot_capacity) override;
  void OnInsert(Slot slot, double priority, uint64_t seq) override;
  void OnUpdate(Slot, double) override {}
  void OnErase(Slot slot) override;
  // Where its insertion number puts it, found from both ends at once: O(distance to the nearer end), O(1) for
  // the oldest item of a FIFO (or the newest of a LIFO).
  void OnRestore(Slot slot, double priority, uint64_t seq) override;
  void Summarize(size_t max_ranks, EvictionSummary* out) const override;
  // The oldest (newest_first: the newest) item, if its rank is at most `max_rank`.
  Slot Victim(Rng& rng, uint64_t max_rank, const std::vector<Slot>& live) override;
  void Front(size_t max_items, uint64_t max_rank, std::vector<Slot>* slots,
             std::vector<uint64_t>* ranks) const override;
  std::string CheckConsistency(size_t live_items) const override;

 private:
  uint64_t Rank(Slot s) const { return newest_first_ ? ~seq_[s] : seq_[s]; }
  const bool newest_first_;
  std::vector<Slot> prev_, next_;
  std::vector<uint64_t> seq_;
  Slot head_ = kNoSlot, tail_ = kNoSlot;
};

}  // namespace apexrl

#endif  // APEXRL_EVICTION_FIFO_H_
