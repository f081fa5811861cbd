// Native decoder of the transition codec's items (python/apexrl/replay/wire/codec.py documents the item layout).
//
// DecodeItems checks (FirstBadItem of item_layout.h, the server's check too) and decodes n sampled items straight
// into caller-provided field buffers: the same rules, in the same order and with the same messages as
// TransitionSpec.decode, so either decoder refuses a batch with the same ValueError text. It touches no Python object,
// so the binding runs it with the GIL released, and several threads may decode different batches at once (an ItemLayout
// is immutable).
#ifndef APEXRL_DECODE_H_
#define APEXRL_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "apexrl/item_layout.h"

namespace apexrl {

// Decodes items [starts[i], starts[i] + sizes[i]) of buf (all inside buf: the caller checked the offsets) into
// outs[f] (one per field, in spec order; n * fields[f].nbytes bytes each, row i at i * nbytes), little-endian
// bytes as stored. Checks them with FirstBadItem; then copies and decompresses item by
// item. Returns "" on success, else the message of the first failure (outs may be partly written).
std::string DecodeItems(const ItemLayout& layout, const uint8_t* buf, const int64_t* starts, const int64_t* sizes,
                        std::size_t n, uint8_t* const* outs);

}  // namespace apexrl

#endif  // APEXRL_DECODE_H_
