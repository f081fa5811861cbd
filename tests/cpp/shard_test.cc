// Shard on its own: insert, sample, update, erase, stale keys, slot reuse, eviction by each policy, and
// Validate() after every operation (including a long random workload checked against a model).
#include "apexrl/shard.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "apexrl/common.h"
#include "apexrl/errors.h"
#include "apexrl/eviction/kinds.h"
#include "apexrl/eviction/lowest_priority.h"
#include "apexrl/random.h"
#include "apexrl/snapshot_io.h"
#include "temp_dir.h"

namespace apexrl {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

#define EXPECT_VALID(shard) EXPECT_NO_THROW((shard).Validate())
#define ASSERT_VALID(shard) ASSERT_NO_THROW((shard).Validate())

// One draw copied out of a SampleSink.
struct Draw {
  Key key;
  std::string payload;
  double mass;
  double probability;
};

// A shard plus the store-wide pieces a ShardedStore would hand it (the insertion counter), and helpers that
// build PreparedItems and SampleSinks.
class ShardHarness {
 public:
  ShardHarness(uint32_t index, double alpha, EvictionKind eviction, double alpha_evict = -0.4, size_t target_slots = 64,
               uint32_t epoch = 1)
      : alpha_(alpha), shard_(index, alpha, MakeEvictionPolicy(eviction, alpha_evict), target_slots, epoch) {}

  Shard& shard() { return shard_; }
  std::atomic<uint64_t>& seq() { return seq_; }

  std::vector<Key> Insert(const std::vector<double>& priorities, const std::vector<std::string>& payloads) {
    EXPECT_EQ(priorities.size(), payloads.size());
    // The shard copies the bytes during Insert; the caller keeps its buffers.
    std::vector<PreparedItem> items(priorities.size());
    for (size_t i = 0; i < items.size(); ++i) {
      items[i] =
          PreparedItem{reinterpret_cast<const uint8_t*>(payloads[i].data()), static_cast<uint32_t>(payloads[i].size()),
                       priorities[i], PriorityMass(priorities[i], alpha_)};
    }
    std::vector<Key> keys(items.size(), 0);
    EXPECT_TRUE(shard_.Insert(items.data(), items.size(), &seq_, keys.data(), true));
    return keys;
  }
  Key InsertOne(double priority, const std::string& payload) { return Insert({priority}, {payload})[0]; }

  size_t Update(const std::vector<Key>& keys, const std::vector<double>& priorities) {
    std::vector<double> masses;
    for (double p : priorities) masses.push_back(PriorityMass(p, alpha_));
    return shard_.Update(keys.data(), priorities.data(), masses.data(), keys.size());
  }
  size_t Erase(const std::vector<Key>& keys) { return shard_.Erase(keys.data(), keys.size()); }

  EvictionSummary Summary(size_t max_ranks = 0) const {
    EvictionSummary out;
    shard_.Summarize(max_ranks, &out);
    return out;
  }
  std::vector<uint64_t> Ranks(size_t max_ranks) const { return Summary(max_ranks).ranks; }
  size_t Evict(size_t count, Rng& rng, uint64_t max_rank = kAnyRank) {
    return shard_.Evict(EvictionQuota{count, max_rank}, rng);
  }

  // Runs Sample (or SampleUniform when rng != nullptr) into a sink whose first `first` positions are
  // untouched padding, and checks the layout of what came out. Returns the draws, or nothing on false.
  std::vector<Draw> Sample(const std::vector<double>& fractions, double share, size_t first = 0,
                           Rng* uniform_rng = nullptr, size_t uniform_k = 0) {
    const size_t k = uniform_rng != nullptr ? uniform_k : fractions.size();
    const size_t n = first + k;
    std::vector<Key> keys(n, 0xAAAA);
    std::vector<double> masses(n, -1.0), probabilities(n, -1.0);
    std::vector<uint64_t> offsets(n + 1, 0xBBBB);
    ByteBuffer data;
    const std::string pad(first * 3, '#');  // what earlier draws would have written
    if (!pad.empty()) std::memcpy(data.Extend(pad.size()), pad.data(), pad.size());
    std::vector<uint64_t> item_chunk_offsets(n + 1, 0);
    std::vector<uint64_t> item_chunks;
    ByteBuffer chunk_data;
    std::vector<uint64_t> chunk_offsets;
    const SampleSink sink{keys.data(),  masses.data(),  probabilities.data(),
                          &data,        offsets.data(), item_chunk_offsets.data(),
                          &item_chunks, &chunk_data,    &chunk_offsets};
    const bool ok = uniform_rng != nullptr ? shard_.SampleUniform(k, *uniform_rng, share, sink, first)
                                           : shard_.Sample(fractions.data(), k, share, sink, first);
    for (size_t i = 0; i < first; ++i) {  // positions before `first` untouched
      EXPECT_EQ(keys[i], 0xAAAAu);
      EXPECT_EQ(offsets[i], 0xBBBBu);
    }
    if (!ok) {
      EXPECT_EQ(data.size(), pad.size()) << "a failed sample wrote bytes";
      EXPECT_EQ(keys[first], 0xAAAAu) << "a failed sample wrote keys";
      return {};
    }
    offsets[n] = data.size();
    std::vector<Draw> out;
    for (size_t i = first; i < n; ++i) {
      EXPECT_GE(offsets[i], pad.size());
      EXPECT_LE(offsets[i], offsets[i + 1]);
      EXPECT_LE(offsets[i + 1], data.size());
      out.push_back(Draw{
          keys[i], std::string(reinterpret_cast<const char*>(data.data()) + offsets[i], offsets[i + 1] - offsets[i]),
          masses[i], probabilities[i]});
    }
    EXPECT_EQ(offsets[first], pad.size());
    return out;
  }

