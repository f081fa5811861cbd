#include "apexrl/serve/handlers.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <utility>

#include "apexrl/errors.h"

namespace apexrl::serve {

namespace {

std::string HexId(uint64_t v) {  // Python's f"{v:#x}"
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// An aligned copy of a wire array (frames may start at any byte).
template <typename T>
std::vector<T> Aligned(const uint8_t* p, size_t n) {
  std::vector<T> v(n);
  if (n != 0) std::memcpy(v.data(), p, n * sizeof(T));
  return v;
}

}  // namespace

Handlers::Handlers(ShardedStore* store, RateLimiter* limiter, InsertWindow* window, SamplePool* pool, double max_wait_s,
                   LogFn log, DiskTable* disk, SliceTable* slices)
    : store_(store),
      limiter_(limiter),
      disk_(disk),
      slices_(slices),
      window_(window),
      pool_(pool),
      max_wait_s_(max_wait_s),
      log_(std::move(log)) {}

std::optional<std::string> Handlers::InsertContentProblem(const Request& q, const ItemLayout* layout,
                                                          bool* spec_refused) {
  *spec_refused = false;
  std::optional<std::string> why = FirstBadInsertContent(q);
  if (slices_ != nullptr) return why ? why : EpisodeProblem(q);
  if (!why) {  // masses above the store's limit (the decoder checked finite and >= 0)
    priority_scratch_.resize(q.count);
    if (q.count != 0) std::memcpy(priority_scratch_.data(), q.priorities, q.count * sizeof(double));
    try {
      store_->CheckPriorities(priority_scratch_.data(), q.count);
    } catch (const InvalidArgument& e) {
      why = e.what();
    }
  }
  if (!why && disk_ != nullptr && (q.num_chunks > 0 || q.num_refs > 0)) {
    why =
        "this table is stored on disk (storage=\"disk\"), which keeps items without chunks; trajectories and "
        "frame chunks need a memory table";
  }
  if (!why && layout && (why = FirstBadItem(*layout, q.data, ItemSpans::Offsets(q.offsets, q.count))))
    *spec_refused = true;
  return why;
}

double Handlers::MaxPriority() const {
  const double m = max_priority_.load(std::memory_order_acquire);
  return m < 0.0 ? 1.0 : m;
}

void Handlers::NoteMaxPriority(const double* priorities, uint64_t n) {
  if (n == 0) return;
  const double largest = *std::max_element(priorities, priorities + n);
  double seen = max_priority_.load(std::memory_order_relaxed);
  while (largest > seen && !max_priority_.compare_exchange_weak(seen, largest, std::memory_order_acq_rel)) {
  }
}

bool Handlers::Serve(Call* c, double now, Reply* reply) {
  const Request& q = c->req;
  const bool can_wait = q.timeout_ms > 0 && now < c->t_arrival + q.timeout_ms / 1000.0;
  try {
    if (slices_ != nullptr && q.op != kInsert) return ServeSlices(c, can_wait, reply);
    switch (q.op) {
      case kInsert:
        return ServeInsert(c, now, can_wait, reply);
      case kSample:
        return ServeSample(c, can_wait, reply);
      case kUpdatePriorities: {
        const auto keys = Aligned<Key>(q.keys, q.count);
        const auto priorities = Aligned<double>(q.priorities, q.count);
        if (disk_ != nullptr) disk_->LogUpdates(keys.data(), priorities.data(), q.count);
        *reply = CountReply(q.op, q.request_id, store_->UpdatePriorities(keys.data(), priorities.data(), q.count));
        NoteMaxPriority(priorities.data(), q.count);
        return true;
      }
      case kRemoveToFit:
        *reply = CountReply(q.op, q.request_id, store_->RemoveToFit());
        if (disk_ != nullptr) disk_->LogRemovals();
        return true;
      case kErase: {
        const auto keys = Aligned<Key>(q.keys, q.count);
        if (disk_ != nullptr) disk_->LogErases(keys.data(), q.count);
        const size_t n = store_->Erase(keys.data(), q.count);
        erased_items_.fetch_add(n, std::memory_order_relaxed);
        *reply = CountReply(q.op, q.request_id, n);
        return true;
      }
      case kReset: {
        // Items first, then the counts: an INSERT admitted between the two is not possible (both on the loop
        // thread), a worker's SAMPLE may see the emptied store and wait or time out like any on an empty table.
        if (disk_ != nullptr) disk_->LogClear();
        const size_t n = store_->Clear();
        if (disk_ != nullptr) disk_->DropRemovals();  // the CLEAR record covers them
        limiter_->Reset();
        max_priority_.store(-1.0, std::memory_order_release);
        resets_.fetch_add(1, std::memory_order_relaxed);
        *reply = CountReply(q.op, q.request_id, n);
        return true;
      }
      default:
        throw std::logic_error(std::string("op ") + std::to_string(q.op) + " reached the data path");
    }
  } catch (const StaleChunks& e) {  // stored chunks the INSERT references are gone: the sender sends them again
    *reply = ErrorReply(q.op, q.request_id, kStaleChunks, std::string("INSERT refused, nothing stored: ") + e.what());
    return true;
  } catch (const IoError& e) {  // a disk table's log could not take the change: undone, nothing changed
    *reply = LogRefusal(q.op, q.request_id, e.what());
    return true;
  } catch (const InvalidArgument& e) {  // the store rejected the values
    *reply = ErrorReply(q.op, q.request_id, kInvalidArgument, e.what());
    return true;
  } catch (const std::exception& e) {  // the server must keep serving
    log_("ERROR", std::string("internal error serving ") + OpName(q.op) + " request " + std::to_string(q.request_id) +
                      ": " + e.what());
    *reply = ErrorReply(q.op, q.request_id, kInternal, std::string("internal error: ") + e.what());
    return true;
  }
}

bool Handlers::ServeSample(Call* c, bool can_wait, Reply* reply) {
  const Request& q = c->req;
  // A batch the loop's thread drew from a disk table and left for a worker to read (Call::drawn), or a new one.
  std::unique_ptr<SampleResult> result = std::move(c->drawn);
  const bool drawn_here = result == nullptr;
  // Another worker can empty the store between the size check and the sample (an ERASE, a REMOVE_TO_FIT):
  // then this request is one that found the store too small, not a bad one. need() >= 1, so an empty store
  // always leaves through the first branch.
  while (drawn_here) {
    if (!limiter_->BigEnough(store_->Size())) {
      if (can_wait) return false;
      *reply = ErrorReply(q.op, q.request_id, kTimeout,
                          "store holds " + std::to_string(store_->Size()) +
                              " items, fewer than min_size_to_sample=" + std::to_string(limiter_->need()) +
                              ", after waiting " + std::to_string(q.timeout_ms) + " ms");
      return true;
    }
    if (!limiter_->TrySample(q.count, store_->Size())) {
      if (!limiter_->BigEnough(store_->Size()) && can_wait) return false;  // shrank meanwhile
      return RateLimited(c, can_wait, reply);
    }
    if (!result) result = pool_->Take();
    try {
      store_->Sample(q.count, q.beta, result.get(), /*hold=*/true);
      break;
    } catch (const EmptyStore&) {
      limiter_->Undo(0, q.count);
    } catch (...) {
      limiter_->Undo(0, q.count);
      GiveBackHeld(*result);
      throw;
    }
  }
  // A sampler that hands items out at most so often (FIFO, a queue) may return fewer: the limiter counts what
  // was handed out.
  if (drawn_here && result->keys.size() < q.count) limiter_->Undo(0, q.count - result->keys.size());
  if (disk_ != nullptr) {  // its store holds where the items' bytes lie
    try {
      if (!c->cached_only) {
        disk_->ReadItems(result.get());
      } else if (!disk_->ReadCached(result.get())) {
        c->drawn = std::move(result);  // not all in the cache: a worker reads them, from the files too
        return false;
      }
    } catch (...) {
      limiter_->Undo(0, result->keys.size());
      GiveBackHeld(*result);
      throw;
    }
  }
  // Until the loop knows whether the reply went out (SampleLease): the limiter's count and, with
  // max_times_sampled, the items drawn for the last time (held by the store) and the batch's keys, whose draws
  // a reply that is not sent takes back.
  // A disk table's pops (the held items) are logged by the loop before the reply leaves (ServeLoop::LogPops):
  // this may be a worker, and the loop's thread alone writes the log.
  const uint64_t counted = result->keys.size();
  std::vector<Key> drawn, held;
  if (store_->config().max_times_sampled > 0) {
    drawn = result->keys;
    held.swap(result->held);
  }
  *reply = SampleReply(q.request_id, std::move(result));
  reply->lease =
      std::make_unique<SampleLease>(store_, limiter_, &items_returned_, counted, std::move(drawn), std::move(held));
  return true;
}

void Handlers::GiveBackHeld(const SampleResult& result) {
  // Items the failed call had drawn for the last time go back (each counted once: no reply names them).
  const std::vector<Key>& held = result.held;
  if (!held.empty()) store_->GiveBack(held.data(), held.size(), held.data(), held.size());
}

bool Handlers::RateLimited(Call* c, bool can_wait, Reply* reply) {
  const Request& q = c->req;
  if (can_wait) {
    if (!c->waited) limiter_->CountWait(q.op);
    c->waited = true;
    return false;
  }
  const std::string until = limiter_->kind() == LimiterKind::kQueue
                                ? (q.op == kInsert ? "the queue has room" : "the queue holds an item")
                                : (q.op == kInsert ? "the samplers are caught up" : "the inserters are caught up");
  *reply = ErrorReply(q.op, q.request_id, kTimeout,
                      std::string("rate limited: ") + OpName(q.op) + " of " + std::to_string(q.count) +
                          " items must wait until " + until + " (" + limiter_->Describe() + "), after waiting " +
                          std::to_string(q.timeout_ms) + " ms");
  return true;
}

bool Handlers::ServeInsert(Call* c, double now, bool can_wait, Reply* reply) {
  const Request& q = c->req;
  const InsertId id{c->identity, q.insert_session, q.insert_sequence};
  const bool has_id = q.insert_session != 0 || q.insert_sequence != 0;
  if (has_id) {
    std::vector<Key> keys;
    const double deadline = c->t_arrival + std::min(q.timeout_ms / 1000.0, max_wait_s_);
    switch (window_->TryClaim(id, c->serial, deadline, now, &keys)) {
      case InsertWindow::Claim::kDone: {  // answered with the keys of the request that stored it
        // The window holds the item keys, the chunk keys, then the number of items (see below).
        std::vector<Key> chunk_keys;
        if (!keys.empty()) {
          const size_t n = std::min<size_t>(keys.back(), keys.size() - 1);
          keys.pop_back();
          chunk_keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(n), keys.end());
          keys.resize(n);
        }
        *reply = InsertReply(q.request_id, std::move(keys), std::move(chunk_keys));
        return true;
      }
      case InsertWindow::Claim::kBusy:  // its first request waits: answer this one after it
        c->behind_id = true;
        if (can_wait) return false;
        *reply =
            ErrorReply(q.op, q.request_id, kTimeout,
                       "INSERT " + HexId(q.insert_session) + "/" + std::to_string(q.insert_sequence) +
                           ": a request with this insert_id is still waiting to be served; retry with the same id");
        return true;
      case InsertWindow::Claim::kNew:
        c->behind_id = false;
        break;
    }
  }
  bool keep_id = false;  // this request still owns its insert_id: stored, or waiting
  struct ReleaseUnlessKept {
    InsertWindow& window;
    const InsertId& id;
    uint64_t owner;
    bool active;
    bool& keep;
    ~ReleaseUnlessKept() {
      if (active && !keep) window.Release(id, owner);
    }
  } guard{*window_, id, c->serial, has_id, keep_id};

