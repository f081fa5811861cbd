// SamplerKind: the ways a store can choose the items of a sample, and the one table that maps each to its name
// and (for the ordered ones) the per-shard order it samples in.
#ifndef APEXRL_SAMPLING_KINDS_H_
#define APEXRL_SAMPLING_KINDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apexrl/eviction/policy.h"

namespace apexrl {

// How Sample() picks items. The values are written into snapshots: never renumber them.
//
// Two shapes (sharded_store.h has the contract):
//  * drawn, with replacement: kPrioritized (P ~ priority^alpha, stratified, IS weights; the store's sum tree)
//    and kUniform (every item equally likely, no tree);
//  * ordered, distinct items: kFifo, kLifo, kMaxHeap, kMinHeap. Their orders are exactly the ordered removers'
//    (eviction/fifo.h, eviction/lowest_priority.h): each shard keeps one such policy object for its sampling
//    order, and the store merges the shards' orders store-wide as OrderedEvictionPlanner does for removals.
enum class SamplerKind : uint32_t {
  kPrioritized = 0,  // proportional to priority^alpha (Ape-X), with replacement
  kUniform = 1,      // every item equally likely, with replacement
  kFifo = 2,         // oldest first (store-wide insertion order)
  kLifo = 3,         // newest first
  kMaxHeap = 4,      // highest priority first
  kMinHeap = 5,      // lowest priority first
};

// Whether `kind` is one of the values above (a snapshot's header is checked with it).
bool IsSamplerKind(SamplerKind kind);
// The name the Python API uses ("prioritized", "uniform", "fifo", "lifo", "max_heap", "min_heap"), and back.
// Parsing is exact (case-sensitive) and throws InvalidArgument naming the valid choices.
const char* SamplerKindName(SamplerKind kind);
SamplerKind ParseSamplerKind(const std::string& name);

// The kind table as data, in its order, for the bindings: Python reads names and numbers from here.
struct SamplerKindEntry {
  SamplerKind kind;
  const char* name;
};
std::vector<SamplerKindEntry> SamplerKindTable();

// Whether the store keeps its sampling sum tree for `kind` (only kPrioritized does).
bool SamplesByPriority(SamplerKind kind);
// Whether `kind` returns distinct items in an order (fifo, lifo, max_heap, min_heap).
bool IsOrderedSampler(SamplerKind kind);
// The order of an ordered sampler, as the ordered remover that keeps it (one per shard); nullptr for a drawn
// sampler. Throws InvalidArgument for an unknown kind.
std::unique_ptr<EvictionPolicy> MakeSamplingOrder(SamplerKind kind);

}  // namespace apexrl

#endif  // APEXRL_SAMPLING_KINDS_H_