 private:
  double alpha_;
  std::atomic<uint64_t> seq_{0};
  Shard shard_;
};

std::string Payload(int id) { return "item-" + std::to_string(id); }

uint64_t LowestPriorityRank(double priority) { return LowestPriorityPolicy::RankOf(priority); }

// ---------------------------------------------------------------------------------------------------------

TEST(ShardTest, InsertIssuesKeysNamingThisShardDistinctSlotsAndGenerationOne) {
  ShardHarness h(3, 1.0, EvictionKind::kFifo);
  Shard& shard = h.shard();
  EXPECT_EQ(shard.size(), 0u);
  EXPECT_EQ(shard.total(), 0.0);
  EXPECT_EQ(shard.min_positive(), kInf);
  EXPECT_EQ(shard.max_seq(), 0u);
  EXPECT_VALID(shard);

  const std::vector<Key> keys = h.Insert({1.0, 2.0, 0.0, 4.5}, {"a", "bb", "", "dddd"});
  std::set<Slot> slots;
  for (Key k : keys) {
    const KeyParts kp = SplitKey(k);
    EXPECT_EQ(kp.shard, 3u);
    EXPECT_EQ(kp.tag, MakeTag(1, 1));
    EXPECT_NE(k, 0u);
    slots.insert(kp.slot);
  }
  EXPECT_EQ(slots.size(), 4u);
  EXPECT_EQ(shard.size(), 4u);
  EXPECT_EQ(shard.total(), 7.5);
  EXPECT_EQ(shard.min_positive(), 1.0);
  EXPECT_EQ(shard.bytes(), 7u);
  EXPECT_EQ(shard.max_seq(), 4u);
  EXPECT_EQ(h.seq().load(), 4u);
  EXPECT_EQ(shard.counters().inserted, 4u);
  EXPECT_VALID(shard);
}

TEST(ShardTest, NonBlockingInsertSucceedsWhenTheLockIsFree) {
  ShardHarness h(0, 1.0, EvictionKind::kFifo);
  const uint8_t byte = 7;
  PreparedItem item{&byte, 1, 1.0, 1.0};
  Key key = 0;
  ASSERT_TRUE(h.shard().Insert(&item, 1, &h.seq(), &key, false));
  EXPECT_EQ(h.shard().size(), 1u);
  EXPECT_VALID(h.shard());
  const auto draws = h.Sample({0.5}, 1.0);
  ASSERT_EQ(draws.size(), 1u);
  EXPECT_EQ(draws[0].key, key);
  EXPECT_EQ(draws[0].payload, std::string(1, '\x07'));
}

TEST(ShardTest, InsertCopiesTheBytesSoTheCallerMayReuseItsBuffers) {
  ShardHarness h(0, 1.0, EvictionKind::kFifo);
  std::vector<std::string> payloads = {"first", std::string(5000, 'L'), ""};
  const std::vector<Key> keys = h.Insert({1.0, 1.0, 1.0}, payloads);
  for (std::string& p : payloads) p.assign(p.size(), '?');
  const auto draws = h.Sample({0.1, 0.5, 0.9}, 1.0);
  ASSERT_EQ(draws.size(), 3u);
  EXPECT_EQ(draws[0].payload, "first");
  EXPECT_EQ(draws[1].payload, std::string(5000, 'L'));
  EXPECT_EQ(draws[2].payload, "");
  EXPECT_EQ(h.shard().bytes(), 5005u);
  EXPECT_VALID(h.shard());
}

TEST(ShardTest, SampleReturnsTheItemWhosePrefixIntervalContainsEachFraction) {
  ShardHarness h(1, 1.0, EvictionKind::kFifo);
  const std::vector<Key> keys = h.Insert({1.0, 2.0, 3.0, 4.0}, {"A", "BB", "CCC", "DDDD"});
  // Masses 1, 2, 3, 4: cumulative intervals [0,1) [1,3) [3,6) [6,10).
  const std::vector<double> fractions = {0.05, 0.15, 0.35, 0.95, 0.0, 0.25, 0.55};
  const std::vector<size_t> expected = {0, 1, 2, 3, 0, 1, 2};
  const double share = 0.25;
  const auto draws = h.Sample(fractions, share, /*first=*/2);
  ASSERT_EQ(draws.size(), fractions.size());
  const std::vector<std::string> payloads = {"A", "BB", "CCC", "DDDD"};
  for (size_t i = 0; i < draws.size(); ++i) {
    const size_t item = expected[i];
    EXPECT_EQ(draws[i].key, keys[item]) << "draw " << i;
    EXPECT_EQ(draws[i].payload, payloads[item]) << "draw " << i;
    EXPECT_EQ(draws[i].mass, static_cast<double>(item + 1));
    EXPECT_DOUBLE_EQ(draws[i].probability, static_cast<double>(item + 1) / 10.0 * share);
  }
  EXPECT_EQ(h.shard().counters().sampled, fractions.size());
  EXPECT_VALID(h.shard());
}

TEST(ShardTest, SampleUsesPriorityToTheAlpha) {
  ShardHarness h(0, 0.5, EvictionKind::kFifo);
  const std::vector<Key> keys = h.Insert({9.0, 16.0, 0.0, 25.0}, {"x", "y", "z", "w"});  // masses 3, 4, 0, 5
  EXPECT_EQ(h.shard().total(), 12.0);
  EXPECT_EQ(h.shard().min_positive(), 3.0);
  // 3/12 = 0.25 and 7/12 are the boundaries; the zero-mass item is never drawn.
  const auto draws = h.Sample({0.0, 0.249, 0.25, 0.58, 0.59, 0.999999}, 1.0);
  ASSERT_EQ(draws.size(), 6u);
  const std::vector<Key> expected = {keys[0], keys[0], keys[1], keys[1], keys[3], keys[3]};
  for (size_t i = 0; i < draws.size(); ++i) {
    EXPECT_EQ(draws[i].key, expected[i]) << "draw " << i;
    EXPECT_NE(draws[i].key, keys[2]);
  }
  EXPECT_DOUBLE_EQ(draws[4].probability, 5.0 / 12.0);
}

TEST(ShardTest, SampleOfAnEmptyOrMasslessShardWritesNothing) {
  ShardHarness h(0, 0.6, EvictionKind::kFifo);
  EXPECT_TRUE(h.Sample({0.5}, 1.0).empty());
  Rng rng(1);
  EXPECT_TRUE(h.Sample({}, 1.0, 0, &rng, 3).empty());
  const std::vector<Key> keys = h.Insert({0.0, 0.0, 0.0}, {"p", "q", "r"});  // all masses 0 (alpha > 0)
  EXPECT_EQ(h.shard().total(), 0.0);
  EXPECT_TRUE(h.Sample({0.5}, 1.0).empty());
  EXPECT_EQ(h.shard().counters().sampled, 0u);
  // The uniform fallback still draws, each item with probability share / size.
  const auto draws = h.Sample({}, 0.6, 1, &rng, 300);
  ASSERT_EQ(draws.size(), 300u);
  std::map<Key, int> counts;
  for (const Draw& d : draws) {
    ++counts[d.key];
    EXPECT_DOUBLE_EQ(d.probability, 0.6 / 3.0);
    EXPECT_EQ(d.mass, 0.0);
    const size_t i = static_cast<size_t>(std::find(keys.begin(), keys.end(), d.key) - keys.begin());
    ASSERT_LT(i, keys.size());
    EXPECT_EQ(d.payload, std::string(1, "pqr"[i]));
  }
  EXPECT_EQ(counts.size(), 3u);
  for (const auto& kv : counts) EXPECT_GT(kv.second, 50);
  EXPECT_VALID(h.shard());
}

TEST(ShardTest, UpdateSetsNewMassesAndSkipsStaleKeys) {
  ShardHarness h(2, 1.0, EvictionKind::kFifo);
  const std::vector<Key> keys = h.Insert({1.0, 1.0, 1.0}, {"a", "b", "c"});
  EXPECT_EQ(h.Update({keys[0], keys[2]}, {5.0, 0.5}), 2u);
  EXPECT_EQ(h.shard().total(), 6.5);
  EXPECT_EQ(h.shard().min_positive(), 0.5);
  EXPECT_VALID(h.shard());
  // The same key twice in one call: the last priority wins.
  EXPECT_EQ(h.Update({keys[1], keys[1]}, {7.0, 2.0}), 2u);
  EXPECT_EQ(h.shard().total(), 7.5);
  EXPECT_VALID(h.shard());

  ASSERT_EQ(h.Erase({keys[0]}), 1u);
  const KeyParts kp = SplitKey(keys[1]);
  const Key wrong_generation = MakeKey(kp.shard, kp.slot, kp.tag + 1);
  const Key unused_slot = MakeKey(kp.shard, 1000000, 1);
  EXPECT_EQ(h.Update({keys[0], wrong_generation, unused_slot, keys[2]}, {9.0, 9.0, 9.0, 3.0}), 1u);
  EXPECT_EQ(h.shard().total(), 5.0);  // 2 (keys[1]) + 3 (keys[2])
  const ShardCounters c = h.shard().counters();
  EXPECT_EQ(c.updated, 5u);
  EXPECT_EQ(c.stale_updates, 3u);
  EXPECT_VALID(h.shard());
}

TEST(ShardTest, EraseRemovesOnlyLiveKeysAndReleasesTheirBytes) {
  ShardHarness h(0, 1.0, EvictionKind::kPrioritized, -0.4);
  const std::vector<Key> keys = h.Insert({1.0, 2.0, 3.0}, {"aaaa", "bb", "c"});
  EXPECT_EQ(h.shard().bytes(), 7u);
  EXPECT_EQ(h.Erase({keys[0], keys[0], keys[2]}), 2u);  // a key twice counts once
  EXPECT_EQ(h.shard().size(), 1u);
  EXPECT_EQ(h.shard().bytes(), 2u);
  EXPECT_EQ(h.shard().total(), 2.0);
  EXPECT_EQ(h.shard().min_positive(), 2.0);
  EXPECT_VALID(h.shard());
  EXPECT_EQ(h.Erase({keys[0], keys[2]}), 0u);  // stale
  EXPECT_EQ(h.shard().counters().erased, 2u);
  const auto draws = h.Sample({0.0, 0.5, 0.9999}, 1.0);
  ASSERT_EQ(draws.size(), 3u);
  for (const Draw& d : draws) EXPECT_EQ(d.key, keys[1]);
  EXPECT_EQ(h.Erase({keys[1]}), 1u);
  EXPECT_EQ(h.shard().size(), 0u);
  EXPECT_EQ(h.shard().total(), 0.0);
  EXPECT_EQ(h.shard().min_positive(), kInf);
  EXPECT_EQ(h.shard().bytes(), 0u);
  EXPECT_VALID(h.shard());
}

TEST(ShardTest, FreedSlotIsReusedWithABumpedGenerationSoOldKeysTurnStale) {
  ShardHarness h(5, 1.0, EvictionKind::kFifo);
  const std::vector<Key> keys = h.Insert({1.0, 1.0, 1.0}, {"a", "b", "c"});
  ASSERT_EQ(h.Erase({keys[1]}), 1u);
  ASSERT_VALID(h.shard());
  const Key fresh = h.InsertOne(2.0, "fresh");
  EXPECT_EQ(SplitKey(fresh).slot, SplitKey(keys[1]).slot);    // the freed slot is reused
  EXPECT_EQ(SplitKey(fresh).tag, SplitKey(keys[1]).tag + 1);  // same epoch, next generation
  EXPECT_EQ(SplitKey(fresh).shard, 5u);
  EXPECT_NE(fresh, keys[1]);
  ASSERT_VALID(h.shard());
  // The old key addresses nothing: no update, no erase, and the new occupant is untouched.
  EXPECT_EQ(h.Update({keys[1]}, {100.0}), 0u);
  EXPECT_EQ(h.Erase({keys[1]}), 0u);
  EXPECT_EQ(h.shard().size(), 3u);
  EXPECT_EQ(h.shard().total(), 4.0);
  // Slot order: keys[0] (mass 1), fresh (2), keys[2] (1): the fresh item covers [1, 3) of the total 4.
  const auto draws = h.Sample({0.3, 0.7}, 1.0);
  ASSERT_EQ(draws.size(), 2u);
  for (const Draw& d : draws) {
    EXPECT_EQ(d.key, fresh);
    EXPECT_EQ(d.payload, "fresh");
  }
  EXPECT_EQ(h.shard().counters().stale_updates, 1u);
  ASSERT_VALID(h.shard());
}

TEST(ShardTest, FreedSlotsAreReusedLastFreedFirst) {
  ShardHarness h(0, 1.0, EvictionKind::kFifo);
  const std::vector<Key> keys = h.Insert({1, 1, 1, 1, 1}, {"0", "1", "2", "3", "4"});
  ASSERT_EQ(h.Erase({keys[1]}), 1u);
  ASSERT_EQ(h.Erase({keys[3]}), 1u);
  const std::vector<Key> fresh = h.Insert({1, 1, 1}, {"x", "y", "z"});
  EXPECT_EQ(SplitKey(fresh[0]).slot, SplitKey(keys[3]).slot);
  EXPECT_EQ(SplitKey(fresh[1]).slot, SplitKey(keys[1]).slot);
  std::set<Slot> used;
  for (Key k : {keys[0], keys[2], keys[4], fresh[0], fresh[1], fresh[2]}) used.insert(SplitKey(k).slot);
  EXPECT_EQ(used.size(), 6u);  // the third new item took a never-used slot
  EXPECT_VALID(h.shard());
}

TEST(ShardTest, GrowingPastTheTargetKeepsEveryItem) {
  ShardHarness h(0, 1.0, EvictionKind::kPrioritized, -0.4, /*target_slots=*/16);
  std::vector<Key> keys;
  for (int i = 0; i < 500; ++i) {
    keys.push_back(h.InsertOne(1.0 + i, Payload(i)));
    if (i % 37 == 0) {
      ASSERT_VALID(h.shard());
    }
  }
  ASSERT_VALID(h.shard());
  EXPECT_EQ(h.shard().size(), 500u);
  EXPECT_EQ(h.shard().total(), 500.0 * 501.0 / 2.0);
  EXPECT_EQ(h.Update(keys, std::vector<double>(500, 1.0)), 500u);
  // Item i now covers [i, i+1) of the mass.
  const auto draws = h.Sample({0.5 / 500, 250.5 / 500, 499.5 / 500}, 1.0);
  ASSERT_EQ(draws.size(), 3u);
  EXPECT_EQ(draws[0].payload, Payload(0));
  EXPECT_EQ(draws[1].payload, Payload(250));
  EXPECT_EQ(draws[2].payload, Payload(499));
  EXPECT_VALID(h.shard());
}

TEST(ShardTest, ConstructorRejectsAMissingPolicy) { EXPECT_THROW(Shard(0, 1.0, nullptr, 16), std::invalid_argument); }

TEST(ShardTest, SummarizeOverwritesEveryFieldWithThisShardsState) {
  ShardHarness fifo(0, 1.0, EvictionKind::kFifo);
  ShardHarness prioritized(1, 1.0, EvictionKind::kPrioritized, -0.4);
  fifo.Insert({1.0, 0.0, 2.0}, {"a", "b", "c"});
  prioritized.Insert({1.0, 0.0, 4.0}, {"a", "b", "c"});
  EvictionSummary s;
  s.size = 99;
  s.ranks = {7, 7, 7};
  s.mass = 5.0;
  s.urgent = 9;
  fifo.shard().Summarize(2, &s);  // a summary reused from an earlier round or another shard
  EXPECT_EQ(s.size, 3u);
  EXPECT_EQ(s.ranks, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.mass, 0.0);
  EXPECT_EQ(s.urgent, 0u);
  prioritized.shard().Summarize(2, &s);
  EXPECT_EQ(s.size, 3u);
  EXPECT_TRUE(s.ranks.empty());
  EXPECT_NEAR(s.mass, 1.0 + std::pow(4.0, -0.4), 1e-12);
  EXPECT_EQ(s.urgent, 1u);
}

TEST(ShardTest, FifoEvictRemovesOldestFirstWithinTheCountAndTheRankBound) {
  ShardHarness h(0, 1.0, EvictionKind::kFifo);
  std::vector<Key> keys;
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 10; ++i) {
    h.seq().fetch_add(3);  // other shards take insertion numbers in between
    keys.push_back(h.InsertOne(1.0, Payload(i)));
    seqs.push_back(h.seq().load());
  }
  EXPECT_EQ(h.shard().max_seq(), seqs.back());
  EXPECT_EQ(h.Ranks(4), std::vector<uint64_t>(seqs.begin(), seqs.begin() + 4));

