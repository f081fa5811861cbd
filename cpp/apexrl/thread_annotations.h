// Clang thread-safety annotations (-Wthread-safety); they compile to nothing elsewhere.
#ifndef APEXRL_THREAD_ANNOTATIONS_H_
#define APEXRL_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define APEXRL_TSA(x) __attribute__((x))
#else
#define APEXRL_TSA(x)
#endif

#define GUARDED_BY(x) APEXRL_TSA(guarded_by(x))
#define EXCLUDES(...) APEXRL_TSA(locks_excluded(__VA_ARGS__))
#define REQUIRES(...) APEXRL_TSA(requires_capability(__VA_ARGS__))

#endif  // APEXRL_THREAD_ANNOTATIONS_H_
