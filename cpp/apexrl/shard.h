// Shard: one lock's worth of the store -- slots, payloads, a sum tree (prioritized sampling only), an eviction
// policy and, for an ordered sampler, its sampling order.
#ifndef APEXRL_SHARD_H_
#define APEXRL_SHARD_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apexrl/aligned_vector.h"
#include "apexrl/byte_buffer.h"
#include "apexrl/common.h"
#include "apexrl/eviction/policy.h"
#include "apexrl/mutex.h"
#include "apexrl/payload_arena.h"
#include "apexrl/random.h"
#include "apexrl/sampling/kinds.h"
#include "apexrl/spin_mutex.h"
#include "apexrl/sum_tree.h"
#include "apexrl/thread_annotations.h"

namespace apexrl {

class SnapshotReader;
class SnapshotWriter;

// An item to insert, validated by the caller; the shard copies its bytes into its own arena.
struct PreparedItem {
  const uint8_t* data;  // the caller's bytes, read during Insert only
  uint32_t size;
  double priority;  // validated: finite, >= 0
  double mass;      // priority^alpha, finite
  // The chunks this item references, distinct, at most kMaxChunksPerItem, in the item's own order (a sample
  // returns them in this order): a value below the call's chunk count m is an index into the call's chunks,
  // any other is the chunk key of a chunk stored earlier in this shard (the caller checked its shard bits).
  const uint64_t* chunks = nullptr;
  uint32_t num_chunks = 0;
};

// An item a disk table's log holds (disk_table.h), put back into an empty shard with its key and insertion number.
struct RestoredItem {
  Key key;
  uint64_t seq;
  double priority;
  const uint8_t* data;
  uint32_t size;
};

// A chunk to insert beside the items of one Insert call (validated by the caller: every chunk is referenced
// by at least one of the call's items). The shard copies its bytes.
struct PreparedChunk {
  const uint8_t* data;
  uint32_t size;
};

// Where Sample() writes its draws: position i of each array is draw i of the whole batch.
struct SampleSink {
  Key* keys;
  double* masses;         // the sampled items' priority^alpha (for IS weights)
  double* probabilities;  // P(item) for one draw
  ByteBuffer* data;       // item bytes appended in draw order
  uint64_t* offsets;      // offsets[i] = where item i starts in data; the caller writes the final end offset
  // The chunks the draws reference, each once per shard visited (a sample pass visits a shard once, so once
  // per batch): draw i's chunks are item_chunks[item_chunk_offsets[i] .. item_chunk_offsets[i + 1]), indices
  // into the batch's chunks, chunk c's bytes chunk_data[chunk_offsets[c] .. chunk_offsets[c + 1]).
  // The caller writes the final end offsets.
  uint64_t* item_chunk_offsets;
  std::vector<uint64_t>* item_chunks;
  ByteBuffer* chunk_data;
  std::vector<uint64_t>* chunk_offsets;  // starts, appended
  // max_times_sampled: where the keys of the items drawn for the last time go when the call holds them (see
  // Shard's "Held items"); null: they are removed before the call returns.
  std::vector<Key>* held = nullptr;
};

struct ShardCounters {
  uint64_t inserted = 0;
  uint64_t sampled = 0;
  uint64_t updated = 0;
  uint64_t stale_updates = 0;
  uint64_t evicted = 0;
  uint64_t erased = 0;
  uint64_t removed_by_sampling = 0;  // items removed after their max_times_sampled-th draw
};

// Everything under one mutex. Thread-safe: every public method takes the shard's lock itself, and no method
// takes any other lock while holding it (the ShardedStore never holds two shard locks at once, so there is
// no lock order to get wrong). Item bytes live in the shard's PayloadArena, so they are copied in under the
// lock (a memcpy into a recycled block; see payload_arena.h for why not malloc outside the lock).
//
// Soft capacity lives in the ShardedStore; a shard grows as needed. Slots freed by removal are reused
// (LIFO); each reuse gives the slot a new tag (the shard's epoch, next generation) so old keys turn stale
// (see common.h).
//
// The lock-free accessors (size(), total(), ...) read values published at the end of each locked operation:
// exact when the shard is quiet, a recent value under concurrency.
//
// Sampling (sampling/kinds.h): only a kPrioritized shard keeps the sum tree (a shard of another sampler makes no
// tree update on insert, update or removal, and its total() is 0); an ordered sampler's shard keeps its order in
// a second ordered policy object beside the eviction policy. With max_times_sampled k > 0 every item counts its
// draws and is removed (like an erase, counted in removed_by_sampling) under the lock of the sample call that
// drew it the k-th time; a draw that would exceed an item's allowance (only possible within one call of a
// with-replacement sampler) is dropped, so the call writes fewer draws than asked (see `written`).
//
// Held items (a sink with `held`, the serving loop's SAMPLEs): an item drawn for the last time is not removed but
// held -- out of the shard's view (size(), sampling, eviction, Update and Erase treat its key as stale) while its
// slot, tag, insertion number, priority, bytes, chunk references and draw count stay as they were -- until its
// batch is settled: Release removes it for good (its reply was sent), GiveBack puts it back exactly as it was
// (its reply was not), at its place in the sampling and eviction orders (by insertion number, so the front of
// a FIFO), with the draws of that batch taken back. A snapshot saves a held item as an item not yet drawn for
// the last time (its delivery is undecided: at least once). held() counts them; bytes() includes their bytes.
class Shard {
 public:
  static constexpr uint32_t kNotLive = 0xFFFFFFFFu;
  static constexpr uint32_t kHeld = 0x80000000u;  // live_pos flag of a held item (slots < 2^28)
  // Evictions hold the lock for at most this many removals at a time.
  static constexpr size_t kEvictChunk = 256;

