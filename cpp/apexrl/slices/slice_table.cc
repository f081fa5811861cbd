#include "apexrl/slices/slice_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "apexrl/common.h"
#include "apexrl/errors.h"
#include "apexrl/snapshot_io.h"

namespace apexrl {

SliceTable::SliceTable(const SliceConfig& config) : config_(config) {
  const auto bad = [](const std::string& what) { throw InvalidArgument("slice table: " + what); };
  if (config.capacity_steps < 1 || config.capacity_steps > (uint64_t{1} << 40)) {
    bad("capacity_steps must be in [1, 2^40], got " + std::to_string(config.capacity_steps));
  }
  if (config.length < 1 || config.length > kMaxEpisodeSteps) bad("length must be in [1, 2^24)");
  if (config.burn_in > kMaxEpisodeSteps - config.length) bad("burn_in + length must be below 2^24");
  if (config.sampler != SliceSampling::kPrioritized && config.sampler != SliceSampling::kUniform) {
    bad("unknown sampler");
  }
  if (!std::isfinite(config.alpha) || config.alpha < 0.0) bad("alpha must be finite and >= 0");
  if (!(config.eta >= 0.0 && config.eta <= 1.0)) bad("eta must be in [0, 1]");
  if (config.span >= config.length) {
    bad("span must be below length (" + std::to_string(config.length) + "), got " + std::to_string(config.span));
  }
}

uint32_t SliceTable::ValidStarts(uint64_t n) const {
  const uint64_t w = uint64_t{config_.burn_in} + config_.length;
  if (n <= config_.burn_in || (config_.strict_length && n < w)) return 0;
  // Starts whose window keeps at least L - span trained steps: t <= n - W + span.
  const uint64_t fit = n + 1 + config_.span > w ? n + 1 + config_.span - w : 0;
  return static_cast<uint32_t>(std::min<uint64_t>(n - config_.burn_in, std::max<uint64_t>(fit, 1)));
}

void SliceTable::CheckPriority(double p, const char* what, size_t i) const {
  if (!std::isfinite(p) || p < 0.0) {
    throw InvalidArgument(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(p) +
                          ": priorities must be finite and >= 0");
  }
  if (config_.sampler == SliceSampling::kPrioritized && std::pow(p, config_.alpha) > kMaxMass) {
    throw InvalidArgument(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(p) +
                          ": its mass p^alpha exceeds 1e250");
  }
}

double SliceTable::Mass(const Episode& e, uint32_t t) const {
  if (config_.sampler == SliceSampling::kUniform) return 1.0;
  const uint64_t a = uint64_t{t} + config_.burn_in;
  const uint64_t b = std::min<uint64_t>(a + config_.length, e.steps);
  double hi = 0.0, sum = 0.0;
  for (uint64_t j = a; j < b; ++j) {
    const double p = priorities_[Pos(e.first_step + j)];
    hi = std::max(hi, p);
    sum += p;
  }
  const double priority = config_.eta * hi + (1.0 - config_.eta) * (sum / static_cast<double>(b - a));
  return std::pow(priority, config_.alpha);
}

void SliceTable::SetMasses(const Episode& e, uint32_t lo, uint32_t hi) {
  for (uint32_t t = lo; t < hi; ++t) tree_.Set(Pos(e.first_step + t), Mass(e, t));
}

void SliceTable::EvictOldest() {
  const Episode& e = episodes_.front();
  for (uint32_t t = 0; t < e.starts; ++t) tree_.Set(Pos(e.first_step + t), 0.0);
  steps_held_ -= e.steps;
  windows_ -= e.starts;
  chunk_bytes_ -= e.data->size();
  index_bytes_ -= IndexBytes(e);
  ++counters_.evicted_episodes;
  episodes_.pop_front();
}

SliceTable::Episode SliceTable::Build(uint64_t fingerprint, const uint8_t* const* data, const uint64_t* sizes,
                                      const uint64_t* steps, size_t num_chunks, const double* priorities,
                                      const uint64_t* columns, size_t num_fields) const {
  if (num_chunks == 0) throw InvalidArgument("an episode needs at least one chunk");
  if (num_fields == 0 || num_fields > (size_t{1} << 16)) throw InvalidArgument("an episode needs 1..65536 fields");
  for (size_t c = 0; c < num_chunks; ++c) {
    for (size_t f = 0; f < num_fields; ++f) {
      const uint64_t* col = columns + 3 * (c * num_fields + f);
      if (col[0] > sizes[c] || col[1] > sizes[c] - col[0] || col[2] > 1) {
        throw InvalidArgument("chunk " + std::to_string(c) + ", field " + std::to_string(f) +
                              ": its column lies outside the chunk or has an unknown codec");
      }
    }
  }
  uint64_t n = 0, bytes = 0;
  for (size_t c = 0; c < num_chunks; ++c) {
    if (steps[c] < 1 || steps[c] > kMaxEpisodeSteps) {
      throw InvalidArgument("chunk " + std::to_string(c) + ": steps must be in [1, 2^24), got " +
                            std::to_string(steps[c]));
    }
    n += steps[c];
    bytes += sizes[c];
  }
  if (n > kMaxEpisodeSteps) throw InvalidArgument("an episode holds below 2^24 steps, got " + std::to_string(n));
  if (n > config_.capacity_steps) {
    throw InvalidArgument("an episode of " + std::to_string(n) + " steps does not fit in a table of " +
                          std::to_string(config_.capacity_steps));
  }
  if (priorities != nullptr) {
    for (uint64_t j = 0; j < n; ++j) CheckPriority(priorities[j], "priorities", j);
  }
  Episode e;
  e.steps = static_cast<uint32_t>(n);
  e.starts = ValidStarts(n);
  e.fingerprint = fingerprint;
  auto bytes_of = std::make_shared<std::vector<uint8_t>>(bytes);
  e.chunk_offsets.reserve(num_chunks + 1);
  e.chunk_steps.reserve(num_chunks + 1);
  uint64_t at = 0, step = 0;
  for (size_t c = 0; c < num_chunks; ++c) {
    e.chunk_offsets.push_back(at);
    e.chunk_steps.push_back(step);
    if (sizes[c] > 0) std::memcpy(bytes_of->data() + at, data[c], sizes[c]);
    at += sizes[c];
    step += steps[c];
  }
  e.chunk_offsets.push_back(at);
  e.chunk_steps.push_back(step);
  e.columns.assign(columns, columns + 3 * num_chunks * num_fields);
  e.data = std::move(bytes_of);
  return e;
}

void SliceTable::Store(Episode&& e, uint64_t number, const double* priorities, size_t num_fields) {
  num_fields_ = num_fields;
  const uint64_t n = e.steps;
  while (steps_held_ + n > config_.capacity_steps) EvictOldest();
  e.number = number;
  next_episode_ = number + 1;
  e.first_step = next_step_;
  next_step_ += n;
  const size_t used = static_cast<size_t>(std::min<uint64_t>(next_step_, config_.capacity_steps));
  if (priorities_.size() < used) {  // grow with the steps held, doubling, up to the capacity
    const size_t grown = static_cast<size_t>(
        std::min<uint64_t>(config_.capacity_steps, std::max<uint64_t>(used, 2 * uint64_t{priorities_.size()})));
    priorities_.resize(grown, 0.0);
    tree_.Grow(grown);
  }
  double top = max_priority_;
  for (uint64_t j = 0; j < n; ++j) {
    const double p = priorities != nullptr ? priorities[j] : max_priority_;
    priorities_[Pos(e.first_step + j)] = p;
    top = std::max(top, p);
  }
  max_priority_ = top;
  steps_held_ += n;
  windows_ += e.starts;
  chunk_bytes_ += e.data->size();
  index_bytes_ += IndexBytes(e);
  episodes_.push_back(std::move(e));
  const Episode& stored = episodes_.back();
  SetMasses(stored, 0, stored.starts);
}

uint64_t SliceTable::Insert(uint64_t fingerprint, const uint8_t* const* data, const uint64_t* sizes,
                            const uint64_t* steps, size_t num_chunks, const double* priorities, const uint64_t* columns,
                            size_t num_fields) {
  Episode e = Build(fingerprint, data, sizes, steps, num_chunks, priorities, columns, num_fields);
  ScopedLock<Mutex> lock(mu_);
  if (num_fields_ != 0 && num_fields != num_fields_) {
    throw InvalidArgument("an episode of " + std::to_string(num_fields) + " fields in a table of " +
                          std::to_string(num_fields_));
  }
  const uint64_t number = next_episode_;
  Store(std::move(e), number, priorities, num_fields);
  ++counters_.inserted_episodes;
  return number;
}

// Snapshot layout, version 1 (little-endian; CRC-32C of every preceding byte at the end, SnapshotWriter's):
//   "APXSLICE" | u32 version | u64 next episode | f64 largest priority | u64 fields | u64 episodes
//   per episode: u64 number | u64 fingerprint | u64 chunks | chunks x (u64 bytes, u64 steps)
//                | chunks x fields x 3 u64 columns | the chunks' bytes | steps x f64 priorities
//   "APXSLEND" | u32 crc
namespace {
constexpr char kSliceMagic[8] = {'A', 'P', 'X', 'S', 'L', 'I', 'C', 'E'};
constexpr char kSliceEndMagic[8] = {'A', 'P', 'X', 'S', 'L', 'E', 'N', 'D'};
constexpr uint32_t kSliceSnapshotVersion = 1;
}  // namespace

size_t SliceTable::Save(const std::string& path) const {
  struct Saved {
    Episode episode;  // a copy: its chunks' bytes shared, never changed
    std::vector<double> priorities;
  };
  std::vector<Saved> saved;
  uint64_t next_episode = 0, num_fields = 0;
  double max_priority = 1.0;
  {
    // Under the lock only what changes: the step priorities are copied, the chunks' bytes shared (immutable).
    ScopedLock<Mutex> lock(mu_);
    next_episode = next_episode_;
    max_priority = max_priority_;
    num_fields = num_fields_;
    saved.reserve(episodes_.size());
    for (const Episode& e : episodes_) {
      Saved s{e, {}};
      s.priorities.resize(e.steps);
      for (uint32_t j = 0; j < e.steps; ++j) s.priorities[j] = priorities_[Pos(e.first_step + j)];
      saved.push_back(std::move(s));
    }
  }
  SnapshotWriter out(path);
  out.Write(kSliceMagic, sizeof(kSliceMagic));
  out.Put<uint32_t>(kSliceSnapshotVersion);
  out.Put<uint64_t>(next_episode);
  out.Put<double>(max_priority);
  out.Put<uint64_t>(num_fields);
  out.Put<uint64_t>(saved.size());
  for (const auto& [e, priorities] : saved) {
    const size_t chunks = e.chunk_offsets.size() - 1;
    out.Put<uint64_t>(e.number);
    out.Put<uint64_t>(e.fingerprint);
    out.Put<uint64_t>(chunks);
    for (size_t c = 0; c < chunks; ++c) {
      out.Put<uint64_t>(e.chunk_offsets[c + 1] - e.chunk_offsets[c]);
      out.Put<uint64_t>(e.chunk_steps[c + 1] - e.chunk_steps[c]);
    }
    out.Write(e.columns.data(), e.columns.size() * sizeof(uint64_t));
    out.Write(e.data->data(), e.data->size());
    out.Write(priorities.data(), priorities.size() * sizeof(double));
  }
  out.Write(kSliceEndMagic, sizeof(kSliceEndMagic));
  out.Commit();
  return saved.size();
}

size_t SliceTable::Load(const std::string& path) {
  // A table that never held an episode: loaded numbers then never meet keys this table gave out.
  const char* const not_new = "slice table: Load needs a new table (one that never held an episode)";
  {
    ScopedLock<Mutex> lock(mu_);
    if (!episodes_.empty() || next_episode_ != 0) throw InvalidArgument(not_new);
  }
  SnapshotReader in(path);
  char magic[8];
  in.Read(magic, sizeof(magic));
  if (std::memcmp(magic, kSliceMagic, sizeof(magic)) != 0) in.Fail("not an apexrl slices snapshot (bad magic)");
  const uint32_t version = in.Get<uint32_t>();
  if (version != kSliceSnapshotVersion) {
    in.Fail("slices snapshot format version " + std::to_string(version) + "; this build reads version " +
            std::to_string(kSliceSnapshotVersion));
  }
  const uint64_t next_episode = in.Get<uint64_t>();
  const double max_priority = in.Get<double>();
  const uint64_t num_fields = in.Get<uint64_t>();
  const uint64_t count = in.Get<uint64_t>();
  if (!std::isfinite(max_priority) || max_priority < 0.0) in.Fail("the largest priority is not finite and >= 0");
  if (count > 0 && (num_fields == 0 || num_fields > (uint64_t{1} << 16))) in.Fail("fields must be in 1..65536");
  // Every episode takes at least 3 u64 and a chunk: a count the file cannot hold is refused before allocating.
  if (count > in.remaining() / (5 * sizeof(uint64_t))) in.Fail("more episodes than the file can hold");
  if (next_episode >= (uint64_t{1} << 40)) in.Fail("episode numbers must be below 2^40");
  struct Loaded {
    uint64_t number;
    Episode episode;
    std::vector<double> priorities;
  };
  std::vector<Loaded> loaded;
  loaded.reserve(static_cast<size_t>(count));
  std::vector<uint64_t> sizes, steps, columns;
  std::vector<uint8_t> bytes;
  std::vector<const uint8_t*> data;
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t number = in.Get<uint64_t>();
    const uint64_t fingerprint = in.Get<uint64_t>();
    const uint64_t chunks = in.Get<uint64_t>();
    if (number >= next_episode || (k > 0 && number != loaded.back().number + 1)) {
      in.Fail("episode numbers must be consecutive and below the next episode's");
    }
    if (chunks == 0 || chunks > in.remaining() / (2 * sizeof(uint64_t))) in.Fail("a chunk count the file cannot hold");
    sizes.resize(static_cast<size_t>(chunks));
    steps.resize(static_cast<size_t>(chunks));
    uint64_t total_bytes = 0, total_steps = 0;
    for (size_t c = 0; c < chunks; ++c) {
      sizes[c] = in.Get<uint64_t>();
      steps[c] = in.Get<uint64_t>();
      if (sizes[c] > in.remaining() || steps[c] > kMaxEpisodeSteps) in.Fail("a chunk larger than the file");
      total_bytes += sizes[c];
      total_steps += steps[c];
      if (total_bytes > in.remaining() || total_steps > kMaxEpisodeSteps) in.Fail("an episode larger than the file");
    }
    if (chunks * num_fields * 3 > in.remaining() / sizeof(uint64_t)) in.Fail("columns larger than the file");
    columns.resize(static_cast<size_t>(chunks * num_fields * 3));
    in.Read(columns.data(), columns.size() * sizeof(uint64_t));
    bytes.resize(static_cast<size_t>(total_bytes));
    in.Read(bytes.data(), bytes.size());
    if (total_steps > in.remaining() / sizeof(double)) in.Fail("priorities larger than the file");
    std::vector<double> priorities(static_cast<size_t>(total_steps));
    in.Read(priorities.data(), priorities.size() * sizeof(double));
    data.resize(static_cast<size_t>(chunks));
    uint64_t at = 0;
    for (size_t c = 0; c < chunks; ++c) {
      data[c] = bytes.data() + at;
      at += sizes[c];
    }
    try {
      Episode e = Build(fingerprint, data.data(), sizes.data(), steps.data(), static_cast<size_t>(chunks),
                        priorities.data(), columns.data(), static_cast<size_t>(num_fields));
      loaded.push_back(Loaded{number, std::move(e), std::move(priorities)});
    } catch (const InvalidArgument& err) {
      in.Fail("episode " + std::to_string(number) + ": " + err.what());
    }
  }
  // Inserts number episodes consecutively and evict the oldest: the newest one held is the last numbered.
  if (!loaded.empty() && loaded.back().number + 1 != next_episode) in.Fail("the newest episode is not the last");
  char end[8];
  in.Read(end, sizeof(end));
  if (std::memcmp(end, kSliceEndMagic, sizeof(end)) != 0) in.Fail("bad end marker");
  in.VerifyChecksum();

