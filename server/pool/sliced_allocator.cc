#include "server/pool/sliced_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace offloadd::pool {

const char* PlacementOutcomeName(PlacementOutcome outcome) {
  switch (outcome) {
    case PlacementOutcome::kLocal: return "local";
    case PlacementOutcome::kUnbound: return "unbound";
    case PlacementOutcome::kSliceFull: return "slice_full";
    case PlacementOutcome::kUnknownNode: return "unknown_node";
    case PlacementOutcome::kNoSlice: return "no_slice";
  }
  return "?";
}

SlicedExtentAllocator::SlicedExtentAllocator(std::vector<ArenaSlice> slices)
    : slices_(std::move(slices)) {
  for (const ArenaSlice& s : slices_) allocators_.emplace_back(s.size_bytes);
}

size_t SlicedExtentAllocator::SliceOf(uint64_t offset) const {
  for (size_t i = 0; i < slices_.size(); ++i) {
    if (offset < slices_[i].offset_bytes + slices_[i].size_bytes) return i;
  }
  return slices_.size();
}

int SlicedExtentAllocator::NodeOfOffset(uint64_t offset) const {
  const size_t i = SliceOf(offset);
  return i < slices_.size() ? slices_[i].numa_node : -1;
}

void SlicedExtentAllocator::Count(PlacementOutcome outcome, int numa_node, uint64_t bytes) {
  switch (outcome) {
    case PlacementOutcome::kLocal: ++counts_.local; return;
    case PlacementOutcome::kUnbound: ++counts_.unbound; return;
    case PlacementOutcome::kSliceFull: ++counts_.slice_full; break;
    case PlacementOutcome::kUnknownNode: ++counts_.unknown_node; break;
    case PlacementOutcome::kNoSlice: ++counts_.no_slice; break;
  }
  LOG_EVERY_N(WARNING, 256) << "pool placement: a block of " << bytes << " bytes for NUMA node "
                            << numa_node << " went to another node's slice ("
                            << PlacementOutcomeName(outcome) << "; " << counts_.fallbacks()
                            << " fallbacks so far, logged every 256th)";
}

absl::StatusOr<Placement> SlicedExtentAllocator::Allocate(uint64_t bytes, int numa_node) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes");
  const bool unbound = slices_.size() == 1 && slices_[0].numa_node < 0;
  size_t want = slices_.size();
  PlacementOutcome outcome = PlacementOutcome::kUnbound;
  if (!unbound) {
    for (size_t i = 0; i < slices_.size(); ++i) {
      if (numa_node >= 0 && slices_[i].numa_node == numa_node) want = i;
    }
    outcome = numa_node < 0               ? PlacementOutcome::kUnknownNode
              : want == slices_.size()    ? PlacementOutcome::kNoSlice
              : allocators_[want].CanAllocate(bytes) ? PlacementOutcome::kLocal
                                                      : PlacementOutcome::kSliceFull;
  }
  size_t pick = unbound ? 0 : want;
  if (outcome != PlacementOutcome::kLocal && !unbound) {
    pick = slices_.size();
    uint64_t most_free = 0;
    for (size_t i = 0; i < slices_.size(); ++i) {
      const AllocatorStats s = allocators_[i].stats();
      const uint64_t free_bytes = s.capacity_bytes - s.used_bytes;
      if (allocators_[i].CanAllocate(bytes) && (pick == slices_.size() || free_bytes > most_free)) {
        pick = i;
        most_free = free_bytes;
      }
    }
  }
  if (pick == slices_.size()) {
    uint64_t largest_slice = 0;
    for (const ArenaSlice& s : slices_) largest_slice = std::max(largest_slice, s.size_bytes);
    if (ExtentAllocator::RoundUp(bytes) > largest_slice) {
      return absl::OutOfRangeError(absl::StrCat(
          "a block of ", bytes, " bytes is larger than every NUMA slice of the pool (the largest "
          "has ", largest_slice, " bytes); a block must fit in one node's slice"));
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("no NUMA slice of the pool has a free extent of ", bytes, " bytes now"));
  }
  absl::StatusOr<Extent> e = allocators_[pick].Allocate(bytes);
  if (!e.ok()) return e.status();
  Count(outcome, numa_node, bytes);
  peak_used_ = std::max(peak_used_, stats().used_bytes);
  Placement p;
  p.extent = {e->offset + slices_[pick].offset_bytes, e->bytes};
  p.numa_node = slices_[pick].numa_node;
  p.outcome = outcome;
  return p;
}

