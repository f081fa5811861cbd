// Native decode of a SliceTable sample: each window's steps copied out of the batch's step chunks into
// (n, window, ...) output arrays, its mask written, and the padding past its steps zeroed. The sample carries each
// chunk's column places (the table keeps them from insert), so no chunk header is parsed, and reads the chunks
// where the table holds them; the copying and the decompression are DecodeSteps' (step_decode.h). Touches no Python
// object: the binding releases the GIL.
#ifndef APEXRL_SLICES_SLICE_DECODE_H_
#define APEXRL_SLICES_SLICE_DECODE_H_

#include <cstddef>
#include <cstdint>

#include "apexrl/slices/slice_table.h"

namespace apexrl {

// outs: sample.num_fields arrays of n * window * row_bytes[f] bytes, window-major; mask: n * window bytes; ok: n
// bytes. Window i's rows [0, rows[i]) get its steps and mask 1, the rest zeros and mask 0; a window whose steps
// do not fit in `window` rows or whose columns do not decode to their sizes gets ok 0 and is all zeros. Returns
// how many windows failed.
std::size_t DecodeSlices(const SliceSample& sample, const uint64_t* row_bytes, uint8_t* const* outs, std::size_t window,
                         uint8_t* mask, uint8_t* ok);

}  // namespace apexrl

#endif  // APEXRL_SLICES_SLICE_DECODE_H_
