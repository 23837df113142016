#include "server/base/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace offloadd::base {
namespace {

constexpr uint32_t kPoly = 0x82F63B78;  // reflected Castagnoli

// Slice-by-8 tables: t[0] is the byte table, t[k][b] the CRC of byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
};
const Tables& T() {
  static const Tables tables;
  return tables;
}

// `raw` is the register value (not finalized) throughout.
uint32_t RawPortable(uint32_t raw, const uint8_t* p, size_t n) {
  const auto& t = T().t;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n) {
    raw = (raw >> 8) ^ t[0][(raw ^ *p++) & 0xff];
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= raw;
    raw = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^
          t[4][(w >> 24) & 0xff] ^ t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^
          t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
  }
  for (; n > 0; --n) raw = (raw >> 8) ^ t[0][(raw ^ *p++) & 0xff];
  return raw;
}

// GF(2) 32x32 matrix (column n = image of bit n) times a vector.
uint32_t Times(const uint32_t* m, uint32_t v) {
  uint32_t sum = 0;
  for (; v != 0; v >>= 1, ++m) {
    if (v & 1) sum ^= *m;
  }
  return sum;
}
void Square(uint32_t* out, const uint32_t* m) {
  for (int n = 0; n < 32; ++n) out[n] = Times(m, m[n]);
}

#if defined(__x86_64__)
constexpr size_t kStreamBytes = 8192;  // per stream of the 3-way loop

// The operator "append kStreamBytes zero bytes" on a finalized CRC (its matrix columns).
struct Shift {
  uint32_t m[32];
  Shift() {
    for (int n = 0; n < 32; ++n) m[n] = Crc32cCombine(1u << n, 0, kStreamBytes);
  }
};
const Shift& StreamShift() {
  static const Shift shift;
  return shift;
}

__attribute__((target("sse4.2"))) uint32_t RawOneStream(uint32_t raw, const uint8_t* p,
                                                         size_t n) {
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n) raw = _mm_crc32_u8(raw, *p++);
  uint64_t r = raw;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    r = _mm_crc32_u64(r, w);
  }
  raw = static_cast<uint32_t>(r);
  for (; n > 0; --n) raw = _mm_crc32_u8(raw, *p++);
  return raw;
}

// Three streams of kStreamBytes at a time, joined with StreamShift; the rest in one stream.
__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                           size_t n) {
  const Shift& shift = StreamShift();
  while (n >= 3 * kStreamBytes) {
    uint64_t a = ~crc, b = 0xFFFFFFFFu, c = 0xFFFFFFFFu;
    const uint8_t* pb = p + kStreamBytes;
    const uint8_t* pc = p + 2 * kStreamBytes;
    for (size_t i = 0; i < kStreamBytes; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, pb + i, 8);
      std::memcpy(&wc, pc + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      c = _mm_crc32_u64(c, wc);
    }
    const uint32_t fa = ~static_cast<uint32_t>(a), fb = ~static_cast<uint32_t>(b),
                   fc = ~static_cast<uint32_t>(c);
    crc = Times(shift.m, Times(shift.m, fa) ^ fb) ^ fc;
    p += 3 * kStreamBytes;
    n -= 3 * kStreamBytes;
  }
  return ~RawOneStream(~crc, p, n);
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t bytes) {
  return ~RawPortable(~crc, static_cast<const uint8_t*>(data), bytes);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t bytes) {
#if defined(__x86_64__)
  if (HasSse42()) return ExtendHardware(crc, static_cast<const uint8_t*>(data), bytes);
#endif
  return Crc32cExtendPortable(crc, data, bytes);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b) {
  if (bytes_b == 0) return crc_a;
  uint32_t even[32], odd[32];
  odd[0] = kPoly;  // the operator for one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  Square(even, odd);  // two zero bits
  Square(odd, even);  // four
  // Apply 8 * bytes_b zero bits to crc_a: squarings give one byte, two, four, ...
  do {
    Square(even, odd);
    if (bytes_b & 1) crc_a = Times(even, crc_a);
    bytes_b >>= 1;
    if (bytes_b == 0) break;
    Square(odd, even);
    if (bytes_b & 1) crc_a = Times(odd, crc_a);
    bytes_b >>= 1;
  } while (bytes_b != 0);
  return crc_a ^ crc_b;
}

bool Crc32cHardware() {
#if defined(__x86_64__)
  return HasSse42();
#else
  return false;
#endif
}

}  // namespace offloadd::base
