// Pack / unpack: gather many small device tensors into one staging buffer so they cross the link
// as one DMA (one offload request, one chunked copy) instead of one small copy each, and scatter
// them back after the reload. The device kernels are in pack.cu (pack.h); this is the CPU
// reference they are tested against, and the layout plan both use.
//
// Layout: segment k occupies staging[offset_k, offset_k + bytes_k); offsets come from PlanPack,
// in order, each rounded up to `alignment_bytes` (default 256, cudaMalloc's alignment, so the
// kernels can use 16-byte accesses when the tensors allow).
#ifndef OFFLOADD_KERNELS_PACK_REF_H_
#define OFFLOADD_KERNELS_PACK_REF_H_

#include <cstdint>
#include <vector>

namespace offloadd::kernels {

// One tensor in a pack: `ptr` is its address (device memory for the kernels, host memory for
// the references), `staging_offset` its place in the staging buffer, `bytes` its size.
struct PackSegment {
  uint64_t ptr = 0;
  uint64_t staging_offset = 0;
  uint64_t bytes = 0;
};

struct PackPlan {
  std::vector<uint64_t> offsets;  // one per size, in order
  uint64_t total_bytes = 0;       // staging size needed (end of the last segment)
};

// Offsets for tensors of `sizes` bytes packed in order; alignment_bytes must be a power of two
// (1 = dense). Sizes may be 0 (such a segment takes no room).
PackPlan PlanPack(const std::vector<uint64_t>& sizes, uint64_t alignment_bytes = 256);

// Builds the segment list for `ptrs` with the plan's offsets.
std::vector<PackSegment> MakeSegments(const std::vector<uint64_t>& ptrs,
                                      const std::vector<uint64_t>& sizes, const PackPlan& plan);

// staging[seg.staging_offset, +bytes) = *(seg.ptr)[0, bytes) for every segment.
void GatherRef(const PackSegment* segments, uint32_t count, uint8_t* staging);
// The reverse.
void ScatterRef(const PackSegment* segments, uint32_t count, const uint8_t* staging);

}  // namespace offloadd::kernels

#endif  // OFFLOADD_KERNELS_PACK_REF_H_
