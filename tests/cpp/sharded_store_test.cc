// ShardedStore: keys, stale updates, sampling distribution and IS weights, the uniform fallback, FIFO,
// prioritized and lowest-priority RemoveToFit, input validation, and snapshots (round trip, truncation,
// corruption, temp files).
// Every test calls Validate() after each step that changes the store.
#include "apexrl/sharded_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "apexrl/common.h"
#include "apexrl/crc32c.h"
#include "apexrl/errors.h"
#include "temp_dir.h"

namespace apexrl {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

#define ASSERT_VALID(store) ASSERT_NO_THROW((store).Validate())

// Payload of item `id`: names the id, padded to a length that varies with it (0-padding included).
std::string PayloadFor(uint64_t id) {
  std::string s = "id=" + std::to_string(id) + ";";
  s.append(id % 13, static_cast<char>('a' + id % 26));
  return s;
}

std::vector<Key> Insert(ShardedStore& store, const std::vector<double>& priorities,
                        const std::vector<std::string>& payloads) {
  EXPECT_EQ(priorities.size(), payloads.size());
  std::vector<const uint8_t*> data;
  std::vector<uint64_t> sizes;
  for (const std::string& p : payloads) {
    data.push_back(reinterpret_cast<const uint8_t*>(p.data()));
    sizes.push_back(p.size());
  }
  std::vector<Key> keys(payloads.size(), 0);
  store.Insert(priorities.data(), data.data(), sizes.data(), payloads.size(), keys.data());
  return keys;
}

std::string ItemBytes(const SampleResult& r, size_t i) {
  return std::string(reinterpret_cast<const char*>(r.data.data()) + r.offsets[i], r.offsets[i + 1] - r.offsets[i]);
}

// Samples and checks the shape of the result: sizes, offsets, weights in (0, 1], probabilities in (0, 1].
SampleResult Sample(ShardedStore& store, size_t n, double beta) {
  SampleResult r;
  store.Sample(n, beta, &r);
  EXPECT_EQ(r.keys.size(), n);
  EXPECT_EQ(r.weights.size(), n);
  EXPECT_EQ(r.probabilities.size(), n);
  EXPECT_EQ(r.offsets.size(), n + 1);
  if (r.offsets.size() == n + 1) {
    EXPECT_EQ(r.offsets[0], 0u);
    for (size_t i = 0; i < n; ++i) EXPECT_LE(r.offsets[i], r.offsets[i + 1]);
    EXPECT_EQ(r.offsets[n], r.data.size());
  }
  for (size_t i = 0; i < r.weights.size(); ++i) {
    EXPECT_GT(r.weights[i], 0.0f);
    EXPECT_LE(r.weights[i], 1.0f);
    EXPECT_GT(r.probabilities[i], 0.0);
    EXPECT_LE(r.probabilities[i], 1.0);
  }
  return r;
}

void ExpectStatsEq(const StoreStats& a, const StoreStats& b) {
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.bytes_held, b.bytes_held);
  EXPECT_EQ(a.inserted, b.inserted);
  EXPECT_EQ(a.sampled, b.sampled);
  EXPECT_EQ(a.sample_calls, b.sample_calls);
  EXPECT_EQ(a.updated, b.updated);
  EXPECT_EQ(a.stale_updates, b.stale_updates);
  EXPECT_EQ(a.evicted, b.evicted);
  EXPECT_EQ(a.erased, b.erased);
  EXPECT_EQ(a.remove_to_fit_calls, b.remove_to_fit_calls);
}

// Two stores that went through the same calls must answer the same: same stats, and the same next samples
// (the sampling stream depends on the seed and on the number of sample calls so far).
void ExpectSameState(ShardedStore& a, ShardedStore& b) {
  ASSERT_VALID(a);
  ASSERT_VALID(b);
  ExpectStatsEq(a.Stats(), b.Stats());
  EXPECT_EQ(a.Size(), b.Size());
  EXPECT_EQ(a.TotalMass(), b.TotalMass());
  if (a.Size() == 0 || b.Size() == 0) return;
  for (int call = 0; call < 3; ++call) {
    const SampleResult ra = Sample(a, 16, 0.5), rb = Sample(b, 16, 0.5);
    EXPECT_EQ(ra.keys, rb.keys);
    EXPECT_EQ(ra.weights, rb.weights);
    EXPECT_EQ(ra.probabilities, rb.probabilities);
    EXPECT_EQ(ra.offsets, rb.offsets);
  }
}

// Is `key` still live? (An update with its current priority changes nothing but the counters.)
bool IsLive(ShardedStore& store, Key key, double priority) { return store.UpdatePriorities(&key, &priority, 1) == 1; }

double ChiSquare(const std::vector<uint64_t>& observed, const std::vector<double>& p, uint64_t draws) {
  double chi2 = 0.0;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (p[i] == 0.0) continue;
    const double expected = p[i] * static_cast<double>(draws);
    const double d = static_cast<double>(observed[i]) - expected;
    chi2 += d * d / expected;
  }
  return chi2;
}

StoreConfig Config(uint32_t shards, uint64_t capacity, double alpha, uint64_t seed = 1) {
  StoreConfig c;
  c.shards = shards;
  c.capacity = capacity;
  c.alpha = alpha;
  c.seed = seed;
  return c;
}

// ---------------------------------------------------------------------------------------------------------
// Keys and counters

TEST(ShardedStoreTest, KeysAreUniqueAndNameAnExistingShard) {
  ShardedStore store(Config(8, 100000, 0.6));
  std::set<Key> seen;
  std::vector<Key> all;
  uint64_t id = 0;
  const size_t batch_sizes[] = {1, 2, 3, 64, 65, 200, 7, 129};
  for (int round = 0; round < 25; ++round) {
    const size_t n = batch_sizes[round % 8];
    std::vector<double> pr(n, 1.0);
    std::vector<std::string> pl;
    for (size_t i = 0; i < n; ++i) pl.push_back(PayloadFor(id++));
    for (Key k : Insert(store, pr, pl)) {
      EXPECT_NE(k, 0u);
      EXPECT_LT(SplitKey(k).shard, 8u);
      EXPECT_TRUE(seen.insert(k).second) << "key " << k << " issued twice";
      all.push_back(k);
    }
    // Free some slots so later inserts reuse them: reused slots must still give new keys.
    std::vector<Key> victims;
    for (size_t i = static_cast<size_t>(round); i < all.size(); i += 9) victims.push_back(all[i]);
    store.Erase(victims.data(), victims.size());
    ASSERT_VALID(store);
  }
  EXPECT_EQ(store.Stats().inserted, id);
  EXPECT_EQ(store.Size(), id - store.Stats().erased);
  std::set<uint32_t> shards_used;
  for (Key k : all) shards_used.insert(SplitKey(k).shard);
  EXPECT_EQ(shards_used.size(), 8u) << "inserts should spread over every shard";
}

TEST(ShardedStoreTest, StaleKeysAreSkippedAndCounted) {
  StoreConfig c = Config(4, 1000, 1.0);
  ShardedStore store(c);
  std::vector<std::string> payloads;
  for (int i = 0; i < 10; ++i) payloads.push_back(PayloadFor(static_cast<uint64_t>(i)));
  const std::vector<Key> keys = Insert(store, std::vector<double>(10, 1.0), payloads);
  ASSERT_EQ(store.Erase(keys.data(), 3), 3u);
  ASSERT_VALID(store);
  EXPECT_EQ(store.Erase(keys.data(), 3), 0u);  // erase ignores stale keys

  std::vector<double> priorities(10, 2.0);
  EXPECT_EQ(store.UpdatePriorities(keys.data(), priorities.data(), 10), 7u);
  ASSERT_VALID(store);
  EXPECT_EQ(store.TotalMass(), 14.0);
  StoreStats st = store.Stats();
  EXPECT_EQ(st.updated, 7u);
  EXPECT_EQ(st.stale_updates, 3u);
  EXPECT_EQ(st.erased, 3u);

  // Keys that were never issued: key 0, a shard that does not exist, a slot never used.
  const std::vector<Key> bogus = {0, MakeKey(200, 0, 1), MakeKey(3, 123456, 1), MakeKey(kMaxShards - 1, 1, 1)};
  const std::vector<double> ones(bogus.size(), 1.0);
  EXPECT_EQ(store.UpdatePriorities(bogus.data(), ones.data(), bogus.size()), 0u);
  EXPECT_EQ(store.Erase(bogus.data(), bogus.size()), 0u);
  st = store.Stats();
  EXPECT_EQ(st.updated, 7u);
  EXPECT_EQ(st.stale_updates, 7u);
  EXPECT_EQ(store.Size(), 7u);
  EXPECT_EQ(store.TotalMass(), 14.0);
  ASSERT_VALID(store);
}

TEST(ShardedStoreTest, ClearRemovesEveryLiveItemAndLeavesHeldOnesToTheirBatch) {
  StoreConfig c = Config(4, 1000, 1.0);
  c.max_times_sampled = 1;
  ShardedStore store(c);
  std::vector<std::string> payloads;
  for (int i = 0; i < 20; ++i) payloads.push_back(PayloadFor(static_cast<uint64_t>(i)));
  const std::vector<Key> keys = Insert(store, std::vector<double>(20, 1.0), payloads);
  SampleResult held;
  store.Sample(3, 0.0, &held, /*hold=*/true);
  const size_t n_held = held.held.size();
  ASSERT_GT(n_held, 0u);
  ASSERT_EQ(store.Size() + n_held, 20u);

  EXPECT_EQ(store.Clear(), 20u - n_held);
  ASSERT_VALID(store);
  EXPECT_EQ(store.Size(), 0u);
  EXPECT_EQ(store.Held(), n_held);
  EXPECT_EQ(store.Stats().erased, 20u - n_held);
  const std::vector<double> twos(keys.size(), 2.0);
  EXPECT_EQ(store.UpdatePriorities(keys.data(), twos.data(), keys.size()), 0u);  // every key stale
  EXPECT_EQ(store.Erase(keys.data(), keys.size()), 0u);
  // The held batch is settled as if nothing happened: a reply not sent gives its items back.
  EXPECT_EQ(store.GiveBack(held.held.data(), n_held, held.keys.data(), held.keys.size()), n_held);
  EXPECT_EQ(store.Size(), n_held);
  EXPECT_EQ(store.Clear(), n_held);
  EXPECT_EQ(store.Stats().bytes_held, 0u);
  EXPECT_EQ(store.TotalMass(), 0.0);

  // The store serves on: new items get new keys.
  const std::vector<Key> again = Insert(store, std::vector<double>(5, 1.0), {"a", "b", "c", "d", "e"});
  for (Key k : again) EXPECT_EQ(std::count(keys.begin(), keys.end(), k), 0);
  EXPECT_EQ(store.Size(), 5u);
  ASSERT_VALID(store);
}

TEST(ShardedStoreTest, InsertCopiesThePayloadBytes) {
  ShardedStore store(Config(2, 100, 1.0, 3));
  std::string a = "original-a", b(3000, 'b');  // a small item and one past the 1 KiB size classes
  Insert(store, {1.0, 1.0}, {a, b});
  std::vector<std::string> payloads = {std::string(40, 'z'), ""};  // the caller's buffers change afterwards
  const std::vector<Key> keys = Insert(store, {1.0, 1.0}, payloads);
  payloads[0].assign(40, '#');
  a.assign(a.size(), '#');
  std::set<std::string> seen;
  for (int call = 0; call < 20; ++call) {
    const SampleResult r = Sample(store, 16, 0.5);
    for (size_t j = 0; j < r.keys.size(); ++j) seen.insert(ItemBytes(r, j));
  }
  EXPECT_EQ(seen, (std::set<std::string>{"original-a", std::string(3000, 'b'), std::string(40, 'z'), ""}));
  EXPECT_EQ(store.Stats().bytes_held, 10u + 3000u + 40u + 0u);
}

