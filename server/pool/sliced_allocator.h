// SlicedExtentAllocator: the pool's extents carved per NUMA slice (arena.h ArenaSlice), so each
// GPU's offloads land in host memory on that GPU's node.
//
// Policy of Allocate(bytes, node):
//  - the slice bound to `node`, when it has a free extent large enough ("local");
//  - otherwise any slice that has one, the one with the most free bytes first, and the reason is
//    counted and logged: the node's slice is full ("slice_full"), the GPU's node is unknown (-1
//    in sysfs: "unknown_node"), or no slice is bound to that node ("no_slice");
//  - an unsliced pool (one slice, node -1) places everything there without a fallback
//    ("unbound").
// Reloads need nothing from here: a block is read wherever its extent is (NodeOfOffset says
// which node that is). Extents never straddle two slices when made by Allocate; AllocateAt
// (adoption of a previous daemon's blocks, whose pool may have been sliced differently) accepts
// one that does, holding its pieces in each slice until Free.
//
// Offsets are from the arena base, as ExtentAllocator's; sizes are rounded as there (256 B).
// Not thread-safe: the caller (store/) serialises calls, as for ExtentAllocator.
#ifndef OFFLOADD_SERVER_POOL_SLICED_ALLOCATOR_H_
#define OFFLOADD_SERVER_POOL_SLICED_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/pool/arena.h"
#include "server/pool/extent_allocator.h"

namespace offloadd::pool {

enum class PlacementOutcome { kLocal, kUnbound, kSliceFull, kUnknownNode, kNoSlice };
// "local", "unbound", "slice_full", "unknown_node", "no_slice" (metric label values).
const char* PlacementOutcomeName(PlacementOutcome outcome);

struct Placement {
  Extent extent;
  int numa_node = -1;  // node of the slice the extent is in; -1 for an unbound pool
  PlacementOutcome outcome = PlacementOutcome::kUnbound;
};

// Allocations per outcome since construction (AllocateAt not counted).
struct PlacementCounts {
  uint64_t local = 0, unbound = 0, slice_full = 0, unknown_node = 0, no_slice = 0;
  uint64_t fallbacks() const { return slice_full + unknown_node + no_slice; }
};

class SlicedExtentAllocator {
 public:
  // `slices` as Arena::slices(): in offset order, covering the pool, non-empty.
  explicit SlicedExtentAllocator(std::vector<ArenaSlice> slices);

  // Errors as ExtentAllocator::Allocate, with OUT_OF_RANGE when `bytes` exceed every slice (a
  // block must fit in one node's slice) and RESOURCE_EXHAUSTED when no slice has room now.
  absl::StatusOr<Placement> Allocate(uint64_t bytes, int numa_node);
  // As ExtentAllocator::AllocateAt, over slice boundaries if need be; unchanged on error.
  absl::Status AllocateAt(const Extent& extent);
  // As ExtentAllocator::Free (an extent exactly as Allocate or AllocateAt took it).
  absl::Status Free(const Extent& extent);

  // Would Allocate(bytes, any node) succeed now?
  bool CanAllocate(uint64_t bytes) const;
  // Node of the slice holding `offset`; -1 when unbound or past the end.
  int NodeOfOffset(uint64_t offset) const;

  const std::vector<ArenaSlice>& slices() const { return slices_; }
  // Sums over the slices, except high_water_bytes (the highest end offset in the pool),
  // largest_free_bytes (the largest in any slice) and peak_used_bytes (the pool's own peak).
  AllocatorStats stats() const;
  AllocatorStats slice_stats(size_t slice) const { return allocators_[slice].stats(); }
  const PlacementCounts& placement_counts() const { return counts_; }

 private:
  // Pieces of [offset, offset + bytes) per slice: (slice index, slice-relative extent).
  std::vector<std::pair<size_t, Extent>> Split(const Extent& extent) const;
  size_t SliceOf(uint64_t offset) const;
  void Count(PlacementOutcome outcome, int numa_node, uint64_t bytes);

  std::vector<ArenaSlice> slices_;
  std::vector<ExtentAllocator> allocators_;
  PlacementCounts counts_;
  uint64_t peak_used_ = 0;
};

}  // namespace offloadd::pool

#endif  // OFFLOADD_SERVER_POOL_SLICED_ALLOCATOR_H_
