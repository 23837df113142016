#include "server/rpc/socket_activation.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace offloadd::rpc {
namespace {

bool IntSockOpt(int fd, int option, int* value) {
  socklen_t len = sizeof(*value);
  return getsockopt(fd, SOL_SOCKET, option, value, &len) == 0;
}

}  // namespace

absl::StatusOr<int> TakeListenFd() {
  const char* pid_text = std::getenv("LISTEN_PID");
  const char* fds_text = std::getenv("LISTEN_FDS");
  int64_t pid = 0, fds = 0;
  const bool for_us = pid_text != nullptr && fds_text != nullptr &&
                      absl::SimpleAtoi(pid_text, &pid) && pid == getpid() &&
                      absl::SimpleAtoi(fds_text, &fds);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  if (!for_us || fds == 0) return -1;
  if (fds != 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the service manager passed %d sockets (LISTEN_FDS); offloadd takes exactly one: give "
        "offloadd.socket a single ListenStream= (the Unix socket path)",
        fds));
  }
  const int fd = kListenFdsStart;
  int domain = 0, type = 0, listening = 0;
  if (!IntSockOpt(fd, SO_DOMAIN, &domain) || !IntSockOpt(fd, SO_TYPE, &type) ||
      !IntSockOpt(fd, SO_ACCEPTCONN, &listening) || domain != AF_UNIX || type != SOCK_STREAM ||
      listening == 0) {
    return absl::FailedPreconditionError(
        "descriptor 3 passed by the service manager is not a listening Unix stream socket: use "
        "ListenStream=/run/offloadd/offloadd.sock (and Accept=no) in offloadd.socket");
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

}  // namespace offloadd::rpc
