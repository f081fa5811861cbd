#include "apexrl/sharded_store.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "apexrl/errors.h"
#include "apexrl/snapshot_io.h"

namespace apexrl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Items per insert chunk: a batch of 50 from an actor takes one shard lock; a big batch spreads out.
constexpr size_t kInsertChunk = 64;
constexpr char kMagic[8] = {'A', 'P', 'X', 'R', 'L', 'S', 'T', '1'};
constexpr char kEndMagic[8] = {'A', 'P', 'X', 'R', 'L', 'E', 'N', 'D'};
// Version 2: keys carry an epoch (slot tags instead of generations, the saved epoch and max_size).
// Version 3: frame chunks (a chunk table per shard, chunk ids per item).
// Version 4: samplers (the sampler and max_times_sampled in the header, each item's times sampled, the counter
// removed_by_sampling). Version 2 and 3 files still load (sampler prioritized, no limit, counts 0).
// Version 5: chunk keys (each stored chunk's tag, so chunk keys issued before the save stay valid after a
// restore, as item keys do). Version 4 files still load.
constexpr uint32_t kSnapshotVersion = 5;
constexpr uint32_t kOldestReadableVersion = 2;
constexpr uint64_t kEvictionStream = 0x5EED0E71C7ull;

// The shortest of %.15g / %.17g that reads back as v: 1e+308, not 1.0000000000000001e+308.
std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

void ValidateConfig(const StoreConfig& c) {
  if (c.capacity < 1) throw InvalidArgument("capacity must be >= 1, got " + std::to_string(c.capacity));
  if (!std::isfinite(c.alpha) || c.alpha < 0.0) {
    throw InvalidArgument("alpha must be finite and >= 0, got " + Num(c.alpha));
  }
  if (c.shards < 1 || c.shards > kMaxShards) {
    throw InvalidArgument("shards must be in [1, " + std::to_string(kMaxShards) + "], got " + std::to_string(c.shards));
  }
  if (!IsEvictionKind(c.eviction)) {
    throw InvalidArgument("unknown eviction policy " + std::to_string(static_cast<uint32_t>(c.eviction)));
  }
  if (!IsSamplerKind(c.sampler)) {
    throw InvalidArgument("unknown sampler " + std::to_string(static_cast<uint32_t>(c.sampler)));
  }
  if (!std::isfinite(c.alpha_evict)) throw InvalidArgument("alpha_evict must be finite, got " + Num(c.alpha_evict));
  if (c.epoch < 1 || c.epoch > kMaxEpoch) {
    throw InvalidArgument("epoch must be in [1, " + std::to_string(kMaxEpoch) + "], got " + std::to_string(c.epoch));
  }
  if (c.max_size < c.capacity) {
    throw InvalidArgument("max_size must be >= capacity = " + std::to_string(c.capacity) + ", got " +
                          std::to_string(c.max_size));
  }
  // Keys have 28 bits for the slot: a shard must be able to hold its share of the hard ceiling.
  const uint64_t per_shard = c.max_size / c.shards + (c.max_size % c.shards != 0);
  if (per_shard > kMaxSlotsPerShard) {
    throw InvalidArgument("max_size " + std::to_string(c.max_size) + " over " + std::to_string(c.shards) +
                          " shards needs " + std::to_string(per_shard) + " slots per shard; a shard holds at most " +
                          std::to_string(kMaxSlotsPerShard) + " (use more shards or a smaller capacity/max_size)");
  }
}

// max_size 0 stands for 2 * capacity (saturating, so a huge capacity is refused by ValidateConfig instead).
StoreConfig WithDefaults(StoreConfig c) {
  if (c.max_size == 0) c.max_size = c.capacity > UINT64_MAX / 2 ? UINT64_MAX : 2 * c.capacity;
  return c;
}

std::string BatchTooLarge(const char* what, uint64_t n) {
  return std::string(what) + " " + std::to_string(n) + " items in one call; the limit is " +
         std::to_string(kMaxBatchItems) + " (split the call)";
}

}  // namespace

ShardedStore::ShardedStore(const StoreConfig& config) : config_(WithDefaults(config)), planner_(nullptr) {
  ValidateConfig(config_);
  planner_ = &EvictionPlannerFor(config_.eviction);
  const uint64_t per_shard = (config_.capacity + config_.shards - 1) / config_.shards;
  const size_t target = static_cast<size_t>(std::min<uint64_t>(per_shard + per_shard / 10 + 1024, kMaxSlotsPerShard));
  shards_.reserve(config_.shards);
  for (uint32_t s = 0; s < config_.shards; ++s) {
    shards_.push_back(std::make_unique<Shard>(s, config_.alpha,
                                              MakeEvictionPolicy(config_.eviction, config_.alpha_evict), target,
                                              config_.epoch, config_.sampler, config_.max_times_sampled));
    shards_.back()->UseSlabReserve(&slab_reserve_);
  }
}

ShardedStore::~ShardedStore() = default;

double ShardedStore::CheckedMass(size_t i, double p) const {
  if (!std::isfinite(p) || p < 0.0) {
    throw InvalidArgument("priorities must be finite and >= 0; priorities[" + std::to_string(i) + "] is " + Num(p));
  }
  const double mass = PriorityMass(p, config_.alpha);
  if (!(mass <= kMaxMass)) {  // also catches an overflow to infinity
    throw InvalidArgument("priorities[" + std::to_string(i) + "] = " + Num(p) +
                          " has mass priority^alpha = " + Num(mass) + " (alpha = " + Num(config_.alpha) +
                          "), above the limit MAX_MASS = " + Num(kMaxMass) +
                          " that keeps the store's total mass finite");
  }
  return mass;
}

