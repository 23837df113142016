#!/usr/bin/env bash
# Link scheduler benchmark (BENCHMARKS.md, "Link scheduler"): builds the daemon, offloadctl and
# bench/sched_bench:sched_client, then runs bench/sched_bench/sched_bench.py (about 35 s): 8
# client processes saturating 4 simulated links, then a half-duplex link and a host link.
# Extra arguments go to the driver (e.g. --rate-gbps 0.25, --quick). Exit 1 if a target is
# missed, 2 on set-up errors.
set -euo pipefail
cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}
$BAZEL build -c opt //server:offloadd //client/cli:offloadctl //bench/sched_bench:sched_client \
  >/dev/null 2>&1 || $BAZEL build -c opt //server:offloadd //client/cli:offloadctl \
  //bench/sched_bench:sched_client
bin=$(mktemp -d /tmp/ofd-sched-bench-XXXXXX)
trap 'rm -rf "$bin"' EXIT
out=bazel-out/k8-opt/bin
ln -s "$PWD/$out/server/offloadd" "$bin/offloadd"
ln -s "$PWD/$out/client/cli/offloadctl" "$bin/offloadctl"
echo "== machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%d)"
/usr/bin/python3 bench/sched_bench/sched_bench.py --bin-dir "$bin" \
  --client "$PWD/$out/bench/sched_bench/sched_client" "$@"
