// The default socket path rule and the reasons a socket did not answer (socket_path.h).
#include "client/socket_path.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace offloadd {
namespace client {

std::string DefaultSocketPathFor(uid_t euid, const char* xdg_runtime_dir,
                                 bool system_directory_exists) {
  if (euid == 0 || system_directory_exists) return kSystemSocketPath;
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] != '\0') {
    return std::string(xdg_runtime_dir) + "/offloadd/offloadd.sock";
  }
  return "/tmp/offloadd-" + std::to_string(euid) + "/offloadd.sock";
}

bool SystemSocketDirectoryExists() {
  struct stat st;
  return stat(kSystemSocketDirectory, &st) == 0 && S_ISDIR(st.st_mode);
}

std::string DefaultSocketPath() {
  return DefaultSocketPathFor(geteuid(), std::getenv("XDG_RUNTIME_DIR"),
                              SystemSocketDirectoryExists());
}

bool SocketPathFits(const std::string& path) {
  return !path.empty() && path.size() <= kMaxSocketPathBytes;
}

int ProbeUnixSocket(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) return ENAMETOOLONG;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  close(fd);
  return err;
}

SocketListener ScanUnixDiagReply(const char* buf, ssize_t n, dev_t dev, ino_t ino,
                                 bool* done) {
  *done = true;
  for (auto* h = reinterpret_cast<const nlmsghdr*>(buf); NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
    if (h->nlmsg_type == NLMSG_DONE) return SocketListener::kNotListening;
    if (h->nlmsg_type == NLMSG_ERROR) return SocketListener::kUnknown;
    const auto* msg = static_cast<const unix_diag_msg*>(NLMSG_DATA(h));
    int len = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(*msg)));
    for (auto* a = reinterpret_cast<const rtattr*>(msg + 1); RTA_OK(a, len);
         a = RTA_NEXT(a, len)) {
      if (a->rta_type != UNIX_DIAG_VFS) continue;
      const auto* vfs = static_cast<const unix_diag_vfs*>(RTA_DATA(a));
      // The kernel's own dev_t: major in the high 12 bits, minor in the low 20.
      const dev_t vfs_dev = makedev(vfs->udiag_vfs_dev >> 20, vfs->udiag_vfs_dev & 0xfffff);
      if (vfs->udiag_vfs_ino == ino && vfs_dev == dev) return SocketListener::kListening;
    }
  }
  *done = false;
  return SocketListener::kNotListening;
}

SocketListener SocketListenerAt(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return SocketListener::kUnknown;
  const int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return SocketListener::kUnknown;
  struct {
    nlmsghdr header;
    unix_diag_req request;
  } dump{};
  dump.header.nlmsg_len = sizeof(dump);
  dump.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  dump.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  dump.request.sdiag_family = AF_UNIX;
  dump.request.udiag_states = 1u << 10;  // TCP_LISTEN: listening sockets only
  dump.request.udiag_show = UDIAG_SHOW_VFS;
  SocketListener result = SocketListener::kUnknown;
  if (send(fd, &dump, sizeof(dump), 0) == static_cast<ssize_t>(sizeof(dump))) {
    alignas(nlmsghdr) char buf[32768];
    bool done = false;
    while (!done) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) {
        result = SocketListener::kUnknown;
        break;
      }
      result = ScanUnixDiagReply(buf, n, st.st_dev, st.st_ino, &done);
      if (result == SocketListener::kListening) break;  // the rest of the dump is not read
    }
  }
  close(fd);
  return result;
}

std::string UserText(uid_t uid) {
  passwd pw;
  passwd* found = nullptr;
  char buf[4096];
  if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return std::string(found->pw_name) + " (uid " + std::to_string(uid) + ")";
  }
  return "uid " + std::to_string(uid);
}

ProcessCredentials CurrentCredentials() {
  ProcessCredentials c{geteuid(), {getegid()}};
  const int n = getgroups(0, nullptr);
  if (n > 0) {
    std::vector<gid_t> extra(static_cast<size_t>(n));
    const int got = getgroups(n, extra.data());
    for (int i = 0; i < got; ++i) {
      if (extra[i] != c.groups[0]) c.groups.push_back(extra[i]);
    }
  }
  return c;
}

std::string CredentialsText(const ProcessCredentials& c) {
  std::string text = "uid " + std::to_string(c.uid) + ", groups ";
  for (size_t i = 0; i < c.groups.size(); ++i) {
    text += (i ? "," : "") + std::to_string(c.groups[i]);
  }
  return text;
}

std::string SocketModeRemedy(const std::string& admitted_user) {
  return "Ask its administrator to give the daemon's socket group read/write permission and a "
         "group of its own (socket_mode: 0660 and socket_group: offloadd in the config, or "
         "--socket_mode=0660 --socket_group=offloadd; SocketMode=0660 and SocketGroup=offloadd "
         "in offloadd.socket under socket activation), restart the daemon, and add this user "
         "to that group (usermod -aG offloadd USER, then log in again); or run this as " +
         admitted_user;
}

std::string AdmittedByMode(const struct stat& st, mode_t owner_bit, mode_t other_bit,
                           const std::string& verb) {
  if (st.st_mode & other_bit) return "its group may not " + verb + " (other users may)";
  if (st.st_mode & owner_bit) return "only its owner, " + UserText(st.st_uid) + ", may " + verb;
  return "no user but root may " + verb;
}

