// SliceTable: episodes stored once (their step chunks), windows of steps chosen at sample time -- uniformly or
// by priority over the windows' start steps.
#ifndef APEXRL_SLICES_SLICE_TABLE_H_
#define APEXRL_SLICES_SLICE_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "apexrl/mutex.h"
#include "apexrl/random.h"
#include "apexrl/sum_tree.h"
#include "apexrl/thread_annotations.h"

namespace apexrl {

// How a SliceTable draws its windows' starts.
enum class SliceSampling : uint32_t {
  kPrioritized = 0,  // P(window) ~ its mass (see "Window mass"), with replacement, stratified
  kUniform = 1,      // every valid start equally likely, with replacement
};

struct SliceConfig {
  uint64_t capacity_steps = 1'000'000;  // hard: an insert evicts the oldest episodes (FIFO) to fit its steps
  uint32_t length = 1;                  // L: the trained steps of a window, >= 1
  uint32_t burn_in = 0;                 // B: steps before them, returned but not trained
  SliceSampling sampler = SliceSampling::kPrioritized;
  double alpha = 0.6;  // a window's mass is its priority ^ alpha
  double eta = 0.9;    // its priority: eta * max + (1 - eta) * mean of its trained steps' priorities (R2D2)
  // TorchRL's SliceSampler options (their defaults): strict_length drops episodes shorter than B + L steps;
  // span (0..L-1) lets a window run past its episode's end as long as it keeps L - span trained steps.
  bool strict_length = true;
  uint32_t span = 0;
  uint64_t seed = 0;
};

// One sampled batch of n windows. Window i covers steps [start, start + rows[i]) of its episode (rows <= B + L;
// the B + L - rows steps past the episode's end are padding, masked out by the decoder). Its steps lie in the
// chunks window_chunks[window_chunk_offsets[i] .. window_chunk_offsets[i + 1]) (indices into this batch's
// chunks, in step order), starting at step `first[i]` of their concatenation.
struct SliceSample {
  std::vector<uint64_t> keys;  // (episode number << kSliceStartBits) | start
  std::vector<double> probabilities;
  std::vector<float> weights;  // importance weights in (0, 1]: (mass / min_mass) ^ -beta; 1 when uniform
  std::vector<uint32_t> rows;
  std::vector<uint64_t> first;
  std::vector<uint64_t> fingerprints;  // of each window's episode (its chunks' structure)
  std::vector<uint64_t> window_chunk_offsets;
  std::vector<uint64_t> window_chunks;
  // Per batch chunk, each chunk the batch references once: its bytes where the table holds them (read in place,
  // not copied: `held` keeps them alive past the episode's eviction), its steps, and where each field's column
  // lies in it (num_fields x (offset from the chunk's start, stored, codec), StepColumn's layout): what
  // DecodeSlices needs, no header parsed.
  std::vector<const uint8_t*> chunk_bases;
  std::vector<uint64_t> chunk_sizes;
  std::vector<uint64_t> chunk_steps;
  std::vector<uint64_t> columns;
  uint64_t num_fields = 0;
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> held;
  // Only when Sample is asked to copy: the chunks' bytes back to back (chunk c at chunk_offsets[c]), for a decoder
  // that reads headers (the reference).
  std::vector<uint8_t> chunk_data;
  std::vector<uint64_t> chunk_offsets;
  double total_mass = 0.0;  // the masses the draws were made from (0 in the uniform fallback and sampler)
  double min_mass = 0.0;
  uint64_t windows = 0;  // valid starts when sampled
};

struct SliceStats {
  uint64_t episodes = 0;
  uint64_t steps = 0;
  uint64_t windows = 0;         // valid starts
  uint64_t chunk_bytes = 0;     // the episodes' chunk bytes, each stored once
  uint64_t metadata_bytes = 0;  // per-step priorities, the sum tree over the steps, the chunks' index
  double total_mass = 0.0;
  double min_mass = 0.0;
  uint64_t inserted_episodes = 0;
  uint64_t evicted_episodes = 0;
  uint64_t sampled = 0;
  uint64_t updated = 0;
  uint64_t stale_updates = 0;
};

// A window's key: its episode's number (below 2^40) above its start step (below 2^24).
inline constexpr uint32_t kSliceStartBits = 24;
inline constexpr uint64_t kMaxEpisodeSteps = (uint64_t{1} << kSliceStartBits) - 1;

// Semantics (the Python API, apexrl.replay.slices, documents them for users):
//  * Episodes: an insert stores one episode's step chunks (bytes, each holding a run of its steps, in order) and
//    a priority per step; its steps are numbered 0..n-1. Each episode gets the next episode number (0, 1, ...).
//    The table holds at most capacity_steps steps: an insert first evicts the oldest episodes until its steps fit
//    (an episode longer than the capacity is refused).
//  * Windows: W = B + L steps from a start t: steps [t, t + B) are burn-in, [t + B, t + B + L) trained. Valid
//    starts of an episode of n steps: t in [0, e(n)) with
//        e(n) = 0                                          if strict_length and n < W
//        e(n) = max(0, min(n - B, max(1, n - W + 1 + span)))   otherwise.
//    So a window never crosses episodes, always holds at least one trained step, holds all of its W steps unless
//    span > 0 or (strict_length false) its episode is shorter than W; its burn-in always lies inside the episode
//    (an episode's first B steps are burn-in only, as in R2D2's stored sequences).
//  * Window mass (prioritized): m(t) = (eta * max_j p_j + (1 - eta) * mean_j p_j) ^ alpha over its trained steps
//    j in [t + B, min(t + B + L, n)). Uniform: m(t) = 1. P(t) = m(t) / sum of m over every valid start.
//    If every mass is 0 the prioritized table draws uniformly (probability 1 / windows, weights 1, total 0).
//  * Priority updates address windows by key: window i's value (one per window) or its L values (one per trained
//    step; those past its episode's end ignored) are written to its trained steps, in key order (a later key's
//    value wins a step two keys share), and every window whose trained steps overlap them gets its mass again.
//    A key whose episode was evicted, or whose start is not valid, is skipped and counted stale.
//  * New steps without priorities get the largest priority ever set (1 before any), as TorchRL's samplers do.
//
// Thread-safety: every method takes the table's mutex; a sample shares its chunks' bytes, which never change.
// Errors: invalid input throws InvalidArgument and changes nothing.
class SliceTable {
 public:
  explicit SliceTable(const SliceConfig& config);

