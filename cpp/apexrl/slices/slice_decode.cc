#include "apexrl/slices/slice_decode.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "apexrl/step_decode.h"

namespace apexrl {

std::size_t DecodeSlices(const SliceSample& s, const uint64_t* row_bytes, uint8_t* const* outs, std::size_t window,
                         uint8_t* mask, uint8_t* ok) {
  const std::size_t n = s.rows.size();
  const std::size_t fields = static_cast<std::size_t>(s.num_fields);
  // Window i's copies: the part of each of its chunks that falls in its steps [first, first + rows) of their
  // concatenation, to the same place in its rows.
  std::vector<StepCopy> copies;
  copies.reserve(s.window_chunks.size());
  for (std::size_t i = 0; i < n; ++i) {
    const uint64_t first = s.first[i], end = first + s.rows[i];
    uint64_t start = 0;  // the concatenation's step of this chunk's first step
    for (uint64_t r = s.window_chunk_offsets[i]; r < s.window_chunk_offsets[i + 1]; ++r) {
      const uint64_t c = s.window_chunks[r], k = s.chunk_steps[c];
      const uint64_t lo = std::max(first, start), hi = std::min(end, start + k);
      if (lo < hi) copies.push_back(StepCopy{c, lo - start, i, lo - first, hi - lo});
      start += k;
    }
  }
  std::memset(ok, 1, n);
  StepDecodeJob job;
  job.chunk_bases = s.chunk_bases.data();  // read where the table holds them
  job.chunk_sizes = s.chunk_sizes.data();
  job.num_chunks = s.chunk_steps.size();
  job.num_fields = fields;
  static_assert(sizeof(StepColumn) == 3 * sizeof(uint64_t));
  job.columns = reinterpret_cast<const StepColumn*>(s.columns.data());
  job.chunk_steps = s.chunk_steps.data();
  job.row_bytes = row_bytes;
  job.outs = outs;
  job.n = n;
  job.t = window;
  job.copies = copies.data();
  job.num_copies = copies.size();
  job.ok = ok;
  const std::size_t bad = DecodeSteps(job);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t valid = ok[i] ? std::min<std::size_t>(s.rows[i], window) : 0;
    std::memset(mask + i * window, 1, valid);
    std::memset(mask + i * window + valid, 0, window - valid);
    for (std::size_t f = 0; f < fields; ++f) {
      const uint64_t rb = row_bytes[f];
      std::memset(outs[f] + (i * window + valid) * rb, 0, (window - valid) * rb);
    }
  }
  return bad;
}

}  // namespace apexrl