std::string ModeDenialReasonFor(const struct stat& st, bool is_socket,
                                const std::string& group, const ProcessCredentials& c) {
  const mode_t owner_bit = is_socket ? S_IWUSR : S_IXUSR;
  const mode_t group_bit = is_socket ? S_IWGRP : S_IXGRP;
  const mode_t other_bit = is_socket ? S_IWOTH : S_IXOTH;
  const std::string perm = is_socket ? "write (w, which connecting needs)" : "search (x)";
  const std::string verb = is_socket ? "connect" : "search it";
  const bool owner_may = (st.st_mode & owner_bit) != 0;
  bool in_group = false;
  for (gid_t g : c.groups) in_group = in_group || g == st.st_gid;
  std::string reason;
  if (c.uid == st.st_uid) {
    if (owner_may) return "";
    reason = "its mode gives its owner, this process's user " + UserText(c.uid) +
             ", no " + perm + " permission";
  } else if (in_group) {
    if (st.st_mode & group_bit) return "";
    reason = "its mode gives its group " + group + ", which this process (" +
             CredentialsText(c) + ") is in, no " + perm + " permission: " +
             AdmittedByMode(st, owner_bit, other_bit, verb);
  } else {
    if (st.st_mode & (group_bit | other_bit)) return "";
    reason = "its mode gives neither its group " + group + " nor other users " +
             perm + " permission: " + AdmittedByMode(st, owner_bit, other_bit, verb) +
             ", and this process is " + CredentialsText(c);
  }
  return reason;
}

std::string ModeDenialRemedy(const struct stat& st, bool is_socket) {
  if (!is_socket) {
    return "Ask its administrator to let this user search it (a group this user is in, with "
           "g+x), or to give the daemon a socket_path in a directory this user may search";
  }
  return SocketModeRemedy((st.st_mode & S_IWUSR) ? UserText(st.st_uid) : "root");
}

std::string NoListenerNote() {
  return "No daemon listens on it in this network namespace: unless offloadd runs in another "
         "container, it has exited and left this socket file behind; start it again (e.g. "
         "systemctl restart offloadd). ";
}

std::string GroupText(gid_t gid) {
  group grp;
  group* found = nullptr;
  char buf[4096];
  if (getgrgid_r(gid, &grp, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return std::string(found->gr_name) + " (gid " + std::to_string(gid) + ")";
  }
  return "gid " + std::to_string(gid);
}

bool IsSharedSystemGid(const std::string& gid) { return gid == "0" || gid == "65534"; }

std::string JoinGroupRemedy(const std::string& group_name, const std::string& usermod_group,
                            const std::string& gid, bool daemon_listening) {
  if (IsSharedSystemGid(gid)) {
    return std::string(daemon_listening ? "The daemon is fine, but its" : "Its") +
           " group is " + group_name + ", and users must not be "
           "added to group " + usermod_group + ". Ask its administrator to create a dedicated "
           "group (groupadd offloadd), set the daemon's socket group to it (socket_group: "
           "offloadd in the config, or --socket_group=offloadd; SocketGroup=offloadd in "
           "offloadd.socket under socket activation), restart the daemon, and add this user to "
           "that group (usermod -aG offloadd USER, then log in again), or in Kubernetes add that "
           "group's gid to the pod's securityContext.supplementalGroups";
  }
  return std::string(daemon_listening ? "The daemon is fine; do not restart it. " : "") +
         "Ask its administrator to add this user to "
         "group " + group_name + " (usermod -aG " + usermod_group + " USER, then log in again), "
         "or in Kubernetes add " + gid + " to the pod's securityContext.supplementalGroups";
}

std::string PermissionDeniedReason(const std::string& path) {
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
  // The mode's own words where it admits no group this user could join (ModeDenialReasonFor),
  // and no claim that the daemon is fine while no daemon listens on the socket.
  const bool is_socket = kind == "the socket";
  const bool listening = !is_socket || SocketListenerAt(path) != SocketListener::kNotListening;
  const std::string note = listening ? "" : NoListenerNote();
  const ProcessCredentials creds = CurrentCredentials();
  if (stat(denying.c_str(), &st) == 0) {
    const std::string by_mode =
        ModeDenialReasonFor(st, is_socket, GroupText(st.st_gid), creds);
    if (!by_mode.empty()) {
      return "permission denied: " + what + ": " + by_mode + ". " + note +
             ModeDenialRemedy(st, is_socket);
    }
  }
  return "permission denied: " + what + " admits only its group, and this process (" +
         CredentialsText(creds) + ") is not in it. " + note +
         JoinGroupRemedy(group_name, usermod_group, gid, listening);
}

std::string UnreachableSocketReason(const std::string& path, int probe_errno) {
  switch (probe_errno) {
    case EACCES:
    case EPERM:
      return PermissionDeniedReason(path);
    case ENOENT:
      return "no socket file there";
    case ECONNREFUSED:
      return "the socket file exists but no daemon listens on it (stale socket of a daemon "
             "that exited)";
    case EAGAIN:
      return "a process listens on the socket but accepts no connection (its queue is full): "
             "the daemon is stopped (SIGSTOP, a debugger) or hung; check it (systemctl status "
             "offloadd, or its log) and restart it if it does not recover";
    case 0:
      return "the socket accepted the connection but no offloadd answered on it: the daemon is "
             "stopped (SIGSTOP, a debugger), hung or overloaded, this user is past its "
             "connection bound, or another program listens there (`ss -xlp` names it)";
    default:
      return std::string("connect failed: ") + std::strerror(probe_errno);
  }
}

}  // namespace client
}  // namespace offloadd