  ASSERT_EQ(h.Erase({keys[2]}), 1u);
  Rng rng(1);
  // Everything up to the 5th item's number: items 0, 1, 3, 4 (item 2 is already gone).
  EXPECT_EQ(h.Evict(100, rng, seqs[4]), 4u);
  ASSERT_VALID(h.shard());
  EXPECT_EQ(h.Ranks(100), std::vector<uint64_t>(seqs.begin() + 5, seqs.end()));
  // The count stops early; a bound below every item removes nothing.
  EXPECT_EQ(h.Evict(2, rng, seqs.back()), 2u);
  EXPECT_EQ(h.Evict(100, rng, seqs[6]), 0u);
  ASSERT_VALID(h.shard());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(h.Update({keys[i]}, {1.0}), i >= 7 ? 1u : 0u) << "item " << i;
  }
  EXPECT_EQ(h.shard().counters().evicted, 6u);
  EXPECT_EQ(h.shard().counters().erased, 1u);
  EXPECT_EQ(h.shard().max_seq(), seqs.back());  // the maximum ever stored, not the current one
  EXPECT_EQ(h.Evict(100, rng), 3u);             // no bound: asking for more than it holds empties it
  EXPECT_EQ(h.shard().size(), 0u);
  EXPECT_EQ(h.Evict(5, rng), 0u);
  ASSERT_VALID(h.shard());
}

