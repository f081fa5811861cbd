// ShardedStore: the replay store -- S independent shards behind one batched API, sampling by priority (Ape-X),
// uniformly, or in an order (FIFO, LIFO, heaps).
#ifndef APEXRL_SHARDED_STORE_H_
#define APEXRL_SHARDED_STORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "apexrl/byte_buffer.h"
#include "apexrl/common.h"
#include "apexrl/eviction/kinds.h"
#include "apexrl/eviction/planner.h"
#include "apexrl/eviction/policy.h"
#include "apexrl/mutex.h"
#include "apexrl/random.h"
#include "apexrl/sampling/kinds.h"
#include "apexrl/shard.h"
#include "apexrl/slab_reserve.h"
#include "apexrl/thread_annotations.h"

namespace apexrl {

struct StoreConfig {
  uint64_t capacity = 1'000'000;  // soft: inserts always succeed; RemoveToFit() trims back to it
  // Hard ceiling (>= capacity; 0: 2 * capacity): an Insert that leaves more items evicts down to capacity
  // itself before returning, so the store stays bounded even if nobody calls RemoveToFit().
  uint64_t max_size = 0;
  double alpha = 0.6;   // sampling P(k) = p_k^alpha / sum_j p_j^alpha
  uint32_t shards = 8;  // independent locks; 1..256
  EvictionKind eviction = EvictionKind::kFifo;
  double alpha_evict = -0.4;  // prioritized eviction draws victims with probability ~ p^alpha_evict
  uint64_t seed = 0;
  // 1..kMaxEpoch, carried by every key the store issues (common.h); a restarted store must use an epoch
  // that differs from the lives before it, so their keys can never address its items.
  uint32_t epoch = 1;
  SamplerKind sampler = SamplerKind::kPrioritized;  // how Sample() picks items (see "Samplers" below)
  uint32_t max_times_sampled = 0;                   // > 0: an item is removed right after its k-th draw; 0: no limit
};

// The chunks an Insert call carries beside its items (see "Frame chunks" below). Item i references
// item_chunks[item_chunk_offsets[i] .. item_chunk_offsets[i + 1]): a value below `count` is an index into
// data/sizes, any other the chunk key of a chunk stored by an earlier call.
struct ChunkBatch {
  const uint8_t* const* data = nullptr;
  const uint64_t* sizes = nullptr;
  size_t count = 0;
  const uint64_t* item_chunks = nullptr;
  const uint64_t* item_chunk_offsets = nullptr;  // n + 1 entries, starting at 0, non-decreasing
  Key* chunk_keys = nullptr;                     // optional output: the chunk keys of the `count` chunks stored
};

// One sampled batch of n items, n = keys.size(): the number the call returned, which may be below the number
// asked for (see "Samplers"). Item i's bytes are data[offsets[i] .. offsets[i+1]).
struct SampleResult {
  std::vector<Key> keys;
  std::vector<float> weights;         // importance-sampling weights in (0, 1]; 1 unless prioritized
  std::vector<double> probabilities;  // P(item) for one draw: mass / total_mass (1 / size in the fallback and
                                      // for the uniform sampler; 1 for an ordered sampler's deterministic pick)
  ByteBuffer data;
  std::vector<uint64_t> offsets;  // size n + 1
  // The store the batch was drawn from (see "Batch totals" below).
  double total_mass = 0.0;  // T: sum of p^alpha the draws were made from; 0 in the uniform fallback and for
                            // every sampler but prioritized
  double min_mass = 0.0;    // m_min: smallest positive mass, the weights' normaliser; 0 where T is 0
  uint64_t size = 0;        // N: items in the store when sampled
  // The chunks the sampled items reference, each once: item i's are item_chunks[item_chunk_offsets[i] ..
  // item_chunk_offsets[i + 1]) (in the order it was inserted with), indices c of chunks whose bytes are
  // chunk_data[chunk_offsets[c] .. chunk_offsets[c + 1]). Empty (offsets all 0) for items without chunks.
  std::vector<uint64_t> item_chunk_offsets;  // size n + 1
  std::vector<uint64_t> item_chunks;
  ByteBuffer chunk_data;
  std::vector<uint64_t> chunk_offsets;  // size (number of chunks) + 1
  // Sample(..., hold = true) with max_times_sampled: the keys of the items this batch drew for the last time,
  // held by the store until Release or GiveBack (see "Held items" below); empty otherwise.
  std::vector<Key> held;
};

struct StoreStats {
  uint64_t size = 0;
  uint64_t bytes_held = 0;      // item and chunk bytes stored (each chunk once)
  uint64_t chunks = 0;          // chunks stored
  uint64_t chunk_bytes = 0;     // their bytes (part of bytes_held)
  uint64_t bytes_reserved = 0;  // memory the shards' payload arenas hold for them
  uint64_t inserted = 0;
  uint64_t sampled = 0;  // items drawn
  uint64_t sample_calls = 0;
  uint64_t updated = 0;
  uint64_t stale_updates = 0;
  uint64_t evicted = 0;
  uint64_t erased = 0;
  uint64_t remove_to_fit_calls = 0;
  uint64_t removed_by_sampling = 0;  // items removed because they reached max_times_sampled
};

// Semantics (the contract the Python API documents):
//  * Sampling is proportional and stratified: the total mass T = sum_k p_k^alpha is cut into n equal
//    segments with one uniform draw in each (Schaul et al.); a draw picks a shard by its share of T, then
//    descends that shard's tree. IS weight w_k = (N P(k))^-beta / max_j w_j = (m_k / m_min)^-beta, where
//    m_min is the smallest positive mass in the store (or a smaller drawn one, written concurrently), so
//    weights lie in (0, 1] (computed from logs, so no ratio overflows; an underflow is clamped to the smallest
//    normal float). If every mass is 0 (alpha > 0 and all priorities 0) draws fall back to uniform with
//    weights 1.
//  * Batch totals: every batch is drawn in one pass over the shards (a pass that finds a shard emptied under
//    it is discarded whole, its draws uncounted, and the batch drawn again), and SampleResult reports that
//    pass's store: total_mass T, min_mass m_min and size N. For every draw k, probability_k * T == m_k (its
//    mass p_k^alpha) up to rounding, and weight_k = (m_k / m_min)^-beta; 0 < m_min <= m_k <= T. A client
//    holding several stores combines batches from these alone (global P_k = m_k / sum_s T_s, global
//    m_min = min_s m_min_s). T is the sum over shards of each shard's total as its draws saw it (read under
//    its lock), or as read before the pass for a shard no draw reached; quiet, that is TotalMass() and P_k
//    the probability the draw was made with. In the uniform fallback T = m_min = 0 and every P_k = 1 / N
//    (weights 1). N is the sum of the shards' sizes read at the start of the pass (N >= 1; draws are with
//    replacement, so n may exceed N).
//  * Samplers (config.sampler; sampling/kinds.h). The contract above is the prioritized sampler's. The others:
//    - uniform: n draws with replacement, every item equally likely: a draw picks a shard by its share of the
//      items, then a uniform slot of it (no sum tree: O(1) per item drawn). Weights 1, probability_k = 1 / N,
//      T = m_min = 0, exactly as the prioritized store's uniform fallback.
//    - fifo (oldest first), lifo (newest first), max_heap (highest priority first), min_heap (lowest first): a
//      sample of n returns min(n, size, kOrderedRound) DISTINCT items, in that order across the whole store
//      (the ordered removers' orders and planner: each shard lists its first items, OrderedEvictionPlanner
//      picks the store-wide first n, and the batch is merged by rank). Equal priorities come in no particular
//      order. Sampling leaves the items in place (unless max_times_sampled says otherwise). Weights 1,
//      probability_k = 1 (the pick is deterministic, as Reverb reports it), T = m_min = 0. Under concurrent
//      writes a batch may hold fewer items: items erased, evicted or sampled away (max_times_sampled) between
//      the shards' summaries and their copy-out are not replaced by later ones in the same call (without
//      max_times_sampled, where the call has removed nothing, such a short batch is drawn again up to 3 times
//      first; with it, e.g. several consumers of one queue, it is returned short).
//    Only the prioritized sampler keeps the sampling sum tree: a store of another sampler makes no tree update
//    on insert, update or removal, and TotalMass() / MinMass() are 0 there (priorities are still validated the
//    same way, and kept for the removers and the heaps).
//  * max_times_sampled = k > 0: every item counts its draws, and the sample call that draws it the k-th time
//    removes it before returning (counted in removed_by_sampling, its chunks freed as by Erase; every
//    invariant holds after the call), so no item is ever returned more than k times in total. The key in that
//    batch is then already stale. With-replacement samplers (prioritized, uniform) draw as usual; a draw that
//    lands on an item whose allowance the same call has already used up is DROPPED (not drawn again), so such
//    a batch may hold fewer than n items (the draws it keeps follow the sampler's distribution, and its batch
//    totals describe them). With k = 0 the prioritized and uniform samplers always return exactly n items.
//  * Held items (Sample with hold, the serving loop's SAMPLEs of a table with max_times_sampled): an item drawn
//    for the last time leaves the store's view at once (Size(), sampling, eviction; updates and erases treat its
//    key as stale) but keeps its slot, key, insertion number, priority, bytes, chunks and draw count until the
//    caller settles its batch: Release (the reply was sent) removes it, counted in removed_by_sampling;
//    GiveBack (the reply could not be sent) puts it back where it was in the sampling and eviction orders (by
//    insertion number: the front of a FIFO queue, in the original order), with its key valid again and the
//    batch's draws taken back. A held item is never evicted, never counted in Size() (Held() counts it), and
//    is saved by a snapshot as not yet drawn for the last time (its delivery is undecided: at least once).
//  * Keys of removed items are stale forever: updates skip and count them, erase ignores them. So are keys
//    of another epoch (an earlier life of a restarted store) unless their item was restored from a snapshot.
//  * Masses are at most kMaxMass, so no total overflows; probabilities are finite and sum to 1.
//  * Frame chunks: an Insert call may carry chunks (blobs, e.g. lz4-compressed runs of Atari frames, or a
//    trajectory writer's steps) beside its items; each item names the chunks it references (at most
//    kMaxChunksPerItem, distinct): chunks of its own call by index, or chunks stored by earlier calls by their
//    chunk key (the Insert returns each new chunk's key: shard, chunk id, tag, as item keys are built). Every
//    chunk of a call is referenced by at least one item of the call, and a call with chunks goes whole to one
//    shard: the shard of the stored chunks it references (all on one shard, else InvalidArgument), or any
//    shard when it references none. A call referencing a stored chunk that is gone (its last item removed, or
//    a key of another life of the store, or naming a shard it does not have) throws StaleChunks listing those
//    keys and stores nothing. A chunk is reference-counted by the live items naming it and freed when the last
//    one is evicted or erased; bytes_held counts it once. A sample returns each referenced
//    chunk once per batch. Sampling and eviction look at items only: chunks change neither.
//  * FIFO eviction removes the globally oldest items (insertion numbers are store-wide), lowest-priority
//    eviction the globally lowest priorities (equal ones in no particular order); prioritized eviction
//    splits the victims among shards by their eviction mass and each shard draws its share. Each shard's
//    policy orders its own victims; the kind's EvictionPlanner (eviction/planner.h) makes the split.
//
// Thread-safety: every method may be called from any number of threads at once. A call holds at most one
// shard lock at a time (insert chunks try the next shard instead of waiting on a busy one) and no store-wide
// lock stops inserts, samples or updates (RemoveToFit's own lock only keeps evictions one at a time).
// Inside a shard's lock an insert is a memcpy into a recycled arena block plus O(log n) tree work; a sample's
// share is a batched tree descent plus the copy of its items out. Under concurrency the shard totals a sample
// starts from may be slightly behind; a draw is then rescaled inside its shard, and the batch reports that
// shard's total as its draws saw it (see "Batch totals").
//
// Errors: invalid input throws InvalidArgument and changes nothing (all validation precedes any change).
class ShardedStore {
 public:
  explicit ShardedStore(const StoreConfig& config);
  ~ShardedStore();

