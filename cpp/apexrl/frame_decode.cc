#include "apexrl/frame_decode.h"

#include <cstring>
#include <limits>
#include <vector>

#include "lz4.h"

namespace apexrl {
namespace {

constexpr uint32_t kNoChunk = std::numeric_limits<uint32_t>::max();

uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// Frames chunk c holds by its size prefix (0: the chunk is unusable: too short, outside the data, or a size that
// is not a whole number of frames in [1, 255]). Nothing is decompressed here.
std::size_t FramesIn(const FrameChunkSet& set, std::size_t c, std::size_t frame_bytes) {
  const uint64_t lo = set.chunk_offsets[c];
  const uint64_t hi = set.chunk_offsets[c + 1];
  if (hi < lo || hi - lo < 4 || hi > set.chunk_data_size) return 0;
  const uint64_t size = LoadLe32(set.chunk_data + lo);
  if (size == 0 || size % frame_bytes != 0 || size > kMaxChunkFrames * frame_bytes) return 0;
  return static_cast<std::size_t>(size / frame_bytes);
}

}  // namespace

std::size_t RebuildFrameStacks(std::size_t depth, std::size_t frame_bytes, std::size_t stacks, std::size_t n,
                               const int64_t* items, const uint16_t* const* refs, const FrameChunkSet& chunks,
                               uint8_t* const* outs, uint8_t* ok) {
  const std::size_t nchunks = chunks.chunk_offsets_size > 1 ? chunks.chunk_offsets_size - 1 : 0;
  std::vector<uint8_t> frames_in(nchunks);
  for (std::size_t c = 0; c < nchunks; ++c) {
    frames_in[c] = static_cast<uint8_t>(FramesIn(chunks, c, frame_bytes));
  }
  // Pass 1: each reference -> its chunk (kNoChunk for zero padding), checked; an item is ok if all of its are.
  const std::size_t per_item = stacks * depth;
  std::vector<uint32_t> ref_chunk(n * per_item, kNoChunk);
  std::vector<uint32_t> users(nchunks + 1, 0);  // counting sort of the used references by chunk
  for (std::size_t j = 0; j < n; ++j) {
    const auto g = static_cast<std::size_t>(items[j]);
    const uint64_t first = chunks.item_chunk_offsets[g];
    const uint64_t count = chunks.item_chunk_offsets[g + 1] - first;  // as Python's int64 difference, mod 2^64
    bool good = true;
    for (std::size_t k = 0; k < stacks && good; ++k) {
      for (std::size_t s = 0; s < depth; ++s) {
        const uint16_t r = refs[k][j * depth + s];
        if (r == kPadFrame) continue;
        const uint64_t slot = r >> 8;
        const uint64_t index = r & 0xFFu;
        const uint64_t at = first + slot;
        // slot < count and 0 <= at < len(item_chunks), in int64 as the Python decoder computes them.
        if (static_cast<int64_t>(slot) >= static_cast<int64_t>(count) || static_cast<int64_t>(at) < 0 ||
            at >= chunks.item_chunks_size) {
          good = false;
          break;
        }
        const uint64_t c = chunks.item_chunks[at];
        if (c >= nchunks || index >= frames_in[c]) {
          good = false;
          break;
        }
        ref_chunk[j * per_item + k * depth + s] = static_cast<uint32_t>(c);
      }
    }
    ok[j] = good ? 1 : 0;
    if (!good) continue;
    for (std::size_t t = 0; t < per_item; ++t) {
      if (ref_chunk[j * per_item + t] != kNoChunk) ++users[ref_chunk[j * per_item + t] + 1];
    }
  }
  for (std::size_t c = 0; c < nchunks; ++c) users[c + 1] += users[c];
  std::vector<uint32_t> order(users[nchunks]);  // reference numbers (j * per_item + t), grouped by chunk
  {
    std::vector<uint32_t> next(users.begin(), users.end() - 1);
    for (std::size_t j = 0; j < n; ++j) {
      if (!ok[j]) continue;
      for (std::size_t t = 0; t < per_item; ++t) {
        const uint32_t c = ref_chunk[j * per_item + t];
        if (c != kNoChunk) order[next[c]++] = static_cast<uint32_t>(j * per_item + t);
      }
    }
  }
  auto target = [&](std::size_t ref) {
    const std::size_t j = ref / per_item;
    const std::size_t k = ref % per_item / depth;
    const std::size_t s = ref % depth;
    return outs[k] + (j * depth + s) * frame_bytes;
  };
  // Pass 2: every used chunk decompressed once (to exactly its stated size), its frames copied to their slots.
  std::vector<uint8_t> failed(nchunks, 0);
  bool any_failed = false;
  std::vector<uint8_t> raw;
  for (std::size_t c = 0; c < nchunks; ++c) {
    if (users[c] == users[c + 1]) continue;
    const uint8_t* block = chunks.chunk_data + chunks.chunk_offsets[c];
    const std::size_t length = static_cast<std::size_t>(chunks.chunk_offsets[c + 1] - chunks.chunk_offsets[c]);
    const std::size_t size = frames_in[c] * frame_bytes;  // > 0: a used chunk passed FramesIn
    if (raw.size() < size) raw.resize(size);
    const int wrote = LZ4_decompress_safe(reinterpret_cast<const char*>(block + 4), reinterpret_cast<char*>(raw.data()),
                                          static_cast<int>(length - 4), static_cast<int>(size));
    if (wrote < 0 || static_cast<std::size_t>(wrote) != size) {
      failed[c] = 1;
      any_failed = true;
      continue;
    }
    for (uint32_t u = users[c]; u < users[c + 1]; ++u) {
      const std::size_t ref = order[u];
      const std::size_t index = refs[ref % per_item / depth][ref / per_item * depth + ref % depth] & 0xFFu;
      std::memcpy(target(ref), raw.data() + index * frame_bytes, frame_bytes);
    }
  }
  std::size_t bad = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (ok[j] && any_failed) {
      for (std::size_t t = 0; t < per_item; ++t) {
        const uint32_t c = ref_chunk[j * per_item + t];
        if (c != kNoChunk && failed[c]) {
          ok[j] = 0;
          break;
        }
      }
    }
    if (!ok[j]) {
      ++bad;
      continue;
    }
    for (std::size_t t = 0; t < per_item; ++t) {  // zero padding
      if (ref_chunk[j * per_item + t] == kNoChunk) std::memset(target(j * per_item + t), 0, frame_bytes);
    }
  }
  return bad;
}

}  // namespace apexrl
