#include "apexrl/decode.h"

#include <cstring>

#include "lz4.h"

namespace apexrl {
namespace {

constexpr std::size_t kWord = 4;  // u32: the fingerprint and every block length

uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

std::string Field(std::size_t i, const ItemField& f) {
  return "item " + std::to_string(i) + ": field '" + f.name + "': ";
}

}  // namespace

std::string DecodeItems(const ItemLayout& layout, const uint8_t* buf, const int64_t* starts, const int64_t* sizes,
                        std::size_t n, uint8_t* const* outs) {
  const std::size_t hdr = layout.HeaderBytes();
  if (auto why = FirstBadItem(layout, buf, ItemSpans::StartsAndSizes(starts, sizes, n))) return *why;
  // Every item is well formed: copy the raw fields, decompress the others.
  for (std::size_t i = 0; i < n; ++i) {
    const uint8_t* item = buf + starts[i];
    std::size_t raw_pos = kWord;
    std::size_t p = hdr;
    for (std::size_t k = 0; k < layout.fields.size(); ++k) {
      const ItemField& f = layout.fields[k];
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
