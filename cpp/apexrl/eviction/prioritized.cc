#include "apexrl/eviction/prioritized.h"

#include <cmath>
#include <string>

namespace apexrl {

void PrioritizedPolicy::Grow(size_t slot_capacity) {
  weights_.Grow(slot_capacity);
  if (urgent_pos_.size() < slot_capacity) urgent_pos_.resize(slot_capacity, kNoSlot);
}

double PrioritizedPolicy::Weight(double priority) const {
  if (alpha_evict_ == 0.0) return 1.0;
  if (priority == 0.0) return alpha_evict_ < 0.0 ? -1.0 : 0.0;
  const double w = std::pow(priority, alpha_evict_);
  return std::isfinite(w) ? w : -1.0;
}

void PrioritizedPolicy::Place(Slot slot, double priority) {
  const double w = Weight(priority);
  if (w < 0.0) {
    urgent_pos_[slot] = static_cast<uint32_t>(urgent_.size());
    urgent_.push_back(slot);
  } else {
    weights_.Set(slot, w);
  }
}

void PrioritizedPolicy::Unplace(Slot slot) {
  const uint32_t pos = urgent_pos_[slot];
  if (pos != kNoSlot) {
    const Slot last = urgent_.back();
    urgent_[pos] = last;
    urgent_pos_[last] = pos;
    urgent_.pop_back();
    urgent_pos_[slot] = kNoSlot;
  } else if (weights_.Get(slot) != 0.0) {
    weights_.Set(slot, 0.0);
  }
}

void PrioritizedPolicy::OnInsert(Slot slot, double priority, uint64_t) {
  Place(slot, priority);
  ++tracked_;
}

void PrioritizedPolicy::OnUpdate(Slot slot, double priority) {
  Unplace(slot);
  Place(slot, priority);
}

void PrioritizedPolicy::OnErase(Slot slot) {
  Unplace(slot);
  --tracked_;
}

void PrioritizedPolicy::Summarize(size_t, EvictionSummary* out) const {
  out->mass = weights_.Total();
  out->urgent = urgent_.size();
}

Slot PrioritizedPolicy::Victim(Rng& rng, uint64_t, const std::vector<Slot>& live) {
  if (!urgent_.empty()) return urgent_.back();
  const double total = weights_.Total();
  if (!(total > 0.0)) return live[rng.Below(live.size())];  // no preference: uniform
  return static_cast<Slot>(weights_.Find(rng.Uniform() * total));
}

std::string PrioritizedPolicy::CheckConsistency(size_t live_items) const {
  if (tracked_ != live_items) {
    return "prioritized eviction tracks " + std::to_string(tracked_) + " items, shard " + std::to_string(live_items);
  }
  for (size_t i = 0; i < urgent_.size(); ++i) {
    if (urgent_pos_[urgent_[i]] != i) return "prioritized eviction: urgent index broken";
  }
  return weights_.CheckConsistency();
}

}  // namespace apexrl
