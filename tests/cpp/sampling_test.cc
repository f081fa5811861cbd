// The samplers (sampling/kinds.h): the table of kinds, the ordered policies' Front() they read their orders from,
// and each sampler through a ShardedStore: store-wide orders across shards, distinct items and short batches,
// uniform draws (chi-square, fixed seeds), max_times_sampled with every sampler, chunks freed by it, and the
// snapshot round trip of sampler, limit and counts.
// Every test calls Validate() after each step that changes the store.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/eviction/fifo.h"
#include "apexrl/eviction/lowest_priority.h"
#include "apexrl/sampling/kinds.h"
#include "apexrl/sharded_store.h"
#include "temp_dir.h"

namespace apexrl {
namespace {

#define ASSERT_VALID(store) ASSERT_NO_THROW((store).Validate())

constexpr SamplerKind kAllKinds[] = {SamplerKind::kPrioritized, SamplerKind::kUniform, SamplerKind::kFifo,
                                     SamplerKind::kLifo,        SamplerKind::kMaxHeap, SamplerKind::kMinHeap};

StoreConfig Config(SamplerKind sampler, uint32_t shards, uint32_t max_times_sampled = 0, uint64_t seed = 1) {
  StoreConfig c;
  c.sampler = sampler;
  c.shards = shards;
  c.capacity = 1'000'000;
  c.max_times_sampled = max_times_sampled;
  c.seed = seed;
  return c;
}

// Inserts one item per priority, in `batch`-sized calls (so items spread over the shards); item i's payload is
// its index i as 8 bytes. Returns the keys.
std::vector<Key> InsertIds(ShardedStore& store, const std::vector<double>& priorities, size_t batch = 3,
                           uint64_t first_id = 0) {
  std::vector<uint64_t> ids(priorities.size());
  std::vector<const uint8_t*> data(priorities.size());
  std::vector<uint64_t> sizes(priorities.size(), sizeof(uint64_t));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = first_id + i;
    data[i] = reinterpret_cast<const uint8_t*>(&ids[i]);
  }
  std::vector<Key> keys(ids.size());
  for (size_t i = 0; i < ids.size(); i += batch) {
    const size_t m = std::min(batch, ids.size() - i);
    store.Insert(&priorities[i], &data[i], &sizes[i], m, &keys[i]);
  }
  return keys;
}

// The ids of a batch's items, in batch order; checks its shape (n items, offsets, weights 1).
std::vector<uint64_t> Ids(const SampleResult& r) {
  const size_t n = r.keys.size();
  EXPECT_EQ(r.weights.size(), n);
  EXPECT_EQ(r.probabilities.size(), n);
  EXPECT_EQ(r.offsets.size(), n + 1);
  EXPECT_EQ(r.item_chunk_offsets.size(), n + 1);
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < n && r.offsets.size() == n + 1; ++i) {
    EXPECT_EQ(r.offsets[i + 1] - r.offsets[i], sizeof(uint64_t));
    uint64_t id = 0;
    std::memcpy(&id, r.data.data() + r.offsets[i], sizeof(id));
    ids.push_back(id);
  }
  return ids;
}

std::vector<uint64_t> SampleIds(ShardedStore& store, size_t n, SampleResult* r = nullptr) {
  SampleResult local;
  SampleResult* out = r != nullptr ? r : &local;
  store.Sample(n, 0.4, out);
  return Ids(*out);
}

TEST(SamplerKindsTest, NamesRoundTripAndParsingIsExact) {
  for (SamplerKind k : kAllKinds) {
    EXPECT_TRUE(IsSamplerKind(k));
    EXPECT_EQ(ParseSamplerKind(SamplerKindName(k)), k);
  }
  EXPECT_STREQ(SamplerKindName(SamplerKind::kPrioritized), "prioritized");
  EXPECT_STREQ(SamplerKindName(SamplerKind::kUniform), "uniform");
  EXPECT_STREQ(SamplerKindName(SamplerKind::kFifo), "fifo");
  EXPECT_STREQ(SamplerKindName(SamplerKind::kLifo), "lifo");
  EXPECT_STREQ(SamplerKindName(SamplerKind::kMaxHeap), "max_heap");
  EXPECT_STREQ(SamplerKindName(SamplerKind::kMinHeap), "min_heap");
  EXPECT_FALSE(IsSamplerKind(static_cast<SamplerKind>(6)));
  EXPECT_THROW(SamplerKindName(static_cast<SamplerKind>(6)), InvalidArgument);
  try {
    ParseSamplerKind("FIFO");
    FAIL() << "parsed FIFO";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'prioritized', 'uniform', 'fifo', 'lifo', 'max_heap' or 'min_heap'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ParseSamplerKind("lowest_priority"), InvalidArgument);  // a remover's alias, not a sampler
}

