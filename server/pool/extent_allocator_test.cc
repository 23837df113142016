#include "server/pool/extent_allocator.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/pool/workload_trace.h"

namespace offloadd::pool {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

Extent MustAllocate(ExtentAllocator& a, uint64_t bytes) {
  auto e = a.Allocate(bytes);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : Extent{};
}

TEST(ExtentAllocatorTest, RoundUp) {
  EXPECT_EQ(ExtentAllocator::RoundUp(0), 0u);
  EXPECT_EQ(ExtentAllocator::RoundUp(1), 256u);
  EXPECT_EQ(ExtentAllocator::RoundUp(255), 256u);
  EXPECT_EQ(ExtentAllocator::RoundUp(256), 256u);
  EXPECT_EQ(ExtentAllocator::RoundUp(257), 512u);
  EXPECT_EQ(ExtentAllocator::RoundUp(4 * kKiB + 1), 4 * kKiB + 256);
}

TEST(ExtentAllocatorTest, CapacityRoundsDown) {
  ExtentAllocator a(1000);
  EXPECT_EQ(a.stats().capacity_bytes, 768u);
  EXPECT_EQ(a.stats().largest_free_bytes, 768u);
  EXPECT_EQ(a.stats().free_extents, 1u);
  ExtentAllocator tiny(255);
  EXPECT_EQ(tiny.stats().capacity_bytes, 0u);
  EXPECT_EQ(tiny.stats().free_extents, 0u);
  EXPECT_EQ(tiny.Allocate(1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ExtentAllocatorTest, AllocatesInAddressOrderAndRounds) {
  ExtentAllocator a(64 * kKiB);
  Extent e1 = MustAllocate(a, 1000);
  Extent e2 = MustAllocate(a, 4096);
  EXPECT_EQ(e1.offset, 0u);
  EXPECT_EQ(e1.bytes, 1024u);
  EXPECT_EQ(e2.offset, 1024u);
  EXPECT_EQ(e2.bytes, 4096u);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.used_bytes, 5120u);
  EXPECT_EQ(s.peak_used_bytes, 5120u);
  EXPECT_EQ(s.high_water_bytes, 5120u);
  EXPECT_EQ(s.allocated_extents, 2u);
  EXPECT_EQ(s.free_extents, 1u);
  EXPECT_EQ(s.largest_free_bytes, 64 * kKiB - 5120);
}

TEST(ExtentAllocatorTest, AllocateAtCarvesExactExtentsAndRefusesOverlap) {
  ExtentAllocator a(4 * kKiB);
  ASSERT_TRUE(a.AllocateAt({1024, 512}).ok());
  ASSERT_TRUE(a.AllocateAt({3072, 1024}).ok());
  EXPECT_EQ(a.stats().used_bytes, 1536u);
  EXPECT_EQ(a.stats().free_extents, 2u);  // [0,1024) and [1536,3072)
  EXPECT_EQ(a.AllocateAt({1280, 512}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a.AllocateAt({768, 512}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(a.AllocateAt({3840, 512}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a.AllocateAt({100, 256}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.stats().used_bytes, 1536u);
  // Allocate then fills the gaps around the adopted extents, lowest fitting first.
  EXPECT_EQ(MustAllocate(a, 1024).offset, 0u);
  EXPECT_EQ(MustAllocate(a, 1536).offset, 1536u);
  EXPECT_FALSE(a.CanAllocate(256));
  ASSERT_TRUE(a.Free({1024, 512}).ok());
  EXPECT_EQ(MustAllocate(a, 512).offset, 1024u);
}

TEST(ExtentAllocatorTest, ErrorCodes) {
  ExtentAllocator a(16 * kKiB);
  EXPECT_EQ(a.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate(16 * kKiB + 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a.Allocate(UINT64_MAX).status().code(), absl::StatusCode::kOutOfRange);
  Extent e = MustAllocate(a, 12 * kKiB);
  auto r = a.Allocate(8 * kKiB);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(a.CanAllocate(8 * kKiB));
  EXPECT_TRUE(a.CanAllocate(4 * kKiB));
  ASSERT_TRUE(a.Free(e).ok());
  EXPECT_TRUE(a.Allocate(8 * kKiB).ok());
}

TEST(ExtentAllocatorTest, InvalidFreeLeavesAllocatorUnchanged) {
  ExtentAllocator a(64 * kKiB);
  Extent e1 = MustAllocate(a, 4 * kKiB);
  Extent e2 = MustAllocate(a, 4 * kKiB);
  ASSERT_TRUE(a.Free(e1).ok());
  const AllocatorStats before = a.stats();
  // Double free.
  EXPECT_EQ(a.Free(e1).code(), absl::StatusCode::kInvalidArgument);
  // Unknown offset (inside a live extent, and in free space).
  EXPECT_EQ(a.Free({e2.offset + 256, 256}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Free({32 * kKiB, 4 * kKiB}).code(), absl::StatusCode::kInvalidArgument);
  // Wrong length, shorter and longer.
  EXPECT_EQ(a.Free({e2.offset, 256}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Free({e2.offset, 8 * kKiB}).code(), absl::StatusCode::kInvalidArgument);
  const AllocatorStats after = a.stats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.allocated_extents, before.allocated_extents);
  EXPECT_EQ(after.free_extents, before.free_extents);
  EXPECT_EQ(after.largest_free_bytes, before.largest_free_bytes);
  EXPECT_TRUE(a.Free(e2).ok());
  EXPECT_EQ(a.stats().free_extents, 1u);
}

TEST(ExtentAllocatorTest, CoalescesWithBothNeighbours) {
  ExtentAllocator a(40 * kKiB);
  Extent e[4];
  for (auto& x : e) x = MustAllocate(a, 8 * kKiB);  // 32 KiB used, 8 KiB tail free
  ASSERT_TRUE(a.Free(e[0]).ok());
  ASSERT_TRUE(a.Free(e[2]).ok());
  EXPECT_EQ(a.stats().free_extents, 3u);  // [0,8) [16,24) [32,40)
  EXPECT_EQ(a.stats().largest_free_bytes, 8 * kKiB);
  // Freeing e[1] merges with the left ([0,8)) and the right ([16,24)) free extents.
  ASSERT_TRUE(a.Free(e[1]).ok());
  EXPECT_EQ(a.stats().free_extents, 2u);
  EXPECT_EQ(a.stats().largest_free_bytes, 24 * kKiB);
  Extent big = MustAllocate(a, 24 * kKiB);
  EXPECT_EQ(big.offset, 0u);
  // Freeing e[3] merges with the right tail only (its left neighbour is allocated).
  ASSERT_TRUE(a.Free(e[3]).ok());
  EXPECT_EQ(a.stats().free_extents, 1u);
  EXPECT_EQ(a.stats().largest_free_bytes, 16 * kKiB);
  ASSERT_TRUE(a.Free(big).ok());
  EXPECT_EQ(a.stats().free_extents, 1u);
  EXPECT_EQ(a.stats().largest_free_bytes, 40 * kKiB);
  EXPECT_EQ(a.stats().used_bytes, 0u);
  EXPECT_EQ(a.stats().peak_used_bytes, 32 * kKiB);
  EXPECT_EQ(a.stats().high_water_bytes, 32 * kKiB);
}

TEST(ExtentAllocatorTest, ChoosesBestFitLowestAddress) {
  // Layout of 1 KiB slots: holes of 3 KiB at 0, 2 KiB at 4, 2 KiB at 7, 4 KiB at 10, tail at 15.
  ExtentAllocator a(32 * kKiB);
  std::vector<Extent> slots;
  for (int i = 0; i < 15; ++i) slots.push_back(MustAllocate(a, kKiB));
  for (int i : {0, 1, 2, 4, 5, 7, 8, 10, 11, 12, 13}) ASSERT_TRUE(a.Free(slots[i]).ok());
  EXPECT_EQ(a.stats().free_extents, 5u);
  // 2 KiB: two exact fits; the lower address wins.
  EXPECT_EQ(MustAllocate(a, 2 * kKiB).offset, 4 * kKiB);
  EXPECT_EQ(MustAllocate(a, 2 * kKiB).offset, 7 * kKiB);
  // 3.5 KiB: the 3 KiB hole is too small, the 4 KiB hole is the best fit (not the tail).
  Extent e = MustAllocate(a, 3 * kKiB + 512);
  EXPECT_EQ(e.offset, 10 * kKiB);
  // 256 B: the smallest remaining hole is the 512 B left after the 3.5 KiB block.
  EXPECT_EQ(MustAllocate(a, 256).offset, 13 * kKiB + 512);
  // 3 KiB: exact fit at 0.
  EXPECT_EQ(MustAllocate(a, 3 * kKiB).offset, 0u);
  // Next 1 KiB goes to the tail now.
  EXPECT_EQ(MustAllocate(a, kKiB).offset, 15 * kKiB);
}

// Reference model: live extents by offset; free space is the gaps between them.
struct Gap {
  uint64_t offset, bytes;
};
std::vector<Gap> Gaps(const std::map<uint64_t, uint64_t>& live, uint64_t capacity) {
  std::vector<Gap> gaps;
  uint64_t at = 0;
  for (const auto& [off, bytes] : live) {
    if (off > at) gaps.push_back({at, off - at});
    at = off + bytes;
  }
  if (capacity > at) gaps.push_back({at, capacity - at});
  return gaps;
}

TEST(ExtentAllocatorTest, RandomTraceMatchesReferenceModel) {
  const uint64_t capacity = 8 * kMiB + 768;  // not a power of two
  ExtentAllocator a(capacity);
  ASSERT_EQ(a.stats().capacity_bytes, capacity);
  std::mt19937_64 rng(42);
  std::map<uint64_t, uint64_t> live;  // offset -> bytes
  uint64_t used = 0, peak = 0, high_water = 0;
  int failures = 0;
  for (int i = 0; i < 20000; ++i) {
    const bool alloc = live.empty() || rng() % 100 < 55;
    if (alloc) {
      const uint64_t bytes = 1 + rng() % (rng() % 4 == 0 ? 2 * kMiB : 64 * kKiB);
      const uint64_t rounded = ExtentAllocator::RoundUp(bytes);
      // Expected placement: smallest gap that fits, lowest offset among equals, its low end.
      const std::vector<Gap> gaps = Gaps(live, capacity);
      const Gap* best = nullptr;
      for (const Gap& g : gaps) {
        if (g.bytes >= rounded && (best == nullptr || g.bytes < best->bytes)) best = &g;
      }
      const bool can = a.CanAllocate(bytes);
      auto e = a.Allocate(bytes);
      ASSERT_EQ(can, e.ok()) << "CanAllocate disagrees with Allocate at step " << i;
      if (best == nullptr) {
        ASSERT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << i;
        ++failures;
        continue;
      }
      ASSERT_TRUE(e.ok()) << e.status() << " at step " << i;
      ASSERT_EQ(e->offset, best->offset) << i;
      ASSERT_EQ(e->bytes, rounded) << i;
      ASSERT_EQ(e->offset % kGranuleBytes, 0u);
      ASSERT_LE(e->offset + e->bytes, capacity);
      auto next = live.lower_bound(e->offset);
      if (next != live.end()) {
        ASSERT_LE(e->offset + e->bytes, next->first) << "overlap";
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, e->offset) << "overlap";
      }
      live[e->offset] = e->bytes;
      used += e->bytes;
      peak = std::max(peak, used);
      high_water = std::max(high_water, e->offset + e->bytes);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(a.Free({it->first, it->second}).ok()) << i;
      used -= it->second;
      live.erase(it);
    }
    const AllocatorStats s = a.stats();
    const std::vector<Gap> gaps = Gaps(live, capacity);
    uint64_t largest = 0;
    for (const Gap& g : gaps) largest = std::max(largest, g.bytes);
    ASSERT_EQ(s.used_bytes, used) << i;
    ASSERT_EQ(s.peak_used_bytes, peak) << i;
    ASSERT_EQ(s.high_water_bytes, high_water) << i;
    ASSERT_EQ(s.allocated_extents, live.size()) << i;
    ASSERT_EQ(s.free_extents, gaps.size()) << "free extents not fully coalesced at step " << i;
    ASSERT_EQ(s.largest_free_bytes, largest) << i;
  }
  EXPECT_GT(failures, 0);  // the trace does exercise RESOURCE_EXHAUSTED
  for (const auto& [off, bytes] : live) ASSERT_TRUE(a.Free({off, bytes}).ok());
  EXPECT_EQ(a.stats().free_extents, 1u);
  EXPECT_EQ(a.stats().largest_free_bytes, capacity);
}

// The overhead bound stated in extent_allocator.h. Seeds are 1..N in order, not selected.
struct BoundCase {
  int ranks;
  double side_probability;
  double max_ratio;   // per seed: high_water / peak live requested
  double mean_ratio;  // mean over the seeds
};

class OverheadBoundTest : public ::testing::TestWithParam<BoundCase> {};

TEST_P(OverheadBoundTest, HighWaterWithinBoundOfPeakLive) {
  const BoundCase c = GetParam();
  constexpr int kSeeds = 20;
  double sum = 0, worst = 0;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    TraceOptions o;
    o.seed = seed;
    o.ranks = c.ranks;
    o.side_probability = c.side_probability;
    const Trace t = MakeTrace(o);
    ExtentAllocator a(uint64_t{1} << 40);  // large enough: nothing may fail
    const ReplayResult r = Replay(t, &a);
    const AllocatorStats s = a.stats();
    ASSERT_EQ(r.failed_allocations, 0u);
    ASSERT_EQ(s.used_bytes, 0u) << "Replay must free everything";
    ASSERT_EQ(s.free_extents, 1u);
    ASSERT_LT(r.max_rounding_bytes, kGranuleBytes);
    ASSERT_LT(r.total_rounding_bytes, kGranuleBytes * r.allocations);
    ASSERT_GT(t.peak_live_requested_bytes, 64 * kMiB);
    const double ratio =
        static_cast<double>(s.high_water_bytes) / static_cast<double>(t.peak_live_requested_bytes);
    EXPECT_GE(ratio, 1.0);
    EXPECT_LE(ratio, c.max_ratio) << "seed " << seed;
    sum += ratio;
    worst = std::max(worst, ratio);
  }
  const double mean = sum / kSeeds;
  EXPECT_LE(mean, c.mean_ratio);
  std::printf("ranks=%d side=%.2f: high_water/peak_live mean %.4f, worst %.4f over %d seeds\n",
              c.ranks, c.side_probability, mean, worst, kSeeds);
}

// Bounds from extent_allocator.h; measured figures (200 seeds) are quoted there.
INSTANTIATE_TEST_SUITE_P(Traces, OverheadBoundTest,
                         ::testing::Values(BoundCase{1, 0.0, 1.0001, 1.0001},
                                           BoundCase{1, 0.15, 1.20, 1.05},
                                           BoundCase{4, 0.10, 1.35, 1.10}));

}  // namespace
}  // namespace offloadd::pool
