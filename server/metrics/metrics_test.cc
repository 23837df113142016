#include "server/metrics/metrics.h"

#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "server/metrics/loopback_listener.h"

namespace offloadd::metrics {
namespace {

TEST(NumaNodeLabelTest, KnownNodesAreTheirNumberAndAnUnknownNodeIsNotZero) {
  EXPECT_EQ(NumaNodeLabel(0), "0");
  EXPECT_EQ(NumaNodeLabel(3), "3");
  EXPECT_EQ(NumaNodeLabel(-1), "unknown");
  EXPECT_NE(NumaNodeLabel(-1), NumaNodeLabel(0));
}

TEST(ExposerTest, TakenPortSaysTheAddressIsInUseAndTheRemedy) {
  std::string address;
  const int fd = ListenOnLoopback(&address);
  ASSERT_GE(fd, 0);

  EXPECT_EQ(CheckAddressFree(address).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Start(address);
  ASSERT_FALSE(exposer.ok());
  const std::string message(exposer.status().message());
  EXPECT_EQ(message.find("null context"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot serve metrics on " + address + ": the address is in use"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--metrics_address= to serve no metrics"), std::string::npos) << message;
  close(fd);
  EXPECT_TRUE(CheckAddressFree(address).ok());
}

}  // namespace
}  // namespace offloadd::metrics
