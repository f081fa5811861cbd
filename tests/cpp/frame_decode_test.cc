// RebuildFrameStacks on hand-built chunks: stacks rebuilt from references and zero padding, and every kind of
// damage (a size prefix that is not whole frames or over 255 frames or huge, a truncated or garbled lz4 block,
// chunk offsets past the data or decreasing, references past an item's chunks or a chunk's frames) marks
// exactly the items that use it, without reading or writing out of bounds: this test also runs in CI's
// AddressSanitizer and UBSan builds. tests/replay/test_native_frames.py holds it to the Python decoder.
#include "apexrl/frame_decode.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "lz4.h"

namespace apexrl {
namespace {

constexpr std::size_t kDepth = 2;
constexpr std::size_t kFrameBytes = 48;

uint8_t Pixel(int frame, std::size_t i) { return static_cast<uint8_t>(1 + frame * 7 + i % 5); }

// A chunk of `frames` frames (frame f's pixels from Pixel(first + f, .)): u32 raw size + one lz4 block.
std::vector<uint8_t> Chunk(int first, int frames) {
  std::vector<uint8_t> raw(static_cast<std::size_t>(frames) * kFrameBytes);
  for (std::size_t i = 0; i < raw.size(); ++i) {
    raw[i] = Pixel(first + static_cast<int>(i / kFrameBytes), i % kFrameBytes);
  }
  std::vector<char> block(LZ4_compressBound(static_cast<int>(raw.size())));
  const int length = LZ4_compress_default(reinterpret_cast<const char*>(raw.data()), block.data(),
                                          static_cast<int>(raw.size()), static_cast<int>(block.size()));
  std::vector<uint8_t> out(4 + static_cast<std::size_t>(length));
  for (std::size_t b = 0; b < 4; ++b) out[b] = static_cast<uint8_t>(raw.size() >> (8 * b));
  std::memcpy(out.data() + 4, block.data(), static_cast<std::size_t>(length));
  return out;
}

uint16_t Ref(int slot, int index) { return static_cast<uint16_t>(slot << 8 | index); }

struct Batch {
  std::vector<std::vector<uint8_t>> chunks;        // each as stored
  std::vector<std::vector<uint64_t>> item_chunks;  // per item, its chunk indices
  std::vector<std::vector<uint16_t>> refs[2];      // per stack, per item, kDepth references
  std::vector<uint64_t> chunk_offsets_override;

  void Add(std::vector<uint64_t> uses, std::vector<uint16_t> obs, std::vector<uint16_t> next) {
    item_chunks.push_back(std::move(uses));
    refs[0].push_back(std::move(obs));
    refs[1].push_back(std::move(next));
  }

  // Rebuilds every item; returns the ok mask, the stacks in *out.
  std::vector<uint8_t> Rebuild(std::vector<uint8_t> out[2]) const {
    std::vector<uint8_t> data;
    std::vector<uint64_t> co{0};
    for (const auto& c : chunks) {
      data.insert(data.end(), c.begin(), c.end());
      co.push_back(data.size());
    }
    if (!chunk_offsets_override.empty()) co = chunk_offsets_override;
    std::vector<uint64_t> ic, ico{0};
    for (const auto& uses : item_chunks) {
      ic.insert(ic.end(), uses.begin(), uses.end());
      ico.push_back(ic.size());
    }
    const std::size_t n = item_chunks.size();
    std::vector<uint16_t> flat[2];
    std::vector<int64_t> items;
    for (std::size_t j = 0; j < n; ++j) {
      items.push_back(static_cast<int64_t>(j));
      for (int k = 0; k < 2; ++k) flat[k].insert(flat[k].end(), refs[k][j].begin(), refs[k][j].end());
    }
    for (int k = 0; k < 2; ++k) out[k].assign(n * kDepth * kFrameBytes, 0xAB);
    // Exact-size copies: any read past what the set describes is an ASan report.
    std::vector<uint8_t> blob(data);
    FrameChunkSet set;
    set.item_chunks = ic.data();
    set.item_chunks_size = ic.size();
    set.item_chunk_offsets = ico.data();
    set.item_chunk_offsets_size = ico.size();
    set.chunk_data = blob.data();
    set.chunk_data_size = blob.size();
    set.chunk_offsets = co.data();
    set.chunk_offsets_size = co.size();
    const uint16_t* ref_ptrs[] = {flat[0].data(), flat[1].data()};
    uint8_t* outs[] = {out[0].data(), out[1].data()};
    std::vector<uint8_t> ok(n, 7);
    const std::size_t bad = RebuildFrameStacks(kDepth, kFrameBytes, 2, n, items.data(), ref_ptrs, set, outs, ok.data());
    std::size_t counted = 0;
    for (uint8_t o : ok) counted += o ? 0 : 1;
    EXPECT_EQ(bad, counted);
    return ok;
  }
};

// Frame `s` of item j's stack k equals Pixel(frame) (or zeros when frame < 0).
void ExpectFrame(const std::vector<uint8_t>* out, std::size_t k, std::size_t j, std::size_t s, int frame) {
  const uint8_t* p = out[k].data() + (j * kDepth + s) * kFrameBytes;
  for (std::size_t i = 0; i < kFrameBytes; ++i) {
    ASSERT_EQ(p[i], frame < 0 ? 0 : Pixel(frame, i)) << "stack " << k << " item " << j << " frame " << s;
  }
}

Batch TwoChunks() {
  Batch b;
  b.chunks = {Chunk(0, 3), Chunk(3, 2)};  // frames 0-2, 3-4
  b.Add({0}, {kPadFrame, Ref(0, 0)}, {Ref(0, 0), Ref(0, 1)});
  b.Add({0, 1}, {Ref(0, 2), Ref(1, 0)}, {Ref(1, 0), Ref(1, 1)});
  b.Add({1}, {Ref(0, 0), Ref(0, 1)}, {Ref(0, 1), kPadFrame});
  return b;
}

TEST(FrameDecodeTest, RebuildsStacksFromReferencesAndPadding) {
  std::vector<uint8_t> out[2];
  EXPECT_EQ(TwoChunks().Rebuild(out), (std::vector<uint8_t>{1, 1, 1}));
  ExpectFrame(out, 0, 0, 0, -1);
  ExpectFrame(out, 0, 0, 1, 0);
  ExpectFrame(out, 1, 0, 1, 1);
  ExpectFrame(out, 0, 1, 0, 2);
  ExpectFrame(out, 0, 1, 1, 3);
  ExpectFrame(out, 1, 1, 1, 4);
  ExpectFrame(out, 0, 2, 0, 3);
  ExpectFrame(out, 1, 2, 1, -1);
}

TEST(FrameDecodeTest, BadSizePrefixesMarkTheirUsersOnly) {
  for (uint32_t size : {0u, 1u, 47u, 49u, 256u * 48u, 0xFFFFFFFFu, 1000000000u}) {
    Batch b = TwoChunks();
    for (int i = 0; i < 4; ++i) b.chunks[1][i] = static_cast<uint8_t>(size >> (8 * i));
    std::vector<uint8_t> out[2];
    EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{1, 0, 0})) << size;
    ExpectFrame(out, 1, 0, 1, 1);
  }
}

