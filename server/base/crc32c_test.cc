#include "server/base/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace offloadd::base {
namespace {

TEST(Crc32cTest, CheckValuesOfRfc3720) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  // RFC 3720 B.4: 32 bytes of zeros, of ones, incrementing.
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, HardwareAndPortableAgreeOnEveryLengthAndAlignment) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(200000 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {0ul, 1ul, 7ul, 8ul, 63ul, 4096ul, 24575ul, 24576ul, 24577ul, 49152ul + 5,
                   200000ul}) {
    for (size_t off : {0ul, 1ul, 3ul, 8ul}) {
      EXPECT_EQ(Crc32cExtend(0x1234, buf.data() + off, n),
                Crc32cExtendPortable(0x1234, buf.data() + off, n))
          << n << " at +" << off;
    }
  }
}

TEST(Crc32cTest, ExtendAndCombineJoinPiecesInOrder) {
  std::mt19937_64 rng(9);
  std::vector<uint8_t> buf(100003);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  for (size_t cut : {0ul, 1ul, 4096ul, 65536ul, 100002ul, 100003ul}) {
    const uint32_t a = Crc32c(buf.data(), cut), b = Crc32c(buf.data() + cut, buf.size() - cut);
    EXPECT_EQ(Crc32cExtend(a, buf.data() + cut, buf.size() - cut), whole) << cut;
    EXPECT_EQ(Crc32cCombine(a, b, buf.size() - cut), whole) << cut;
  }
  std::vector<uint8_t> changed = buf;
  changed[5000] ^= 1;
  EXPECT_NE(Crc32c(changed.data(), changed.size()), whole);
}

}  // namespace
}  // namespace offloadd::base
