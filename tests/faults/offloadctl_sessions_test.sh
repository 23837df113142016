#!/usr/bin/env bash
# offloadctl sessions / end-session against the real daemon: the session list shows the client's
# pid and uid and its block, end-session releases it and the client sees the reason, unknown ids
# and non-admin users are refused, a non-admin sees only its own sessions.
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
OFFLOADD=$R/server/offloadd
CTL=$R/client/cli/offloadctl
CLIENT=$R/tests/faults/fault_client
dir=$(mktemp -d /tmp/ofd-ctl-XXXXXX)
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
fail() { echo "FAIL: $*"; exit 1; }

chmod 0755 "$dir"
"$OFFLOADD" --socket_path="$sock" --socket_mode=0666 --pool_bytes=16MiB --metrics_address= \
  >"$dir/daemon.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { cat "$dir/daemon.log"; fail "daemon did not start"; }

"$CLIENT" --mode=hold --socket="$sock" >"$dir/hold.out" &
hold=$!
pids+=($hold)
for _ in $(seq 200); do grep -q ready "$dir/hold.out" && break; sleep 0.05; done
sid=$(awk '/ready/ {print $2}' "$dir/hold.out")
[ -n "$sid" ] || fail "client not ready"

out=$("$CTL" --socket "$sock" sessions)
echo "$out"
echo "$out" | grep -Eq "^ +$sid +fault_client hold +gpu-hold +$hold +$(id -u) +$(id -g) +1 " \
  || fail "session $sid with pid $hold, uid $(id -u) and 1 block not listed"
"$CTL" --socket "$sock" sessions --json | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
assert len(s["sessions"]) == 1 and s["sessions"][0]["peer_known"], s
assert int(s["pool_used_bytes"]) >= 1 << 20, s'

if "$CTL" --socket "$sock" end-session 999999 2>"$dir/err"; then fail "unknown id accepted"; fi
grep -q "no open session has id 999999" "$dir/err" || fail "unknown id: $(cat "$dir/err")"

if [ "$(id -u)" = 0 ]; then
  # uid 65534 is not an admin: it sees no session of root's and may not end one.
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$CTL" --socket "$sock" sessions)
  grep -q "not an admin" <<<"$out" || fail "non-admin view not marked: $out"
  grep -q "fault_client hold" <<<"$out" && fail "non-admin sees root's session"
  if setpriv --reuid=65534 --regid=65534 --clear-groups "$CTL" --socket "$sock" \
       end-session "$sid" 2>"$dir/err"; then
    fail "non-admin ended a session"
  fi
  grep -q "needs an admin" "$dir/err" || fail "non-admin refusal: $(cat "$dir/err")"
fi

# A session holding blocks is not ended without --force; a --reason without its text is refused.
if "$CTL" --socket "$sock" end-session "$sid" --reason "no force" 2>"$dir/err"; then
  fail "a session holding a block was ended without --force"
fi
grep -q "holds 1 blocks" "$dir/err" && grep -q "end-session --force" "$dir/err" \
  || fail "no-force refusal: $(cat "$dir/err")"
set +e; "$CTL" --socket "$sock" end-session "$sid" --force --reason 2>"$dir/err"; rc=$?; set -e
[ "$rc" = 2 ] && grep -q -- "--reason needs a value" "$dir/err" \
  || fail "--reason without a value: rc $rc, $(cat "$dir/err")"
"$CTL" --socket "$sock" sessions | grep -Eq "^ +$sid " || fail "the refusals ended the session"

"$CTL" --socket "$sock" end-session "$sid" --force --reason "drain node for test" \
  | tee "$dir/end.out"
grep -q "released 1 blocks" "$dir/end.out" || fail "end-session did not report the block"
wait "$hold" || fail "client exit status"
grep -q "drain node for test" "$dir/hold.out" || fail "client did not see the reason: $(cat "$dir/hold.out")"
"$CTL" --socket "$sock" sessions --json | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
assert not s.get("sessions") and int(s["pool_used_bytes"]) == 0, s'
# The audit log: the session's open and close, the admin's call with its reason, and the refused
# calls of the non-admin.
grep -q "audit: session_open session=$sid client=\"fault_client hold\"" "$dir/daemon.log" \
  || fail "no session_open audit line: $(grep audit "$dir/daemon.log")"
grep -q "audit: end_session by_uid=$(id -u) by_pid=[0-9]* session=$sid reason=\"drain node for test\" outcome=OK blocks=1" \
  "$dir/daemon.log" || fail "no end_session audit line: $(grep audit "$dir/daemon.log")"
grep -q "audit: session_close session=$sid cause=admin blocks=1" "$dir/daemon.log" \
  || fail "no session_close audit line: $(grep audit "$dir/daemon.log")"
grep -q "audit: end_session by_uid=$(id -u) .*session=$sid reason=\"no force\" outcome=FAILED_PRECONDITION" \
  "$dir/daemon.log" || fail "the refused call without --force is not audited"
if [ "$(id -u)" = 0 ]; then
  grep -q "audit: end_session by_uid=65534 .*session=$sid .*outcome=PERMISSION_DENIED" \
    "$dir/daemon.log" || fail "the refused call is not audited: $(grep audit "$dir/daemon.log")"
fi
echo "PASS"

# offloadctl health opens no session: with every session slot taken it still answers SERVING
# (it used to say hello, and so failed with RESOURCE_EXHAUSTED when the slots were full).
sock2=$dir/full.sock
"$OFFLOADD" --socket_path="$sock2" --socket_mode=0666 --pool_bytes=16MiB --metrics_address= \
  --max_sessions=1 --max_sessions_per_uid=1 >"$dir/daemon2.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock2" ] && break; sleep 0.05; done
[ -S "$sock2" ] || { cat "$dir/daemon2.log"; fail "second daemon did not start"; }
"$CLIENT" --mode=hold --socket="$sock2" >"$dir/hold2.out" &
pids+=($!)
for _ in $(seq 200); do grep -q ready "$dir/hold2.out" && break; sleep 0.05; done
grep -q ready "$dir/hold2.out" || fail "holding client not ready: $(cat "$dir/hold2.out")"
out=$("$CTL" --socket "$sock2" health) || fail "health with the session slots full: $out"
[ "$out" = SERVING ] || fail "health said: $out"
if [ "$(id -u)" = 0 ]; then
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups "$CTL" --socket "$sock2" health) \
    || fail "non-admin health with the session slots full: $out"
  [ "$out" = SERVING ] || fail "non-admin health said: $out"
fi
echo PASS health without a session
