// Concurrency stress on one ShardedStore (run under ThreadSanitizer in CI: ctest -L stress).
//
// Seven threads share a small store (8 shards, capacity 2000) so eviction never stops:
//   2 inserters  -- insert batches (held back while the store is 1.5x over capacity); every payload embeds a
//                   unique id; each records key -> id
//   2 samplers   -- sample and record (key, payload id) for every draw
//   1 updater    -- updates the keys it just sampled plus older ones (often stale by then)
//   1 evictor    -- RemoveToFit() whenever the store is above capacity
//   1 eraser     -- while over capacity, erases some sampled keys and some old (often stale) ones; also runs
//                   Validate() and saves a snapshot under load
// At the end every sampled (key, id) pair must match what the inserter recorded (a key never returns a
// foreign item), and the counters must add up exactly. The run is bounded by iteration counts only.
//
// QueueStressTest: max_times_sampled = 1 with the fifo, uniform and prioritized samplers (a queue, and the
// with-replacement samplers' dropped draws): 2 inserters and 3 samplers, no eviction; every inserted item is
// returned exactly once (none twice, none lost), and removed_by_sampling counts them all.
// OrderedSampleStressTest: a fifo sampler without a limit while one thread inserts, erases and evicts: every
// batch holds distinct items, oldest first (increasing ids), at least one.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "apexrl/common.h"
#include "apexrl/errors.h"
#include "apexrl/eviction/kinds.h"
#include "apexrl/random.h"
#include "apexrl/sampling/kinds.h"
#include "apexrl/sharded_store.h"
#include "temp_dir.h"

namespace apexrl {
namespace {

constexpr uint32_t kShards = 8;
constexpr uint64_t kCapacity = 2000;
// Sized for a few seconds in a Release build and well under two minutes under ThreadSanitizer on 2 cores.
constexpr int kInsertBatchesPerThread = 50000;
constexpr int kSampleCallsPerThread = 40000;
constexpr size_t kSampleBatch = 32;
constexpr int kUpdateRounds = 40000;
constexpr int kEraseRounds = 40000;

// Payload of item `id`: the id itself, then filler bytes derived from it -- usually a few, for one item in
// 97 over a kilobyte (so more than one of the arena's size classes is recycled concurrently).
size_t PayloadSize(uint64_t id) { return 8 + (id % 97 == 0 ? 1000 + id % 1500 : id % 29); }

std::string MakePayload(uint64_t id) {
  std::string s(PayloadSize(id), '\0');
  std::memcpy(&s[0], &id, sizeof(id));
  for (size_t j = 8; j < s.size(); ++j) s[j] = static_cast<char>((id * 131 + j) & 0xFF);
  return s;
}

// Recovers the id from a payload; false if the bytes are not a payload MakePayload could have written.
bool DecodePayload(const uint8_t* p, size_t len, uint64_t* id) {
  if (len < 8) return false;
  std::memcpy(id, p, sizeof(*id));
  if (len != PayloadSize(*id)) return false;
  for (size_t j = 8; j < len; ++j) {
    if (p[j] != static_cast<uint8_t>((*id * 131 + j) & 0xFF)) return false;
  }
  return true;
}

// Failures seen on worker threads (gtest assertions stay on the main thread).
class Failures {
 public:
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.size() < 10) first_.push_back(what);
    ++count_;
  }
  size_t count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }
  std::string Describe() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s;
    for (const std::string& f : first_) s += "  " + f + "\n";
    return s;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> first_;
  size_t count_ = 0;
};

