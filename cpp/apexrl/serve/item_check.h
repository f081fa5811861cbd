// The checks the server runs on every INSERT's items: their content against the request's own frames
// (FirstBadInsertContent) and, once the run's TransitionSpec is known, against its item layout (FirstBadItem of
// apexrl/item_layout.h, shared with the learner's decoder). tests/server/test_native_protocol.py holds the
// latter to TransitionSpec.validate_items on valid and corrupted batches.
#ifndef APEXRL_SERVE_ITEM_CHECK_H_
#define APEXRL_SERVE_ITEM_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apexrl/item_layout.h"
#include "apexrl/serve/wire.h"

namespace apexrl::serve {

// The spec check itself is apexrl::FirstBadItem (apexrl/item_layout.h), the learner's decoder's check too.
using apexrl::FirstBadItem;
using apexrl::ItemLayout;
using apexrl::ItemSpans;

// The message naming the first problem of a decoded INSERT's own content that the store would refuse, or
// nothing: each item's size and chunk references (each one of the request's own chunk frames or a well-formed
// chunk key, stored chunks all of one shard, distinct, at most kMaxChunksPerItem per item; whether a chunk key
// is still live is the store's check, StaleChunks), each chunk's size, every chunk referenced by an item, no chunks
// without items. The store's rules and messages (ShardedStore::Insert), but on the u64 values sent, so the message
// names the value sent. The loop runs it once, when the request is decoded: before the insert-id window and
// the rate limiter, so such a request is INVALID_ARGUMENT whatever the server's state (never TIMEOUT, never the
// keys of an earlier request with its insert id), and every later step may trust the references. (With it the
// loop runs the spec check, FirstBadItem, and the store's priority check, ShardedStore::CheckPriorities.)
std::optional<std::string> FirstBadInsertContent(const Request& q);

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_ITEM_CHECK_H_
