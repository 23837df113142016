#!/usr/bin/env bash
# offloadctl stats / topo show the spill tier (its capacity, pacing and I/O) when the daemon has
# one, and nothing of it when it has none.
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
OFFLOADD=$R/server/offloadd
CTL=$R/client/cli/offloadctl
dir=$(mktemp -d /tmp/ofd-ctlspill-XXXXXX)  # short: a socket path
spill=$(mktemp -d "${TEST_TMPDIR:-/var/tmp}/ofd-ctlspill-XXXXXX")  # a disk, not tmpfs
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$dir" "$spill"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

start() {  # start ARGS...: a daemon on $dir/d.sock
  "$OFFLOADD" --socket_path="$dir/d.sock" --pool_bytes=16MiB --metrics_address= "$@" \
    >"$dir/daemon.log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    [ -S "$dir/d.sock" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  cat "$dir/daemon.log"
  pid=
  return 1
}
stop() { kill "$pid"; wait "$pid" || true; pid=; }

start
"$CTL" --socket "$dir/d.sock" stats | grep -q "^spill:" && fail "a spill line without a tier"
"$CTL" --socket "$dir/d.sock" topo | grep -q "disk link spill" && fail "a disk link without a tier"
stop

if ! start --spill_directory="$spill/d" --spill_capacity_bytes=64MiB \
     --spill_bytes_per_second=1500000000; then
  grep -q "O_DIRECT" "$dir/daemon.log" && { echo "SKIP: $spill does not take O_DIRECT"; exit 0; }
  fail "daemon with a spill tier did not start"
fi
stats=$("$CTL" --socket "$dir/d.sock" stats)
echo "$stats"
echo "$stats" | grep -Eq "^spill: 0.00 B on disk of 64.00 MiB \(0 blocks\), spilled 0 .* lost 0, write failures 0; (io_uring|posix), paced 1.50 GB/s$" \
  || fail "spill line"
topo=$("$CTL" --socket "$dir/d.sock" topo)
echo "$topo"
echo "$topo" | grep -Eq "^disk link spill  both directions 1.50 GB/s  (io_uring|posix), 0.00 B moved" \
  || fail "disk link line"
echo "PASS"