  // `target_slots`: the slots this shard expects to need at the store's capacity. Arrays double up to it and
  // then grow by a quarter, so a store at its soft capacity does not carry 2x slack of per-slot metadata.
  // `policy` (not null; std::invalid_argument otherwise) orders this shard's evictions; the shard owns it.
  // `epoch` (1..kMaxEpoch) goes into the tag of every key this shard issues. `sampler` and `max_times_sampled`
  // (0: no limit) as in StoreConfig.
  Shard(uint32_t index, double alpha, std::unique_ptr<EvictionPolicy> policy, size_t target_slots, uint32_t epoch = 1,
        SamplerKind sampler = SamplerKind::kPrioritized, uint32_t max_times_sampled = 0);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // New payload slabs come from `reserve` first (the store's; it must outlive this shard's inserts and loads).
  void UseSlabReserve(SlabReserve* reserve) EXCLUDES(mu_);

  // Copies the items (and the `m` chunks they reference) in and writes their keys, and the new chunks' chunk
  // keys to `chunk_keys` (m of them; may be null). If `block` is false and the lock is held by another thread,
  // returns false and changes nothing (the caller tries another shard). `seq_counter` issues the store-wide
  // insertion numbers, taken under this shard's lock so they increase along the shard's FIFO list. A chunk lives
  // while any item referencing it lives (a reference count). Throws StaleChunks, changing nothing, if an item
  // references a stored chunk that is gone (every key listed once).
  bool Insert(const PreparedItem* items, size_t n, std::atomic<uint64_t>* seq_counter, Key* keys, bool block,
              const PreparedChunk* chunks = nullptr, size_t m = 0, Key* chunk_keys = nullptr) EXCLUDES(mu_);

  // Draws k items: draw i lands on the item where the prefix sum of masses passes fractions[i] * total.
  // `share` is the probability that one draw of the whole store came to this shard. Writes draws
  // [first, first + k) of `sink`. Returns false, writing nothing, if the shard has no mass now. `used_total`
  // (optional) receives the shard's total the draws were scaled to (read under the lock). `written`
  // (optional): how many draws were written, k unless max_times_sampled dropped some (see above). A kPrioritized
  // shard only.
  bool Sample(const double* fractions, size_t k, double share, const SampleSink& sink, size_t first,
              double* used_total = nullptr, size_t* written = nullptr) EXCLUDES(mu_);
  // k uniform draws among this shard's items (a uniform sampler, or the prioritized store's fallback when every
  // mass is 0); `share`, `written` as above.
  bool SampleUniform(size_t k, Rng& rng, double share, const SampleSink& sink, size_t first, size_t* written = nullptr)
      EXCLUDES(mu_);
  // An ordered sampler's shard: writes its first items in sampling order within `quota` (at most quota.count,
  // ranks at most quota.max_rank; see EvictionQuota), distinct, from position `first` of `sink`, appends
  // their ranks to `ranks`, and returns how many it wrote.
  size_t SampleOrdered(const EvictionQuota& quota, const SampleSink& sink, size_t first, std::vector<uint64_t>* ranks)
      EXCLUDES(mu_);
  // An ordered sampler's shard: like Summarize, for the sampling order.
  void SummarizeOrder(size_t max_ranks, EvictionSummary* out) const EXCLUDES(mu_);