std::vector<std::pair<size_t, Extent>> SlicedExtentAllocator::Split(const Extent& extent) const {
  std::vector<std::pair<size_t, Extent>> pieces;
  uint64_t at = extent.offset;
  const uint64_t end = extent.offset + extent.bytes;
  while (at < end) {
    const size_t i = SliceOf(at);
    if (i == slices_.size()) {  // past the pool: let the last slice's allocator say so
      pieces.push_back({slices_.size() - 1,
                        {at - slices_.back().offset_bytes, end - at}});
      break;
    }
    const uint64_t slice_end = slices_[i].offset_bytes + slices_[i].size_bytes;
    const uint64_t piece_end = std::min(end, slice_end);
    pieces.push_back({i, {at - slices_[i].offset_bytes, piece_end - at}});
    at = piece_end;
  }
  return pieces;
}

absl::Status SlicedExtentAllocator::AllocateAt(const Extent& extent) {
  if (extent.bytes == 0) return absl::InvalidArgumentError("cannot allocate an empty extent");
  const auto pieces = Split(extent);
  for (size_t k = 0; k < pieces.size(); ++k) {
    absl::Status st = allocators_[pieces[k].first].AllocateAt(pieces[k].second);
    if (!st.ok()) {
      for (size_t j = 0; j < k; ++j) (void)allocators_[pieces[j].first].Free(pieces[j].second);
      return st;
    }
  }
  peak_used_ = std::max(peak_used_, stats().used_bytes);
  return absl::OkStatus();
}

absl::Status SlicedExtentAllocator::Free(const Extent& extent) {
  if (extent.bytes == 0) return absl::InvalidArgumentError("cannot free an empty extent");
  const auto pieces = Split(extent);
  // Piece by piece; a piece that is not allocated as a whole undoes the pieces freed before it,
  // so a bad call changes nothing.
  for (size_t k = 0; k < pieces.size(); ++k) {
    absl::Status st = allocators_[pieces[k].first].Free(pieces[k].second);
    if (!st.ok()) {
      for (size_t j = 0; j < k; ++j) {
        (void)allocators_[pieces[j].first].AllocateAt(pieces[j].second);
      }
      return st;
    }
  }
  return absl::OkStatus();
}

bool SlicedExtentAllocator::CanAllocate(uint64_t bytes) const {
  return std::any_of(allocators_.begin(), allocators_.end(),
                     [&](const ExtentAllocator& a) { return a.CanAllocate(bytes); });
}

AllocatorStats SlicedExtentAllocator::stats() const {
  AllocatorStats total;
  for (size_t i = 0; i < allocators_.size(); ++i) {
    const AllocatorStats s = allocators_[i].stats();
    total.capacity_bytes += s.capacity_bytes;
    total.used_bytes += s.used_bytes;
    if (s.high_water_bytes > 0) {
      total.high_water_bytes =
          std::max(total.high_water_bytes, slices_[i].offset_bytes + s.high_water_bytes);
    }
    total.free_extents += s.free_extents;
    total.largest_free_bytes = std::max(total.largest_free_bytes, s.largest_free_bytes);
    total.allocated_extents += s.allocated_extents;
  }
  total.peak_used_bytes = peak_used_;
  return total;
}

}  // namespace offloadd::pool