void ShardedStore::ComputeMasses(const double* priorities, size_t n, double* masses) const {
  for (size_t i = 0; i < n; ++i) masses[i] = CheckedMass(i, priorities[i]);
}

void ShardedStore::CheckPriorities(const double* priorities, size_t n) const {
  // Below half of MAX_MASS^(1/alpha) no rounding of pow can reach MAX_MASS: only larger priorities pay for it.
  const double safe = config_.alpha > 0.0 ? std::pow(kMaxMass, 1.0 / config_.alpha) / 2 : HUGE_VAL;
  for (size_t i = 0; i < n; ++i) {
    const double p = priorities[i];
    if (!(p >= 0.0 && p <= safe)) CheckedMass(i, p);
  }
}

void ShardedStore::Insert(const double* priorities, const uint8_t* const* data, const uint64_t* sizes, size_t n,
                          Key* keys, const ChunkBatch* chunks) {
  const bool with_chunks = chunks != nullptr && (chunks->count > 0 || chunks->item_chunk_offsets != nullptr);
  if (n == 0) {
    if (with_chunks && chunks->count > 0) throw InvalidArgument("chunks sent without items: no item references them");
    return;
  }
  if (n > kMaxBatchItems) throw InvalidArgument(BatchTooLarge("cannot insert", n));
  std::vector<double> masses(n);
  ComputeMasses(priorities, n, masses.data());
  for (size_t i = 0; i < n; ++i) {
    if (sizes[i] > std::numeric_limits<uint32_t>::max()) {
      throw InvalidArgument("items[" + std::to_string(i) + "] is " + std::to_string(sizes[i]) +
                            " bytes; an item may hold at most 4294967295 bytes");
    }
  }
  std::vector<PreparedItem> items(n);
  for (size_t i = 0; i < n; ++i) {
    items[i] = PreparedItem{data[i], static_cast<uint32_t>(sizes[i]), priorities[i], masses[i]};
  }
  const size_t num_shards = shards_.size();
  if (with_chunks) {
    // Validate everything before any change: references in range, distinct per item, every chunk used.
    const size_t m = chunks->count;
    if (m > kMaxBatchItems) throw InvalidArgument(BatchTooLarge("cannot insert chunks for", m));
    const uint64_t* off = chunks->item_chunk_offsets;
    if (off == nullptr) throw InvalidArgument("chunks sent without the items' chunk references");
    if (off[0] != 0) throw InvalidArgument("item_chunk_offsets must start at 0");
    std::vector<uint8_t> used(m, 0);
    std::vector<PreparedChunk> prepared(m);
    for (size_t c = 0; c < m; ++c) {
      if (chunks->sizes[c] > std::numeric_limits<uint32_t>::max()) {
        throw InvalidArgument("chunks[" + std::to_string(c) + "] is " + std::to_string(chunks->sizes[c]) +
                              " bytes; a chunk may hold at most 4294967295 bytes");
      }
      prepared[c] = PreparedChunk{chunks->data[c], static_cast<uint32_t>(chunks->sizes[c])};
    }
    int64_t home = -1;  // the shard of the stored chunks the call references, if any
    std::vector<uint64_t> sorted;
    std::vector<Key> foreign;  // chunk keys naming a shard this store does not have
    for (size_t i = 0; i < n; ++i) {
      if (off[i + 1] < off[i]) throw InvalidArgument("item_chunk_offsets must not decrease");
      const uint64_t k = off[i + 1] - off[i];
      if (k > kMaxChunksPerItem) {
        throw InvalidArgument("items[" + std::to_string(i) + "] references " + std::to_string(k) +
                              " chunks; an item may reference at most " + std::to_string(kMaxChunksPerItem));
      }
      const uint64_t* refs = chunks->item_chunks + off[i];
      for (uint64_t j = 0; j < k; ++j) {
        if (refs[j] < m) {
          used[refs[j]] = 1;
          continue;
        }
        const KeyParts key = SplitKey(refs[j]);
        if (!ValidTag(key.tag) || key.slot >= kMaxChunksPerShard) {
          throw InvalidArgument("items[" + std::to_string(i) + "] references chunk " + std::to_string(refs[j]) +
                                ": neither one of the call's " + std::to_string(m) + " chunks nor a chunk key");
        }
        if (key.shard >= num_shards) {  // a chunk key, but not of this store: as stale as a removed chunk's
          if (std::find(foreign.begin(), foreign.end(), refs[j]) == foreign.end()) foreign.push_back(refs[j]);
          continue;
        }
        if (home >= 0 && key.shard != static_cast<uint64_t>(home)) {
          throw InvalidArgument("items[" + std::to_string(i) + "] references stored chunks of shards " +
                                std::to_string(home) + " and " + std::to_string(key.shard) +
                                "; the items of one call and all their chunks live on one shard");
        }
        home = key.shard;
      }
      sorted.assign(refs, refs + k);  // distinct: sorted, O(k log k) (k may be in the thousands)
      std::sort(sorted.begin(), sorted.end());
      const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
      if (twice != sorted.end()) {
        throw InvalidArgument("items[" + std::to_string(i) + "] references chunk " + std::to_string(*twice) + " twice");
      }
      items[i].chunks = refs;
      items[i].num_chunks = static_cast<uint32_t>(k);
    }
    for (size_t c = 0; c < m; ++c) {
      if (!used[c]) throw InvalidArgument("chunks[" + std::to_string(c) + "] is referenced by no item");
    }
    if (!foreign.empty()) throw StaleChunks(std::move(foreign));
    // The whole call into one shard, so that its chunks' reference counts live under one lock: the shard of the
    // stored chunks it references, else the first free one.
    bool inserted = false;
    if (home >= 0) {
      inserted = shards_[static_cast<size_t>(home)]->Insert(items.data(), n, &next_seq_, keys, true, prepared.data(), m,
                                                            chunks->chunk_keys);
    } else {
      const uint64_t start = next_shard_.fetch_add(1, std::memory_order_relaxed);
      for (size_t t = 0; t < num_shards && !inserted; ++t) {
        inserted = shards_[(start + t) % num_shards]->Insert(items.data(), n, &next_seq_, keys, false, prepared.data(),
                                                             m, chunks->chunk_keys);
      }
      if (!inserted) {
        shards_[start % num_shards]->Insert(items.data(), n, &next_seq_, keys, true, prepared.data(), m,
                                            chunks->chunk_keys);
      }
    }
    if (Size() > config_.max_size) RemoveToFit();
    return;
  }
  size_t done = 0;
  while (done < n) {
    const size_t m = std::min(kInsertChunk, n - done);
    const uint64_t start = next_shard_.fetch_add(1, std::memory_order_relaxed);
    // Take the first shard whose lock is free; wait only if every shard is busy.
    bool inserted = false;
    for (size_t t = 0; t < num_shards && !inserted; ++t) {
      inserted = shards_[(start + t) % num_shards]->Insert(&items[done], m, &next_seq_, keys + done, false);
    }
    if (!inserted) shards_[start % num_shards]->Insert(&items[done], m, &next_seq_, keys + done, true);
    done += m;
  }
  if (Size() > config_.max_size) RemoveToFit();  // the hard ceiling holds even if nobody else evicts
}

