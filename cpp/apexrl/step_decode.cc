#include "apexrl/step_decode.h"

#include <cstring>
#include <vector>

#include "lz4.h"

namespace apexrl {

namespace {

constexpr uint64_t kNoScratch = ~uint64_t{0};

// Scratch for the columns that cannot be decompressed straight into an output (their chunk's first copy takes
// only some of its rows). Kept per thread between calls: a buffer allocated per batch goes back to the system
// when freed and costs a page fault per 4 KiB the next time, which made a batch of chunks that are all
// distinct (a large table) several times dearer per chunk than one of chunks its items share.
thread_local std::vector<uint8_t> scratch;

}  // namespace

std::size_t DecodeSteps(const StepDecodeJob& job) {
  const std::size_t cells = job.num_chunks * job.num_fields;
  std::size_t bad = 0;
  auto fail = [&](uint64_t item) {
    if (item < job.n && job.ok[item]) {
      job.ok[item] = 0;
      ++bad;
    }
  };
  auto in_range = [&](const StepCopy& c) {
    return c.item < job.n && c.chunk < job.num_chunks && c.rows <= job.t && c.dst_row <= job.t - c.rows &&
           c.rows <= job.chunk_steps[c.chunk] && c.src_row <= job.chunk_steps[c.chunk] - c.rows;
  };
  // The bytes a column's offset counts from, and how many there are.
  auto base = [&](std::size_t chunk) { return job.chunk_bases != nullptr ? job.chunk_bases[chunk] : job.chunk_data; };
  auto size = [&](std::size_t chunk) -> uint64_t {
    return job.chunk_bases != nullptr ? job.chunk_sizes[chunk] : job.chunk_data_size;
  };
  // A column's decoded size, or kNoScratch when it lies outside its bytes or would be over 2 GiB.
  auto raw_bytes = [&](std::size_t cell) -> uint64_t {
    const StepColumn& c = job.columns[cell];
    const uint64_t steps = job.chunk_steps[cell / job.num_fields];
    const uint64_t rb = job.row_bytes[cell % job.num_fields];
    const uint64_t have = size(cell / job.num_fields);
    const bool fits = c.offset <= have && c.stored <= have - c.offset;
    const uint64_t raw = steps * rb;
    if (!fits || (rb != 0 && raw / rb != steps) || raw > (uint64_t{1} << 31)) return kNoScratch;
    return raw;
  };
  // A chunk's columns are decompressed once, where its first copy puts them: straight into that copy's output
  // rows when it takes all of the chunk's rows (the usual case: no buffer, no second copy), else into scratch.
  std::vector<uint64_t> scratch_at(cells, kNoScratch);
  std::vector<uint8_t> seen(job.num_chunks, 0);
  uint64_t scratch_bytes = 0;
  for (std::size_t i = 0; i < job.num_copies; ++i) {
    const StepCopy& c = job.copies[i];
    if (!in_range(c) || seen[c.chunk]) continue;
    seen[c.chunk] = 1;
    if (c.src_row == 0 && c.rows == job.chunk_steps[c.chunk]) continue;
    for (std::size_t f = 0; f < job.num_fields; ++f) {
      const std::size_t cell = c.chunk * job.num_fields + f;
      const uint64_t raw = raw_bytes(cell);
      if (job.columns[cell].codec != kStepColumnLz4 || raw == kNoScratch) continue;
      scratch_at[cell] = scratch_bytes;
      scratch_bytes += raw;
    }
  }
  if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);

  // The decoded column of (chunk, field): `state` 0: not yet, 1: ready at `ready` (in chunk_data when raw, else in
  // scratch or in the output rows of the copy that decompressed it), 2: bad.
  std::vector<uint8_t> state(cells, 0);
  std::vector<const uint8_t*> ready(cells, nullptr);
  for (std::size_t i = 0; i < job.num_copies; ++i) {
    const StepCopy& c = job.copies[i];
    if (!in_range(c)) {
      fail(c.item);
      continue;
    }
    for (std::size_t f = 0; f < job.num_fields; ++f) {
      const std::size_t cell = c.chunk * job.num_fields + f;
      const uint64_t rb = job.row_bytes[f];
      uint8_t* dst = job.outs[f] + (c.item * job.t + c.dst_row) * rb;
      bool copied = false;
      if (state[cell] == 0) {
        state[cell] = 2;
        const StepColumn& col = job.columns[cell];
        const uint64_t raw = raw_bytes(cell);
        const uint8_t* src = base(c.chunk) + col.offset;
        if (raw == kNoScratch) {
          // bad: outside its bytes or too large
        } else if (col.codec == kStepColumnRaw && col.stored == raw) {
          ready[cell] = src;
          state[cell] = 1;
        } else if (col.codec == kStepColumnLz4 && col.stored <= (uint64_t{1} << 31)) {
          // Not in scratch only when this is the chunk's first copy, which takes every row: dst holds them all.
          const bool whole = c.src_row == 0 && c.rows == job.chunk_steps[c.chunk];
          uint8_t* to = scratch_at[cell] != kNoScratch ? scratch.data() + scratch_at[cell] : whole ? dst : nullptr;
          const int got = to == nullptr
                              ? -1
                              : LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(to),
                                                    static_cast<int>(col.stored), static_cast<int>(raw));
          if (got >= 0 && static_cast<uint64_t>(got) == raw) {
            ready[cell] = to;
            state[cell] = 1;
            copied = to == dst;
          }
        }
      }
      if (state[cell] != 1) {
        fail(c.item);
        break;
      }
      // memmove: a column decompressed into one item's rows is the source of the other items that share it (a
      // plan's copies never overlap in their destinations, so those rows stay as decompressed).
      if (!copied && c.rows * rb > 0) std::memmove(dst, ready[cell] + c.src_row * rb, c.rows * rb);
    }
  }
  return bad;
}

}  // namespace apexrl
