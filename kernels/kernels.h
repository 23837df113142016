// Device kernels of offloadd (built with nvcc into a static library by kernels/BUILD; the CPU
// references they must match are pack_ref.h and checksum_ref.h, tested in CI).
//
// All launches are asynchronous on `stream` and return the launch's cudaError_t (cudaSuccess,
// or e.g. cudaErrorInvalidValue for bad arguments); errors during execution surface at the next
// synchronisation, as usual in CUDA. Pointers are device pointers unless said otherwise.
#ifndef OFFLOADD_KERNELS_KERNELS_H_
#define OFFLOADD_KERNELS_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/checksum_ref.h"
#include "kernels/pack_ref.h"

namespace offloadd::kernels {

// Gather: staging[seg.staging_offset, +bytes) = seg.ptr[0, bytes) for each of `count` segments.
// `segments` is a device array (copy the host list with cudaMemcpyAsync first);
// `max_segment_bytes` bounds every seg.bytes (sizes the grid). Segments must not overlap in
// staging. Uses 16-byte accesses where pointers and sizes allow, bytes otherwise.
cudaError_t LaunchGather(const PackSegment* segments, uint32_t count, uint64_t max_segment_bytes,
                         uint8_t* staging, cudaStream_t stream);
// Scatter: the reverse (seg.ptr[0, bytes) = staging[seg.staging_offset, +bytes)).
cudaError_t LaunchScatter(const PackSegment* segments, uint32_t count, uint64_t max_segment_bytes,
                          const uint8_t* staging, cudaStream_t stream);

// *result = checksum of data[0, bytes) as defined in checksum_ref.h (a uint64 in device memory,
// overwritten). Any alignment; fastest when `data` is 8-byte aligned.
cudaError_t LaunchChecksum(const void* data, uint64_t bytes, uint64_t* result, cudaStream_t stream);

// One thread that busy-waits `nanoseconds` on the GPU's global timer (%globaltimer), holding
// `stream` for that long: a long producer kernel for ordering probes. Returns the launch's error.
cudaError_t LaunchSpin(uint64_t nanoseconds, cudaStream_t stream);

}  // namespace offloadd::kernels

#endif  // OFFLOADD_KERNELS_KERNELS_H_