TEST(SamplerKindsTest, OnlyPrioritizedUsesTheTreeAndOnlyOrderedSamplersHaveAnOrder) {
  for (SamplerKind k : kAllKinds) {
    EXPECT_EQ(SamplesByPriority(k), k == SamplerKind::kPrioritized);
    const bool ordered = k != SamplerKind::kPrioritized && k != SamplerKind::kUniform;
    EXPECT_EQ(IsOrderedSampler(k), ordered);
    EXPECT_EQ(MakeSamplingOrder(k) != nullptr, ordered);
  }
  EXPECT_THROW(MakeSamplingOrder(static_cast<SamplerKind>(9)), InvalidArgument);
  StoreConfig c = Config(static_cast<SamplerKind>(9), 2);
  EXPECT_THROW(ShardedStore{c}, InvalidArgument);
}

TEST(OrderFrontTest, FifoAndLifoListTheirFirstItemsWithinTheRankBound) {
  FifoPolicy fifo, lifo(/*newest_first=*/true);
  for (EvictionPolicy* p : {static_cast<EvictionPolicy*>(&fifo), static_cast<EvictionPolicy*>(&lifo)}) {
    p->Grow(8);
    for (Slot s = 0; s < 6; ++s) p->OnInsert(s, 1.0, 10 + s);
    p->OnErase(2);
  }
  std::vector<Slot> slots;
  std::vector<uint64_t> ranks;
  fifo.Front(3, kAnyRank, &slots, &ranks);
  EXPECT_EQ(slots, (std::vector<Slot>{0, 1, 3}));
  EXPECT_EQ(ranks, (std::vector<uint64_t>{10, 11, 13}));
  slots.clear();
  ranks.clear();
  fifo.Front(10, 11, &slots, &ranks);  // bounded by rank
  EXPECT_EQ(slots, (std::vector<Slot>{0, 1}));
  slots.clear();
  ranks.clear();
  lifo.Front(10, kAnyRank, &slots, &ranks);
  EXPECT_EQ(slots, (std::vector<Slot>{5, 4, 3, 1, 0}));
  EXPECT_TRUE(std::is_sorted(ranks.begin(), ranks.end()));
  EXPECT_EQ(fifo.CheckConsistency(5), "");
}

TEST(OrderFrontTest, HeapsListTheirItemsInPriorityOrder) {
  LowestPriorityPolicy min_heap, max_heap(/*highest_first=*/true);
  const std::vector<double> prio = {5, 3, 9, 1, 7, 2, 8, 6, 4, 0.5};
  for (EvictionPolicy* p : {static_cast<EvictionPolicy*>(&min_heap), static_cast<EvictionPolicy*>(&max_heap)}) {
    p->Grow(16);
    for (Slot s = 0; s < prio.size(); ++s) p->OnInsert(s, prio[s], s + 1);
    p->OnUpdate(2, 0.1);  // 9 -> 0.1
    p->OnErase(6);        // 8 goes
  }
  std::vector<Slot> slots;
  std::vector<uint64_t> ranks;
  min_heap.Front(4, kAnyRank, &slots, &ranks);
  EXPECT_EQ(slots, (std::vector<Slot>{2, 9, 3, 5}));  // 0.1, 0.5, 1, 2
  slots.clear();
  ranks.clear();
  max_heap.Front(3, kAnyRank, &slots, &ranks);
  EXPECT_EQ(slots, (std::vector<Slot>{4, 7, 0}));  // 7, 6, 5
  slots.clear();
  ranks.clear();
  min_heap.Front(100, LowestPriorityPolicy::RankOf(2.0), &slots, &ranks);
  EXPECT_EQ(slots.size(), 4u);  // 0.1, 0.5, 1, 2: the bound is inclusive
  EXPECT_EQ(min_heap.CheckConsistency(9), "");
}

