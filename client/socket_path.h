// The default Unix-socket path of offloadd, shared by the daemon (where it listens) and the
// client library (where it connects) so the two never disagree, and why a socket did not
// answer. Header-only, no dependencies.
//
// Rule, first match wins:
//   1. effective uid 0 (root, e.g. the systemd unit):   /run/offloadd/offloadd.sock
//   2. $XDG_RUNTIME_DIR set and non-empty:               $XDG_RUNTIME_DIR/offloadd/offloadd.sock
//   3. otherwise:                                        /tmp/offloadd-<euid>/offloadd.sock
// The gRPC target for a path p is "unix:" + p. Unix socket paths are limited to 107 bytes
// (sizeof(sockaddr_un::sun_path) - 1); callers that accept a path should check it with
// SocketPathFits().
#ifndef OFFLOADD_CLIENT_SOCKET_PATH_H_
#define OFFLOADD_CLIENT_SOCKET_PATH_H_

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace offloadd {
namespace client {

// Largest usable Unix socket path length in bytes (Linux sun_path is 108 bytes incl. NUL).
inline constexpr size_t kMaxSocketPathBytes = 107;

// The rule above as a pure function of its inputs; xdg_runtime_dir may be null.
inline std::string DefaultSocketPathFor(uid_t euid, const char* xdg_runtime_dir) {
  if (euid == 0) return "/run/offloadd/offloadd.sock";
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] != '\0') {
    return std::string(xdg_runtime_dir) + "/offloadd/offloadd.sock";
  }
  return "/tmp/offloadd-" + std::to_string(euid) + "/offloadd.sock";
}

// The rule above for the calling process (geteuid(), getenv("XDG_RUNTIME_DIR")).
inline std::string DefaultSocketPath() {
  return DefaultSocketPathFor(geteuid(), std::getenv("XDG_RUNTIME_DIR"));
}

// True when `path` is non-empty and fits in a sockaddr_un.
inline bool SocketPathFits(const std::string& path) {
  return !path.empty() && path.size() <= kMaxSocketPathBytes;
}

// connect()s to the Unix socket at `path` and closes it again: 0 when a process accepted,
// else connect's errno (ENOENT: no file; ECONNREFUSED: nobody listens; EACCES: no permission).
inline int ProbeUnixSocket(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  close(fd);
  return err;
}

// Why no daemon answered at `path`, from ProbeUnixSocket's result: a clause for an error
// message that tells a permission problem from a dead or stuck daemon.
inline std::string UnreachableSocketReason(const std::string& path, int probe_errno) {
  struct stat st;
  const bool exists = stat(path.c_str(), &st) == 0;
  switch (probe_errno) {
    case EACCES:
    case EPERM: {
      std::string owner = exists ? " (owner uid " + std::to_string(st.st_uid) + ", group gid " +
                                       std::to_string(st.st_gid) + ")"
                                 : "";
      return "permission denied: this user may not connect to the socket" + owner +
             "; the daemon may be fine: ask its administrator to add you to the socket's "
             "group (socket_group in the daemon config)";
    }
    case ENOENT:
      return "no socket file there";
    case ECONNREFUSED:
      return "the socket file exists but no daemon listens on it (stale socket of a daemon "
             "that exited)";
    case 0:
      return "the socket accepted the connection but the daemon did not answer (daemon stuck "
             "or overloaded, or this user is past its connection bound)";
    default:
      return std::string("connect failed: ") + std::strerror(probe_errno);
  }
}

}  // namespace client
}  // namespace offloadd

#endif  // OFFLOADD_CLIENT_SOCKET_PATH_H_
