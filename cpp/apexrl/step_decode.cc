#include "apexrl/step_decode.h"

#include <cstring>
#include <vector>

#include "lz4.h"

namespace apexrl {

std::size_t DecodeSteps(const StepDecodeJob& job) {
  // The decoded column of (chunk, field), decompressed once when a copy first needs it; `state` 0: not yet,
  // 1: ready in `buffers` (or pointing into chunk_data when raw), 2: bad.
  const std::size_t cells = job.num_chunks * job.num_fields;
  std::vector<uint8_t> state(cells, 0);
  std::vector<const uint8_t*> ready(cells, nullptr);
  std::vector<std::vector<uint8_t>> buffers(cells);
  auto column = [&](std::size_t chunk, std::size_t field) -> const uint8_t* {
    const std::size_t cell = chunk * job.num_fields + field;
    if (state[cell] == 0) {
      state[cell] = 2;
      const StepColumn& c = job.columns[cell];
      const uint64_t steps = job.chunk_steps[chunk];
      const uint64_t rb = job.row_bytes[field];
      const bool fits = c.offset <= job.chunk_data_size && c.stored <= job.chunk_data_size - c.offset;
      const uint64_t raw = steps * rb;
      if (fits && (rb == 0 || raw / rb == steps) && raw <= (uint64_t{1} << 31)) {
        const uint8_t* src = job.chunk_data + c.offset;
        if (c.codec == kStepColumnRaw && c.stored == raw) {
          ready[cell] = src;
          state[cell] = 1;
        } else if (c.codec == kStepColumnLz4 && c.stored <= (uint64_t{1} << 31)) {
          buffers[cell].resize(raw);
          const int got =
              LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(buffers[cell].data()),
                                  static_cast<int>(c.stored), static_cast<int>(raw));
          if (got >= 0 && static_cast<uint64_t>(got) == raw) {
            ready[cell] = buffers[cell].data();
            state[cell] = 1;
          }
        }
      }
    }
    return state[cell] == 1 ? ready[cell] : nullptr;
  };
  std::size_t bad = 0;
  auto fail = [&](uint64_t item) {
    if (item < job.n && job.ok[item]) {
      job.ok[item] = 0;
      ++bad;
    }
  };
  for (std::size_t i = 0; i < job.num_copies; ++i) {
    const StepCopy& c = job.copies[i];
    if (c.item >= job.n) continue;
    if (c.chunk >= job.num_chunks || c.rows > job.t || c.dst_row > job.t - c.rows ||
        c.rows > job.chunk_steps[c.chunk] || c.src_row > job.chunk_steps[c.chunk] - c.rows) {
      fail(c.item);
      continue;
    }
    for (std::size_t f = 0; f < job.num_fields; ++f) {
      const uint8_t* src = column(c.chunk, f);
      if (src == nullptr) {
        fail(c.item);
        break;
      }
      const uint64_t rb = job.row_bytes[f];
      if (c.rows * rb > 0) {
        std::memcpy(job.outs[f] + (c.item * job.t + c.dst_row) * rb, src + c.src_row * rb, c.rows * rb);
      }
    }
  }
  return bad;
}

}  // namespace apexrl
