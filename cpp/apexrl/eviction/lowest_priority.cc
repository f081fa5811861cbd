#include "apexrl/eviction/lowest_priority.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

namespace apexrl {

uint64_t LowestPriorityPolicy::RankOf(double priority) {
  if (priority == 0.0) return 0;  // +0.0 and -0.0 alike
  uint64_t bits;
  std::memcpy(&bits, &priority, sizeof(bits));
  return bits;
}

void LowestPriorityPolicy::Grow(size_t slot_capacity) {
  if (pos_.size() < slot_capacity) pos_.resize(slot_capacity, kNoSlot);
  // OnInsert must not allocate: the shard makes every allocation (this call) before it changes anything.
  heap_.reserve(slot_capacity);
}

void LowestPriorityPolicy::Put(size_t i, Entry e) {
  heap_[i] = e;
  pos_[e.slot] = static_cast<uint32_t>(i);
}

void LowestPriorityPolicy::SiftUp(size_t i) {
  const Entry e = heap_[i];
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (heap_[parent].rank <= e.rank) break;
    Put(i, heap_[parent]);
    i = parent;
  }
  Put(i, e);
}

void LowestPriorityPolicy::SiftDown(size_t i) {
  const Entry e = heap_[i];
  const size_t n = heap_.size();
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && heap_[child + 1].rank < heap_[child].rank) ++child;
    if (e.rank <= heap_[child].rank) break;
    Put(i, heap_[child]);
    i = child;
  }
  Put(i, e);
}

void LowestPriorityPolicy::OnInsert(Slot slot, double priority, uint64_t) {
  heap_.push_back(Entry{Rank(priority), slot});
  SiftUp(heap_.size() - 1);
}

void LowestPriorityPolicy::OnUpdate(Slot slot, double priority) {
  const size_t i = pos_[slot];
  const uint64_t old_rank = heap_[i].rank;
  heap_[i].rank = Rank(priority);
  if (heap_[i].rank < old_rank) {
    SiftUp(i);
  } else {
    SiftDown(i);
  }
}

void LowestPriorityPolicy::OnErase(Slot slot) {
  const size_t i = pos_[slot];
  pos_[slot] = kNoSlot;
  const Entry last = heap_.back();
  heap_.pop_back();
  if (i == heap_.size()) return;  // it was the last entry
  // The last entry fills the hole; it may belong above or below it.
  Put(i, last);
  if (i > 0 && heap_[(i - 1) / 2].rank > last.rank) {
    SiftUp(i);
  } else {
    SiftDown(i);
  }
}

void LowestPriorityPolicy::Summarize(size_t max_ranks, EvictionSummary* out) const {
  thread_local std::vector<Slot> slots;
  slots.clear();
  Front(max_ranks, kAnyRank, &slots, &out->ranks);
}

void LowestPriorityPolicy::Front(size_t max_items, uint64_t max_rank, std::vector<Slot>* slots,
                                 std::vector<uint64_t>* ranks) const {
  // Best-first walk of the heap: a node's rank is <= its children's, so popping the smallest frontier node
  // and adding its children yields ranks in increasing order, touching O(k) nodes.
  using Node = std::pair<uint64_t, size_t>;  // (rank, index in heap_)
  thread_local std::vector<Node> frontier;
  frontier.clear();
  if (!heap_.empty() && max_items > 0) frontier.emplace_back(heap_[0].rank, 0);
  size_t listed = 0;
  while (!frontier.empty() && listed < max_items) {
    std::pop_heap(frontier.begin(), frontier.end(), std::greater<Node>());
    const size_t i = frontier.back().second;
    frontier.pop_back();
    if (heap_[i].rank > max_rank) break;  // every node left ranks at least as high
    slots->push_back(heap_[i].slot);
    ranks->push_back(heap_[i].rank);
    ++listed;
    for (size_t c = 2 * i + 1; c <= 2 * i + 2 && c < heap_.size(); ++c) {
      frontier.emplace_back(heap_[c].rank, c);
      std::push_heap(frontier.begin(), frontier.end(), std::greater<Node>());
    }
  }
}

Slot LowestPriorityPolicy::Victim(Rng&, uint64_t max_rank, const std::vector<Slot>&) {
  return !heap_.empty() && heap_[0].rank <= max_rank ? heap_[0].slot : kNoSlot;
}

std::string LowestPriorityPolicy::CheckConsistency(size_t live_items) const {
  if (heap_.size() != live_items) {
    return "lowest-priority heap holds " + std::to_string(heap_.size()) + " items, shard " + std::to_string(live_items);
  }
  for (size_t i = 0; i < heap_.size(); ++i) {
    if (pos_[heap_[i].slot] != i) return "lowest-priority heap: position of slot " + std::to_string(heap_[i].slot);
    if (i > 0 && heap_[(i - 1) / 2].rank > heap_[i].rank) return "lowest-priority heap: order broken";
  }
  const size_t placed =
      static_cast<size_t>(std::count_if(pos_.begin(), pos_.end(), [](uint32_t p) { return p != kNoSlot; }));
  if (placed != heap_.size()) return "lowest-priority heap: a removed slot still has a position";
  return "";
}

}  // namespace apexrl
