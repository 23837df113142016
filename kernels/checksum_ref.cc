#include "kernels/checksum_ref.h"

#include <cstring>

namespace offloadd::kernels {

uint64_t ChecksumRef(const void* data, uint64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t sum = Mix64(bytes);
  const uint64_t words = (bytes + 7) / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = 0;
    const uint64_t n = bytes - i * 8 < 8 ? bytes - i * 8 : 8;
    for (uint64_t b = 0; b < n; ++b) w |= static_cast<uint64_t>(p[i * 8 + b]) << (8 * b);
    sum += Mix64(w + i * kChecksumGolden);
  }
  return sum;
}

}  // namespace offloadd::kernels
