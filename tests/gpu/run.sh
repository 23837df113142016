#!/bin/bash
# offloadd GPU check: runs every GPU test from the bundle made by `make gpu-bundle`
# (deploy/make_gpu_bundle.sh) and prints the figures, with the copy timing model's figures next
# to the real engine's (step 1b, calibration). One H200, < 8 minutes.
#
#   gpu-bundle/run.sh            # from anywhere; writes logs under $OUT or /tmp/offloadd-gpu-*
#
# The bundle holds prebuilt binaries (bin/), every shared library they load except the driver's
# libcuda and glibc (lib/; used only by our binaries, through LD_LIBRARY_PATH on their command
# line, never exported to Python), the pure-Python client (python/) and this script. Without a
# CUDA driver every check prints SKIPPED and the script exits 0.
set -u
here=$(cd "$(dirname "$0")" && pwd)
logs=${OUT:-$(mktemp -d /tmp/offloadd-gpu-XXXXXX)}
mkdir -p "$logs"
LIB="$here/lib"
PY=${PYTHON:-python3}
sock=/tmp/offloadd-gpu-$$.sock
fails=0
figures="$logs/figures.txt"
: > "$figures"
start_s=$(date +%s)

say() { echo "== $*"; }
run() {  # run NAME TIMEOUT CMD...: our binaries, with the bundled libraries
  local name=$1 t=$2; shift 2
  LD_LIBRARY_PATH="$LIB" timeout "$t" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  grep -E "^(PASS|FAIL|SKIPPED|FIGURE|\[  PASSED|\[  FAILED)" "$logs/$name.log"
  grep "^FIGURE" "$logs/$name.log" >> "$figures"
  if [ $rc -ne 0 ]; then
    echo "FAIL: $name exited $rc (log: $logs/$name.log)"; tail -5 "$logs/$name.log"
    fails=$((fails + 1))
  fi
  return $rc
}
figure() { echo "FIGURE $*" | tee -a "$figures"; }
fig() { awk -v n="$1" '$2 == n { print $3 }' "$figures" | tail -1; }

say "bundle $(cat "$here/MANIFEST" 2>/dev/null | head -1)"
# 0. Fake-based unit tests of the cuda engine and client export (no GPU needed).
run unit_engine 60 "$here/bin/cuda_engine_test" --gtest_brief=1
run unit_export 60 "$here/bin/cuda_export_test" --gtest_brief=1

# 1. Kernels vs CPU references (skips without a driver).
run kernels 120 "$here/bin/kernels_gpu_check"
if grep -q "^SKIPPED" "$logs/kernels.log"; then
  echo "SKIPPED: no usable CUDA driver/GPU here; nothing else to run (unit tests above ran)"
  exit $(( fails > 0 ))
fi
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,memory.total --format=csv,noheader \
  2>/dev/null | sed 's/^/gpu: /'

# 1b. Calibration of the copy timing model (issue 16): copy_sim_bench's workload through the
# real cuda engine on this machine's GPUs (--backend=cuda), then the model (cuda-sim) with the
# same configuration; per chunk size the achieved GB/s per direction and the urgent reload
# latency in chunk-times (of CALIB_RATE_GBPS, the model's rate, default 55), side by side.
# Runs before the daemon starts, on idle GPUs; ~15 s.
say "calibration: real cuda engine vs the timing model, same workload"
ngpu=$(nvidia-smi --list-gpus 2>/dev/null | wc -l); [ "$ngpu" -ge 1 ] || ngpu=1
[ "$ngpu" -le 8 ] || ngpu=8
calib="--gpus=$ngpu --gpus_per_switch=$ngpu --numa_nodes=1 --placement=local --engine=sync,async \
  --chunk_mib=1,8,32 --repeats=3 --seconds=0.5 --rate_gbps=${CALIB_RATE_GBPS:-55} --figures=1"
# shellcheck disable=SC2086
run calib_measured 120 "$here/bin/copy_sim_bench" --backend=cuda $calib
# shellcheck disable=SC2086
run calib_model 120 "$here/bin/copy_sim_bench" --backend=sim $calib
grep -E "^(sync|async|engine)" "$logs/calib_measured.log" | sed 's/^/measured: /'
grep -E "^(sync|async|engine)" "$logs/calib_model.log" | sed 's/^/model:    /'
for e in sync async; do for c in 1 8 32; do
  m=$(grep "^FIGURE copy_measured_${e}_local_${c}MiB " "$logs/calib_measured.log")
  s=$(grep "^FIGURE copy_model_${e}_local_${c}MiB " "$logs/calib_model.log")
  [ -n "$m" ] && [ -n "$s" ] || continue
  # FIGURE <name> d2h <GB/s> GB/s h2d <GB/s> GB/s urgent_reload_median <chunk-times> ...
  md=$(echo "$m" | awk '{ print $4 }'); mh=$(echo "$m" | awk '{ print $7 }')
  mu=$(echo "$m" | awk '{ print $10 }')
  sd=$(echo "$s" | awk '{ print $4 }'); sh=$(echo "$s" | awk '{ print $7 }')
  su=$(echo "$s" | awk '{ print $10 }')
  figure "calib_${e}_${c}MiB d2h measured $md GB/s model $sd GB/s ($(awk -v a="$md" -v b="$sd" \
    'BEGIN { printf "%.2f", a / b }')x); h2d measured $mh model $sh GB/s ($(awk -v a="$mh" \
    -v b="$sh" 'BEGIN { printf "%.2f", a / b }')x); urgent reload median measured $mu model $su chunk-times"
done; done

# 2. The daemon, backend cuda, 16 GiB pool (pinned in the background).
say "starting offloadd (backend cuda)"
LD_LIBRARY_PATH="$LIB" "$here/bin/offloadd" --backend=cuda --pool_bytes=16GiB \
  --socket_path="$sock" --chunk_bytes=8MiB --copy_threads=2 --metrics_address= \
  > "$logs/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 1 600); do
  grep -q "ready on" "$logs/daemon.log" && break
  kill -0 $daemon 2>/dev/null || break
  sleep 0.1
done
if ! grep -q "ready on" "$logs/daemon.log"; then
  echo "FAIL: offloadd did not start:"; tail -20 "$logs/daemon.log"; exit 1
fi
E2E="$here/bin/gpu_e2e"

# 3. Device memory of the daemon's own CUDA context (first client: no context before it).
run context 60 "$E2E" --mode=context --socket="$sock"

# 4. Wait for the pinned pool (reported by the daemon), then two clients moving real memory.
for _ in $(seq 1 600); do
  grep -q "host pool pinned\|pinning the host pool failed" "$logs/daemon.log" && break
  sleep 0.1
done
grep -o "host pool pinned.*\|pinning the host pool failed.*" "$logs/daemon.log" | head -1 |
  sed 's/^/daemon: /' || true
grep -q "host pool pinned" "$logs/daemon.log" ||
  echo "NOTE: the daemon did not report a pinned pool (PrepareHostPool not wired in main.cc?):" \
       "its rates below come from pageable memory"
say "two clients, 16 x 64 MiB each, checksums on the device"
LD_LIBRARY_PATH="$LIB" timeout 120 "$E2E" --mode=data --socket="$sock" --seed=1 \
  > "$logs/data1.log" 2>&1 &
c1=$!
LD_LIBRARY_PATH="$LIB" timeout 120 "$E2E" --mode=data --socket="$sock" --seed=2 \
  > "$logs/data2.log" 2>&1 &
c2=$!
wait $c1; r1=$?
wait $c2; r2=$?
for n in 1 2; do grep -E "^(PASS|FAIL|FIGURE)" "$logs/data$n.log" | sed "s/^/client $n: /"; done
[ $r1 -eq 0 ] && [ $r2 -eq 0 ] || { echo "FAIL: data clients exited $r1 $r2"; fails=$((fails+1)); }

# 5. One client alone: the rate through the daemon vs cudaMemcpyAsync on a pinned buffer.
run data_alone 120 "$E2E" --mode=data --socket="$sock" --seed=3 --small_requests=0
run baseline 60 "$E2E" --mode=baseline --tensor_mib=64
for d in d2h h2d; do
  ours=$(awk -v n="daemon_${d}_GBps" '$2 == n { v = $3 } END { print v }' "$logs/data_alone.log")
  base=$(fig "baseline_${d}_GBps")
  [ -n "$ours" ] && [ -n "$base" ] &&
    figure "ratio_${d}_daemon_vs_cudaMemcpyAsync $(awk -v a="$ours" -v b="$base" \
      'BEGIN { printf "%.2f", a / b }') (daemon $ours GB/s, cudaMemcpyAsync $base GB/s)"
done

# 6. Reload-after-offload ordering in a tight loop.
run ordering 120 "$E2E" --mode=ordering --socket="$sock" --iterations=200 --tensor_mib=64