  const StoreConfig& config() const { return config_; }

  // Inserts n <= kMaxBatchItems items (item i: sizes[i] bytes at data[i]) with their priorities; writes n
  // keys. Each mass priority^alpha must be <= kMaxMass. If the store then holds more than max_size items it
  // runs RemoveToFit() before returning (the new items may be among the victims; their keys are then stale).
  // `chunks` (optional): the chunks the items reference; see "Frame chunks" above.
  void Insert(const double* priorities, const uint8_t* const* data, const uint64_t* sizes, size_t n, Key* keys,
              const ChunkBatch* chunks = nullptr);
  // Throws InvalidArgument exactly as Insert would for these priorities (not finite, < 0, or a mass above
  // kMaxMass); changes nothing. The serving loop refuses such an INSERT before the rate limiter sees it.
  void CheckPriorities(const double* priorities, size_t n) const;
  // Draws 1 <= n <= kMaxBatchItems items into `out` (reusing its buffers) with the configured sampler; beta >= 0
  // (used by the prioritized sampler only). The batch holds n items with replacement (prioritized, uniform)
  // or min(n, size) distinct ones (ordered samplers), fewer where "Samplers" says so; at least 1. EmptyStore
  // if the store is empty.
  // `hold` (max_times_sampled): the items drawn for the last time are held rather than removed, their keys in
  // out->held; the caller must settle them with Release or GiveBack (see "Held items").
  void Sample(size_t n, double beta, SampleResult* out, bool hold = false);
  // Held items: Release removes them for good (their batch was delivered); GiveBack puts them back as they
  // were and takes back the draws of the batch (`drawn`: its keys, out->keys), so the next sample gets them
  // as if this batch had never been drawn. GiveBack returns how many held items came back. Keys that are not
  // held (already settled, another batch's, stale) are ignored.
  void Release(const Key* held, size_t n);
  size_t GiveBack(const Key* held, size_t n_held, const Key* drawn, size_t n_drawn);
  size_t Held() const;  // items held now (not counted in Size())
  // Returns how many keys still addressed an item (the rest are counted as stale updates).
  size_t UpdatePriorities(const Key* keys, const double* priorities, size_t n);
  size_t Erase(const Key* keys, size_t n);
  // Removes every item but the held ones (Shard::Clear), one shard after the other, counted as erased; returns
  // how many. Their keys are stale from then on; the store's configuration, epoch and counters are kept.
  size_t Clear();
  // Evicts with the configured policy until Size() <= capacity; returns how many items it removed.
  size_t RemoveToFit();