TEST(ShardTest, EvictBeyondOneChunkKeepsGoingAndCountsEveryRemoval) {
  for (EvictionKind kind : {EvictionKind::kFifo, EvictionKind::kPrioritized, EvictionKind::kLowestPriority}) {
    ShardHarness h(0, 1.0, kind, -0.4, 16);
    const size_t n = 3 * Shard::kEvictChunk + 10;
    const std::vector<Key> keys = h.Insert(std::vector<double>(n, 1.0), std::vector<std::string>(n, "x"));
    Rng rng(2);
    const size_t k = 2 * Shard::kEvictChunk + 5;
    EXPECT_EQ(h.Evict(k, rng), k);
    ASSERT_VALID(h.shard());
    EXPECT_EQ(h.shard().size(), n - k);
    EXPECT_EQ(h.shard().counters().evicted, k);
    if (kind == EvictionKind::kFifo) {  // exactly the oldest k
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(h.Update({keys[i]}, {1.0}), i >= k ? 1u : 0u) << i;
    }
    EXPECT_EQ(h.Evict(n, rng), n - k);
    EXPECT_EQ(h.shard().size(), 0u);
  }
}

TEST(ShardTest, EvictOnALowestPriorityShardFollowsCurrentPrioritiesWithinTheBound) {
  ShardHarness h(0, 1.0, EvictionKind::kLowestPriority);
  const std::vector<Key> keys = h.Insert({4.0, 1.0, 3.0, 2.0, 5.0}, {"a", "b", "c", "d", "e"});
  ASSERT_EQ(h.Update({keys[4]}, {0.5}), 1u);  // "e" is now the lowest
  EXPECT_EQ(h.Ranks(3),
            (std::vector<uint64_t>{LowestPriorityRank(0.5), LowestPriorityRank(1.0), LowestPriorityRank(2.0)}));
  Rng rng(6);
  EXPECT_EQ(h.Evict(10, rng, LowestPriorityRank(1.0)), 2u);  // "e" and "b"; "d" (2.0) is past the bound
  ASSERT_VALID(h.shard());
  EXPECT_EQ(h.Update({keys[4], keys[1]}, {1.0, 1.0}), 0u);
  EXPECT_EQ(h.Evict(1, rng), 1u);  // "d"
  EXPECT_EQ(h.Update({keys[3]}, {1.0}), 0u);
  EXPECT_EQ(h.Update({keys[0], keys[2]}, {4.0, 3.0}), 2u);
  ASSERT_VALID(h.shard());
}

