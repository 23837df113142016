"""The default Unix-socket path of offloadd, and why a socket refuses; the same rules as
client/socket_path.h.

Default path, first match wins:
  1. effective uid 0:                          /run/offloadd/offloadd.sock
  2. the directory /run/offloadd exists (a system-wide daemon: the systemd unit's
     RuntimeDirectory, the DaemonSet's host path), for every user: /run/offloadd/offloadd.sock
  3. $XDG_RUNTIME_DIR set, non-empty:          $XDG_RUNTIME_DIR/offloadd/offloadd.sock
  4. otherwise:                                /tmp/offloadd-<euid>/offloadd.sock
``$OFFLOADD_SOCKET`` overrides the rule for the Python client (handy in launch scripts).
Unix socket paths are limited to 107 bytes (sizeof(sockaddr_un.sun_path) - 1).
"""

import errno
import grp
import os
import socket
import struct

MAX_SOCKET_PATH_BYTES = 107
SYSTEM_SOCKET_DIRECTORY = "/run/offloadd"
SYSTEM_SOCKET_PATH = SYSTEM_SOCKET_DIRECTORY + "/offloadd.sock"


def default_socket_path_for(euid, xdg_runtime_dir, system_directory_exists=False):
    """The rule above as a pure function; xdg_runtime_dir may be None;
    ``system_directory_exists``: whether /run/offloadd is a directory."""
    if euid == 0 or system_directory_exists:
        return SYSTEM_SOCKET_PATH
    if xdg_runtime_dir:
        return xdg_runtime_dir + "/offloadd/offloadd.sock"
    return "/tmp/offloadd-%d/offloadd.sock" % euid


def default_socket_path():
    """$OFFLOADD_SOCKET if set, else the rule above for this process."""
    env = os.environ.get("OFFLOADD_SOCKET")
    if env:
        return env
    return default_socket_path_for(os.geteuid(), os.environ.get("XDG_RUNTIME_DIR"),
                                   os.path.isdir(SYSTEM_SOCKET_DIRECTORY))


def socket_path_fits(path):
    """True when ``path`` is non-empty and fits in a sockaddr_un (<= 107 bytes)."""
    return bool(path) and len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES


def probe(path, timeout_seconds=1.0):
    """One connect() to the socket at ``path``: ``(0, daemon_uid)`` when it accepted (the
    listening process's uid, SO_PEERCRED: the daemon's, or the service manager's under socket
    activation), else ``(errno, None)``: ENOENT no file, ECONNREFUSED nobody listens, EACCES no
    permission, ETIMEDOUT no accept within ``timeout_seconds``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_seconds)
    try:
        s.connect(path)
        _pid, uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                           struct.calcsize("3i")))
        return 0, uid
    except socket.timeout:
        return errno.ETIMEDOUT, None
    except OSError as e:
        return e.errno or errno.EIO, None
    finally:
        s.close()


def group_text(gid):
    """"name (gid N)", or "gid N" for a gid without a name here."""
    try:
        return "%s (gid %d)" % (grp.getgrgid(gid).gr_name, gid)
    except KeyError:
        return "gid %d" % gid


# Groups no user should be added to: root (gid 0) opens root's files to them, nogroup (gid
# 65534, nobody's group) every unprivileged service's.
SHARED_SYSTEM_GIDS = ("0", "65534")


def join_group_remedy(group, usermod, gid):
    """The remedy once a file's group shuts this process out: join that group (``group`` as
    :func:`group_text` writes it, ``usermod`` its name or gid, ``gid`` its gid as text). Group
    root (gid 0) and nogroup (gid 65534, a daemon run as nobody) are never ones to add users to
    (:data:`SHARED_SYSTEM_GIDS`): then the daemon's socket needs a dedicated group first, set by
    socket_group (config or --socket_group)."""
    if gid in SHARED_SYSTEM_GIDS:
        return ("The daemon is fine, but its group is %s, and users must not be added to group "
                "%s. Ask its administrator to create a dedicated group (groupadd offloadd), set "
                "the daemon's socket group to it (socket_group: offloadd in the config, or "
                "--socket_group=offloadd; SocketGroup=offloadd in offloadd.socket under socket "
                "activation), restart the daemon, and add this user to that group (usermod -aG "
                "offloadd USER, then log in again), or in Kubernetes add that group's gid to the "
                "pod's securityContext.supplementalGroups" % (group, usermod))
    return ("The daemon is fine; do not restart it. Ask its administrator to add this user to "
            "group %s (usermod -aG %s USER, then log in again), or in Kubernetes add %s to the "
            "pod's securityContext.supplementalGroups" % (group, usermod, gid))


def permission_denied_reason(path):
    """Why connect() to ``path`` was refused with EACCES: the file that shuts this process out
    (the first directory on the way it may not search, else the socket), its group and mode, who
    this process is, and the remedy (:func:`join_group_remedy`: join the group; never a restart
    unless the group is root)."""
    denying, kind = path, "the socket"
    parts = path.split("/")
    for i in range(2, len(parts)):
        d = "/".join(parts[:i])
        if not os.access(d, os.X_OK, effective_ids=True):
            denying, kind = d, "its directory"
            break
    what, group, usermod, gid = "%s %s" % (kind, denying), "the socket's group", "GROUP", "its gid"
    try:
        st = os.stat(denying)
        group = group_text(st.st_gid)
        what += " (group %s, mode %04o)" % (group, st.st_mode & 0o7777)
        gid = str(st.st_gid)
        try:
            usermod = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            usermod = gid  # usermod takes a gid too
    except OSError:
        pass
    groups = sorted(set([os.getegid()] + os.getgroups()))
    return ("permission denied: %s admits only its group, and this process (uid %d, groups %s) "
            "is not in it. %s" % (what, os.geteuid(), ",".join(map(str, groups)),
                                  join_group_remedy(group, usermod, gid)))


def unreachable_reason(path, probe_errno):
    """A clause saying why the socket at ``path`` did not accept (``probe_errno`` from
    :func:`probe`), telling a permission problem from a missing or dead daemon."""
    if probe_errno in (errno.EACCES, errno.EPERM):
        return permission_denied_reason(path)
    if probe_errno == errno.ENOENT:
        return "no socket file there"
    if probe_errno == errno.ECONNREFUSED:
        return ("the socket file exists but no daemon listens on it (the socket of a daemon that "
                "exited)")
    if probe_errno == errno.ETIMEDOUT:
        return "the socket did not accept within the timeout (daemon stuck or overloaded)"
    if probe_errno == 0:
        return ("the socket accepts connections, but what listens there does not answer: the "
                "daemon is stopped (SIGSTOP, a debugger), hung or overloaded, or another "
                "program listens there (`ss -xlp | grep %s` names it)" % path)
    return "connect failed: %s" % os.strerror(probe_errno)


def no_answer_reason(path, target, seconds):
    """Why a connection to ``target`` (the socket ``path``) got no offloadd answer within
    ``seconds``: the clause of :func:`unreachable_reason` for one more connect(), and what to
    do. A socket nobody listens on (a daemon that exited) says to start the daemon; one that
    accepts without answering warns that restarting a daemon whose pool has no pool_shm_name
    ends every session's blocks."""
    err, _uid = probe(path, 0.2)
    reason = "no offloadd answered at %s within %.1f s: %s" % (
        target, seconds, unreachable_reason(path, err))
    if err == errno.ECONNREFUSED:
        return reason + "; start the daemon (systemctl start offloadd)"
    if err == 0:
        return reason + ". Restarting a daemon whose pool has no pool_shm_name ends every " \
            "session's blocks"
    return reason
