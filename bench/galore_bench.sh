#!/usr/bin/env bash
# GaLore refresh steps, stock galore-torch vs offloadd.galore (bench/galore_bench.py, one process
# per mode): training pinned to CPU 0, the daemon (1 refresh worker) to CPU 1. Prints a table and,
# per mode, the amortised overhead extrapolated to update_proj_gap 200: the refresh step's extra
# time (median refresh - median normal) spread over 200 steps, as a fraction of a normal step.
#   bash bench/galore_bench.sh [STEPS]     (default 60; needs build/bin/offloadd and .venv)
# MODES (default "stock sync sync-randomized async async-lazy") runs those modes in that order;
# a mode may repeat, e.g. MODES="stock sync stock sync" to pair two modes against drift.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
STEPS=${1:-60}
dir=$(mktemp -d /tmp/ofd-galore-bench-XXXXXX)
daemon=""
cleanup() { [ -n "$daemon" ] && kill -TERM "$daemon" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
pin_train="" pin_daemon=""
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  pin_train="taskset -c 0" pin_daemon="taskset -c 1"
fi
echo "projector { workers: 1 }" > "$dir/offloadd.conf"
$pin_daemon build/bin/offloadd --config "$dir/offloadd.conf" --socket_path "$dir/d.sock" \
  --pool_bytes 64MiB --metrics_address= > "$dir/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$dir/d.sock" ] && break; sleep 0.1; done
echo "machine: $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "pinning: training '${pin_train:-none}', daemon '${pin_daemon:-none}'"
# The daemon's OpenBLAS kernels (docs/galore.md "Projector BLAS kernels"). An OPENBLAS_CORETYPE in this
# environment reaches the daemon and is taken as the operator's pin: it is shown here, not changed.
grep -o 'projector BLAS: .*' "$dir/daemon.log" | sed 's/^/daemon /'
env | grep '^OPENBLAS_' | sed 's/^/environment (the daemon inherits it): /'
for mode in ${MODES:-stock sync sync-randomized async async-lazy}; do
  PYTHONPATH=client/python OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $pin_train "$PY" \
    bench/galore_bench.py --mode "$mode" --socket "$dir/d.sock" --steps "$STEPS" \
    >> "$dir/results.jsonl" 2> "$dir/$mode.err" || { cat "$dir/$mode.err"; exit 1; }
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$dir/results.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| mode | first step (s) | median normal step (s) | median refresh step (s) | refresh / normal | wall (s) | peak RSS (MiB) | final loss | overhead at gap 200 |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    n, f = r["median_normal_step_seconds"], r["median_refresh_step_seconds"]
    print("| %s | %.3f | %.3f | %.3f | %.2fx | %.1f | %.0f | %.4f | %.2f%% |" % (
        r["mode"], r["first_step_seconds"], n, f, f / n, r["wall_seconds"],
        r["peak_rss_bytes"] / 2**20, r["final_loss"], 100 * (f - n) / 200 / n))
for r in rows:
    if "routing" in r:
        print(r["mode"], r["routing"])
PYEOF