// The ordered samplers' expected order of ids, given (id -> priority) and insertion order = id order.
std::vector<uint64_t> ModelOrder(SamplerKind kind, const std::map<uint64_t, double>& live) {
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : live) ids.push_back(id);
  std::stable_sort(ids.begin(), ids.end(), [&](uint64_t a, uint64_t b) {
    switch (kind) {
      case SamplerKind::kLifo:
        return a > b;
      case SamplerKind::kMaxHeap:
        return live.at(a) > live.at(b);
      case SamplerKind::kMinHeap:
        return live.at(a) < live.at(b);
      default:
        return a < b;
    }
  });
  return ids;
}

class OrderedSamplerTest : public ::testing::TestWithParam<SamplerKind> {};

TEST_P(OrderedSamplerTest, ReturnsDistinctItemsInTheStoreWideOrderThroughUpdatesAndErases) {
  for (uint32_t shards : {1u, 4u}) {
    ShardedStore store(Config(GetParam(), shards));
    std::vector<double> prio(50);
    for (size_t i = 0; i < prio.size(); ++i) prio[i] = static_cast<double>((i * 37) % 101) + 0.25;  // distinct
    const std::vector<Key> keys = InsertIds(store, prio);
    std::map<uint64_t, double> live;
    for (size_t i = 0; i < prio.size(); ++i) live[i] = prio[i];
    for (size_t i = 0; i < prio.size(); i += 7) {
      const double p = 200.0 + static_cast<double>(i);
      ASSERT_EQ(store.UpdatePriorities(&keys[i], &p, 1), 1u);
      live[i] = p;
    }
    for (size_t i = 3; i < prio.size(); i += 11) {
      ASSERT_EQ(store.Erase(&keys[i], 1), 1u);
      live.erase(i);
    }
    ASSERT_VALID(store);
    const std::vector<uint64_t> model = ModelOrder(GetParam(), live);
    SampleResult r;
    EXPECT_EQ(SampleIds(store, 10, &r), std::vector<uint64_t>(model.begin(), model.begin() + 10)) << shards;
    EXPECT_EQ(r.size, live.size());
    EXPECT_EQ(r.total_mass, 0.0);
    for (size_t i = 0; i < r.keys.size(); ++i) {
      EXPECT_EQ(r.weights[i], 1.0f);
      EXPECT_EQ(r.probabilities[i], 1.0);
    }
    // Sampling does not remove: the same items again; more than the store holds: all of them, once each.
    EXPECT_EQ(SampleIds(store, 10), std::vector<uint64_t>(model.begin(), model.begin() + 10));
    EXPECT_EQ(SampleIds(store, 1000), model);
    EXPECT_EQ(store.Size(), live.size());
    EXPECT_EQ(store.TotalMass(), 0.0);  // no sum tree
    ASSERT_VALID(store);
  }
}

TEST_P(OrderedSamplerTest, MaxTimesSampledOneDrainsTheStoreInOrderExactlyOnce) {
  ShardedStore store(Config(GetParam(), 4, /*max_times_sampled=*/1));
  std::vector<double> prio(40);
  for (size_t i = 0; i < prio.size(); ++i) prio[i] = static_cast<double>((i * 13) % 41) + 1.0;
  InsertIds(store, prio, 5);
  std::map<uint64_t, double> live;
  for (size_t i = 0; i < prio.size(); ++i) live[i] = prio[i];
  const std::vector<uint64_t> model = ModelOrder(GetParam(), live);
  std::vector<uint64_t> got;
  while (store.Size() > 0) {
    const std::vector<uint64_t> ids = SampleIds(store, 7);
    got.insert(got.end(), ids.begin(), ids.end());
    ASSERT_VALID(store);
  }
  EXPECT_EQ(got, model);
  EXPECT_EQ(store.Stats().removed_by_sampling, 40u);
  EXPECT_EQ(store.Stats().bytes_held, 0u);
  SampleResult r;
  EXPECT_THROW(store.Sample(1, 0.4, &r), EmptyStore);
}