TEST(ShardedStoreTest, EmptyBatchesAreNoOps) {
  ShardedStore store(Config(2, 10, 0.6));
  store.Insert(nullptr, nullptr, nullptr, 0, nullptr);
  EXPECT_EQ(store.UpdatePriorities(nullptr, nullptr, 0), 0u);
  EXPECT_EQ(store.Erase(nullptr, 0), 0u);
  EXPECT_EQ(store.Size(), 0u);
  StoreStats st = store.Stats();
  EXPECT_EQ(st.inserted + st.updated + st.stale_updates + st.erased, 0u);
  ASSERT_VALID(store);
}

TEST(ShardedStoreTest, StatsCountInsertsSamplesBytesAndCalls) {
  ShardedStore store(Config(3, 5, 1.0));
  const std::vector<Key> keys = Insert(store, {1, 2, 3, 4, 5, 6, 7}, {"a", "bb", "ccc", "", "e", "ff", "g"});
  ASSERT_VALID(store);
  Sample(store, 10, 0.4);
  Sample(store, 5, 0.4);
  EXPECT_EQ(store.RemoveToFit(), 2u);
  EXPECT_EQ(store.RemoveToFit(), 0u);
  ASSERT_VALID(store);
  const StoreStats st = store.Stats();
  EXPECT_EQ(st.inserted, 7u);
  EXPECT_EQ(st.sampled, 15u);
  EXPECT_EQ(st.sample_calls, 2u);
  EXPECT_EQ(st.evicted, 2u);
  EXPECT_EQ(st.remove_to_fit_calls, 2u);
  EXPECT_EQ(st.size, 5u);
  EXPECT_EQ(st.bytes_held, 3u + 0u + 1u + 2u + 1u);  // FIFO removed "a" and "bb"
  EXPECT_EQ(store.TotalMass(), 3.0 + 4.0 + 5.0 + 6.0 + 7.0);
}

// ---------------------------------------------------------------------------------------------------------
// Sampling

class SamplingFrequencyTest : public ::testing::TestWithParam<double> {};

TEST_P(SamplingFrequencyTest, DrawsFollowPriorityToTheAlpha) {
  const double alpha = GetParam();
  const double beta = 0.6;
  ShardedStore store(Config(4, 1000, alpha, 2024));
  std::vector<double> priorities;
  std::vector<std::string> payloads;
  for (uint64_t i = 0; i < 24; ++i) {
    priorities.push_back(i % 8 == 5 ? 0.0 : 0.05 + 0.4 * static_cast<double>(i));
    payloads.push_back(PayloadFor(i));
  }
  const std::vector<Key> keys = Insert(store, priorities, payloads);
  ASSERT_VALID(store);
  std::map<Key, size_t> index;
  for (size_t i = 0; i < keys.size(); ++i) index[keys[i]] = i;
  std::vector<double> mass(keys.size()), p(keys.size());
  double total = 0.0, min_mass = kInf;
  for (size_t i = 0; i < keys.size(); ++i) {
    mass[i] = alpha == 0.0 ? 1.0 : std::pow(priorities[i], alpha);
    total += mass[i];
    if (mass[i] > 0.0) min_mass = std::min(min_mass, mass[i]);
  }
  for (size_t i = 0; i < keys.size(); ++i) p[i] = mass[i] / total;
  EXPECT_NEAR(store.TotalMass(), total, 1e-12 * total);

  std::vector<uint64_t> counts(keys.size(), 0);
  const int calls = 2000;
  const size_t batch = 50;
  SampleResult r;
  for (int call = 0; call < calls; ++call) {
    store.Sample(batch, beta, &r);
    ASSERT_EQ(r.keys.size(), batch);
    for (size_t j = 0; j < batch; ++j) {
      auto it = index.find(r.keys[j]);
      ASSERT_NE(it, index.end()) << "sampled a key that was never issued";
      const size_t i = it->second;
      ASSERT_GT(p[i], 0.0) << "sampled an item of zero mass";
      ++counts[i];
      ASSERT_NEAR(r.probabilities[j], p[i], 1e-12 * p[i]) << "item " << i;
      const double w = std::pow(mass[i] / min_mass, -beta);
      ASSERT_NEAR(r.weights[j], w, 1e-6 * w) << "item " << i;
      ASSERT_EQ(ItemBytes(r, j), payloads[i]);
    }
  }
  uint64_t dof = 0;
  for (double x : p) dof += x > 0.0 ? 1 : 0;
  dof -= 1;
  const double chi2 = ChiSquare(counts, p, static_cast<uint64_t>(calls) * batch);
  // Mean dof, sd sqrt(2 dof); 8 sd above the mean is far out in the tail (stratification only lowers it).
  EXPECT_LT(chi2, static_cast<double>(dof) + 8.0 * std::sqrt(2.0 * static_cast<double>(dof))) << "alpha " << alpha;
  EXPECT_EQ(store.Stats().sampled, static_cast<uint64_t>(calls) * batch);
  ASSERT_VALID(store);
}

INSTANTIATE_TEST_SUITE_P(ShardedStoreTest, SamplingFrequencyTest, ::testing::Values(0.0, 0.6, 1.0),
                         [](const ::testing::TestParamInfo<double>& param_info) {
                           return "Alpha" + std::to_string(static_cast<int>(std::lround(param_info.param * 10)));
                         });

TEST(ShardedStoreTest, ImportanceWeightsMatchTheHandComputedFormula) {
  // alpha = 0.5: masses are square roots {0, 1, 2, 3, 4, 0.5}; the smallest positive mass is 0.5 (the zero
  // item is never the minimum), so w_k = (m_k / 0.5)^-beta.
  ShardedStore store(Config(3, 100, 0.5, 9));
  const std::vector<double> priorities = {0.0, 1.0, 4.0, 9.0, 16.0, 0.25};
  const std::vector<double> masses = {0.0, 1.0, 2.0, 3.0, 4.0, 0.5};
  std::vector<std::string> payloads;
  for (uint64_t i = 0; i < 6; ++i) payloads.push_back(PayloadFor(i));
  const std::vector<Key> keys = Insert(store, priorities, payloads);
  ASSERT_VALID(store);
  EXPECT_EQ(store.TotalMass(), 10.5);
  for (double beta : {0.0, 0.4, 1.0, 3.0}) {
    SCOPED_TRACE("beta " + std::to_string(beta));
    const SampleResult r = Sample(store, 500, beta);
    std::set<size_t> seen;
    for (size_t j = 0; j < r.keys.size(); ++j) {
      const size_t i = static_cast<size_t>(std::find(keys.begin(), keys.end(), r.keys[j]) - keys.begin());
      ASSERT_LT(i, keys.size());
      ASSERT_NE(i, 0u) << "the zero-priority item was sampled";
      seen.insert(i);
      const float expected = static_cast<float>(std::pow(masses[i] / 0.5, -beta));
      EXPECT_FLOAT_EQ(r.weights[j], expected) << "item " << i;
      EXPECT_DOUBLE_EQ(r.probabilities[j], masses[i] / 10.5);
    }
    EXPECT_EQ(seen.size(), 5u);  // 500 stratified draws reach every positive item
  }
  // Exact values for beta = 1: w = 0.5 / m.
  const SampleResult r = Sample(store, 200, 1.0);
  for (size_t j = 0; j < r.keys.size(); ++j) {
    const size_t i = static_cast<size_t>(std::find(keys.begin(), keys.end(), r.keys[j]) - keys.begin());
    EXPECT_EQ(r.weights[j], static_cast<float>(0.5 / masses[i]));
  }
}

TEST(ShardedStoreTest, WeightsStayPositiveWhenTheRatioUnderflowsAFloat) {
  ShardedStore store(Config(1, 10, 1.0));
  Insert(store, {1e-300, 1.0}, {"tiny", "big"});
  const SampleResult r = Sample(store, 8, 1.0);  // (1 / 1e-300)^-1 = 1e-300: below any float
  for (size_t j = 0; j < r.keys.size(); ++j) {
    if (ItemBytes(r, j) == "big") {
      EXPECT_EQ(r.weights[j], FLT_MIN);
    }
  }
}

TEST(ShardedStoreTest, AllZeroPrioritiesFallBackToUniformSampling) {
  ShardedStore store(Config(4, 100, 0.6, 3));
  std::vector<std::string> payloads;
  for (uint64_t i = 0; i < 10; ++i) payloads.push_back(PayloadFor(i));
  const std::vector<Key> keys = Insert(store, std::vector<double>(10, 0.0), payloads);
  ASSERT_VALID(store);
  EXPECT_EQ(store.TotalMass(), 0.0);
  std::vector<uint64_t> counts(10, 0);
  const int calls = 1000;
  for (int call = 0; call < calls; ++call) {
    const SampleResult r = Sample(store, 40, 0.7);
    for (size_t j = 0; j < r.keys.size(); ++j) {
      const size_t i = static_cast<size_t>(std::find(keys.begin(), keys.end(), r.keys[j]) - keys.begin());
      ASSERT_LT(i, keys.size());
      ++counts[i];
      ASSERT_DOUBLE_EQ(r.probabilities[j], 0.1);
      ASSERT_EQ(r.weights[j], 1.0f);
      ASSERT_EQ(ItemBytes(r, j), payloads[i]);
    }
  }
  // 9 dof: 9 + 8 sd.
  EXPECT_LT(ChiSquare(counts, std::vector<double>(10, 0.1), calls * 40), 9.0 + 8.0 * std::sqrt(18.0));
  // One positive priority: every draw is that item, with probability 1 and weight 1.
  const double one = 1.0;
  ASSERT_EQ(store.UpdatePriorities(&keys[7], &one, 1), 1u);
  ASSERT_VALID(store);
  const SampleResult r = Sample(store, 64, 0.7);
  for (size_t j = 0; j < r.keys.size(); ++j) {
    EXPECT_EQ(r.keys[j], keys[7]);
    EXPECT_EQ(r.probabilities[j], 1.0);
    EXPECT_EQ(r.weights[j], 1.0f);
  }
}

TEST(ShardedStoreTest, AlphaZeroSamplesZeroPrioritiesUniformlyToo) {
  ShardedStore store(Config(2, 100, 0.0, 4));
  const std::vector<Key> keys = Insert(store, {0.0, 5.0, 0.0, 100.0}, {"a", "b", "c", "d"});
  EXPECT_EQ(store.TotalMass(), 4.0);
  std::map<Key, int> counts;
  for (int call = 0; call < 200; ++call) {
    const SampleResult r = Sample(store, 20, 0.5);
    for (size_t j = 0; j < r.keys.size(); ++j) {
      ++counts[r.keys[j]];
      ASSERT_DOUBLE_EQ(r.probabilities[j], 0.25);
      ASSERT_EQ(r.weights[j], 1.0f);
    }
  }
  ASSERT_EQ(counts.size(), 4u);
  for (const auto& kv : counts) EXPECT_NEAR(kv.second, 1000, 150);
}

TEST(ShardedStoreTest, SamplingSkipsEmptyShards) {
  ShardedStore store(Config(16, 100, 1.0, 5));
  const std::vector<Key> keys = Insert(store, {1.0, 3.0}, {"one", "three"});
  // One insert call of 2 items is one chunk: 15 shards stay empty.
  std::map<Key, int> counts;
  for (int call = 0; call < 100; ++call) {
    const SampleResult r = Sample(store, 40, 0.5);
    for (size_t j = 0; j < r.keys.size(); ++j) {
      ++counts[r.keys[j]];
      ASSERT_TRUE(r.keys[j] == keys[0] || r.keys[j] == keys[1]);
      ASSERT_EQ(ItemBytes(r, j), r.keys[j] == keys[0] ? "one" : "three");
    }
  }
  EXPECT_NEAR(counts[keys[1]] / 4000.0, 0.75, 0.02);
}

TEST(ShardedStoreTest, SampleResultBuffersAreReusedAcrossCalls) {
  ShardedStore store(Config(2, 100, 1.0, 6));
  Insert(store, {1.0, 1.0, 1.0}, {"xx", "yyyy", "z"});
  SampleResult r;
  store.Sample(100, 0.5, &r);
  EXPECT_EQ(r.keys.size(), 100u);
  store.Sample(3, 0.5, &r);  // a smaller batch into the same result: nothing left over
  ASSERT_EQ(r.keys.size(), 3u);
  ASSERT_EQ(r.weights.size(), 3u);
  ASSERT_EQ(r.probabilities.size(), 3u);
  ASSERT_EQ(r.offsets.size(), 4u);
  EXPECT_EQ(r.offsets[0], 0u);
  EXPECT_EQ(r.offsets[3], r.data.size());
  size_t bytes = 0;
  for (size_t j = 0; j < 3; ++j) bytes += ItemBytes(r, j).size();
  EXPECT_EQ(bytes, r.data.size());
}

