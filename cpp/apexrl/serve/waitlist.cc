#include "apexrl/serve/waitlist.h"

#include <algorithm>
#include <cstdio>

#include "apexrl/serve/wire.h"

namespace apexrl::serve {
namespace {

bool Later(const DeferredPtr& a, const DeferredPtr& b) {  // heap comparator: a below b
  return a->deadline != b->deadline ? a->deadline > b->deadline : a->seq > b->seq;
}

void DropDead(std::deque<DeferredPtr>& q) {
  while (!q.empty() && !q.front()->live) q.pop_front();
}

template <typename C>
void KeepLive(C& c) {
  c.erase(std::remove_if(c.begin(), c.end(), [](const DeferredPtr& e) { return !e->live; }), c.end());
}

}  // namespace

std::optional<std::string> Waitlist::FullReason(const Deferred& e) const {
  if (count_ >= max_total_) {
    return std::to_string(count_) + " requests already wait on the server (max_waiting=" + std::to_string(max_total_) +
           ")";
  }
  if (e.nbytes != 0 && bytes_ + e.nbytes > max_bytes_) {
    char mb[32];
    std::snprintf(mb, sizeof mb, "%g", static_cast<double>(max_bytes_) / (1 << 20));
    return "waiting inserts already hold " + std::to_string(bytes_) + " bytes, this one " + std::to_string(e.nbytes) +
           " more, over max_waiting_mb=" + mb;
  }
  return std::nullopt;
}

DeferredPtr Waitlist::Add(DeferredPtr e, bool front) {
  auto& q = e->behind_id ? behind_ : e->op == kInsert ? inserts_ : samples_;
  if (front)
    q.push_front(e);
  else
    q.push_back(e);
  heap_.push_back(e);
  std::push_heap(heap_.begin(), heap_.end(), Later);
  auto& mine = per_client_[e->who];
  mine.push_back(e);
  const uint64_t n = ++peer_count_[e->who];
  if (mine.size() > 2 * n + 64) KeepLive(mine);
  ++count_;
  bytes_ += e->nbytes;
  Compact();
  if (n > max_peer_) {
    DropDead(mine);
    DeferredPtr oldest = mine.front();
    Remove(oldest.get());
    ++evicted;
    return oldest;
  }
  return nullptr;
}

void Waitlist::Remove(Deferred* e) {
  e->live = false;
  --count_;
  bytes_ -= e->nbytes;
  auto it = peer_count_.find(e->who);
  if (--it->second == 0) {
    peer_count_.erase(it);
    per_client_.erase(e->who);
  }
}

std::vector<DeferredPtr> Waitlist::Release(const RateLimiter& limiter, uint64_t size,
                                           const std::function<bool(const Deferred&)>& still_behind, uint64_t held) {
  uint64_t inserted, sampled;
  limiter.Counts(&inserted, &sampled);
  std::vector<DeferredPtr> ready;
  uint64_t examined = 0;
  // Retries behind their insert id: released once the first request is stored (they are answered with its
  // keys) or gave up (they own the id now, and meet the limiter as new inserts). Rare, so a scan.
  if (!behind_.empty()) KeepLive(behind_);
  for (auto it = behind_.begin(); it != behind_.end();) {
    ++examined;
    if (still_behind && still_behind(**it)) {
      ++it;
      continue;
    }
    Remove(it->get());
    ready.push_back(std::move(*it));
    it = behind_.erase(it);
  }
  while (true) {
    DropDead(inserts_);
    DropDead(samples_);
    if (!inserts_.empty()) {
      ++examined;
      DeferredPtr head = inserts_.front();
      if (limiter.InsertOk(head->n, limiter.InsertSize(size, held), inserted, sampled)) {
        inserts_.pop_front();
        inserted += head->n;
        size += head->n;
        Remove(head.get());
        ready.push_back(std::move(head));
        continue;
      }
    }
    if (!samples_.empty()) {
      ++examined;
      DeferredPtr head = samples_.front();
      if (limiter.SampleOk(head->n, size, inserted, sampled)) {
        samples_.pop_front();
        sampled += head->n;
        Remove(head.get());
        ready.push_back(std::move(head));
        continue;
      }
    }
    break;
  }
  examined_max = std::max(examined_max, examined);
  examined_total += examined;
  return ready;
}

std::vector<DeferredPtr> Waitlist::Expired(double now) {
  std::vector<DeferredPtr> out;
  while (!heap_.empty() && heap_.front()->deadline <= now) {
    std::pop_heap(heap_.begin(), heap_.end(), Later);
    DeferredPtr e = std::move(heap_.back());
    heap_.pop_back();
    if (e->live) {
      Remove(e.get());
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::optional<double> Waitlist::NextDeadline() {
  while (!heap_.empty() && !heap_.front()->live) {
    std::pop_heap(heap_.begin(), heap_.end(), Later);
    heap_.pop_back();
  }
  if (heap_.empty()) return std::nullopt;
  return heap_.front()->deadline;
}

std::vector<DeferredPtr> Waitlist::DropPeer(const std::string& peer) {
  std::vector<DeferredPtr> out;
  for (const DeferredPtr& e : heap_) {
    if (e->live && e->peer == peer) out.push_back(e);
  }
  for (const DeferredPtr& e : out) Remove(e.get());
  dropped += out.size();
  return out;
}

std::vector<DeferredPtr> Waitlist::TakeAll() {
  std::vector<DeferredPtr> out;
  for (const DeferredPtr& e : heap_) {
    if (e->live) out.push_back(e);
  }
  std::sort(out.begin(), out.end(), [](const DeferredPtr& a, const DeferredPtr& b) { return a->seq < b->seq; });
  for (const DeferredPtr& e : out) Remove(e.get());
  inserts_.clear();
  samples_.clear();
  behind_.clear();
  heap_.clear();
  per_client_.clear();
  return out;
}

void Waitlist::Compact() {
  if (heap_.size() > 2 * count_ + 64) {
    KeepLive(heap_);
    std::make_heap(heap_.begin(), heap_.end(), Later);
  }
  if (inserts_.size() > 2 * count_ + 64) KeepLive(inserts_);
  if (samples_.size() > 2 * count_ + 64) KeepLive(samples_);
  if (behind_.size() > 2 * count_ + 64) KeepLive(behind_);
}

}  // namespace apexrl::serve
