// CRC-32C (Castagnoli), the checksum of snapshot files and table logs. On x86-64 CPUs with SSE4.2 (checked at run
// time) the crc32 instruction (several GB/s: a disk table checksums every item it logs on the serving thread);
// elsewhere portable slicing-by-8 (~1-2 GB/s). Both give the same values.
#ifndef APEXRL_CRC32C_H_
#define APEXRL_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace apexrl {

// Extends `crc` (0 for a fresh checksum) with `n` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
// The portable computation alone (tests compare the two).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace apexrl

#endif  // APEXRL_CRC32C_H_
