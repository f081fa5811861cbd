// EvictionKind: the eviction policies a store can be configured with, and the one table that maps each to its
// name, its per-shard policy and its planner.
#ifndef APEXRL_EVICTION_KINDS_H_
#define APEXRL_EVICTION_KINDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apexrl/eviction/planner.h"
#include "apexrl/eviction/policy.h"

namespace apexrl {

// Which items remove_to_fit() takes when the store is above its soft capacity. The values are written into
// snapshots: never renumber them.
//
// Adding a policy: a value here, its EvictionPolicy subclass, and its row in kinds.cc (name, factory,
// planner). The store, the shards, the snapshot format and the Python binding's eviction= parsing pick it up
// from the table.
enum class EvictionKind : uint32_t {
  kFifo = 0,            // globally oldest first (insertion order across all shards)
  kPrioritized = 1,     // victims drawn with probability proportional to priority^alpha_evict
  kLowestPriority = 2,  // globally lowest priority first ("lowest_priority", also "min_heap")
  kLifo = 3,            // globally newest first
  kUniform = 4,         // every item equally likely
  kMaxHeap = 5,         // globally highest priority first
};

// Whether `kind` is one of the values above (a snapshot's header is checked with it).
bool IsEvictionKind(EvictionKind kind);
// The policy object for one shard. Throws InvalidArgument for an unknown kind.
std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(EvictionKind kind, double alpha_evict);
// The planner of `kind`'s eviction shape. Throws InvalidArgument for an unknown kind.
const EvictionPlanner& EvictionPlannerFor(EvictionKind kind);
// The name the Python API uses ("fifo", "prioritized", "lowest_priority", "lifo", "uniform", "max_heap"), and
// back; "min_heap" parses as "lowest_priority". Parsing is exact (case-sensitive) and throws InvalidArgument
// naming the valid choices.
const char* EvictionKindName(EvictionKind kind);
EvictionKind ParseEvictionKind(const std::string& name);

// The kind table as data, in its order, for the bindings: Python reads names, aliases and numbers from here.
struct EvictionKindEntry {
  EvictionKind kind;
  const char* name;
  const char* alias;  // nullptr: none
};
std::vector<EvictionKindEntry> EvictionKindTable();

}  // namespace apexrl

#endif  // APEXRL_EVICTION_KINDS_H_
