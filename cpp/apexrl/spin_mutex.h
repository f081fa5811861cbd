// SpinMutex: a mutex that spins briefly before it sleeps, for the shards' short critical sections.
#ifndef APEXRL_SPIN_MUTEX_H_
#define APEXRL_SPIN_MUTEX_H_

#include <mutex>

#include "apexrl/thread_annotations.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define APEXRL_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define APEXRL_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define APEXRL_CPU_RELAX() ((void)0)
#endif

#ifndef APEXRL_SPIN_TRIES
#define APEXRL_SPIN_TRIES 256
#endif

namespace apexrl {

// Why: a shard's critical sections last a few microseconds (a 50-item insert, one shard's share of a
// 512-sample), while putting a thread to sleep on a contended std::mutex and waking it again costs tens of
// microseconds on the VMs we measured. With one thread inserting and one sampling on the same store, a plain
// std::mutex cost the sampler a third of its rate; spinning for about as long as a critical section before
// sleeping turns most collisions into short waits. It still sleeps when the holder is slow (or descheduled),
// so oversubscribed machines do not burn a core per waiter.
// A capability for the thread-safety analysis: lock it through ScopedLock (mutex.h), not std::lock_guard,
// which the analysis cannot see. Satisfies Lockable. Not recursive.
class CAPABILITY("mutex") SpinMutex {
 public:
  void lock() ACQUIRE() {
    for (int i = 0; i < APEXRL_SPIN_TRIES; ++i) {
      if (mu_.try_lock()) return;
      for (int k = 0; k < 8; ++k) APEXRL_CPU_RELAX();
    }
    mu_.lock();
  }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

}  // namespace apexrl

#endif  // APEXRL_SPIN_MUTEX_H_
