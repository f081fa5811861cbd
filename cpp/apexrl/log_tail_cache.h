// LogTailCache: the last bytes a disk table's log wrote, kept in memory, so that a SAMPLE reads recently written
// items with a copy instead of a system call each.
//
// Why: a disk table's store holds where each item's bytes lie in the log (disk_table.h), and a SAMPLE read each
// drawn item with one pread -- from the page cache when it is there, yet about 3.5 µs of CPU an item on the
// loop's workers (the system call, in a virtual machine), where a memory table copies its items out of its
// slabs in a tenth of that. Under the Ape-X mix that kept a disk table's sample rate at a quarter of a memory
// table's. A replay table's live items are mostly its newest (FIFO eviction keeps the last `capacity`), which
// lie in the log's tail: this keeps that tail, up to `capacity` bytes, and a read found here costs a memcpy.
// A read it does not hold (an older item, or one written before the cache's bytes begin) goes to the file as
// before: the cache changes speed, never an answer (the reader checks that the record is the item's either way:
// its type, size and key; a file's checksum too). Its blocks are whole 2 MiB pages, aligned, given to transparent
// huge pages where the kernel allows (AllocateSlab): a batch's reads land all over the cache.
//
// Layout: blocks of block_bytes(), each holding a contiguous run of one segment's bytes; a new segment, or bytes
// that do not follow the last ones written, start a new block. When the blocks pass `capacity`, the oldest goes
// (its memory is reused for the next block unless a reader still holds it). Until the cache is full, its new
// blocks come from a SlabReserve, their pages touched by a thread of its own: the appender (the serving loop)
// does not take a page fault for every 4 KiB it caches.
//
// Thread-safety: one thread appends (the serving loop's: the log's only writer); any thread reads, through a
// Reader, which holds the blocks that existed when it was made. A block's bytes below its published fill
// (released after they are copied in) are never written again while a Reader holds it, so a reader copies them
// without a lock; Readers take and let go of their blocks under the cache's lock, so the appender, which looks
// under it too, reuses a dropped block only once no reader can be reading it.
#ifndef APEXRL_LOG_TAIL_CACHE_H_
#define APEXRL_LOG_TAIL_CACHE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "apexrl/mutex.h"
#include "apexrl/slab_reserve.h"
#include "apexrl/thread_annotations.h"

namespace apexrl {

class LogTailCache {
 public:
  struct Block;

  // Holds up to `capacity` bytes (> 0) of the log's tail, in blocks of block_bytes().
  explicit LogTailCache(uint64_t capacity);
  ~LogTailCache();
  LogTailCache(const LogTailCache&) = delete;
  LogTailCache& operator=(const LogTailCache&) = delete;

  // The appending thread: `n` bytes just written to `segment` at byte `offset` (on disk now, in the page cache).
  void Append(uint64_t segment, uint64_t offset, const uint8_t* data, size_t n) EXCLUDES(mu_);

  // A batch's view of the cache: the blocks as they were when it was made (held, so none is reused meanwhile),
  // each read up to what had been appended to it when that read began.
  class Reader {
   public:
    Reader() = default;
    ~Reader();  // lets go of the blocks, under the cache's lock
    Reader(Reader&& other) noexcept;
    Reader& operator=(Reader&&) = delete;
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;
    // Copies `n` bytes of `segment` at `offset` into `out`; false (out partly written) when the cache does not
    // hold all of them.
    bool Read(uint64_t segment, uint64_t offset, size_t n, uint8_t* out) const;
    // Where those `n` bytes lie when one block holds them all (valid while this Reader lives), else null.
    const uint8_t* Find(uint64_t segment, uint64_t offset, size_t n) const;
    bool empty() const { return blocks_.empty(); }

   private:
    friend class LogTailCache;
    // The last block starting at or before (segment, offset), or end().
    std::vector<std::shared_ptr<const Block>>::const_iterator Locate(uint64_t segment, uint64_t offset) const;
    const LogTailCache* cache_ = nullptr;
    std::vector<std::shared_ptr<const Block>> blocks_;  // oldest first: ordered by (segment, start)
  };
  // Any thread. The Reader must not outlive the cache.
  Reader Snapshot() const EXCLUDES(mu_);

  uint64_t capacity() const { return capacity_; }
  size_t block_bytes() const { return block_bytes_; }
  // The blocks' memory now (a dropped block a Reader still held, until it lets go, is not counted).
  uint64_t bytes() const { return held_.load(std::memory_order_relaxed); }

 private:
  // Starts a block for `segment` at `offset` (past capacity the oldest goes, its memory reused if no Reader
  // holds it). Appending thread.
  void NewBlock(uint64_t segment, uint64_t offset) EXCLUDES(mu_);

  const uint64_t capacity_;
  const size_t block_bytes_;
  const size_t max_blocks_;
  mutable Mutex mu_;
  std::deque<std::shared_ptr<Block>> blocks_ GUARDED_BY(mu_);
  Block* current_ = nullptr;  // the newest block; the appending thread's (blocks_.back())
  // New blocks' memory, touched ahead; the appending thread's, let go once the cache is full.
  std::unique_ptr<SlabReserve> reserve_;
  std::atomic<uint64_t> held_{0};
};

}  // namespace apexrl

#endif  // APEXRL_LOG_TAIL_CACHE_H_
