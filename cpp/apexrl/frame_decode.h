// Native rebuild of Atari frame stacks stored once (python/apexrl/replay/wire/frames.py documents the layout).
//
// A sampled batch of FrameStackCodec items carries, per item and per stack, u16 frame references (slot << 8 |
// index: frame `index` of the item's `slot`-th chunk, or kPadFrame for an all-zero frame) and the frame chunks
// the items reference (each chunk: u32 little-endian raw size + one lz4 block of whole frames, at most 255).
// RebuildFrameStacks checks every reference, decompresses each chunk that a well-referenced item uses once and
// copies its frames into caller-provided stacks; an item with a bad reference, or one into a chunk that does
// not decompress to its stated size, is marked bad: the same items, by the same rules, as
// FrameStackCodec.decode_valid (the Python reference). It touches no Python object, so the binding runs it with
// the GIL released, and several threads may rebuild different batches at once.
#ifndef APEXRL_FRAME_DECODE_H_
#define APEXRL_FRAME_DECODE_H_

#include <cstddef>
#include <cstdint>

namespace apexrl {

inline constexpr uint16_t kPadFrame = 0xFFFF;  // a reference that stands for an all-zero frame
inline constexpr std::size_t kMaxChunkFrames = 255;

// The frame chunks of a sampled batch (protocol.FrameChunks): item i references chunks
// item_chunks[item_chunk_offsets[i] .. item_chunk_offsets[i + 1]), chunk c is
// chunk_data[chunk_offsets[c] .. chunk_offsets[c + 1]). Nothing here is trusted: offsets that decrease or run
// past their arrays make the chunks or items they describe bad, never an out-of-bounds read.
struct FrameChunkSet {
  const uint64_t* item_chunks = nullptr;
  std::size_t item_chunks_size = 0;
  const uint64_t* item_chunk_offsets = nullptr;
  std::size_t item_chunk_offsets_size = 0;  // the batch's items + 1
  const uint8_t* chunk_data = nullptr;
  std::size_t chunk_data_size = 0;
  const uint64_t* chunk_offsets = nullptr;
  std::size_t chunk_offsets_size = 0;  // chunks + 1 (0 or 1: no chunk)
};

// Rebuilds `stacks` stacks (obs, next_obs) of n items. items[j]: item j's index in the batch (its chunk list;
// the caller checked items[j] + 1 < item_chunk_offsets_size); refs[k]: stack k's references, n * depth u16 (row j
// = item j, oldest frame first); outs[k]: n * depth * frame_bytes bytes (row j at j * depth * frame_bytes).
// Sets ok[j] to 1 if item j's stacks are rebuilt, else 0 (its rows of outs are then unspecified). Returns the
// number of bad items.
std::size_t RebuildFrameStacks(std::size_t depth, std::size_t frame_bytes, std::size_t stacks, std::size_t n,
                               const int64_t* items, const uint16_t* const* refs, const FrameChunkSet& chunks,
                               uint8_t* const* outs, uint8_t* ok);

}  // namespace apexrl

#endif  // APEXRL_FRAME_DECODE_H_