TEST(ShardTest, EvictOnAPrioritizedShardTakesUrgentItemsFirst) {
  ShardHarness h(0, 1.0, EvictionKind::kPrioritized, -0.4);
  const std::vector<Key> keys = h.Insert({1.0, 0.0, 2.0, 0.0, 4.0}, {"a", "b", "c", "d", "e"});
  EvictionSummary s = h.Summary();
  EXPECT_EQ(s.urgent, 2u);
  EXPECT_NEAR(s.mass, 1.0 + std::pow(2.0, -0.4) + std::pow(4.0, -0.4), 1e-12);
  Rng rng(2);
  EXPECT_EQ(h.Evict(2, rng, 0), 2u);  // a rank bound means nothing to drawn victims
  ASSERT_VALID(h.shard());
  EXPECT_EQ(h.Update({keys[1]}, {1.0}), 0u);
  EXPECT_EQ(h.Update({keys[3]}, {1.0}), 0u);
  s = h.Summary();
  EXPECT_EQ(s.urgent, 0u);
  EXPECT_EQ(s.size, 3u);
  EXPECT_EQ(h.shard().size(), 3u);
  ASSERT_VALID(h.shard());
}

TEST(ShardTest, EvictPrefersLowPrioritiesWithNegativeAlphaEvict) {
  // 100 items of priority 0.001 (weight 0.001^-0.4 ~ 15.8) and 100 of priority 1 (weight 1): evicting 100
  // should take mostly the low ones.
  ShardHarness h(0, 1.0, EvictionKind::kPrioritized, -0.4, 256);
  std::vector<Key> low, high;
  for (int i = 0; i < 100; ++i) {
    low.push_back(h.InsertOne(0.001, "low"));
    high.push_back(h.InsertOne(1.0, "high"));
  }
  Rng rng(3);
  EXPECT_EQ(h.Evict(100, rng), 100u);
  ASSERT_VALID(h.shard());
  const size_t low_left = h.Update(low, std::vector<double>(100, 0.001));
  const size_t high_left = h.Update(high, std::vector<double>(100, 1.0));
  EXPECT_EQ(low_left + high_left, 100u);
  EXPECT_LT(low_left, 40u);
  EXPECT_GT(high_left, 60u);
}