TEST(FrameDecodeTest, AStatedSizeTheBlockDoesNotMatchFailsAtDecompression) {
  Batch b = TwoChunks();
  b.chunks[0][0] = static_cast<uint8_t>(2 * kFrameBytes);  // 2 frames stated, the block holds 3: too short
  std::vector<uint8_t> out[2];
  EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{0, 0, 1}));
  b = TwoChunks();
  b.chunks[0][0] = static_cast<uint8_t>(4 * kFrameBytes);  // 4 stated, 3 held: decompresses short
  EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{0, 0, 1}));
}

TEST(FrameDecodeTest, TruncatedOrGarbledBlocksAreRefusedInBounds) {
  for (std::size_t keep : {0, 3, 4, 5, 9}) {
    Batch b = TwoChunks();
    b.chunks[0].resize(keep);
    std::vector<uint8_t> out[2];
    EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{0, 0, 1})) << keep;
  }
  for (uint8_t fill : {0x00, 0xFF, 0x1F}) {
    Batch b = TwoChunks();
    for (std::size_t i = 4; i < b.chunks[0].size(); ++i) b.chunks[0][i] = fill;
    std::vector<uint8_t> out[2];
    EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{0, 0, 1})) << int(fill);
  }
  // Random damage: whatever the decoder makes of it, no out-of-bounds access and item 2 (chunk 1) unharmed.
  uint32_t x = 12345;
  for (int round = 0; round < 300; ++round) {
    Batch b = TwoChunks();
    for (int hits = 0; hits < 3; ++hits) {
      x = x * 1664525u + 1013904223u;
      b.chunks[0][4 + (x >> 8) % (b.chunks[0].size() - 4)] = static_cast<uint8_t>(x >> 24);
    }
    std::vector<uint8_t> out[2];
    EXPECT_EQ(b.Rebuild(out)[2], 1);
  }
}

TEST(FrameDecodeTest, ChunkOffsetsOutsideTheDataMakeTheChunkBad) {
  Batch b = TwoChunks();
  const uint64_t a = b.chunks[0].size(), total = a + b.chunks[1].size();
  std::vector<uint8_t> out[2];
  b.chunk_offsets_override = {0, a, total + 100};  // chunk 1 runs past the data
  EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{1, 0, 0}));
  b.chunk_offsets_override = {a + 1, a, total};  // chunk 0's offsets decrease
  EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{0, 0, 1}));
  b.chunk_offsets_override = {0};  // no chunk at all
  EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{0, 0, 0}));
}

TEST(FrameDecodeTest, BadReferencesMarkTheirItems) {
  Batch b = TwoChunks();
  b.refs[0][0][1] = Ref(1, 0);  // item 0 has one chunk: slot 1 names none
  b.refs[1][1][0] = Ref(1, 2);  // chunk 1 holds 2 frames
  b.item_chunks[2] = {5};       // no chunk 5
  std::vector<uint8_t> out[2];
  EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{0, 0, 0}));
  b = TwoChunks();
  b.refs[0][2][0] = 0xFEFF;  // slot 254, index 255: not padding
  EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{1, 1, 0}));
}

TEST(FrameDecodeTest, AFullChunkOf255FramesIsAccepted) {
  Batch b;
  b.chunks = {Chunk(0, 255)};
  b.Add({0}, {Ref(0, 0), Ref(0, 254)}, {Ref(0, 254), kPadFrame});
  std::vector<uint8_t> out[2];
  EXPECT_EQ(b.Rebuild(out), (std::vector<uint8_t>{1}));
  ExpectFrame(out, 0, 0, 1, 254);
}

}  // namespace
}  // namespace apexrl
