// FifoPolicy: oldest item first.
#ifndef APEXRL_EVICTION_FIFO_H_
#define APEXRL_EVICTION_FIFO_H_

#include <vector>

#include "apexrl/eviction/policy.h"

namespace apexrl {

// An intrusive doubly-linked list over slots in insertion order, so erasing an item from the middle (erase,
// or a victim of the other policy) is O(1). Every method is O(1) except OldestSeqs, O(k).
class FifoPolicy final : public EvictionPolicy {
 public:
  void Grow(size_t slot_capacity) override;
  void OnInsert(Slot slot, double priority, uint64_t seq) override;
  void OnUpdate(Slot, double) override {}
  void OnErase(Slot slot) override;
  Slot Victim(Rng&) override { return head_; }
  std::string CheckConsistency(size_t live_items) const override;

  // Appends the insertion numbers of this shard's `k` oldest items (fewer if it holds fewer), oldest first.
  void OldestSeqs(size_t k, std::vector<uint64_t>* out) const;
  Slot oldest() const { return head_; }
  uint64_t seq(Slot slot) const { return seq_[slot]; }

 private:
  std::vector<Slot> prev_, next_;
  std::vector<uint64_t> seq_;
  Slot head_ = kNoSlot, tail_ = kNoSlot;
};

}  // namespace apexrl

#endif  // APEXRL_EVICTION_FIFO_H_