TEST(ShardTest, EvictWithNoPreferencePicksUniformly) {
  // alpha_evict > 0 and every priority 0: the policy has no preference and picks uniformly.
  ShardHarness h(0, 1.0, EvictionKind::kPrioritized, 1.0);
  h.Insert(std::vector<double>(10, 0.0), std::vector<std::string>(10, "z"));
  Rng rng(4);
  EXPECT_EQ(h.Evict(4, rng), 4u);
  EXPECT_EQ(h.shard().size(), 6u);
  ASSERT_VALID(h.shard());
}

TEST(ShardTest, ValidatePassesAfterEveryOperationOfARandomWorkload) {
  for (EvictionKind kind : {EvictionKind::kFifo, EvictionKind::kPrioritized, EvictionKind::kLowestPriority}) {
    for (double alpha : {0.0, 0.6, 1.0}) {
      SCOPED_TRACE("eviction " + std::to_string(static_cast<int>(kind)) + " alpha " + std::to_string(alpha));
      ShardHarness h(7, alpha, kind, -0.4, 16);
      Rng rng(static_cast<uint64_t>(alpha * 10) + 100 * static_cast<uint64_t>(kind));
      std::map<Key, std::pair<double, std::string>> model;  // live key -> (priority, payload)
      std::vector<Key> dead;
      int next_id = 0;
      auto random_key = [&]() {
        auto it = model.begin();
        std::advance(it, static_cast<long>(rng.Below(model.size())));
        return it->first;
      };
      for (int step = 0; step < 600; ++step) {
        const uint64_t op = model.empty() ? 0 : rng.Below(6);
        if (op <= 1) {  // insert a small batch
          const size_t n = 1 + rng.Below(5);
          std::vector<double> pr;
          std::vector<std::string> pl;
          for (size_t i = 0; i < n; ++i) {
            pr.push_back(rng.Below(4) == 0 ? 0.0 : static_cast<double>(rng.Below(100)) / 8.0);
            pl.push_back(Payload(next_id++) + std::string(rng.Below(20), 'x'));
          }
          const auto keys = h.Insert(pr, pl);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(model.count(keys[i]), 0u) << "key issued twice";
            model[keys[i]] = {pr[i], pl[i]};
          }
        } else if (op == 2) {  // update live and dead keys
          std::vector<Key> keys;
          std::vector<double> pr;
          size_t live = 0;
          for (int i = 0; i < 3; ++i) {
            keys.push_back(random_key());
            pr.push_back(static_cast<double>(rng.Below(50)) / 4.0);
          }
          if (!dead.empty()) {
            keys.push_back(dead[rng.Below(dead.size())]);
            pr.push_back(1.0);
          }
          for (size_t i = 0; i < keys.size(); ++i) {
            auto it = model.find(keys[i]);
            if (it != model.end()) {
              it->second.first = pr[i];
              ++live;
            }
          }
          ASSERT_EQ(h.Update(keys, pr), live);
        } else if (op == 3) {  // erase one live and one dead key
          std::vector<Key> keys = {random_key()};
          if (!dead.empty()) keys.push_back(dead[rng.Below(dead.size())]);
          ASSERT_EQ(h.Erase(keys), 1u);
          model.erase(keys[0]);
          dead.push_back(keys[0]);
        } else if (op == 4) {  // sample and check every draw against the model
          double total = 0.0;
          for (const auto& kv : model) total += PriorityMass(kv.second.first, alpha);
          std::vector<double> fractions(8);
          for (double& f : fractions) f = rng.Uniform();
          const auto draws = h.Sample(fractions, 1.0, rng.Below(3));
          ASSERT_EQ(draws.empty(), !(total > 0.0));
          for (const Draw& d : draws) {
            auto it = model.find(d.key);
            ASSERT_NE(it, model.end()) << "sampled a key that is not live";
            EXPECT_EQ(d.payload, it->second.second);
            EXPECT_EQ(d.mass, PriorityMass(it->second.first, alpha));
            EXPECT_GT(d.mass, 0.0);
            EXPECT_NEAR(d.probability, d.mass / total, 1e-9);
          }
        } else {  // evict a few
          const size_t before = model.size();
          const size_t k = 1 + rng.Below(3);
          const size_t removed = h.Evict(k, rng);
          ASSERT_EQ(removed, std::min(k, before));
          std::vector<Key> gone;
          for (const auto& kv : model) {
            const Key key = kv.first;
            if (h.Update({key}, {kv.second.first}) == 0) gone.push_back(key);
          }
          ASSERT_EQ(gone.size(), removed);
          for (Key key : gone) {
            model.erase(key);
            dead.push_back(key);
          }
        }
        ASSERT_VALID(h.shard()) << "after step " << step << " (op " << op << ")";
        ASSERT_EQ(h.shard().size(), model.size());
        double total = 0.0;
        uint64_t bytes = 0;
        for (const auto& kv : model) {
          total += PriorityMass(kv.second.first, alpha);
          bytes += kv.second.second.size();
        }
        ASSERT_NEAR(h.shard().total(), total, 1e-9 * (1.0 + total));
        ASSERT_EQ(h.shard().bytes(), bytes);
      }
    }
  }
}

