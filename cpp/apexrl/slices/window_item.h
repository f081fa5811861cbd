// A slices table's window on the wire: the item a SAMPLE reply carries per window (docs/protocol.md, "Slices
// tables"), fixed little-endian binary, no JSON:
//   "APXW", u16 version (1), u16 flags (0), u32 F (fields), u32 R (chunks referenced), u64 fingerprint,
//   u64 first (the window's first step in the concatenation of its chunks), u64 rows (its steps), u64 t (the
//   batch's steps per window), then per chunk it references (in the reply's order): u64 steps, F x (u64 offset
//   in the chunk, u64 stored bytes, u64 codec).
// It carries what the table kept at insert (each chunk's steps and column places), so a client decodes the
// reply's windows as the in-process SliceTable decodes its samples (DecodeSlices), parsing no chunk header.
#ifndef APEXRL_SLICES_WINDOW_ITEM_H_
#define APEXRL_SLICES_WINDOW_ITEM_H_

#include <cstddef>
#include <cstdint>

#include "apexrl/slices/slice_table.h"

namespace apexrl {

inline constexpr char kWindowItemMagic[4] = {'A', 'P', 'X', 'W'};
inline constexpr uint16_t kWindowItemVersion = 1;
inline constexpr std::size_t kWindowItemHeader = 48;

// The item's bytes for a window referencing `num_refs` chunks of `num_fields` fields.
inline uint64_t WindowItemSize(uint64_t num_refs, uint64_t num_fields) {
  return kWindowItemHeader + num_refs * (8 + 24 * num_fields);
}

// Writes window i of `s` (WindowItemSize bytes) at `out`, its sequence `t` steps long.
void WriteWindowItem(const SliceSample& s, std::size_t i, uint64_t t, uint8_t* out);

// A SAMPLE reply's frames as the client received them, unchecked.
struct WindowItemsReply {
  const uint8_t* data = nullptr;  // the items, back to back
  uint64_t data_size = 0;
  const uint64_t* offsets = nullptr;  // n + 1
  std::size_t n = 0;
  const uint64_t* item_chunks = nullptr;  // the reply's chunk indices each item references
  uint64_t num_item_chunks = 0;
  const uint64_t* item_chunk_offsets = nullptr;  // n + 1
  const uint8_t* chunk_data = nullptr;
  uint64_t chunk_data_size = 0;
  const uint64_t* chunk_offsets = nullptr;  // num_chunks + 1
  uint64_t num_chunks = 0;
};

// Decodes the reply's windows into outs (num_fields arrays of n * window * row_bytes[f] bytes, window-major, the
// fields in path order), mask (n * window) and rows (n: each window's steps, 0 when it is not ok), as
// DecodeSlices does. Every field and frame is checked before anything is read through it: a window whose item
// is malformed (size, magic, version, flags, field count, a reference or chunk outside its frame, steps past its
// chunks, rows not in [1, window], a t other than `window`, a chunk's places unlike an earlier window's), of
// another fingerprint than `fingerprint`, or whose columns do not decode to their sizes gets ok 0, mask 0 and
// zero rows; the rest decode. Returns how many windows failed. Touches no Python object.
std::size_t DecodeWindowItems(const WindowItemsReply& reply, uint64_t fingerprint, std::size_t num_fields,
                              const uint64_t* row_bytes, uint8_t* const* outs, std::size_t window, uint8_t* mask,
                              uint8_t* ok, uint64_t* rows);

}  // namespace apexrl

#endif  // APEXRL_SLICES_WINDOW_ITEM_H_
