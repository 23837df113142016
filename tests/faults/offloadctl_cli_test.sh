#!/usr/bin/env bash
# offloadctl as a new user meets it: every unknown command, option or argument (and an empty
# --socket) is named and refused with exit 2; a socket path with nothing there, or a socket file
# no daemon listens on, fails with exit 1 and the advice, before any connect timeout; a socket
# this user may not open is explained by its mode; against a real daemon, `topo` on a fresh
# daemon says why it shows no links, `stats` and `sessions` list the same sessions,
# `sessions --json` holds only session fields, and `bench` leaves no link behind (its sessions
# say transient_device).
set -uo pipefail
R=${TEST_SRCDIR:-.}/offloadd
OFFLOADD=$R/server/offloadd
CTL=$R/client/cli/offloadctl
CLIENT=$R/tests/faults/fault_client
dir=$(mktemp -d /tmp/ofd-cli-XXXXXX)
sock=$dir/d.sock
pids=()
# SIGTERM, then wait: a fault_client unlinks its shm region as it exits (the sandbox would
# SIGKILL what still runs when this script ends, leaving the name in /dev/shm).
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect NAME CODE WANTED_STDERR ARGS...: offloadctl ARGS exits CODE with WANTED on stderr.
expect() {
  local name=$1 code=$2 want=$3; shift 3
  "$CTL" "$@" >"$dir/out" 2>"$dir/err" </dev/null
  local rc=$?
  if [ "$rc" -eq "$code" ] && grep -qF -- "$want" "$dir/err"; then
    echo "PASS $name"
  else
    fail "$name: exit $rc (want $code), stderr: $(cat "$dir/err")"
  fi
}

expect unknown_command 2 "unknown command 'foo'" foo
expect unknown_global_option 2 "unknown option '--sock'" --sock "$sock" stats
expect socket_without_path 2 "--socket needs a path" --socket
expect no_command 2 "no command given" --socket "$sock"
expect stats_unknown_flag 2 "offloadctl stats: unknown argument '--jsn'" --socket "$sock" stats --jsn
expect topo_extra_argument 2 "offloadctl topo: unknown argument '--json'" --socket "$sock" topo --json
expect health_extra_argument 2 "offloadctl health: unknown argument 'now'" --socket "$sock" health now
expect sessions_unknown_flag 2 "unknown argument '--all'" --socket "$sock" sessions --all
expect end_session_unknown_flag 2 "unexpected argument '--forse'" --socket "$sock" end-session 3 --forse
expect end_session_bad_id 2 "'abc' is not a session id" --socket "$sock" end-session abc
expect bench_unknown_flag 2 "unknown option --blocksize" --socket "$sock" bench --blocksize=4
expect bench_bad_size 2 "--block_bytes must be a positive size" --socket "$sock" bench --block_bytes 64Mi
# An unknown name is named before its value is read; dashes read as underscores.
expect bench_unknown_flag_with_value 2 "unknown option --bogus" --socket "$sock" bench --bogus=8MiB
expect bench_dashes 2 "--block_bytes must be a positive size" --socket "$sock" bench --block-bytes 64Mi
expect bench_dashes_count 2 "--latency-requests takes a positive count, not 'x'" \
  --socket "$sock" bench --latency-requests x
expect bench_missing_value 2 "--rounds needs a value" --socket "$sock" bench --rounds
expect plan_unknown_flag 2 "unknown flag --sequence" plan --sequence 4K

# Nothing at the path: exit 1 with the advice, from the presence check (the gRPC connect timeout
# says "could not connect ... within 5 s" instead).
for cmd in stats health topo sessions bench "end-session 3"; do
  # shellcheck disable=SC2086
  expect "missing_socket_$cmd" 1 "no offloadd socket at unix:$sock (No such file or directory)" \
    --socket "$sock" $cmd
  grep -q "OFFLOADD_SOCKET" "$dir/err" || fail "missing_socket_$cmd: no advice: $(cat "$dir/err")"
done
OFFLOADD_SOCKET=$sock expect missing_socket_from_env 1 "no offloadd socket at unix:$sock" stats
# An empty --socket is refused, not read as the default path.
expect socket_empty 2 "--socket needs a path, not an empty one" --socket "" stats
expect socket_empty_equals 2 "--socket needs a path, not an empty one" --socket= health

