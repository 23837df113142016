#!/usr/bin/env bash
# The reference study's Qwen3 step through checkpointing alone, torch's save_on_cpu and offloadd
# (client/python/examples/bench_qwen3.py), against a daemon started here; part of `make bench`.
#   bash bench/torch_bench.sh [bench_qwen3.py arguments, e.g. --steps 5]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
PY=${PYTHON:-.venv/bin/python}
sock=/tmp/offloadd-torch-bench-$$.sock
log=$(mktemp /tmp/offloadd-torch-bench-XXXXXX.log)
"$BIN/offloadd" --socket_path "$sock" --pool_bytes 256MiB --metrics_address= > "$log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do grep -q "ready on" "$log" && break; sleep 0.1; done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u +%F)"
OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 "$PY" client/python/examples/bench_qwen3.py --socket "$sock" "$@"
