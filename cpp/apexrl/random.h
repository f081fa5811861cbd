// Small, fast, seedable generators. Randomness is always injected (a seed per store, a stream per call),
// never global, so sampling is reproducible from the seed.
#ifndef APEXRL_RANDOM_H_
#define APEXRL_RANDOM_H_

#include <cstdint>

namespace apexrl {

// SplitMix64 step: used to expand one 64-bit seed into well-mixed state words.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman & Vigna). Not thread-safe: one instance per thread or per call.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t sm = seed;
    for (auto& word : s_) word = SplitMix64(sm);
  }
  // Independent stream `stream` of generator `seed` (e.g. one per sample call).
  Rng(uint64_t seed, uint64_t stream) : Rng(seed ^ (0xD1B54A32D192ED03ull * (stream + 1))) {}

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform double in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n) for n > 0 (Lemire's multiply-shift; bias < n / 2^64).
  uint64_t Below(uint64_t n) {
    __extension__ typedef unsigned __int128 U128;  // GCC/Clang extension; __extension__ keeps -Wpedantic quiet
    return static_cast<uint64_t>((static_cast<U128>(Next()) * n) >> 64);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace apexrl

#endif  // APEXRL_RANDOM_H_
