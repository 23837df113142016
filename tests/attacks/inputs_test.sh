#!/usr/bin/env bash
# Hostile and mistaken inputs to the daemon's and offloadctl's command lines, each refused at
# once with its exit status and a sentence: config files and --hf-config files that are devices
# (/dev/zero, /dev/urandom: read until the OOM killer before), FIFOs without a writer (blocked
# start-up for good) or too large; integer flags beyond their field (4294967297 became 1) or not
# in decimal digits (0x10 became 16, 1e3 1000, 1.5 bytes 2), in flags and the file, sizes
# beyond 64 bits, socket modes that are not octal (0999 became mode 0), session ids beyond 64
# bits; and a socket path without a directory part, which is served in the current directory
# (it became a directory of that name). Every command runs under a time and memory bound, so a
# regression fails here instead of hanging or exhausting the machine.
set -uo pipefail
R=${TEST_SRCDIR:-.}/offloadd
OFFLOADD=$R/server/offloadd
CTL=$R/client/cli/offloadctl
dir=$(mktemp -d /tmp/ofd-inputs-XXXXXX)
daemon=
trap '[ -n "$daemon" ] && kill -9 "$daemon" 2>/dev/null; rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect NAME CODE WANTED_STDERR CMD...: CMD exits CODE within 20 s and 2 GiB of address space,
# with WANTED_STDERR (fixed text) on stderr.
expect() {
  local name=$1 code=$2 want=$3; shift 3
  (ulimit -v 2097152; exec timeout 20 "$@") >"$dir/out" 2>"$dir/err" </dev/null
  local rc=$?
  if [ "$rc" -eq "$code" ] && grep -qF -- "$want" "$dir/err"; then
    echo "PASS $name"
  else
    fail "$name: exit $rc (want $code), stderr:"; head -c 2000 "$dir/err" | sed 's/^/    /'
  fi
}

mkfifo "$dir/fifo"
common=(--socket_path="$dir/d.sock" --pool_bytes=16MiB --metrics_address=)
for f in /dev/zero /dev/urandom; do
  expect "config_$f" 2 "cannot read config file $f: it is a character device; give a regular file" \
    "$OFFLOADD" --config "$f" "${common[@]}"
  expect "check_config_$f" 2 "cannot read config file $f: it is a character device" \
    "$OFFLOADD" --check-config "$f" "${common[@]}"
  expect "plan_hf_config_$f" 1 "cannot read --hf-config file $f: it is a character device" \
    "$CTL" plan --hf-config "$f" --seq 4K
done
expect config_fifo 2 "cannot read config file $dir/fifo: it is a FIFO; give a regular file" \
  "$OFFLOADD" --config "$dir/fifo" "${common[@]}"
expect check_config_fifo 2 "cannot read config file $dir/fifo: it is a FIFO" \
  "$OFFLOADD" --check-config "$dir/fifo" "${common[@]}"
expect plan_hf_config_fifo 1 "cannot read --hf-config file $dir/fifo: it is a FIFO" \
  "$CTL" plan --hf-config "$dir/fifo" --seq 4K
head -c 1048577 /dev/zero | tr '\0' '#' >"$dir/big.conf"
expect config_too_large 2 "config file $dir/big.conf is larger than 1048576 bytes" \
  "$OFFLOADD" --check-config "$dir/big.conf" "${common[@]}"

# Values beyond their field's range, or not in decimal digits, are refused, naming the flag, the
# value and the form.
for flag in max_connections_total max_sessions max_requests_in_flight; do
  for v in 4294967296 4294967297 4294967301 0x10 1e3 1.5; do
    expect "${flag}_$v" 2 "$flag must be a whole number from 0 to 4294967295, in decimal digits only (no sign, leading 0, 0x, exponent or fraction) (got \"$v\" from --$flag=$v on the command line)" \
      "$OFFLOADD" --check-config /dev/null "${common[@]}" "--$flag=$v"
  done
done
for v in 18446744073709551616 16777216TiB; do
  expect "pool_bytes_$v" 2 "pool_bytes must be at most 18446744073709551615 bytes" \
    "$OFFLOADD" --check-config /dev/null --socket_path="$dir/d.sock" --metrics_address= \
    "--pool_bytes=$v"
done
for v in 1e30 0x10000000 1.5; do
  expect "pool_bytes_$v" 2 "pool_bytes must be a whole number of bytes in decimal digits, optionally with a size suffix" \
    "$OFFLOADD" --check-config /dev/null --socket_path="$dir/d.sock" --metrics_address= \
    "--pool_bytes=$v"
done
printf 'max_sessions: 0x10\n' >"$dir/hex.conf"
expect config_file_hex 2 "$dir/hex.conf: config: line 1 column 15: max_sessions must be a whole number from 0 to 4294967295, in decimal digits only" \
  "$OFFLOADD" --check-config "$dir/hex.conf" "${common[@]}"
expect offloadd_subcommand 2 "unexpected argument 'stats' (offloadd --help lists the options; offloadctl asks a running daemon" \
  "$OFFLOADD" stats
expect misspelt_flag 2 "unknown flag --max_session (did you mean --max_sessions?)" \
  "$OFFLOADD" --max-session=8
expect socket_mode_0999 2 "socket_mode must be an octal file mode from 0000 to 0777" \
  "$OFFLOADD" --check-config /dev/null "${common[@]}" --socket_mode=0999
expect end_session_beyond_64_bits 2 "'18446744073709551616' is not a session id" \
  "$CTL" --socket "$dir/none.sock" end-session 18446744073709551616

# A socket path without a directory part: served as a socket in the current directory, named
# by its absolute path, and removed at the stop; no directory of that name is made.
(cd "$dir" && exec "$OFFLOADD" --socket_path rel.sock --pool_bytes=16MiB --metrics_address= \
   >"$dir/daemon.out" 2>"$dir/daemon.err") &
daemon=$!
for _ in $(seq 200); do grep -q "ready on" "$dir/daemon.out" 2>/dev/null && break; sleep 0.05; done
if grep -qF "offloadd: ready on $dir/rel.sock" "$dir/daemon.out" && [ -S "$dir/rel.sock" ]; then
  echo "PASS relative_socket_path_served"
else
  fail "relative_socket_path_served: rel.sock is $(stat -c %F "$dir/rel.sock" 2>&1); out:"
  cat "$dir/daemon.out" "$dir/daemon.err" | tail -5 | sed 's/^/    /'
fi
kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; daemon=
if [ -e "$dir/rel.sock" ]; then
  fail "relative_socket_path_left: rel.sock is still there ($(stat -c %F "$dir/rel.sock"))"
else
  echo "PASS relative_socket_path_removed"
fi

[ "$failures" -eq 0 ] && echo "inputs_test: all passed" && exit 0
echo "inputs_test: $failures failed"; exit 1