INSTANTIATE_TEST_SUITE_P(Samplers, OrderedSamplerTest,
                         ::testing::Values(SamplerKind::kFifo, SamplerKind::kLifo, SamplerKind::kMaxHeap,
                                           SamplerKind::kMinHeap),
                         [](const ::testing::TestParamInfo<SamplerKind>& param_info) {
                           return std::string(SamplerKindName(param_info.param));
                         });

TEST(UniformSamplerTest, EveryItemIsEquallyLikelyAcrossUnevenShards) {
  // 4 shards of uneven sizes (batches of 7 round-robin over 4 shards) and wildly different priorities: a
  // uniform draw ignores both. 35 items, 70,000 draws: chi-square with 34 degrees of freedom; 65.25 is its
  // 0.999 quantile.
  ShardedStore store(Config(SamplerKind::kUniform, 4, 0, 42));
  std::vector<double> prio(35);
  for (size_t i = 0; i < prio.size(); ++i) prio[i] = i % 5 == 0 ? 0.0 : static_cast<double>(i * i);
  InsertIds(store, prio, 7);
  std::vector<uint64_t> counts(prio.size(), 0);
  uint64_t draws = 0;
  for (int call = 0; call < 700; ++call) {
    SampleResult r;
    const std::vector<uint64_t> ids = SampleIds(store, 100, &r);
    ASSERT_EQ(ids.size(), 100u);
    EXPECT_EQ(r.size, 35u);
    EXPECT_EQ(r.total_mass, 0.0);
    EXPECT_EQ(r.min_mass, 0.0);
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(r.weights[i], 1.0f);
      EXPECT_DOUBLE_EQ(r.probabilities[i], 1.0 / 35.0);
      ++counts[ids[i]];
      ++draws;
    }
  }
  double chi2 = 0.0;
  const double expected = static_cast<double>(draws) / 35.0;
  for (uint64_t c : counts)
    chi2 += (static_cast<double>(c) - expected) * (static_cast<double>(c) - expected) / expected;
  EXPECT_LT(chi2, 65.25);
  EXPECT_EQ(store.TotalMass(), 0.0);
  ASSERT_VALID(store);
}

TEST(MaxTimesSampledTest, WithReplacementSamplersNeverReturnAnItemMoreThanItsAllowance) {
  for (SamplerKind kind : {SamplerKind::kPrioritized, SamplerKind::kUniform}) {
    for (uint32_t k : {1u, 3u}) {
      ShardedStore store(Config(kind, 3, k, 5));
      std::vector<double> prio(30);
      for (size_t i = 0; i < prio.size(); ++i) prio[i] = 1.0 + static_cast<double>(i % 4);
      InsertIds(store, prio, 4);
      std::map<uint64_t, uint32_t> times;
      uint64_t delivered = 0;
      while (store.Size() > 0) {
        SampleResult r;
        const std::vector<uint64_t> ids = SampleIds(store, 8, &r);
        ASSERT_GE(ids.size(), 1u);
        ASSERT_LE(ids.size(), 8u);
        for (size_t i = 0; i < ids.size(); ++i) {
          ++times[ids[i]];
          EXPECT_GT(r.probabilities[i], 0.0);
          EXPECT_LE(r.probabilities[i], 1.0);
          if (kind == SamplerKind::kPrioritized) {
            EXPECT_NEAR(r.probabilities[i] * r.total_mass, PriorityMass(prio[ids[i]], 0.6), 1e-9);
          }
        }
        delivered += ids.size();
        ASSERT_VALID(store);
      }
      ASSERT_EQ(times.size(), 30u) << SamplerKindName(kind) << " k=" << k;
      for (const auto& [id, t] : times) EXPECT_EQ(t, k) << id;
      const StoreStats st = store.Stats();
      EXPECT_EQ(st.removed_by_sampling, 30u);
      EXPECT_EQ(st.sampled, delivered);
      EXPECT_EQ(st.bytes_held, 0u);
    }
  }
}