namespace {
// Per-thread scratch of Sample (one sample call per thread at a time).
struct SampleScratch {
  std::vector<double> masses, points, fractions, totals;
  std::vector<size_t> counts;
  std::vector<uint64_t> bounds, ranks;  // uniform: running shard sizes; ordered: each written item's rank
  std::vector<uint32_t> order;
  std::vector<EvictionSummary> summaries;
  std::vector<EvictionQuota> quotas;
  std::vector<std::pair<size_t, size_t>> done;  // (shard, draws) sampled so far in this pass
  std::vector<Key>* held = nullptr;             // this call's held keys (Sample's `hold`), or null
};
thread_local SampleScratch sample_scratch;
}  // namespace

void ShardedStore::Sample(size_t n, double beta, SampleResult* out, bool hold) {
  if (n == 0) throw InvalidArgument("the number of items to sample must be >= 1, got 0");
  if (n > kMaxBatchItems) throw InvalidArgument(BatchTooLarge("cannot sample", n));
  if (!std::isfinite(beta) || beta < 0.0) throw InvalidArgument("beta must be finite and >= 0, got " + Num(beta));
  if (Size() == 0) throw EmptyStore();
  Rng rng(config_.seed, sample_calls_.fetch_add(1, std::memory_order_relaxed));
  out->held.clear();
  sample_scratch.held = hold && config_.max_times_sampled > 0 ? &out->held : nullptr;

  out->keys.resize(n);
  out->weights.resize(n);
  out->probabilities.resize(n);
  out->offsets.resize(n + 1);
  out->item_chunk_offsets.resize(n + 1);
  SampleScratch& scratch = sample_scratch;
  scratch.masses.resize(n);
  {
    uint64_t items = 0, bytes = 0;
    for (const auto& shard : shards_) {
      items += shard->size();
      bytes += shard->bytes();
    }
    out->data.clear();
    if (items > 0) out->data.reserve(static_cast<size_t>(n * (bytes / items) + n * (bytes / items) / 8 + 4096));
  }
  // One pass normally fills the batch. A shard emptied between reading its total and locking it leaves its
  // draws unfilled: the whole batch is then drawn again from fresh totals, so every batch comes from one
  // pass and its total_mass / min_mass / size describe all of its draws.
  size_t filled = 0;
  for (int pass = 0; (filled = SamplePass(n, rng, out)) == 0; ++pass) {
    if (Size() == 0) throw EmptyStore();
    if (pass >= 64) throw std::runtime_error("sample: the store kept changing under the draw; try again");
  }
  n = filled;  // fewer than asked where the sampler allows it (see "Samplers")
  out->keys.resize(n);
  out->weights.resize(n);
  out->probabilities.resize(n);
  out->offsets.resize(n + 1);
  out->item_chunk_offsets.resize(n + 1);
  out->offsets[n] = out->data.size();
  out->item_chunk_offsets[n] = out->item_chunks.size();
  out->chunk_offsets.push_back(out->chunk_data.size());

  // w = (N P(k))^-beta / max_j w_j = (m_k / m_min)^-beta, computed as exp(beta * (log m_min - log m_k)):
  // a ratio of masses spanning denormals to kMaxMass would overflow, a difference of logs cannot. m_min is
  // at most every drawn positive mass, so w <= 1; float underflow is clamped to the smallest normal float,
  // so every weight is a finite float in (0, 1]. The uniform fallback has weights 1.
  const double* masses = scratch.masses.data();
  const double min_mass = out->min_mass;
  for (size_t i = 0; i < n; ++i) {
    double w = 1.0;
    if (masses[i] > 0.0 && min_mass > 0.0 && beta > 0.0)
      w = std::exp(beta * (std::log(min_mass) - std::log(masses[i])));
    out->weights[i] = static_cast<float>(std::clamp(w, static_cast<double>(FLT_MIN), 1.0));
  }
}