# 7. A client killed with copies in flight: copies drain, handle closes, extents return.
say "client killed with copies in flight"
LD_LIBRARY_PATH="$LIB" "$E2E" --mode=data --socket="$sock" --seed=4 --tensors=48 \
  > "$logs/killed.log" 2>&1 &
victim=$!
for _ in $(seq 1 3000); do
  grep -q "^OFFLOADING" "$logs/killed.log" && break
  kill -0 $victim 2>/dev/null || break
  sleep 0.01
done
sleep 0.02  # 48 x 64 MiB take ~60 ms at 50 GB/s: copies are in flight now
kill -9 $victim 2>/dev/null; wait $victim 2>/dev/null
grep -q "^OFFLOADING" "$logs/killed.log" || { echo "FAIL: the victim never started"; fails=$((fails+1)); }
sleep 2
PYTHONPATH="$here/python" timeout 30 "$PY" - "$sock" > "$logs/after_kill.log" 2>&1 <<'PYEOF'
import sys
from offloadd.client import Client
c = Client(socket_path=sys.argv[1], client_name="gpu-check stats", device_id="stats")
s = c.get_stats()
print("FIGURE after_kill_pool_used_bytes %d bytes" % s.pool_used_bytes)
print("FIGURE after_kill_blocks %d blocks" % s.blocks)
print("FIGURE after_kill_sessions_open %d sessions (this one included)" % s.sessions_open)
c.close()
sys.exit(0 if s.pool_used_bytes == 0 and s.blocks == 0 else 1)
PYEOF
rc=$?; cat "$logs/after_kill.log" | grep -E "^FIGURE|Error" ; grep "^FIGURE" "$logs/after_kill.log" >> "$figures"
[ $rc -eq 0 ] || { echo "FAIL: the killed client's blocks were not released"; fails=$((fails+1)); }

# 8. Handle cache: opens in the daemon vs requests made.
opens=$(grep -c "opened IPC memory handle" "$logs/daemon.log")
closes=$(grep -c "closed IPC memory handle" "$logs/daemon.log")
figure "ipc_handle_opens $opens opens for 6 client processes with 1 region each (~2,600 requests)"
figure "ipc_handle_closes $closes closes"
[ "$opens" -eq "$closes" ] || { echo "FAIL: $opens handle opens but $closes closes"; fails=$((fails+1)); }
[ "$opens" -eq 6 ] || { echo "FAIL: expected 6 handle opens (one per region)"; fails=$((fails+1)); }

# 9. PyTorch example model on CUDA (the machine's python3 with torch, grpcio, protobuf).
say "PyTorch example model: gradients, step times, memory"
PYTHONPATH="$here/python" timeout 300 "$PY" "$here/torch_check.py" --socket="$sock" \
  --python-root="$here/python" > "$logs/torch.log" 2>&1
rc=$?
grep -E "^(torch|PASS|FAIL|SKIPPED|FIGURE)" "$logs/torch.log"; grep "^FIGURE" "$logs/torch.log" >> "$figures"
[ $rc -eq 0 ] || { echo "FAIL: torch_check exited $rc"; tail -15 "$logs/torch.log"; fails=$((fails+1)); }

# 9b. The real-stack acceptance on CUDA tensors: the reference study's Qwen3 step at two sequence
# lengths (peak GPU memory and step time per mode) and 5 Trainer steps, with this machine's
# torch and Transformers (SKIPPED where Transformers is missing).
say "Transformers: seed Qwen3 step and Trainer on CUDA"
PYTHONPATH="$here/python" timeout 600 "$PY" "$here/transformers_check.py" --socket="$sock" \
  --fixture-dir="$here" > "$logs/transformers.log" 2>&1
rc=$?
grep -E "^(torch|PASS|FAIL|SKIPPED|FIGURE)" "$logs/transformers.log"
grep "^FIGURE" "$logs/transformers.log" >> "$figures"
[ $rc -eq 0 ] || { echo "FAIL: transformers_check exited $rc"; tail -15 "$logs/transformers.log"; fails=$((fails+1)); }

# 10. Clean stop.
kill -TERM $daemon; wait $daemon; drc=$?
[ $drc -eq 0 ] || { echo "FAIL: offloadd exited $drc on SIGTERM"; fails=$((fails+1)); }
grep -E "context on|host pool pinned" "$logs/daemon.log" | sed 's/^.*cuda: /daemon: /'

say "figures ($(( $(date +%s) - start_s )) s; logs in $logs)"
cat "$figures"
if [ $fails -gt 0 ]; then echo "RESULT: $fails failure(s)"; exit 1; fi
echo "RESULT: all GPU checks passed"
