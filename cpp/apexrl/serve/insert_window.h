// Exactly-once inserts across retries. An INSERT may carry an insert_id (session, sequence); the window
// remembers the keys replied to recent ids, so a retry of a stored batch gets its first keys back and stores
// nothing. A request that claims a new id owns it until it is stored (Finish) or answered without storing
// (Release): every exit from a wait (expired, refused, evicted, its peer left, shutdown) releases it, and an
// owner's deadline is clipped to the server's wait cap, so the pending table only ever holds requests that
// wait or are being served. Remembered ids are kept per client identity (the ZAP User-Id; one shared window
// without CURVE), each bounded by count and bytes, so no client can push out another's ids.
#ifndef APEXRL_SERVE_INSERT_WINDOW_H_
#define APEXRL_SERVE_INSERT_WINDOW_H_

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "apexrl/common.h"
#include "apexrl/mutex.h"
#include "apexrl/thread_annotations.h"

namespace apexrl::serve {

struct InsertId {
  std::string identity;
  uint64_t session = 0;
  uint64_t sequence = 0;
  bool operator==(const InsertId& o) const {
    return session == o.session && sequence == o.sequence && identity == o.identity;
  }
};

struct InsertIdHash {
  size_t operator()(const InsertId& id) const {
    return std::hash<std::string>()(id.identity) ^ (id.session * 0x9E3779B97F4A7C15ULL) ^
           (id.sequence + 0x632BE59BD9B4E019ULL);
  }
};

struct InsertWindowStats {
  uint64_t duplicates = 0;  // retries answered from the window
  uint64_t remembered = 0;  // ids remembered now, all identities
  uint64_t forgotten = 0;   // ids dropped for the bounds
  uint64_t bytes = 0;       // bytes the remembered replies take
  uint64_t pending = 0;     // ids owned by a waiting or in-service request
  uint64_t identities = 0;
};

class InsertWindow {
 public:
  static constexpr uint64_t kEntryOverhead = 256;  // bytes charged per remembered id besides its keys

  InsertWindow(uint64_t max_ids_per_identity, uint64_t max_bytes_per_identity);

  enum class Claim { kNew, kDone, kBusy };
  // kDone (keys filled) for an id already stored; kBusy while another live request owns it; else kNew and
  // `owner` (a unique request number) owns the id until Finish or Release. now/deadline: monotonic seconds.
  Claim TryClaim(const InsertId& id, uint64_t owner, double deadline, double now, std::vector<Key>* keys) EXCLUDES(mu_);
  void Release(const InsertId& id, uint64_t owner) EXCLUDES(mu_);
  // True while a live request other than `asker` owns the id (TryClaim would answer kBusy).
  bool Busy(const InsertId& id, uint64_t asker, double now) const EXCLUDES(mu_);
  void Finish(const InsertId& id, uint64_t owner, const Key* keys, size_t n) EXCLUDES(mu_);
  InsertWindowStats Stats() const EXCLUDES(mu_);

 private:
  struct Remembered {
    uint64_t session, sequence;
    std::vector<Key> keys;
  };
  struct PerIdentity {
    std::list<Remembered> order;  // oldest first
    std::unordered_map<InsertId, std::list<Remembered>::iterator, InsertIdHash> index;
    uint64_t bytes = 0;
  };
  struct Owner {
    uint64_t owner;
    double deadline;
  };

  const uint64_t max_ids_;
  const uint64_t max_bytes_;
  mutable Mutex mu_;
  std::unordered_map<std::string, PerIdentity> done_ GUARDED_BY(mu_);
  std::unordered_map<InsertId, Owner, InsertIdHash> pending_ GUARDED_BY(mu_);
  uint64_t duplicates_ GUARDED_BY(mu_) = 0;
  uint64_t forgotten_ GUARDED_BY(mu_) = 0;
  uint64_t remembered_ GUARDED_BY(mu_) = 0;
  uint64_t bytes_ GUARDED_BY(mu_) = 0;
};

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_INSERT_WINDOW_H_
