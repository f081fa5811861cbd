// The item layout of the transition codec (python/apexrl/replay/wire/codec.py documents it) and the one check of
// a batch of items against it, shared by the server's spec check on INSERT (serve/handlers.cc) and the learner's
// native decoder (decode.h). Both get their layout from TransitionSpec.native_layout(), the one conversion.
//
// FirstBadItem checks the same three rules, in the same order and with the same messages, as
// TransitionSpec._item_problems: the sizes of all items, then their spec fingerprints, then the walk over their
// compressed blocks' lengths (the lz4 payloads themselves are checked by the decoder). It allocates nothing on
// a good batch and touches no Python object; an ItemLayout is immutable once built, so any number of threads may
// check and decode against one at once.
#ifndef APEXRL_ITEM_LAYOUT_H_
#define APEXRL_ITEM_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace apexrl {

// One field of a spec, in spec order.
struct ItemField {
  std::string name;
  std::size_t nbytes = 0;  // bytes of this field in one transition, uncompressed
  bool compress = false;   // stored as u32 length + lz4 block after the raw part
};

// What the check and the decoder need of a TransitionSpec.
struct ItemLayout {
  uint32_t fingerprint = 0;
  std::vector<ItemField> fields;
  std::string repr;  // repr(spec), for the size error's message

  std::size_t HeaderBytes() const;  // 4 (fingerprint) + the raw fields' bytes
  std::size_t CompressedFields() const;
};

// Where the n items of a batch lie in its buffer: either the wire's n + 1 little-endian u64 offsets (already
// checked to start at 0, never decrease and end inside the buffer), or the learner's n int64 starts and sizes
// (each item inside the buffer; a negative size is "offsets decrease").
class ItemSpans {
 public:
  static ItemSpans Offsets(const uint8_t* le_u64_offsets, std::size_t n) {
    return ItemSpans(n, le_u64_offsets, nullptr, nullptr);
  }
  static ItemSpans StartsAndSizes(const int64_t* starts, const int64_t* sizes, std::size_t n) {
    return ItemSpans(n, nullptr, starts, sizes);
  }
  std::size_t size() const { return n_; }
  int64_t Start(std::size_t i) const { return offsets_ ? Offset(i) : starts_[i]; }
  int64_t Size(std::size_t i) const { return offsets_ ? Offset(i + 1) - Offset(i) : sizes_[i]; }

 private:
  ItemSpans(std::size_t n, const uint8_t* offsets, const int64_t* starts, const int64_t* sizes)
      : n_(n), offsets_(offsets), starts_(starts), sizes_(sizes) {}
  int64_t Offset(std::size_t i) const {
    uint64_t v;
    std::memcpy(&v, offsets_ + 8 * i, 8);
    return static_cast<int64_t>(v);
  }
  std::size_t n_;
  const uint8_t* offsets_;
  const int64_t* starts_;
  const int64_t* sizes_;
};

// The message naming the first bad item of the batch, or nothing when every item is good.
std::optional<std::string> FirstBadItem(const ItemLayout& layout, const uint8_t* buf, const ItemSpans& items);

}  // namespace apexrl

#endif  // APEXRL_ITEM_LAYOUT_H_
