#include "apexrl/eviction/planner.h"

#include <algorithm>
#include <cstdint>

namespace apexrl {
namespace {

class OrderedPlanner final : public EvictionPlanner {
 public:
  size_t RanksPerShard(size_t excess) const override { return std::min(excess, kOrderedRound); }

  void Plan(size_t excess, const std::vector<EvictionSummary>& shards, Rng&,
            std::vector<EvictionQuota>* quotas) const override {
    quotas->assign(shards.size(), EvictionQuota{0, 0});
    size_t listed = 0;
    for (const EvictionSummary& s : shards) listed += s.ranks.size();
    const size_t k = std::min({excess, kOrderedRound, listed});
    if (k == 0) return;
    std::vector<uint64_t> all;
    all.reserve(listed);
    for (const EvictionSummary& s : shards) all.insert(all.end(), s.ranks.begin(), s.ranks.end());
    std::nth_element(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k - 1), all.end());
    const uint64_t cutoff = all[k - 1];  // the k smallest ranks are <= cutoff
    // Every rank below the cutoff leaves; of those equal to it (several only when ranks can tie), as many as
    // make up k, from the lowest-numbered shards. A shard's ranks are increasing, so what it gives is always
    // its first victims.
    size_t ties = k;
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::vector<uint64_t>& r = shards[s].ranks;
      const size_t below = static_cast<size_t>(std::lower_bound(r.begin(), r.end(), cutoff) - r.begin());
      (*quotas)[s] = EvictionQuota{below, cutoff};
      ties -= below;
    }
    for (size_t s = 0; s < shards.size() && ties > 0; ++s) {
      const std::vector<uint64_t>& r = shards[s].ranks;
      const size_t at =
          static_cast<size_t>(std::upper_bound(r.begin(), r.end(), cutoff) - r.begin()) - (*quotas)[s].count;
      const size_t take = std::min(at, ties);
      (*quotas)[s].count += take;
      ties -= take;
    }
  }
};

class DrawnPlanner final : public EvictionPlanner {
 public:
  size_t RanksPerShard(size_t) const override { return 0; }

  void Plan(size_t excess, const std::vector<EvictionSummary>& shards, Rng& rng,
            std::vector<EvictionQuota>* quotas) const override {
    const size_t n = shards.size();
    quotas->assign(n, EvictionQuota{});
    size_t remaining = excess;
    for (size_t s = 0; s < n && remaining > 0; ++s) {  // urgent items first
      const size_t t = std::min(shards[s].urgent, remaining);
      (*quotas)[s].count += t;
      remaining -= t;
    }
    if (remaining > 0 && n > 0) {
      std::vector<double> weight(n);
      double total = 0.0;
      for (size_t s = 0; s < n; ++s) total += (weight[s] = shards[s].mass);
      if (!(total > 0.0)) {  // no mass anywhere: by the items not already taken as urgent
        total = 0.0;
        for (size_t s = 0; s < n; ++s) {
          const size_t left = shards[s].size - std::min(shards[s].size, (*quotas)[s].count);
          total += (weight[s] = static_cast<double>(left));
        }
      }
      if (total > 0.0) {
        const double segment = total / static_cast<double>(remaining);
        size_t s = 0;
        double end = weight[0];
        for (size_t j = 0; j < remaining; ++j) {
          const double u = (static_cast<double>(j) + rng.Uniform()) * segment;
          while (u >= end && s + 1 < n) end += weight[++s];
          ++(*quotas)[s].count;
        }
      }
    }
    for (size_t s = 0; s < n; ++s) (*quotas)[s].count = std::min((*quotas)[s].count, shards[s].size);
  }
};

}  // namespace

const EvictionPlanner& OrderedEvictionPlanner() {
  static const OrderedPlanner planner;
  return planner;
}

const EvictionPlanner& DrawnEvictionPlanner() {
  static const DrawnPlanner planner;
  return planner;
}

}  // namespace apexrl
