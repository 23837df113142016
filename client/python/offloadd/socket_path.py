"""The default Unix-socket path of offloadd; the same rule as client/socket_path.h.

First match wins:
  1. effective uid 0:                  /run/offloadd/offloadd.sock
  2. $XDG_RUNTIME_DIR set, non-empty:  $XDG_RUNTIME_DIR/offloadd/offloadd.sock
  3. otherwise:                        /tmp/offloadd-<euid>/offloadd.sock
``$OFFLOADD_SOCKET`` overrides the rule for the Python client (handy in launch scripts).
Unix socket paths are limited to 107 bytes (sizeof(sockaddr_un.sun_path) - 1).
"""

import os

MAX_SOCKET_PATH_BYTES = 107


def default_socket_path_for(euid, xdg_runtime_dir):
    """The rule above as a pure function; xdg_runtime_dir may be None."""
    if euid == 0:
        return "/run/offloadd/offloadd.sock"
    if xdg_runtime_dir:
        return xdg_runtime_dir + "/offloadd/offloadd.sock"
    return "/tmp/offloadd-%d/offloadd.sock" % euid


def default_socket_path():
    """$OFFLOADD_SOCKET if set, else the rule above for this process."""
    env = os.environ.get("OFFLOADD_SOCKET")
    if env:
        return env
    return default_socket_path_for(os.geteuid(), os.environ.get("XDG_RUNTIME_DIR"))


def socket_path_fits(path):
    """True when ``path`` is non-empty and fits in a sockaddr_un (<= 107 bytes)."""
    return bool(path) and len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES
