#include "apexrl/eviction/kinds.h"

#include <string>

#include "apexrl/errors.h"
#include "apexrl/eviction/fifo.h"
#include "apexrl/eviction/lowest_priority.h"
#include "apexrl/eviction/prioritized.h"
#include "apexrl/eviction/uniform.h"

namespace apexrl {
namespace {

struct KindInfo {
  EvictionKind kind;
  const char* name;   // eviction= in the Python API
  const char* alias;  // another name that parses as this kind, or nullptr
  std::unique_ptr<EvictionPolicy> (*make_policy)(double alpha_evict);
  const EvictionPlanner& (*planner)();
};

// The one place that ties a kind to its policy and to how the store plans across shards.
constexpr KindInfo kKinds[] = {
    {EvictionKind::kFifo, "fifo", nullptr,
     [](double) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<FifoPolicy>(); }, OrderedEvictionPlanner},
    {EvictionKind::kPrioritized, "prioritized", nullptr,
     [](double alpha_evict) -> std::unique_ptr<EvictionPolicy> {
       return std::make_unique<PrioritizedPolicy>(alpha_evict);
     },
     DrawnEvictionPlanner},
    {EvictionKind::kLowestPriority, "lowest_priority", "min_heap",
     [](double) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<LowestPriorityPolicy>(); },
     OrderedEvictionPlanner},
    {EvictionKind::kLifo, "lifo", nullptr,
     [](double) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<FifoPolicy>(/*newest_first=*/true); },
     OrderedEvictionPlanner},
    {EvictionKind::kUniform, "uniform", nullptr,
     [](double) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<UniformPolicy>(); }, DrawnEvictionPlanner},
    {EvictionKind::kMaxHeap, "max_heap", nullptr,
     [](double) -> std::unique_ptr<EvictionPolicy> {
       return std::make_unique<LowestPriorityPolicy>(/*highest_first=*/true);
     },
     OrderedEvictionPlanner},
};

const KindInfo* Find(EvictionKind kind) {
  for (const KindInfo& k : kKinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

const KindInfo& Get(EvictionKind kind) {
  const KindInfo* k = Find(kind);
  if (k == nullptr) {
    throw InvalidArgument("unknown eviction policy " + std::to_string(static_cast<uint32_t>(kind)));
  }
  return *k;
}

}  // namespace

bool IsEvictionKind(EvictionKind kind) { return Find(kind) != nullptr; }

std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(EvictionKind kind, double alpha_evict) {
  return Get(kind).make_policy(alpha_evict);
}

const EvictionPlanner& EvictionPlannerFor(EvictionKind kind) { return Get(kind).planner(); }

const char* EvictionKindName(EvictionKind kind) { return Get(kind).name; }

EvictionKind ParseEvictionKind(const std::string& name) {
  std::string choices;
  const size_t n = sizeof(kKinds) / sizeof(kKinds[0]);
  for (size_t i = 0; i < n; ++i) {
    if (name == kKinds[i].name || (kKinds[i].alias != nullptr && name == kKinds[i].alias)) return kKinds[i].kind;
    choices += (i == 0 ? "'" : i + 1 < n ? ", '" : " or '") + std::string(kKinds[i].name) + "'";
    if (kKinds[i].alias != nullptr) choices += " ('" + std::string(kKinds[i].alias) + "')";
  }
  throw InvalidArgument("unknown eviction policy '" + name + "'; use " + choices);
}

std::vector<EvictionKindEntry> EvictionKindTable() {
  std::vector<EvictionKindEntry> out;
  for (const KindInfo& k : kKinds) out.push_back({k.kind, k.name, k.alias});
  return out;
}

}  // namespace apexrl
