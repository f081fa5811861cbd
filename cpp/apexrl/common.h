// Shared vocabulary of the apexrl core: keys, slots and the layout that ties them together.
#ifndef APEXRL_COMMON_H_
#define APEXRL_COMMON_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace apexrl {

// A key is a 64-bit handle the store issues for one inserted item. It locates the item without a hash map:
//
//   bits 63..36  tag (28 bits)   -- epoch (12 bits) << 16 | generation (16 bits), see below
//   bits 35..8   slot (28 bits)  -- index into the shard's arrays
//   bits  7..0   shard (8 bits)
//
// A key addresses an item iff its slot is occupied AND the slot's stored tag equals the key's tag.
//
// Epoch: every store is built with an epoch in 1..kMaxEpoch (StoreConfig::epoch), and every key it issues
// carries it. A restarted server picks an epoch that differs from its earlier lives (docs/protocol.md,
// "Keys"), so a key issued by an earlier life never matches a slot (re)issued in this one.
// Generation: a slot's next tag is generation + 1 if its last tag has the store's epoch, else (epoch, 1).
// A slot whose generation would pass kMaxGeneration within one epoch is retired for the rest of the store's
// life, so a store never issues the same tag for a slot twice. Tags are never 0 (epoch and generation start
// at 1), so key 0 is never issued.
using Key = uint64_t;
using Slot = uint32_t;
using Tag = uint32_t;

inline constexpr int kShardBits = 8;
inline constexpr int kSlotBits = 28;
inline constexpr int kTagBits = 28;
inline constexpr int kGenerationBits = 16;
inline constexpr int kEpochBits = kTagBits - kGenerationBits;  // 12
inline constexpr uint32_t kMaxShards = 1u << kShardBits;
inline constexpr uint64_t kMaxSlotsPerShard = (uint64_t{1} << kSlotBits) - 1;
inline constexpr uint32_t kMaxGeneration = (1u << kGenerationBits) - 1;  // 65535
inline constexpr uint32_t kMaxEpoch = (1u << kEpochBits) - 1;            // 4095

inline constexpr Tag MakeTag(uint32_t epoch, uint32_t generation) { return (epoch << kGenerationBits) | generation; }
inline constexpr uint32_t TagEpoch(Tag tag) { return tag >> kGenerationBits; }
inline constexpr uint32_t TagGeneration(Tag tag) { return tag & kMaxGeneration; }
inline constexpr bool ValidTag(Tag tag) {
  return TagEpoch(tag) >= 1 && TagEpoch(tag) <= kMaxEpoch && TagGeneration(tag) >= 1;
}
// The epoch a store restored from a snapshot saved under `epoch` uses by default: the next one, cyclically.
inline constexpr uint32_t NextEpoch(uint32_t epoch) { return epoch % kMaxEpoch + 1; }

struct KeyParts {
  uint32_t shard;
  Slot slot;
  Tag tag;
};

inline constexpr Key MakeKey(uint32_t shard, Slot slot, Tag tag) {
  return (static_cast<uint64_t>(tag) << (kShardBits + kSlotBits)) | (static_cast<uint64_t>(slot) << kShardBits) |
         static_cast<uint64_t>(shard);
}

inline constexpr KeyParts SplitKey(Key key) {
  return KeyParts{static_cast<uint32_t>(key & (kMaxShards - 1)),
                  static_cast<Slot>((key >> kShardBits) & kMaxSlotsPerShard),
                  static_cast<Tag>(key >> (kShardBits + kSlotBits))};
}

// The largest sampling mass (priority^alpha) the store accepts. A store holds at most
// kMaxShards * kMaxSlotsPerShard (~6.9e10) items, so no sum of masses can exceed ~6.9e260: totals, draw
// points and probabilities stay finite with a wide margin below DBL_MAX (~1.8e308).
inline constexpr double kMaxMass = 1e250;
// The most items one Insert or Sample call takes (a larger request is refused, naming both numbers).
inline constexpr uint64_t kMaxBatchItems = uint64_t{1} << 24;
// Chunks (shard.h): blobs an insert batch carries beside its items, each referenced by one or more items and
// kept while any of them lives; later inserts may reference a stored chunk by its chunk key (a Key of the same
// layout: shard, chunk id in the slot bits, tag). An item references at most kMaxChunksPerItem chunks: a
// sequence of 4096 chunks of 1 step each, far above any message the server takes (the message size cap bounds
// the references before this does).
inline constexpr uint32_t kMaxChunksPerItem = 4096;
// The most chunks one shard holds at a time (chunk ids are 32-bit; this keeps a margin below 2^32).
inline constexpr uint64_t kMaxChunksPerShard = uint64_t{1} << 28;

// The sampling mass of a priority: priority^alpha (alpha = 0 gives every item mass 1, i.e. uniform sampling,
// zero priorities included). The one place this is computed, so stored leaves and checks always agree.
inline double PriorityMass(double priority, double alpha) {
  if (alpha == 1.0) return priority;
  if (alpha == 0.0) return 1.0;
  return std::pow(priority, alpha);
}

}  // namespace apexrl

#endif  // APEXRL_COMMON_H_
