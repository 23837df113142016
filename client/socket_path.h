// The default Unix-socket path of offloadd, shared by the daemon (where it listens) and the
// client library (where it connects) so the two never disagree, and why a socket did not
// answer. Header-only, no dependencies.
//
// Rule, first match wins:
//   1. effective uid 0 (root, e.g. the systemd unit):   /run/offloadd/offloadd.sock
//   2. the directory /run/offloadd exists (a system-wide daemon: the unit's RuntimeDirectory,
//      the DaemonSet's host path), whoever asks:        /run/offloadd/offloadd.sock
//   3. $XDG_RUNTIME_DIR set and non-empty:               $XDG_RUNTIME_DIR/offloadd/offloadd.sock
//   4. otherwise:                                        /tmp/offloadd-<euid>/offloadd.sock
// So on a node with a system-wide daemon every user finds it without configuration; a user who
// runs a daemon of their own there gives both sides the path (--socket_path, $OFFLOADD_SOCKET).
// The gRPC target for a path p is "unix:" + p. Unix socket paths are limited to 107 bytes
// (sizeof(sockaddr_un::sun_path) - 1); callers that accept a path should check it with
// SocketPathFits().
#ifndef OFFLOADD_CLIENT_SOCKET_PATH_H_
#define OFFLOADD_CLIENT_SOCKET_PATH_H_

#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace offloadd {
namespace client {

// Largest usable Unix socket path length in bytes (Linux sun_path is 108 bytes incl. NUL).
inline constexpr size_t kMaxSocketPathBytes = 107;

// The system-wide daemon's socket directory and socket (rules 1 and 2).
inline constexpr const char* kSystemSocketDirectory = "/run/offloadd";
inline constexpr const char* kSystemSocketPath = "/run/offloadd/offloadd.sock";

// The rule above as a pure function of its inputs; xdg_runtime_dir may be null;
// `system_directory_exists`: whether kSystemSocketDirectory is a directory.
inline std::string DefaultSocketPathFor(uid_t euid, const char* xdg_runtime_dir,
                                        bool system_directory_exists = false) {
  if (euid == 0 || system_directory_exists) return kSystemSocketPath;
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] != '\0') {
    return std::string(xdg_runtime_dir) + "/offloadd/offloadd.sock";
  }
  return "/tmp/offloadd-" + std::to_string(euid) + "/offloadd.sock";
}

// Whether kSystemSocketDirectory is a directory (readable by everyone: /run is 0755).
inline bool SystemSocketDirectoryExists() {
  struct stat st;
  return stat(kSystemSocketDirectory, &st) == 0 && S_ISDIR(st.st_mode);
}

// The rule above for the calling process (geteuid(), getenv("XDG_RUNTIME_DIR"), /run/offloadd).
inline std::string DefaultSocketPath() {
  return DefaultSocketPathFor(geteuid(), std::getenv("XDG_RUNTIME_DIR"),
                              SystemSocketDirectoryExists());
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

// "name (gid N)", or "gid N" for a gid without a name here.
inline std::string GroupText(gid_t gid) {
  group grp;
  group* found = nullptr;
  char buf[4096];
  if (getgrgid_r(gid, &grp, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return std::string(found->gr_name) + " (gid " + std::to_string(gid) + ")";
  }
  return "gid " + std::to_string(gid);
}

// Whether `gid` (as text) is a group no user should be added to: root (gid 0) opens root's
// files to them, nogroup (gid 65534, nobody's group) every unprivileged service's.
inline bool IsSharedSystemGid(const std::string& gid) { return gid == "0" || gid == "65534"; }

// The remedy once a file's group shuts this process out: join that group (`usermod_group` is
// its name or gid, `gid` its gid as text; "GROUP" / "its gid" when unknown). Group root (gid 0)
// and nogroup (gid 65534, a daemon run as nobody) are never ones to add users to
// (IsSharedSystemGid): then the daemon's socket needs a dedicated group first, set by
// socket_group (config or --socket_group) and a restart.
inline std::string JoinGroupRemedy(const std::string& group_name, const std::string& usermod_group,
                                   const std::string& gid) {
  if (IsSharedSystemGid(gid)) {
    return "The daemon is fine, but its group is " + group_name + ", and users must not be "
           "added to group " + usermod_group + ". Ask its administrator to create a dedicated "
           "group (groupadd offloadd), set the daemon's socket group to it (socket_group: "
           "offloadd in the config, or --socket_group=offloadd; SocketGroup=offloadd in "
           "offloadd.socket under socket activation), restart the daemon, and add this user to "
           "that group (usermod -aG offloadd USER, then log in again), or in Kubernetes add that "
           "group's gid to the pod's securityContext.supplementalGroups";
  }
  return "The daemon is fine; do not restart it. Ask its administrator to add this user to "
         "group " + group_name + " (usermod -aG " + usermod_group + " USER, then log in again), "
         "or in Kubernetes add " + gid + " to the pod's securityContext.supplementalGroups";
}

// Why connect() to `path` is refused with EACCES/EPERM: which file shuts this process out (the
// socket, or a directory on the way that it may not search), its group and mode, who this
// process is, and the remedy (JoinGroupRemedy: join the group; never a restart unless the group
// is root).
inline std::string PermissionDeniedReason(const std::string& path) {
  // The first directory from the root that this process may not search, else the socket.
  std::string denying = path, kind = "the socket";
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string dir = path.substr(0, slash);
    if (faccessat(AT_FDCWD, dir.c_str(), X_OK, AT_EACCESS) != 0) {
      denying = dir;
      kind = "its directory";
      break;
    }
  }
  struct stat st;
  std::string what = kind + " " + denying;
  std::string group_name = "the socket's group", usermod_group = "GROUP", gid = "its gid";
  if (stat(denying.c_str(), &st) == 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    group_name = GroupText(st.st_gid);
    what += " (group " + group_name + ", mode " + mode + ")";
    gid = std::to_string(st.st_gid);
    group grp;
    group* found = nullptr;
    char buf[4096];
    const bool named = getgrgid_r(st.st_gid, &grp, buf, sizeof(buf), &found) == 0 && found;
    usermod_group = named ? std::string(found->gr_name) : gid;  // usermod takes either
  }
  return "permission denied: " + what + " admits only its group, and this process (uid " +
         std::to_string(geteuid()) + ") is not in it. " +
         JoinGroupRemedy(group_name, usermod_group, gid);
}

// Why no daemon answered at `path`, from ProbeUnixSocket's result: a clause for an error
// message that tells a permission problem from a dead or stuck daemon.
inline std::string UnreachableSocketReason(const std::string& path, int probe_errno) {
  switch (probe_errno) {
    case EACCES:
    case EPERM:
      return PermissionDeniedReason(path);
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