  // Sets new priorities; keys whose item is gone are skipped and counted as stale. Returns how many updated.
  size_t Update(const Key* keys, const double* priorities, const double* masses, size_t n) EXCLUDES(mu_);
  // Removes the items of still-valid keys; returns how many.
  size_t Erase(const Key* keys, size_t n) EXCLUDES(mu_);
  // Removes every live item, counted as erased; returns how many. One lock hold. Held items stay held: their
  // batch settles them as usual (Release: delivered; GiveBack: back in the shard), so every item is either
  // delivered or erased, never lost between the two.
  size_t Clear() EXCLUDES(mu_);

  // Eviction, whatever the policy (see eviction/planner.h for how the store drives these two).
  // Overwrites `out` with this shard's item count and its policy's summary, listing at most `max_ranks`
  // ranks. One lock hold, O(max_ranks).
  void Summarize(size_t max_ranks, EvictionSummary* out) const EXCLUDES(mu_);
  // Removes the policy's next victims within `quota` (see EvictionQuota), fewer if the shard runs out or the
  // policy allows no more; returns how many. Holds the lock for at most kEvictChunk removals at a time, so
  // samplers and inserters get in between. Draws from `rng` if the policy does.
  size_t Evict(const EvictionQuota& quota, Rng& rng) EXCLUDES(mu_);

  size_t size() const { return size_.load(std::memory_order_relaxed); }
  double total() const { return total_.load(std::memory_order_relaxed); }
  double min_positive() const { return min_positive_.load(std::memory_order_relaxed); }
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }  // items' and chunks' bytes
  size_t chunks() const { return chunks_.load(std::memory_order_relaxed); }
  uint64_t chunk_bytes() const { return chunk_bytes_.load(std::memory_order_relaxed); }
  uint64_t reserved_bytes() const { return reserved_.load(std::memory_order_relaxed); }
  ShardCounters counters() const EXCLUDES(mu_);
  // Takes back k draws from the `sampled` counter: the store discarded a batch pass they were part of.
  void UncountSampled(size_t k) EXCLUDES(mu_);
  // Held items (see above), by the keys the sample wrote to `held` (keys of this shard; others are ignored).
  // Release: removes them for good (counted in removed_by_sampling). GiveBack: puts them back; `drawn` (the
  // batch's keys of this shard, repeats included) have their draw counts taken back, a held item's once per
  // draw, a live item's too (not below 0). Returns how many held items came back.
  void Release(const Key* held, size_t n) EXCLUDES(mu_);
  size_t GiveBack(const Key* held, size_t n_held, const Key* drawn, size_t n_drawn) EXCLUDES(mu_);
  size_t held() const { return held_size_.load(std::memory_order_relaxed); }
  uint64_t max_seq() const EXCLUDES(mu_);  // largest insertion number ever stored here (0 if none)

  // Throws std::logic_error describing the first broken invariant (tests and debugging).
  void Validate() const EXCLUDES(mu_);

  // Disk tables (disk_table.h). Every item removal but a held item's Release (erase, clear, eviction, a removal
  // after the last draw) appends its key to `sink` from then on (null: none); the caller reads it between calls.
  void ReportRemovals(std::vector<Key>* sink) EXCLUDES(mu_);
  // Fills an empty shard with `items` (each of this shard, slots distinct, insertion numbers increasing): each
  // keeps its key, so the keys a disk table acknowledged stay valid across restarts. InvalidArgument otherwise.
  void Restore(const RestoredItem* items, size_t n) EXCLUDES(mu_);
  // A live item's insertion number, priority and bytes (false for a key that addresses no live item).
  bool Peek(Key key, uint64_t* seq, double* priority, std::string* data) const EXCLUDES(mu_);
  // Calls f(bytes, size) for every item, held ones included, under the lock (f must not call into the shard).
  template <typename F>
  void ForEachItem(F&& f) const EXCLUDES(mu_) {
    ScopedLock lock(mu_);
    for (Slot s : live_) f(static_cast<const uint8_t*>(refs_[s].data), refs_[s].size);
    for (Slot s : held_) f(static_cast<const uint8_t*>(refs_[s].data), refs_[s].size);
  }