  // The request's content was checked when it was decoded (InsertContentProblem).
  // A queue's bound counts the items held for SAMPLE replies not yet sent (Handlers::ServeSample): given back,
  // they must fit.
  const uint64_t size = slices_ != nullptr ? slices_->NumWindows() : store_->Size();
  if (!limiter_->TryInsert(q.count, limiter_->InsertSize(size, slices_ != nullptr ? 0 : store_->Held()))) {
    const bool replied = RateLimited(c, can_wait, reply);
    keep_id = !replied;
    return replied;
  }
  if (slices_ != nullptr) {       // one episode (EpisodeProblem checked it): its number is the item's key
    std::vector<Key> keys(2, 1);  // the window keeps the key, no chunk key, then the number of items (1)
    uint64_t window_bytes = 0;
    try {
      keys[0] = StoreEpisode(q, &window_bytes);
    } catch (...) {
      limiter_->Undo(q.count, 0);
      throw;
    }
    keep_id = true;
    if (has_id) window_->Finish(id, c->serial, keys.data(), keys.size());
    keys.resize(1);
    *reply = InsertReply(q.request_id, std::move(keys), {});
    reply->max_item_bytes = window_bytes;
    return true;
  }
  // kFlagMaxPriority: every item gets the largest priority so far, read once for the batch (an INSERT is served
  // on the loop thread, so inserts into this table are ordered; a concurrent UPDATE may raise it just after).
  const auto priorities =
      q.max_priority ? std::vector<double>(q.count, MaxPriority()) : Aligned<double>(q.priorities, q.count);
  item_ptrs_.resize(q.count);
  item_sizes_.resize(q.count);
  for (uint64_t i = 0; i < q.count; ++i) {
    const uint64_t at = LoadU64(q.offsets, i);
    item_ptrs_[i] = q.data + at;
    item_sizes_[i] = LoadU64(q.offsets, i + 1) - at;
  }
  // Frame chunks, when the request has any (references checked against them when it was decoded).
  ChunkBatch chunks;
  const bool with_chunks = q.num_chunks > 0 || q.num_refs > 0;
  if (with_chunks) {
    chunk_ptrs_.resize(q.num_chunks);
    chunk_sizes_.resize(q.num_chunks);
    for (uint64_t k = 0; k < q.num_chunks; ++k) {
      const uint64_t at = LoadU64(q.chunk_offsets, k);
      chunk_ptrs_[k] = q.chunk_data + at;
      chunk_sizes_[k] = LoadU64(q.chunk_offsets, k + 1) - at;
    }
    chunk_refs_.resize(q.num_refs);
    for (uint64_t j = 0; j < q.num_refs; ++j) {
      chunk_refs_[j] = LoadU64(q.item_chunks, j);  // a request index or a stored chunk key
    }
    chunk_ref_offsets_ = Aligned<uint64_t>(q.item_chunk_offsets, q.count + 1);
    chunks.data = chunk_ptrs_.data();
    chunks.sizes = chunk_sizes_.data();
    chunks.count = q.num_chunks;
    chunks.item_chunks = chunk_refs_.data();
    chunks.item_chunk_offsets = chunk_ref_offsets_.data();
  }
  // The items' keys, then the chunks', then the number of items: what the insert-id window keeps, so that a retry
  // (which may carry other frames) is answered with both.
  std::vector<Key> keys(q.count + q.num_chunks + 1);
  keys.back() = q.count;
  chunks.chunk_keys = keys.data() + q.count;
  try {
    if (disk_ != nullptr) {  // stored and logged, or neither (it refuses chunks: InsertContentProblem)
      disk_->Insert(priorities.data(), item_ptrs_.data(), item_sizes_.data(), q.count, keys.data());
    } else {
      store_->Insert(priorities.data(), item_ptrs_.data(), item_sizes_.data(), q.count, keys.data(),
                     with_chunks ? &chunks : nullptr);
    }
  } catch (...) {
    limiter_->Undo(q.count, 0);
    throw;
  }
  keep_id = true;
  if (!q.max_priority) NoteMaxPriority(priorities.data(), q.count);
  if (has_id) window_->Finish(id, c->serial, keys.data(), keys.size());
  // An item's share of a SAMPLE reply: its bytes, and at most every chunk it references (8 bytes of reference
  // and of chunk offset each) when no other draw of the batch brought them. A chunk stored by an earlier request
  // counts as the request's largest chunk (a trajectory writer's chunks are of one size, give or take).
  uint64_t largest = 0, largest_chunk = 0;
  for (uint64_t k = 0; k < q.num_chunks; ++k) largest_chunk = std::max(largest_chunk, chunk_sizes_[k]);
  for (uint64_t i = 0; i < q.count; ++i) {
    uint64_t bytes = item_sizes_[i];
    if (with_chunks) {
      for (uint64_t j = chunk_ref_offsets_[i]; j < chunk_ref_offsets_[i + 1]; ++j) {
        bytes += (chunk_refs_[j] < q.num_chunks ? chunk_sizes_[chunk_refs_[j]] : largest_chunk) + 16;
      }
    }
    largest = std::max(largest, bytes);
  }
  std::vector<Key> chunk_keys(keys.begin() + static_cast<std::ptrdiff_t>(q.count), keys.end() - 1);
  keys.resize(q.count);
  *reply = InsertReply(q.request_id, std::move(keys), std::move(chunk_keys));
  reply->max_item_bytes = largest;
  return true;
}

}  // namespace apexrl::serve