// Checks one sample result's layout and payloads; appends (key, id) of every draw to `seen`.
void CheckSample(const SampleResult& r, size_t n, std::vector<std::pair<Key, uint64_t>>* seen, Failures* f) {
  if (r.keys.size() != n || r.weights.size() != n || r.probabilities.size() != n || r.offsets.size() != n + 1) {
    f->Add("sample result has the wrong sizes");
    return;
  }
  if (r.offsets[0] != 0 || r.offsets[n] != r.data.size()) f->Add("offsets do not span the data");
  // The batch totals stay consistent with each draw while other threads write: P * T is the drawn item's
  // mass, at least m_min, and the weight is (mass / m_min)^-beta (beta 0.4 in every sample call here).
  if (r.size == 0) f->Add("sample result reports an empty store");
  if (r.total_mass > 0.0) {
    if (!(r.min_mass > 0.0 && r.min_mass <= r.total_mass)) {
      f->Add("min_mass " + std::to_string(r.min_mass) + " total_mass " + std::to_string(r.total_mass));
    }
    for (size_t i = 0; i < n; ++i) {
      const double mass = r.probabilities[i] * r.total_mass;
      const double w = std::exp(0.4 * (std::log(r.min_mass) - std::log(mass)));
      if (!(mass >= r.min_mass * (1 - 1e-12)) || std::fabs(w - r.weights[i]) > 1e-6) {
        f->Add("draw " + std::to_string(i) + ": P * T = " + std::to_string(mass) + ", m_min " +
               std::to_string(r.min_mass) + ", weight " + std::to_string(r.weights[i]));
      }
    }
  } else if (r.min_mass != 0.0) {
    f->Add("uniform batch with min_mass " + std::to_string(r.min_mass));
  }
  for (size_t i = 0; i < n; ++i) {
    if (r.offsets[i] > r.offsets[i + 1] || r.offsets[i + 1] > r.data.size()) {
      f->Add("offsets out of order");
      return;
    }
    if (!(r.weights[i] > 0.0f && r.weights[i] <= 1.0f)) f->Add("weight " + std::to_string(r.weights[i]));
    if (!(r.probabilities[i] > 0.0 && r.probabilities[i] <= 1.0)) {
      f->Add("probability " + std::to_string(r.probabilities[i]));
    }
    if (SplitKey(r.keys[i]).shard >= kShards) f->Add("key names a shard that does not exist");
    uint64_t id = 0;
    if (!DecodePayload(r.data.data() + r.offsets[i], r.offsets[i + 1] - r.offsets[i], &id)) {
      f->Add("sampled bytes are not an intact payload");
      continue;
    }
    seen->emplace_back(r.keys[i], id);
  }
}

struct InserterResult {
  std::unordered_map<Key, uint64_t> key_to_id;
  uint64_t inserted = 0;
};

struct StressOutcome {
  std::unordered_map<Key, uint64_t> key_to_id;
  std::vector<std::pair<Key, uint64_t>> sampled;
  uint64_t inserted = 0, draws = 0, sample_calls = 0;
  uint64_t updated = 0, update_keys = 0;
  uint64_t evicted = 0, remove_to_fit_calls = 0;
  uint64_t erased = 0;
  bool snapshot_saved = false;
};

