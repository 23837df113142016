// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78; the checksum of iSCSI, RFC 3720
// appendix B.4, ext4 metadata and many storage systems), for the spill tier's files and the
// optional checksums of the shared pool's blocks.
//
// Values are the finalized CRC (initial value and final XOR 0xFFFFFFFF), so
// Crc32c("123456789") == 0xE3069283 (the RFC's check value) and
// Crc32cExtend(Crc32c(a), b) == Crc32c(a || b).
//
// Speed: x86-64 CPUs with SSE4.2 use its CRC32 instruction on three interleaved streams
// (8 KiB each, joined with a precomputed shift: the instruction's 3-cycle latency and 1-cycle
// throughput); elsewhere a slice-by-8 table loop. Crc32cCombine is the GF(2) matrix method
// zlib's crc32_combine uses (Mark Adler), here for this polynomial. Debian 12 packages no
// CRC32C library (Abseil's absl/crc came after its 20220623 release), hence this file.
//
// Thread-safe; no allocation.
#ifndef OFFLOADD_SERVER_BASE_CRC32C_H_
#define OFFLOADD_SERVER_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace offloadd::base {

// The CRC32C of `crc`'s data followed by [data, data + bytes).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t bytes);

// The CRC32C of [data, data + bytes).
inline uint32_t Crc32c(const void* data, size_t bytes) { return Crc32cExtend(0, data, bytes); }

// Crc32c(a || b) from crc_a = Crc32c(a), crc_b = Crc32c(b) and b's length in bytes; O(log) in
// bytes_b (pieces checksummed in parallel, joined in order).
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);

// True when the hardware path is in use (SSE4.2 on this CPU).
bool Crc32cHardware();

// The portable path alone (tests compare the two).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t bytes);

}  // namespace offloadd::base

#endif  // OFFLOADD_SERVER_BASE_CRC32C_H_
