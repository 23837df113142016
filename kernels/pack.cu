// Gather / scatter kernels (kernels.h). Grid: x = 64 KiB tiles of a segment, y = segments
// (grid-stride over y beyond 65,535 segments); 256 threads per block.
#include "kernels/kernels.h"

namespace offloadd::kernels {
namespace {

constexpr uint64_t kTileBytes = 64 << 10;
constexpr int kThreads = 256;

template <bool kGather>
__global__ void PackKernel(const PackSegment* segments, uint32_t count, uint8_t* staging) {
  for (uint32_t s = blockIdx.y; s < count; s += gridDim.y) {
    const PackSegment seg = segments[s];
    const uint64_t begin = static_cast<uint64_t>(blockIdx.x) * kTileBytes;
    if (begin >= seg.bytes) continue;
    const uint64_t end = begin + kTileBytes < seg.bytes ? begin + kTileBytes : seg.bytes;
    uint8_t* tensor = reinterpret_cast<uint8_t*>(seg.ptr);
    uint8_t* stage = staging + seg.staging_offset;
    const uint8_t* src = kGather ? tensor : stage;
    uint8_t* dst = kGather ? stage : tensor;
    const bool wide =
        ((reinterpret_cast<uint64_t>(src) | reinterpret_cast<uint64_t>(dst) | begin | end) & 15) ==
        0;
    if (wide) {
      const uint4* s4 = reinterpret_cast<const uint4*>(src + begin);
      uint4* d4 = reinterpret_cast<uint4*>(dst + begin);
      const uint64_t n = (end - begin) / 16;
      for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) d4[i] = s4[i];
    } else {
      for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
    }
  }
}

template <bool kGather>
cudaError_t Launch(const PackSegment* segments, uint32_t count, uint64_t max_segment_bytes,
                   uint8_t* staging, cudaStream_t stream) {
  if (count == 0 || max_segment_bytes == 0) return cudaSuccess;
  if (segments == nullptr || staging == nullptr) return cudaErrorInvalidValue;
  const uint64_t tiles = (max_segment_bytes + kTileBytes - 1) / kTileBytes;
  if (tiles > 0x7fffffffull) return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>(tiles), count < 65535 ? count : 65535);
  PackKernel<kGather><<<grid, kThreads, 0, stream>>>(segments, count, staging);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGather(const PackSegment* segments, uint32_t count, uint64_t max_segment_bytes,
                         uint8_t* staging, cudaStream_t stream) {
  return Launch<true>(segments, count, max_segment_bytes, staging, stream);
}

cudaError_t LaunchScatter(const PackSegment* segments, uint32_t count, uint64_t max_segment_bytes,
                          const uint8_t* staging, cudaStream_t stream) {
  return Launch<false>(segments, count, max_segment_bytes, const_cast<uint8_t*>(staging), stream);
}

}  // namespace offloadd::kernels
