#include "apexrl/serve/insert_window.h"

namespace apexrl::serve {

InsertWindow::InsertWindow(uint64_t max_ids_per_identity, uint64_t max_bytes_per_identity)
    : max_ids_(max_ids_per_identity), max_bytes_(max_bytes_per_identity) {}

InsertWindow::Claim InsertWindow::TryClaim(const InsertId& id, uint64_t owner, double deadline, double now,
                                           std::vector<Key>* keys) {
  ScopedLock<Mutex> lock(mu_);
  auto who = done_.find(id.identity);
  if (who != done_.end()) {
    auto it = who->second.index.find(id);
    if (it != who->second.index.end()) {
      ++duplicates_;
      *keys = it->second->keys;
      return Claim::kDone;
    }
  }
  auto [slot, fresh] = pending_.try_emplace(id, Owner{owner, deadline});
  // A live owner holds the id; one past its (clipped) deadline was answered or dropped without releasing it,
  // which the loop never does, but a stale entry must never block a retry for good.
  if (!fresh && slot->second.owner != owner && now < slot->second.deadline) return Claim::kBusy;
  slot->second = Owner{owner, deadline};
  return Claim::kNew;
}

bool InsertWindow::Busy(const InsertId& id, uint64_t asker, double now) const {
  ScopedLock<Mutex> lock(mu_);
  auto it = pending_.find(id);
  return it != pending_.end() && it->second.owner != asker && now < it->second.deadline;
}

void InsertWindow::Release(const InsertId& id, uint64_t owner) {
  ScopedLock<Mutex> lock(mu_);
  auto it = pending_.find(id);
  if (it != pending_.end() && it->second.owner == owner) pending_.erase(it);
}

void InsertWindow::Finish(const InsertId& id, uint64_t owner, const Key* keys, size_t n) {
  ScopedLock<Mutex> lock(mu_);
  auto it = pending_.find(id);
  if (it != pending_.end() && it->second.owner == owner) pending_.erase(it);
  PerIdentity& w = done_[id.identity];
  if (w.index.count(id) != 0) return;  // stored twice cannot happen (the owner alone stores); keep the first
  w.order.push_back(Remembered{id.session, id.sequence, std::vector<Key>(keys, keys + n)});
  w.index.emplace(id, std::prev(w.order.end()));
  const uint64_t cost = 8 * n + kEntryOverhead;
  w.bytes += cost;
  bytes_ += cost;
  ++remembered_;
  while (!w.order.empty() && (w.order.size() > max_ids_ || w.bytes > max_bytes_)) {
    const Remembered& old = w.order.front();
    const uint64_t old_cost = 8 * old.keys.size() + kEntryOverhead;
    w.index.erase(InsertId{id.identity, old.session, old.sequence});
    w.order.pop_front();
    w.bytes -= old_cost;
    bytes_ -= old_cost;
    --remembered_;
    ++forgotten_;
  }
}

InsertWindowStats InsertWindow::Stats() const {
  ScopedLock<Mutex> lock(mu_);
  InsertWindowStats s;
  s.duplicates = duplicates_;
  s.remembered = remembered_;
  s.forgotten = forgotten_;
  s.bytes = bytes_;
  s.pending = pending_.size();
  s.identities = done_.size();
  return s;
}

}  // namespace apexrl::serve
