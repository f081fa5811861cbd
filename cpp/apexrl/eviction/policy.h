// EvictionPolicy: which item of a shard leaves first when the store is above its soft capacity.
#ifndef APEXRL_EVICTION_POLICY_H_
#define APEXRL_EVICTION_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "apexrl/common.h"
#include "apexrl/random.h"

namespace apexrl {

inline constexpr Slot kNoSlot = std::numeric_limits<Slot>::max();

// A strategy object owned by one Shard and told about every insert, priority update and removal there
// (the shape of Reverb's item selectors). Single-threaded by contract: the shard calls it under its mutex.
// How a global eviction is split across shards is the ShardedStore's job (see sharded_store.h); the policy
// only orders the victims inside its shard.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // Slots are dense indices below `slot_capacity`; called before any slot at or past the old capacity is used.
  virtual void Grow(size_t slot_capacity) = 0;
  // `seq` is the store-wide insertion number; within one shard it only increases.
  virtual void OnInsert(Slot slot, double priority, uint64_t seq) = 0;
  virtual void OnUpdate(Slot slot, double priority) = 0;
  virtual void OnErase(Slot slot) = 0;
  // The slot to evict next, or kNoSlot when the policy has no preference (the shard then picks uniformly).
  // Only called while the shard holds at least one item. Does not remove it: the shard calls OnErase.
  virtual Slot Victim(Rng& rng) = 0;
  // "" if the policy's structures are consistent with `live_items` tracked items, else what is wrong.
  virtual std::string CheckConsistency(size_t live_items) const = 0;
};

}  // namespace apexrl

#endif  // APEXRL_EVICTION_POLICY_H_
