#!/usr/bin/env bash
# Spill tier throughput against plain O_DIRECT on the same directory, in one run:
#   1. dd oflag=direct writes BYTES (bs=8M), dd iflag=direct reads them back: the baseline;
#   2. spill_bench spills the same bytes from a pool buffer and stages them back (SpillTier,
#      unpaced, io_uring), checking every byte;
# and prints the ratios spill/dd-write and stage/dd-read (target >= 0.9, BENCHMARKS.md);
#   3. the CRC32C's cost: spill_bench with checksums off and on, ROUNDS (2) times each, the order
#      swapped every round (off-on, on-off, ...: a disk whose rate drifts during the run favours
#      neither side), and the stage-back throughput with / without (target >= 0.97: <= 3 % of
#      it), summed over the rounds and as the median of the rounds' ratios;
#   4. the same cost in one process (spill_bench --paired_rounds, PAIRED_ROUNDS=20): stage-backs
#      with and without checksums back to back, the steadier figure on a disk whose rate drifts.
#   bench/spill_bench.sh [DIR] [BYTES_MIB]      (default: a fresh directory under $TMPDIR, 512)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${SPILL_BENCH_BIN:-$root/bazel-bin/bench/spill_bench}
if [ -z "${SPILL_BENCH_BIN:-}" ]; then
  # `make build` builds the daemon, not the benchmarks: build this one (seconds, cached).
  (cd "$root" && bazel build -c opt //bench:spill_bench >/dev/null 2>&1) ||
    { echo "spill_bench.sh: cannot build //bench:spill_bench; run: bazel build -c opt //bench:spill_bench" >&2; exit 1; }
fi
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
on_stage=0; off_stage=0; on_spill=0; off_spill=0
stage_ratios=()
for r in $(seq "${ROUNDS:-2}"); do
  order="0 1"; [ $((r % 2)) = 0 ] && order="1 0"
  declare -A round=()
  for c in $order; do
    o=$("$bin" --dir="$dir" --blocks=$((mib / 64)) --block_bytes=$((64 << 20)) --checksums=$c)
    echo "$o"
    s=$(echo "$o" | sed 's/.*"spill_gbps": \([0-9.]*\).*/\1/')
    t=$(echo "$o" | sed 's/.*"stage_gbps": \([0-9.]*\).*/\1/')
    round[$c]=$t
    if [ "$c" = 1 ]; then
      on_stage=$(awk -v a="$on_stage" -v b="$t" 'BEGIN{print a + b}')
      on_spill=$(awk -v a="$on_spill" -v b="$s" 'BEGIN{print a + b}')
    else
      off_stage=$(awk -v a="$off_stage" -v b="$t" 'BEGIN{print a + b}')
      off_spill=$(awk -v a="$off_spill" -v b="$s" 'BEGIN{print a + b}')
    fi
  done
  stage_ratios+=("$(awk -v a="${round[1]}" -v b="${round[0]}" 'BEGIN{printf "%.3f", a / b}')")
  unset round
done
median=$(printf '%s\n' "${stage_ratios[@]}" | sort -n | awk '{v[NR] = $1} END {
  print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
awk -v a="$on_stage" -v b="$off_stage" -v c="$on_spill" -v d="$off_spill" -v m="$median" \
    -v rs="${stage_ratios[*]}" 'BEGIN {
  printf "{\"checksums_stage_over_none\": %.3f, \"checksums_spill_over_none\": %.3f, \"checksums_stage_round_ratios\": \"%s\", \"checksums_stage_median_round\": %.3f}\n", a / b, c / d, rs, m }'
mkdir -p "$dir/paired"
"$bin" --dir="$dir/paired" --blocks=$((mib / 64)) --block_bytes=$((64 << 20)) \
    --paired_rounds="${PAIRED_ROUNDS:-20}"
