#include "apexrl/sampling/kinds.h"

#include <string>

#include "apexrl/errors.h"
#include "apexrl/eviction/fifo.h"
#include "apexrl/eviction/lowest_priority.h"

namespace apexrl {
namespace {

struct KindInfo {
  SamplerKind kind;
  const char* name;  // sampler= in the Python API
  // The shard's sampling order (an ordered remover's policy), or nullptr for a drawn sampler.
  std::unique_ptr<EvictionPolicy> (*make_order)();
};

// The one place that ties a sampler to its name and its order.
constexpr KindInfo kKinds[] = {
    {SamplerKind::kPrioritized, "prioritized", nullptr},
    {SamplerKind::kUniform, "uniform", nullptr},
    {SamplerKind::kFifo, "fifo", []() -> std::unique_ptr<EvictionPolicy> { return std::make_unique<FifoPolicy>(); }},
    {SamplerKind::kLifo, "lifo",
     []() -> std::unique_ptr<EvictionPolicy> { return std::make_unique<FifoPolicy>(/*newest_first=*/true); }},
    {SamplerKind::kMaxHeap, "max_heap",
     []() -> std::unique_ptr<EvictionPolicy> {
       return std::make_unique<LowestPriorityPolicy>(/*highest_first=*/true);
     }},
    {SamplerKind::kMinHeap, "min_heap",
     []() -> std::unique_ptr<EvictionPolicy> { return std::make_unique<LowestPriorityPolicy>(); }},
};

const KindInfo* Find(SamplerKind kind) {
  for (const KindInfo& k : kKinds) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

const KindInfo& Get(SamplerKind kind) {
  const KindInfo* k = Find(kind);
  if (k == nullptr) throw InvalidArgument("unknown sampler " + std::to_string(static_cast<uint32_t>(kind)));
  return *k;
}

}  // namespace

bool IsSamplerKind(SamplerKind kind) { return Find(kind) != nullptr; }

const char* SamplerKindName(SamplerKind kind) { return Get(kind).name; }

SamplerKind ParseSamplerKind(const std::string& name) {
  std::string choices;
  const size_t n = sizeof(kKinds) / sizeof(kKinds[0]);
  for (size_t i = 0; i < n; ++i) {
    if (name == kKinds[i].name) return kKinds[i].kind;
    choices += (i == 0 ? "'" : i + 1 < n ? ", '" : " or '") + std::string(kKinds[i].name) + "'";
  }
  throw InvalidArgument("unknown sampler '" + name + "'; use " + choices);
}

std::vector<SamplerKindEntry> SamplerKindTable() {
  std::vector<SamplerKindEntry> out;
  for (const KindInfo& k : kKinds) out.push_back({k.kind, k.name});
  return out;
}

bool SamplesByPriority(SamplerKind kind) { return kind == SamplerKind::kPrioritized; }

bool IsOrderedSampler(SamplerKind kind) { return Get(kind).make_order != nullptr; }

std::unique_ptr<EvictionPolicy> MakeSamplingOrder(SamplerKind kind) {
  const KindInfo& k = Get(kind);
  return k.make_order != nullptr ? k.make_order() : nullptr;
}

}  // namespace apexrl
