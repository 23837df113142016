// The default Unix-socket path of offloadd, shared by the daemon (where it listens) and the
// client library (where it connects) so the two never disagree. Header-only, no dependencies.
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

#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
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

}  // namespace client
}  // namespace offloadd

#endif  // OFFLOADD_CLIENT_SOCKET_PATH_H_