  // What a snapshot of this shard holds, copied under the lock: its stored chunks (ids ascending) and its live
  // items, oldest first, each with its key and the ids of the chunks it references. A restored store hands
  // these to readers of its snapshot (apexrl export), so that the format has one reader: Read.
  struct Contents {
    std::vector<uint32_t> chunk_ids;
    std::vector<std::string> chunks;
    std::vector<Key> keys;
    std::vector<uint64_t> seqs;
    std::vector<double> priorities;
    std::vector<std::string> items;
    std::vector<std::vector<uint32_t>> item_chunk_ids;
  };
  Contents Dump() const EXCLUDES(mu_);

  // Snapshot of this shard, captured at one instant: Serialize copies the shard's block into `out` under
  // the lock (a memcpy per item, no I/O), Write serializes and then writes the block with the lock released.
  void Serialize(ByteBuffer* out) const EXCLUDES(mu_);
  void Write(SnapshotWriter& out) const EXCLUDES(mu_);
  // Fills an empty shard from a snapshot of format `version` (2: no chunks; 3: chunks; 4: times sampled and
  // removed_by_sampling; 5: chunk tags; structure checked, the caller verifies the checksum at the end).
  void Read(SnapshotReader& in, uint32_t version) EXCLUDES(mu_);

 private:
  // Everything per slot but the tree leaf and the FIFO links, in one 32-byte record (two per cache line), so a
  // sampled draw or a priority update costs one miss here rather than one per array.
  struct SlotRef {
    uint8_t* data = nullptr;
    uint32_t size = 0;
    Tag tag = 0;  // of the slot's current item, or of its last one while free (0: never issued)
    double priority = 0.0;
    uint32_t live_pos = kNotLive;  // index in live_, kHeld | index in held_, or kNotLive
    // Chunks the item references; their ids follow the item's bytes in its block (ChunkIds()).
    uint32_t num_chunks = 0;
  };
  // One stored chunk; free while refs == 0 (data null). Its tag works as a slot's (common.h): a reused id gets
  // the next tag, so the chunk keys of an earlier chunk with that id turn stale.
  struct ChunkRef {
    uint8_t* data = nullptr;
    uint32_t size = 0;
    uint32_t refs = 0;  // live items referencing it
    Tag tag = 0;        // of the chunk, or of the id's last chunk while free (0: never issued)
  };
  // An item's block: its bytes, then (when it references chunks) its chunk ids, 4-byte aligned.
  static uint32_t ItemBlockSize(uint32_t size, uint32_t num_chunks) {
    return num_chunks == 0 ? size : ((size + 3u) & ~3u) + 4u * num_chunks;
  }
  static uint32_t* ChunkIds(const SlotRef& r) { return reinterpret_cast<uint32_t*>(r.data + ((r.size + 3u) & ~3u)); }

  bool Live(Slot slot, Tag tag) const REQUIRES(mu_);
  // A free slot whose next tag would pass kMaxGeneration in this epoch: never reused in this life.
  bool Retired(const SlotRef& r) const { return TagEpoch(r.tag) == epoch_ && TagGeneration(r.tag) == kMaxGeneration; }
  void EnsureSlots(size_t extra) REQUIRES(mu_);
  Slot TakeSlot() REQUIRES(mu_);
  // Unlinks a live slot everywhere, frees it (or retires it), and returns its bytes to the arena. Its tree leaf
  // is zeroed by the FinishRemovals() the caller must make before releasing the lock.
  void Remove(Slot slot) REQUIRES(mu_);
  // Remove's two halves: out of the live list, the orders and (by FinishRemovals) the tree; then the slot
  // freed with its bytes and chunk references. A held item is unlinked, not freed.
  void Unlink(Slot slot) REQUIRES(mu_);
  void Free(Slot slot) REQUIRES(mu_);
  bool IsHeld(const SlotRef& r) const { return r.live_pos != kNotLive && (r.live_pos & kHeld) != 0; }
  void Unhold(Slot slot) REQUIRES(mu_);          // out of held_ (the slot's live_pos is then the caller's to set)
  void ReleaseChunk(uint32_t id) REQUIRES(mu_);  // one reference fewer; frees the chunk at zero
  // Whether a chunk key (of this shard) addresses a stored chunk.
  bool ChunkLive(Key chunk_key) const REQUIRES(mu_);
  // A free chunk id whose next tag would pass kMaxGeneration in this epoch: never reused in this life.
  bool ChunkRetired(const ChunkRef& c) const {
    return TagEpoch(c.tag) == epoch_ && TagGeneration(c.tag) == kMaxGeneration;
  }
  uint32_t TakeChunkId() REQUIRES(mu_);
  void EnsureChunks(size_t extra) REQUIRES(mu_);
  void FinishRemovals() REQUIRES(mu_);
  // max_times_sampled: counts the draws slots[0..k) of one call, keeps those within their item's allowance
  // (compacted, in order) and returns how many; items drawn for the last time go to exhausted_.
  size_t Admit(Slot* slots, size_t k) REQUIRES(mu_);
  // Removes the items Admit() found exhausted (after their bytes were copied out), or holds them when `held`
  // is not null (their keys appended there), and publishes.
  void RemoveExhausted(std::vector<Key>* held) REQUIRES(mu_);
  void CopyOut(const Slot* slots, size_t k, double share, double total, const SampleSink& sink, size_t first)
      REQUIRES(mu_);
  void Publish() REQUIRES(mu_);

