// PayloadArena: memory for one shard's item bytes, recycled inside the shard.
#ifndef APEXRL_PAYLOAD_ARENA_H_
#define APEXRL_PAYLOAD_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "apexrl/slab_reserve.h"

namespace apexrl {

// Why not malloc per item: glibc hands a freed chunk back to the arena of the thread that allocated it, so
// when one thread inserts and another evicts (a server's workers, the launcher's threads) the inserting
// thread never sees the freed memory again. It keeps page-faulting fresh memory (measured: 10x slower
// inserts) and the resident set grows towards twice the data. Here a block freed by eviction is reused by the
// next insert into the same shard, whichever thread makes it.
//
// Blocks come in size classes: multiples of 16 bytes up to 1 KiB (a 636-byte DPG item takes 640), then 8
// classes per power of two (at most 12.5% rounding) up to 1 MiB; larger items go straight to malloc.
// Each class has an intrusive free list and a bump pointer into its current slab (>= 64 KiB). Slabs are kept
// until the arena is destroyed: memory stays at the shard's high-water mark per class. With a SlabReserve
// (the store's), a new slab is one whose pages a background thread has already touched, when one is ready.
//
// Cost: O(1) per Allocate/Free. Thread-safety: none; the owning Shard's mutex guards it.
class PayloadArena {
 public:
  PayloadArena() = default;
  ~PayloadArena();
  PayloadArena(const PayloadArena&) = delete;
  PayloadArena& operator=(const PayloadArena&) = delete;

  // A block of at least `size` bytes (16-byte aligned, never null; throws std::bad_alloc).
  uint8_t* Allocate(uint32_t size);
  // Returns a block from Allocate(size) with the same size.
  void Free(uint8_t* block, uint32_t size);
  // Bytes this arena holds from the system (slabs plus large blocks).
  uint64_t reserved_bytes() const { return reserved_; }
  // Where new slabs come from first (not owned; null: malloc only). It must outlive the arena's Allocate calls.
  void set_reserve(SlabReserve* reserve) { reserve_ = reserve; }

  static constexpr uint32_t kLargeItem = 1u << 20;  // items above this are malloc'd individually

 private:
  struct SizeClass {
    uint8_t* free_list = nullptr;  // freed blocks, linked through their first 8 bytes
    uint8_t* bump = nullptr;       // unused tail of the current slab
    uint8_t* bump_end = nullptr;
  };
  static size_t ClassOf(uint32_t size);
  static uint32_t BlockSize(size_t size_class);
  uint8_t* Refill(size_t size_class);

  std::vector<SizeClass> classes_;
  std::vector<void*> slabs_;
  uint64_t reserved_ = 0;
  SlabReserve* reserve_ = nullptr;
};

}  // namespace apexrl

#endif  // APEXRL_PAYLOAD_ARENA_H_
