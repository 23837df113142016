#include "server/projector/dtype.h"

#include <cmath>
#include <cstring>

namespace offloadd::projector {
namespace {

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FloatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Rounds `value >> shift` to nearest, ties to even (shift >= 1).
uint32_t ShiftRoundNearestEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (kept & 1u))) return kept + 1u;
  return kept;
}

}  // namespace

size_t ElementSizeBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
  }
  return "unknown";
}

uint16_t Float32ToBFloat16(float value) {
  const uint32_t bits = BitsOf(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: keep sign and the top payload bits, force the quiet bit so it cannot become inf.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest-even; a carry out of the mantissa
  // correctly bumps the exponent (up to inf for values above bf16's largest finite).
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float BFloat16ToFloat32(uint16_t bits) { return FloatOf(static_cast<uint32_t>(bits) << 16); }

uint16_t Float32ToFloat16(float value) {
  const uint32_t bits = BitsOf(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {
    if (magnitude == 0x7F800000u) return sign | 0x7C00u;                           // inf
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x03FFu));  // quiet NaN
  }
  const int exponent = static_cast<int>(magnitude >> 23) - 127;  // unbiased
  if (exponent > 15) return sign | 0x7C00u;                      // >= 65536: overflow to inf
  const uint32_t mantissa = magnitude & 0x007FFFFFu;
  if (exponent >= -14) {
    // Normal binary16: rebias the exponent, round 23 mantissa bits to 10. A carry propagates
    // into the exponent, so 65520 and above round to inf as IEEE requires.
    const uint32_t wide = (static_cast<uint32_t>(exponent + 15) << 23) | mantissa;
    return static_cast<uint16_t>(sign | ShiftRoundNearestEven(wide, 13));
  }
  if (exponent < -25) return sign;  // below half the smallest subnormal (2^-25): signed zero
  // Subnormal binary16 counts units of 2^-24; value = significand * 2^(exponent - 23).
  const uint32_t significand = mantissa | 0x00800000u;
  const int shift = -(exponent + 1);  // 14..24
  return static_cast<uint16_t>(sign | ShiftRoundNearestEven(significand, shift));
}

float Float16ToFloat32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x03FFu;
  if (exponent == 0x1Fu) return FloatOf(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return FloatOf(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

void ConvertToFloat32(const void* src, DType dtype, size_t count, float* dst) {
  const auto* bytes = static_cast<const unsigned char*>(src);
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBFloat16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = BFloat16ToFloat32(h);
      }
      return;
    case DType::kFloat16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = Float16ToFloat32(h);
      }
      return;
  }
}

void ConvertFromFloat32(const float* src, size_t count, DType dtype, void* dst) {
  auto* bytes = static_cast<unsigned char*>(dst);
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBFloat16:
      for (size_t i = 0; i < count; ++i) {
        const uint16_t h = Float32ToBFloat16(src[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
    case DType::kFloat16:
      for (size_t i = 0; i < count; ++i) {
        const uint16_t h = Float32ToFloat16(src[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
  }
}

}  // namespace offloadd::projector
