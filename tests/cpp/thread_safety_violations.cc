// Locking mistakes the thread-safety analysis must catch. Never linked into anything: with
// APEXRL_THREAD_SAFETY=ON, ctest runs clang on this file in -verify mode, which passes only if exactly the
// diagnostics announced in the comments beside the faulty lines come out. So it fails if the annotations stop meaning
// anything (a lock class losing its CAPABILITY, a guard its SCOPED_CAPABILITY, the flag going missing), which
// a clean build of the real code could never show.
#include <mutex>

#include "apexrl/mutex.h"
#include "apexrl/spin_mutex.h"
#include "apexrl/thread_annotations.h"

namespace apexrl {

class Guarded {
 public:
  void WritesWithoutTheLock() {
    ++n_;  // expected-warning {{writing variable 'n_' requires holding mutex 'mu_' exclusively}}
  }
  int ReadsAfterTheGuardIsGone() {
    {
      ScopedLock lock(mu_);
      ++n_;
    }
    return n_;  // expected-warning {{reading variable 'n_' requires holding mutex 'mu_'}}
  }
  void CallsWithoutTheLock() {
    Bump();  // expected-warning {{calling function 'Bump' requires holding mutex 'mu_' exclusively}}
  }
  void CallsWhileHoldingIt() {
    ScopedLock lock(mu_);
    Outside();  // expected-warning {{cannot call function 'Outside' while mutex 'mu_' is held}}
  }
  void IgnoresTryLock() {
    mu_.try_lock();
    ++n_;          // expected-warning {{writing variable 'n_' requires holding mutex 'mu_' exclusively}}
    mu_.unlock();  // expected-warning {{releasing mutex 'mu_' that was not held}}
  }
  bool AdoptsASuccessfulTryLock() {  // correct: no diagnostic
    if (!mu_.try_lock()) return false;
    ScopedLock lock(mu_, std::adopt_lock);
    ++n_;
    return true;
  }
  void TouchesThePointee() {
    *p_ = 1;  // expected-warning {{writing the value pointed to by 'p_' requires holding mutex 'mu_' exclusively}}
  }
  void WritesUnderThePlainMutex() {
    ++m_;  // expected-warning {{writing variable 'm_' requires holding mutex 'slow_mu_' exclusively}}
    ScopedLock lock(slow_mu_);
    ++m_;
  }
  void WaitsWithoutTheLock() {
    cv_.Wait(slow_mu_);  // expected-warning {{calling function 'Wait' requires holding mutex 'slow_mu_' exclusively}}
  }
  void WaitsInALoopUnderTheLock() {  // correct: no diagnostic (the lock is held again after each wait)
    ScopedLock lock(slow_mu_);
    while (m_ == 0) cv_.Wait(slow_mu_);
    --m_;
  }

 private:
  void Bump() REQUIRES(mu_) { ++n_; }
  void Outside() EXCLUDES(mu_) {}

  SpinMutex mu_;
  int n_ GUARDED_BY(mu_) = 0;
  int* p_ PT_GUARDED_BY(mu_) = nullptr;
  Mutex slow_mu_;
  int m_ GUARDED_BY(slow_mu_) = 0;
  CondVar cv_;
};

}  // namespace apexrl
