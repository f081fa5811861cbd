// SlabReserve and the arena that takes its slabs: slabs are ready only once asked for, handed out once each,
// never blocking; an arena on a reserve allocates the same blocks as one without, from touched slabs.
#include "apexrl/slab_reserve.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "apexrl/payload_arena.h"

namespace apexrl {
namespace {

// Waits (polling, generous deadline: CI is a loaded 2-core machine) until the reserve holds `n` ready slabs.
bool WaitReady(SlabReserve& reserve, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (reserve.ready() < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(SlabReserveTest, FillsOnlyAfterTheFirstTakeThenHandsOutEachSlabOnce) {
  SlabReserve reserve(4);
  // Nothing is prepared before an arena asks: the first Take finds none ready and does not wait for one.
  EXPECT_EQ(reserve.Take(), nullptr);
  EXPECT_EQ(reserve.taken_empty(), 1u);
  ASSERT_TRUE(WaitReady(reserve, 4));
  EXPECT_EQ(reserve.ready(), 4u);  // never more than its depth
  std::set<void*> seen;
  std::vector<void*> slabs;
  for (int i = 0; i < 4; ++i) {
    void* slab = reserve.Take();
    ASSERT_NE(slab, nullptr);
    EXPECT_TRUE(seen.insert(slab).second) << "slab handed out twice";
    std::memset(slab, 0xAB, SlabReserve::kSlabBytes);  // the whole slab is the caller's
    slabs.push_back(slab);
  }
  EXPECT_EQ(reserve.taken_ready(), 4u);
  // Taking refills it again.
  ASSERT_TRUE(WaitReady(reserve, 4));
  for (void* slab : slabs) std::free(slab);
}

// Slabs of whole 2 MiB pages (a log tail cache's blocks) start on a 2 MiB boundary, so that the kernel can back
// them with transparent huge pages; any other size is plain malloc memory. Either is whole and writable.
TEST(SlabReserveTest, SlabsOfWholeHugePagesAreAlignedToThem) {
  constexpr size_t kHuge = 2u << 20;
  for (size_t bytes : {kHuge, 4 * kHuge, size_t{4096}, size_t{3} << 20}) {
    void* slab = AllocateSlab(bytes);
    ASSERT_NE(slab, nullptr) << bytes;
    if (bytes % kHuge == 0) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(slab) % kHuge, 0u) << bytes;
    }
    std::memset(slab, 0x5A, bytes);
    EXPECT_EQ(static_cast<uint8_t*>(slab)[bytes - 1], 0x5A);
    std::free(slab);
  }
  SlabReserve reserve(2, 2 * kHuge);
  EXPECT_EQ(reserve.Take(), nullptr);
  ASSERT_TRUE(WaitReady(reserve, 2));
  void* slab = reserve.Take();
  ASSERT_NE(slab, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(slab) % kHuge, 0u);
  std::free(slab);
}

TEST(SlabReserveTest, DepthZeroPreparesNothing) {
  SlabReserve reserve(0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(reserve.Take(), nullptr);
  EXPECT_EQ(reserve.ready(), 0u);
  EXPECT_EQ(reserve.taken_ready(), 0u);
}

TEST(SlabReserveTest, DestroyedWithSlabsReadyAndWhileFilling) {
  // The destructor stops the thread wherever it is and frees what is ready (LeakSanitizer checks the frees in
  // the sanitizer builds).
  for (int round = 0; round < 20; ++round) {
    SlabReserve reserve(8);
    EXPECT_EQ(reserve.Take(), nullptr);
    if (round % 2 == 0) {
      ASSERT_TRUE(WaitReady(reserve, 1));
    }
  }
}

TEST(SlabReserveTest, ArenaOnAReserveAllocatesDistinctWritableBlocks) {
  SlabReserve reserve(4);
  PayloadArena with;
  with.set_reserve(&reserve);
  PayloadArena without;
  // 640-byte blocks (a DPG item): the first slab is the arena's own (nothing ready yet), later ones the reserve's.
  constexpr uint32_t kSize = 636;
  std::set<uint8_t*> blocks;
  std::vector<uint8_t*> order;
  const size_t per_slab = SlabReserve::kSlabBytes / 640;
  for (size_t i = 0; i < 10 * per_slab; ++i) {
    if (i % per_slab == 0 && i > 0) {
      ASSERT_TRUE(WaitReady(reserve, 1));
    }
    uint8_t* b = with.Allocate(kSize);
    std::memset(b, static_cast<int>(i & 0xFF), kSize);
    ASSERT_TRUE(blocks.insert(b).second);
    order.push_back(b);
    without.Allocate(kSize);
  }
  EXPECT_EQ(reserve.taken_ready(), 9u);  // every slab after the first came ready
  EXPECT_EQ(reserve.taken_empty(), 1u);
  // Ten slabs either way; a reserve slab counts whole (its tail past the last whole block is unused).
  EXPECT_EQ(without.reserved_bytes(), 10 * per_slab * 640);
  EXPECT_EQ(with.reserved_bytes(), per_slab * 640 + 9 * SlabReserve::kSlabBytes);
  for (size_t i = 0; i < order.size(); ++i) {
    ASSERT_EQ(order[i][0], static_cast<uint8_t>(i & 0xFF));
    ASSERT_EQ(order[i][kSize - 1], static_cast<uint8_t>(i & 0xFF));
  }
  // Freed blocks are reused before any new slab is taken.
  const uint64_t taken = reserve.taken_ready() + reserve.taken_empty();
  for (uint8_t* b : order) with.Free(b, kSize);
  for (size_t i = 0; i < order.size(); ++i) with.Allocate(kSize);
  EXPECT_EQ(reserve.taken_ready() + reserve.taken_empty(), taken);
  // Blocks above the slab size never come from the reserve.
  uint8_t* big = with.Allocate(SlabReserve::kSlabBytes + 1);
  with.Free(big, SlabReserve::kSlabBytes + 1);
  EXPECT_EQ(reserve.taken_ready() + reserve.taken_empty(), taken);
}

TEST(SlabReserveTest, ManyArenasTakeConcurrently) {
  SlabReserve reserve(4);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&reserve] {
      PayloadArena arena;
      arena.set_reserve(&reserve);
      for (int i = 0; i < 4000; ++i) std::memset(arena.Allocate(1000), 1, 1000);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GE(reserve.taken_ready() + reserve.taken_empty(), static_cast<uint64_t>(kThreads));
}

}  // namespace
}  // namespace apexrl
