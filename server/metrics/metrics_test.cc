#include "server/metrics/metrics.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace offloadd::metrics {
namespace {

TEST(NumaNodeLabelTest, KnownNodesAreTheirNumberAndAnUnknownNodeIsNotZero) {
  EXPECT_EQ(NumaNodeLabel(0), "0");
  EXPECT_EQ(NumaNodeLabel(3), "3");
  EXPECT_EQ(NumaNodeLabel(-1), "unknown");
  EXPECT_NE(NumaNodeLabel(-1), NumaNodeLabel(0));
}

TEST(ExposerTest, TakenPortSaysTheAddressIsInUseAndTheRemedy) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

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
