#include "apexrl/serve/item_check.h"

#include "apexrl/common.h"
#include "apexrl/serve/wire.h"

namespace apexrl::serve {
std::optional<std::string> FirstBadInsertContent(const Request& q) {
  constexpr uint64_t kMaxPayload = 0xFFFFFFFFu;  // an item or chunk of the store holds at most 2^32 - 1 bytes
  const uint64_t n = q.count, m = q.num_chunks;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t size = LoadU64(q.offsets, i + 1) - LoadU64(q.offsets, i);
    if (size > kMaxPayload) {
      return "items[" + std::to_string(i) + "] is " + std::to_string(size) +
             " bytes; an item may hold at most 4294967295 bytes";
    }
  }
  if (n == 0) {
    if (m > 0) return std::string("chunks sent without items: no item references them");
    return std::nullopt;
  }
  if (m == 0 && q.num_refs == 0) return std::nullopt;
  if (m > kMaxBatchItems) {
    return "cannot insert chunks for " + std::to_string(m) + " items in one call; the limit is " +
           std::to_string(kMaxBatchItems) + " (split the call)";
  }
  for (uint64_t c = 0; c < m; ++c) {
    const uint64_t size = LoadU64(q.chunk_offsets, c + 1) - LoadU64(q.chunk_offsets, c);
    if (size > kMaxPayload) {
      return "chunks[" + std::to_string(c) + "] is " + std::to_string(size) +
             " bytes; a chunk may hold at most 4294967295 bytes";
    }
  }
  std::vector<uint8_t> used(m, 0);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t lo = LoadU64(q.item_chunk_offsets, i), hi = LoadU64(q.item_chunk_offsets, i + 1);
    if (hi - lo > kMaxChunksPerItem) {  // the decoder checked lo <= hi <= num_refs
      return "items[" + std::to_string(i) + "] references " + std::to_string(hi - lo) +
             " chunks; an item may reference at most " + std::to_string(kMaxChunksPerItem);
    }
    for (uint64_t j = lo; j < hi; ++j) {
      const uint64_t c = LoadU64(q.item_chunks, j);
      if (c >= m) {
        return "items[" + std::to_string(i) + "] references chunk " + std::to_string(c) + " of " + std::to_string(m);
      }
      for (uint64_t k = lo; k < j; ++k) {
        if (LoadU64(q.item_chunks, k) == c) {
          return "items[" + std::to_string(i) + "] references chunk " + std::to_string(c) + " twice";
        }
      }
      used[c] = 1;
    }
  }
  for (uint64_t c = 0; c < m; ++c) {
    if (!used[c]) return "chunks[" + std::to_string(c) + "] is referenced by no item";
  }
  return std::nullopt;
}

}  // namespace apexrl::serve