namespace {

// Puts the n items of a batch into a new order: item i of the result is item order[i] of `out`. Every
// per-item array and both byte streams are gathered (chunk indices stay valid: the chunks are not moved).
void PermuteBatch(SampleResult* out, const std::vector<uint32_t>& order) {
  const size_t n = order.size();
  thread_local std::vector<Key> keys;
  thread_local std::vector<double> probabilities;
  thread_local std::vector<uint64_t> offsets, item_chunk_offsets, item_chunks;
  thread_local ByteBuffer data;
  keys.resize(n);
  probabilities.resize(n);
  offsets.resize(n);
  item_chunk_offsets.resize(n);
  item_chunks.clear();
  data.clear();
  data.reserve(out->data.size());
  for (size_t i = 0; i < n; ++i) {
    const uint32_t j = order[i];
    keys[i] = out->keys[j];
    probabilities[i] = out->probabilities[j];
    const uint64_t b = out->offsets[j], e = out->offsets[j + 1];
    offsets[i] = data.size();
    if (e > b) std::memcpy(data.Extend(e - b), out->data.data() + b, e - b);
    item_chunk_offsets[i] = item_chunks.size();
    item_chunks.insert(item_chunks.end(),
                       out->item_chunks.begin() + static_cast<std::ptrdiff_t>(out->item_chunk_offsets[j]),
                       out->item_chunks.begin() + static_cast<std::ptrdiff_t>(out->item_chunk_offsets[j + 1]));
  }
  std::copy(keys.begin(), keys.end(), out->keys.begin());
  std::copy(probabilities.begin(), probabilities.end(), out->probabilities.begin());
  std::copy(offsets.begin(), offsets.end(), out->offsets.begin());
  std::copy(item_chunk_offsets.begin(), item_chunk_offsets.end(), out->item_chunk_offsets.begin());
  out->item_chunks.swap(item_chunks);
  std::swap(out->data, data);
}

}  // namespace

size_t ShardedStore::SamplePass(size_t n, Rng& rng, SampleResult* out) {
  if (config_.sampler == SamplerKind::kUniform) return UniformPass(n, rng, out);
  if (config_.sampler != SamplerKind::kPrioritized) return OrderedPass(n, rng, out);
  SampleScratch& scratch = sample_scratch;
  const size_t num_shards = shards_.size();
  scratch.points.resize(n);
  scratch.fractions.resize(n);
  scratch.totals.resize(num_shards);
  scratch.counts.resize(num_shards);
  std::vector<double>& totals = scratch.totals;
  out->data.clear();
  out->item_chunks.clear();
  out->chunk_data.clear();
  out->chunk_offsets.clear();
  scratch.done.clear();
  // A discarded pass takes its draws back from the shards' counters, so `sampled` counts delivered draws.
  auto discard = [&]() -> size_t {
    for (const auto& [s, k] : scratch.done) shards_[s]->UncountSampled(k);
    return 0;
  };
  const SampleSink sink{out->keys.data(),  scratch.masses.data(), out->probabilities.data(),
                        &out->data,        out->offsets.data(),   out->item_chunk_offsets.data(),
                        &out->item_chunks, &out->chunk_data,      &out->chunk_offsets,
                        scratch.held};

  double total = 0.0, min_mass = kInf;
  uint64_t items = 0;
  int last = -1;
  for (size_t s = 0; s < num_shards; ++s) {
    totals[s] = shards_[s]->total();
    total += totals[s];
    items += shards_[s]->size();
    min_mass = std::min(min_mass, shards_[s]->min_positive());
    if (totals[s] > 0.0) last = static_cast<int>(s);
  }
  if (items == 0) throw EmptyStore();
  out->size = items;
  if (!(total > 0.0)) return UniformPass(n, rng, out);  // every mass is 0 (alpha > 0, all priorities 0)
  // Stratified: draw j is uniform in segment j of [0, total); the draws come out sorted, so each shard's
  // draws are one contiguous run.
  const double segment = total / static_cast<double>(n);
  double* points = scratch.points.data();
  double* fractions = scratch.fractions.data();
  for (size_t j = 0; j < n; ++j) points[j] = (static_cast<double>(j) + rng.Uniform()) * segment;
  // The total the batch reports: each shard's total as its draws saw it (read under its lock), the total
  // read before the pass for shards no draw reached. Every drawn mass is part of it, so P <= 1.
  // With max_times_sampled a shard may drop draws (and remove items): `filled` counts what was written, and
  // a shard emptied under the pass gives nothing rather than discarding the pass.
  const bool limited = config_.max_times_sampled > 0;
  double used = 0.0;
  size_t j = 0, filled = 0;
  double begin = 0.0;
  for (size_t s = 0; s < num_shards; ++s) {
    if (!(totals[s] > 0.0)) continue;
    const double end = begin + totals[s];
    const size_t first = j;
    for (; j < n; ++j) {
      if (points[j] >= end && static_cast<int>(s) != last) break;  // rounding past the end: last shard
      fractions[j] = std::clamp((points[j] - begin) / totals[s], 0.0, 1.0 - DBL_EPSILON);
    }
    const size_t k = j - first;
    double shard_total = totals[s];
    if (k > 0) {
      size_t written = 0;
      if (shards_[s]->Sample(&fractions[first], k, totals[s] / total, sink, filled, &shard_total, &written)) {
        scratch.done.emplace_back(s, written);
        filled += written;
      } else if (!limited) {
        return discard();
      }
    }
    used += shard_total;
    begin = end;
  }
  // P(k) = m_k / total_mass exactly (up to rounding), so a client recovers m_k = P(k) * total_mass. Quiet,
  // this is the probability the draw was made with; under concurrent writes the shard a draw landed in may
  // have moved between the read and the lock (the draw is rescaled into the shard's current tree).
  const double* masses = scratch.masses.data();
  for (size_t i = 0; i < filled; ++i) {
    out->probabilities[i] = masses[i] / used;
    if (masses[i] > 0.0) min_mass = std::min(min_mass, masses[i]);
  }
  out->total_mass = used;
  out->min_mass = std::min(min_mass, used);
  return filled;
}