# A socket file nobody listens on (its daemon exited without removing it): exit 1 saying so, not
# gRPC's "failed to connect to all addresses ... Connection refused".
stale=$dir/stale.sock
/usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$stale"
for cmd in stats health topo sessions; do
  expect "stale_socket_$cmd" 1 \
    "no offloadd listens at unix:$stale: the socket file exists but no daemon listens on it" \
    --socket "$stale" $cmd
  grep -q "restart offloadd" "$dir/err" || fail "stale_socket_$cmd: no advice: $(cat "$dir/err")"
  ! grep -q "failed to connect" "$dir/err" ||
    fail "stale_socket_$cmd: gRPC's text: $(cat "$dir/err")"
done

# A listener that is not offloadd (it closes each connection at once): exit 1 saying the socket
# accepts but no offloadd answers, gRPC's words only after that.
other=$dir/other.sock
/usr/bin/python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(64)
while True:
    s.accept()[0].close()' "$other" &
pids+=($!)
for _ in $(seq 100); do [ -S "$other" ] && break; sleep 0.05; done
for cmd in stats health sessions; do
  expect "other_listener_$cmd" 1 "the socket accepted the connection but no offloadd answered" \
    --socket "$other" $cmd
  grep -q "another program listens there" "$dir/err" ||
    fail "other_listener_$cmd: no advice: $(cat "$dir/err")"
done

chmod 0755 "$dir"
"$OFFLOADD" --socket_path="$sock" --pool_bytes=64MiB --metrics_address= >"$dir/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { cat "$dir/daemon.log"; fail "daemon did not start"; exit 1; }

# A user the socket does not admit: exit 1 naming the socket, its group and the remedy (not
# gRPC's bare "failed to connect"). Needs root to run offloadctl as nobody, from a copy that
# nobody may execute (the runfiles may lie under a private home).
# (Inside a sandbox whose user namespace maps root alone, setpriv cannot become nobody: skipped.)
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null &&
    setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
  cp "$CTL" "$dir/offloadctl" && chmod 0755 "$dir/offloadctl"
  setpriv --reuid=65534 --regid=65534 --clear-groups "$dir/offloadctl" --socket "$sock" stats \
    >"$dir/out" 2>"$dir/err" </dev/null
  rc=$?
  if [ "$rc" -eq 1 ] && grep -qF "cannot reach unix:$sock: permission denied: the socket" \
      "$dir/err" && grep -qF "usermod" "$dir/err"; then
    echo "PASS socket_not_admitting_this_user"
  else
    fail "socket_not_admitting_this_user: exit $rc, stderr: $(cat "$dir/err")"
  fi
  # The mode decides the words: 0600 and 0755 admit only the owner even to a member of the
  # socket's group (gid 0 here), 0000 no one but root; none of them is "admits only its group".
  # expect_as_nobody NAME MODE REGID WANTED...: stats as uid 65534 on $sock chmod'ed to MODE.
  expect_as_nobody() {
    local name=$1 mode=$2 regid=$3; shift 3
    chmod "$mode" "$sock"
    setpriv --reuid=65534 --regid="$regid" --clear-groups "$dir/offloadctl" --socket "$sock" \
      stats >"$dir/out" 2>"$dir/err" </dev/null
    local rc=$? want ok=1
    for want in "$@"; do grep -qF -- "$want" "$dir/err" || ok=0; done
    grep -qF "admits only its group" "$dir/err" && ok=0
    if [ "$rc" -eq 1 ] && [ "$ok" -eq 1 ]; then echo "PASS $name"; else
      fail "$name: exit $rc, stderr: $(cat "$dir/err")"; fi
  }
  expect_as_nobody owner_only_socket_group_member 0600 0 \
    "gives its group root (gid 0), which this process (uid 65534, groups 0) is in, no write (w," \
    "only its owner, root (uid 0), may connect" "--socket_mode=0660 --socket_group=offloadd"
  expect_as_nobody owner_only_socket_outsider 0600 65534 "gives neither its group root (gid 0)" \
    "nor other users write (w, which connecting needs) permission: only its owner"
  expect_as_nobody group_without_write 0755 0 \
    "is in, no write (w, which connecting needs) permission: only its owner"
  expect_as_nobody socket_mode_0000 0000 0 "no user but root may connect" "or run this as root"
  chmod 0660 "$sock"
  # A stale socket this user may not open: no daemon listens, so never "the daemon is fine".
  chmod 0660 "$stale"
  setpriv --reuid=65534 --regid=65534 --clear-groups "$dir/offloadctl" --socket "$stale" stats \
    >"$dir/out" 2>"$dir/err" </dev/null
  rc=$?
  if [ "$rc" -eq 1 ] && grep -qF "No daemon listens on it" "$dir/err" &&
      ! grep -qiF "the daemon is fine" "$dir/err"; then
    echo "PASS stale_socket_not_admitting_this_user"
  else
    fail "stale_socket_not_admitting_this_user: exit $rc, stderr: $(cat "$dir/err")"
  fi
