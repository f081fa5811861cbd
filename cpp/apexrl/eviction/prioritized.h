// PrioritizedPolicy: victims drawn with probability proportional to priority^alpha_evict (a drawn policy; see
// policy.h).
#ifndef APEXRL_EVICTION_PRIORITIZED_H_
#define APEXRL_EVICTION_PRIORITIZED_H_

#include <vector>

#include "apexrl/eviction/policy.h"
#include "apexrl/sum_tree.h"

namespace apexrl {

// With a negative exponent (the store's default is alpha_evict = -0.4) low priorities go first. Priority 0 is
// well defined under every exponent:
//   alpha_evict < 0: 0^alpha_evict is +infinity, so zero-priority items are "urgent": they leave before any
//                    drawn victim (as does any item whose weight overflows a double);
//   alpha_evict = 0: every weight is 1 (uniform);
//   alpha_evict > 0: weight 0; if every weight is 0 the policy has no preference and picks uniformly.
// The summary is the sum of the finite weights (the mass) and the number of urgent items.
// Cost: O(16 log16 n) per insert, update, erase and draw (a SumMinTree of the weights); urgent items O(1).
class PrioritizedPolicy final : public EvictionPolicy {
 public:
  explicit PrioritizedPolicy(double alpha_evict) : alpha_evict_(alpha_evict) {}

  void Grow(size_t slot_capacity) override;
  void OnInsert(Slot slot, double priority, uint64_t seq) override;
  void OnUpdate(Slot slot, double priority) override;
  void OnErase(Slot slot) override;
  void Summarize(size_t max_ranks, EvictionSummary* out) const override;
  // The most recently made urgent item, else a draw by weight, else a uniform pick from `live`. Ignores
  // `max_rank`: drawn victims have no store-wide order.
  Slot Victim(Rng& rng, uint64_t max_rank, const std::vector<Slot>& live) override;
  std::string CheckConsistency(size_t live_items) const override;

 private:
  // The eviction weight, or a negative number for an urgent item.
  double Weight(double priority) const;
  void Place(Slot slot, double priority);
  void Unplace(Slot slot);

  double alpha_evict_;
  SumMinTree weights_;
  std::vector<Slot> urgent_;
  std::vector<uint32_t> urgent_pos_;  // index in urgent_, or kNoSlot
  size_t tracked_ = 0;
};

}  // namespace apexrl

#endif  // APEXRL_EVICTION_PRIORITIZED_H_