  ScopedLock<Mutex> lock(mu_);
  if (!episodes_.empty() || next_episode_ != 0) throw InvalidArgument(not_new);
  for (Loaded& l : loaded) Store(std::move(l.episode), l.number, l.priorities.data(), static_cast<size_t>(num_fields));
  next_episode_ = next_episode;
  max_priority_ = std::max(max_priority_, max_priority);
  return episodes_.size();
}

const SliceTable::Episode* SliceTable::Find(uint64_t number) const {
  if (episodes_.empty() || number < episodes_.front().number || number >= next_episode_) return nullptr;
  return &episodes_[static_cast<size_t>(number - episodes_.front().number)];
}

const SliceTable::Episode& SliceTable::EpisodeAt(uint64_t abs) const {
  // Episodes are stored back to back in insertion order: the last one starting at or before `abs`.
  auto it = std::upper_bound(episodes_.begin(), episodes_.end(), abs,
                             [](uint64_t s, const Episode& e) { return s < e.first_step; });
  return *std::prev(it);
}

void SliceTable::AddWindow(const Episode& e, uint32_t t, bool copy_chunks, SliceSample* out) {
  const uint64_t w = uint64_t{config_.burn_in} + config_.length;
  const uint32_t rows = static_cast<uint32_t>(std::min<uint64_t>(w, e.steps - t));
  // The chunks holding steps [t, t + rows): from the one holding t to the one holding the last.
  const auto& cs = e.chunk_steps;
  const size_t c0 = static_cast<size_t>(std::upper_bound(cs.begin(), cs.end(), uint64_t{t}) - cs.begin()) - 1;
  const size_t c1 =
      static_cast<size_t>(std::upper_bound(cs.begin(), cs.end(), uint64_t{t} + rows - 1) - cs.begin()) - 1;
  out->rows.push_back(rows);
  out->first.push_back(t - cs[c0]);
  out->fingerprints.push_back(e.fingerprint);
  for (size_t c = c0; c <= c1; ++c) {
    // Chunk ids of one batch: the episode number's low 40 bits and the chunk's index (below 2^24).
    const uint64_t id = (e.number << kSliceStartBits) | c;
    const auto [it, added] = batch_chunks_.try_emplace(id, batch_chunks_.size());
    const uint64_t index = it->second;
    if (added) {
      const uint64_t lo = e.chunk_offsets[c], hi = e.chunk_offsets[c + 1];
      if (out->held.empty() || out->held.back() != e.data) out->held.push_back(e.data);
      out->chunk_bases.push_back(e.data->data() + lo);
      out->chunk_sizes.push_back(hi - lo);
      out->chunk_steps.push_back(cs[c + 1] - cs[c]);
      const auto col = e.columns.begin() + static_cast<std::ptrdiff_t>(c * 3 * num_fields_);
      out->columns.insert(out->columns.end(), col, col + static_cast<std::ptrdiff_t>(3 * num_fields_));
      if (copy_chunks) {
        out->chunk_data.insert(out->chunk_data.end(), e.data->begin() + static_cast<std::ptrdiff_t>(lo),
                               e.data->begin() + static_cast<std::ptrdiff_t>(hi));
        out->chunk_offsets.push_back(out->chunk_data.size());
      }
    }
    out->window_chunks.push_back(index);
  }
  out->window_chunk_offsets.push_back(out->window_chunks.size());
}