  const uint32_t index_;
  const double alpha_;
  const size_t target_slots_;
  const uint32_t epoch_;
  const bool sample_tree_;  // the sampler is kPrioritized: tree_ holds every item's mass
  const uint32_t max_times_sampled_;
  mutable SpinMutex mu_;

  AlignedVector<SlotRef> refs_ GUARDED_BY(mu_);
  std::vector<uint64_t> seq_ GUARDED_BY(mu_);
  std::vector<Slot> live_ GUARDED_BY(mu_);  // dense list of occupied slots (uniform draws, snapshots)
  std::vector<Slot> free_ GUARDED_BY(mu_);
  size_t num_slots_ GUARDED_BY(mu_) = 0;  // slots ever created; slots >= this are untouched
  SumMinTree tree_ GUARDED_BY(mu_);
  PayloadArena arena_ GUARDED_BY(mu_);
  const std::unique_ptr<EvictionPolicy> policy_ PT_GUARDED_BY(mu_);  // never null
  const std::unique_ptr<EvictionPolicy> order_ PT_GUARDED_BY(mu_);   // an ordered sampler's order, else null
  std::vector<uint32_t> times_sampled_ GUARDED_BY(mu_);  // per slot, draws so far; empty unless max_times_sampled_
  std::vector<Slot> exhausted_ GUARDED_BY(mu_);
  std::vector<Slot> held_ GUARDED_BY(mu_);  // held items (see "Held items")
  ShardCounters counters_ GUARDED_BY(mu_);
  uint64_t max_seq_ GUARDED_BY(mu_) = 0;
  uint64_t bytes_held_ GUARDED_BY(mu_) = 0;           // items' and chunks' bytes
  std::vector<ChunkRef> chunk_refs_ GUARDED_BY(mu_);  // by chunk id
  std::vector<uint32_t> free_chunk_ids_ GUARDED_BY(mu_);
  size_t num_chunk_ids_ GUARDED_BY(mu_) = 0;  // ids ever used; ids >= this are untouched
  size_t live_chunks_ GUARDED_BY(mu_) = 0;
  uint64_t chunk_bytes_held_ GUARDED_BY(mu_) = 0;
  // Sampling: chunk id -> its index in the batch being copied out, valid where chunk_stamp_ == copy_stamp_.
  std::vector<uint64_t> chunk_stamp_ GUARDED_BY(mu_);
  std::vector<uint32_t> chunk_out_ GUARDED_BY(mu_);
  uint64_t copy_stamp_ GUARDED_BY(mu_) = 0;
  std::vector<Slot> scratch_slots_ GUARDED_BY(mu_);
  std::vector<Slot> removed_ GUARDED_BY(mu_);
  std::vector<double> zeros_ GUARDED_BY(mu_);
  std::vector<double> scratch_values_ GUARDED_BY(mu_);
  std::vector<Key>* removal_sink_ GUARDED_BY(mu_) = nullptr;  // ReportRemovals

  std::atomic<size_t> size_{0};
  std::atomic<size_t> held_size_{0};
  std::atomic<double> total_{0.0};
  std::atomic<double> min_positive_;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> reserved_{0};
  std::atomic<size_t> chunks_{0};
  std::atomic<uint64_t> chunk_bytes_{0};
};

}  // namespace apexrl

#endif  // APEXRL_SHARD_H_