// The batch totals a client combines several stores with: T = sum of masses, m_min = smallest positive mass,
// N = items, and probability_k * T == m_k, weight_k = (m_k / m_min)^-beta for every draw.
void ExpectBatchTotals(ShardedStore& store, const std::map<Key, double>& priorities, double alpha) {
  double total = 0.0, min_mass = kInf;
  for (const auto& kv : priorities) {
    const double m = std::pow(kv.second, alpha);
    total += m;
    if (m > 0.0) min_mass = std::min(min_mass, m);
  }
  const double beta = 0.6;
  for (int call = 0; call < 20; ++call) {
    const SampleResult r = Sample(store, 64, beta);
    EXPECT_NEAR(r.total_mass, total, 1e-12 * total);
    EXPECT_EQ(r.total_mass, store.TotalMass());
    EXPECT_DOUBLE_EQ(r.min_mass, min_mass);
    EXPECT_EQ(r.min_mass, store.MinMass());
    EXPECT_EQ(r.size, priorities.size());
    for (size_t j = 0; j < r.keys.size(); ++j) {
      const auto it = priorities.find(r.keys[j]);
      ASSERT_NE(it, priorities.end()) << "drew a key not in the store";
      const double mass = std::pow(it->second, alpha);
      ASSERT_GT(mass, 0.0) << "drew an item of mass 0";
      EXPECT_NEAR(r.probabilities[j] * r.total_mass, mass, 1e-13 * mass);
      EXPECT_NEAR(r.probabilities[j], mass / total, 1e-12 * mass / total);
      EXPECT_FLOAT_EQ(r.weights[j], static_cast<float>(std::pow(mass / r.min_mass, -beta)));
    }
  }
}

TEST(ShardedStoreTest, BatchTotalsDescribeTheStoreAcrossShardsUpdatesAndErases) {
  const double alpha = 0.7;
  ShardedStore store(Config(8, 10000, alpha, 11));
  std::map<Key, double> priorities;
  Rng rng(5, 0);
  for (int call = 0; call < 20; ++call) {  // 20 chunks of 50: round robin over all 8 shards
    std::vector<double> p;
    std::vector<std::string> payloads;
    for (int i = 0; i < 50; ++i) {
      p.push_back(0.01 + 10.0 * rng.Uniform());
      payloads.push_back(PayloadFor(call * 50 + i));
    }
    const std::vector<Key> keys = Insert(store, p, payloads);
    for (size_t i = 0; i < keys.size(); ++i) priorities[keys[i]] = p[i];
  }
  ASSERT_VALID(store);
  std::set<uint32_t> shards;
  for (const auto& kv : priorities) shards.insert(SplitKey(kv.first).shard);
  ASSERT_EQ(shards.size(), 8u);
  ExpectBatchTotals(store, priorities, alpha);

  // New priorities, among them a new smallest mass and some zeros (out of the draw, not of the size).
  std::vector<Key> keys;
  std::vector<double> p;
  for (const auto& kv : priorities) {
    if (keys.size() == 300) break;
    keys.push_back(kv.first);
    p.push_back(keys.size() % 10 == 0 ? 0.0 : keys.size() == 7 ? 1e-6 : 20.0 * rng.Uniform() + 1e-3);
  }
  ASSERT_EQ(store.UpdatePriorities(keys.data(), p.data(), keys.size()), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) priorities[keys[i]] = p[i];
  ASSERT_VALID(store);
  ExpectBatchTotals(store, priorities, alpha);

  // Erase a third, the smallest mass among them: the totals follow.
  std::vector<Key> gone;
  size_t i = 0;
  for (const auto& kv : priorities) {
    if (i++ % 3 == 0 || kv.second == 1e-6) gone.push_back(kv.first);
  }
  ASSERT_EQ(store.Erase(gone.data(), gone.size()), gone.size());
  for (const Key k : gone) priorities.erase(k);
  ASSERT_VALID(store);
  ExpectBatchTotals(store, priorities, alpha);
}

TEST(ShardedStoreTest, BatchTotalsOfTheUniformFallbackAreZeroMassAndTheSize) {
  ShardedStore store(Config(4, 100, 0.6, 3));
  std::vector<std::string> payloads;
  for (uint64_t i = 0; i < 10; ++i) payloads.push_back(PayloadFor(i));
  const std::vector<Key> keys = Insert(store, std::vector<double>(10, 0.0), payloads);
  const SampleResult r = Sample(store, 40, 0.7);
  EXPECT_EQ(r.total_mass, 0.0);
  EXPECT_EQ(r.min_mass, 0.0);
  EXPECT_EQ(store.MinMass(), 0.0);
  EXPECT_EQ(r.size, 10u);
  for (size_t j = 0; j < r.keys.size(); ++j) {
    EXPECT_EQ(r.probabilities[j], 0.1);
    EXPECT_EQ(r.weights[j], 1.0f);
  }
  // One positive mass: back to proportional, with that item's mass as T and m_min.
  const double two = 2.0;
  ASSERT_EQ(store.UpdatePriorities(&keys[3], &two, 1), 1u);
  const SampleResult p = Sample(store, 8, 0.7);
  EXPECT_EQ(p.total_mass, std::pow(2.0, 0.6));
  EXPECT_EQ(p.min_mass, std::pow(2.0, 0.6));
  EXPECT_EQ(p.size, 10u);
}

TEST(ShardedStoreTest, SameSeedAndCallsGiveTheSameSamples) {
  ShardedStore a(Config(4, 100, 0.6, 42)), b(Config(4, 100, 0.6, 42)), c(Config(4, 100, 0.6, 43));
  std::vector<double> pr;
  std::vector<std::string> pl;
  for (uint64_t i = 0; i < 50; ++i) {
    pr.push_back(0.1 * static_cast<double>(i + 1));
    pl.push_back(PayloadFor(i));
  }
  EXPECT_EQ(Insert(a, pr, pl), Insert(b, pr, pl));
  Insert(c, pr, pl);
  ExpectSameState(a, b);
  EXPECT_NE(Sample(a, 32, 0.4).keys, Sample(c, 32, 0.4).keys) << "the seed should matter";
}

// ---------------------------------------------------------------------------------------------------------
// RemoveToFit

TEST(ShardedStoreTest, FifoRemoveToFitRemovesTheGloballyOldestAcrossShards) {
  StoreConfig cfg = Config(4, 25, 0.6, 7);
  cfg.eviction = EvictionKind::kFifo;
  cfg.max_size = 1'000'000;  // above what the test inserts: only RemoveToFit evicts
  ShardedStore store(cfg);
  std::vector<Key> order;  // every key, in insertion order
  uint64_t id = 0;
  const size_t batch_sizes[] = {1, 5, 70, 2, 3, 1, 1, 9};  // 70 spans two chunks, so two shards
  for (size_t n : batch_sizes) {
    std::vector<double> pr;
    std::vector<std::string> pl;
    for (size_t i = 0; i < n; ++i) {
      pr.push_back(static_cast<double>((id * 7) % 5));  // priorities must not matter to FIFO
      pl.push_back(PayloadFor(id++));
    }
    const auto keys = Insert(store, pr, pl);
    order.insert(order.end(), keys.begin(), keys.end());
  }
  ASSERT_EQ(order.size(), 92u);
  ASSERT_VALID(store);
  // Priorities of the oldest items go up: FIFO must ignore them.
  std::vector<double> high(10, 1000.0);
  ASSERT_EQ(store.UpdatePriorities(order.data(), high.data(), 10), 10u);
  EXPECT_EQ(store.RemoveToFit(), 67u);
  ASSERT_VALID(store);
  EXPECT_EQ(store.Size(), 25u);
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(IsLive(store, order[i], 1.0), i >= 67) << "item " << i;
  }
  EXPECT_EQ(store.RemoveToFit(), 0u);

  // Erasing some of the newest leaves the store under capacity; new inserts then push out the oldest live.
  std::vector<Key> erased = {order[90], order[80]};
  ASSERT_EQ(store.Erase(erased.data(), erased.size()), 2u);
  for (uint64_t i = 0; i < 6; ++i) {
    const auto keys = Insert(store, {1.0}, {PayloadFor(id++)});
    order.push_back(keys[0]);
  }
  EXPECT_EQ(store.RemoveToFit(), 4u);  // 23 + 6 = 29 -> 25: items 67..70 go
  ASSERT_VALID(store);
  for (size_t i = 67; i < order.size(); ++i) {
    const bool live = i >= 71 && i != 80 && i != 90;
    EXPECT_EQ(IsLive(store, order[i], 1.0), live) << "item " << i;
  }
  const StoreStats st = store.Stats();
  EXPECT_EQ(st.evicted, 71u);
  EXPECT_EQ(st.erased, 2u);
  EXPECT_EQ(st.size, st.inserted - st.evicted - st.erased);
}

TEST(ShardedStoreTest, FifoRemoveToFitHandlesAnExcessLargerThanOneRound) {
  StoreConfig cfg = Config(3, 1000, 1.0, 8);
  cfg.max_size = 1'000'000;  // above what the test inserts: only RemoveToFit evicts
  ShardedStore store(cfg);
  std::vector<Key> order;
  const size_t total = 70000;  // excess 69000, more than the 65536 candidates of one round
  for (size_t done = 0; done < total;) {
    const size_t n = std::min<size_t>(5000, total - done);
    std::vector<std::string> pl(n, "p");
    const auto keys = Insert(store, std::vector<double>(n, 1.0), pl);
    order.insert(order.end(), keys.begin(), keys.end());
    done += n;
  }
  EXPECT_EQ(store.RemoveToFit(), total - 1000);
  ASSERT_VALID(store);
  std::vector<double> ones(total, 1.0);
  EXPECT_EQ(store.UpdatePriorities(order.data(), ones.data(), total - 1000), 0u);
  EXPECT_EQ(store.UpdatePriorities(order.data() + (total - 1000), ones.data(), 1000), 1000u);
}

TEST(ShardedStoreTest, PrioritizedRemoveToFitRemovesLowPrioritiesFarMoreOften) {
  StoreConfig cfg = Config(4, 500, 0.6, 10);
  cfg.eviction = EvictionKind::kPrioritized;
  cfg.alpha_evict = -0.4;  // weight 0.01^-0.4 ~ 6.3 against 1 for priority 1
  ShardedStore store(cfg);
  std::vector<Key> low, high;
  for (uint64_t i = 0; i < 500; ++i) {
    const auto keys = Insert(store, {0.01, 1.0}, {PayloadFor(2 * i), PayloadFor(2 * i + 1)});
    low.push_back(keys[0]);
    high.push_back(keys[1]);
  }
  ASSERT_VALID(store);
  EXPECT_EQ(store.RemoveToFit(), 500u);
  ASSERT_VALID(store);
  EXPECT_EQ(store.Size(), 500u);
  size_t low_left = 0, high_left = 0;
  for (Key k : low) low_left += IsLive(store, k, 0.01) ? 1 : 0;
  for (Key k : high) high_left += IsLive(store, k, 1.0) ? 1 : 0;
  EXPECT_EQ(low_left + high_left, 500u);
  EXPECT_LT(low_left * 3, high_left) << low_left << " low vs " << high_left << " high priorities left";
  EXPECT_EQ(store.Stats().evicted, 500u);
}

