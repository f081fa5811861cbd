// The check the server runs on every INSERT once the run's TransitionSpec is known: each item's size, its
// spec fingerprint and the walk over its compressed blocks' lengths (the item layout of
// python/apexrl/replay/codec.py; the lz4 payloads themselves are checked by the learner's decode).
// tests/server/test_native_protocol.py holds this to TransitionSpec.validate_items on valid and corrupted batches.
#ifndef APEXRL_SERVE_ITEM_CHECK_H_
#define APEXRL_SERVE_ITEM_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apexrl/serve/wire.h"

namespace apexrl::serve {

struct ItemLayout {
  uint32_t fingerprint = 0;
  uint64_t header_bytes = 0;                  // 4 (fingerprint) + the raw fields' bytes
  std::vector<std::string> compressed_names;  // the compressed fields, in spec order
  std::vector<bool> compressed_empty;         // whether each holds zero bytes (its block must be empty)
  std::string repr;                           // the spec's repr(), for messages
};

// The message naming the first bad item (in the rule order of TransitionSpec._item_problems: sizes of all
// items, then fingerprints, then block walks), or nothing when every item is good. offsets: n + 1 values,
// already checked to start at 0, never decrease and end at data_size.
std::optional<std::string> FirstBadItem(const ItemLayout& layout, const uint8_t* data, const uint8_t* offsets,
                                        uint64_t n);

// The message naming the first problem of a decoded INSERT's own content that the store would refuse, or
// nothing: each item's size and chunk references against the request's own chunk frames (in range, distinct,
// at most kMaxChunksPerItem per item), each chunk's size, every chunk referenced by an item, no chunks without
// items. The store's rules and messages (ShardedStore::Insert), but on the u64 values sent, so the message
// names the value sent. The loop runs it once, when the request is decoded: before the insert-id window and
// the rate limiter, so such a request is INVALID_ARGUMENT whatever the server's state (never TIMEOUT, never the
// keys of an earlier request with its insert id), and every later step may trust the references. (With it the
// loop runs the spec check, FirstBadItem, and the store's priority check, ShardedStore::CheckPriorities.)
std::optional<std::string> FirstBadInsertContent(const Request& q);

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_ITEM_CHECK_H_
