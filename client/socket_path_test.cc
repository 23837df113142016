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

namespace offloadd::client {
namespace {

// Issue 13 item 9: a socket the user may not open is reported as a permission problem, not as
// "daemon stuck or stale socket".
TEST(UnreachableSocketReasonTest, TellsPermissionFromStaleAndStuck) {
  EXPECT_NE(UnreachableSocketReason("/nonexistent/x.sock", EACCES).find("permission denied"),
            std::string::npos);
  EXPECT_EQ(UnreachableSocketReason("/nonexistent/x.sock", EACCES).find("stuck"),
            std::string::npos);
  EXPECT_NE(UnreachableSocketReason("/nonexistent/x.sock", ECONNREFUSED).find("no daemon listens"),
            std::string::npos);
  EXPECT_NE(UnreachableSocketReason("/nonexistent/x.sock", 0).find("did not answer"),
            std::string::npos);
  EXPECT_EQ(ProbeUnixSocket("/nonexistent/x.sock"), ENOENT);
}

}  // namespace
}  // namespace offloadd::client
