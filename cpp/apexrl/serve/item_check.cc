#include "apexrl/serve/item_check.h"

#include <cstdio>
#include <cstring>

#include "apexrl/common.h"
#include "apexrl/serve/wire.h"

namespace apexrl::serve {
namespace {

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::string Hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string Item(uint64_t i) { return "item " + std::to_string(i) + ": "; }

// The first problem of one item's block walk, or nothing.
std::optional<std::string> WalkProblem(const ItemLayout& L, const uint8_t* data, uint64_t start, uint64_t end,
                                       uint64_t i) {
  uint64_t p = start + L.header_bytes;
  for (size_t k = 0; k < L.compressed_names.size(); ++k) {
    const std::string field = "field '" + L.compressed_names[k] + "': ";
    if (p + 4 > end) return Item(i) + field + "truncated before its length";
    const uint64_t len = LoadU32(data + p);
    p += 4;
    if (len > end - p) return Item(i) + field + "block of " + std::to_string(len) + " bytes overruns the item";
    if (L.compressed_empty[k] && len != 0) {
      return Item(i) + field + "zero-size field with a " + std::to_string(len) + "-byte block";
    }
    p += len;
  }
  if (p != end) return Item(i) + std::to_string(end - p) + " trailing bytes after the last field";
  return std::nullopt;
}

}  // namespace

std::optional<std::string> FirstBadItem(const ItemLayout& L, const uint8_t* data, const uint8_t* offsets, uint64_t n) {
  const bool compressed = !L.compressed_names.empty();
  const uint64_t least = L.header_bytes + 4 * L.compressed_names.size();
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t size = LoadU64(offsets, i + 1) - LoadU64(offsets, i);
    if (compressed ? size < least : size != L.header_bytes) {
      return Item(i) + std::to_string(size) + " bytes, expected " + (compressed ? "at least " : "exactly ") +
             std::to_string(compressed ? least : L.header_bytes) + " for " + L.repr;
    }
  }
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t fp = LoadU32(data + LoadU64(offsets, i));
    if (fp != L.fingerprint) {
      return Item(i) + "spec fingerprint " + Hex8(fp) + ", expected " + Hex8(L.fingerprint) +
             " (an item of another spec, or corrupted)";
    }
  }
  if (compressed) {
    for (uint64_t i = 0; i < n; ++i) {
      auto why = WalkProblem(L, data, LoadU64(offsets, i), LoadU64(offsets, i + 1), i);
      if (why) return why;
    }
  }
  return std::nullopt;
}

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
