#!/usr/bin/env bash
# Boots systemd as PID 1 of new PID, mount and cgroup namespaces over an overlay of the cached
# rootfs; run by tests/systemd/test_systemd.py as
#   unshare --pid --fork --mount --cgroup --propagation private bash boot.sh ROOTFS WORK
# ROOTFS (read-only lower layer, tests/systemd/rootfs.sh), WORK/upper and WORK/work (the overlay's
# writable layers, pre-filled by the test), WORK/merged (the root systemd sees). The caller put
# this process in a cgroup of its own (name=systemd hierarchy), which the cgroup namespace makes
# systemd's root. Everything mounted here dies with the namespace. /dev/shm is the host's, so the
# shared pool and the shm regions of clients on the host meet the daemon's.
set -euo pipefail
lower=$1 work=$2
root=$work/merged
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/work" "$root"
mount -t proc proc "$root/proc"
mount -t sysfs -o ro sysfs "$root/sys"
mount -t tmpfs -o mode=0755 tmpfs "$root/sys/fs/cgroup"
mkdir "$root/sys/fs/cgroup/systemd"
mount -t cgroup -o none,name=systemd cgroup "$root/sys/fs/cgroup/systemd"
mount -t tmpfs -o mode=0755 tmpfs "$root/dev"
for node in null zero full random urandom tty; do
  touch "$root/dev/$node"
  mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir "$root/dev/shm" "$root/dev/pts"
mount --bind /dev/shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
mount -t tmpfs -o mode=0755 tmpfs "$root/run"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
export container=offloadd-test
exec chroot "$root" /lib/systemd/systemd --log-level=notice