  const SliceConfig& config() const { return config_; }

  // Stores one episode: chunk c is sizes[c] bytes at data[c] holding steps[c] >= 1 steps (sum n, 1..capacity and
  // below 2^24); `priorities` n values (finite, >= 0, mass <= kMaxMass) or null. `columns`: per chunk, num_fields
  // x (offset in the chunk, stored bytes, codec) of its field columns (every episode the same num_fields >= 1;
  // each column inside its chunk, codec raw or lz4). Returns its episode number.
  uint64_t Insert(uint64_t fingerprint, const uint8_t* const* data, const uint64_t* sizes, const uint64_t* steps,
                  size_t num_chunks, const double* priorities, const uint64_t* columns, size_t num_fields)
      EXCLUDES(mu_);
  // 1 <= n <= kMaxBatchItems windows, beta >= 0. EmptyStore when no window can be drawn. copy_chunks: also
  // copy the chunks' bytes into out->chunk_data.
  void Sample(size_t n, double beta, SliceSample* out, bool copy_chunks = false) EXCLUDES(mu_);
  // `values`: n (one per window, per_step false) or n * L (per_step true). Returns how many keys were live.
  size_t Update(const uint64_t* keys, size_t n, const double* values, bool per_step) EXCLUDES(mu_);

  // Snapshots. Save writes every episode held now (its chunks, their columns, its step priorities), the next
  // episode number and the largest priority to `path`, checksummed and published atomically (SnapshotWriter); the
  // table's lock is held only while the episodes' shared bytes and priorities are taken, not while writing.
  // Returns the episodes written. Load fills a new table (one that never held an episode; InvalidArgument otherwise)
  // from such a file: every episode checked as an insert is, then stored in order under its saved number (a window key
  // sampled before the save addresses the same steps after the load), its windows and masses those of this table's
  // configuration (length, burn-in, span, sampler may differ from the saving table's: windows are chosen at sample
  // time); episodes beyond this table's capacity are evicted oldest first, as inserts would. A truncated, corrupted or
  // foreign file throws SnapshotError and changes nothing. Returns the episodes loaded (held after eviction).
  size_t Save(const std::string& path) const EXCLUDES(mu_);
  size_t Load(const std::string& path) EXCLUDES(mu_);

  // Drops every episode (RESET): steps, windows, bytes and the largest priority (back to 1) go, the counters
  // stay, and episode numbers go on from where they were (so keys sampled before stay stale). Returns how many
  // episodes were dropped. The structure (field count) is free again for the next episode.
  size_t Clear() EXCLUDES(mu_);
  // Valid starts held now (what a sample draws from; a server's MinSize counts them).
  uint64_t NumWindows() const EXCLUDES(mu_);

