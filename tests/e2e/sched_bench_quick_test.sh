#!/usr/bin/env bash
# Short run of the link scheduler benchmark (bench/sched_bench/sched_bench.py --quick): the real
# daemon on the shm backend with paced links and 13 client processes; asserts per-link fairness,
# the 2:1 weighted share, urgent-before-prefetch latency, the offload minimum share on a
# half-duplex link and fairness at both levels under a host link, with loose bounds.
set -uo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
bin=$(mktemp -d /tmp/sbq-XXXXXX)
trap 'rm -rf "$bin"' EXIT
ln -s "$R/server/offloadd" "$bin/offloadd"
ln -s "$R/client/cli/offloadctl" "$bin/offloadctl"
/usr/bin/python3 "$R/bench/sched_bench/sched_bench.py" --quick --bin-dir "$bin" \
  --client "$R/bench/sched_bench/sched_client"