void RunStress(ShardedStore& store, const std::string& snapshot_path, Failures* failures, StressOutcome* out) {
  std::atomic<bool> go{false};
  std::atomic<int> inserters_running{2};
  std::atomic<bool> evictor_done{false};
  auto wait_for_go = [&go] {
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
  };
  auto guarded = [failures, &store](const char* who, auto&& body) {
    return [failures, &store, who, body]() mutable {
      try {
        body();
      } catch (const std::exception& e) {
        const StoreStats st = store.Stats();
        failures->Add(std::string(who) + " threw: " + e.what() + " (store now: size " + std::to_string(st.size) +
                      ", inserted " + std::to_string(st.inserted) + ", evicted " + std::to_string(st.evicted) +
                      ", erased " + std::to_string(st.erased) + ")");
      }
    };
  };

  // Prefill to capacity so sampling never meets an empty store.
  InserterResult prefill;
  {
    std::vector<std::string> payloads;
    std::vector<const uint8_t*> data;
    std::vector<uint64_t> sizes;
    std::vector<double> priorities;
    for (uint64_t i = 0; i < kCapacity; ++i) {
      payloads.push_back(MakePayload(i));
      priorities.push_back(i % 10 == 0 ? 0.0 : 0.5 + static_cast<double>(i % 7));
    }
    for (const std::string& p : payloads) {
      data.push_back(reinterpret_cast<const uint8_t*>(p.data()));
      sizes.push_back(p.size());
    }
    std::vector<Key> keys(kCapacity);
    store.Insert(priorities.data(), data.data(), sizes.data(), kCapacity, keys.data());
    for (uint64_t i = 0; i < kCapacity; ++i) prefill.key_to_id.emplace(keys[i], i);
    prefill.inserted = kCapacity;
  }

  std::vector<InserterResult> inserter_results(2);
  std::vector<std::vector<std::pair<Key, uint64_t>>> seen(4);  // samplers 0-1, updater 2, eraser 3
  std::vector<uint64_t> draws(4, 0), calls(4, 0);
  uint64_t updated = 0, update_keys = 0, evicted = 0, evict_calls = 0, erased = 0;
  bool saved = false;
  std::vector<std::thread> threads;

  for (int t = 0; t < 2; ++t) {
    threads.emplace_back(guarded("inserter", [&, t] {
      struct Done {  // tells the evictor this inserter is finished, however it ends
        std::atomic<int>& running;
        ~Done() { running.fetch_sub(1, std::memory_order_acq_rel); }
      } done{inserters_running};
      InserterResult& res = inserter_results[static_cast<size_t>(t)];
      Rng rng(100 + static_cast<uint64_t>(t));
      uint64_t next_id = (static_cast<uint64_t>(t) + 1) << 40;
      std::vector<std::string> payloads;
      std::vector<const uint8_t*> data;
      std::vector<uint64_t> sizes;
      std::vector<double> priorities;
      std::vector<Key> keys;
      wait_for_go();
      for (int it = 0; it < kInsertBatchesPerThread; ++it) {
        // Back-pressure, as a replay server applies to its actors: never run far ahead of the evictor, so one
        // eviction round (whose excess is read at its start) cannot overshoot into an empty store while the
        // eraser removes items concurrently.
        while (store.Size() > kCapacity * 3 / 2 && !evictor_done.load(std::memory_order_acquire)) {
          std::this_thread::yield();
        }
        const size_t n = it % 97 == 0 ? 100 : 1 + static_cast<size_t>(rng.Below(16));  // 100 spans 2 chunks
        payloads.clear();
        data.clear();
        sizes.clear();
        priorities.clear();
        keys.assign(n, 0);
        for (size_t i = 0; i < n; ++i) {
          payloads.push_back(MakePayload(next_id + i));
          priorities.push_back(rng.Below(20) == 0 ? 0.0 : 0.01 + 4.0 * rng.Uniform());
        }
        for (const std::string& p : payloads) {
          data.push_back(reinterpret_cast<const uint8_t*>(p.data()));
          sizes.push_back(p.size());
        }
        store.Insert(priorities.data(), data.data(), sizes.data(), n, keys.data());
        for (size_t i = 0; i < n; ++i) {
          if (keys[i] == 0 || SplitKey(keys[i]).shard >= kShards) failures->Add("insert issued a bad key");
          if (!res.key_to_id.emplace(keys[i], next_id + i).second) failures->Add("insert issued a key twice");
        }
        next_id += n;
        res.inserted += n;
      }
    }));
  }

  for (int t = 0; t < 2; ++t) {
    threads.emplace_back(guarded("sampler", [&, t] {
      const size_t me = static_cast<size_t>(t);
      SampleResult r;
      wait_for_go();
      for (int it = 0; it < kSampleCallsPerThread; ++it) {
        const size_t n = it % 10 == 0 ? 1 : kSampleBatch;
        store.Sample(n, 0.4, &r);
        CheckSample(r, n, &seen[me], failures);
        draws[me] += n;
        ++calls[me];
      }
    }));
  }

  threads.emplace_back(guarded("updater", [&] {
    Rng rng(300);
    SampleResult r;
    std::vector<Key> keys, old(64, 0);
    std::vector<double> priorities;
    size_t old_pos = 0;
    wait_for_go();
    for (int it = 0; it < kUpdateRounds; ++it) {
      store.Sample(16, 0.4, &r);
      CheckSample(r, 16, &seen[2], failures);
      draws[2] += 16;
      ++calls[2];
      keys.assign(r.keys.begin(), r.keys.end());
      for (int i = 0; i < 8; ++i) keys.push_back(old[(old_pos + static_cast<size_t>(i) * 8) % old.size()]);
      for (size_t i = 0; i < 16; ++i) old[(old_pos + i) % old.size()] = r.keys[i];
      old_pos = (old_pos + 16) % old.size();
      priorities.clear();
      for (size_t i = 0; i < keys.size(); ++i) {
        priorities.push_back(rng.Below(20) == 0 ? 0.0 : 0.01 + 5.0 * rng.Uniform());
      }
      updated += store.UpdatePriorities(keys.data(), priorities.data(), keys.size());
      update_keys += keys.size();
    }
  }));

  threads.emplace_back(guarded("evictor", [&] {
    struct Done {
      std::atomic<bool>& done;
      ~Done() { done.store(true, std::memory_order_release); }
    } done{evictor_done};
    wait_for_go();
    while (inserters_running.load(std::memory_order_acquire) > 0) {
      if (store.Size() > kCapacity) {
        evicted += store.RemoveToFit();
        ++evict_calls;
      } else {
        std::this_thread::yield();
      }
    }
  }));

  threads.emplace_back(guarded("eraser", [&] {
    Rng rng(500);
    SampleResult r;
    std::vector<Key> old;
    wait_for_go();
    for (int it = 0; it < kEraseRounds; ++it) {
      store.Sample(8, 0.4, &r);
      CheckSample(r, 8, &seen[3], failures);
      draws[3] += 8;
      ++calls[3];
      // Never drain the store (the samplers must always find items): erase only while it is over capacity,
      // i.e. race the evictor for items it would remove anyway.
      if (store.Size() > kCapacity) {
        std::vector<Key> victims = {r.keys[0], r.keys[rng.Below(8)]};     // sometimes the same key twice
        if (!old.empty()) victims.push_back(old[rng.Below(old.size())]);  // long gone by now, usually
        erased += store.Erase(victims.data(), victims.size());
      }
      if (old.size() < 256) {
        old.push_back(r.keys[7]);
      } else {
        old[rng.Below(old.size())] = r.keys[7];
      }
      if (it % 500 == 250) {
        try {
          store.Validate();
        } catch (const std::logic_error& e) {
          failures->Add(std::string("Validate() under load: ") + e.what());
        }
      }
      if (it == kEraseRounds / 2) {
        store.Save(snapshot_path);
        saved = true;
      }
    }
  }));

  go.store(true, std::memory_order_release);
  for (std::thread& t : threads) t.join();

  out->key_to_id = std::move(prefill.key_to_id);
  out->inserted = prefill.inserted;
  for (InserterResult& res : inserter_results) {
    for (const auto& kv : res.key_to_id) {
      if (!out->key_to_id.emplace(kv.first, kv.second).second) failures->Add("two inserters got the same key");
    }
    out->inserted += res.inserted;
  }
  for (auto& v : seen) out->sampled.insert(out->sampled.end(), v.begin(), v.end());
  for (size_t i = 0; i < 4; ++i) {
    out->draws += draws[i];
    out->sample_calls += calls[i];
  }
  out->updated = updated;
  out->update_keys = update_keys;
  out->evicted = evicted;
  out->remove_to_fit_calls = evict_calls;
  out->erased = erased;
  out->snapshot_saved = saved;
}

