#!/usr/bin/env bash
# `make bench`: every benchmark of offloadd in one run on this machine; prints each result and
# writes them to build/bench/*.txt. Figures are ratios within one run (DESIGN.md: shared, noisy
# machines); copy them into BENCHMARKS.md with the command, machine and date.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
OUT=build/bench
mkdir -p "$OUT"
BAZEL=${BAZEL:-bazel}
rc=0
sock_dir=$(mktemp -d /tmp/ofd-bench-XXXXXX)
sock=$sock_dir/d.sock
cleanup() { [ -n "${daemon:-}" ] && kill -TERM "$daemon" 2>/dev/null; wait 2>/dev/null; rm -rf "$sock_dir"; }
trap cleanup EXIT

echo "== machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(date -u +%Y-%m-%d)"

echo "== offload+reload throughput vs memcpy, small-request latency and rate (offloadctl bench)"
$BIN/offloadd --socket_path "$sock" --pool_bytes 1GiB --metrics_address= > "$OUT/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
# Issue 16 part 4: a bare gRPC ping-pong before and after, so the small-request ratio is measured
# in one run (offloadctl's 4 KiB round trip is two requests: offload, then reload).
$BAZEL build -c opt //bench/pingpong:grpc_pingpong >/dev/null 2>&1 || rc=1
pingpong=bazel-out/k8-opt/bin/bench/pingpong/grpc_pingpong
$pingpong | tee "$OUT/pingpong_before.txt" || rc=1
$BIN/offloadctl --socket "$sock" bench | tee "$OUT/daemon_bench.txt" || rc=1
$pingpong | tee "$OUT/pingpong_after.txt" || rc=1
kill -TERM "$daemon"; wait "$daemon"; daemon=
awk '/^direct:/ {bare += $3; n++}
     /4 KiB offload\+reload round trip/ {for (i = 1; i <= NF; i++) if ($i == "p50") rt = $(i + 1)}
     END {if (n && rt) printf "small-request ratio: one 4 KiB request p50 %.1f us (round trip %.0f / 2) / bare gRPC ping-pong p50 %.1f us = %.2f (target <= 1.5)\n", rt / 2, rt, bare / n, rt / 2 / (bare / n)}' \
  "$OUT/pingpong_before.txt" "$OUT/daemon_bench.txt" "$OUT/pingpong_after.txt" | tee "$OUT/small_request_ratio.txt"

echo "== allocator overhead under a variable-size trace (Google Benchmark)"
$BAZEL run -c opt //bench:allocator_bench 2>/dev/null | tee "$OUT/allocator_bench.txt" || rc=1

echo "== simulated GPU copy engines: the cuda copy path on a timing model (SIMULATED, no bytes moved)"
$BAZEL run -c opt //bench:copy_sim_bench 2>"$OUT/copy_sim_bench.log" | tee "$OUT/copy_sim_bench.txt" || rc=1
$BAZEL run -c opt //bench:copy_sim_bench -- --gpus=1 --gpus_per_switch=1 \
  2>>"$OUT/copy_sim_bench.log" | tee -a "$OUT/copy_sim_bench.txt" || rc=1

for extra in bench/sched_bench.sh bench/projector_bench.sh bench/torch_bench.sh; do
  if [ -f "$extra" ]; then
    echo "== $extra"
    bash "$extra" | tee "$OUT/$(basename "$extra" .sh).txt" || rc=1
  fi
done
$BAZEL shutdown >/dev/null 2>&1 || true
exit $rc
