#include "server/metrics/metrics.h"

#include "gtest/gtest.h"

namespace offloadd::metrics {
namespace {

TEST(NumaNodeLabelTest, KnownNodesAreTheirNumberAndAnUnknownNodeIsNotZero) {
  EXPECT_EQ(NumaNodeLabel(0), "0");
  EXPECT_EQ(NumaNodeLabel(3), "3");
  EXPECT_EQ(NumaNodeLabel(-1), "unknown");
  EXPECT_NE(NumaNodeLabel(-1), NumaNodeLabel(0));
}

}  // namespace
}  // namespace offloadd::metrics