TEST(MaxTimesSampledTest, WithoutALimitPrioritizedAndUniformReturnExactlyN) {
  for (SamplerKind kind : {SamplerKind::kPrioritized, SamplerKind::kUniform}) {
    ShardedStore store(Config(kind, 2));
    InsertIds(store, {1.0, 2.0});
    EXPECT_EQ(SampleIds(store, 50).size(), 50u);
    EXPECT_EQ(store.Stats().removed_by_sampling, 0u);
  }
}

TEST(MaxTimesSampledTest, ARemovedItemFreesItsChunksAndItsKeyIsStale) {
  ShardedStore store(Config(SamplerKind::kFifo, 2, 2));
  const std::string chunk0(100, 'a'), chunk1(50, 'b');
  const uint8_t* chunk_data[] = {reinterpret_cast<const uint8_t*>(chunk0.data()),
                                 reinterpret_cast<const uint8_t*>(chunk1.data())};
  const uint64_t chunk_sizes[] = {100, 50};
  const uint64_t item_chunks[] = {0, 0, 1};
  const uint64_t item_chunk_offsets[] = {0, 1, 3};
  ChunkBatch chunks{chunk_data, chunk_sizes, 2, item_chunks, item_chunk_offsets};
  const uint64_t ids[] = {0, 1};
  const uint8_t* data[] = {reinterpret_cast<const uint8_t*>(&ids[0]), reinterpret_cast<const uint8_t*>(&ids[1])};
  const uint64_t sizes[] = {8, 8};
  const double prio[] = {1.0, 1.0};
  Key keys[2];
  store.Insert(prio, data, sizes, 2, keys, &chunks);
  EXPECT_EQ(store.Stats().chunks, 2u);
  SampleResult r;
  EXPECT_EQ(SampleIds(store, 1, &r), std::vector<uint64_t>{0});
  EXPECT_EQ(store.Stats().chunks, 2u);
  EXPECT_EQ(SampleIds(store, 1, &r), std::vector<uint64_t>{0});  // its 2nd draw: removed
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.chunk_data.data()), r.chunk_data.size()), chunk0);
  ASSERT_VALID(store);
  EXPECT_EQ(store.Stats().removed_by_sampling, 1u);
  EXPECT_EQ(store.Stats().chunks, 2u);  // chunk 0 is still referenced by item 1
  const double p = 2.0;
  EXPECT_EQ(store.UpdatePriorities(&keys[0], &p, 1), 0u);
  EXPECT_EQ(SampleIds(store, 5, &r), std::vector<uint64_t>{1});
  EXPECT_EQ(SampleIds(store, 5, &r), std::vector<uint64_t>{1});
  ASSERT_VALID(store);
  const StoreStats st = store.Stats();
  EXPECT_EQ(st.size, 0u);
  EXPECT_EQ(st.chunks, 0u);
  EXPECT_EQ(st.bytes_held, 0u);
  EXPECT_EQ(st.removed_by_sampling, 2u);
}