size_t ShardedStore::UniformPass(size_t n, Rng& rng, SampleResult* out) {
  SampleScratch& scratch = sample_scratch;
  const size_t num_shards = shards_.size();
  scratch.counts.assign(num_shards, 0);
  scratch.totals.resize(num_shards);
  scratch.bounds.resize(num_shards);
  out->data.clear();
  out->item_chunks.clear();
  out->chunk_data.clear();
  out->chunk_offsets.clear();
  scratch.done.clear();
  const SampleSink sink{out->keys.data(),  scratch.masses.data(), out->probabilities.data(),
                        &out->data,        out->offsets.data(),   out->item_chunk_offsets.data(),
                        &out->item_chunks, &out->chunk_data,      &out->chunk_offsets,
                        scratch.held};
  // Each draw picks a shard by its share of the items (a binary search of the running sizes: O(log shards),
  // independent of the store's size), then a uniform item there.
  uint64_t drawn_from = 0;
  for (size_t s = 0; s < num_shards; ++s) {
    const size_t size = shards_[s]->size();  // read once: the shares and the bounds must agree
    scratch.totals[s] = static_cast<double>(size);
    drawn_from += size;
    scratch.bounds[s] = drawn_from;
  }
  if (drawn_from == 0) return 0;  // emptied since the caller looked
  for (size_t j = 0; j < n; ++j) {
    const uint64_t r = rng.Below(drawn_from);
    ++scratch.counts[static_cast<size_t>(std::upper_bound(scratch.bounds.begin(), scratch.bounds.end(), r) -
                                         scratch.bounds.begin())];
  }
  const bool limited = config_.max_times_sampled > 0;
  size_t filled = 0;
  for (size_t s = 0; s < num_shards; ++s) {
    const size_t k = scratch.counts[s];
    if (k == 0) continue;
    size_t written = 0;
    if (!shards_[s]->SampleUniform(k, rng, scratch.totals[s] / static_cast<double>(drawn_from), sink, filled,
                                   &written)) {
      if (limited) continue;  // other shards may have removed items already: keep what they gave
      for (const auto& [d, c] : scratch.done) shards_[d]->UncountSampled(c);
      return 0;
    }
    scratch.done.emplace_back(s, written);
    filled += written;
  }
  out->size = drawn_from;
  out->total_mass = 0.0;
  out->min_mass = 0.0;
  std::fill(out->probabilities.begin(), out->probabilities.begin() + static_cast<std::ptrdiff_t>(filled),
            1.0 / static_cast<double>(drawn_from));
  std::fill(scratch.masses.begin(), scratch.masses.end(), 0.0);  // weights 1
  return filled;
}

