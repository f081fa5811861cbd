#include "apexrl/serve/item_check.h"

#include <algorithm>
#include <vector>

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
  std::vector<uint64_t> sorted;
  int64_t home = -1;  // the shard of the stored chunks referenced: one per request
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t lo = LoadU64(q.item_chunk_offsets, i), hi = LoadU64(q.item_chunk_offsets, i + 1);
    if (hi - lo > kMaxChunksPerItem) {  // the decoder checked lo <= hi <= num_refs
      return "items[" + std::to_string(i) + "] references " + std::to_string(hi - lo) +
             " chunks; an item may reference at most " + std::to_string(kMaxChunksPerItem);
    }
    sorted.clear();
    for (uint64_t j = lo; j < hi; ++j) {
      const uint64_t c = LoadU64(q.item_chunks, j);
      sorted.push_back(c);
      if (c < m) {
        used[c] = 1;
        continue;
      }
      // Not one of the request's chunks: a chunk key (its shard's range and its liveness are the store's check).
      const KeyParts key = SplitKey(c);
      if (!ValidTag(key.tag) || key.slot >= kMaxChunksPerShard) {
        return "items[" + std::to_string(i) + "] references chunk " + std::to_string(c) + ": neither one of the " +
               std::to_string(m) + " chunks sent nor a chunk key";
      }
      if (home >= 0 && key.shard != static_cast<uint64_t>(home)) {
        return "items[" + std::to_string(i) + "] references stored chunks of shards " + std::to_string(home) + " and " +
               std::to_string(key.shard) + "; the items of one call and all their chunks live on one shard";
      }
      home = key.shard;
    }
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end()) {
      return "items[" + std::to_string(i) + "] references chunk " + std::to_string(*twice) + " twice";
    }
  }
  for (uint64_t c = 0; c < m; ++c) {
    if (!used[c]) return "chunks[" + std::to_string(c) + "] is referenced by no item";
  }
  return std::nullopt;
}

}  // namespace apexrl::serve