TEST(MaxTimesSampledTest, RemoveToFitAndEraseWorkBesideIt) {
  StoreConfig c = Config(SamplerKind::kFifo, 3, 2);
  c.capacity = 10;
  c.max_size = 1000;
  c.eviction = EvictionKind::kLifo;
  ShardedStore store(c);
  const std::vector<Key> keys = InsertIds(store, std::vector<double>(20, 1.0));
  EXPECT_EQ(SampleIds(store, 4), (std::vector<uint64_t>{0, 1, 2, 3}));
  EXPECT_EQ(store.RemoveToFit(), 10u);  // the newest 10 go (LIFO remover)
  EXPECT_EQ(store.Erase(&keys[1], 1), 1u);
  ASSERT_VALID(store);
  EXPECT_EQ(SampleIds(store, 4), (std::vector<uint64_t>{0, 2, 3, 4}));  // 0, 2, 3 reach 2 draws and go
  EXPECT_EQ(SampleIds(store, 100), (std::vector<uint64_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(store.Stats().removed_by_sampling, 4u);
  EXPECT_EQ(store.Size(), 5u);
  ASSERT_VALID(store);
}

TEST(SamplerSnapshotTest, SamplerLimitAndCountsSurviveASaveAndLoad) {
  testing_util::TempDir dir("samplers");
  const std::string path = dir.Path("samplers.snap");
  for (SamplerKind kind : kAllKinds) {
    ShardedStore store(Config(kind, 3, 3));
    std::vector<double> prio(12);
    for (size_t i = 0; i < prio.size(); ++i) prio[i] = 1.0 + static_cast<double>(i);
    InsertIds(store, prio);
    const std::vector<uint64_t> first = SampleIds(store, 5);  // every sampled item now counts >= 1 draw
    store.Save(path);
    std::unique_ptr<ShardedStore> loaded = ShardedStore::Load(path);
    ASSERT_VALID(*loaded);
    EXPECT_EQ(loaded->config().sampler, kind);
    EXPECT_EQ(loaded->config().max_times_sampled, 3u);
    EXPECT_EQ(loaded->Size(), store.Size());
    EXPECT_EQ(loaded->Stats().sampled, store.Stats().sampled);
    // The restored counts hold: every item is returned 3 times in all, before and after the load. Both
    // stores go on identically, except uniform draws (they index the shard's live list, which a load rebuilds
    // in insertion order).
    std::map<uint64_t, int> times;
    for (uint64_t id : first) ++times[id];
    for (int call = 0; call < 100 && loaded->Size() > 0; ++call) {
      const std::vector<uint64_t> ids = SampleIds(*loaded, 5);
      for (uint64_t id : ids) ++times[id];
      if (kind != SamplerKind::kUniform) {
        EXPECT_EQ(ids, SampleIds(store, 5)) << SamplerKindName(kind) << " call " << call;
        EXPECT_EQ(loaded->Stats().removed_by_sampling, store.Stats().removed_by_sampling);
        EXPECT_EQ(loaded->Size(), store.Size());
      }
    }
    EXPECT_EQ(loaded->Size(), 0u);
    EXPECT_EQ(times.size(), 12u);
    for (const auto& [id, t] : times) EXPECT_EQ(t, 3) << SamplerKindName(kind) << " id " << id;
    ASSERT_VALID(*loaded);
    EXPECT_EQ(loaded->Stats().removed_by_sampling, 12u);
  }
}

// Held items (sharded_store.h, "Held items"): a SAMPLE reply that could not be sent gives its batch back.
TEST(HeldItemsTest, AGivenBackBatchIsAtTheFrontOfTheQueueInOrderWithItsKeys) {
  for (uint32_t shards : {1u, 3u}) {
    ShardedStore store(Config(SamplerKind::kFifo, shards, 1));
    const std::vector<Key> keys = InsertIds(store, std::vector<double>(6, 1.0), 1);
    SampleResult taken;
    store.Sample(2, 0.4, &taken, /*hold=*/true);
    EXPECT_EQ(Ids(taken), (std::vector<uint64_t>{0, 1}));
    EXPECT_EQ(taken.held.size(), 2u);
    EXPECT_EQ(store.Size(), 4u);
    EXPECT_EQ(store.Held(), 2u);
    ASSERT_VALID(store);
    // Out of the store's view meanwhile: another sample, an update, an erase and an eviction pass them by.
    SampleResult other;
    store.Sample(1, 0.4, &other, /*hold=*/true);
    EXPECT_EQ(Ids(other), std::vector<uint64_t>{2});
    const double p = 5.0;
    EXPECT_EQ(store.UpdatePriorities(&keys[0], &p, 1), 0u);
    EXPECT_EQ(store.Erase(&keys[1], 1), 0u);
    ASSERT_VALID(store);
    EXPECT_EQ(store.GiveBack(taken.held.data(), taken.held.size(), taken.keys.data(), taken.keys.size()), 2u);
    EXPECT_EQ(store.Size(), 5u);
    EXPECT_EQ(store.Held(), 1u);
    ASSERT_VALID(store);
    store.Release(other.held.data(), other.held.size());  // delivered: gone for good
    EXPECT_EQ(store.Held(), 0u);
    EXPECT_EQ(store.Stats().removed_by_sampling, 1u);
    ASSERT_VALID(store);
    SampleResult again;
    store.Sample(10, 0.4, &again);
    EXPECT_EQ(Ids(again), (std::vector<uint64_t>{0, 1, 3, 4, 5})) << shards << " shards";
    EXPECT_EQ(again.keys[0], keys[0]);
    EXPECT_EQ(again.keys[1], keys[1]);
    EXPECT_EQ(store.Size(), 0u);
    EXPECT_EQ(store.Stats().removed_by_sampling, 6u);
    ASSERT_VALID(store);
  }
}

TEST(HeldItemsTest, GivenBackItemsKeepTheirChunksPrioritiesAndDrawCounts) {
  ShardedStore store(Config(SamplerKind::kMaxHeap, 2, 2));
  const std::string chunk0(100, 'a'), chunk1(50, 'b');
  const uint8_t* chunk_data[] = {reinterpret_cast<const uint8_t*>(chunk0.data()),
                                 reinterpret_cast<const uint8_t*>(chunk1.data())};
  const uint64_t chunk_sizes[] = {100, 50};
  const uint64_t item_chunks[] = {0, 0, 1};
  const uint64_t item_chunk_offsets[] = {0, 1, 3};
  ChunkBatch chunks{chunk_data, chunk_sizes, 2, item_chunks, item_chunk_offsets};
  const uint64_t ids[] = {0, 1};
  const uint8_t* data[] = {reinterpret_cast<const uint8_t*>(&ids[0]), reinterpret_cast<const uint8_t*>(&ids[1])};
  const uint64_t sizes[] = {8, 8};
  const double prio[] = {2.0, 1.0};
  Key keys[2];
  store.Insert(prio, data, sizes, 2, keys, &chunks);
  const StoreStats before = store.Stats();
  SampleResult r;
  store.Sample(1, 0.4, &r, true);  // item 0's first draw: counted, not held
  EXPECT_TRUE(r.held.empty());
  EXPECT_EQ(store.GiveBack(r.held.data(), r.held.size(), r.keys.data(), r.keys.size()), 0u);  // the draw back
  store.Sample(1, 0.4, &r, true);
  EXPECT_EQ(Ids(r), std::vector<uint64_t>{0});
  EXPECT_TRUE(r.held.empty());  // its first draw again, not its second
  store.Sample(1, 0.4, &r, true);
  EXPECT_EQ(Ids(r), std::vector<uint64_t>{0});
  ASSERT_EQ(r.held, std::vector<Key>{keys[0]});  // its second: held, its chunk kept
  EXPECT_EQ(store.Size(), 1u);
  EXPECT_EQ(store.Stats().chunks, 2u);
  EXPECT_EQ(store.Stats().bytes_held, before.bytes_held);
  ASSERT_VALID(store);
  EXPECT_EQ(store.GiveBack(r.held.data(), r.held.size(), r.keys.data(), r.keys.size()), 1u);
  ASSERT_VALID(store);
  for (int draw = 0; draw < 2; ++draw) {  // one draw left, then item 1 (priority order kept)
    store.Sample(1, 0.4, &r, true);
    EXPECT_EQ(r.keys, std::vector<Key>{keys[draw]});
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.chunk_data.data()), r.chunk_data.size()),
              draw == 0 ? chunk0 : chunk0 + chunk1);
    store.Release(r.held.data(), r.held.size());
  }
  ASSERT_VALID(store);
}

TEST(HeldItemsTest, ASnapshotKeepsHeldItemsAsNotYetDelivered) {
  testing_util::TempDir dir("held");
  const std::string path = dir.Path("held.snap");
  ShardedStore store(Config(SamplerKind::kFifo, 2, 1));
  InsertIds(store, std::vector<double>(4, 1.0), 1);
  SampleResult r;
  store.Sample(2, 0.4, &r, true);
  store.Save(path);
  std::unique_ptr<ShardedStore> loaded = ShardedStore::Load(path);
  ASSERT_VALID(*loaded);
  EXPECT_EQ(loaded->Size(), 4u);
  EXPECT_EQ(SampleIds(*loaded, 10), (std::vector<uint64_t>{0, 1, 2, 3}));
  store.Release(r.held.data(), r.held.size());
  ASSERT_VALID(store);
}

}  // namespace
}  // namespace apexrl
