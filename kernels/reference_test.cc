#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/checksum_ref.h"
#include "kernels/pack_ref.h"

namespace offloadd::kernels {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(ChecksumRefTest, KnownValues) {
  // Empty input: mix(0) = 0 (splitmix64's finaliser fixes zero).
  EXPECT_EQ(ChecksumRef(nullptr, 0), 0u);
  // One zero byte: mix(1) + mix(0 + 0 * golden) = mix(1).
  const uint8_t zero = 0;
  EXPECT_EQ(ChecksumRef(&zero, 1), Mix64(1));
  // splitmix64 reference: the first output for seed 0 is mix(golden) = 0xe220a8397b1dcdaf.
  EXPECT_EQ(Mix64(kChecksumGolden), 0xe220a8397b1dcdafull);
  // Two words: terms for w0 = 1 at i = 0 and w1 = 0 at i = 1.
  uint8_t two[16] = {1};
  EXPECT_EQ(ChecksumRef(two, 16), Mix64(16) + Mix64(1) + Mix64(kChecksumGolden));
}

TEST(ChecksumRefTest, DetectsEverySingleBitFlipAndSwappedWords) {
  std::vector<uint8_t> data = RandomBytes(4099, 1);
  const uint64_t base = ChecksumRef(data.data(), data.size());
  for (size_t byte = 0; byte < data.size(); byte += 7) {
    for (int bit = 0; bit < 8; ++bit) {
      data[byte] ^= static_cast<uint8_t>(1 << bit);
      ASSERT_NE(ChecksumRef(data.data(), data.size()), base) << byte << ":" << bit;
      data[byte] ^= static_cast<uint8_t>(1 << bit);
    }
  }
  std::vector<uint8_t> swapped = data;
  std::memcpy(swapped.data(), data.data() + 8, 8);
  std::memcpy(swapped.data() + 8, data.data(), 8);
  EXPECT_NE(ChecksumRef(swapped.data(), swapped.size()), base);
  // A trailing zero byte changes the length term.
  std::vector<uint8_t> longer = data;
  longer.push_back(0);
  EXPECT_NE(ChecksumRef(longer.data(), longer.size()), base);
}

TEST(ChecksumRefTest, DoesNotDependOnAlignment) {
  std::vector<uint8_t> data = RandomBytes(1000, 2);
  std::vector<uint8_t> shifted(1003);
  std::memcpy(shifted.data() + 3, data.data(), data.size());
  EXPECT_EQ(ChecksumRef(data.data(), data.size()), ChecksumRef(shifted.data() + 3, data.size()));
}

TEST(PackRefTest, PlanAlignsEachSegmentInOrder) {
  PackPlan p = PlanPack({10, 0, 300, 1}, 256);
  EXPECT_EQ(p.offsets, (std::vector<uint64_t>{0, 256, 256, 768}));
  EXPECT_EQ(p.total_bytes, 769u);
  PackPlan dense = PlanPack({3, 5, 7}, 1);
  EXPECT_EQ(dense.offsets, (std::vector<uint64_t>{0, 3, 8}));
  EXPECT_EQ(dense.total_bytes, 15u);
  EXPECT_EQ(PlanPack({}, 256).total_bytes, 0u);
}

TEST(PackRefTest, GatherThenScatterRestoresEveryTensorAndNothingElse) {
  std::vector<uint64_t> sizes = {1, 17, 4096, 0, 255, 70000, 3};
  std::vector<std::vector<uint8_t>> tensors;
  std::vector<uint64_t> ptrs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    tensors.push_back(RandomBytes(sizes[i], 10 + i));
    ptrs.push_back(reinterpret_cast<uint64_t>(tensors.back().data()));
  }
  PackPlan plan = PlanPack(sizes, 256);
  std::vector<PackSegment> segs = MakeSegments(ptrs, sizes, plan);
  ASSERT_EQ(segs.size(), sizes.size());
  std::vector<uint8_t> staging(plan.total_bytes, 0xAB);
  GatherRef(segs.data(), segs.size(), staging.data());
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(std::memcmp(staging.data() + plan.offsets[i], tensors[i].data(), sizes[i]), 0);
  }
  // Padding between segments is untouched.
  EXPECT_EQ(staging[1], 0xAB);
  std::vector<std::vector<uint8_t>> originals = tensors;
  for (auto& t : tensors) std::fill(t.begin(), t.end(), 0);
  ScatterRef(segs.data(), segs.size(), staging.data());
  EXPECT_EQ(tensors, originals);
}

}  // namespace
}  // namespace offloadd::kernels
