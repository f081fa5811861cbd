// A reply and the lifetime of its buffers. Replies leave without copies: each frame views a buffer the Reply
// owns (its small parts, or a SampleResult's arrays), and the Reply lives on in a Hold until libzmq has freed
// its last frame (FreeFrame), which also takes its bytes off its peer's unread count and returns the sample
// result's buffers to the SamplePool for the next SAMPLE.
#ifndef APEXRL_SERVE_REPLY_H_
#define APEXRL_SERVE_REPLY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apexrl/disk_table.h"
#include "apexrl/mutex.h"
#include "apexrl/serve/rate_limiter.h"
#include "apexrl/serve/wire.h"
#include "apexrl/sharded_store.h"
#include "apexrl/thread_annotations.h"

namespace apexrl::serve {

// What a served SAMPLE took from its table until the loop knows whether its reply went out: the rate limiter's
// count of its items and, in a table with max_times_sampled, the items it drew for the last time, which the
// store holds (ShardedStore's "Held items") rather than removes. Settled once, on the loop thread: Keep when
// libzmq took the reply (the held items are removed for good), GiveBack when it did not -- the peer left
// (EHOSTUNREACH), its queue is full (EAGAIN), the reply would take it over its unread-bytes cap, or it is over
// the reply cap -- which puts the items back at their place (the front of a queue, in order) and takes the
// count back. A lease destroyed unsettled gives back: its reply was never handed to libzmq.
class SampleLease {
 public:
  // `returned` counts the items given back (the table's items_returned). Every pointer must outlive the lease.
  SampleLease(ShardedStore* store, RateLimiter* limiter, std::atomic<uint64_t>* returned, uint64_t counted,
              std::vector<Key> drawn, std::vector<Key> held)
      : store_(store),
        limiter_(limiter),
        returned_(returned),
        counted_(counted),
        drawn_(std::move(drawn)),
        held_(std::move(held)) {}
  ~SampleLease() { GiveBack(); }
  SampleLease(const SampleLease&) = delete;
  SampleLease& operator=(const SampleLease&) = delete;

  void Keep();
  // Returns how many items came back to the store (0 when settled already, or none was held).
  uint64_t GiveBack();
  size_t held() const { return held_.size(); }
  const std::vector<Key>& held_keys() const { return held_; }
  // The held items' pops are in `disk`'s log now: a give-back logs them again there.
  void LoggedIn(DiskTable* disk) { disk_ = disk; }

 private:
  ShardedStore* const store_;
  RateLimiter* const limiter_;
  std::atomic<uint64_t>* const returned_;
  const uint64_t counted_;
  std::vector<Key> drawn_;
  std::vector<Key> held_;
  DiskTable* disk_ = nullptr;  // the log the held items' pops are in (LoggedIn): a give-back logs them again there
  bool settled_ = false;
};

// One reply's frames and the buffers they view (sent without copies).
struct Reply {
  // Where frame i's bytes are: parts[k], or one array of `sample` or `keys`.
  enum Source : uint8_t {
    kPart,
    kSampleKeys,
    kWeights,
    kProbabilities,
    kOffsets,
    kData,
    kKeys,
    kItemChunks,
    kItemChunkOffsets,
    kChunkData,
    kChunkOffsets,
    kChunkKeys
  };
  uint16_t op = 0;
  uint16_t status = kOk;
  std::vector<std::string> parts;
  std::unique_ptr<SampleResult> sample;
  std::vector<Key> keys;
  std::vector<Key> chunk_keys;  // an INSERT reply's: the keys of the chunks it stored, in request order
  std::vector<std::pair<Source, size_t>> layout;
  // An INSERT the store took: its largest item's share of a SAMPLE reply (bytes, and those of the chunks it
  // references), measured on the batch the store accepted. 0 for every other reply, a repeated insert id's
  // included: the store did not see that request.
  uint64_t max_item_bytes = 0;
  // A SAMPLE's take from its table, until the loop settles it (Send): null for every other reply.
  std::unique_ptr<SampleLease> lease;

  void Add(std::string s) {
    layout.emplace_back(kPart, parts.size());
    parts.push_back(std::move(s));
  }
  FrameView Frame(size_t i) const;
  uint64_t Bytes() const;  // of every frame
};

Reply ErrorReply(uint16_t op, uint64_t rid, uint16_t status, const std::string& message);
// INTERNAL: a change a disk table's log could not take (`why`), undone.
Reply LogRefusal(uint16_t op, uint64_t rid, const std::string& why);
Reply CountReply(uint16_t op, uint64_t rid, uint64_t count);  // UPDATE_PRIORITIES, ERASE, REMOVE_TO_FIT
Reply InsertReply(uint64_t rid, std::vector<Key> keys, std::vector<Key> chunk_keys);
Reply SampleReply(uint64_t rid, std::unique_ptr<SampleResult> s);

// Sample results whose reply libzmq has sent, kept for the next SAMPLE: their buffers are reused as they are
// (no allocation, no fresh pages for ~n x item bytes per request). Filled by libzmq's I/O thread, emptied by
// the loop and the workers; bounded in bytes.
class SamplePool {
 public:
  // What the pool may hold: enough for a learner's prefetch of DPG-sized batches, little beside the store.
  static constexpr size_t kMaxBytes = size_t{4} << 20;
  std::unique_ptr<SampleResult> Take() EXCLUDES(mu_);
  void Give(std::unique_ptr<SampleResult> r) EXCLUDES(mu_);

 private:
  static size_t Footprint(const SampleResult& r);
  Mutex mu_;
  std::vector<std::unique_ptr<SampleResult>> free_ GUARDED_BY(mu_);
  size_t bytes_ GUARDED_BY(mu_) = 0;
};

// A reply in libzmq's hands: freed (its sample result back to the pool), and its bytes taken off its peer's
// unread count, when libzmq is done with its last frame (on whichever thread libzmq calls back).
struct Hold {
  Reply reply;
  std::shared_ptr<std::atomic<int64_t>> peer;
  std::shared_ptr<std::atomic<int64_t>> total;
  std::shared_ptr<SamplePool> pool;
  int64_t bytes = 0;
  std::atomic<int> refs{0};  // frames libzmq (or the sender) has not freed yet
};

// libzmq's free callback for every frame of a Hold (`hint`); the last one deletes the Hold.
void FreeFrame(void* data, void* hint);

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_REPLY_H_