size_t ShardedStore::OrderedPass(size_t n, Rng& rng, SampleResult* out) {
  SampleScratch& scratch = sample_scratch;
  const size_t num_shards = shards_.size();
  const SampleSink sink{out->keys.data(),  scratch.masses.data(), out->probabilities.data(),
                        &out->data,        out->offsets.data(),   out->item_chunk_offsets.data(),
                        &out->item_chunks, &out->chunk_data,      &out->chunk_offsets,
                        scratch.held};
  // The removers' store-wide merge (planner.h): each shard lists the ranks of its first items, the planner
  // gives each shard its count and the rank bound that keeps a shard changed since its summary from handing
  // out other items in their place.
  const EvictionPlanner& planner = OrderedEvictionPlanner();
  const size_t ranks_per_shard = planner.RanksPerShard(n);
  scratch.summaries.resize(num_shards);
  uint64_t items = 0;
  size_t filled = 0, contributing = 0;
  // A shard changed since its summary gives fewer than planned. Without max_times_sampled nothing was removed,
  // so a short batch is drawn again from fresh summaries, a few times; with it, the batch stays short.
  for (int attempt = 0;; ++attempt) {
    items = 0;
    for (size_t s = 0; s < num_shards; ++s) {
      shards_[s]->SummarizeOrder(ranks_per_shard, &scratch.summaries[s]);
      items += scratch.summaries[s].size;
    }
    if (items == 0) return 0;
    planner.Plan(n, scratch.summaries, rng, &scratch.quotas);
    out->data.clear();
    out->item_chunks.clear();
    out->chunk_data.clear();
    out->chunk_offsets.clear();
    scratch.ranks.clear();
    scratch.done.clear();
    filled = contributing = 0;
    size_t planned = 0;
    for (size_t s = 0; s < num_shards; ++s) {
      if (scratch.quotas[s].count == 0) continue;
      planned += scratch.quotas[s].count;
      const size_t written = shards_[s]->SampleOrdered(scratch.quotas[s], sink, filled, &scratch.ranks);
      scratch.done.emplace_back(s, written);
      filled += written;
      contributing += written > 0;
    }
    if (filled == planned || config_.max_times_sampled > 0 || attempt >= 3) break;
    for (const auto& [s, k] : scratch.done) shards_[s]->UncountSampled(k);
  }
  out->size = items;
  out->total_mass = 0.0;
  out->min_mass = 0.0;
  std::fill(out->probabilities.begin(), out->probabilities.begin() + static_cast<std::ptrdiff_t>(filled), 1.0);
  std::fill(scratch.masses.begin(), scratch.masses.end(), 0.0);  // weights 1
  if (contributing > 1) {
    // Each shard wrote its run in order; merge the runs into the store-wide order (ties: lower shard first).
    out->offsets[filled] = out->data.size();
    out->item_chunk_offsets[filled] = out->item_chunks.size();
    scratch.order.resize(filled);
    std::iota(scratch.order.begin(), scratch.order.end(), 0u);
    const uint64_t* ranks = scratch.ranks.data();
    std::stable_sort(scratch.order.begin(), scratch.order.end(),
                     [ranks](uint32_t a, uint32_t b) { return ranks[a] < ranks[b]; });
    PermuteBatch(out, scratch.order);
  }
  return filled;
}

void ShardedStore::GroupByShard(const Key* keys, size_t n, std::vector<uint32_t>* order,
                                std::vector<size_t>* starts) const {
  const size_t num_shards = shards_.size();
  starts->assign(num_shards + 2, 0);
  auto bucket = [num_shards](Key k) {
    const uint32_t s = SplitKey(k).shard;
    return s < num_shards ? s : num_shards;  // unknown shard: its own bucket at the end
  };
  for (size_t i = 0; i < n; ++i) ++(*starts)[bucket(keys[i]) + 1];
  for (size_t b = 1; b < starts->size(); ++b) (*starts)[b] += (*starts)[b - 1];
  order->resize(n);
  std::vector<size_t> cursor(starts->begin(), starts->end() - 1);
  for (size_t i = 0; i < n; ++i) (*order)[cursor[bucket(keys[i])]++] = static_cast<uint32_t>(i);
}

size_t ShardedStore::UpdatePriorities(const Key* keys, const double* priorities, size_t n) {
  if (n == 0) return 0;
  thread_local std::vector<double> masses, group_priorities, group_masses;
  thread_local std::vector<Key> group_keys;
  thread_local std::vector<uint32_t> order;
  thread_local std::vector<size_t> starts;
  masses.resize(n);
  ComputeMasses(priorities, n, masses.data());
  GroupByShard(keys, n, &order, &starts);
  size_t updated = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const size_t b = starts[s], e = starts[s + 1];
    if (b == e) continue;
    group_keys.resize(e - b);
    group_priorities.resize(e - b);
    group_masses.resize(e - b);
    for (size_t i = b; i < e; ++i) {
      group_keys[i - b] = keys[order[i]];
      group_priorities[i - b] = priorities[order[i]];
      group_masses[i - b] = masses[order[i]];
    }
    updated += shards_[s]->Update(group_keys.data(), group_priorities.data(), group_masses.data(), e - b);
  }
  invalid_shard_keys_.fetch_add(n - starts[shards_.size()], std::memory_order_relaxed);
  return updated;
}

size_t ShardedStore::Erase(const Key* keys, size_t n) {
  if (n == 0) return 0;
  std::vector<uint32_t> order;
  std::vector<size_t> starts;
  GroupByShard(keys, n, &order, &starts);
  std::vector<Key> group;
  size_t erased = 0;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const size_t b = starts[s], e = starts[s + 1];
    if (b == e) continue;
    group.resize(e - b);
    for (size_t i = b; i < e; ++i) group[i - b] = keys[order[i]];
    erased += shards_[s]->Erase(group.data(), e - b);
  }
  return erased;
}

size_t ShardedStore::Clear() {
  size_t cleared = 0;
  for (const auto& shard : shards_) cleared += shard->Clear();
  return cleared;
}

size_t ShardedStore::EvictRound(size_t excess, Rng& rng) {
  const size_t num_shards = shards_.size();
  const size_t ranks = planner_->RanksPerShard(excess);
  summaries_.resize(num_shards);
  for (size_t s = 0; s < num_shards; ++s) shards_[s]->Summarize(ranks, &summaries_[s]);
  planner_->Plan(excess, summaries_, rng, &quotas_);
  size_t removed = 0;
  for (size_t s = 0; s < num_shards; ++s) {
    // Erases running meanwhile shrink the excess: never evict below capacity because of them. A shard that
    // gives fewer than its quota (it ran out) leaves the rest to the next round.
    EvictionQuota quota = quotas_[s];
    quota.count = std::min(quota.count, Excess());
    if (quota.count > 0) removed += shards_[s]->Evict(quota, rng);
  }
  return removed;
}

