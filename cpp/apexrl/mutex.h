// Mutex, ScopedLock and CondVar: a plain mutex, a lock guard and a condition variable that clang's thread-safety
// analysis can follow (libstdc++'s std::mutex, std::lock_guard and std::condition_variable carry no capability
// annotations).
#ifndef APEXRL_MUTEX_H_
#define APEXRL_MUTEX_H_

#include <chrono>
#include <condition_variable>
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

// A condition variable that waits on a Mutex, so that a wait is checked like any other use of the lock: Wait
// REQUIRES the Mutex, and the analysis knows it is held again when Wait returns.
//
// Why std::condition_variable_any and not std::condition_variable: the latter only waits on a
// std::unique_lock<std::mutex>, which would mean handing out Mutex's inner std::mutex and locking it behind the
// analysis' back. condition_variable_any waits on Mutex itself (it calls Mutex::unlock and Mutex::lock), at
// the price of an inner mutex of its own per wait and notify: nothing on the paths it serves (the workers'
// job queue, the control queue to Python), which wake at most once per request handed over.
//
// There is no predicate overload on purpose: a predicate lambda is analysed as a function of its own that does
// not hold the lock, so every guarded member it read would be a warning. Callers loop instead:
//   while (!closed_ && queue_.empty()) cv_.Wait(mu_);
class CondVar {
 public:
  // Releases `mu`, sleeps until notified (or spuriously woken), and takes `mu` again.
  void Wait(Mutex& mu) REQUIRES(mu) { cv_.wait(mu); }
  // As Wait, but false once `deadline` has passed.
  bool WaitUntil(Mutex& mu, std::chrono::steady_clock::time_point deadline) REQUIRES(mu) {
    return cv_.wait_until(mu, deadline) == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace apexrl

#endif  // APEXRL_MUTEX_H_
