#!/usr/bin/env bash
# The Debian rootfs the systemd tests boot (tests/systemd/run.sh): bookworm, minbase, with
# systemd as init and the runtime libraries of offloadd and offloadctl (the Containerfile's list),
# made with debootstrap from deb.debian.org. Built once per machine and kept outside the
# repository; prints its path on stdout.
#
#   bash tests/systemd/rootfs.sh      # needs root and debootstrap (deploy/install-deps.sh)
#
# Cache: ${OFFLOADD_TEST_CACHE:-/var/cache/offloadd-test}/rootfs-<key>, key = a hash of the
# package list and suite below, so changing them builds a new one (older ones are removed).
# Idempotent: an existing rootfs whose stamp matches is reused at once; builders of one machine
# take a lock, and a rootfs is renamed into place only when debootstrap finished, so an
# interrupted build is never used. The tests never write into it: they boot an overlay of it.
# Measured here: 83 s idle, 278 s on a loaded 2-core machine (download and unpack, 337 MB), once.
set -euo pipefail
SUITE=bookworm
MIRROR=${OFFLOADD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=systemd,systemd-sysv,dbus,libabsl20220623,libc-ares2,libcivetweb1,libgflags2.2,\
libgoogle-glog0v6,libgrpc++1.51,libgrpc29,libprometheus-cpp-core1.0,libprometheus-cpp-pull1.0,\
libprotobuf32,libre2-9,libssl3,libunwind8,libopenblas0-pthread,liblapacke,liburing2,libnuma1,\
libsystemd0,libcap2-bin
cache=${OFFLOADD_TEST_CACHE:-/var/cache/offloadd-test}
key=$(printf '%s\n' "$SUITE" "$PACKAGES" minbase | sha256sum | cut -c1-12)
rootfs=$cache/rootfs-$SUITE-$key
if [ -f "$rootfs/.offloadd-rootfs" ]; then
  echo "$rootfs"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v debootstrap >/dev/null; then
  echo "tests/systemd/rootfs.sh: needs root and debootstrap (deploy/install-deps.sh)" >&2
  exit 1
fi
mkdir -p "$cache"
exec 9>"$cache/rootfs.lock"
flock 9
if [ -f "$rootfs/.offloadd-rootfs" ]; then  # another builder finished meanwhile
  echo "$rootfs"
  exit 0
fi
tmp=$cache/.building-$key
rm -rf "$tmp"
echo "tests/systemd/rootfs.sh: debootstrap $SUITE into $rootfs (once per machine)" >&2
start=$(date +%s)
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$MIRROR" >"$cache/debootstrap-$key.log" 2>&1 || {
  tail -20 "$cache/debootstrap-$key.log" >&2
  echo "tests/systemd/rootfs.sh: debootstrap failed (log: $cache/debootstrap-$key.log)" >&2
  exit 1
}
# No getty or other consoles: the tests talk to systemd through systemctl.
rm -f "$tmp"/etc/systemd/system/getty.target.wants/* 2>/dev/null || true
echo "$SUITE $PACKAGES built $(date -u +%FT%TZ) in $(( $(date +%s) - start )) s" > "$tmp/.offloadd-rootfs"
mv "$tmp" "$rootfs"
for old in "$cache"/rootfs-*; do
  [ "$old" = "$rootfs" ] || rm -rf "$old"
done
echo "tests/systemd/rootfs.sh: ready in $(( $(date +%s) - start )) s" >&2
echo "$rootfs"
