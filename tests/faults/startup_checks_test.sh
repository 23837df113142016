#!/usr/bin/env bash
# Start-up checks of the real daemon, each refused with exit 1 and a message that says what to
# do: a pool larger than MemAvailable, mlock over RLIMIT_MEMLOCK, a socket directory it cannot
# create or write, a metrics port already taken, a socket another daemon serves (reported before
# the pool: a 1000 TiB pool on a taken socket names the socket). --check-config on a host that
# cannot run the config: exit 1 with every problem in start-up order; config file errors with
# the errno text and size suffixes. (The memlock check (pool_mlock only) and its decisions are
# unit-tested in server/pool/arena_test.cc, the host checks in server/host_check_test.cc.)
set -uo pipefail
OFFLOADD=${TEST_SRCDIR:-.}/offloadd/server/offloadd
dir=$(mktemp -d /tmp/ofd-start-XXXXXX)
chmod 0755 "$dir"
holder=
trap '[ -n "$holder" ] && kill "$holder" 2>/dev/null; rm -rf "$dir"' EXIT
failures=0
# expect NAME WANTED_TEXT CMD...: exit status $code (1 unless set) and WANTED_TEXT on stderr.
expect() {
  local name=$1 want=$2 code=${code:-1}; shift 2
  "$@" >/dev/null 2>"$dir/err" </dev/null
  local rc=$?
  if [ "$rc" -eq "$code" ] && grep -qF -- "$want" "$dir/err"; then
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
taken="127.0.0.1:$(cat "$dir/port")"
expect metrics_port_taken "cannot serve metrics on $taken: the address is in use" \
  "$OFFLOADD" --socket_path="$dir/b.sock" --pool_bytes=16MiB --metrics_address="$taken"
grep -q "null context" "$dir/err" && { echo "FAIL metrics_port_taken shows the HTTP server's text"; failures=$((failures + 1)); }
[ -S "$dir/b.sock" ] && { echo "FAIL metrics_port_taken left its socket behind"; failures=$((failures + 1)); }
# --check-config finds it too, with the remedy.
printf 'pool_bytes: 16MiB\n' >"$dir/metrics.conf"
expect check_config_metrics_port_taken "--metrics_address= to serve no metrics" \
  "$OFFLOADD" --check-config "$dir/metrics.conf" --socket_path="$dir/b.sock" \
  --metrics_address="$taken"

# A daemon serving a socket; a second one on it is refused before it maps (or checks) its pool.
"$OFFLOADD" --socket_path="$dir/live.sock" --pool_bytes=16MiB --metrics_address= \
  >"$dir/live.log" 2>&1 &
live=$!
for _ in $(seq 100); do [ -S "$dir/live.sock" ] && break; sleep 0.05; done
expect second_daemon_socket_before_pool "another offloadd is already listening on $dir/live.sock" \
  "$OFFLOADD" --socket_path="$dir/live.sock" --pool_bytes=1000TiB --metrics_address=
grep -q "MemAvailable" "$dir/err" && { echo "FAIL second daemon also checked its pool"; failures=$((failures + 1)); }

# --check-config: a valid config this host cannot run names each problem, in start-up order.
printf 'backend: "cuda"\npool_bytes: 1000TiB\nmetrics_address: ""\n' >"$dir/big.conf"
if [ -e /dev/nvidiactl ]; then
  expect check_config_host_memory "larger than MemAvailable" \
    "$OFFLOADD" --check-config "$dir/big.conf" --socket_path="$dir/c.sock"
else
  expect check_config_host_cuda_then_memory "this host cannot run it (2 problems" \
    "$OFFLOADD" --check-config "$dir/big.conf" --socket_path="$dir/c.sock"
  sed -n 2p "$dir/err" | grep -q 'backend "cuda" needs the NVIDIA driver' \
    && sed -n 3p "$dir/err" | grep -q "larger than MemAvailable" \
    || { echo "FAIL problems not in start-up order:"; cat "$dir/err"; failures=$((failures + 1)); }
fi
# A live daemon on the socket is a note, not a failure (ExecStartPre runs after it stopped).
printf 'pool_bytes: 16MiB  # a size with a suffix\nmetrics_address: ""\n' >"$dir/ok.conf"
if "$OFFLOADD" --check-config "$dir/ok.conf" --socket_path="$dir/live.sock" >"$dir/out" 2>&1 \
   && grep -q "note: another offloadd is already listening" "$dir/out" \
   && grep -q "is valid and this host can run it" "$dir/out"; then
  echo "PASS check_config_live_socket_is_a_note"
else
  echo "FAIL check_config_live_socket_is_a_note:"; cat "$dir/out"; failures=$((failures + 1))
fi
kill "$live"; wait "$live" 2>/dev/null

# --check-config with flags checks the file alone too: a file a daemon started without the flags
# (systemd's ExecStart) refuses passes with the flags (exit 0) and a note naming the file's
# problem; a valid one's verdict names the flags.
printf 'ring_poll_seconds: 0.5\nmetrics_address: ""\npool_bytes: 16MiB\n' >"$dir/poll.conf"
if "$OFFLOADD" --check-config "$dir/poll.conf" --socket_path="$dir/p.sock" \
     --ring_poll_seconds=0.001 >"$dir/out" 2>&1 \
   && grep -qF "offloadd: note: $dir/poll.conf alone is not valid (invalid config: ring_poll_seconds must be 0" "$dir/out" \
   && grep -qF "it is valid only with the command-line flags given (--socket_path=$dir/p.sock --ring_poll_seconds=0.001)" "$dir/out"; then
  echo "PASS check_config_file_alone_invalid_noted"
else
  echo "FAIL check_config_file_alone_invalid_noted:"; cat "$dir/out"; failures=$((failures + 1))
fi
printf 'metrics_address: ""\npool_bytes: 16MiB\n' >"$dir/poll_ok.conf"
if "$OFFLOADD" --check-config "$dir/poll_ok.conf" --ring_poll_seconds=0.001 \
     --socket_path="$dir/p.sock" >"$dir/out" 2>&1 \
   && grep -qF "$dir/poll_ok.conf with --ring_poll_seconds=0.001 --socket_path=$dir/p.sock from the command line is valid and this host can run it" "$dir/out"; then
  echo "PASS check_config_with_flags_names_them"
else
  echo "FAIL check_config_with_flags_names_them:"; cat "$dir/out"; failures=$((failures + 1))
fi

# --config next to --check-config naming another file was ignored without a word.
code=2 expect check_config_and_another_config \
  "--check-config $dir/poll_ok.conf checks that file as --config would read it, and --config $dir/poll.conf names another: give one of them" \
  "$OFFLOADD" --config "$dir/poll.conf" --check-config "$dir/poll_ok.conf"

# Config file errors: errno text, directories, sizes the parser cannot read.
code=2 expect config_missing_errno "cannot read config file $dir/none.conf: No such file or directory" \
  "$OFFLOADD" --config "$dir/none.conf"
code=2 expect config_is_directory "it is a directory" "$OFFLOADD" --check-config "$dir"
printf 'copy_threads: 2\npool_bytes: 16M\n' >"$dir/m.conf"
code=2 expect config_size_suffix_unknown "KiB MiB GiB TiB KB MB GB TB" \
  "$OFFLOADD" --check-config "$dir/m.conf"
code=2 expect check_config_needs_file "--check-config needs a FILE" "$OFFLOADD" --check-config
printf 'pool_bytes: 16MiB\n' >"$dir/n.conf"
code=2 expect config_given_twice "--config is given twice ($dir/m.conf and $dir/n.conf)" \
  "$OFFLOADD" --config "$dir/m.conf" --config "$dir/n.conf"
code=2 expect check_config_given_twice "--check-config is given twice" \
  "$OFFLOADD" --check-config "$dir/n.conf" --check-config "$dir/m.conf"
printf 'links { name: "sw" gpus: ["GPU-a", "GPU-a"] }\npool_bytes: 16MiB\n' >"$dir/l.conf"
code=2 expect gpu_twice_in_one_link "link 'sw' lists GPU GPU-a twice; list each GPU once" \
  "$OFFLOADD" --check-config "$dir/l.conf"

if [ "$(id -u)" = 0 ] && setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
  as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
  mkdir "$dir/ro"
  expect socket_dir_not_creatable "create it or choose another socket_path" \
    as_nobody "$OFFLOADD" --socket_path="$dir/ro/sub/a.sock" --pool_bytes=16MiB --metrics_address=
  expect socket_dir_not_writable "is not writable by this user" \
    as_nobody "$OFFLOADD" --socket_path="$dir/ro/a.sock" --pool_bytes=16MiB --metrics_address=
  mkdir "$dir/nobody" && chown 65534:65534 "$dir/nobody"
  expect memlock_too_low "LimitMEMLOCK=infinity" \
    bash -c "ulimit -l 8192 && exec setpriv --reuid=65534 --regid=65534 --clear-groups \
      '$OFFLOADD' --socket_path='$dir/nobody/c.sock' --pool_bytes=64MiB --pool_mlock=true \
      --metrics_address="
  printf 'pool_bytes: 64MiB\npool_mlock: true\nmetrics_address: ""\n' >"$dir/mlock.conf"
  chmod 0644 "$dir/mlock.conf"
  expect check_config_host_memlock_and_socket_dir "this host cannot run it (2 problems" \
    bash -c "ulimit -l 8192 && exec setpriv --reuid=65534 --regid=65534 --clear-groups \
      '$OFFLOADD' --check-config '$dir/mlock.conf' --socket_path='$dir/ro/a.sock'"
  sed -n 2p "$dir/err" | grep -q "is not writable by this user" \
    && sed -n 3p "$dir/err" | grep -q "RLIMIT_MEMLOCK" \
    || { echo "FAIL check-config as nobody:"; cat "$dir/err"; failures=$((failures + 1)); }
else
  echo "SKIP socket directory and memlock checks: need root to run the daemon as uid 65534"
fi
# RLIMIT_NOFILE: a hard limit below what the connection and session bounds need refuses the
# start with the fix; a soft limit below it is raised toward the hard one.
expect nofile_hard_limit_too_low "RLIMIT_NOFILE allows 1024 open files (hard limit 1024)" \
  prlimit --nofile=1024:1024 "$OFFLOADD" --socket_path="$dir/n.sock" --pool_bytes=16MiB \
  --metrics_address=
prlimit --nofile=1024:8192 "$OFFLOADD" --socket_path="$dir/r.sock" --pool_bytes=16MiB \
  --metrics_address= >"$dir/r.log" 2>&1 &
raised=$!
for _ in $(seq 100); do [ -S "$dir/r.sock" ] && break; sleep 0.05; done
soft=$(awk '/Max open files/ {print $4}' "/proc/$raised/limits")
kill "$raised"; wait "$raised" 2>/dev/null
if [ "${soft:-0}" -ge 5408 ]; then
  echo "PASS nofile_soft_limit_raised ($soft)"
else
  echo "FAIL nofile_soft_limit_raised: soft limit ${soft:-?}"; sed 's/^/    /' "$dir/r.log"
  failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] && echo "all start-up checks PASSED" || echo "$failures start-up checks FAILED"
exit $((failures > 0))
