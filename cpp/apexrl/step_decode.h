// Native decode of sampled sequence items (python/apexrl/replay/wire/steps.py documents the step chunks): copies
// the steps of each item out of its step chunks' columns into (n, T, ...) output arrays.
//
// The Python side parses the small headers (JSON) of the batch's items and chunks, checks each item (its step range
// inside its chunks, one structure), and describes the work as columns (where each chunk's field column lies in the
// batch's chunk bytes, and how it is stored) and copies (rows of one chunk into rows of one item). DecodeSteps
// decompresses each column a copy needs once (straight into the output when its chunk's first copy takes all of
// its rows; later copies read it from there), checks every copy against the column's rows and the output's, and
// copies; it touches no Python object, so the binding runs it with the GIL released.
#ifndef APEXRL_STEP_DECODE_H_
#define APEXRL_STEP_DECODE_H_

#include <cstddef>
#include <cstdint>

namespace apexrl {

inline constexpr uint8_t kStepColumnRaw = 0;
inline constexpr uint8_t kStepColumnLz4 = 1;

// One field's column in one chunk: `stored` bytes at `offset` of the chunk bytes, raw or one lz4 block that
// decompresses to steps * row_bytes bytes.
struct StepColumn {
  uint64_t offset = 0;
  uint64_t stored = 0;
  uint64_t codec = kStepColumnRaw;
};

// Rows [src_row, src_row + rows) of chunk `chunk` go to rows [dst_row, dst_row + rows) of item `item`.
struct StepCopy {
  uint64_t chunk = 0;
  uint64_t src_row = 0;
  uint64_t item = 0;
  uint64_t dst_row = 0;
  uint64_t rows = 0;
};

struct StepDecodeJob {
  const uint8_t* chunk_data = nullptr;  // the batch's chunk bytes
  std::size_t chunk_data_size = 0;
  // Or, where the chunks lie apart (a SliceTable's, read in place): per chunk its bytes and their size, a column's
  // offset then counting from its chunk's start.
  const uint8_t* const* chunk_bases = nullptr;
  const uint64_t* chunk_sizes = nullptr;
  std::size_t num_chunks = 0;
  std::size_t num_fields = 0;
  const StepColumn* columns = nullptr;    // num_chunks * num_fields, chunk-major
  const uint64_t* chunk_steps = nullptr;  // per chunk: its steps
  const uint64_t* row_bytes = nullptr;    // per field: the bytes of one step
  uint8_t* const* outs = nullptr;         // per field: n * t * row_bytes bytes, item-major
  std::size_t n = 0;                      // items
  std::size_t t = 0;                      // steps per item in the outputs
  const StepCopy* copies = nullptr;       // in any order (grouped by chunk is fastest)
  std::size_t num_copies = 0;
  uint8_t* ok = nullptr;  // per item: set to 0 when one of its copies fails (out of range, a column that does
                          // not decompress to its size); the caller sets it to 1 first
};

// Runs the job; returns how many items it marked bad. Never reads or writes outside the buffers it was given.
std::size_t DecodeSteps(const StepDecodeJob& job);

}  // namespace apexrl

#endif  // APEXRL_STEP_DECODE_H_
