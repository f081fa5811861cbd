#include "apexrl/log_tail_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace apexrl {

struct LogTailCache::Block {
  // `memory`: `bytes` from std::malloc (a SlabReserve's slab, or the appender's own), freed with the block.
  Block(void* memory, size_t bytes) : size(bytes), data(static_cast<uint8_t*>(memory)) {}
  uint64_t segment = 0;
  uint64_t start = 0;  // the segment's byte offset of data[0]
  const size_t size;
  // Bytes of data appended; data[0, fill) never changes while a reader holds the block.
  std::atomic<size_t> fill{0};
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data;
};

namespace {

// A 32nd of the capacity, within [4 KiB, 16 MiB]: few blocks for a reader to hold, and at most a 32nd of the
// capacity empty after the oldest block goes. A small cache has two blocks (at least half of it stays full).
size_t BlockBytes(uint64_t capacity) {
  const uint64_t b = std::clamp<uint64_t>(capacity / 32, 4u << 10, 16u << 20);
  return static_cast<size_t>(std::max<uint64_t>(1, std::min(b, capacity / 2)));
}

}  // namespace

LogTailCache::LogTailCache(uint64_t capacity)
    : capacity_(capacity),
      block_bytes_(capacity > 0 ? BlockBytes(capacity) : 1),
      max_blocks_(static_cast<size_t>(std::max<uint64_t>(1, capacity / block_bytes_))) {
  if (capacity == 0) throw std::invalid_argument("a log tail cache needs a capacity above 0 bytes");
  if (max_blocks_ > 1) reserve_ = std::make_unique<SlabReserve>(2, block_bytes_);  // idle until the first block
}

LogTailCache::~LogTailCache() = default;

void LogTailCache::Append(uint64_t segment, uint64_t offset, const uint8_t* data, size_t n) {
  while (n > 0) {
    Block* b = current_;
    const size_t fill = b != nullptr ? b->fill.load(std::memory_order_relaxed) : 0;
    if (b == nullptr || b->segment != segment || b->start + fill != offset || fill == b->size) {
      NewBlock(segment, offset);
      continue;
    }
    const size_t take = std::min(n, b->size - fill);
    std::memcpy(b->data.get() + fill, data, take);
    b->fill.store(fill + take, std::memory_order_release);  // a reader that sees the fill sees the bytes
    data += take;
    offset += take;
    n -= take;
  }
}

void LogTailCache::NewBlock(uint64_t segment, uint64_t offset) {
  std::shared_ptr<Block> block;
  {
    ScopedLock<Mutex> lock(mu_);
    if (blocks_.size() >= max_blocks_) {
      // Readers copy and let go of their blocks under this lock: a count of 1 read here means none holds it,
      // and none can take it once it leaves the list.
      if (blocks_.front().use_count() == 1) block = std::move(blocks_.front());
      blocks_.pop_front();
    }
  }
  // A new block until the cache is full (its pages touched ahead by the reserve's thread, when it kept up), then
  // the oldest reused, unless a reader still held it as it went.
  if (block == nullptr) {
    void* memory = reserve_ != nullptr ? reserve_->Take() : nullptr;
    if (memory == nullptr) memory = AllocateSlab(block_bytes_);
    if (memory == nullptr) throw std::bad_alloc();
    block = std::make_shared<Block>(memory, block_bytes_);
  }
  block->segment = segment;
  block->start = offset;
  block->fill.store(0, std::memory_order_relaxed);
  bool full;
  {
    ScopedLock<Mutex> lock(mu_);
    current_ = block.get();
    blocks_.push_back(std::move(block));
    held_.store(blocks_.size() * block_bytes_, std::memory_order_relaxed);
    full = blocks_.size() >= max_blocks_;
  }
  if (full) reserve_.reset();  // blocks are reused from now on: its thread and ready slabs go
}

LogTailCache::Reader LogTailCache::Snapshot() const {
  Reader r;
  r.cache_ = this;
  ScopedLock<Mutex> lock(mu_);
  r.blocks_.assign(blocks_.begin(), blocks_.end());
  return r;
}

LogTailCache::Reader::Reader(Reader&& other) noexcept : cache_(other.cache_), blocks_(std::move(other.blocks_)) {
  other.cache_ = nullptr;
  other.blocks_.clear();
}

LogTailCache::Reader::~Reader() {
  if (cache_ == nullptr || blocks_.empty()) return;
  ScopedLock<Mutex> lock(cache_->mu_);
  blocks_.clear();
}

std::vector<std::shared_ptr<const LogTailCache::Block>>::const_iterator LogTailCache::Reader::Locate(
    uint64_t segment, uint64_t offset) const {
  auto it = std::upper_bound(blocks_.begin(), blocks_.end(), std::make_pair(segment, offset),
                             [](const std::pair<uint64_t, uint64_t>& at, const std::shared_ptr<const Block>& b) {
                               return at.first < b->segment || (at.first == b->segment && at.second < b->start);
                             });
  return it == blocks_.begin() ? blocks_.end() : it - 1;
}

const uint8_t* LogTailCache::Reader::Find(uint64_t segment, uint64_t offset, size_t n) const {
  const auto it = Locate(segment, offset);
  if (it == blocks_.end()) return nullptr;
  const Block& b = **it;
  const size_t fill = b.fill.load(std::memory_order_acquire);
  if (b.segment != segment || offset < b.start || offset - b.start + n > fill) return nullptr;
  return b.data.get() + (offset - b.start);
}

bool LogTailCache::Reader::Read(uint64_t segment, uint64_t offset, size_t n, uint8_t* out) const {
  auto it = Locate(segment, offset);
  while (n > 0) {
    if (it == blocks_.end()) return false;
    const Block& b = **it;
    const size_t fill = b.fill.load(std::memory_order_acquire);
    if (b.segment != segment || offset < b.start || offset >= b.start + fill) return false;
    const size_t at = static_cast<size_t>(offset - b.start);
    const size_t take = std::min(n, fill - at);
    std::memcpy(out, b.data.get() + at, take);
    out += take;
    offset += take;
    n -= take;
    ++it;  // the rest, if any, continues in the next block
  }
  return true;
}

}  // namespace apexrl
