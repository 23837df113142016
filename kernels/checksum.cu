// Checksum kernel (kernels.h; definition in checksum_ref.h). Each thread sums the mixed terms of
// a grid-stride set of 64-bit words, a warp reduces with shuffles, lane 0 adds to *result with
// one atomicAdd (unsigned 64-bit addition wraps mod 2^64, matching the reference).
#include "kernels/kernels.h"

namespace offloadd::kernels {
namespace {

constexpr int kThreads = 256;

__device__ uint64_t LoadWord(const uint8_t* p, uint64_t bytes, uint64_t i, bool aligned) {
  const uint64_t at = i * 8;
  if (aligned && at + 8 <= bytes) return reinterpret_cast<const uint64_t*>(p)[i];
  uint64_t w = 0;
  const uint64_t n = bytes - at < 8 ? bytes - at : 8;
  for (uint64_t b = 0; b < n; ++b) w |= static_cast<uint64_t>(p[at + b]) << (8 * b);
  return w;
}

__global__ void ChecksumKernel(const uint8_t* data, uint64_t bytes, unsigned long long* result) {
  const bool aligned = (reinterpret_cast<uint64_t>(data) & 7) == 0;
  const uint64_t words = (bytes + 7) / 8;
  uint64_t sum = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    sum += Mix64(LoadWord(data, bytes, i, aligned) + i * kChecksumGolden);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) sum += Mix64(bytes);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(result, static_cast<unsigned long long>(sum));
}

}  // namespace

cudaError_t LaunchChecksum(const void* data, uint64_t bytes, uint64_t* result,
                           cudaStream_t stream) {
  if (result == nullptr || (data == nullptr && bytes != 0)) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(result, 0, sizeof(uint64_t), stream);
  if (e != cudaSuccess) return e;
  const uint64_t words = (bytes + 7) / 8;
  uint64_t blocks = (words + kThreads - 1) / kThreads;
  if (blocks > 1024) blocks = 1024;  // grid-stride beyond: enough to fill an H200 (132 SMs)
  if (blocks == 0) blocks = 1;
  ChecksumKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(data), bytes, reinterpret_cast<unsigned long long*>(result));
  return cudaGetLastError();
}

}  // namespace offloadd::kernels
