#include "client/socket_path.h"

#include <string>

#include "gtest/gtest.h"

namespace offloadd {
namespace client {
namespace {

TEST(SocketPathTest, RootUsesRunEvenWithXdg) {
  EXPECT_EQ(DefaultSocketPathFor(0, "/run/user/0"), "/run/offloadd/offloadd.sock");
  EXPECT_EQ(DefaultSocketPathFor(0, nullptr), "/run/offloadd/offloadd.sock");
}

TEST(SocketPathTest, UserWithXdgRuntimeDir) {
  EXPECT_EQ(DefaultSocketPathFor(1000, "/run/user/1000"), "/run/user/1000/offloadd/offloadd.sock");
}

TEST(SocketPathTest, UserWithoutXdgFallsBackToTmp) {
  EXPECT_EQ(DefaultSocketPathFor(1000, nullptr), "/tmp/offloadd-1000/offloadd.sock");
  EXPECT_EQ(DefaultSocketPathFor(1234, ""), "/tmp/offloadd-1234/offloadd.sock");
}

TEST(SocketPathTest, DefaultMatchesRuleForThisProcess) {
  EXPECT_EQ(DefaultSocketPath(), DefaultSocketPathFor(geteuid(), std::getenv("XDG_RUNTIME_DIR")));
}

TEST(SocketPathTest, FitsChecksSunPathLimit) {
  EXPECT_FALSE(SocketPathFits(""));
  EXPECT_TRUE(SocketPathFits(std::string(107, 'a')));
  EXPECT_FALSE(SocketPathFits(std::string(108, 'a')));
}

}  // namespace
}  // namespace client
}  // namespace offloadd
