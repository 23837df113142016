#include "server/projector/gpu_uuid.h"

#include "gtest/gtest.h"

namespace offloadd::projector {
namespace {

constexpr char kCanonical[] = "GPU-3f1a2b4c-5d6e-7f80-9a1b-2c3d4e5f6a7b";

TEST(NormalizeGpuUuidTest, EverySpellingOfOneUuidIsTheSame) {
  EXPECT_EQ(NormalizeGpuUuid(kCanonical), kCanonical);
  EXPECT_EQ(NormalizeGpuUuid("GPU-3F1A2B4C-5D6E-7F80-9A1B-2C3D4E5F6A7B"), kCanonical);
  EXPECT_EQ(NormalizeGpuUuid("gpu-3f1a2b4c-5d6e-7f80-9a1b-2c3d4e5f6a7b"), kCanonical);
  EXPECT_EQ(NormalizeGpuUuid("3f1a2b4c-5d6e-7f80-9a1b-2c3d4e5f6a7b"), kCanonical);
  EXPECT_EQ(NormalizeGpuUuid("3f1a2b4c5d6e7f809a1b2c3d4e5f6a7b"), kCanonical);
  EXPECT_EQ(NormalizeGpuUuid("  GPU-3f1a2b4c-5d6e-7f80-9a1b-2c3d4e5f6a7b\n"), kCanonical);
}

TEST(NormalizeGpuUuidTest, MigKeepsItsPrefixAndOthersAreLeftAlone) {
  EXPECT_EQ(NormalizeGpuUuid("MIG-3F1A2B4C-5D6E-7F80-9A1B-2C3D4E5F6A7B"),
            "MIG-3f1a2b4c-5d6e-7f80-9a1b-2c3d4e5f6a7b");
  EXPECT_NE(NormalizeGpuUuid("MIG-3f1a2b4c-5d6e-7f80-9a1b-2c3d4e5f6a7b"), kCanonical);
  EXPECT_EQ(NormalizeGpuUuid("projector"), "projector");
  EXPECT_EQ(NormalizeGpuUuid("GPU-3f1a2b4c"), "GPU-3f1a2b4c");                 // too short
  EXPECT_EQ(NormalizeGpuUuid("GPU-zz1a2b4c-5d6e-7f80-9a1b-2c3d4e5f6a7b"),
            "GPU-zz1a2b4c-5d6e-7f80-9a1b-2c3d4e5f6a7b");                      // not hex
}

}  // namespace
}  // namespace offloadd::projector
