// Clang thread-safety annotations (-Wthread-safety). They compile to nothing elsewhere; CI builds the core with
// clang and APEXRL_THREAD_SAFETY=ON, which turns every violation into an error.
//
// A class marked CAPABILITY is a lock (SpinMutex, Mutex); SCOPED_CAPABILITY marks a guard that holds one for
// its lifetime (ScopedLock). Data members name the lock that guards them (GUARDED_BY, or PT_GUARDED_BY for what
// a pointer points to), and functions the locks they need held (REQUIRES), must not hold (EXCLUDES), take
// (ACQUIRE, TRY_ACQUIRE) or give back (RELEASE).
#ifndef APEXRL_THREAD_ANNOTATIONS_H_
#define APEXRL_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define APEXRL_TSA(x) __attribute__((x))
#else
#define APEXRL_TSA(x)
#endif

#define CAPABILITY(x) APEXRL_TSA(capability(x))
#define SCOPED_CAPABILITY APEXRL_TSA(scoped_lockable)
#define GUARDED_BY(x) APEXRL_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) APEXRL_TSA(pt_guarded_by(x))
#define REQUIRES(...) APEXRL_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) APEXRL_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) APEXRL_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) APEXRL_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) APEXRL_TSA(try_acquire_capability(__VA_ARGS__))
#define RETURN_CAPABILITY(x) APEXRL_TSA(lock_returned(x))
// For the few functions the analysis cannot follow; each use says why.
#define NO_THREAD_SAFETY_ANALYSIS APEXRL_TSA(no_thread_safety_analysis)

#endif  // APEXRL_THREAD_ANNOTATIONS_H_
