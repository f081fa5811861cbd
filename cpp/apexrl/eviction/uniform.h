// UniformPolicy: every item equally likely to go (a drawn policy; see policy.h).
#ifndef APEXRL_EVICTION_UNIFORM_H_
#define APEXRL_EVICTION_UNIFORM_H_

#include <string>
#include <vector>

#include "apexrl/eviction/policy.h"

namespace apexrl {

// No mass and no urgent items: the planner splits the draws among shards by their item counts, and each
// victim is a uniform draw from the shard's live slots. Nothing to track, so every method is O(1) and the
// policy holds no memory.
class UniformPolicy final : public EvictionPolicy {
 public:
  void Grow(size_t) override {}
  void OnInsert(Slot, double, uint64_t) override {}
  void OnUpdate(Slot, double) override {}
  void OnErase(Slot) override {}
  void Summarize(size_t, EvictionSummary*) const override {}
  Slot Victim(Rng& rng, uint64_t, const std::vector<Slot>& live) override { return live[rng.Below(live.size())]; }
  std::string CheckConsistency(size_t) const override { return ""; }
};

}  // namespace apexrl

#endif  // APEXRL_EVICTION_UNIFORM_H_
