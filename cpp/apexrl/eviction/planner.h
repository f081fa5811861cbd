// EvictionPlanner: splits one store-wide eviction into per-shard quotas, from the shards' summaries.
#ifndef APEXRL_EVICTION_PLANNER_H_
#define APEXRL_EVICTION_PLANNER_H_

#include <cstddef>
#include <vector>

#include "apexrl/eviction/policy.h"
#include "apexrl/random.h"

namespace apexrl {

// One planner per eviction shape (policy.h): OrderedEvictionPlanner() and DrawnEvictionPlanner(). Which
// shape a policy has is stated once, in its row of kinds.cc. The store runs an eviction in rounds:
//
//   ranks = planner.RanksPerShard(excess)
//   each shard: Summarize(ranks, &summary[s])        (its own lock, one shard at a time)
//   planner.Plan(excess, summaries, rng, &quotas)
//   each shard: Evict(quotas[s])
//
// Planners are stateless and immutable: one instance serves every store, from any thread.
class EvictionPlanner {
 public:
  virtual ~EvictionPlanner() = default;

  // How many ranks each shard should list in its summary for an eviction of `excess` items (0: none).
  virtual size_t RanksPerShard(size_t excess) const = 0;
  // Writes one quota per summary into `quotas`. The quotas sum to at most `excess`, and none asks a shard
  // for more items than its summary counted. May draw from `rng`. O(total ranks listed + shards + draws).
  virtual void Plan(size_t excess, const std::vector<EvictionSummary>& shards, Rng& rng,
                    std::vector<EvictionQuota>* quotas) const = 0;
};

// Ordered: the `k` smallest ranks listed across all shards, k = min(excess, ranks listed, kOrderedRound),
// leave. Each shard's quota is how many of them it listed, bounded by the k-th smallest rank; ties at that
// rank go to the lower-numbered shards. Draws nothing from `rng`.
const EvictionPlanner& OrderedEvictionPlanner();
// Ordered evictions take at most this many items per round (the store runs more rounds for the rest), so a
// summary lists at most this many ranks per shard: that bounds its memory (512 KiB) and the time Summarize
// holds the shard's lock.
inline constexpr size_t kOrderedRound = size_t{1} << 16;

// Drawn: urgent items first, taken from shards in index order; the remaining victims are split among shards
// by their share of the total eviction mass, stratified (victim j falls in segment j of the mass, at a
// uniform point: one rng.Uniform() each). With no mass anywhere the split is by item count (uniform), and a
// quota is cut to the shard's size (the rest is planned again in the next round).
const EvictionPlanner& DrawnEvictionPlanner();

}  // namespace apexrl

#endif  // APEXRL_EVICTION_PLANNER_H_
