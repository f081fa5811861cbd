#include "apexrl/decode.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "lz4.h"

namespace apexrl {
namespace {

constexpr std::size_t kWord = 4;  // u32: the fingerprint and every block length

uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

std::string Item(std::size_t i) { return "item " + std::to_string(i) + ": "; }

std::string Field(std::size_t i, const DecodeField& f) { return Item(i) + "field '" + f.name + "': "; }

// The first rule item i breaks in the walk over its compressed blocks' lengths ("" if none).
std::string BlockProblem(const DecodeLayout& layout, const uint8_t* buf, int64_t start, int64_t size, std::size_t i) {
  const int64_t end = start + size;
  int64_t p = start + static_cast<int64_t>(layout.HeaderBytes());
  for (const DecodeField& f : layout.fields) {
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
  return "";
}

}  // namespace

std::size_t DecodeLayout::HeaderBytes() const {
  std::size_t raw = 0;
  for (const DecodeField& f : fields) raw += f.compress ? 0 : f.nbytes;
  return kWord + raw;
}

std::size_t DecodeLayout::CompressedFields() const {
  std::size_t c = 0;
  for (const DecodeField& f : fields) c += f.compress ? 1 : 0;
  return c;
}

std::string DecodeItems(const DecodeLayout& layout, const uint8_t* buf, const int64_t* starts, const int64_t* sizes,
                        std::size_t n, uint8_t* const* outs) {
  const std::size_t hdr = layout.HeaderBytes();
  const std::size_t compressed = layout.CompressedFields();
  // Rule 1: sizes.
  const int64_t least = static_cast<int64_t>(hdr + kWord * compressed);
  for (std::size_t i = 0; i < n; ++i) {
    const bool bad = compressed ? sizes[i] < least : sizes[i] != static_cast<int64_t>(hdr);
    if (!bad) continue;
    if (sizes[i] < 0) {
      return Item(i) + "offsets decrease (" + std::to_string(starts[i]) + " -> " +
             std::to_string(starts[i] + sizes[i]) + ")";
    }
    return Item(i) + std::to_string(sizes[i]) + " bytes, expected " + (compressed ? "at least " : "exactly ") +
           std::to_string(least) + " for " + layout.spec_repr;
  }
  // Rule 2: fingerprints.
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t fp = LoadLe32(buf + starts[i]);
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
      std::string why = BlockProblem(layout, buf, starts[i], sizes[i], i);
      if (!why.empty()) return why;
    }
  }
  // Every item is well formed: copy the raw fields, decompress the others.
  for (std::size_t i = 0; i < n; ++i) {
    const uint8_t* item = buf + starts[i];
    std::size_t raw_pos = kWord;
    std::size_t p = hdr;
    for (std::size_t k = 0; k < layout.fields.size(); ++k) {
      const DecodeField& f = layout.fields[k];
      uint8_t* dst = outs[k] + i * f.nbytes;
      if (!f.compress) {
        if (f.nbytes) std::memcpy(dst, item + raw_pos, f.nbytes);
        raw_pos += f.nbytes;
        continue;
      }
      const uint32_t length = LoadLe32(item + p);
      p += kWord;
      if (f.nbytes == 0) continue;
      // As lz4.block.decompress(block, uncompressed_size=nbytes): the same call of the same lz4 version.
      const int wrote = LZ4_decompress_safe(reinterpret_cast<const char*>(item + p), reinterpret_cast<char*>(dst),
                                            static_cast<int>(length), static_cast<int>(f.nbytes));
      if (wrote < 0) {
        return Field(i, f) + "corrupted lz4 block (Decompression failed: corrupt input or insufficient space in " +
               "destination buffer. Error code: " + std::to_string(-static_cast<int64_t>(wrote)) + ")";
      }
      if (static_cast<std::size_t>(wrote) != f.nbytes) {
        return Field(i, f) + "decompressed to " + std::to_string(wrote) + " bytes, expected " +
               std::to_string(f.nbytes);
      }
      p += length;
    }
  }
  return "";
}

}  // namespace apexrl
