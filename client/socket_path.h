// The default Unix-socket path of offloadd, shared by the daemon (where it listens) and the
// client library (where it connects) so the two never disagree, and why a socket did not
// answer. No dependencies beyond libc (socket_path.cc).
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

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace offloadd {
namespace client {

// Largest usable Unix socket path length in bytes (Linux sun_path is 108 bytes incl. NUL).
inline constexpr size_t kMaxSocketPathBytes = 107;

// The system-wide daemon's socket directory and socket (rules 1 and 2).
inline constexpr const char* kSystemSocketDirectory = "/run/offloadd";
inline constexpr const char* kSystemSocketPath = "/run/offloadd/offloadd.sock";

// The rule above as a pure function of its inputs; xdg_runtime_dir may be null;
// `system_directory_exists`: whether kSystemSocketDirectory is a directory.
std::string DefaultSocketPathFor(uid_t euid, const char* xdg_runtime_dir,
                                 bool system_directory_exists = false);

// Whether kSystemSocketDirectory is a directory (readable by everyone: /run is 0755).
bool SystemSocketDirectoryExists();

// The rule above for the calling process (geteuid(), getenv("XDG_RUNTIME_DIR"), /run/offloadd).
std::string DefaultSocketPath();

// True when `path` is non-empty and fits in a sockaddr_un.
bool SocketPathFits(const std::string& path);

// connect()s to the Unix socket at `path` without blocking and closes it again: 0 when the
// listener queued the connection, else connect's errno (ENOENT: no file; ECONNREFUSED: nobody
// listens; EACCES: no permission; EAGAIN: a process listens but its queue of connections not
// yet accepted is full: it accepts none, stopped or hung; ENAMETOOLONG: past sockaddr_un).
// Never waits: a blocking connect to a listener that accepts nothing would wait forever.
int ProbeUnixSocket(const std::string& path);

// Whether a listening socket is bound to the socket file at `path`, as the kernel's socket
// diagnostics (NETLINK_SOCK_DIAG, what `ss -xl` reads; no privilege needed) list the listeners of
// this network namespace by the device and inode of their file. kUnknown when `path` is not a
// socket or the diagnostics do not answer. kNotListening is certain only for a daemon in this
// network namespace: one in another container's is not listed.
enum class SocketListener { kListening, kNotListening, kUnknown };

// One netlink reply buffer of SocketListenerAt: kListening when a listener's file is (dev, ino),
// kNotListening at the end of the dump, kUnknown on an error; `done` says whether the dump ended.
SocketListener ScanUnixDiagReply(const char* buf, ssize_t n, dev_t dev, ino_t ino,
                                 bool* done);

SocketListener SocketListenerAt(const std::string& path);

// "name (uid N)", or "uid N" for a uid without a name here.
std::string UserText(uid_t uid);

// This process as file permissions see it: its effective uid and its groups (the effective gid
// and the supplementary ones).
struct ProcessCredentials {
  uid_t uid;
  std::vector<gid_t> groups;
};

ProcessCredentials CurrentCredentials();

// "uid N, groups a,b".
std::string CredentialsText(const ProcessCredentials& c);

// The remedy once a socket's mode admits no group this user could join: the daemon's socket
// mode and group, or running as a user the mode admits (`admitted_user`: "root" or its owner).
std::string SocketModeRemedy(const std::string& admitted_user);

// Who a mode lets connect (`verb`) when its group's bits do not: "only its owner, X, may
// connect", "no user but root may connect", or, where the others' bits do, "its group may not".
std::string AdmittedByMode(const struct stat& st, mode_t owner_bit, mode_t other_bit,
                           const std::string& verb);

// Why the mode of `denying` (the socket when `is_socket`, else a directory on the way) shuts out
// a process with credentials `c`, following the kernel's rule: the owner's bits for its owner,
// else the group's for a member of its group, else the others'. Connecting needs write
// permission on the socket (socket_mode gives read/write), passing a directory search (x).
// A clause without its remedy (ModeDenialRemedy); "" when the mode is not the reason to name:
// the group's bits admit, and this process is not in the group (the remedy is joining it;
// PermissionDeniedReason), or its class has the permission.
// `group` is the file's group as GroupText writes it.
std::string ModeDenialReasonFor(const struct stat& st, bool is_socket,
                                const std::string& group, const ProcessCredentials& c);

// The remedy after ModeDenialReasonFor: for the socket, its mode and group (SocketModeRemedy);
// for a directory, search permission for a group this user is in.
std::string ModeDenialRemedy(const struct stat& st, bool is_socket);

// The sentence for a socket file whose permission shuts this process out and on which
// SocketListenerAt finds no listener: the daemon may be gone, which its permission hides.
std::string NoListenerNote();

// "name (gid N)", or "gid N" for a gid without a name here.
std::string GroupText(gid_t gid);

// Whether `gid` (as text) is a group no user should be added to: root (gid 0) opens root's
// files to them, nogroup (gid 65534, nobody's group) every unprivileged service's.
bool IsSharedSystemGid(const std::string& gid);

// The remedy once a file's group shuts this process out: join that group (`usermod_group` is
// its name or gid, `gid` its gid as text; "GROUP" / "its gid" when unknown). Group root (gid 0)
// and nogroup (gid 65534, a daemon run as nobody) are never ones to add users to
// (IsSharedSystemGid): then the daemon's socket needs a dedicated group first, set by
// socket_group (config or --socket_group) and a restart. `daemon_listening` false
// (SocketListenerAt found no listener): no claim that the daemon is fine.
std::string JoinGroupRemedy(const std::string& group_name, const std::string& usermod_group,
                            const std::string& gid, bool daemon_listening = true);

// Why connect() to `path` is refused with EACCES/EPERM: which file shuts this process out (the
// socket, or a directory on the way that it may not search), its group and mode, who this
// process is, and the remedy (JoinGroupRemedy: join the group; never a restart unless the group
// is root). Where the mode admits no group this user could join (owner-only, or a group without
// the permission), the mode's words and remedy instead (ModeDenialReasonFor); on a socket
// nobody listens on (SocketListenerAt), that first (NoListenerNote) and no "the daemon is fine".
std::string PermissionDeniedReason(const std::string& path);

// Why no daemon answered at `path`, from ProbeUnixSocket's result: a clause for an error
// message that tells a permission problem from a dead or stuck daemon.
std::string UnreachableSocketReason(const std::string& path, int probe_errno);

}  // namespace client
}  // namespace offloadd

#endif  // OFFLOADD_CLIENT_SOCKET_PATH_H_
