// Integrity checksum of a byte range, computed the same way on the device (checksum.cu) and on
// the CPU (this reference): used to check that a tensor reloaded from the pool is bit-identical
// to the one offloaded (switchable per session by the client).
//
// Definition (any byte length, any alignment): split the bytes into 64-bit little-endian words
// w_0..w_{k-1}, the last zero-padded; then
//     checksum = mix(len) + sum_i mix(w_i + i * 0x9e3779b97f4a7c15)   (mod 2^64)
// where mix is the splitmix64 finaliser (Steele, Lea, Flood, "Fast splittable pseudorandom
// number generators", OOPSLA 2014; constants from its public reference code). A sum of mixed
// terms is order-independent to compute (so the device reduces with atomicAdd) but depends on
// each word's position through i, and any bit flip changes one mixed term. Not cryptographic.
#ifndef OFFLOADD_KERNELS_CHECKSUM_REF_H_
#define OFFLOADD_KERNELS_CHECKSUM_REF_H_

#include <cstdint>

namespace offloadd::kernels {

inline constexpr uint64_t kChecksumGolden = 0x9e3779b97f4a7c15ull;

// splitmix64's output function. Usable from host and device code.
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline uint64_t
    Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The checksum of host[0, bytes). `data` may be null when bytes == 0.
uint64_t ChecksumRef(const void* data, uint64_t bytes);

}  // namespace offloadd::kernels

#endif  // OFFLOADD_KERNELS_CHECKSUM_REF_H_