// A scratch directory removed at the end of the test.
class ShardFileTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.Path(name); }

  testing_util::TempDir dir_{"apexrl_shard_test"};
};

TEST_F(ShardFileTest, WriteThenReadRestoresItemsKeysAndCounters) {
  ShardHarness a(2, 0.6, EvictionKind::kFifo);
  const std::vector<Key> keys = a.Insert({1.0, 0.0, 3.0, 2.0}, {"one", "", "three", "four"});
  ASSERT_EQ(a.Erase({keys[2]}), 1u);
  ASSERT_EQ(a.Update({keys[3], keys[2]}, {5.0, 1.0}), 1u);
  const std::string path = Path("shard.bin");
  {
    SnapshotWriter out(path);
    a.shard().Write(out);
    out.Commit();
  }
  ShardHarness b(2, 0.6, EvictionKind::kFifo);
  {
    SnapshotReader in(path);
    b.shard().Read(in, 4);
    in.VerifyChecksum();
  }
  ASSERT_VALID(b.shard());
  EXPECT_EQ(b.shard().size(), 3u);
  EXPECT_EQ(b.shard().total(), a.shard().total());
  EXPECT_EQ(b.shard().bytes(), a.shard().bytes());
  EXPECT_EQ(b.shard().max_seq(), a.shard().max_seq());
  const ShardCounters ca = a.shard().counters(), cb = b.shard().counters();
  EXPECT_EQ(cb.inserted, ca.inserted);
  EXPECT_EQ(cb.updated, ca.updated);
  EXPECT_EQ(cb.stale_updates, ca.stale_updates);
  EXPECT_EQ(cb.erased, ca.erased);
  // Old keys still address the same items (and the erased one stays stale).
  EXPECT_EQ(b.Update({keys[0], keys[1], keys[2], keys[3]}, {1.0, 0.0, 9.0, 5.0}), 3u);
  // FIFO order survives: the oldest live item goes first.
  Rng rng(5);
  EXPECT_EQ(b.Evict(1, rng), 1u);
  EXPECT_EQ(b.Update({keys[0]}, {1.0}), 0u);
  EXPECT_EQ(b.Update({keys[1]}, {0.0}), 1u);
  ASSERT_VALID(b.shard());
}

