// LogTailCache (log_tail_cache.h): reads what was appended and nothing else (not past what was appended, not
// another segment's, not bytes before a gap, not what fell out past the capacity), across blocks; a reader's
// blocks stay as they were while the appender moves on; the memory stays within the capacity; one appender and
// several readers at once never see a byte other than the one appended at that place (label stress: run under
// ThreadSanitizer in CI).
#include "apexrl/log_tail_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

namespace apexrl {
namespace {

// The byte "appended" at `offset` of `segment`: reads are checked against it.
uint8_t ByteAt(uint64_t segment, uint64_t offset) { return static_cast<uint8_t>((offset * 131 + segment * 7) >> 3); }

std::vector<uint8_t> Bytes(uint64_t segment, uint64_t offset, size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = ByteAt(segment, offset + i);
  return out;
}

void Append(LogTailCache& c, uint64_t segment, uint64_t offset, size_t n) {
  const std::vector<uint8_t> b = Bytes(segment, offset, n);
  c.Append(segment, offset, b.data(), b.size());
}

// Whether the cache holds [offset, offset + n) of `segment`, checking the bytes when it does.
bool Holds(const LogTailCache& c, uint64_t segment, uint64_t offset, size_t n) {
  std::vector<uint8_t> out(n);
  if (!c.Snapshot().Read(segment, offset, n, out.data())) return false;
  EXPECT_EQ(out, Bytes(segment, offset, n)) << "segment " << segment << " offset " << offset;
  return true;
}

TEST(LogTailCache, ReadsWhatWasAppendedAcrossBlocksAndNothingElse) {
  LogTailCache c(1 << 20);  // blocks of 32 KiB
  ASSERT_EQ(c.block_bytes(), 32u << 10);
  EXPECT_FALSE(Holds(c, 1, 24, 1));  // empty
  Append(c, 1, 24, 100'000);         // four blocks
  Append(c, 1, 100'024, 50);
  EXPECT_TRUE(Holds(c, 1, 24, 100'050));
  EXPECT_TRUE(Holds(c, 1, 65'000, 2'000));  // across the blocks' boundary
  EXPECT_TRUE(Holds(c, 1, 100'073, 1));     // the last byte
  EXPECT_FALSE(Holds(c, 1, 100'073, 2));    // past what was appended
  EXPECT_FALSE(Holds(c, 1, 23, 2));         // before it
  EXPECT_FALSE(Holds(c, 2, 24, 1));         // another segment
  // The next segment starts a block of its own; the last one's bytes stay.
  Append(c, 2, 24, 10);
  EXPECT_TRUE(Holds(c, 2, 24, 10));
  EXPECT_TRUE(Holds(c, 1, 100'000, 74));
  EXPECT_FALSE(Holds(c, 1, 100'000, 75));  // does not run on into segment 2
  // Bytes that do not follow the last ones (a gap) start a block too; the gap is not held.
  Append(c, 2, 1'000, 10);
  EXPECT_TRUE(Holds(c, 2, 1'000, 10));
  EXPECT_FALSE(Holds(c, 2, 34, 1));
  EXPECT_FALSE(Holds(c, 2, 30, 980));
}

TEST(LogTailCache, KeepsTheNewestBytesWithinItsCapacity) {
  LogTailCache c(1 << 20);  // 32 blocks of 32 KiB
  uint64_t offset = 24;
  for (int i = 0; i < 100; ++i) {  // 5 MB in appends of 50 KB
    Append(c, 3, offset, 50'000);
    offset += 50'000;
    EXPECT_LE(c.bytes(), c.capacity());
  }
  EXPECT_EQ(c.bytes(), c.capacity());
  EXPECT_TRUE(Holds(c, 3, offset - 1'000'000, 1'000'000));  // the newest 31 blocks' worth at least
  EXPECT_FALSE(Holds(c, 3, 24, 1));                         // the oldest went
  EXPECT_FALSE(Holds(c, 3, offset - (1 << 20) - 70'000, 1));
}

TEST(LogTailCache, AReadersBlocksStayAsTheyWereWhileTheAppenderMovesOn) {
  LogTailCache c(256 << 10);  // 32 blocks of 8 KiB
  Append(c, 1, 24, 100'000);
  const LogTailCache::Reader held = c.Snapshot();
  for (uint64_t s = 2; s < 40; ++s) Append(c, s, 24, 200'000);  // the cache turns over many times
  std::vector<uint8_t> out(100'000);
  ASSERT_TRUE(held.Read(1, 24, out.size(), out.data()));
  EXPECT_EQ(out, Bytes(1, 24, out.size()));  // not reused while held
  EXPECT_FALSE(Holds(c, 1, 24, 1));          // gone from the cache itself
  EXPECT_TRUE(Holds(c, 39, 200'024 - 100'000, 100'000));
}

TEST(LogTailCache, ASmallCapacityIsTwoBlocksAndZeroIsRefused) {
  LogTailCache c(1000);
  EXPECT_EQ(c.block_bytes(), 500u);
  Append(c, 1, 24, 1500);
  EXPECT_TRUE(Holds(c, 1, 524, 1000));
  EXPECT_FALSE(Holds(c, 1, 523, 2));
  EXPECT_LE(c.bytes(), 1000u);
  EXPECT_THROW(LogTailCache(0), std::invalid_argument);
}

// One appender turning the cache over many times while readers read random recent ranges: every read that
// succeeds returns exactly the bytes appended there.
TEST(LogTailCacheStress, ReadersNeverSeeAByteOtherThanTheOneAppended) {
  LogTailCache c(512 << 10);  // 32 blocks of 16 KiB
  std::atomic<uint64_t> end{24};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> hits{0}, wrong{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937_64 rng(r);
      std::vector<uint8_t> out(4096);
      while (!done.load(std::memory_order_acquire)) {
        const LogTailCache::Reader view = c.Snapshot();
        for (int k = 0; k < 64; ++k) {
          const uint64_t e = end.load(std::memory_order_acquire);
          const uint64_t back = rng() % (700u << 10);
          const uint64_t at = e > back + 24 ? e - back : 24;
          const size_t n = 1 + rng() % out.size();
          if (!view.Read(7, at, n, out.data())) continue;
          hits.fetch_add(1, std::memory_order_relaxed);
          for (size_t i = 0; i < n; ++i) {
            if (out[i] != ByteAt(7, at + i)) {
              wrong.fetch_add(1, std::memory_order_relaxed);
              break;
            }
          }
        }
      }
    });
  }
  std::mt19937_64 rng(99);
  uint64_t offset = 24;
  while (offset < (40u << 20)) {  // 40 MB: the cache turns over about 80 times
    const size_t n = 1 + rng() % 20'000;
    Append(c, 7, offset, n);
    offset += n;
    end.store(offset, std::memory_order_release);
  }
  done.store(true, std::memory_order_release);
  for (auto& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  EXPECT_LE(c.bytes(), c.capacity());
}

}  // namespace
}  // namespace apexrl