size_t ShardedStore::RemoveToFit() {
  ScopedLock lock(remove_mu_);
  Rng rng(config_.seed ^ kEvictionStream, eviction_calls_.fetch_add(1, std::memory_order_relaxed));
  size_t removed = 0;
  for (;;) {
    const size_t excess = Excess();
    if (excess == 0) break;
    const size_t r = EvictRound(excess, rng);
    if (r == 0) break;
    removed += r;
  }
  return removed;
}

size_t ShardedStore::Excess() const {
  const size_t size = Size();
  return size > config_.capacity ? size - config_.capacity : 0;
}

void ShardedStore::Release(const Key* held, size_t n) {
  std::vector<uint8_t> touched(shards_.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t s = SplitKey(held[i]).shard;
    if (s < shards_.size() && !touched[s]) {
      touched[s] = 1;
      shards_[s]->Release(held, n);  // each shard picks its own keys
    }
  }
}

size_t ShardedStore::GiveBack(const Key* held, size_t n_held, const Key* drawn, size_t n_drawn) {
  std::vector<uint8_t> touched(shards_.size(), 0);
  size_t back = 0;
  for (const auto& [keys, n] : {std::pair{held, n_held}, std::pair{drawn, n_drawn}}) {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t s = SplitKey(keys[i]).shard;
      if (s < shards_.size() && !touched[s]) {
        touched[s] = 1;
        back += shards_[s]->GiveBack(held, n_held, drawn, n_drawn);  // each shard picks its own keys
      }
    }
  }
  return back;
}

size_t ShardedStore::Held() const {
  size_t n = 0;
  for (const auto& shard : shards_) n += shard->held();
  return n;
}

size_t ShardedStore::Size() const {
  size_t n = 0;
  for (const auto& shard : shards_) n += shard->size();
  return n;
}

double ShardedStore::TotalMass() const {
  double t = 0.0;
  for (const auto& shard : shards_) t += shard->total();
  return t;
}

double ShardedStore::MinMass() const {
  double m = kInf;
  for (const auto& shard : shards_) m = std::min(m, shard->min_positive());
  return m < kInf ? m : 0.0;
}

StoreStats ShardedStore::Stats() const {
  StoreStats st;
  for (const auto& shard : shards_) {
    const ShardCounters c = shard->counters();
    st.inserted += c.inserted;
    st.sampled += c.sampled;
    st.updated += c.updated;
    st.stale_updates += c.stale_updates;
    st.evicted += c.evicted;
    st.erased += c.erased;
    st.removed_by_sampling += c.removed_by_sampling;
    st.size += shard->size();
    st.bytes_held += shard->bytes();
    st.chunks += shard->chunks();
    st.chunk_bytes += shard->chunk_bytes();
    st.bytes_reserved += shard->reserved_bytes();
  }
  st.stale_updates += invalid_shard_keys_.load(std::memory_order_relaxed);
  st.sample_calls = sample_calls_.load(std::memory_order_relaxed);
  st.remove_to_fit_calls = eviction_calls_.load(std::memory_order_relaxed);
  return st;
}

void ShardedStore::Validate() const {
  for (const auto& shard : shards_) shard->Validate();
}

void ShardedStore::ReportRemovals(std::vector<Key>* sink) {
  for (const auto& shard : shards_) shard->ReportRemovals(sink);
}

void ShardedStore::Restore(std::vector<RestoredItem> items) {
  if (Size() != 0 || Held() != 0 || next_seq_.load() != 0) throw InvalidArgument("Restore needs a new, empty store");
  std::sort(items.begin(), items.end(), [](const RestoredItem& a, const RestoredItem& b) { return a.seq < b.seq; });
  std::vector<std::vector<RestoredItem>> by_shard(shards_.size());
  uint64_t max_seq = 0;
  for (const RestoredItem& item : items) {
    const uint32_t shard = SplitKey(item.key).shard;
    if (shard >= shards_.size()) {
      throw InvalidArgument("restored key " + std::to_string(item.key) + " names shard " + std::to_string(shard) +
                            "; this store has " + std::to_string(shards_.size()));
    }
    by_shard[shard].push_back(item);
    max_seq = std::max(max_seq, item.seq);
  }
  for (size_t s = 0; s < shards_.size(); ++s) shards_[s]->Restore(by_shard[s].data(), by_shard[s].size());
  next_seq_ = max_seq;
}

bool ShardedStore::Peek(Key key, uint64_t* seq, double* priority, std::string* data) const {
  const uint32_t shard = SplitKey(key).shard;
  return shard < shards_.size() && shards_[shard]->Peek(key, seq, priority, data);
}

std::vector<Shard::Contents> ShardedStore::Dump() const {
  std::vector<Shard::Contents> out;
  for (const auto& shard : shards_) out.push_back(shard->Dump());
  return out;
}

