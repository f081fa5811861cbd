// DecodeSteps on hand-built step chunks: columns raw and lz4, copies spanning chunks, and every kind of damage
// (a copy past a chunk's steps or an item's rows, a column past the chunk bytes, a garbled or short lz4 block, a
// raw column of the wrong size) marks exactly the items that use it, without reading or writing out of bounds:
// this test also runs in CI's AddressSanitizer and UBSan builds. tests/replay/test_steps.py holds the binding to
// the numpy decoder.
#include "apexrl/step_decode.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "lz4.h"

namespace apexrl {
namespace {

constexpr uint64_t kRowBytes[2] = {4, 6};  // field 0: 4 bytes a step (raw), field 1: 6 bytes a step (lz4)

uint8_t Value(uint64_t field, uint64_t step, uint64_t i) { return static_cast<uint8_t>(field * 100 + step * 3 + i); }

// Chunks of `steps[c]` steps (global steps from `first[c]`), appended to `data`, their columns to `columns`.
struct Batch {
  std::vector<uint8_t> data;
  std::vector<StepColumn> columns;
  std::vector<uint64_t> steps;

  void Add(uint64_t first, uint64_t k) {
    steps.push_back(k);
    for (uint64_t f = 0; f < 2; ++f) {
      std::vector<uint8_t> raw(k * kRowBytes[f]);
      for (uint64_t s = 0; s < k; ++s) {
        for (uint64_t i = 0; i < kRowBytes[f]; ++i) raw[s * kRowBytes[f] + i] = Value(f, first + s, i);
      }
      StepColumn c;
      c.offset = data.size();
      if (f == 0) {
        data.insert(data.end(), raw.begin(), raw.end());
        c.stored = raw.size();
        c.codec = kStepColumnRaw;
      } else {
        std::vector<char> block(LZ4_compressBound(static_cast<int>(raw.size())));
        const int n = LZ4_compress_default(reinterpret_cast<const char*>(raw.data()), block.data(),
                                           static_cast<int>(raw.size()), static_cast<int>(block.size()));
        data.insert(data.end(), block.begin(), block.begin() + n);
        c.stored = static_cast<uint64_t>(n);
        c.codec = kStepColumnLz4;
      }
      columns.push_back(c);
    }
  }
};

struct Out {
  std::vector<uint8_t> f0, f1;
  std::vector<uint8_t> ok;
  Out(std::size_t n, std::size_t t) : f0(n * t * kRowBytes[0], 0xEE), f1(n * t * kRowBytes[1], 0xEE), ok(n, 1) {}
};

std::size_t Decode(const Batch& b, const std::vector<StepCopy>& copies, std::size_t n, std::size_t t, Out* out) {
  uint8_t* outs[2] = {out->f0.data(), out->f1.data()};
  StepDecodeJob job;
  job.chunk_data = b.data.data();
  job.chunk_data_size = b.data.size();
  job.num_chunks = b.steps.size();
  job.num_fields = 2;
  job.columns = b.columns.data();
  job.chunk_steps = b.steps.data();
  job.row_bytes = kRowBytes;
  job.outs = outs;
  job.n = n;
  job.t = t;
  job.copies = copies.data();
  job.num_copies = copies.size();
  job.ok = out->ok.data();
  return DecodeSteps(job);
}

// Item `item`'s rows [0, steps) hold global steps first.. of every field.
void ExpectSteps(const Out& out, std::size_t t, uint64_t item, uint64_t first, uint64_t steps) {
  for (uint64_t s = 0; s < steps; ++s) {
    for (uint64_t i = 0; i < kRowBytes[0]; ++i) {
      EXPECT_EQ(out.f0[(item * t + s) * kRowBytes[0] + i], Value(0, first + s, i)) << item << " " << s;
    }
    for (uint64_t i = 0; i < kRowBytes[1]; ++i) {
      EXPECT_EQ(out.f1[(item * t + s) * kRowBytes[1] + i], Value(1, first + s, i)) << item << " " << s;
    }
  }
}

TEST(DecodeSteps, CopiesRowsAcrossChunksFromRawAndLz4Columns) {
  Batch b;
  b.Add(0, 3);  // steps 0-2
  b.Add(3, 3);  // steps 3-5
  b.Add(6, 1);  // step 6
  // Item 0: steps 1..5 (rows 0-4); item 1: steps 5..6 (rows 0-1); item 2: step 0.
  const std::vector<StepCopy> copies{
      {0, 1, 0, 0, 2}, {1, 0, 0, 2, 3}, {1, 2, 1, 0, 1}, {2, 0, 1, 1, 1}, {0, 0, 2, 0, 1}};
  Out out(3, 5);
  EXPECT_EQ(Decode(b, copies, 3, 5, &out), 0u);
  EXPECT_EQ(out.ok, (std::vector<uint8_t>{1, 1, 1}));
  ExpectSteps(out, 5, 0, 1, 5);
  ExpectSteps(out, 5, 1, 5, 2);
  ExpectSteps(out, 5, 2, 0, 1);
  EXPECT_EQ(out.f0[(1 * 5 + 2) * kRowBytes[0]], 0xEE);  // rows past an item's steps are left alone
}

// A column whose chunk's first copy takes all its rows is decompressed into that item's rows and read from there
// by the items that share it, even when that item fails over another chunk; a first copy of some rows goes
// through the per-thread scratch, which must hold the right column whatever size the previous call left it.
TEST(DecodeSteps, SharedColumnsAreReadFromTheFirstItemsRowsOrFromScratchAcrossCalls) {
  for (int round = 0; round < 3; ++round) {
    Batch b;
    b.Add(0, 4);  // steps 0-3
    b.Add(4, 4);  // steps 4-7
    b.Add(8, 2);  // steps 8-9
    const std::size_t n = 4, t = 6;
    const uint64_t absent = 9;  // a chunk the batch lacks: item 0 fails after its first copy
    std::vector<StepCopy> copies{
        {1, 0, 0, 0, 4},       // item 0: all of chunk 1, straight into its rows
        {absent, 0, 0, 4, 1},  // ... then fails
        {1, 1, 1, 0, 3},       // item 1: steps 5-7 from item 0's rows
        {2, 0, 1, 3, 2},       //         steps 8-9
        {0, 2, 2, 0, 2},       // item 2: steps 2-3 (chunk 0's first copy: some rows, scratch)
        {1, 0, 2, 2, 4},       //         steps 4-7 from item 0's rows
        {0, 0, 3, 0, 4},       // item 3: steps 0-3 from scratch
    };
    if (round == 1) copies.resize(4);  // a smaller scratch than the last call's (none)
    Out out(n, t);
    Decode(b, copies, n, t, &out);
    EXPECT_EQ(out.ok[0], 0) << round;
    EXPECT_EQ(out.ok[1], 1) << round;
    ExpectSteps(out, t, 1, 5, 5);
    if (round != 1) {
      EXPECT_EQ(out.ok[2], 1);
      EXPECT_EQ(out.ok[3], 1);
      ExpectSteps(out, t, 2, 2, 6);
      ExpectSteps(out, t, 3, 0, 4);
    }
  }
}

TEST(DecodeSteps, DamageMarksExactlyTheItemsThatUseIt) {
  Batch b;
  b.Add(0, 3);
  b.Add(3, 3);
  const std::size_t n = 6, t = 4;
  std::vector<StepCopy> copies{
      {0, 0, 0, 0, 3},             // item 0: fine
      {0, 2, 1, 0, 2},             // item 1: rows 2..3 of a 3-step chunk
      {1, 0, 2, 2, 3},             // item 2: rows 2..4 of a 4-row item
      {5, 0, 3, 0, 1},             // item 3: a chunk the batch lacks
      {1, ~uint64_t{0}, 4, 0, 2},  // item 4: a source row that overflows
      {1, 0, 5, 0, 3},             // item 5: fine
  };
  Out out(n, t);
  EXPECT_EQ(Decode(b, copies, n, t, &out), 4u);
  EXPECT_EQ(out.ok, (std::vector<uint8_t>{1, 0, 0, 0, 0, 1}));
  ExpectSteps(out, t, 0, 0, 3);
  ExpectSteps(out, t, 5, 3, 3);
}

TEST(DecodeSteps, BadColumnsMarkTheirItemsAndAreNeverReadOutOfBounds) {
  for (int damage = 0; damage < 5; ++damage) {
    Batch b;
    b.Add(0, 2);
    b.Add(2, 2);
    StepColumn& lz4 = b.columns[1 * 2 + 1];  // chunk 1, field 1
    StepColumn& raw = b.columns[1 * 2 + 0];  // chunk 1, field 0
    switch (damage) {
      case 0:
        lz4.stored -= 1;  // a short block
        break;
      case 1:
        for (uint64_t i = 0; i < lz4.stored; ++i) b.data[lz4.offset + i] ^= 0x5A;  // garbled
        break;
      case 2:
        lz4.offset = b.data.size() - 1;  // past the chunk bytes
        lz4.stored = 100;
        break;
      case 3:
        raw.stored += 1;  // a raw column of the wrong size
        break;
      default:
        lz4.codec = 7;  // an unknown codec
        break;
    }
    const std::vector<StepCopy> copies{{0, 0, 0, 0, 2}, {1, 0, 1, 0, 2}, {0, 1, 2, 0, 1}, {1, 1, 2, 1, 1}};
    Out out(3, 2);
    Decode(b, copies, 3, 2, &out);
    EXPECT_EQ(out.ok, (std::vector<uint8_t>{1, 0, 0})) << damage;
    ExpectSteps(out, 2, 0, 0, 2);
  }
}

}  // namespace
}  // namespace apexrl
