// SlicedExtentAllocator: placement per NUMA slice, fallback reasons and counts, adoption of
// extents that straddle slices. (Placement from a sysfs topology: sched/numa_placement_test.cc.)
#include "server/pool/sliced_allocator.h"

#include "gtest/gtest.h"

namespace offloadd::pool {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// Two 1 MiB slices: node 1 first, then node 0.
std::vector<ArenaSlice> TwoNodes() { return {{1, 0, kMiB}, {0, kMiB, kMiB}}; }

TEST(SlicedExtentAllocatorTest, ABlockGoesToItsNodesSlice) {
  SlicedExtentAllocator a(TwoNodes());
  auto p0 = a.Allocate(4096, 0);
  auto p1 = a.Allocate(4096, 1);
  ASSERT_TRUE(p0.ok() && p1.ok());
  EXPECT_EQ(p0->numa_node, 0);
  EXPECT_EQ(p0->outcome, PlacementOutcome::kLocal);
  EXPECT_EQ(p0->extent.offset, kMiB);
  EXPECT_EQ(p1->extent.offset, 0u);
  EXPECT_EQ(a.NodeOfOffset(p0->extent.offset), 0);
  EXPECT_EQ(a.NodeOfOffset(p1->extent.offset), 1);
  EXPECT_EQ(a.placement_counts().local, 2u);
  EXPECT_EQ(a.placement_counts().fallbacks(), 0u);
  EXPECT_EQ(a.slice_stats(0).used_bytes, 4096u);
  EXPECT_EQ(a.slice_stats(1).used_bytes, 4096u);
}

TEST(SlicedExtentAllocatorTest, AFullSliceFallsBackToAnotherNodeAndCountsWhy) {
  SlicedExtentAllocator a(TwoNodes());
  auto fill = a.Allocate(kMiB, 0);
  ASSERT_TRUE(fill.ok());
  auto spill = a.Allocate(8192, 0);
  ASSERT_TRUE(spill.ok()) << spill.status();
  EXPECT_EQ(spill->outcome, PlacementOutcome::kSliceFull);
  EXPECT_EQ(spill->numa_node, 1);
  EXPECT_LT(spill->extent.offset, kMiB);
  EXPECT_EQ(a.placement_counts().slice_full, 1u);
  // Freed, the node's slice takes its blocks again.
  ASSERT_TRUE(a.Free(fill->extent).ok());
  auto back = a.Allocate(8192, 0);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->outcome, PlacementOutcome::kLocal);
  EXPECT_EQ(back->numa_node, 0);
  EXPECT_EQ(a.placement_counts().fallbacks(), 1u);
}

TEST(SlicedExtentAllocatorTest, UnknownNodeAndNodeWithoutSliceFallBackToTheEmptiest) {
  SlicedExtentAllocator a(TwoNodes());
  ASSERT_TRUE(a.Allocate(512 * 1024, 1).ok());
  auto unknown = a.Allocate(4096, -1);
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->outcome, PlacementOutcome::kUnknownNode);
  EXPECT_EQ(unknown->numa_node, 0);  // node 1's slice is half used
  auto other = a.Allocate(4096, 3);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->outcome, PlacementOutcome::kNoSlice);
  EXPECT_EQ(a.placement_counts().unknown_node, 1u);
  EXPECT_EQ(a.placement_counts().no_slice, 1u);
  EXPECT_STREQ(PlacementOutcomeName(PlacementOutcome::kNoSlice), "no_slice");
}

TEST(SlicedExtentAllocatorTest, FullPoolAndBlocksLargerThanASliceAreRefused) {
  SlicedExtentAllocator a(TwoNodes());
  EXPECT_EQ(a.Allocate(kMiB + 4096, 0).status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(a.Allocate(kMiB, 0).ok());
  ASSERT_TRUE(a.Allocate(kMiB, 1).ok());
  EXPECT_FALSE(a.CanAllocate(256));
  EXPECT_EQ(a.Allocate(256, 0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.stats().used_bytes, 2 * kMiB);
  EXPECT_EQ(a.stats().capacity_bytes, 2 * kMiB);
}

TEST(SlicedExtentAllocatorTest, AnUnslicedPoolPlacesEverythingWithoutFallback) {
  SlicedExtentAllocator a({{-1, 0, 2 * kMiB}});
  auto p = a.Allocate(4096, 1);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->outcome, PlacementOutcome::kUnbound);
  EXPECT_EQ(p->numa_node, -1);
  EXPECT_EQ(a.placement_counts().unbound, 1u);
  EXPECT_EQ(a.placement_counts().fallbacks(), 0u);
}

TEST(SlicedExtentAllocatorTest, AnAdoptedExtentMayStraddleSlicesAndIsFreedWhole) {
  SlicedExtentAllocator a(TwoNodes());
  const Extent straddling{kMiB - 8192, 16384};
  ASSERT_TRUE(a.AllocateAt(straddling).ok());
  EXPECT_EQ(a.slice_stats(0).used_bytes, 8192u);
  EXPECT_EQ(a.slice_stats(1).used_bytes, 8192u);
  // A second claim on any of its bytes is refused and changes nothing.
  EXPECT_EQ(a.AllocateAt({kMiB - 4096, 8192}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a.stats().used_bytes, 16384u);
  // Freeing only part of it is refused; freeing it whole returns both pieces.
  EXPECT_FALSE(a.Free({kMiB - 8192, 8192 + 4096}).ok());
  EXPECT_EQ(a.stats().used_bytes, 16384u);
  ASSERT_TRUE(a.Free(straddling).ok());
  EXPECT_EQ(a.stats().used_bytes, 0u);
  EXPECT_EQ(a.stats().peak_used_bytes, 16384u);
}

}  // namespace
}  // namespace offloadd::pool
