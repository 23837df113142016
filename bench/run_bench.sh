#!/usr/bin/env bash
# `make bench`: every benchmark of offloadd in one run on this machine; prints each result and
# writes them to build/bench/*.txt. Figures are ratios within one run (docs/ARCHITECTURE.md: shared,
# noisy machines); copy them into BENCHMARKS.md with the command, machine and date.
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
$BIN/offloadctl --socket "$sock" bench | tee "$OUT/daemon_bench.txt" || rc=1
# Small-request path: one 4 KiB request vs a bare gRPC ping-pong, interleaved in one process.
echo "== small requests vs a bare gRPC ping-pong (small_request_bench, same daemon)"
$BAZEL build -c opt //bench/small_request:small_request_bench >/dev/null 2>&1 || rc=1
bazel-out/k8-opt/bin/bench/small_request/small_request_bench --socket="$sock" \
  | tee "$OUT/small_request_bench.txt" || rc=1
kill -TERM "$daemon"; wait "$daemon"; daemon=
# Whether the client and the server share a core decides a round trip on a small machine (22 vs
# 48 us here): pin the daemon and the bare server to CPU 0, the client to CPU 0 then CPU 1, so
# both sides of each ratio see the same placement.
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  taskset -c 0 $BIN/offloadd --socket_path "$sock" --pool_bytes 1GiB --metrics_address= \
    > "$OUT/daemon_pinned.log" 2>&1 &
  daemon=$!
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  for client_cpu in 0 1; do
    echo "-- pinned: daemon and bare server on CPU 0, client on CPU $client_cpu"
    taskset -c "$client_cpu" bazel-out/k8-opt/bin/bench/small_request/small_request_bench \
      --socket="$sock" --bare_server_cpu=0 | tee -a "$OUT/small_request_bench.txt" || rc=1
  done
  kill -TERM "$daemon"; wait "$daemon"; daemon=
fi

echo "== allocator overhead under a variable-size trace (Google Benchmark)"
$BAZEL run -c opt //bench:allocator_bench 2>/dev/null | tee "$OUT/allocator_bench.txt" || rc=1

echo "== simulated GPU copy engines: the cuda copy path on a timing model (SIMULATED, no bytes moved)"
$BAZEL run -c opt //bench:copy_sim_bench 2>"$OUT/copy_sim_bench.log" | tee "$OUT/copy_sim_bench.txt" || rc=1
$BAZEL run -c opt //bench:copy_sim_bench -- --gpus=2 --gpus_per_switch=1 --placement=local \
  2>>"$OUT/copy_sim_bench.log" | tee -a "$OUT/copy_sim_bench.txt" || rc=1

echo "== spill tier: spill write and stage-back vs dd O_DIRECT on the same directory"
$BAZEL build -c opt //bench:spill_bench >/dev/null 2>&1 || rc=1
SPILL_BENCH_BIN=bazel-out/k8-opt/bin/bench/spill_bench bash bench/spill_bench.sh \
  "${SPILL_BENCH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/offloadd-spill-bench.XXXXXX")}" 512 \
  2>"$OUT/spill_bench.log" | tee "$OUT/spill_bench.txt" || rc=1

echo "== the reference study's table through the daemon (SIMULATED; bench/study_table.py, ~10 min)"
.venv/bin/python bench/study_table.py --bin "$BIN" --json "$OUT/study_table.json" \
  | tee "$OUT/study_table.txt" || rc=1

echo "== the hooks' cost per saved tensor: training thread, client threads, requests (bench/hook_overhead.py)"
$BAZEL build -c opt //bench:native_floor_hooks.so >/dev/null 2>&1 || rc=1
.venv/bin/python bench/hook_overhead.py --bin "$BIN" --json "$OUT/hook_overhead.json" \
  | tee "$OUT/hook_overhead.txt" || rc=1
echo "-- the same with the daemons' timed ring polls off (every submission wakes the daemon)"
.venv/bin/python bench/hook_overhead.py --bin "$BIN" --layouts split --ring-poll-seconds 0 \
  --json "$OUT/hook_overhead_no_poll.json" | tee "$OUT/hook_overhead_no_poll.txt" || rc=1
echo "== the hooks' instructions and cache misses per saved tensor (cachegrind; bench/hook_instructions.py, ~20 min)"
.venv/bin/python bench/hook_instructions.py --bin "$BIN" --json "$OUT/hook_instructions.json" \
  | tee "$OUT/hook_instructions.txt" || rc=1
echo "-- the Python a saved tensor runs, by where it lives (the simulated device, offloadd, torch)"
.venv/bin/python bench/hook_instructions.py --bin "$BIN" --python-ops \
  --variants noop,store-front,cuda-sim,cuda-sim-pyhook,cuda-sim-pyreload \
  | tee "$OUT/hook_python_ops.txt" || rc=1

echo "== GaLore projector refresh on the CPU backend (LAPACK, exact and randomized)"
$BAZEL run -c opt //bench:projector_bench 2>/dev/null | tee "$OUT/projector_bench.txt" || rc=1

for extra in bench/sched_bench.sh bench/torch_bench.sh bench/galore_bench.sh; do
  echo "== $extra"
  bash "$extra" | tee "$OUT/$(basename "$extra" .sh).txt" || rc=1
done
$BAZEL shutdown >/dev/null 2>&1 || true
exit $rc