TEST(ShardedStoreTest, PrioritizedRemoveToFitTakesZeroPrioritiesFirst) {
  StoreConfig cfg = Config(4, 100, 0.6, 11);
  cfg.eviction = EvictionKind::kPrioritized;
  cfg.alpha_evict = -0.4;
  ShardedStore store(cfg);
  std::vector<Key> zero, positive;
  for (uint64_t i = 0; i < 130; ++i) {
    const double p = i % 13 < 3 ? 0.0 : 0.5;  // 30 zeros spread over the shards
    const Key k = Insert(store, {p}, {PayloadFor(i)})[0];
    (p == 0.0 ? zero : positive).push_back(k);
  }
  ASSERT_EQ(zero.size(), 30u);
  EXPECT_EQ(store.RemoveToFit(), 30u);
  ASSERT_VALID(store);
  for (Key k : zero) EXPECT_FALSE(IsLive(store, k, 0.0));
  for (Key k : positive) EXPECT_TRUE(IsLive(store, k, 0.5));
}

TEST(ShardedStoreTest, PositiveAlphaEvictRemovesHighPrioritiesMoreOften) {
  StoreConfig cfg = Config(2, 200, 1.0, 12);
  cfg.eviction = EvictionKind::kPrioritized;
  cfg.alpha_evict = 1.0;
  ShardedStore store(cfg);
  std::vector<Key> low, high;
  for (uint64_t i = 0; i < 200; ++i) {
    const auto keys = Insert(store, {0.1, 2.0}, {PayloadFor(2 * i), PayloadFor(2 * i + 1)});
    low.push_back(keys[0]);
    high.push_back(keys[1]);
  }
  EXPECT_EQ(store.RemoveToFit(), 200u);
  ASSERT_VALID(store);
  size_t low_left = 0, high_left = 0;
  for (Key k : low) low_left += IsLive(store, k, 0.1) ? 1 : 0;
  for (Key k : high) high_left += IsLive(store, k, 2.0) ? 1 : 0;
  EXPECT_LT(high_left * 3, low_left);
}

TEST(ShardedStoreTest, PrioritizedRemoveToFitWithNoEvictionMassRemovesUniformly) {
  // alpha_evict > 0 and every priority 0: no shard has eviction mass; victims are split by size.
  StoreConfig cfg = Config(4, 60, 0.6, 13);
  cfg.eviction = EvictionKind::kPrioritized;
  cfg.alpha_evict = 0.5;
  ShardedStore store(cfg);
  for (uint64_t i = 0; i < 100; ++i) Insert(store, {0.0}, {PayloadFor(i)});
  EXPECT_EQ(store.RemoveToFit(), 40u);
  ASSERT_VALID(store);
  EXPECT_EQ(store.Size(), 60u);
}

// Inserts one item per priority, in batches of varying size so they spread over the shards; returns the keys.
std::vector<Key> InsertSpread(ShardedStore& store, const std::vector<double>& priorities, uint64_t first_id) {
  std::vector<Key> keys;
  const size_t batch_sizes[] = {1, 7, 70, 3, 2};
  for (size_t done = 0, b = 0; done < priorities.size(); ++b) {
    const size_t n = std::min(batch_sizes[b % 5], priorities.size() - done);
    std::vector<std::string> pl;
    for (size_t i = 0; i < n; ++i) pl.push_back(PayloadFor(first_id + done + i));
    const auto k = Insert(store, std::vector<double>(priorities.begin() + done, priorities.begin() + done + n), pl);
    keys.insert(keys.end(), k.begin(), k.end());
    done += n;
  }
  return keys;
}

TEST(ShardedStoreTest, LowestPriorityRemoveToFitRemovesTheGloballyLowestAcrossShards) {
  StoreConfig cfg = Config(4, 30, 0.6, 14);
  cfg.eviction = EvictionKind::kLowestPriority;
  cfg.max_size = 1'000'000;  // above what the test inserts: only RemoveToFit evicts
  ShardedStore store(cfg);
  // Priorities 1..100 in a shuffled order.
  std::vector<double> priorities(100);
  for (size_t i = 0; i < priorities.size(); ++i) priorities[i] = static_cast<double>(i + 1);
  Rng rng(15);
  for (size_t i = priorities.size() - 1; i > 0; --i) std::swap(priorities[i], priorities[rng.Below(i + 1)]);
  const std::vector<Key> keys = InsertSpread(store, priorities, 0);
  ASSERT_VALID(store);
  // Updates move items in the order: the two lowest become the two highest, and two of the highest sink.
  for (size_t i = 0; i < keys.size(); ++i) {
    double p = priorities[i];
    if (p <= 2.0) p += 200.0;                 // 1, 2 -> 201, 202
    if (p == 99.0 || p == 100.0) p /= 400.0;  // 99, 100 -> 0.2475, 0.25
    if (p != priorities[i]) {
      ASSERT_EQ(store.UpdatePriorities(&keys[i], &p, 1), 1u);
      priorities[i] = p;
    }
  }
  EXPECT_EQ(store.RemoveToFit(), 70u);
  ASSERT_VALID(store);
  std::vector<double> sorted = priorities;
  std::sort(sorted.begin(), sorted.end());
  const double lowest_kept = sorted[70];
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(IsLive(store, keys[i], priorities[i]), priorities[i] >= lowest_kept) << "priority " << priorities[i];
  }
  EXPECT_EQ(store.Stats().evicted, 70u);
}

TEST(ShardedStoreTest, LowestPriorityRemoveToFitTakesEveryLowerPriorityBeforeAnyTiedOne) {
  // 10 items of priority 0 (half of them -0.0), 30 of 1 and 20 of 2, spread over 3 shards; 25 must go: all
  // zeros and 15 of the ones, whichever shards the ties sit in.
  StoreConfig cfg = Config(3, 35, 1.0, 16);
  cfg.eviction = EvictionKind::kLowestPriority;
  ShardedStore store(cfg);
  std::vector<double> priorities;
  for (int i = 0; i < 30; ++i) priorities.push_back(1.0);
  for (int i = 0; i < 20; ++i) priorities.push_back(2.0);
  for (int i = 0; i < 10; ++i) priorities.push_back(i % 2 == 0 ? 0.0 : -0.0);
  const std::vector<Key> keys = InsertSpread(store, priorities, 0);
  EXPECT_EQ(store.RemoveToFit(), 25u);
  ASSERT_VALID(store);
  std::map<double, size_t> live;
  for (size_t i = 0; i < keys.size(); ++i) live[priorities[i]] += IsLive(store, keys[i], priorities[i]) ? 1 : 0;
  EXPECT_EQ(live[0.0], 0u);
  EXPECT_EQ(live[1.0], 15u);
  EXPECT_EQ(live[2.0], 20u);
}

TEST(ShardedStoreTest, LowestPriorityRemoveToFitHandlesAnExcessLargerThanOneRound) {
  StoreConfig cfg = Config(3, 1000, 1.0, 17);
  cfg.eviction = EvictionKind::kLowestPriority;
  cfg.max_size = 1'000'000;  // above what the test inserts: only RemoveToFit evicts
  ShardedStore store(cfg);
  const size_t total = 70000;  // excess 69000, more than one ordered round
  std::vector<double> priorities(total);
  Rng rng(18);
  for (double& p : priorities) p = rng.Uniform();
  std::vector<Key> keys;
  for (size_t done = 0; done < total; done += 5000) {
    const std::vector<double> batch(priorities.begin() + done, priorities.begin() + done + 5000);
    const auto k = Insert(store, batch, std::vector<std::string>(5000, "p"));
    keys.insert(keys.end(), k.begin(), k.end());
  }
  EXPECT_EQ(store.RemoveToFit(), total - 1000);
  ASSERT_VALID(store);
  std::vector<double> sorted = priorities;
  std::sort(sorted.begin(), sorted.end());
  size_t kept_wrong = 0;
  for (size_t i = 0; i < total; ++i) {
    if (IsLive(store, keys[i], priorities[i]) != (priorities[i] >= sorted[total - 1000])) ++kept_wrong;
  }
  EXPECT_EQ(kept_wrong, 0u);
}

// ---------------------------------------------------------------------------------------------------------
// Invalid input

TEST(ShardedStoreTest, InvalidInputThrowsInvalidArgumentAndChangesNothing) {
  const StoreConfig cfg = Config(4, 100, 0.6, 21);
  ShardedStore store(cfg), twin(cfg);  // `twin` gets only the valid calls
  std::vector<double> pr;
  std::vector<std::string> pl;
  for (uint64_t i = 0; i < 40; ++i) {
    pr.push_back(0.25 * static_cast<double>(i % 9));
    pl.push_back(PayloadFor(i));
  }
  const std::vector<Key> keys = Insert(store, pr, pl);
  ASSERT_EQ(Insert(twin, pr, pl), keys);
  ExpectSameState(store, twin);

  for (double bad : {kNaN, kInf, -kInf, -1.0, -1e-300}) {
    SCOPED_TRACE("priority " + std::to_string(bad));
    // The bad priority comes last: nothing before it may have been inserted or updated.
    EXPECT_THROW(Insert(store, {1.0, 2.0, bad}, {"x", "y", "z"}), InvalidArgument);
    const std::vector<double> update = {5.0, 6.0, bad};
    EXPECT_THROW(store.UpdatePriorities(keys.data(), update.data(), 3), InvalidArgument);
    ASSERT_VALID(store);
  }
  SampleResult r;
  EXPECT_THROW(store.Sample(0, 0.4, &r), InvalidArgument);
  for (double bad_beta : {-0.1, kNaN, kInf}) EXPECT_THROW(store.Sample(4, bad_beta, &r), InvalidArgument);
  // An item larger than 4 GiB - 1 is refused before any byte is copied.
  const uint8_t small[1] = {0};
  const uint8_t* data[2] = {small, small};
  const uint64_t sizes[2] = {1, uint64_t{1} << 33};
  const double two[2] = {1.0, 1.0};
  Key out[2];
  EXPECT_THROW(store.Insert(two, data, sizes, 2, out), InvalidArgument);
  ASSERT_VALID(store);
  ExpectSameState(store, twin);
}

TEST(ShardedStoreTest, NegativePriorityIsRejectedWhateverTheAlpha) {
  // With alpha 1 a negative priority would be a finite (negative) mass, with alpha 0 a mass of 1: the
  // priority itself must be checked, not only the mass it gives.
  for (double alpha : {0.0, 1.0, 2.0}) {
    SCOPED_TRACE("alpha " + std::to_string(alpha));
    const StoreConfig cfg = Config(2, 100, alpha, 24);
    ShardedStore store(cfg), twin(cfg);
    const std::vector<Key> keys = Insert(store, {1.0, 3.0}, {"a", "b"});
    Insert(twin, {1.0, 3.0}, {"a", "b"});
    for (double bad : {-1.0, -0.5, -1e-300, -kInf, kNaN}) {
      EXPECT_THROW(Insert(store, {2.0, bad}, {"x", "y"}), InvalidArgument) << bad;
      const std::vector<double> update = {2.0, bad};
      EXPECT_THROW(store.UpdatePriorities(keys.data(), update.data(), 2), InvalidArgument) << bad;
    }
    ExpectSameState(store, twin);
  }
}

TEST(ShardedStoreTest, PriorityWhoseMassOverflowsIsRejected) {
  const StoreConfig cfg = Config(2, 100, 2.0, 22);
  ShardedStore store(cfg), twin(cfg);
  const std::vector<Key> keys = Insert(store, {1.0, 3.0}, {"a", "b"});
  Insert(twin, {1.0, 3.0}, {"a", "b"});
  EXPECT_THROW(Insert(store, {1e200}, {"big"}), InvalidArgument);  // (1e200)^2 is not finite
  const std::vector<double> update = {2.0, 1e200};
  EXPECT_THROW(store.UpdatePriorities(keys.data(), update.data(), 2), InvalidArgument);
  ExpectSameState(store, twin);
  EXPECT_EQ(store.TotalMass(), 10.0);
}

