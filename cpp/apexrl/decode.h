// Native decoder of the transition codec's items (python/apexrl/replay/codec.py documents the item layout).
//
// DecodeItems checks and decodes n sampled items straight into caller-provided field buffers: the same rules,
// in the same order and with the same messages as TransitionSpec.decode, so either decoder refuses a batch
// with the same ValueError text. It touches no Python object, so the binding runs it with the GIL released,
// and several threads may decode different batches at once (a DecodeLayout is immutable).
#ifndef APEXRL_DECODE_H_
#define APEXRL_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace apexrl {

// One field of a spec, in spec order.
struct DecodeField {
  std::string name;
  std::size_t nbytes = 0;  // bytes of this field in one transition, uncompressed
  bool compress = false;   // stored as u32 length + lz4 block after the raw part
};

// What DecodeItems needs of a TransitionSpec.
struct DecodeLayout {
  uint32_t fingerprint = 0;
  std::vector<DecodeField> fields;
  std::string spec_repr;  // repr(spec), for the size error's message

  std::size_t HeaderBytes() const;  // 4 + the raw fields' bytes
  std::size_t CompressedFields() const;
};

// Decodes items [starts[i], starts[i] + sizes[i]) of buf (all inside buf: the caller checked the offsets) into
// outs[f] (one per field, in spec order; n * fields[f].nbytes bytes each, row i at i * nbytes), little-endian
// bytes as stored. Checks, for all items, each rule before the next: sizes (a negative size is "offsets
// decrease"), fingerprints, the walk over the compressed blocks' lengths; then copies and decompresses item by
// item. Returns "" on success, else the message of the first failure (outs may be partly written).
std::string DecodeItems(const DecodeLayout& layout, const uint8_t* buf, const int64_t* starts, const int64_t* sizes,
                        std::size_t n, uint8_t* const* outs);

}  // namespace apexrl

#endif  // APEXRL_DECODE_H_
