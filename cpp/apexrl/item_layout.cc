#include "apexrl/item_layout.h"

#include <cinttypes>
#include <cstdio>

namespace apexrl {
namespace {

constexpr std::size_t kWord = 4;  // u32: the fingerprint and every block length

uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

std::string Item(std::size_t i) { return "item " + std::to_string(i) + ": "; }

std::string Field(std::size_t i, const ItemField& f) { return Item(i) + "field '" + f.name + "': "; }

// The first rule item i breaks in the walk over its compressed blocks' lengths, or nothing.
std::optional<std::string> BlockProblem(const ItemLayout& layout, std::size_t hdr, const uint8_t* buf, int64_t start,
                                        int64_t size, std::size_t i) {
  const int64_t end = start + size;
  int64_t p = start + static_cast<int64_t>(hdr);
  for (const ItemField& f : layout.fields) {
    if (!f.compress) continue;
    if (p + static_cast<int64_t>(kWord) > end) return Field(i, f) + "truncated before its length";
    const int64_t length = LoadLe32(buf + p);
    p += kWord;
    if (length > end - p) return Field(i, f) + "block of " + std::to_string(length) + " bytes overruns the item";
    if (f.nbytes == 0 && length != 0) {
      return Field(i, f) + "zero-size field with a " + std::to_string(length) + "-byte block";
    }
    p += length;
  }
  if (p != end) return Item(i) + std::to_string(end - p) + " trailing bytes after the last field";
  return std::nullopt;
}

}  // namespace

std::size_t ItemLayout::HeaderBytes() const {
  std::size_t raw = 0;
  for (const ItemField& f : fields) raw += f.compress ? 0 : f.nbytes;
  return kWord + raw;
}

std::size_t ItemLayout::CompressedFields() const {
  std::size_t c = 0;
  for (const ItemField& f : fields) c += f.compress ? 1 : 0;
  return c;
}

std::optional<std::string> FirstBadItem(const ItemLayout& layout, const uint8_t* buf, const ItemSpans& items) {
  const std::size_t n = items.size();
  const std::size_t hdr = layout.HeaderBytes();
  const std::size_t compressed = layout.CompressedFields();
  // Rule 1: sizes.
  const int64_t least = static_cast<int64_t>(hdr + kWord * compressed);
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t size = items.Size(i);
    const bool bad = compressed ? size < least : size != static_cast<int64_t>(hdr);
    if (!bad) continue;
    if (size < 0) {
      const int64_t start = items.Start(i);
      return Item(i) + "offsets decrease (" + std::to_string(start) + " -> " + std::to_string(start + size) + ")";
    }
    return Item(i) + std::to_string(size) + " bytes, expected " + (compressed ? "at least " : "exactly ") +
           std::to_string(least) + " for " + layout.repr;
  }
  // Rule 2: fingerprints.
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t fp = LoadLe32(buf + items.Start(i));
    if (fp != layout.fingerprint) {
      char text[96];
      std::snprintf(text, sizeof text, "spec fingerprint 0x%08" PRIx32 ", expected 0x%08" PRIx32, fp,
                    layout.fingerprint);
      return Item(i) + text + " (an item of another spec, or corrupted)";
    }
  }
  // Rule 3: the block-length walk (the lowest bad item's first problem).
  if (compressed) {
    for (std::size_t i = 0; i < n; ++i) {
      auto why = BlockProblem(layout, hdr, buf, items.Start(i), items.Size(i), i);
      if (why) return why;
    }
  }
  return std::nullopt;
}

}  // namespace apexrl
