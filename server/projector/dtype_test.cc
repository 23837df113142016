#include "server/projector/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace offloadd::projector {
namespace {

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

float FromBits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(ElementSizeBytes(DType::kFloat32), 4u);
  EXPECT_EQ(ElementSizeBytes(DType::kBFloat16), 2u);
  EXPECT_EQ(ElementSizeBytes(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bf16");
}

TEST(DTypeTest, BFloat16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = BFloat16ToFloat32(static_cast<uint16_t>(h));
    EXPECT_EQ(Bits(f), h << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BFloat16ToFloat32(Float32ToBFloat16(f)))) << h;
    } else {
      EXPECT_EQ(Float32ToBFloat16(f), h) << h;
    }
  }
}

TEST(DTypeTest, BFloat16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7: ties go to the even mantissa.
  EXPECT_EQ(Float32ToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(Float32ToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  // Just above the tie rounds up.
  EXPECT_EQ(Float32ToBFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(Float32ToBFloat16(-1.0f), 0xBF80);
  // FLT_MAX is beyond the largest bf16 plus half an ulp: overflow to +inf.
  EXPECT_EQ(Float32ToBFloat16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(Float32ToBFloat16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat32(Float32ToBFloat16(std::nanf("")))));
  // A NaN whose payload sits only in the dropped bits must not become inf.
  EXPECT_TRUE(std::isnan(BFloat16ToFloat32(Float32ToBFloat16(FromBits(0x7F800001u)))));
}

TEST(DTypeTest, BFloat16IsNearestForRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    const float x = FromBits(any(rng));
    if (!std::isfinite(x) || std::fabs(x) > 3.0e38f) continue;
    const uint16_t h = Float32ToBFloat16(x);
    const double got = BFloat16ToFloat32(h);
    // The neighbours one bf16 ulp either side of the result are no closer.
    for (int step : {-1, 1}) {
      const uint16_t other = static_cast<uint16_t>(h + step);
      const double alt = BFloat16ToFloat32(other);
      if (std::isnan(alt) || std::isinf(alt) || (other & 0x7FFF) == 0x7FFF) continue;
      ASSERT_LE(std::fabs(got - x), std::fabs(alt - x)) << "x=" << x;
    }
  }
}

TEST(DTypeTest, Float16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Float16ToFloat32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(h & 0x7C00u, 0x7C00u) << h;
      EXPECT_TRUE(std::isnan(Float16ToFloat32(Float32ToFloat16(f)))) << h;
    } else {
      EXPECT_EQ(Float32ToFloat16(f), h) << h;
    }
  }
  EXPECT_EQ(Float16ToFloat32(0x3C00), 1.0f);
  EXPECT_EQ(Float16ToFloat32(0x7BFF), 65504.0f);
  EXPECT_EQ(Float16ToFloat32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(Float16ToFloat32(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(Float16ToFloat32(0x8000)));
}

TEST(DTypeTest, Float16EdgeCases) {
  EXPECT_EQ(Float32ToFloat16(65504.0f), 0x7BFF);
  EXPECT_EQ(Float32ToFloat16(65519.0f), 0x7BFF);  // below the overflow threshold
  EXPECT_EQ(Float32ToFloat16(65520.0f), 0x7C00);  // tie with "65536": rounds to inf
  EXPECT_EQ(Float32ToFloat16(1e30f), 0x7C00);
  EXPECT_EQ(Float32ToFloat16(-1e30f), 0xFC00);
  EXPECT_EQ(Float32ToFloat16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(Float32ToFloat16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(Float32ToFloat16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie to even 2
  EXPECT_EQ(Float32ToFloat16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  // Largest subnormal plus half a unit rounds up into the smallest normal (even).
  EXPECT_EQ(Float32ToFloat16(std::ldexp(1023.5f, -24)), 0x0400);
  EXPECT_EQ(Float32ToFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie to even
  EXPECT_EQ(Float32ToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie to even
  EXPECT_EQ(Float32ToFloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(Float32ToFloat16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(Float16ToFloat32(Float32ToFloat16(std::nanf("")))));
}

#if defined(__FLT16_MAX__)
// The compiler's _Float16 conversion is IEEE round-to-nearest-even: use it as an oracle.
TEST(DTypeTest, Float16MatchesCompilerConversion) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any;
  // Random bit patterns concentrated on exponents that reach fp16 (normal, subnormal, overflow).
  std::uniform_int_distribution<uint32_t> exponent(127 - 30, 127 + 17);
  for (int i = 0; i < 500000; ++i) {
    uint32_t b = any(rng);
    if (i % 2 == 0) b = (b & 0x807FFFFFu) | (exponent(rng) << 23);
    const volatile float x = FromBits(b);
    if (std::isnan(x)) continue;
    const _Float16 h = static_cast<_Float16>(x);
    uint16_t expected;
    std::memcpy(&expected, &h, 2);
    ASSERT_EQ(Float32ToFloat16(x), expected) << "bits=" << std::hex << b;
  }
}
#endif

TEST(DTypeTest, BufferConversionsUseTheScalarRules) {
  const std::vector<float> values = {0.0f, -1.5f, 3.14159f, 1e-6f, 70000.0f, 1e30f};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    std::vector<unsigned char> bytes(values.size() * ElementSizeBytes(dtype) + 1);
    // Odd offset: the buffer functions must not assume alignment.
    ConvertFromFloat32(values.data(), values.size(), dtype, bytes.data() + 1);
    std::vector<float> back(values.size());
    ConvertToFloat32(bytes.data() + 1, dtype, values.size(), back.data());
    for (size_t i = 0; i < values.size(); ++i) {
      float expected = values[i];
      if (dtype == DType::kBFloat16) expected = BFloat16ToFloat32(Float32ToBFloat16(values[i]));
      if (dtype == DType::kFloat16) expected = Float16ToFloat32(Float32ToFloat16(values[i]));
      EXPECT_EQ(Bits(back[i]), Bits(expected)) << DTypeName(dtype) << " " << i;
    }
  }
  // Spot values: bf16 keeps 1e30 approximately; fp16 overflows 70000 to inf.
  EXPECT_NEAR(BFloat16ToFloat32(Float32ToBFloat16(1e30f)), 1e30f, 1e30f * 0.004f);
  EXPECT_TRUE(std::isinf(Float16ToFloat32(Float32ToFloat16(70000.0f))));
}

}  // namespace
}  // namespace offloadd::projector
