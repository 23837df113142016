// TakeListenFd: the LISTEN_FDS protocol read by hand, its refusals by status code.
#include "server/rpc/socket_activation.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace offloadd::rpc {
namespace {

void SetListenEnv(int pid, int fds) {
  setenv("LISTEN_PID", std::to_string(pid).c_str(), 1);
  setenv("LISTEN_FDS", std::to_string(fds).c_str(), 1);
}

// Puts a socket of `type` on descriptor 3 (listening when `listen_on`).
void SocketOnFd3(int type, bool listen_on) {
  int s = socket(AF_UNIX, type, 0);
  ASSERT_GE(s, 0);
  if (listen_on) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;  // autobind: an abstract name
    ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(sa_family_t)), 0);
    ASSERT_EQ(listen(s, 4), 0);
  }
  if (s != kListenFdsStart) {
    ASSERT_EQ(dup2(s, kListenFdsStart), kListenFdsStart);
    close(s);
  }
}

TEST(SocketActivationTest, NoEnvironmentMeansNoSocket) {
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  auto fd = TakeListenFd();
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(*fd, -1);
}

TEST(SocketActivationTest, AnotherProcessesVariablesAreIgnoredAndCleared) {
  SetListenEnv(getpid() + 1, 1);
  auto fd = TakeListenFd();
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(*fd, -1);
  EXPECT_EQ(std::getenv("LISTEN_PID"), nullptr);
  EXPECT_EQ(std::getenv("LISTEN_FDS"), nullptr);
}

TEST(SocketActivationTest, TakesAListeningUnixStreamSocketOnFd3) {
  SocketOnFd3(SOCK_STREAM, true);
  SetListenEnv(getpid(), 1);
  auto fd = TakeListenFd();
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(*fd, kListenFdsStart);
  EXPECT_NE(fcntl(*fd, F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_EQ(std::getenv("LISTEN_FDS"), nullptr);
  close(kListenFdsStart);
}

TEST(SocketActivationTest, RefusesMoreThanOneSocket) {
  SetListenEnv(getpid(), 2);
  auto fd = TakeListenFd();
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition) << fd.status();
}

TEST(SocketActivationTest, RefusesASocketThatDoesNotListen) {
  SocketOnFd3(SOCK_STREAM, false);
  SetListenEnv(getpid(), 1);
  auto fd = TakeListenFd();
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition) << fd.status();
  close(kListenFdsStart);
}

TEST(SocketActivationTest, RefusesADatagramSocket) {
  SocketOnFd3(SOCK_DGRAM, false);
  SetListenEnv(getpid(), 1);
  auto fd = TakeListenFd();
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kFailedPrecondition) << fd.status();
  close(kListenFdsStart);
}

}  // namespace
}  // namespace offloadd::rpc
