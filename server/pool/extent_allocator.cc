#include "server/pool/extent_allocator.h"

#include <algorithm>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace offloadd::pool {

ExtentAllocator::ExtentAllocator(uint64_t capacity_bytes)
    : capacity_(capacity_bytes / kGranuleBytes * kGranuleBytes) {
  if (capacity_ > 0) {
    free_by_offset_.emplace(0, capacity_);
    free_by_size_.emplace(capacity_, 0);
  }
}

absl::StatusOr<Extent> ExtentAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("cannot allocate an extent of 0 bytes");
  }
  // Compared before rounding (RoundUp of a value near UINT64_MAX wraps); capacity_ is a multiple
  // of kGranuleBytes, so bytes <= capacity_ implies RoundUp(bytes) <= capacity_.
  if (bytes > capacity_) {
    return absl::OutOfRangeError(absl::StrCat("extent of ", bytes,
                                              " bytes can never fit in a pool of ", capacity_,
                                              " bytes; raise the pool size or split the block"));
  }
  const uint64_t rounded = RoundUp(bytes);
  // Smallest free extent that fits; among equal sizes the lowest offset.
  auto it = free_by_size_.lower_bound({rounded, 0});
  if (it == free_by_size_.end()) {
    const uint64_t largest = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
    return absl::ResourceExhaustedError(
        absl::StrCat("no free extent of ", rounded, " bytes (", capacity_ - used_,
                     " bytes free in total, largest free extent ", largest,
                     " bytes); retry after blocks are reloaded or freed"));
  }
  const uint64_t free_bytes = it->first;
  const uint64_t offset = it->second;
  free_by_size_.erase(it);
  free_by_offset_.erase(offset);
  if (free_bytes > rounded) {
    // Carve from the low end so the remainder stays address-adjacent to what follows it.
    free_by_offset_.emplace(offset + rounded, free_bytes - rounded);
    free_by_size_.emplace(free_bytes - rounded, offset + rounded);
  }
  allocated_.emplace(offset, rounded);
  used_ += rounded;
  peak_used_ = std::max(peak_used_, used_);
  high_water_ = std::max(high_water_, offset + rounded);
  return Extent{offset, rounded};
}

absl::Status ExtentAllocator::AllocateAt(const Extent& extent) {
  if (extent.bytes == 0 || extent.offset % kGranuleBytes != 0 ||
      extent.bytes % kGranuleBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extent at offset ", extent.offset, " of ", extent.bytes, " bytes is not a non-empty "
        "multiple of ", kGranuleBytes, " bytes"));
  }
  if (extent.offset > capacity_ || extent.bytes > capacity_ - extent.offset) {
    return absl::OutOfRangeError(absl::StrCat("extent at offset ", extent.offset, " of ",
                                              extent.bytes, " bytes ends past the pool of ",
                                              capacity_, " bytes"));
  }
  // The free extent containing it: the last one starting at or before its offset.
  auto it = free_by_offset_.upper_bound(extent.offset);
  if (it == free_by_offset_.begin() ||
      std::prev(it)->first + std::prev(it)->second < extent.offset + extent.bytes) {
    return absl::AlreadyExistsError(absl::StrCat("extent at offset ", extent.offset, " of ",
                                                 extent.bytes,
                                                 " bytes overlaps an allocated extent"));
  }
  --it;
  const uint64_t free_offset = it->first, free_bytes = it->second;
  free_by_offset_.erase(it);
  free_by_size_.erase({free_bytes, free_offset});
  if (extent.offset > free_offset) {
    free_by_offset_.emplace(free_offset, extent.offset - free_offset);
    free_by_size_.emplace(extent.offset - free_offset, free_offset);
  }
  const uint64_t end = extent.offset + extent.bytes, free_end = free_offset + free_bytes;
  if (free_end > end) {
    free_by_offset_.emplace(end, free_end - end);
    free_by_size_.emplace(free_end - end, end);
  }
  allocated_.emplace(extent.offset, extent.bytes);
  used_ += extent.bytes;
  peak_used_ = std::max(peak_used_, used_);
  high_water_ = std::max(high_water_, end);
  return absl::OkStatus();
}

absl::Status ExtentAllocator::Free(const Extent& extent) {
  auto it = allocated_.find(extent.offset);
  if (it == allocated_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no allocated extent at offset ", extent.offset,
                     " (double free or an extent from another allocator)"));
  }
  if (it->second != extent.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("extent at offset ", extent.offset, " has ",
                                                   it->second, " bytes, not ", extent.bytes,
                                                   "; pass the Extent that Allocate returned"));
  }
  allocated_.erase(it);
  used_ -= extent.bytes;

  uint64_t offset = extent.offset;
  uint64_t bytes = extent.bytes;
  // Merge with the free extent that ends where this one starts.
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_by_size_.erase({prev->second, prev->first});
      free_by_offset_.erase(prev);
    }
  }
  // Merge with the free extent that starts where this one ends.
  if (next != free_by_offset_.end() && next->first == offset + bytes) {
    bytes += next->second;
    free_by_size_.erase({next->second, next->first});
    free_by_offset_.erase(next);
  }
  free_by_offset_.emplace(offset, bytes);
  free_by_size_.emplace(bytes, offset);
  return absl::OkStatus();
}

bool ExtentAllocator::CanAllocate(uint64_t bytes) const {
  if (bytes == 0 || bytes > capacity_) return false;
  return !free_by_size_.empty() && free_by_size_.rbegin()->first >= RoundUp(bytes);
}

AllocatorStats ExtentAllocator::stats() const {
  AllocatorStats s;
  s.capacity_bytes = capacity_;
  s.used_bytes = used_;
  s.peak_used_bytes = peak_used_;
  s.high_water_bytes = high_water_;
  s.free_extents = free_by_offset_.size();
  s.largest_free_bytes = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.allocated_extents = allocated_.size();
  return s;
}

}  // namespace offloadd::pool