  SliceStats Stats() const EXCLUDES(mu_);
  // Every valid window (key and mass), oldest episode first, starts ascending (tests and Validate).
  void Windows(std::vector<uint64_t>* keys, std::vector<double>* masses) const EXCLUDES(mu_);
  // The step priorities of an episode held now (InvalidArgument if it is not).
  std::vector<double> StepPriorities(uint64_t episode) const EXCLUDES(mu_);
  // Throws std::logic_error at the first broken invariant (tests).
  void Validate() const EXCLUDES(mu_);

 private:
  struct Episode {
    uint64_t number = 0;
    uint64_t first_step = 0;  // its step 0's absolute step number (ring position: mod capacity)
    uint32_t steps = 0;
    uint32_t starts = 0;  // e(n)
    uint64_t fingerprint = 0;
    std::shared_ptr<const std::vector<uint8_t>> data;  // its chunks' bytes, back to back (samples share them)
    std::vector<uint64_t> chunk_offsets;               // chunks + 1 offsets into data
    std::vector<uint64_t> chunk_steps;                 // chunks + 1: the first step of each chunk, then n
    std::vector<uint64_t> columns;                     // chunks x num_fields x (offset in its chunk, stored, codec)
  };

  uint32_t ValidStarts(uint64_t n) const;
  // An episode from an insert's arguments, every argument checked (InvalidArgument); number and first_step unset.
  Episode Build(uint64_t fingerprint, const uint8_t* const* data, const uint64_t* sizes, const uint64_t* steps,
                size_t num_chunks, const double* priorities, const uint64_t* columns, size_t num_fields) const;
  // Stores a built episode as number `number` (evicting the oldest to fit), its step priorities from
  // `priorities` (null: the largest so far).
  void Store(Episode&& e, uint64_t number, const double* priorities, size_t num_fields) REQUIRES(mu_);
  static uint64_t IndexBytes(const Episode& e) {
    return (e.chunk_offsets.size() + e.chunk_steps.size() + e.columns.size()) * sizeof(uint64_t);
  }
  size_t Pos(uint64_t abs_step) const { return static_cast<size_t>(abs_step % config_.capacity_steps); }
  double Mass(const Episode& e, uint32_t t) const REQUIRES(mu_);
  // Recomputes the tree leaves of starts [lo, hi) of `e`.
  void SetMasses(const Episode& e, uint32_t lo, uint32_t hi) REQUIRES(mu_);
  void EvictOldest() REQUIRES(mu_);
  const Episode* Find(uint64_t number) const REQUIRES(mu_);
  // The episode holding absolute step `abs` (a live step).
  const Episode& EpisodeAt(uint64_t abs) const REQUIRES(mu_);
  void AddWindow(const Episode& e, uint32_t t, bool copy_chunks, SliceSample* out) REQUIRES(mu_);
  void CheckPriority(double p, const char* what, size_t i) const;

  const SliceConfig config_;
  mutable Mutex mu_;
  std::deque<Episode> episodes_ GUARDED_BY(mu_);
  uint64_t next_episode_ GUARDED_BY(mu_) = 0;
  uint64_t next_step_ GUARDED_BY(mu_) = 0;  // absolute step number of the next step stored
  uint64_t steps_held_ GUARDED_BY(mu_) = 0;
  uint64_t windows_ GUARDED_BY(mu_) = 0;
  uint64_t chunk_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t index_bytes_ GUARDED_BY(mu_) = 0;  // the episodes' chunk offsets, steps and columns
  uint64_t num_fields_ GUARDED_BY(mu_) = 0;   // the first episode's; 0 before any
  double max_priority_ GUARDED_BY(mu_) = 1.0;
  std::vector<double> priorities_ GUARDED_BY(mu_);  // by ring position
  SumMinTree tree_ GUARDED_BY(mu_);                 // leaf = ring position of a start step
  uint64_t sample_calls_ GUARDED_BY(mu_) = 0;
  SliceStats counters_ GUARDED_BY(mu_);
  // Sample scratch: (episode number, chunk index) -> batch chunk index.
  std::unordered_map<uint64_t, uint64_t> batch_chunks_ GUARDED_BY(mu_);
  std::vector<uint32_t> scratch_leaves_ GUARDED_BY(mu_);
  std::vector<double> scratch_masses_ GUARDED_BY(mu_);
};

}  // namespace apexrl

#endif  // APEXRL_SLICES_SLICE_TABLE_H_
