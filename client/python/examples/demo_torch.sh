#!/usr/bin/env bash
# make demo-torch: starts an offloadd daemon (shm backend), trains the tiny transformer of
# client/python/examples with its checkpointed layer inputs offloaded to it, and stops it.
#
#   bash client/python/examples/demo_torch.sh [BIN_DIR] [train_tiny.py arguments...]
#
# BIN_DIR holds the offloadd binary (default build/bin, else bazel-bin/server). Extra arguments
# go to train_tiny.py (e.g. --steps 50 --offload-mode hooks). Exit status: the training's.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
bin_dir=${1:-build/bin}
[ $# -gt 0 ] && shift
daemon="$bin_dir/offloadd"
[ -x "$daemon" ] || daemon=bazel-bin/server/offloadd
if [ ! -x "$daemon" ]; then
  echo "demo_torch.sh: no offloadd binary in $bin_dir or bazel-bin/server: run 'make build'" >&2
  exit 1
fi
bash client/python/gen_proto.sh >/dev/null
sock=/tmp/offloadd-demo-torch-$$.sock
log=$(mktemp /tmp/offloadd-demo-torch-XXXXXX.log)
out=$(mktemp /tmp/offloadd-demo-torch-XXXXXX.out)
"$daemon" --socket_path "$sock" --pool_bytes 256MiB --metrics_address "" >"$out" 2>"$log" &
pid=$!
cleanup() {
  kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -f "$log" "$out"
}
trap cleanup EXIT
for _ in $(seq 100); do
  grep -q "offloadd: ready on" "$out" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { echo "offloadd failed to start:" >&2; cat "$log" >&2; exit 1; }
  sleep 0.1
done
if ! grep -q "offloadd: ready on" "$out"; then
  echo "offloadd did not get ready:" >&2; cat "$log" >&2; exit 1
fi
echo "demo-torch: offloadd (pid $pid) serving on $sock"
"${PYTHON:-.venv/bin/python}" client/python/examples/train_tiny.py --offload --socket "$sock" "$@"
