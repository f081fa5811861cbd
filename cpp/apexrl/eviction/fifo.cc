#include "apexrl/eviction/fifo.h"

#include <string>

namespace apexrl {

void FifoPolicy::Grow(size_t slot_capacity) {
  if (slot_capacity <= prev_.size()) return;
  prev_.resize(slot_capacity, kNoSlot);
  next_.resize(slot_capacity, kNoSlot);
  seq_.resize(slot_capacity, 0);
}

void FifoPolicy::OnInsert(Slot slot, double, uint64_t seq) {
  seq_[slot] = seq;
  prev_[slot] = tail_;
  next_[slot] = kNoSlot;
  if (tail_ != kNoSlot) {
    next_[tail_] = slot;
  } else {
    head_ = slot;
  }
  tail_ = slot;
}

void FifoPolicy::OnRestore(Slot slot, double, uint64_t seq) {
  // The first item newer than `seq` (its successor), searched from the head and, for its predecessor, from the
  // tail, one step each at a time.
  Slot next = kNoSlot;  // kNoSlot: the slot goes last
  for (Slot front = head_, back = tail_;; front = next_[front], back = prev_[back]) {
    if (front == kNoSlot || seq_[front] > seq) {
      next = front;
      break;
    }
    if (back == kNoSlot || seq_[back] < seq) {
      next = back == kNoSlot ? head_ : next_[back];
      break;
    }
  }
  seq_[slot] = seq;
  const Slot prev = next == kNoSlot ? tail_ : prev_[next];
  prev_[slot] = prev;
  next_[slot] = next;
  if (prev != kNoSlot) {
    next_[prev] = slot;
  } else {
    head_ = slot;
  }
  if (next != kNoSlot) {
    prev_[next] = slot;
  } else {
    tail_ = slot;
  }
}

void FifoPolicy::OnErase(Slot slot) {
  const Slot p = prev_[slot], n = next_[slot];
  if (p != kNoSlot) {
    next_[p] = n;
  } else {
    head_ = n;
  }
  if (n != kNoSlot) {
    prev_[n] = p;
  } else {
    tail_ = p;
  }
  prev_[slot] = next_[slot] = kNoSlot;
}

void FifoPolicy::Summarize(size_t max_ranks, EvictionSummary* out) const {
  const std::vector<Slot>& step = newest_first_ ? prev_ : next_;
  for (Slot s = newest_first_ ? tail_ : head_; s != kNoSlot && max_ranks > 0; s = step[s], --max_ranks) {
    out->ranks.push_back(Rank(s));
  }
}

Slot FifoPolicy::Victim(Rng&, uint64_t max_rank, const std::vector<Slot>&) {
  const Slot first = newest_first_ ? tail_ : head_;
  return first != kNoSlot && Rank(first) <= max_rank ? first : kNoSlot;
}

void FifoPolicy::Front(size_t max_items, uint64_t max_rank, std::vector<Slot>* slots,
                       std::vector<uint64_t>* ranks) const {
  const std::vector<Slot>& step = newest_first_ ? prev_ : next_;
  for (Slot s = newest_first_ ? tail_ : head_; s != kNoSlot && max_items > 0 && Rank(s) <= max_rank;
       s = step[s], --max_items) {
    slots->push_back(s);
    ranks->push_back(Rank(s));
  }
}

std::string FifoPolicy::CheckConsistency(size_t live_items) const {
  size_t count = 0;
  Slot prev = kNoSlot;
  for (Slot s = head_; s != kNoSlot; prev = s, s = next_[s]) {
    if (prev_[s] != prev) return "fifo list: broken back link at slot " + std::to_string(s);
    if (prev != kNoSlot && seq_[prev] >= seq_[s]) return "fifo list: insertion numbers out of order";
    if (++count > live_items) return "fifo list: longer than the number of items";
  }
  if (prev != tail_) return "fifo list: tail is not the last element";
  if (count != live_items) {
    return "fifo list holds " + std::to_string(count) + " items, shard " + std::to_string(live_items);
  }
  return "";
}

}  // namespace apexrl
