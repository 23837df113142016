// Element types of gradients and projectors, and the scalar conversions the projector refresh
// uses: every refresh computes in fp32 whatever the input type, and writes the projector back in
// the input type.
//
// Rounding: fp32 -> bf16 and fp32 -> fp16 round to nearest, ties to even (IEEE 754 default
// rounding, the same rounding torch's `.to(torch.bfloat16)` / `.to(torch.float16)` apply).
// Overflow rounds to +/-inf, NaN stays NaN (quiet), fp16 subnormals are produced and read.
// bf16 -> fp32 and fp16 -> fp32 are exact.
#ifndef OFFLOADD_SERVER_PROJECTOR_DTYPE_H_
#define OFFLOADD_SERVER_PROJECTOR_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace offloadd::projector {

enum class DType { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Bytes per element: 4 for fp32, 2 for bf16/fp16.
size_t ElementSizeBytes(DType dtype);

// "fp32", "bf16" or "fp16".
absl::string_view DTypeName(DType dtype);

// Scalar conversions. Bit patterns are the IEEE binary16 / bfloat16 layouts.
uint16_t Float32ToBFloat16(float value);
float BFloat16ToFloat32(uint16_t bits);
uint16_t Float32ToFloat16(float value);
float Float16ToFloat32(uint16_t bits);

// Converts `count` elements of `dtype` at `src` (no alignment required) to fp32 in `dst`.
void ConvertToFloat32(const void* src, DType dtype, size_t count, float* dst);

// Converts `count` fp32 values to `dtype`, writing count * ElementSizeBytes(dtype) bytes at `dst`.
void ConvertFromFloat32(const float* src, size_t count, DType dtype, void* dst);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_DTYPE_H_