void SliceTable::Sample(size_t n, double beta, SliceSample* out, bool copy_chunks) {
  if (n < 1 || n > kMaxBatchItems) throw InvalidArgument("batch size must be in [1, 2^24]");
  if (!std::isfinite(beta) || beta < 0.0) throw InvalidArgument("beta must be finite and >= 0");
  *out = SliceSample();
  out->chunk_offsets.push_back(0);
  out->window_chunk_offsets.push_back(0);
  ScopedLock<Mutex> lock(mu_);
  if (windows_ == 0) throw EmptyStore();
  Rng rng(config_.seed, sample_calls_++);
  const double total = tree_.Total();
  const bool uniform = config_.sampler == SliceSampling::kUniform || !(total > 0.0);
  batch_chunks_.clear();
  std::vector<std::pair<const Episode*, uint32_t>> picks;
  picks.reserve(n);
  const uint64_t oldest = episodes_.front().first_step;
  const uint64_t cap = config_.capacity_steps;
  if (!uniform || config_.sampler == SliceSampling::kUniform) {
    // Stratified: draw i lands where the prefix sum of masses first passes (i + u_i) / n of the total.
    scratch_masses_.resize(n);
    scratch_leaves_.resize(n);
    for (size_t i = 0; i < n; ++i)
      scratch_masses_[i] = (static_cast<double>(i) + rng.Uniform()) * total / static_cast<double>(n);
    tree_.FindBatch(scratch_masses_.data(), n, scratch_leaves_.data());
    for (size_t i = 0; i < n; ++i) {
      const uint64_t pos = scratch_leaves_[i];
      const uint64_t abs = oldest + (pos + cap - oldest % cap) % cap;  // the live step at that ring position
      const Episode& e = EpisodeAt(abs);
      picks.emplace_back(&e, static_cast<uint32_t>(abs - e.first_step));
    }
  } else {
    // Every mass is 0: uniform over the valid starts (a walk over the episodes; only in this fallback).
    for (size_t i = 0; i < n; ++i) {
      uint64_t k = rng.Below(windows_);
      for (const Episode& e : episodes_) {
        if (k < e.starts) {
          picks.emplace_back(&e, static_cast<uint32_t>(k));
          break;
        }
        k -= e.starts;
      }
    }
  }
  const double min_mass = uniform ? 0.0 : tree_.MinPositive();
  for (const auto& [e, t] : picks) {
    out->keys.push_back((e->number << kSliceStartBits) | t);
    if (uniform) {
      out->probabilities.push_back(1.0 / static_cast<double>(windows_));
      out->weights.push_back(1.0f);
    } else {
      const double m = tree_.Get(Pos(e->first_step + t));
      out->probabilities.push_back(m / total);
      const double wlog = -beta * (std::log(m) - std::log(std::min(min_mass, m)));
      out->weights.push_back(std::max(static_cast<float>(std::exp(wlog)), std::numeric_limits<float>::min()));
    }
    AddWindow(*e, t, copy_chunks, out);
  }
  out->total_mass = uniform ? 0.0 : total;
  out->min_mass = min_mass;
  out->windows = windows_;
  out->num_fields = num_fields_;
  counters_.sampled += n;
}