TEST(ShardTest, SlotWhoseGenerationReachesTheLimitIsRetiredForTheRestOfTheEpoch) {
  ShardHarness h(0, 1.0, EvictionKind::kFifo, -0.4, 64, /*epoch=*/7);
  // One slot, freed and reused until its generation is the last of the epoch.
  std::set<Key> issued;
  Key last = 0;
  for (uint32_t g = 1; g <= kMaxGeneration; ++g) {
    last = h.InsertOne(1.0, "x");
    ASSERT_EQ(SplitKey(last).slot, 0u);
    ASSERT_EQ(SplitKey(last).tag, MakeTag(7, g));
    ASSERT_TRUE(issued.insert(last).second) << "key issued twice";
    ASSERT_EQ(h.Erase({last}), 1u);
  }
  ASSERT_VALID(h.shard());
  const Key next = h.InsertOne(1.0, "next");
  EXPECT_EQ(SplitKey(next).slot, 1u) << "a retired slot was reused";
  EXPECT_EQ(SplitKey(next).tag, MakeTag(7, 1));
  // Nothing addresses slot 0 any more, whatever tag a key claims.
  for (Tag t : {Tag{0}, MakeTag(7, 1), MakeTag(7, kMaxGeneration), MakeTag(8, 1)}) {
    EXPECT_EQ(h.Update({MakeKey(0, 0, t)}, {1.0}), 0u);
  }
  EXPECT_EQ(h.shard().size(), 1u);
  ASSERT_VALID(h.shard());
}

TEST_F(ShardFileTest, ReadWithANewEpochKeepsRestoredKeysAndStalesEveryOtherKeyOfTheOldLife) {
  ShardHarness a(1, 1.0, EvictionKind::kFifo, -0.4, 64, /*epoch=*/3);
  // Slot 0 retired (its last generation of epoch 3 used up), slots 1..4 live, slot 2 then freed.
  for (uint32_t g = 1; g <= kMaxGeneration; ++g) ASSERT_EQ(a.Erase({a.InsertOne(1.0, "r")}), 1u);
  const std::vector<Key> keys = a.Insert({1.0, 2.0, 3.0, 4.0}, {"one", "two", "three", "four"});
  ASSERT_EQ(SplitKey(keys[0]).slot, 1u);
  ASSERT_EQ(a.Erase({keys[1]}), 1u);
  const std::string path = Path("shard.bin");
  {
    SnapshotWriter out(path);
    a.shard().Write(out);
    out.Commit();
  }
  // The old life goes on after the snapshot: these keys must be stale in the restored shard.
  std::vector<Key> after = a.Insert({5.0, 6.0}, {"five", "six"});
  ASSERT_EQ(a.Erase({keys[3]}), 1u);
  after.push_back(a.InsertOne(7.0, "seven"));

  ShardHarness b(1, 1.0, EvictionKind::kFifo, -0.4, 64, /*epoch=*/4);
  {
    SnapshotReader in(path);
    b.shard().Read(in, 4);
    in.VerifyChecksum();
  }
  ASSERT_VALID(b.shard());
  b.seq() = a.seq().load();  // the store-wide insertion counter goes on
  EXPECT_EQ(b.shard().size(), 3u);
  // Keys of restored items still address them.
  EXPECT_EQ(b.Update({keys[0], keys[2], keys[3]}, {1.5, 3.5, 4.5}), 3u);
  // New items take the free slots, retired slot 0 included (a new epoch starts its generations afresh).
  const std::vector<Key> fresh = b.Insert({1.0, 1.0, 1.0}, {"a", "b", "c"});
  std::set<Slot> slots;
  for (Key k : fresh) {
    EXPECT_EQ(TagEpoch(SplitKey(k).tag), 4u);
    EXPECT_EQ(TagGeneration(SplitKey(k).tag), 1u);
    slots.insert(SplitKey(k).slot);
  }
  EXPECT_EQ(slots, (std::set<Slot>{0, 2, 5}));
  // Every key of the old life that was not restored is stale, though the same slots hold items again.
  const ShardCounters before = b.shard().counters();
  EXPECT_EQ(b.Update(after, {9.0, 9.0, 9.0}), 0u);
  EXPECT_EQ(b.Update({keys[1]}, {9.0}), 0u);
  EXPECT_EQ(b.Erase(after), 0u);
  EXPECT_EQ(b.shard().counters().stale_updates, before.stale_updates + 4);
  EXPECT_EQ(b.shard().size(), 6u);
  EXPECT_EQ(b.shard().total(), 1.5 + 3.5 + 4.5 + 3.0);
  ASSERT_VALID(b.shard());
}

}  // namespace
}  // namespace apexrl
