// CRC-32C (Castagnoli), the checksum of snapshot files. Portable slicing-by-8 (~1-2 GB/s), no intrinsics.
#ifndef APEXRL_CRC32C_H_
#define APEXRL_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace apexrl {

// Extends `crc` (0 for a fresh checksum) with `n` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

}  // namespace apexrl

#endif  // APEXRL_CRC32C_H_
