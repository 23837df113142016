// Test helper: a TCP socket listening on 127.0.0.1 at a port the kernel picks, for tests of
// what the daemon does with a metrics address another process holds.
#ifndef OFFLOADD_SERVER_METRICS_LOOPBACK_LISTENER_H_
#define OFFLOADD_SERVER_METRICS_LOOPBACK_LISTENER_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace offloadd::metrics {

// Listens on 127.0.0.1:<a free port>; the descriptor (close it to free the port), or -1 when a
// step failed. `*address` is "127.0.0.1:<port>".
inline int ListenOnLoopback(std::string* address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  return fd;
}

}  // namespace offloadd::metrics

#endif  // OFFLOADD_SERVER_METRICS_LOOPBACK_LISTENER_H_