TEST(ShardedStoreTest, SamplingAnEmptyStoreThrowsAndChangesNothing) {
  const StoreConfig cfg = Config(4, 100, 0.6, 23);
  ShardedStore store(cfg), twin(cfg);
  SampleResult r;
  EXPECT_THROW(store.Sample(4, 0.4, &r), InvalidArgument);
  ExpectStatsEq(store.Stats(), twin.Stats());
  // A store emptied by erase is empty too.
  const std::vector<Key> keys = Insert(store, {1.0, 2.0}, {"a", "b"});
  Insert(twin, {1.0, 2.0}, {"a", "b"});
  ASSERT_EQ(store.Erase(keys.data(), 2), 2u);
  ASSERT_EQ(twin.Erase(keys.data(), 2), 2u);
  EXPECT_THROW(store.Sample(4, 0.4, &r), InvalidArgument);
  ExpectStatsEq(store.Stats(), twin.Stats());
  // Afterwards both stores sample the same items: the failed calls did not consume sampling state.
  std::vector<double> pr;
  std::vector<std::string> pl;
  for (uint64_t i = 0; i < 30; ++i) {
    pr.push_back(1.0 + static_cast<double>(i));
    pl.push_back(PayloadFor(i));
  }
  Insert(store, pr, pl);
  Insert(twin, pr, pl);
  ExpectSameState(store, twin);
}

TEST(ShardedStoreTest, BadConfigurationIsRejected) {
  auto make = [](StoreConfig c) { ShardedStore s(c); };
  StoreConfig ok = Config(8, 1000, 0.6);
  EXPECT_NO_THROW(make(ok));
  StoreConfig c = ok;
  c.shards = 0;
  EXPECT_THROW(make(c), InvalidArgument);
  c.shards = 257;
  EXPECT_THROW(make(c), InvalidArgument);
  c.shards = 256;
  EXPECT_NO_THROW(make(c));
  c.shards = 1;
  EXPECT_NO_THROW(make(c));
  c = ok;
  c.capacity = 0;
  EXPECT_THROW(make(c), InvalidArgument);
  c.capacity = 1;
  EXPECT_NO_THROW(make(c));
  for (double bad : {-0.1, -kInf, kInf, kNaN}) {
    c = ok;
    c.alpha = bad;
    EXPECT_THROW(make(c), InvalidArgument) << "alpha " << bad;
  }
  c = ok;
  c.alpha = 0.0;
  EXPECT_NO_THROW(make(c));
  for (double bad : {kInf, -kInf, kNaN}) {
    c = ok;
    c.alpha_evict = bad;
    EXPECT_THROW(make(c), InvalidArgument) << "alpha_evict " << bad;
  }
  c = ok;
  c.eviction = static_cast<EvictionKind>(7);
  EXPECT_THROW(make(c), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------------------
// Snapshots

class SnapshotTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.Path(name); }
  // Saves `store` as `name` and loads it back, checking the copy is valid and keeps the eviction kind; then
  // evicts the copy down to capacity, expecting `removed` evictions.
  std::unique_ptr<ShardedStore> RoundTripThenFit(const ShardedStore& store, const std::string& name, size_t removed) {
    store.Save(Path(name));
    std::unique_ptr<ShardedStore> loaded = ShardedStore::Load(Path(name));
    EXPECT_NO_THROW(loaded->Validate());
    EXPECT_EQ(loaded->config().eviction, store.config().eviction);
    EXPECT_EQ(loaded->RemoveToFit(), removed);
    EXPECT_NO_THROW(loaded->Validate());
    return loaded;
  }
  std::set<std::string> Files() const { return dir_.Files(); }
  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  static void WriteAll(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // "" if loading `path` throws SnapshotError, else what happened instead.
  static std::string LoadOutcome(const std::string& path) {
    try {
      std::unique_ptr<ShardedStore> s = ShardedStore::Load(path);
      return "loaded without error";
    } catch (const SnapshotError&) {
      return "";
    } catch (const std::exception& e) {
      return std::string("threw something other than SnapshotError: ") + e.what();
    }
  }

  testing_util::TempDir dir_{"apexrl_store_test"};
};

TEST_F(SnapshotTest, SaveLoadRoundTripKeepsItemsPrioritiesKeysOrderAndCounters) {
  StoreConfig cfg = Config(5, 40, 0.7, 77);
  cfg.eviction = EvictionKind::kFifo;
  cfg.alpha_evict = -0.25;
  ShardedStore store(cfg);
  struct Item {
    double priority;
    std::string payload;
  };
  std::map<Key, Item> live;
  std::vector<Key> order;  // every key ever issued, oldest first
  uint64_t id = 0;
  for (size_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 5}) {
    std::vector<double> pr;
    std::vector<std::string> pl;
    for (size_t i = 0; i < n; ++i, ++id) {
      pr.push_back(id % 7 == 0 ? 0.0 : 0.1 + 0.3 * static_cast<double>(id % 11));
      pl.push_back(PayloadFor(id));
    }
    const auto keys = Insert(store, pr, pl);
    for (size_t i = 0; i < n; ++i) {
      live[keys[i]] = Item{pr[i], pl[i]};
      order.push_back(keys[i]);
    }
  }
  ASSERT_EQ(order.size(), 50u);
  std::vector<Key> erase = {order[3], order[10], order[20], order[33], order[47]};
  ASSERT_EQ(store.Erase(erase.data(), erase.size()), 5u);
  for (Key k : erase) live.erase(k);
  std::vector<Key> upd = {order[1],  order[5],  order[8],  order[13], order[21],
                          order[34], order[40], order[44], order[49], order[3]};
  std::vector<double> upd_p = {2.0, 0.0, 1.5, 3.25, 0.125, 4.0, 0.5, 1.0, 2.5, 9.0};
  ASSERT_EQ(store.UpdatePriorities(upd.data(), upd_p.data(), upd.size()), 9u);  // order[3] is stale
  for (size_t i = 0; i < upd.size(); ++i) {
    if (live.count(upd[i])) live[upd[i]].priority = upd_p[i];
  }
  Sample(store, 16, 0.4);
  Sample(store, 16, 0.4);
  // 45 live, capacity 40: the 5 oldest live go.
  ASSERT_EQ(store.RemoveToFit(), 5u);
  for (size_t i = 0, removed = 0; removed < 5; ++i) {
    if (live.erase(order[i])) ++removed;
  }
  ASSERT_VALID(store);
  ASSERT_EQ(store.Size(), live.size());

  const std::string path = Path("store.snap");
  store.Save(path);
  EXPECT_EQ(Files(), std::set<std::string>{"store.snap"}) << "the temporary file was left behind";
  std::unique_ptr<ShardedStore> loaded = ShardedStore::Load(path);
  ASSERT_NE(loaded, nullptr);
  ASSERT_VALID(*loaded);

  // Configuration and counters.
  EXPECT_EQ(loaded->config().capacity, cfg.capacity);
  EXPECT_EQ(loaded->config().alpha, cfg.alpha);
  EXPECT_EQ(loaded->config().shards, cfg.shards);
  EXPECT_EQ(loaded->config().eviction, cfg.eviction);
  EXPECT_EQ(loaded->config().alpha_evict, cfg.alpha_evict);
  EXPECT_EQ(loaded->config().seed, cfg.seed);
  ExpectStatsEq(loaded->Stats(), store.Stats());
  EXPECT_EQ(loaded->Size(), live.size());
  EXPECT_EQ(loaded->TotalMass(), store.TotalMass());

  // Items and priorities, seen through sampling: every draw is a live item with its own payload and the
  // probability its priority gives.
  double total = 0.0;
  for (const auto& kv : live) total += std::pow(kv.second.priority, cfg.alpha);
  std::set<Key> drawn;
  for (int call = 0; call < 50; ++call) {
    const SampleResult r = Sample(*loaded, 64, 0.4);
    for (size_t j = 0; j < r.keys.size(); ++j) {
      auto it = live.find(r.keys[j]);
      ASSERT_NE(it, live.end()) << "sampled a key that is not live";
      EXPECT_EQ(ItemBytes(r, j), it->second.payload);
      EXPECT_NEAR(r.probabilities[j], std::pow(it->second.priority, cfg.alpha) / total, 1e-12);
      drawn.insert(r.keys[j]);
    }
  }
  size_t positive = 0;
  for (const auto& kv : live) positive += kv.second.priority > 0.0 ? 1 : 0;
  EXPECT_EQ(drawn.size(), positive);
  ASSERT_VALID(*loaded);

  // The loaded store continues the original's sampling stream.
  {
    std::unique_ptr<ShardedStore> again = ShardedStore::Load(path);
    const SampleResult ra = Sample(store, 32, 0.5), rb = Sample(*again, 32, 0.5);
    EXPECT_EQ(ra.keys, rb.keys);
    EXPECT_EQ(ra.weights, rb.weights);
  }

  // Old keys still address the same items; removed ones stay stale.
  for (Key k : order) {
    auto it = live.find(k);
    const double p = it != live.end() ? it->second.priority : 1.0;
    EXPECT_EQ(IsLive(*loaded, k, p), it != live.end());
  }
  const double big = 50.0;
  const Key target = order[30];
  ASSERT_EQ(loaded->UpdatePriorities(&target, &big, 1), 1u);
  live[target].priority = big;
  total = 0.0;
  for (const auto& kv : live) total += std::pow(kv.second.priority, cfg.alpha);
  EXPECT_NEAR(loaded->TotalMass(), total, 1e-12 * total);
  const SampleResult r = Sample(*loaded, 64, 0.4);
  for (size_t j = 0; j < r.keys.size(); ++j) {
    if (r.keys[j] == target) {
      EXPECT_NEAR(r.probabilities[j], std::pow(big, cfg.alpha) / total, 1e-12);
      EXPECT_EQ(ItemBytes(r, j), live[target].payload);
    }
  }
  ASSERT_VALID(*loaded);

  // FIFO order survives: 8 new items push out exactly the 8 oldest live ones.
  std::vector<Key> live_in_order;
  for (Key k : order) {
    if (live.count(k)) live_in_order.push_back(k);
  }
  for (uint64_t i = 0; i < 8; ++i) {
    const Key k = Insert(*loaded, {1.0}, {PayloadFor(1000 + i)})[0];
    EXPECT_EQ(live.count(k), 0u) << "a new key collides with a key issued before the snapshot";
    EXPECT_EQ(std::count(order.begin(), order.end(), k), 0) << "a key was issued twice";
    live_in_order.push_back(k);
  }
  EXPECT_EQ(loaded->RemoveToFit(), 8u);
  ASSERT_VALID(*loaded);
  for (size_t i = 0; i < live_in_order.size(); ++i) {
    EXPECT_EQ(IsLive(*loaded, live_in_order[i], 1.0), i >= 8) << "item " << i;
  }
}

TEST_F(SnapshotTest, PrioritizedStoreRoundTripKeepsUrgentItems) {
  StoreConfig cfg = Config(3, 20, 0.6, 31);
  cfg.eviction = EvictionKind::kPrioritized;
  cfg.alpha_evict = -0.4;
  ShardedStore store(cfg);
  std::vector<Key> zero, positive;
  for (uint64_t i = 0; i < 24; ++i) {
    const double p = i % 6 == 2 ? 0.0 : 1.0;
    (p == 0.0 ? zero : positive).push_back(Insert(store, {p}, {PayloadFor(i)})[0]);
  }
  std::unique_ptr<ShardedStore> loaded = RoundTripThenFit(store, "p.snap", 4);
  for (Key k : zero) EXPECT_FALSE(IsLive(*loaded, k, 0.0));
  for (Key k : positive) EXPECT_TRUE(IsLive(*loaded, k, 1.0));
}

TEST_F(SnapshotTest, LowestPriorityStoreRoundTripKeepsTheOrder) {
  StoreConfig cfg = Config(3, 10, 0.6, 32);
  cfg.eviction = EvictionKind::kLowestPriority;
  ShardedStore store(cfg);
  std::vector<double> priorities;
  for (uint64_t i = 0; i < 16; ++i) priorities.push_back(static_cast<double>((i * 7) % 16));  // 0..15 shuffled
  const std::vector<Key> keys = InsertSpread(store, priorities, 0);
  std::unique_ptr<ShardedStore> loaded = RoundTripThenFit(store, "l.snap", 6);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(IsLive(*loaded, keys[i], priorities[i]), priorities[i] >= 6.0) << "priority " << priorities[i];
  }
}

