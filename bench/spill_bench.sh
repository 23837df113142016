#!/usr/bin/env bash
# Spill tier throughput against plain O_DIRECT on the same directory, in one run (issue 18):
#   1. dd oflag=direct writes BYTES (bs=8M), dd iflag=direct reads them back: the baseline;
#   2. spill_bench spills the same bytes from a pool buffer and stages them back (SpillTier,
#      unpaced, io_uring), checking every byte;
# and prints the ratios spill/dd-write and stage/dd-read (target >= 0.9, BENCHMARKS.md).
#   bench/spill_bench.sh [DIR] [BYTES_MIB]      (default: a fresh directory under $TMPDIR, 512)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${SPILL_BENCH_BIN:-$root/bazel-bin/bench/spill_bench}
dir=${1:-$(mktemp -d "${TMPDIR:-/tmp}/offloadd-spill-bench.XXXXXX")}
mib=${2:-512}
mkdir -p "$dir"
trap 'rm -f "$dir/dd.tmp"' EXIT
rate() { sed -n 's/.* copied, \([0-9.e+-]*\) s, .*/\1/p' | awk -v b=$((mib << 20)) '{printf "%.3f", b / $1 / 1e9}'; }
dd_write=$(dd if=/dev/zero of="$dir/dd.tmp" bs=8M count=$((mib / 8)) oflag=direct conv=fsync 2>&1 | rate)
dd_read=$(dd if="$dir/dd.tmp" of=/dev/null bs=8M iflag=direct 2>&1 | rate)
rm -f "$dir/dd.tmp"
out=$("$bin" --dir="$dir" --blocks=$((mib / 64)) --block_bytes=$((64 << 20)))
spill=$(echo "$out" | sed 's/.*"spill_gbps": \([0-9.]*\).*/\1/')
stage=$(echo "$out" | sed 's/.*"stage_gbps": \([0-9.]*\).*/\1/')
echo "$out"
awk -v dw="$dd_write" -v dr="$dd_read" -v s="$spill" -v t="$stage" -v m="$mib" 'BEGIN {
  printf "{\"mib\": %d, \"dd_write_gbps\": %s, \"dd_read_gbps\": %s, \"spill_gbps\": %s, \"stage_gbps\": %s, \"spill_over_dd\": %.2f, \"stage_over_dd\": %.2f}\n",
         m, dw, dr, s, t, s / dw, t / dr }'
