#!/usr/bin/env bash
# Runs every test suite of offloadd and ends with one line "N passed, N failed" over all of them:
#   1. Bazel tests (C++ unit tests beside the code, tests/e2e integration and multi-process tests,
#      the short chaos soaks of tests/soak: plain ~50 s, with the spill tier active ~30 s)
#   2. Python tests (client/python/tests: protocol client, torch hooks, planner)
#   3. monitoring/deployment tests (manifests, promtool, live Prometheus scrape)
#   4. a short libFuzzer run over the session request handling (make fuzz, 15 s)
#   5. a smoke run of `make demo` with a small workload
#   6. function length: no function in server/ over 60 code lines (tests/function_length.py)
# Exit status is non-zero when anything failed. Stops the Bazel server at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}
rc=0
results=$(mktemp -d)
trap 'rm -rf "$results"; $BAZEL shutdown >/dev/null 2>&1 || true' EXIT

echo "== bazel test"
$BAZEL test //... --keep_going --test_output=errors 2>&1 | tee "$results/bazel.log" | grep -vE '^\[[0-9,]+ / [0-9,]+\]|^INFO: From|^Loading|^Analyzing'
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
$BAZEL query 'tests(//...)' 2>/dev/null > "$results/targets"
/usr/bin/python3 tests/count_bazel_results.py "$results/targets" bazel-out/k8-opt/testlogs > "$results/bazel.count" || rc=1

echo "== python tests"
if [ -x tests/python/run.sh ] || [ -f tests/python/run.sh ]; then
  OFFLOADD_BIN="$PWD/build/bin/offloadd" bash tests/python/run.sh 2>&1 | tee "$results/python.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
/usr/bin/python3 tests/count_unittest_results.py "$results/python.log" > "$results/python.count" || rc=1

echo "== monitoring and deployment tests"
bash tests/monitoring/run.sh 2>&1 | tee "$results/monitoring.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
/usr/bin/python3 tests/count_unittest_results.py "$results/monitoring.log" > "$results/monitoring.count" || rc=1

echo "== fuzz (short)"
# libFuzzer over the session request handling for FUZZ_SECONDS (15) from the seed corpus; the
# full run is `make fuzz`. The corpus and regressions are also replayed by bazel test above.
if command -v clang++ >/dev/null; then
  if make -s fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-15}" > "$results/fuzz.log" 2>&1; then
    echo "fuzz: PASSED ($(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$results/fuzz.log"))"
    echo "1 0" > "$results/fuzz.count"
  else
    tail -40 "$results/fuzz.log"; echo "fuzz: FAILED (inputs in build/fuzz/crash-* etc.)"
    echo "0 1" > "$results/fuzz.count"; rc=1
  fi
else
  echo "fuzz: skipped (no clang++; deploy/install-deps.sh installs it)"
fi

echo "== demo smoke test"
if /usr/bin/python3 bench/demo.py --bin build/bin --clients 2 --layers 6 \
     --layer-bytes 2MiB --steps 2 --pool-bytes 64MiB --quiet > "$results/demo.log" 2>&1; then
  echo "demo: PASSED"; echo "1 0" > "$results/demo.count"
else
  cat "$results/demo.log"; echo "demo: FAILED"; echo "0 1" > "$results/demo.count"; rc=1
fi

echo "== function length"
if /usr/bin/python3 tests/function_length_test.py > "$results/function_length.log" 2>&1 &&
   /usr/bin/python3 tests/function_length.py >> "$results/function_length.log" 2>&1; then
  tail -1 "$results/function_length.log"; echo "1 0" > "$results/function_length.count"
else
  cat "$results/function_length.log"; echo "0 1" > "$results/function_length.count"; rc=1
fi

echo "== layering"
if BAZEL=$BAZEL bash tests/layering_check.sh > "$results/layering.log" 2>&1; then
  tail -1 "$results/layering.log"; echo "1 0" > "$results/layering.count"
else
  cat "$results/layering.log"; echo "0 1" > "$results/layering.count"; rc=1
fi

passed=0; failed=0
for f in "$results"/*.count; do
  read -r p fl < "$f"
  echo "  $(basename "$f" .count): $p passed, $fl failed"
  passed=$((passed + p)); failed=$((failed + fl))
done
[ "$failed" -eq 0 ] || rc=1
echo "$passed passed, $failed failed"
exit $rc
