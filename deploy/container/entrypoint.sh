#!/bin/sh
# offloadd-entrypoint: the DaemonSet container's entrypoint (installed as
# /usr/local/bin/offloadd-entrypoint by deploy/container/Containerfile).
#
#   offloadd-entrypoint [OFFLOADD_FLAGS...]
#       checks the config and the host (offloadd --check-config: socket directory, CUDA driver,
#       memlock, MemAvailable, spill directory, shared pool object; what ExecStartPre does in
#       the systemd unit), then execs the
#       daemon with the same flags. A failed check exits with its status (2 invalid config,
#       1 the host cannot run it) and its reasons on stderr, so the pod's log says why.
#   offloadd-entrypoint prepare-socket-dir DIR UID GID
#       as root (the init container): creates DIR, owned by UID:GID, mode 0750: the daemon
#       (UID) creates its socket there, members of GID (training pods' supplementalGroups)
#       may reach it.
#
# Environment: OFFLOADD_CONFIG (default /etc/offloadd/offloadd.conf), OFFLOADD_BIN (default the
# directory of this script).
set -eu
bin=${OFFLOADD_BIN:-$(dirname "$0")}
config=${OFFLOADD_CONFIG:-/etc/offloadd/offloadd.conf}

if [ "${1:-}" = prepare-socket-dir ]; then
  if [ $# -ne 4 ]; then
    echo "usage: offloadd-entrypoint prepare-socket-dir DIR UID GID" >&2
    exit 2
  fi
  mkdir -p "$2"
  chown "$3:$4" "$2"
  chmod 0750 "$2"
  echo "offloadd-entrypoint: $2 is $(stat -c '%U(%u):%G(%g) %a' "$2")"
  exit 0
fi

if [ ! -r "$config" ]; then
  echo "offloadd-entrypoint: cannot read $config: mount the ConfigMap there (daemonset.yaml) or set OFFLOADD_CONFIG" >&2
  exit 2
fi
"$bin/offloadd" --check-config "$config" "$@"
exec "$bin/offloadd" --config "$config" "$@"
