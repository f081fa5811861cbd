// Mutex and ScopedLock: a plain mutex and a lock guard that clang's thread-safety analysis can follow
// (libstdc++'s std::mutex and std::lock_guard carry no capability annotations).
#ifndef APEXRL_MUTEX_H_
#define APEXRL_MUTEX_H_

#include <mutex>

#include "apexrl/thread_annotations.h"

namespace apexrl {

// std::mutex as a capability, for locks held across long operations (no spinning; SpinMutex is for the
// shards' short critical sections). Not recursive.
class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds `mu` (a SpinMutex or a Mutex) from construction to destruction. The adopting constructor takes over
// a lock the caller already holds (after a successful try_lock), so early returns and exceptions release it.
template <typename M>
class SCOPED_CAPABILITY ScopedLock {
 public:
  explicit ScopedLock(M& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ScopedLock(M& mu, std::adopt_lock_t) REQUIRES(mu) : mu_(mu) {}
  ~ScopedLock() RELEASE() { mu_.unlock(); }
  ScopedLock(const ScopedLock&) = delete;
  ScopedLock& operator=(const ScopedLock&) = delete;

 private:
  M& mu_;
};

}  // namespace apexrl

#endif  // APEXRL_MUTEX_H_
