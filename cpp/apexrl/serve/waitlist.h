// The requests that wait on the server (minimum size, rate limiter, an insert id in flight), with bounds and
// no scan of them all on the hot path:
//   * one FIFO per op (INSERT, SAMPLE): admission looks only at their heads (O(released + 2));
//   * retries of an INSERT whose first request waits (same insert id) wait apart, for that request alone;
//   * a heap of deadlines: the loop pops what expired (O(log waiting) each);
//   * per client (its identity, or its connection without one), its entries in arrival order: over
//     max_waiting_per_peer its oldest is answered TIMEOUT.
// Entries that left stay as husks (live false, request released) until a queue reaches them; queues are
// compacted when husks outnumber live entries. Loop thread only.
#ifndef APEXRL_SERVE_WAITLIST_H_
#define APEXRL_SERVE_WAITLIST_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "apexrl/serve/rate_limiter.h"

namespace apexrl::serve {

struct Pending;

struct Deferred {
  Deferred();
  ~Deferred();  // in serve_loop.cc, where Pending is complete
  std::unique_ptr<Pending> p;
  uint16_t op = 0;
  uint64_t n = 0;
  uint64_t nbytes = 0;  // what a waiting INSERT holds
  double deadline = 0;
  uint64_t seq = 0;
  bool live = true;
  bool behind_id = false;  // an INSERT waiting for its insert id's first request: needs no admission
  std::string who;         // the per-client key
  std::string peer;        // the connection (routing id)
};
using DeferredPtr = std::shared_ptr<Deferred>;

class Waitlist {
 public:
  Waitlist(uint64_t max_total, uint64_t max_per_peer, uint64_t max_bytes)
      : max_total_(max_total), max_peer_(max_per_peer), max_bytes_(max_bytes) {}

  uint64_t count() const { return count_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t peers() const { return peer_count_.size(); }
  uint64_t behind() const { return behind_.size(); }  // husks included
  uint64_t max_peer() const { return max_peer_; }

  // Why `e` may not wait (total count or bytes cap reached), or nothing.
  std::optional<std::string> FullReason(const Deferred& e) const;
  // Lets `e` wait (at the head of its queue when `front`); returns the client's oldest waiting request when it
  // is now over its cap (taken out: answer it).
  DeferredPtr Add(DeferredPtr e, bool front);
  // The retries behind an insert id that `still_behind` no longer holds, then the heads the rules admit now,
  // in turn (admissions simulated, nothing counted). `held`: items held for SAMPLE replies not sent yet (a
  // queue's INSERTs count them, RateLimiter::InsertSize).
  std::vector<DeferredPtr> Release(const RateLimiter& limiter, uint64_t size,
                                   const std::function<bool(const Deferred&)>& still_behind = nullptr,
                                   uint64_t held = 0);
  std::vector<DeferredPtr> Expired(double now);
  std::optional<double> NextDeadline();
  // Every waiting request of a connection that left.
  std::vector<DeferredPtr> DropPeer(const std::string& peer);
  std::vector<DeferredPtr> TakeAll();

  uint64_t dropped = 0;  // waiting requests of departed peers, dropped unanswered
  uint64_t refused = 0;  // answered TIMEOUT at once because the caps were reached
  uint64_t evicted = 0;  // oldest requests of a client over its cap
  uint64_t examined_max = 0;
  uint64_t examined_total = 0;

 private:
  void Remove(Deferred* e);
  void Compact();

  const uint64_t max_total_, max_peer_, max_bytes_;
  std::deque<DeferredPtr> inserts_, samples_;
  std::deque<DeferredPtr> behind_;  // INSERTs waiting for their insert id's first request (behind_id)
  std::vector<DeferredPtr> heap_;   // std::push_heap order: earliest deadline, then arrival, on top
  std::unordered_map<std::string, std::deque<DeferredPtr>> per_client_;
  std::unordered_map<std::string, uint64_t> peer_count_;
  uint64_t count_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_WAITLIST_H_