size_t SliceTable::Update(const uint64_t* keys, size_t n, const double* values, bool per_step) {
  const size_t per = per_step ? config_.length : 1;
  for (size_t i = 0; i < n * per; ++i) CheckPriority(values[i], "priorities", i);
  ScopedLock<Mutex> lock(mu_);
  size_t live = 0;
  for (size_t i = 0; i < n; ++i) {
    const Episode* e = Find(keys[i] >> kSliceStartBits);
    const uint64_t t = keys[i] & kMaxEpisodeSteps;
    if (e == nullptr || t >= e->starts) {
      ++counters_.stale_updates;
      continue;
    }
    ++live;
    const uint64_t a = t + config_.burn_in;
    const uint64_t b = std::min<uint64_t>(a + config_.length, e->steps);
    for (uint64_t j = a; j < b; ++j) {
      const double p = values[i * per + (per_step ? j - a : 0)];
      priorities_[Pos(e->first_step + j)] = p;
      max_priority_ = std::max(max_priority_, p);
    }
    if (config_.sampler == SliceSampling::kUniform) continue;
    // Windows whose trained steps [s + B, s + B + L) meet [a, b): s in (a - B - L, b - B).
    const uint64_t reach = uint64_t{config_.burn_in} + config_.length - 1;
    const uint64_t lo = a > reach ? a - reach : 0;
    const uint64_t hi = std::min<uint64_t>(b - config_.burn_in, e->starts);
    SetMasses(*e, static_cast<uint32_t>(lo), static_cast<uint32_t>(hi));
  }
  counters_.updated += live;
  return live;
}

