// EvictionPolicy: the order in which one shard's items leave when the store is above its soft capacity, and
// the summary of that order from which the store plans a store-wide eviction.
#ifndef APEXRL_EVICTION_POLICY_H_
#define APEXRL_EVICTION_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "apexrl/common.h"
#include "apexrl/random.h"

namespace apexrl {

inline constexpr Slot kNoSlot = std::numeric_limits<Slot>::max();           // never a real slot (common.h)
inline constexpr uint64_t kAnyRank = std::numeric_limits<uint64_t>::max();  // a rank bound that bounds nothing

// A store-wide eviction comes in one of two shapes, and every policy has one of them (kinds.cc says which):
//
//  * ordered: the victims follow one order across the whole store. Each item has a rank, comparable between
//    shards, and the store evicts the items of smallest rank first (FIFO: the rank is the store-wide
//    insertion number). A shard's victims come out in increasing rank.
//  * drawn: the victims are random draws. Each shard has an eviction mass (the sum of its items' weights)
//    and "urgent" items that go before any draw; the store splits the draws among shards by mass.
//
// What a shard reports to the planner (planner.h) before an eviction. The shard fills `size`; the policy
// fills the fields of its shape and leaves the others alone.
struct EvictionSummary {
  size_t size = 0;              // items in the shard
  std::vector<uint64_t> ranks;  // ordered: the ranks of the shard's next victims, in increasing order
  double mass = 0.0;            // drawn: the total weight draws are made from
  size_t urgent = 0;            // drawn: items that leave before any drawn victim
};

// What the planner asks of one shard: remove up to `count` victims, and (ordered) only victims whose rank is
// at most `max_rank`. The bound keeps a shard that lost items to a concurrent erase since its summary from
// evicting newer items in their place, ahead of another shard's older ones.
struct EvictionQuota {
  size_t count = 0;
  uint64_t max_rank = kAnyRank;
};

// A strategy object owned by one Shard and told about every insert, priority update and removal there.
// Single-threaded by contract: the shard calls it under its mutex only, and it touches nothing but its own
// members. How a store-wide eviction is split across shards is the EvictionPlanner's job; a policy orders the
// victims inside its shard and summarizes that order.
//
// A new policy is a subclass plus an EvictionKind and its row in kinds.cc; the shard and the store need no
// change.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // Slots are dense indices below `slot_capacity`; called before any slot at or past the old capacity is used.
  virtual void Grow(size_t slot_capacity) = 0;
  // `priority` is validated (finite, >= 0; possibly -0.0). `seq` is the store-wide insertion number; within
  // one shard it only increases (a snapshot load replays a shard's items in insertion order too).
  virtual void OnInsert(Slot slot, double priority, uint64_t seq) = 0;
  virtual void OnUpdate(Slot slot, double priority) = 0;
  virtual void OnErase(Slot slot) = 0;
  // An item put back after OnErase with the insertion number it had (a held item given back, shard.h): `seq`
  // may be below those of items inserted since. An order by insertion number puts it back where it was; the
  // others treat it as an insert.
  virtual void OnRestore(Slot slot, double priority, uint64_t seq) { OnInsert(slot, priority, seq); }

  // Fills this policy's fields of `out` (see EvictionSummary), which the shard has just reset (ranks empty,
  // mass and urgent 0): an ordered policy appends the ranks of its next min(max_ranks, items) victims, a
  // drawn one sets mass and urgent. At most O(max_ranks log max_ranks).
  virtual void Summarize(size_t max_ranks, EvictionSummary* out) const = 0;
  // The slot to evict next, or kNoSlot if no item may go: an ordered policy returns kNoSlot when its next
  // victim ranks above `max_rank`; a drawn policy ignores the bound and, with no preference among the items
  // (no urgent item, no mass), picks uniformly from `live` with `rng`. `live` lists the shard's occupied
  // slots and is not empty. Does not remove the victim: the shard then calls OnErase.
  virtual Slot Victim(Rng& rng, uint64_t max_rank, const std::vector<Slot>& live) = 0;
  // Ordered policies: appends the slots (and their ranks) of the first min(max_items, items) items in victim
  // order whose rank is at most `max_rank`, without removing them: an ordered sampler (sampling/kinds.h)
  // reads its order here. A drawn policy has no order and appends nothing. At most O(max_items log max_items).
  virtual void Front(size_t /*max_items*/, uint64_t /*max_rank*/, std::vector<Slot>* /*slots*/,
                     std::vector<uint64_t>* /*ranks*/) const {}

  // "" if the policy's structures are consistent with `live_items` tracked items, else what is wrong.
  virtual std::string CheckConsistency(size_t live_items) const = 0;
};

}  // namespace apexrl

#endif  // APEXRL_EVICTION_POLICY_H_
