"""Shared-memory regions that client processes of a test harness left behind in /dev/shm.

The C++ client names a region "offloadd-<pid>-<pidns>-<n>-<hex>" (client/shm_region.cc): the
creator's pid and the inode of its PID namespace. A client killed by a signal, or one that dies on
its own, never unlinks its regions. A harness calls remove_dead() once its clients are reaped: it
unlinks the regions made in this harness's PID namespace, by this uid, whose creator no longer
runs, and returns how many it removed. Names of live processes and of other namespaces are kept.
"""
import os
import re

_NAME = re.compile(r"^offloadd-(\d+)-(\d+)-\d+-[0-9a-f]+$")


def pid_namespace():
    """The inode of this process's PID namespace ("pid:[N]" -> N); 0 when unreadable."""
    try:
        m = re.match(r"pid:\[(\d+)\]$", os.readlink("/proc/self/ns/pid"))
    except OSError:
        return 0
    return int(m.group(1)) if m else 0


def remove_dead(shm_dir="/dev/shm"):
    ns = pid_namespace()
    removed = 0
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return 0
    for name in names:
        m = _NAME.match(name)
        if not m or ns == 0 or int(m.group(2)) != ns or os.path.exists("/proc/" + m.group(1)):
            continue
        path = os.path.join(shm_dir, name)
        try:
            if os.stat(path).st_uid == os.geteuid():
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return removed