  size_t Size() const;
  double TotalMass() const;  // sum of p^alpha over every item (the sampling mass)
  double MinMass() const;    // the smallest positive p^alpha of any item; 0 when there is none
  StoreStats Stats() const;

  // Versioned, checksummed snapshot; see sharded_store.cc for the layout. Save writes path.tmp.<pid>.<n>,
  // fsyncs it, renames it into place and fsyncs the directory; on any failure (disk full, I/O error, missing
  // directory) it removes the temporary and throws SnapshotError with the OS reason, leaving an earlier
  // snapshot at `path` untouched. Shards are copied one at a time under their own lock and written after it
  // is released, so a save stalls no shard for longer than a memcpy of its items.
  // Load verifies structure and checksum and throws SnapshotError for a truncated, corrupted, foreign or
  // older-version file, never returning a partly loaded store. The restored store issues keys with `epoch`,
  // which must differ from the saved one (InvalidArgument otherwise): keys of restored items stay valid, keys
  // the saved store issued after the save are stale. Without `epoch`: NextEpoch(saved epoch).
  void Save(const std::string& path) const;
  static std::unique_ptr<ShardedStore> Load(const std::string& path, uint32_t epoch);
  static std::unique_ptr<ShardedStore> Load(const std::string& path);
  // The epoch a snapshot was saved under, read from its header only (SnapshotError if it is not a snapshot
  // of this version).
  static uint32_t SnapshotEpoch(const std::string& path);
  // The format version of the snapshot at `path` (header only; SnapshotError if it is none this build reads).
  static uint32_t SnapshotVersion(const std::string& path);