size_t SliceTable::Clear() {
  ScopedLock<Mutex> lock(mu_);
  const size_t dropped = episodes_.size();
  for (const Episode& e : episodes_) {
    for (uint32_t t = 0; t < e.starts; ++t) tree_.Set(Pos(e.first_step + t), 0.0);
  }
  episodes_.clear();
  steps_held_ = windows_ = chunk_bytes_ = index_bytes_ = 0;
  num_fields_ = 0;
  max_priority_ = 1.0;
  return dropped;
}

uint64_t SliceTable::NumWindows() const {
  ScopedLock<Mutex> lock(mu_);
  return windows_;
}

SliceStats SliceTable::Stats() const {
  ScopedLock<Mutex> lock(mu_);
  SliceStats s = counters_;
  s.episodes = episodes_.size();
  s.steps = steps_held_;
  s.windows = windows_;
  s.chunk_bytes = chunk_bytes_;
  // Per step: its priority and its tree leaf, plus the tree's upper levels (sums and minima, ~2/15 more); per
  // chunk: its offsets and its columns' places.
  s.metadata_bytes =
      priorities_.size() * (sizeof(double) * 2) + priorities_.size() * sizeof(double) * 2 / 15 + index_bytes_;
  s.total_mass = config_.sampler == SliceSampling::kPrioritized ? tree_.Total() : 0.0;
  const double m = tree_.MinPositive();
  s.min_mass = config_.sampler == SliceSampling::kPrioritized && std::isfinite(m) ? m : 0.0;
  return s;
}

