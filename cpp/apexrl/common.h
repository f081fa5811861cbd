// Shared vocabulary of the apexrl core: keys, slots and the layout that ties them together.
#ifndef APEXRL_COMMON_H_
#define APEXRL_COMMON_H_

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace apexrl {

// A key is a 64-bit handle the store issues for one inserted item. It locates the item without a hash map:
//
//   bits 63..40  generation (24 bits)  -- bumped each time the slot is freed, so a key of an evicted or
//                                         erased item never matches the slot's next occupant
//   bits 39..8   slot (32 bits)        -- index into the shard's arrays
//   bits  7..0   shard (8 bits)
//
// A slot whose generation would reach kGenerationLimit is retired (never reused), so generations never wrap
// and a stale key can never address a newer item. Generations start at 1, so key 0 is never issued.
using Key = uint64_t;
using Slot = uint32_t;

inline constexpr int kShardBits = 8;
inline constexpr int kSlotBits = 32;
inline constexpr int kGenerationBits = 24;
inline constexpr uint32_t kMaxShards = 1u << kShardBits;
inline constexpr uint32_t kGenerationLimit = 1u << kGenerationBits;
inline constexpr uint64_t kMaxSlotsPerShard = (uint64_t{1} << kSlotBits) - 1;

struct KeyParts {
  uint32_t shard;
  Slot slot;
  uint32_t generation;
};

inline constexpr Key MakeKey(uint32_t shard, Slot slot, uint32_t generation) {
  return (static_cast<uint64_t>(generation) << (kShardBits + kSlotBits)) |
         (static_cast<uint64_t>(slot) << kShardBits) | static_cast<uint64_t>(shard);
}

inline constexpr KeyParts SplitKey(Key key) {
  return KeyParts{static_cast<uint32_t>(key & (kMaxShards - 1)),
                  static_cast<Slot>((key >> kShardBits) & 0xFFFFFFFFu),
                  static_cast<uint32_t>(key >> (kShardBits + kSlotBits))};
}

// The sampling mass of a priority: priority^alpha (alpha = 0 gives every item mass 1, i.e. uniform sampling,
// zero priorities included). The one place this is computed, so stored leaves and checks always agree.
inline double PriorityMass(double priority, double alpha) {
  if (alpha == 1.0) return priority;
  if (alpha == 0.0) return 1.0;
  return std::pow(priority, alpha);
}

}  // namespace apexrl

#endif  // APEXRL_COMMON_H_