class StoreStressTest : public ::testing::TestWithParam<EvictionKind> {
 protected:
  testing_util::TempDir dir_{"apexrl_stress"};
};

TEST_P(StoreStressTest, ConcurrentInsertSampleUpdateEvictEraseKeepKeysBoundToTheirItems) {
  StoreConfig cfg;
  cfg.shards = kShards;
  cfg.capacity = kCapacity;
  cfg.alpha = 0.6;
  cfg.eviction = GetParam();
  cfg.alpha_evict = -0.4;
  cfg.seed = 2024;
  ShardedStore store(cfg);
  const std::string snapshot = dir_.Path("mid_run.snap");
  Failures failures;
  StressOutcome o;
  const auto start = std::chrono::steady_clock::now();
  RunStress(store, snapshot, &failures, &o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ stress   ] %s eviction: %.2f s, %llu inserted, %llu draws, %llu evicted, %llu erased\n",
              EvictionKindName(cfg.eviction), seconds, static_cast<unsigned long long>(o.inserted),
              static_cast<unsigned long long>(o.draws), static_cast<unsigned long long>(o.evicted),
              static_cast<unsigned long long>(o.erased));
  std::fflush(stdout);

  ASSERT_EQ(failures.count(), 0u) << "failures on worker threads:\n" << failures.Describe();
  ASSERT_NO_THROW(store.Validate());

  // Every key ever issued is distinct, and every draw returned the item its key was issued for.
  EXPECT_EQ(o.key_to_id.size(), o.inserted) << "keys were issued more than once";
  size_t foreign = 0, unknown = 0;
  for (const auto& [key, id] : o.sampled) {
    auto it = o.key_to_id.find(key);
    if (it == o.key_to_id.end()) {
      ++unknown;
    } else if (it->second != id) {
      ++foreign;
    }
  }
  EXPECT_EQ(unknown, 0u) << "sampled keys that were never issued";
  EXPECT_EQ(foreign, 0u) << "sampled keys that returned another item's payload";
  EXPECT_EQ(o.sampled.size(), o.draws);

  // The counters add up exactly.
  const uint64_t final_evicted = store.RemoveToFit();
  StoreStats st = store.Stats();
  EXPECT_EQ(st.inserted, o.inserted);
  EXPECT_EQ(st.sampled, o.draws);
  EXPECT_EQ(st.sample_calls, o.sample_calls);
  EXPECT_EQ(st.updated, o.updated);
  EXPECT_EQ(st.stale_updates, o.update_keys - o.updated);
  EXPECT_GT(st.stale_updates, 0u) << "the updater should have met stale keys";
  EXPECT_EQ(st.erased, o.erased);
  EXPECT_EQ(st.evicted, o.evicted + final_evicted);
  EXPECT_EQ(st.remove_to_fit_calls, o.remove_to_fit_calls + 1);
  EXPECT_EQ(st.size, st.inserted - st.evicted - st.erased);
  EXPECT_EQ(store.Size(), st.size);
  EXPECT_LE(st.size, kCapacity);
  EXPECT_GT(st.evicted, o.inserted / 2) << "eviction should have run all along";
  ASSERT_NO_THROW(store.Validate());

  // Quiet now: a last round of samples must still map keys to their own items.
  std::vector<std::pair<Key, uint64_t>> last;
  Failures quiet;
  SampleResult r;
  for (int i = 0; i < 20; ++i) {
    store.Sample(64, 0.4, &r);
    CheckSample(r, 64, &last, &quiet);
  }
  EXPECT_EQ(quiet.count(), 0u) << quiet.Describe();
  for (const auto& [key, id] : last) {
    auto it = o.key_to_id.find(key);
    ASSERT_NE(it, o.key_to_id.end());
    EXPECT_EQ(it->second, id);
  }

  // Erasing every key ever issued removes exactly the live items and empties the store.
  std::vector<Key> all;
  all.reserve(o.key_to_id.size());
  for (const auto& kv : o.key_to_id) all.push_back(kv.first);
  const size_t live = store.Size();
  EXPECT_EQ(store.Erase(all.data(), all.size()), live);
  st = store.Stats();
  EXPECT_EQ(st.size, 0u);
  EXPECT_EQ(st.bytes_held, 0u);
  EXPECT_EQ(store.TotalMass(), 0.0);
  ASSERT_NO_THROW(store.Validate());

  // The snapshot taken mid-run is a consistent store whose keys still map to their own items.
  ASSERT_TRUE(o.snapshot_saved);
  std::unique_ptr<ShardedStore> loaded = ShardedStore::Load(snapshot);
  ASSERT_NO_THROW(loaded->Validate());
  EXPECT_GT(loaded->Size(), 0u);
  last.clear();
  for (int i = 0; i < 20; ++i) {
    loaded->Sample(64, 0.4, &r);
    CheckSample(r, 64, &last, &quiet);
  }
  EXPECT_EQ(quiet.count(), 0u) << quiet.Describe();
  for (const auto& [key, id] : last) {
    auto it = o.key_to_id.find(key);
    ASSERT_NE(it, o.key_to_id.end());
    EXPECT_EQ(it->second, id);
  }
}

