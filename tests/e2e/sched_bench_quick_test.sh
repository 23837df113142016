#!/usr/bin/env bash
# Short run of the link scheduler benchmark (bench/sched_bench/sched_bench.py --quick): the real
# daemon on the shm backend with paced links and 13 client processes; asserts per-link fairness,
# the 2:1 weighted share, urgent-before-prefetch latency, the offload minimum share on a
# half-duplex link and fairness at both levels under a host link, with loose bounds.
# Shares and latencies are timings: on a shared machine whose CPUs are taken away (the clients
# then cannot keep their links saturated) a run can miss them, so a timing miss (exit 1) is run
# again, up to 3 runs in all. A client error or an unclean daemon exit (exit 3) and a set-up
# error (exit 2) fail at once.
set -uo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
bin=$(mktemp -d /tmp/sbq-XXXXXX)
trap 'rm -rf "$bin"' EXIT
ln -s "$R/server/offloadd" "$bin/offloadd"
ln -s "$R/client/cli/offloadctl" "$bin/offloadctl"
for run in 1 2 3; do
  /usr/bin/python3 "$R/bench/sched_bench/sched_bench.py" --quick --bin-dir "$bin" \
    --client "$R/bench/sched_bench/sched_client"
  rc=$?
  [ "$rc" -eq 1 ] || exit "$rc"
  echo "sched_bench_quick_test: run $run missed a timing target"
done
exit 1