void SliceTable::Windows(std::vector<uint64_t>* keys, std::vector<double>* masses) const {
  ScopedLock<Mutex> lock(mu_);
  keys->clear();
  masses->clear();
  for (const Episode& e : episodes_) {
    for (uint32_t t = 0; t < e.starts; ++t) {
      keys->push_back((e.number << kSliceStartBits) | t);
      masses->push_back(tree_.Get(Pos(e.first_step + t)));
    }
  }
}

std::vector<double> SliceTable::StepPriorities(uint64_t episode) const {
  ScopedLock<Mutex> lock(mu_);
  const Episode* e = Find(episode);
  if (e == nullptr) throw InvalidArgument("episode " + std::to_string(episode) + " is not held");
  std::vector<double> out(e->steps);
  for (uint32_t j = 0; j < e->steps; ++j) out[j] = priorities_[Pos(e->first_step + j)];
  return out;
}

void SliceTable::Validate() const {
  ScopedLock<Mutex> lock(mu_);
  const auto fail = [](const std::string& what) { throw std::logic_error("slice table: " + what); };
  const std::string tree = tree_.CheckConsistency();
  if (!tree.empty()) fail(tree);
  uint64_t steps = 0, windows = 0, bytes = 0;
  std::vector<uint8_t> is_start(priorities_.size(), 0);
  for (size_t k = 0; k < episodes_.size(); ++k) {
    const Episode& e = episodes_[k];
    if (k > 0 && (e.number != episodes_[k - 1].number + 1 ||
                  e.first_step != episodes_[k - 1].first_step + episodes_[k - 1].steps)) {
      fail("episodes not back to back at episode " + std::to_string(e.number));
    }
    if (e.starts != ValidStarts(e.steps)) fail("episode " + std::to_string(e.number) + ": wrong start count");
    if (e.chunk_steps.back() != e.steps || e.chunk_offsets.back() != e.data->size()) {
      fail("episode " + std::to_string(e.number) + ": chunks do not add up");
    }
    for (uint32_t t = 0; t < e.starts; ++t) {
      const size_t pos = Pos(e.first_step + t);
      is_start[pos] = 1;
      if (tree_.Get(pos) != Mass(e, t)) {
        fail("episode " + std::to_string(e.number) + " start " + std::to_string(t) + ": leaf " +
             std::to_string(tree_.Get(pos)) + ", mass " + std::to_string(Mass(e, t)));
      }
    }
    steps += e.steps;
    windows += e.starts;
    bytes += e.data->size();
  }
  if (!episodes_.empty() && episodes_.back().first_step + episodes_.back().steps != next_step_) {
    fail("next step does not follow the newest episode");
  }
  if (steps != steps_held_ || windows != windows_ || bytes != chunk_bytes_) fail("counts do not add up");
  if (steps > config_.capacity_steps) fail("holds more steps than its capacity");
  for (size_t pos = 0; pos < priorities_.size(); ++pos) {
    if (!is_start[pos] && tree_.Get(pos) != 0.0) fail("a leaf that is no valid start holds mass");
  }
}

}  // namespace apexrl
