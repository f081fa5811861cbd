#include "apexrl/slab_reserve.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>

namespace apexrl {

void* AllocateSlab(size_t bytes) {
  constexpr size_t kHugePage = 2u << 20;
  if (bytes < kHugePage || bytes % kHugePage != 0) return std::malloc(bytes);
  void* slab = std::aligned_alloc(kHugePage, bytes);
#ifdef MADV_HUGEPAGE
  // Advice only: a kernel without THP, or with it off, keeps 4 KiB pages and the slab works the same.
  if (slab != nullptr) ::madvise(slab, bytes, MADV_HUGEPAGE);
#endif
  return slab;
}

SlabReserve::SlabReserve(size_t depth, size_t slab_bytes) : depth_(depth), slab_bytes_(slab_bytes) {
  ready_.reserve(depth_);  // so the thread's push_back and Take's pop_back never allocate under the lock
  if (depth_ > 0) thread_ = std::thread([this] { Run(); });
}

SlabReserve::~SlabReserve() {
  {
    ScopedLock<Mutex> lock(mu_);
    stop_ = true;
  }
  wake_.NotifyAll();
  if (thread_.joinable()) thread_.join();
  ScopedLock<Mutex> lock(mu_);
  for (void* slab : ready_) std::free(slab);
  ready_.clear();
}

void* SlabReserve::Take() {
  if (depth_ == 0) return nullptr;
  void* slab = nullptr;
  bool first = false;
  {
    ScopedLock<Mutex> lock(mu_);
    first = !wanted_;
    wanted_ = true;
    if (!ready_.empty()) {
      slab = ready_.back();
      ready_.pop_back();
    }
  }
  // Wake the thread on the first call and whenever a slab left: it refills up to depth_.
  if (first || slab != nullptr) wake_.NotifyOne();
  (slab != nullptr ? taken_ready_ : taken_empty_).fetch_add(1, std::memory_order_relaxed);
  return slab;
}

size_t SlabReserve::ready() {
  ScopedLock<Mutex> lock(mu_);
  return ready_.size();
}

void SlabReserve::Run() {
  const long page = sysconf(_SC_PAGESIZE);
  const size_t step = page > 0 ? static_cast<size_t>(page) : 4096;
  for (;;) {
    {
      ScopedLock<Mutex> lock(mu_);
      while (!stop_ && (!wanted_ || ready_.size() >= depth_)) wake_.Wait(mu_);
      if (stop_) return;
    }
    // Allocate and touch outside the lock: this is the slow part the inserting thread no longer does.
    void* slab = AllocateSlab(slab_bytes_);
    if (slab == nullptr) {
      // Out of memory: stop preparing; the arenas allocate (and report bad_alloc) themselves.
      ScopedLock<Mutex> lock(mu_);
      while (!stop_) wake_.Wait(mu_);
      return;
    }
    auto* bytes = static_cast<volatile uint8_t*>(slab);
    for (size_t i = 0; i < slab_bytes_; i += step) bytes[i] = 0;
    ScopedLock<Mutex> lock(mu_);
    if (stop_ || ready_.size() >= depth_) {
      std::free(slab);
      if (stop_) return;
      continue;
    }
    ready_.push_back(slab);
  }
}

}  // namespace apexrl
