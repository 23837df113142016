#include "kernels/pack_ref.h"

#include <cstring>

namespace offloadd::kernels {

PackPlan PlanPack(const std::vector<uint64_t>& sizes, uint64_t alignment_bytes) {
  if (alignment_bytes == 0) alignment_bytes = 1;
  PackPlan plan;
  uint64_t at = 0;
  for (uint64_t size : sizes) {
    at = (at + alignment_bytes - 1) & ~(alignment_bytes - 1);
    plan.offsets.push_back(at);
    at += size;
    plan.total_bytes = at;
  }
  return plan;
}

std::vector<PackSegment> MakeSegments(const std::vector<uint64_t>& ptrs,
                                      const std::vector<uint64_t>& sizes, const PackPlan& plan) {
  std::vector<PackSegment> segs;
  for (size_t i = 0; i < ptrs.size() && i < sizes.size() && i < plan.offsets.size(); ++i) {
    segs.push_back(PackSegment{ptrs[i], plan.offsets[i], sizes[i]});
  }
  return segs;
}

void GatherRef(const PackSegment* segments, uint32_t count, uint8_t* staging) {
  for (uint32_t i = 0; i < count; ++i) {
    const PackSegment& s = segments[i];
    if (s.bytes)
      std::memcpy(staging + s.staging_offset, reinterpret_cast<const void*>(s.ptr), s.bytes);
  }
}

void ScatterRef(const PackSegment* segments, uint32_t count, const uint8_t* staging) {
  for (uint32_t i = 0; i < count; ++i) {
    const PackSegment& s = segments[i];
    if (s.bytes) std::memcpy(reinterpret_cast<void*>(s.ptr), staging + s.staging_offset, s.bytes);
  }
}

}  // namespace offloadd::kernels