else
  echo "SKIP socket_not_admitting_this_user and the socket mode checks: needs root, setpriv" \
    "and uid 65534 to run as another user"
fi

out=$("$CTL" --socket "$sock" topo)
grep -q "^no links yet: a link appears when a GPU's first copy is scheduled" <<<"$out" \
  && echo "PASS topo_fresh_daemon" || fail "topo on a fresh daemon: $out"

"$CLIENT" --mode=hold --socket="$sock" >"$dir/hold.out" &
hold=$!
pids+=($hold)
for _ in $(seq 200); do grep -q ready "$dir/hold.out" && break; sleep 0.05; done
sid=$(awk '/ready/ {print $2}' "$dir/hold.out")
[ -n "$sid" ] || fail "fault_client not ready"

# stats and sessions: the same one session (the held client), stats not counting its own query.
before=$failures
stats=$("$CTL" --socket "$sock" stats)
sessions=$("$CTL" --socket "$sock" sessions)
grep -q "^sessions open: 1$" <<<"$stats" || fail "stats does not show 1 session: $stats"
[ "$(echo "$stats" | grep -c '^  session ')" -eq 1 ] || fail "stats lists other than 1: $stats"
grep -qE "^  session $sid +fault_client hold" <<<"$stats" || fail "stats lacks $sid: $stats"
[ "$(echo "$sessions" | grep -cE '^ +[0-9]+ ')" -eq 1 ] || fail "sessions lists other than 1"
grep -qE "^ +$sid +fault_client hold" <<<"$sessions" || fail "sessions lacks $sid: $sessions"
[ "$failures" -eq "$before" ] && echo "PASS stats_and_sessions_agree"

"$CTL" --socket "$sock" sessions --json >"$dir/sessions.json" || fail "sessions --json exit $?"
/usr/bin/python3 - "$dir/sessions.json" "$sid" <<'PY' && echo "PASS sessions_json_fields" || fail "sessions --json"
import json, sys
s = json.load(open(sys.argv[1]))
want = {"sessions", "sessions_filtered", "uid_usage", "session_quota_bytes", "uid_quota_bytes",
        "pool_capacity_bytes", "pool_used_bytes"}
assert set(s) == want, sorted(set(s) ^ want)
assert [x["session_id"] for x in s["sessions"]] == [sys.argv[2]], s["sessions"]
assert int(s["pool_used_bytes"]) == 1 << 20 and int(s["pool_capacity_bytes"]) == 64 << 20, s
PY

# Both flag forms, and a size suffix, as `plan` takes them.
"$CTL" --socket "$sock" bench --blocks=2 --block_bytes 1MiB --rounds 1 \
  --latency_requests=10 --rate_requests=40 --window=4 >"$dir/bench.out" 2>&1 \
  || fail "bench: $(cat "$dir/bench.out")"
"$CTL" --socket "$sock" stats --json | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
bench = [l["name"] for l in s.get("links", []) if l["name"] != "gpu-hold"]
assert bench == [], bench  # transient_device: the bench link went with its sessions
sessions = [x["client_name"] for x in s.get("sessions", [])]
assert sessions == ["fault_client hold"], sessions' && echo "PASS bench_links" || fail "bench links"

[ "$failures" -eq 0 ] && echo "all offloadctl checks PASSED" || echo "$failures offloadctl checks FAILED"
exit $((failures > 0))
