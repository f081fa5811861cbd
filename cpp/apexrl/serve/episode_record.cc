#include "apexrl/serve/episode_record.h"

#include <cmath>
#include <cstring>

#include "apexrl/serve/wire.h"
#include "apexrl/slices/slice_table.h"

namespace apexrl::serve {

namespace {

std::string Str(uint64_t v) { return std::to_string(v); }

}  // namespace

std::optional<std::string> ParseEpisodeRecord(const uint8_t* record, uint64_t size, const uint64_t* chunk_sizes,
                                              uint64_t num_chunks, EpisodeRecord* out) {
  if (size < kEpisodeHeader) {
    return "the episode record is " + Str(size) + " bytes, shorter than its " + Str(kEpisodeHeader) + "-byte header";
  }
  if (std::memcmp(record, kEpisodeMagic, 4) != 0) {
    return "the episode record's magic is " + HexBytes(record, 4) + ", expected 41505845 (b'APXE')";
  }
  uint16_t version, flags;
  uint32_t c, f;
  std::memcpy(&version, record + 4, 2);
  std::memcpy(&flags, record + 6, 2);
  std::memcpy(&c, record + 8, 4);
  std::memcpy(&f, record + 12, 4);
  if (version != kEpisodeVersion) {
    return "the episode record's version is " + Str(version) + "; this server reads version " + Str(kEpisodeVersion);
  }
  if ((flags & ~kEpisodeStepPriorities) != 0) {
    return "the episode record's flags are " + Str(flags) + ", only bit 0 (per-step priorities) is defined";
  }
  if (c != num_chunks) {
    return "the episode record describes " + Str(c) + " chunks, the request carries " + Str(num_chunks);
  }
  if (c < 1 || c > kMaxEpisodeSteps) return "an episode needs 1 to 2^24 - 1 chunks, the record says " + Str(c);
  if (f < 1 || f > (1u << 16)) return "an episode needs 1 to 65536 fields per chunk, the record says " + Str(f);
  // C < 2^24 and F <= 2^16: the sizes below fit 64 bits.
  const uint64_t fixed = kEpisodeHeader + 8 * uint64_t{c} + 24 * uint64_t{c} * f;
  if (size < fixed) {
    return "the episode record is " + Str(size) + " bytes, too short for its " + Str(c) + " chunks of " + Str(f) +
           " fields (" + Str(fixed) + " bytes)";
  }
  std::memcpy(&out->fingerprint, record + 16, 8);
  out->num_fields = f;
  out->steps.resize(c);
  std::memcpy(out->steps.data(), record + kEpisodeHeader, 8 * uint64_t{c});
  uint64_t n = 0;
  for (uint64_t k = 0; k < c; ++k) {
    if (out->steps[k] < 1 || out->steps[k] > kMaxEpisodeSteps) {
      return "chunk " + Str(k) + " of the episode record holds " + Str(out->steps[k]) + " steps, must be 1 to 2^24 - 1";
    }
    n += out->steps[k];  // at most 2^24 terms below 2^24: no overflow
  }
  if (n > kMaxEpisodeSteps) return "an episode holds below 2^24 steps, the record says " + Str(n);
  out->total_steps = n;
  out->columns.resize(3 * uint64_t{c} * f);
  std::memcpy(out->columns.data(), record + kEpisodeHeader + 8 * uint64_t{c}, 24 * uint64_t{c} * f);
  for (uint64_t k = 0; k < c; ++k) {
    for (uint64_t j = 0; j < f; ++j) {
      const uint64_t* col = out->columns.data() + 3 * (k * f + j);
      if (col[0] > chunk_sizes[k] || col[1] > chunk_sizes[k] - col[0] || col[2] > 1) {
        return "chunk " + Str(k) + ", field " + Str(j) + " of the episode record: column at " + Str(col[0]) + " of " +
               Str(col[1]) + " bytes, codec " + Str(col[2]) + ", in a chunk of " + Str(chunk_sizes[k]) +
               " bytes (a column lies inside its chunk; codec 0 raw or 1 lz4)";
      }
    }
  }
  const bool per_step = (flags & kEpisodeStepPriorities) != 0;
  const uint64_t want = fixed + (per_step ? 8 * n : 0);
  if (size != want) {
    return "the episode record is " + Str(size) + " bytes, its fields say " + Str(want) +
           (per_step ? " (with " + Str(n) + " step priorities)" : " (without step priorities)");
  }
  out->step_priorities.clear();
  if (per_step) {
    out->step_priorities.resize(n);
    std::memcpy(out->step_priorities.data(), record + fixed, 8 * n);
    for (uint64_t j = 0; j < n; ++j) {
      const double p = out->step_priorities[j];
      if (!(std::isfinite(p) && p >= 0.0)) {
        return "the episode record's step priority " + Str(j) + " is " + FormatDouble(p) + ", must be finite and >= 0";
      }
    }
  }
  return std::nullopt;
}

}  // namespace apexrl::serve