  // Disk tables (disk_table.h): every removal but a held item's Release appends its key to `sink` (Shard::
  // ReportRemovals); Restore fills an empty store with a log's items, each with its key and insertion number
  // (InvalidArgument, for a key of a shard it does not have or two items in one slot); Peek reads a live item.
  void ReportRemovals(std::vector<Key>* sink);
  void Restore(std::vector<RestoredItem> items);
  bool Peek(Key key, uint64_t* seq, double* priority, std::string* data) const;
  // f(bytes, size) for every item, held ones included, one shard's lock at a time (Shard::ForEachItem).
  template <typename F>
  void ForEachItem(F&& f) const {
    for (const auto& shard : shards_) shard->ForEachItem(f);
  }
  // The last insertion number issued: an Insert call that runs alone numbers its items from this + 1, in order.
  uint64_t last_seq() const { return next_seq_.load(std::memory_order_relaxed); }

  // Throws std::logic_error describing the first broken invariant of any shard (tests).
  void Validate() const;
  // Every shard's Shard::Contents, in shard order: a restored snapshot's items, read by the store itself.
  std::vector<Shard::Contents> Dump() const;

 private:
  // One pass of Sample: reads the shard totals and fills up to n draws and the batch totals of `out`. Returns
  // how many it wrote, 0 if the batch is to be drawn again (a shard had emptied between the read and its lock;
  // with max_times_sampled such a shard's draws are dropped instead, since other shards may have removed
  // items already). The keys', probabilities' and masses' end offsets are written by the caller.
  size_t SamplePass(size_t n, Rng& rng, SampleResult* out);
  // The uniform draws of a pass (the uniform sampler, and the prioritized one when every mass is 0).
  size_t UniformPass(size_t n, Rng& rng, SampleResult* out);
  // The pass of an ordered sampler (fifo, lifo, max_heap, min_heap).
  size_t OrderedPass(size_t n, Rng& rng, SampleResult* out);
  // Validates priorities (finite, >= 0, mass <= kMaxMass) into masses[]; throws naming the first bad one.
  void ComputeMasses(const double* priorities, size_t n, double* masses) const;
  double CheckedMass(size_t i, double priority) const;  // priorities[i]'s mass, or the refusal naming it
  // Groups key indices by shard (counting sort); keys naming a shard that does not exist go last.
  void GroupByShard(const Key* keys, size_t n, std::vector<uint32_t>* order, std::vector<size_t>* starts) const;
  size_t Excess() const;  // items above capacity now
  // One eviction round: summaries, the planner's quotas, evictions. Returns how many items it removed.
  size_t EvictRound(size_t excess, Rng& rng) REQUIRES(remove_mu_);

  StoreConfig config_;
  // Before shards_, so it is destroyed after them: their arenas take slabs from it until then.
  SlabReserve slab_reserve_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<uint64_t> next_seq_{0};      // store-wide insertion numbers (FIFO order across shards)
  std::atomic<uint64_t> next_shard_{0};    // round-robin start for insert chunks
  std::atomic<uint64_t> sample_calls_{0};  // also the stream index of each sample call's generator
  std::atomic<uint64_t> eviction_calls_{0};
  std::atomic<uint64_t> invalid_shard_keys_{0};
  const EvictionPlanner* planner_;  // of config_.eviction; stateless, shared
  // One RemoveToFit at a time (two would both evict the same excess). Held across the shard calls of an
  // eviction: it is always taken before a shard's lock, never while holding one, so the order cannot invert.
  Mutex remove_mu_;
  std::vector<EvictionSummary> summaries_ GUARDED_BY(remove_mu_);  // per shard, reused across rounds
  std::vector<EvictionQuota> quotas_ GUARDED_BY(remove_mu_);
};

}  // namespace apexrl

#endif  // APEXRL_SHARDED_STORE_H_