TEST_F(SnapshotTest, EmptyStoreRoundTrips) {
  ShardedStore store(Config(2, 10, 0.6, 1));
  store.Save(Path("empty.snap"));
  std::unique_ptr<ShardedStore> loaded = ShardedStore::Load(Path("empty.snap"));
  ASSERT_VALID(*loaded);
  EXPECT_EQ(loaded->Size(), 0u);
  SampleResult r;
  EXPECT_THROW(loaded->Sample(1, 0.4, &r), InvalidArgument);
  const Key k = Insert(*loaded, {1.0}, {"x"})[0];
  EXPECT_EQ(Sample(*loaded, 1, 0.4).keys[0], k);
}

TEST_F(SnapshotTest, SaveReplacesAnExistingSnapshot) {
  ShardedStore store(Config(2, 100, 1.0, 2));
  Insert(store, {1.0}, {"first"});
  store.Save(Path("s.snap"));
  Insert(store, {1.0}, {"second"});
  store.Save(Path("s.snap"));
  EXPECT_EQ(Files(), std::set<std::string>{"s.snap"});
  EXPECT_EQ(ShardedStore::Load(Path("s.snap"))->Size(), 2u);
}

TEST_F(SnapshotTest, FailedSaveLeavesNoTemporaryFile) {
  ShardedStore store(Config(2, 100, 1.0, 3));
  Insert(store, {1.0}, {"x"});
  // The destination is a directory: the temporary is written, the rename fails.
  std::filesystem::create_directory(Path("occupied"));
  EXPECT_THROW(store.Save(Path("occupied")), SnapshotError);
  EXPECT_EQ(Files(), std::set<std::string>{"occupied"});
  // A directory that does not exist: nothing can be created.
  EXPECT_THROW(store.Save(Path("missing/dir/s.snap")), SnapshotError);
  EXPECT_EQ(Files(), std::set<std::string>{"occupied"});
  ASSERT_VALID(store);
}

TEST_F(SnapshotTest, MissingFileIsAnIoError) { EXPECT_THROW(ShardedStore::Load(Path("nope.snap")), IoError); }

