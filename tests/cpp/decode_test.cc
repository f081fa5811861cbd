// DecodeItems on hand-built items: the layout of python/apexrl/replay/wire/codec.py, each rule's message, and
// corrupted lz4 blocks refused without reading or writing out of bounds (this test also runs under the
// sanitizers). tests/replay/test_native_decode.py holds it to the Python decoder on random specs.
#include "apexrl/decode.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lz4.h"

namespace apexrl {
namespace {

constexpr uint32_t kFingerprint = 0x12345678;
constexpr std::size_t kFrame = 256;

ItemLayout Layout() {
  ItemLayout layout;
  layout.fingerprint = kFingerprint;
  layout.fields = {{"action", 4, false}, {"obs", kFrame, true}, {"empty", 0, true}};
  layout.repr = "TransitionSpec(test)";
  return layout;
}

void PutLe32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// One item: fingerprint, action (raw), obs (u32 length + lz4 block), empty (length 0).
std::vector<uint8_t> Item(int32_t action, uint8_t level) {
  std::vector<uint8_t> item;
  PutLe32(item, kFingerprint);
  PutLe32(item, static_cast<uint32_t>(action));
  std::vector<uint8_t> frame(kFrame);
  for (std::size_t i = 0; i < kFrame; ++i) frame[i] = static_cast<uint8_t>(level + i / 64);
  std::vector<char> block(LZ4_compressBound(kFrame));
  const int length = LZ4_compress_default(reinterpret_cast<const char*>(frame.data()), block.data(), kFrame,
                                          static_cast<int>(block.size()));
  PutLe32(item, static_cast<uint32_t>(length));
  item.insert(item.end(), block.begin(), block.begin() + length);
  PutLe32(item, 0);
  return item;
}

struct Batch {
  std::vector<uint8_t> data;
  std::vector<int64_t> starts, sizes;
  void Add(const std::vector<uint8_t>& item) {
    starts.push_back(static_cast<int64_t>(data.size()));
    sizes.push_back(static_cast<int64_t>(item.size()));
    data.insert(data.end(), item.begin(), item.end());
  }
  std::string Decode(std::vector<int32_t>* actions = nullptr, std::vector<uint8_t>* frames = nullptr) const {
    std::vector<int32_t> a(starts.size());
    std::vector<uint8_t> f(starts.size() * kFrame);
    uint8_t empty = 0;
    uint8_t* outs[] = {reinterpret_cast<uint8_t*>(a.data()), f.data(), &empty};
    std::string error = DecodeItems(Layout(), data.data(), starts.data(), sizes.data(), starts.size(), outs);
    if (actions) *actions = a;
    if (frames) *frames = f;
    return error;
  }
};

TEST(DecodeTest, DecodesRawAndCompressedFieldsOfEveryItem) {
  Batch b;
  b.Add(Item(7, 10));
  b.Add(Item(-3, 100));
  std::vector<int32_t> actions;
  std::vector<uint8_t> frames;
  ASSERT_EQ(b.Decode(&actions, &frames), "");
  EXPECT_EQ(actions, (std::vector<int32_t>{7, -3}));
  EXPECT_EQ(frames[0], 10);
  EXPECT_EQ(frames[kFrame - 1], 13);
  EXPECT_EQ(frames[kFrame], 100);
}

TEST(DecodeTest, EachRuleNamesTheFirstBadItemAsThePythonDecoderDoes) {
  Batch sizes;
  sizes.Add(Item(1, 1));
  sizes.Add({1, 2, 3});
  EXPECT_EQ(sizes.Decode(), "item 1: 3 bytes, expected at least 16 for TransitionSpec(test)");

  Batch decrease;
  decrease.Add(Item(1, 1));
  decrease.sizes[0] = -4;
  EXPECT_EQ(decrease.Decode(), "item 0: offsets decrease (0 -> -4)");

  Batch foreign;
  foreign.Add(Item(1, 1));
  foreign.Add(Item(1, 1));
  foreign.data[foreign.starts[1]] ^= 0xFF;
  EXPECT_EQ(foreign.Decode(),
            "item 1: spec fingerprint 0x12345687, expected 0x12345678 (an item of another spec, or corrupted)");

  Batch overrun;
  overrun.Add(Item(1, 1));
  overrun.data[8] = 0xFF;  // obs's block length
  EXPECT_EQ(overrun.Decode().rfind("item 0: field 'obs': block of ", 0), 0u);

  Batch trailing;
  std::vector<uint8_t> item = Item(1, 1);
  item.push_back(0);
  trailing.Add(item);
  EXPECT_EQ(trailing.Decode(), "item 0: 1 trailing bytes after the last field");

  Batch nonempty;
  item = Item(1, 1);
  item[item.size() - 4] = 1;  // the zero-size field's block length: 1, and that one byte follows
  item.push_back(0);
  nonempty.Add(item);
  EXPECT_EQ(nonempty.Decode(), "item 0: field 'empty': zero-size field with a 1-byte block");
}

TEST(DecodeTest, EveryCorruptionOfALz4BlockIsAnErrorOrAFullDecodeNeverAnOverrun) {
  const std::vector<uint8_t> good = Item(5, 42);
  const std::size_t block_start = 12;
  const std::size_t block_end = good.size() - 4;
  int errors = 0;
  for (std::size_t pos = block_start; pos < block_end; ++pos) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      Batch b;
      std::vector<uint8_t> item = good;
      item[pos] ^= flip;
      b.Add(item);
      const std::string error = b.Decode();
      if (!error.empty()) {
        ++errors;
        EXPECT_EQ(error.rfind("item 0: field 'obs': ", 0), 0u) << error;
      }
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace apexrl