// Snapshot layout, version 5 (little-endian; CRC-32C of every preceding byte at the end):
//   "APXRLST1" | u32 version | u32 epoch | u64 capacity | u64 max_size | f64 alpha | u32 shards | u32 eviction
//   | f64 alpha_evict | u64 seed | u32 sampler | u32 max_times_sampled | shards x Shard block (shard.cc) | u64 next_seq
//   | u64 next_shard | u64 sample_calls | u64 eviction_calls | u64 invalid_shard_keys | "APXRLEND" | u32 crc32c
// Shards are captured one at a time, each under its own lock for the copy of its block only: inserts and
// samples go on meanwhile, and every item acknowledged before Save() began is in the file unless it was
// removed before its shard was copied. Versions 2 and 3 have no sampler and max_times_sampled (read as
// prioritized and 0).
void ShardedStore::Save(const std::string& path) const {
  SnapshotWriter out(path);
  out.Write(kMagic, sizeof(kMagic));
  out.Put<uint32_t>(kSnapshotVersion);
  out.Put<uint32_t>(config_.epoch);
  out.Put<uint64_t>(config_.capacity);
  out.Put<uint64_t>(config_.max_size);
  out.Put<double>(config_.alpha);
  out.Put<uint32_t>(config_.shards);
  out.Put<uint32_t>(static_cast<uint32_t>(config_.eviction));
  out.Put<double>(config_.alpha_evict);
  out.Put<uint64_t>(config_.seed);
  out.Put<uint32_t>(static_cast<uint32_t>(config_.sampler));
  out.Put<uint32_t>(config_.max_times_sampled);
  for (const auto& shard : shards_) shard->Write(out);
  out.Put<uint64_t>(next_seq_.load());  // read after the shards: not below any insertion number written
  out.Put<uint64_t>(next_shard_.load());
  out.Put<uint64_t>(sample_calls_.load());
  out.Put<uint64_t>(eviction_calls_.load());
  out.Put<uint64_t>(invalid_shard_keys_.load());
  out.Write(kEndMagic, sizeof(kEndMagic));
  out.Commit();
}

namespace {

// Reads the magic and version; returns the saved epoch (and the version through `version`).
uint32_t ReadHeader(SnapshotReader& in, uint32_t* version_out = nullptr) {
  char magic[8];
  if (in.remaining() < sizeof(magic)) in.Fail("too short to be an apexrl store snapshot");
  in.Read(magic, sizeof(magic));
  if (std::memcmp(magic, kMagic, sizeof(magic)) != 0) in.Fail("not an apexrl store snapshot (bad magic)");
  const uint32_t version = in.Get<uint32_t>();
  if (version < kOldestReadableVersion || version > kSnapshotVersion) {
    in.Fail("snapshot format version " + std::to_string(version) + "; this build reads versions " +
            std::to_string(kOldestReadableVersion) + " to " + std::to_string(kSnapshotVersion) +
            (version < kOldestReadableVersion ? " (older snapshots have keys without an epoch and cannot be restored)"
                                              : " (written by a newer apexrl)"));
  }
  if (version_out != nullptr) *version_out = version;
  const uint32_t epoch = in.Get<uint32_t>();
  if (epoch < 1 || epoch > kMaxEpoch) in.Fail("bad epoch " + std::to_string(epoch));
  return epoch;
}

}  // namespace

uint32_t ShardedStore::SnapshotEpoch(const std::string& path) {
  SnapshotReader in(path);
  return ReadHeader(in);
}

uint32_t ShardedStore::SnapshotVersion(const std::string& path) {
  SnapshotReader in(path);
  uint32_t version = 0;
  ReadHeader(in, &version);
  return version;
}

std::unique_ptr<ShardedStore> ShardedStore::Load(const std::string& path) {
  return Load(path, NextEpoch(SnapshotEpoch(path)));
}

std::unique_ptr<ShardedStore> ShardedStore::Load(const std::string& path, uint32_t epoch) {
  SnapshotReader in(path);
  uint32_t version = 0;
  const uint32_t saved_epoch = ReadHeader(in, &version);
  if (epoch < 1 || epoch > kMaxEpoch) {
    throw InvalidArgument("epoch must be in [1, " + std::to_string(kMaxEpoch) + "], got " + std::to_string(epoch));
  }
  if (epoch == saved_epoch) {
    throw InvalidArgument("epoch " + std::to_string(epoch) + " is the one snapshot '" + path +
                          "' was saved under: keys the saved store issued after the save could address restored "
                          "slots; restore with another epoch");
  }
  StoreConfig config;
  config.epoch = epoch;
  config.capacity = in.Get<uint64_t>();
  config.max_size = in.Get<uint64_t>();
  config.alpha = in.Get<double>();
  config.shards = in.Get<uint32_t>();
  config.eviction = static_cast<EvictionKind>(in.Get<uint32_t>());
  config.alpha_evict = in.Get<double>();
  config.seed = in.Get<uint64_t>();
  if (version >= 4) {
    config.sampler = static_cast<SamplerKind>(in.Get<uint32_t>());
    config.max_times_sampled = in.Get<uint32_t>();
  }
  if (config.max_size == 0) in.Fail("bad max_size 0");
  std::unique_ptr<ShardedStore> store;
  try {
    store = std::make_unique<ShardedStore>(config);
  } catch (const InvalidArgument& e) {
    in.Fail(std::string("bad configuration: ") + e.what());
  }
  uint64_t max_seq = 0;
  for (const auto& shard : store->shards_) {
    shard->Read(in, version);
    max_seq = std::max(max_seq, shard->max_seq());
  }
  store->next_seq_ = std::max(in.Get<uint64_t>(), max_seq);
  store->next_shard_ = in.Get<uint64_t>();
  store->sample_calls_ = in.Get<uint64_t>();
  store->eviction_calls_ = in.Get<uint64_t>();
  store->invalid_shard_keys_ = in.Get<uint64_t>();
  char end[8];
  in.Read(end, sizeof(end));
  if (std::memcmp(end, kEndMagic, sizeof(end)) != 0) in.Fail("end marker missing");
  in.VerifyChecksum();
  return store;
}

}  // namespace apexrl
