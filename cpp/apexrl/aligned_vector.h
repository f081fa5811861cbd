// AlignedVector: std::vector whose storage starts on a 128-byte boundary.
#ifndef APEXRL_ALIGNED_VECTOR_H_
#define APEXRL_ALIGNED_VECTOR_H_

#include <cstddef>
#include <new>
#include <vector>

namespace apexrl {

// Why: a SumMinTree block is 16 doubles (128 bytes) and a Shard slot record 32 bytes. With malloc's 16-byte
// alignment a block spans three cache lines instead of two and a record can straddle two, adding misses to
// every draw and update. 128 bytes also keeps a block inside one adjacent-line prefetch pair.
template <typename T, size_t Alignment = 128>
struct AlignedAllocator {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, Alignment>;
  };
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, Alignment>&) noexcept {}  // NOLINT: rebinding is implicit
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{Alignment})); }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, std::align_val_t{Alignment}); }
  template <typename U>
  bool operator==(const AlignedAllocator<U, Alignment>&) const noexcept {
    return true;
  }
  template <typename U>
  bool operator!=(const AlignedAllocator<U, Alignment>&) const noexcept {
    return false;
  }
};

template <typename T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace apexrl

#endif  // APEXRL_ALIGNED_VECTOR_H_