// A small snapshot (two shards, a few items, some erased) for the damage tests below.
std::string SmallSnapshot(const std::string& path) {
  StoreConfig cfg = Config(2, 100, 0.6, 5);
  ShardedStore store(cfg);
  // Two insert calls: two chunks, so both shards hold items.
  const std::vector<Key> keys = Insert(store, {1.0, 0.0, 2.5}, {"ab", "", "cde"});
  Insert(store, {0.75, 3.0, 1.0}, {"f", "gh", "i"});
  store.Erase(&keys[2], 1);
  store.Save(path);
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(SnapshotTest, TruncatedSnapshotThrowsSnapshotError) {
  const std::string bytes = SmallSnapshot(Path("good.snap"));
  ASSERT_GT(bytes.size(), 100u);
  ASSERT_EQ(LoadOutcome(Path("good.snap")), "loaded without error");
  std::vector<std::string> failures;
  for (size_t len = 0; len < bytes.size(); ++len) {
    WriteAll(Path("cut.snap"), bytes.substr(0, len));
    const std::string outcome = LoadOutcome(Path("cut.snap"));
    if (!outcome.empty()) failures.push_back("first " + std::to_string(len) + " bytes: " + outcome);
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " truncations not reported, e.g. " << failures.front();
  EXPECT_EQ(Files(), (std::set<std::string>{"cut.snap", "good.snap"}));
}

TEST_F(SnapshotTest, EverySingleBitFlipThrowsSnapshotError) {
  const std::string bytes = SmallSnapshot(Path("good.snap"));
  std::vector<std::string> failures;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string damaged = bytes;
      damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
      WriteAll(Path("flip.snap"), damaged);
      const std::string outcome = LoadOutcome(Path("flip.snap"));
      if (!outcome.empty()) {
        failures.push_back("byte " + std::to_string(i) + " bit " + std::to_string(bit) + ": " + outcome);
      }
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " corruptions not reported, e.g. " << failures.front();
  EXPECT_EQ(Files(), (std::set<std::string>{"flip.snap", "good.snap"}));
}

TEST_F(SnapshotTest, DamagedStructureUnderAValidChecksumIsRejectedOrLoadsAConsistentStore) {
  // Every single-bit flip again, but with the checksum recomputed, so only the structural checks stand
  // between the damage and the store: each load must either throw SnapshotError or give a store whose
  // invariants hold (a flipped payload byte or counter is undetectable without the checksum).
  const std::string bytes = SmallSnapshot(Path("good.snap"));
  ASSERT_GT(bytes.size(), 4u);
  auto with_crc = [](std::string b) {
    const uint32_t crc = Crc32cExtend(0, b.data(), b.size() - 4);
    std::memcpy(&b[b.size() - 4], &crc, 4);
    return b;
  };
  ASSERT_EQ(with_crc(bytes), bytes) << "the trailing CRC-32C is not what this test assumes";
  std::vector<std::string> failures;
  size_t rejected = 0;
  for (size_t i = 0; i + 4 < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string damaged = bytes;
      damaged[i] = static_cast<char>(damaged[i] ^ (1 << bit));
      WriteAll(Path("forged.snap"), with_crc(damaged));
      const std::string where = "byte " + std::to_string(i) + " bit " + std::to_string(bit) + ": ";
      try {
        std::unique_ptr<ShardedStore> s = ShardedStore::Load(Path("forged.snap"));
        s->Validate();
        // Tag 0 is never issued (epochs and generations start at 1), so its keys must address nothing.
        for (uint32_t shard = 0; shard < std::min<uint32_t>(s->config().shards, 4); ++shard) {
          for (Slot slot = 0; slot < 8; ++slot) {
            const Key k = MakeKey(shard, slot, 0);
            const double p = 1.0;
            if (s->UpdatePriorities(&k, &p, 1) != 0) failures.push_back(where + "a tag-0 key is live");
          }
        }
        if (s->Size() > 0) {
          SampleResult r;
          s->Sample(8, 0.5, &r);
          // A flipped sampler or max_times_sampled gives a store that may return fewer items (still >= 1).
          const size_t n = r.keys.size();
          if (n == 0 || n > 8 || r.offsets.size() != n + 1 || r.offsets[n] != r.data.size()) {
            failures.push_back(where + "bad sample");
          }
        }
      } catch (const SnapshotError&) {
        ++rejected;
      } catch (const std::exception& e) {
        failures.push_back(where + e.what());
      }
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " forged files misbehaved, e.g. " << failures.front();
  EXPECT_GT(rejected, bytes.size()) << "structural checks rejected suspiciously few forged files";
  // The end marker in particular is checked on its own.
  std::string marker = bytes;
  marker[marker.size() - 5] ^= 0x20;  // last byte of "APXRLEND"
  WriteAll(Path("marker.snap"), with_crc(marker));
  EXPECT_EQ(LoadOutcome(Path("marker.snap")), "");
}

TEST_F(SnapshotTest, TrailingBytesAreRejected) {
  const std::string bytes = SmallSnapshot(Path("good.snap"));
  WriteAll(Path("long.snap"), bytes + std::string(1, '\0'));
  EXPECT_EQ(LoadOutcome(Path("long.snap")), "");
}

TEST_F(SnapshotTest, WrongMagicOrVersionOrForeignFileThrowsSnapshotError) {
  const std::string bytes = SmallSnapshot(Path("good.snap"));
  std::string magic = bytes;
  magic[7] = '2';  // "APXRLST2"
  WriteAll(Path("magic.snap"), magic);
  EXPECT_EQ(LoadOutcome(Path("magic.snap")), "");
  std::string version = bytes;
  version[8] = 6;  // u32 version right after the magic: one this build does not know
  WriteAll(Path("version.snap"), version);
  EXPECT_EQ(LoadOutcome(Path("version.snap")), "");
  try {
    ShardedStore::Load(Path("version.snap"));
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("version"), std::string::npos) << e.what();
  }
  WriteAll(Path("empty.snap"), "");
  EXPECT_EQ(LoadOutcome(Path("empty.snap")), "");
  WriteAll(Path("text.snap"), "this is not a replay store snapshot, just some text that is long enough\n");
  EXPECT_EQ(LoadOutcome(Path("text.snap")), "");
  WriteAll(Path("short.snap"), "APX");
  EXPECT_EQ(LoadOutcome(Path("short.snap")), "");
  EXPECT_EQ(Files(), (std::set<std::string>{"empty.snap", "good.snap", "magic.snap", "short.snap", "text.snap",
                                            "version.snap"}));
}

// ---------------------------------------------------------------------------------------------------------
// Epochs: keys never collide across lives of a store

std::vector<Key> InsertN(ShardedStore& store, size_t n, double priority, uint64_t first_id) {
  std::vector<double> pr(n, priority);
  std::vector<std::string> pl;
  for (size_t i = 0; i < n; ++i) pl.push_back(PayloadFor(first_id + i));
  return Insert(store, pr, pl);
}

TEST(EpochTest, EveryKeyCarriesTheStoresEpochAndAnotherEpochsKeysAddressNothing) {
  StoreConfig a_cfg = Config(4, 1000, 1.0, 3);
  a_cfg.epoch = 17;
  ShardedStore a(a_cfg);
  const std::vector<Key> keys = InsertN(a, 100, 1.0, 0);
  for (Key k : keys) {
    EXPECT_EQ(TagEpoch(SplitKey(k).tag), 17u);
    EXPECT_EQ(TagGeneration(SplitKey(k).tag), 1u);
  }
  // A restarted, empty store with another epoch fills the same slots; the first life's keys are stale.
  StoreConfig b_cfg = a_cfg;
  b_cfg.epoch = 18;
  ShardedStore b(b_cfg);
  const std::vector<Key> fresh = InsertN(b, 100, 1.0, 1000);
  std::set<std::pair<uint32_t, Slot>> a_slots, b_slots;
  for (Key k : keys) a_slots.insert({SplitKey(k).shard, SplitKey(k).slot});
  for (Key k : fresh) b_slots.insert({SplitKey(k).shard, SplitKey(k).slot});
  ASSERT_EQ(a_slots, b_slots) << "the test needs the second life to reuse the same slots";
  const std::vector<double> big(keys.size(), 50.0);
  EXPECT_EQ(b.UpdatePriorities(keys.data(), big.data(), keys.size()), 0u);
  EXPECT_EQ(b.Stats().stale_updates, 100u);
  EXPECT_EQ(b.TotalMass(), 100.0);
  EXPECT_EQ(b.Erase(keys.data(), keys.size()), 0u);
  EXPECT_EQ(b.Size(), 100u);
  ASSERT_VALID(b);
}

TEST(EpochTest, ConfigurationIsChecked) {
  for (uint32_t bad : {0u, kMaxEpoch + 1}) {
    StoreConfig c = Config(2, 10, 1.0);
    c.epoch = bad;
    EXPECT_THROW({ ShardedStore s(c); }, InvalidArgument) << bad;
  }
  StoreConfig ok = Config(2, 10, 1.0);
  ok.epoch = kMaxEpoch;
  EXPECT_NO_THROW({ ShardedStore s(ok); });
  EXPECT_EQ(NextEpoch(kMaxEpoch), 1u);
  EXPECT_EQ(NextEpoch(1), 2u);
}

TEST(SlotLimitTest, ACapacityThatNeedsMoreSlotsPerShardThanKeysCanNameIsRefused) {
  // 28 slot bits: a shard holds at most 2^28 - 1 items, and must be able to hold its share of max_size.
  StoreConfig c = Config(1, kMaxSlotsPerShard, 1.0);
  c.max_size = kMaxSlotsPerShard;
  EXPECT_NO_THROW({ ShardedStore s(c); });
  c.max_size = 0;  // default 2 * capacity: too many for one shard
  try {
    ShardedStore s(c);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("268435455"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shards"), std::string::npos) << e.what();
  }
  c.shards = 2;  // the same ceiling over two shards fits
  EXPECT_NO_THROW({ ShardedStore s(c); });
  StoreConfig below = Config(2, 10, 1.0);
  below.max_size = 9;
  EXPECT_THROW({ ShardedStore s(below); }, InvalidArgument);
}

TEST_F(SnapshotTest, LoadWithANewEpochKeepsRestoredKeysValidAndStalesKeysIssuedAfterTheSave) {
  StoreConfig cfg = Config(3, 1000, 1.0, 9);
  cfg.epoch = 40;
  ShardedStore old(cfg);
  const std::vector<Key> saved = InsertN(old, 60, 1.0, 0);
  ASSERT_EQ(old.Erase(&saved[5], 1), 1u);  // a free slot in the snapshot
  const std::string path = Path("e.snap");
  old.Save(path);
  EXPECT_EQ(ShardedStore::SnapshotEpoch(path), 40u);
  // The old life goes on: new items in the freed slot and in new slots, one restored item erased and its
  // slot reused.
  std::vector<Key> after = InsertN(old, 40, 1.0, 100);
  ASSERT_EQ(old.Erase(&saved[7], 1), 1u);
  const std::vector<Key> more = InsertN(old, 1, 1.0, 200);
  after.insert(after.end(), more.begin(), more.end());

  EXPECT_THROW(ShardedStore::Load(path, 40), InvalidArgument);  // the saved epoch itself
  EXPECT_THROW(ShardedStore::Load(path, 0), InvalidArgument);
  std::unique_ptr<ShardedStore> restored = ShardedStore::Load(path, 41);
  ASSERT_VALID(*restored);
  EXPECT_EQ(restored->config().epoch, 41u);
  EXPECT_EQ(restored->Size(), 59u);
  const std::vector<Key> fresh = InsertN(*restored, 41, 1.0, 300);  // reuses the free slots, then new ones
  for (Key k : fresh) EXPECT_EQ(TagEpoch(SplitKey(k).tag), 41u);
  // Keys of restored items address them (the one erased before the save stays stale) ...
  std::vector<Key> restored_keys;
  for (size_t i = 0; i < saved.size(); ++i) {
    if (i != 5) restored_keys.push_back(saved[i]);
  }
  const std::vector<double> two(restored_keys.size(), 2.0);
  EXPECT_EQ(restored->UpdatePriorities(restored_keys.data(), two.data(), two.size()), 59u);
  EXPECT_FALSE(IsLive(*restored, saved[5], 1.0));
  // ... and no key issued after the save addresses anything: the new items keep priority 1.
  const std::vector<double> big(after.size(), 1000.0);
  EXPECT_EQ(restored->UpdatePriorities(after.data(), big.data(), after.size()), 0u);
  EXPECT_EQ(restored->TotalMass(), 59 * 2.0 + 41 * 1.0);
  ASSERT_VALID(*restored);

  // Load(path) without an epoch: the saved one plus one.
  EXPECT_EQ(ShardedStore::Load(path)->config().epoch, 41u);
  StoreConfig last = Config(1, 10, 1.0);
  last.epoch = kMaxEpoch;
  ShardedStore wraps(last);
  wraps.Save(Path("w.snap"));
  EXPECT_EQ(ShardedStore::Load(Path("w.snap"))->config().epoch, 1u);
}

TEST_F(SnapshotTest, SnapshotOfAnOlderFormatVersionIsRefusedWithTheReason) {
  const std::string bytes = SmallSnapshot(Path("good.snap"));
  std::string v1 = bytes;
  const uint32_t one = 1;
  std::memcpy(&v1[8], &one, 4);  // the version follows the 8-byte magic
  const uint32_t crc = Crc32cExtend(0, v1.data(), v1.size() - 4);
  std::memcpy(&v1[v1.size() - 4], &crc, 4);
  WriteAll(Path("v1.snap"), v1);
  try {
    ShardedStore::Load(Path("v1.snap"));
    ADD_FAILURE() << "a version-1 snapshot loaded";
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("version 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ShardedStore::SnapshotEpoch(Path("v1.snap")), SnapshotError);
}

// ---------------------------------------------------------------------------------------------------------
// Mass limit, batch limits, hard ceiling

TEST(MassLimitTest, PrioritiesWhoseMassWouldOverflowTheTreeAreRefusedAndChangeNothing) {
  ShardedStore store(Config(2, 100, 1.0));
  const std::vector<Key> keys = Insert(store, {1.0, 2.0}, {"a", "b"});
  // Two 1e308 priorities with alpha 1 would sum to infinity.
  try {
    Insert(store, {1e308, 1e308}, {"x", "y"});
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("1e+308"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1e+250"), std::string::npos) << e.what();
  }
  const double huge[2] = {1.0, 1e251};
  EXPECT_THROW(store.UpdatePriorities(keys.data(), huge, 2), InvalidArgument);
  EXPECT_EQ(store.Size(), 2u);
  EXPECT_EQ(store.TotalMass(), 3.0);
  // At the limit: accepted, and the total, probabilities and weights stay finite.
  const double at_limit[2] = {kMaxMass, 1e-300};
  ASSERT_EQ(store.UpdatePriorities(keys.data(), at_limit, 2), 2u);
  InsertN(store, 50, kMaxMass, 0);
  EXPECT_TRUE(std::isfinite(store.TotalMass()));
  const SampleResult r = Sample(store, 64, 1.0);
  for (size_t i = 0; i < r.keys.size(); ++i) {
    EXPECT_TRUE(std::isfinite(r.probabilities[i]));
    EXPECT_TRUE(std::isfinite(r.weights[i]));
  }
  // A large alpha: the mass, not the priority, is what is limited.
  ShardedStore steep(Config(1, 10, 10.0));
  EXPECT_NO_THROW(Insert(steep, {1e24}, {"ok"}));
  EXPECT_THROW(Insert(steep, {1e26}, {"too"}), InvalidArgument);
}

TEST(MassLimitTest, ImportanceWeightsAcrossTheWholeMassRangeAreFiniteAndInRange) {
  ShardedStore store(Config(1, 100, 1.0));
  // The smallest positive double and the largest mass: their ratio overflows a double.
  Insert(store, {4.9e-324, kMaxMass}, {"tiny", "huge"});
  const SampleResult r = Sample(store, 16, 1.0);
  for (size_t i = 0; i < r.keys.size(); ++i) EXPECT_EQ(r.weights[i], FLT_MIN) << "huge item's weight underflows";
}

TEST(BatchLimitTest, OversizedSampleAndInsertCallsNameTheValueAndTheLimit) {
  ShardedStore store(Config(1, 10, 1.0));
  Insert(store, {1.0}, {"a"});
  SampleResult r;
  try {
    store.Sample(size_t{1} << 62, 0.4, &r);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(uint64_t{1} << 62)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(kMaxBatchItems)), std::string::npos) << e.what();
  }
  EXPECT_THROW(store.Insert(nullptr, nullptr, nullptr, kMaxBatchItems + 1, nullptr), InvalidArgument);
  EXPECT_EQ(store.Size(), 1u);
}

TEST(MaxSizeTest, InsertsBeyondTheHardCeilingEvictWithThePolicyWithoutRemoveToFit) {
  StoreConfig c = Config(4, 100, 1.0);
  EXPECT_EQ(ShardedStore(c).config().max_size, 200u);  // default 2 * capacity
  c.max_size = 150;
  ShardedStore store(c);
  std::vector<Key> all;
  for (uint64_t batch = 0; batch < 50; ++batch) {  // 50x capacity, nobody calls RemoveToFit
    const std::vector<Key> keys = InsertN(store, 100, 1.0, batch * 100);
    all.insert(all.end(), keys.begin(), keys.end());
    ASSERT_LE(store.Size(), 150u) << "after batch " << batch;
  }
  ASSERT_VALID(store);
  // FIFO: what is left are the newest items.
  const size_t left = store.Size();
  EXPECT_GE(left, 100u);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(IsLive(store, all[i], 1.0), i >= all.size() - left) << i;
  EXPECT_EQ(store.Stats().evicted, all.size() - left);
}

TEST_F(SnapshotTest, SaveIntoAMissingDirectoryThrowsSnapshotErrorNamingTheReasonAndKeepsTheOldSnapshot) {
  ShardedStore store(Config(2, 100, 1.0, 3));
  Insert(store, {1.0}, {"x"});
  store.Save(Path("s.snap"));
  Insert(store, {1.0}, {"y"});
  try {
    store.Save(Path("no/such/dir/s.snap"));
    ADD_FAILURE() << "saved";
  } catch (const SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ShardedStore::Load(Path("s.snap"))->Size(), 1u);
  EXPECT_EQ(Files(), std::set<std::string>{"s.snap"});
}

// ---------------------------------------------------------------------------------------------------------
// Frame chunks: kept while an item references them, returned once per sample, in snapshots

namespace {

struct ChunkedBatch {
  std::vector<std::string> items, chunks;
  std::vector<uint64_t> refs;  // below chunks.size(): one of the batch's chunks; else a stored chunk key
  std::vector<uint64_t> ref_offsets{0};
};

std::vector<Key> InsertChunked(ShardedStore& store, const ChunkedBatch& b, std::vector<Key>* chunk_keys = nullptr) {
  std::vector<const uint8_t*> items, chunks;
  std::vector<uint64_t> sizes, chunk_sizes;
  for (const auto& s : b.items) {
    items.push_back(reinterpret_cast<const uint8_t*>(s.data()));
    sizes.push_back(s.size());
  }
  for (const auto& s : b.chunks) {
    chunks.push_back(reinterpret_cast<const uint8_t*>(s.data()));
    chunk_sizes.push_back(s.size());
  }
  ChunkBatch batch;
  batch.data = chunks.data();
  batch.sizes = chunk_sizes.data();
  batch.count = chunks.size();
  batch.item_chunks = b.refs.data();
  batch.item_chunk_offsets = b.ref_offsets.data();
  if (chunk_keys != nullptr) {
    chunk_keys->assign(b.chunks.size(), 0);
    batch.chunk_keys = chunk_keys->data();
  }
  std::vector<double> priorities(b.items.size(), 1.0);
  std::vector<Key> keys(b.items.size());
  store.Insert(priorities.data(), items.data(), sizes.data(), items.size(), keys.data(), &batch);
  return keys;
}

// Items "a" {0}, "b" {0, 1}, "c" {1}, of chunks X (100 B) and Y (50 B), tagged with `tag`.
ChunkedBatch ThreeItems(char tag) {
  ChunkedBatch b;
  b.items = {std::string(1, tag) + "a", std::string(1, tag) + "b", std::string(1, tag) + "c"};
  b.chunks = {std::string(100, tag), std::string(50, static_cast<char>(tag + 1))};
  b.refs = {0, 0, 1, 1};
  b.ref_offsets = {0, 1, 3, 4};
  return b;
}

// Every draw's chunks, as bytes, checked against `want` (item bytes -> its chunks' bytes); each chunk once.
void ExpectChunks(const SampleResult& r, const std::map<std::string, std::vector<std::string>>& want) {
  const size_t c = r.chunk_offsets.size() - 1;
  std::set<std::string> distinct;
  for (size_t j = 0; j < c; ++j) {
    distinct.insert(std::string(reinterpret_cast<const char*>(r.chunk_data.data()) + r.chunk_offsets[j],
                                r.chunk_offsets[j + 1] - r.chunk_offsets[j]));
  }
  EXPECT_EQ(distinct.size(), c) << "a chunk came twice";
  for (size_t i = 0; i < r.keys.size(); ++i) {
    std::vector<std::string> got;
    for (uint64_t j = r.item_chunk_offsets[i]; j < r.item_chunk_offsets[i + 1]; ++j) {
      const uint64_t k = r.item_chunks[j];
      ASSERT_LT(k, c);
      got.emplace_back(reinterpret_cast<const char*>(r.chunk_data.data()) + r.chunk_offsets[k],
                       r.chunk_offsets[k + 1] - r.chunk_offsets[k]);
    }
    EXPECT_EQ(got, want.at(ItemBytes(r, i)));
  }
}

}  // namespace

TEST_F(SnapshotTest, ChunksLiveWhileAnItemNeedsThemAndSurviveASnapshot) {
  StoreConfig config;
  config.capacity = 100;
  config.shards = 4;
  ShardedStore store(config);
  const std::vector<Key> a = InsertChunked(store, ThreeItems('p'));
  const std::vector<Key> b = InsertChunked(store, ThreeItems('r'));
  std::map<std::string, std::vector<std::string>> want;
  for (char t : {'p', 'r'}) {
    const ChunkedBatch x = ThreeItems(t);
    want[x.items[0]] = {x.chunks[0]};
    want[x.items[1]] = {x.chunks[0], x.chunks[1]};
    want[x.items[2]] = {x.chunks[1]};
  }
  StoreStats st = store.Stats();
  EXPECT_EQ(st.chunks, 4u);
  EXPECT_EQ(st.chunk_bytes, 300u);
  EXPECT_EQ(st.bytes_held, 300u + 6 * 2);
  SampleResult r;
  for (int i = 0; i < 5; ++i) {
    store.Sample(16, 0.4, &r);
    ExpectChunks(r, want);
  }
  store.Save(Path("chunks.snap"));
  std::unique_ptr<ShardedStore> loaded = ShardedStore::Load(Path("chunks.snap"));
  loaded->Validate();
  EXPECT_EQ(loaded->Stats().chunks, 4u);
  loaded->Sample(16, 0.4, &r);
  ExpectChunks(r, want);

  ASSERT_EQ(store.Erase(&a[0], 1), 1u);  // X of batch p still held by item b
  EXPECT_EQ(store.Stats().chunks, 4u);
  ASSERT_EQ(store.Erase(&a[1], 1), 1u);
  EXPECT_EQ(store.Stats().chunks, 3u);
  ASSERT_EQ(store.Erase(&a[2], 1), 1u);
  st = store.Stats();
  EXPECT_EQ(st.chunks, 2u);
  EXPECT_EQ(st.chunk_bytes, 150u);
  store.Validate();
}

TEST(ShardedStoreTest, BadChunkReferencesAreRefusedAndChangeNothing) {
  StoreConfig config;
  config.capacity = 100;
  ShardedStore store(config);
  InsertChunked(store, ThreeItems('k'));
  const StoreStats before = store.Stats();
  auto refused = [&](ChunkedBatch b, const char* what) {
    try {
      InsertChunked(store, b);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  ChunkedBatch unused = ThreeItems('u');
  unused.refs = {0, 0, 0};  // every item chunk 0 only
  unused.ref_offsets = {0, 1, 2, 3};
  refused(unused, "chunks[1] is referenced by no item");
  ChunkedBatch range = ThreeItems('v');
  range.refs = {0, 0, 1, 7};
  refused(range, "items[2] references chunk 7: neither one of the call's 2 chunks nor a chunk key");
  ChunkedBatch twice = ThreeItems('w');
  twice.refs = {0, 1, 1, 1};
  refused(twice, "items[1] references chunk 1 twice");
  const StoreStats after = store.Stats();
  EXPECT_EQ(after.size, before.size);
  EXPECT_EQ(after.chunks, before.chunks);
  EXPECT_EQ(after.bytes_held, before.bytes_held);
  store.Validate();
}

TEST(ShardedStoreTest, EvictionFreesAChunkWithItsLastItem) {
  StoreConfig config;
  config.capacity = 3;
  config.max_size = 1000;
  config.shards = 2;
  ShardedStore store(config);
  for (char t : {'a', 'b', 'c'}) InsertChunked(store, ThreeItems(t));
  EXPECT_EQ(store.Stats().chunks, 6u);
  EXPECT_EQ(store.RemoveToFit(), 6u);  // FIFO: batches a and b go, and their chunks with them
  EXPECT_EQ(store.Stats().chunks, 2u);
  EXPECT_EQ(store.Stats().chunk_bytes, 150u);
  store.Validate();
}

// ---------------------------------------------------------------------------------------------------------
// Stored chunks: later calls reference chunks by the chunk keys an earlier call returned

namespace {

// One item referencing `refs` (stored chunk keys or indices into `chunks`), its bytes `name`.
ChunkedBatch OneItem(const std::string& name, std::vector<std::string> chunks, std::vector<uint64_t> refs) {
  ChunkedBatch b;
  b.items = {name};
  b.chunks = std::move(chunks);
  b.ref_offsets = {0, refs.size()};
  b.refs = std::move(refs);
  return b;
}

}  // namespace

TEST(ShardedStoreTest, StoredChunksAreReferencedByKeyStoredOnceAndStayOnTheirShard) {
  StoreConfig config;
  config.capacity = 1000;
  config.shards = 8;
  ShardedStore store(config);
  std::vector<Key> ck;
  const Key first = InsertChunked(store, OneItem("i0", {std::string(100, 'A'), std::string(60, 'B')}, {0, 1}), &ck)[0];
  ASSERT_EQ(ck.size(), 2u);
  EXPECT_NE(ck[0], ck[1]);
  EXPECT_EQ(SplitKey(ck[0]).shard, SplitKey(first).shard);
  // Items that reference the stored chunks (and new ones) go to their shard, whatever the round robin says.
  std::vector<Key> items{first};
  std::vector<Key> ck2;
  for (int i = 1; i < 20; ++i) {
    const std::vector<Key> k =
        InsertChunked(store, OneItem("i" + std::to_string(i), {"C" + std::to_string(i)}, {ck[1], 0, ck[0]}), &ck2);
    EXPECT_EQ(SplitKey(k[0]).shard, SplitKey(ck[0]).shard);
    EXPECT_EQ(SplitKey(ck2[0]).shard, SplitKey(ck[0]).shard);
    items.push_back(k[0]);
  }
  StoreStats st = store.Stats();
  EXPECT_EQ(st.chunks, 2u + 19u);
  EXPECT_EQ(st.chunk_bytes, 160u + 9u * 2u + 10u * 3u);
  // A sample returns each chunk once, and every item's chunks in its own order.
  std::map<std::string, std::vector<std::string>> want{{"i0", {std::string(100, 'A'), std::string(60, 'B')}}};
  for (int i = 1; i < 20; ++i) {
    want["i" + std::to_string(i)] = {std::string(60, 'B'), "C" + std::to_string(i), std::string(100, 'A')};
  }
  SampleResult r;
  store.Sample(64, 0.4, &r);
  ExpectChunks(r, want);
  // The stored chunks live until the last item referencing them goes.
  ASSERT_EQ(store.Erase(items.data(), 19), 19u);
  EXPECT_EQ(store.Stats().chunks, 3u);
  ASSERT_EQ(store.Erase(&items[19], 1), 1u);
  EXPECT_EQ(store.Stats().chunks, 0u);
  EXPECT_EQ(store.Stats().bytes_held, 0u);
  store.Validate();
}

TEST(ShardedStoreTest, AReferenceToAChunkThatIsGoneIsRefusedWholeListingTheStaleKeys) {
  StoreConfig config;
  config.capacity = 1000;
  config.shards = 2;
  ShardedStore store(config);
  std::vector<Key> ck;
  const Key a = InsertChunked(store, OneItem("a", {"x", "y"}, {0, 1}), &ck)[0];
  std::vector<Key> keep;
  const Key b = InsertChunked(store, OneItem("b", {"z"}, {ck[1], 0}), &keep)[0];
  ASSERT_EQ(store.Erase(&a, 1), 1u);  // x goes (no item left), y stays (b)
  // Another chunk takes x's id: x's key stays stale (a new tag), never aliased to the new chunk.
  std::vector<Key> reused;
  InsertChunked(store, OneItem("c", {"w"}, {0}), &reused);
  const StoreStats before = store.Stats();
  try {
    InsertChunked(store, OneItem("d", {"n"}, {ck[0], ck[1], 0}));
    ADD_FAILURE() << "a stale chunk key was accepted";
  } catch (const StaleChunks& e) {
    EXPECT_EQ(e.keys(), std::vector<Key>{ck[0]});
    EXPECT_NE(std::string(e.what()).find(std::to_string(ck[0])), std::string::npos) << e.what();
  }
  const StoreStats after = store.Stats();
  EXPECT_EQ(after.size, before.size);
  EXPECT_EQ(after.chunks, before.chunks);
  EXPECT_EQ(after.bytes_held, before.bytes_held);
  store.Validate();
  // Sending the chunk again (the writer still has its steps) stores the item.
  InsertChunked(store, OneItem("d", {"x", "n"}, {0, ck[1], 1}));
  EXPECT_EQ(store.Size(), 3u);
  ASSERT_EQ(store.Erase(&b, 1), 1u);
  store.Validate();
}

TEST(ShardedStoreTest, ACallReferencingStoredChunksOfTwoShardsIsRefused) {
  StoreConfig config;
  config.capacity = 1000;
  config.shards = 4;
  ShardedStore store(config);
  std::vector<Key> x, y;
  InsertChunked(store, OneItem("a", {"x"}, {0}), &x);
  // Round robin: the next call without stored references goes to another shard.
  do {
    InsertChunked(store, OneItem("b", {"y"}, {0}), &y);
  } while (SplitKey(y[0]).shard == SplitKey(x[0]).shard);
  const StoreStats before = store.Stats();
  EXPECT_THROW(InsertChunked(store, OneItem("c", {}, {x[0], y[0]})), InvalidArgument);
  try {
    InsertChunked(store, OneItem("c", {}, {x[0], y[0]}));
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("live on one shard"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.Stats().size, before.size);
  // Not a chunk key at all (tag 0), or a shard the store does not have.
  EXPECT_THROW(InsertChunked(store, OneItem("c", {}, {uint64_t{1} << 20})), InvalidArgument);
  EXPECT_THROW(InsertChunked(store, OneItem("c", {}, {MakeKey(200, 0, MakeTag(1, 1))})), StaleChunks);
  store.Validate();
}

TEST(ShardedStoreTest, AnItemMayReferenceThousandsOfChunks) {
  StoreConfig config;
  config.capacity = 1000;
  config.shards = 2;
  ShardedStore store(config);
  std::vector<std::string> chunks;
  std::vector<uint64_t> refs;
  for (uint32_t c = 0; c < kMaxChunksPerItem; ++c) {
    chunks.push_back(std::to_string(c));
    refs.push_back(kMaxChunksPerItem - 1 - c);
  }
  InsertChunked(store, OneItem("big", chunks, refs));
  EXPECT_EQ(store.Stats().chunks, kMaxChunksPerItem);
  SampleResult r;
  store.Sample(1, 0.4, &r);
  ASSERT_EQ(r.item_chunk_offsets[1], kMaxChunksPerItem);
  refs.push_back(0);
  chunks.push_back("one too many");
  refs.back() = kMaxChunksPerItem;
  EXPECT_THROW(InsertChunked(store, OneItem("bigger", chunks, refs)), InvalidArgument);
  store.Validate();
}

TEST_F(SnapshotTest, ChunkKeysStayValidAcrossASnapshotAndARestoredStoreIssuesNewOnes) {
  StoreConfig config;
  config.capacity = 1000;
  config.shards = 3;
  ShardedStore store(config);
  std::vector<Key> ck, gone;
  InsertChunked(store, OneItem("a", {"x", "y"}, {0, 1}), &ck);
  const Key g = InsertChunked(store, OneItem("g", {"q"}, {0}), &gone)[0];
  ASSERT_EQ(store.Erase(&g, 1), 1u);
  store.Save(Path("keys.snap"));
  std::unique_ptr<ShardedStore> loaded = ShardedStore::Load(Path("keys.snap"));
  loaded->Validate();
  // The restored chunks keep their keys: a writer that survived the restart goes on referencing them.
  std::vector<Key> fresh;
  const Key b = InsertChunked(*loaded, OneItem("b", {"z"}, {ck[1], 0}), &fresh)[0];
  EXPECT_EQ(SplitKey(b).shard, SplitKey(ck[1]).shard);
  EXPECT_NE(TagEpoch(SplitKey(fresh[0]).tag), TagEpoch(SplitKey(ck[0]).tag));
  // A chunk gone before the save is stale in the restored store.
  EXPECT_THROW(InsertChunked(*loaded, OneItem("c", {}, {gone[0]})), StaleChunks);
  SampleResult r;
  loaded->Sample(8, 0.4, &r);
  ExpectChunks(r, {{"a", {"x", "y"}}, {"b", {"y", "z"}}});
  loaded->Validate();
}

}  // namespace
}  // namespace apexrl
