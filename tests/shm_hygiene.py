#!/usr/bin/python3
"""/dev/shm as `make test` found it: no shared-memory object outlives its owner.

    shm_hygiene.py snapshot FILE     records the names in /dev/shm
    shm_hygiene.py check FILE        exit 1 listing the names that appeared since the snapshot
                                     and whose owner is gone

A name counts as left behind when it was not there at the snapshot and either embeds the pid of
a process that no longer runs (offloadd's names carry their creator's pid: "offloadd-<pid>-...",
"ofd-...-<pid>-...", "offloadd-soak-<pid>") or embeds no pid at all. Objects of processes still
running (another checkout's tests on a shared machine) are not this run's leaks. Prints one line
per leftover and "shm hygiene: N left behind".
"""
import os
import re
import sys


def names():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def owner_alive(name):
    """True when some number in the name is the pid of a live process; None when it has none."""
    pids = [int(c) for c in re.split(r"[-_.]", name) if c.isdigit() and len(c) <= 7 and int(c) > 1]
    if not pids:
        return None
    return any(os.path.exists("/proc/%d" % p) for p in pids)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("snapshot", "check"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    path = sys.argv[2]
    if sys.argv[1] == "snapshot":
        with open(path, "w") as f:
            f.write("\n".join(sorted(names())))
        return 0
    with open(path) as f:
        before = set(f.read().split())
    left = sorted(n for n in names() - before if owner_alive(n) is not True)
    for n in left:
        print("left behind in /dev/shm: %s" % n)
    print("shm hygiene: %d left behind" % len(left))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