INSTANTIATE_TEST_SUITE_P(Eviction, StoreStressTest,
                         // Not lowest_priority: it runs FIFO's planner and the same shard paths, and its
                         // policy is only reached under the shard lock (checked by the clang build); a third
                         // run would add about 50 s under ThreadSanitizer on 2 cores.
                         ::testing::Values(EvictionKind::kFifo, EvictionKind::kPrioritized),
                         [](const ::testing::TestParamInfo<EvictionKind>& param_info) {
                           return param_info.param == EvictionKind::kFifo ? std::string("Fifo")
                                                                          : std::string("Prioritized");
                         });

class QueueStressTest : public ::testing::TestWithParam<SamplerKind> {};

TEST_P(QueueStressTest, MaxTimesSampledOneHandsOutEveryItemExactlyOnce) {
  constexpr int kBatches = 10000;  // per inserter
  StoreConfig cfg;
  cfg.shards = 4;
  cfg.capacity = 1'000'000;  // no eviction: every item must come out through a sample
  cfg.sampler = GetParam();
  cfg.max_times_sampled = 1;
  cfg.seed = 77;
  ShardedStore store(cfg);
  Failures failures;
  std::atomic<bool> go{false};
  std::atomic<int> inserters_running{2};
  std::vector<uint64_t> inserted(2, 0);
  std::vector<std::vector<uint64_t>> got(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      struct Done {
        std::atomic<int>& running;
        ~Done() { running.fetch_sub(1, std::memory_order_acq_rel); }
      } done{inserters_running};
      try {
        Rng rng(500 + static_cast<uint64_t>(t));
        uint64_t next_id = (static_cast<uint64_t>(t) + 1) << 40;
        std::vector<std::string> payloads;
        std::vector<const uint8_t*> data;
        std::vector<uint64_t> sizes;
        std::vector<double> priorities;
        std::vector<Key> keys;
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        for (int it = 0; it < kBatches; ++it) {
          const size_t n = 1 + static_cast<size_t>(rng.Below(16));
          payloads.clear();
          data.clear();
          sizes.clear();
          priorities.assign(n, 0.0);
          keys.assign(n, 0);
          for (size_t i = 0; i < n; ++i) {
            payloads.push_back(MakePayload(next_id + i));
            priorities[i] = 0.01 + 4.0 * rng.Uniform();
          }
          for (const std::string& p : payloads) {
            data.push_back(reinterpret_cast<const uint8_t*>(p.data()));
            sizes.push_back(p.size());
          }
          store.Insert(priorities.data(), data.data(), sizes.data(), n, keys.data());
          next_id += n;
          inserted[static_cast<size_t>(t)] += n;
        }
      } catch (const std::exception& e) {
        failures.Add(std::string("inserter threw: ") + e.what());
      }
    });
  }
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      try {
        SampleResult r;
        std::vector<uint64_t>& mine = got[static_cast<size_t>(t)];
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        // Until the inserters are done and the store is drained (read in that order: an item inserted before
        // the last inserter finished is in Size() by then).
        for (;;) {
          const bool inserting = inserters_running.load(std::memory_order_acquire) > 0;
          if (!inserting && store.Size() == 0) break;
          try {
            store.Sample(16, 0.4, &r);
          } catch (const EmptyStore&) {
            std::this_thread::yield();
            continue;
          }
          if (r.keys.empty() || r.keys.size() > 16) failures.Add("a batch of " + std::to_string(r.keys.size()));
          for (size_t i = 0; i < r.keys.size(); ++i) {
            uint64_t id = 0;
            if (!DecodePayload(r.data.data() + r.offsets[i], r.offsets[i + 1] - r.offsets[i], &id)) {
              failures.Add("sampled bytes are not an intact payload");
            }
            mine.push_back(id);
          }
        }
      } catch (const std::exception& e) {
        failures.Add(std::string("sampler threw: ") + e.what());
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (std::thread& th : threads) th.join();
  ASSERT_EQ(failures.count(), 0u) << failures.Describe();
  ASSERT_NO_THROW(store.Validate());

  std::vector<uint64_t> all;
  for (const auto& g : got) all.insert(all.end(), g.begin(), g.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "an item was returned twice";
  std::vector<uint64_t> expected;
  for (uint64_t t = 0; t < 2; ++t) {
    for (uint64_t i = 0; i < inserted[t]; ++i) expected.push_back(((t + 1) << 40) + i);
  }
  EXPECT_EQ(all.size(), expected.size()) << "items lost or returned twice";
  EXPECT_TRUE(all == expected) << "the returned items are not exactly the inserted ones";
  const StoreStats st = store.Stats();
  EXPECT_EQ(st.removed_by_sampling, st.inserted);
  EXPECT_EQ(st.sampled, st.inserted);
  EXPECT_EQ(st.size, 0u);
  EXPECT_EQ(st.bytes_held, 0u);
}

TEST(OrderedSampleStressTest, FifoBatchesStayDistinctAndOldestFirstUnderInsertsErasesAndEvictions) {
  StoreConfig cfg;
  cfg.shards = 4;
  cfg.capacity = 500;
  cfg.sampler = SamplerKind::kFifo;
  cfg.seed = 91;
  ShardedStore store(cfg);
  Failures failures;
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  // One writer: ids increase with insertion order, so a FIFO batch's ids must increase.
  threads.emplace_back([&] {
    try {
      Rng rng(17);
      std::vector<Key> recent;
      uint64_t next_id = 0;
      for (int it = 0; it < 20000; ++it) {
        const size_t n = 1 + static_cast<size_t>(rng.Below(8));
        std::vector<std::string> payloads;
        std::vector<const uint8_t*> data;
        std::vector<uint64_t> sizes;
        std::vector<double> priorities(n, 1.0);
        std::vector<Key> keys(n);
        for (size_t i = 0; i < n; ++i) payloads.push_back(MakePayload(next_id + i));
        for (const std::string& p : payloads) {
          data.push_back(reinterpret_cast<const uint8_t*>(p.data()));
          sizes.push_back(p.size());
        }
        store.Insert(priorities.data(), data.data(), sizes.data(), n, keys.data());
        next_id += n;
        recent.insert(recent.end(), keys.begin(), keys.end());
        if (recent.size() > 64) {
          const Key k = recent[static_cast<size_t>(rng.Below(recent.size()))];
          store.Erase(&k, 1);
          recent.erase(recent.begin(), recent.begin() + 32);
        }
        if (it % 50 == 0) store.RemoveToFit();
      }
    } catch (const std::exception& e) {
      failures.Add(std::string("writer threw: ") + e.what());
    }
    done.store(true, std::memory_order_release);
  });
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      try {
        SampleResult r;
        while (!done.load(std::memory_order_acquire)) {
          try {
            store.Sample(64, 0.4, &r);
          } catch (const EmptyStore&) {
            continue;
          }
          if (r.keys.empty() || r.keys.size() > 64) failures.Add("a batch of " + std::to_string(r.keys.size()));
          uint64_t previous = 0;
          for (size_t i = 0; i < r.keys.size(); ++i) {
            uint64_t id = 0;
            if (!DecodePayload(r.data.data() + r.offsets[i], r.offsets[i + 1] - r.offsets[i], &id)) {
              failures.Add("sampled bytes are not an intact payload");
            }
            if (i > 0 && id <= previous) failures.Add("a FIFO batch out of order or with a repeated item");
            previous = id;
          }
        }
      } catch (const std::exception& e) {
        failures.Add(std::string("sampler threw: ") + e.what());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_EQ(failures.count(), 0u) << failures.Describe();
  ASSERT_NO_THROW(store.Validate());
}

INSTANTIATE_TEST_SUITE_P(Samplers, QueueStressTest,
                         ::testing::Values(SamplerKind::kFifo, SamplerKind::kUniform, SamplerKind::kPrioritized),
                         [](const ::testing::TestParamInfo<SamplerKind>& param_info) {
                           return std::string(SamplerKindName(param_info.param));
                         });

}  // namespace
}  // namespace apexrl
