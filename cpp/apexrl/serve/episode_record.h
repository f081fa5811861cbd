// The INSERT item of a slices table (a table of episodes sampled as windows, slices/slice_table.h): one fixed
// binary record per episode that says how to read the request's step chunks, checked field by field before
// anything reads through it, without parsing JSON (docs/protocol.md, "Slices tables").
//
//   offset  size            field
//   0       4               magic b"APXE"
//   4       2               version (1)
//   6       2               flags: bit 0 = per-step priorities follow (every other bit 0)
//   8       4               C: chunks (1..2^24), the request's chunks 0..C-1, in step order
//   12      4               F: fields per chunk (1..65536)
//   16      8               fingerprint of the steps' structure (the chunks' own)
//   24      8 C             steps in each chunk (each >= 1, the sum N below 2^24)
//   24+8C   24 C F          per chunk, per field (in path order): offset in the chunk, stored bytes, codec (0 raw,
//                           1 lz4) of its column, each inside its chunk
//   ...     8 N (flag 0)    f64 priority of each step (finite, >= 0)
//
// All little-endian; the record's size is exactly what C, F, its flags and N say.
#ifndef APEXRL_SERVE_EPISODE_RECORD_H_
#define APEXRL_SERVE_EPISODE_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace apexrl::serve {

inline constexpr char kEpisodeMagic[4] = {'A', 'P', 'X', 'E'};
inline constexpr uint16_t kEpisodeVersion = 1;
inline constexpr uint16_t kEpisodeStepPriorities = 1;
inline constexpr size_t kEpisodeHeader = 24;

// A checked record, its arrays copied out aligned.
struct EpisodeRecord {
  uint64_t fingerprint = 0;
  uint64_t num_fields = 0;
  uint64_t total_steps = 0;
  std::vector<uint64_t> steps;          // per chunk
  std::vector<uint64_t> columns;        // chunks x fields x (offset, stored, codec)
  std::vector<double> step_priorities;  // empty unless the flag is set
};

// Why `record` (size bytes) is not an episode record over chunks of `chunk_sizes` (the request's C chunks, which
// the record must describe: its C equals num_chunks), or nothing, with *out filled. Checks in wire order; reads
// no byte it has not bounded first.
std::optional<std::string> ParseEpisodeRecord(const uint8_t* record, uint64_t size, const uint64_t* chunk_sizes,
                                              uint64_t num_chunks, EpisodeRecord* out);

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_EPISODE_RECORD_H_
