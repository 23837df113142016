#!/usr/bin/env bash
# Start-up checks of the real daemon, each refused with exit 1 and a message that says what to
# do: a pool larger than MemAvailable, mlock over RLIMIT_MEMLOCK, a socket directory it cannot
# create or write, a metrics port already taken. (The memlock check of the cuda backend and its
# decisions are unit-tested in server/pool/arena_test.cc.)
set -uo pipefail
OFFLOADD=${TEST_SRCDIR:-.}/offloadd/server/offloadd
dir=$(mktemp -d /tmp/ofd-start-XXXXXX)
chmod 0755 "$dir"
holder=
trap '[ -n "$holder" ] && kill "$holder" 2>/dev/null; rm -rf "$dir"' EXIT
failures=0
# expect NAME WANTED_TEXT CMD...: exit status 1 and WANTED_TEXT on stderr.
expect() {
  local name=$1 want=$2; shift 2
  "$@" >/dev/null 2>"$dir/err" </dev/null
  local rc=$?
  if [ "$rc" -eq 1 ] && grep -q -- "$want" "$dir/err"; then
    echo "PASS $name"
  else
    echo "FAIL $name: exit $rc, stderr:"; sed 's/^/    /' "$dir/err"; failures=$((failures + 1))
  fi
}

expect pool_larger_than_ram "larger than MemAvailable" \
  "$OFFLOADD" --socket_path="$dir/a.sock" --pool_bytes=1000TiB --metrics_address=

# A TCP port held by another process.
/usr/bin/python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(60)' >"$dir/port" &
holder=$!
for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
expect metrics_port_taken "free the port" \
  "$OFFLOADD" --socket_path="$dir/b.sock" --pool_bytes=16MiB \
  --metrics_address="127.0.0.1:$(cat "$dir/port")"
[ -S "$dir/b.sock" ] && { echo "FAIL metrics_port_taken left its socket behind"; failures=$((failures + 1)); }

if [ "$(id -u)" = 0 ] && setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
  as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
  mkdir "$dir/ro"
  expect socket_dir_not_creatable "create it or choose another socket_path" \
    as_nobody "$OFFLOADD" --socket_path="$dir/ro/sub/a.sock" --pool_bytes=16MiB --metrics_address=
  expect socket_dir_not_writable "is not writable by this user" \
    as_nobody "$OFFLOADD" --socket_path="$dir/ro/a.sock" --pool_bytes=16MiB --metrics_address=
  expect memlock_too_low "LimitMEMLOCK=infinity" \
    bash -c "ulimit -l 8192 && exec setpriv --reuid=65534 --regid=65534 --clear-groups \
      '$OFFLOADD' --socket_path='$dir/c.sock' --pool_bytes=64MiB --pool_mlock=true \
      --metrics_address="
else
  echo "SKIP socket directory and memlock checks: need root to run the daemon as uid 65534"
fi
[ "$failures" -eq 0 ] && echo "all start-up checks PASSED" || echo "$failures start-up checks FAILED"
exit $((failures > 0))
