#!/usr/bin/env bash
# Runs every test suite of offloadd and ends with one line "N passed, N failed" over all of them:
#   1. Bazel tests (C++ unit tests beside the code, tests/e2e integration and multi-process tests,
#      the short chaos soaks of tests/soak: plain ~50 s, with the spill tier active ~30 s), then the
#      clang thread-safety build (tests/tsa_build.sh, make tsa)
#   2. Python tests (client/python/tests: protocol client, torch hooks, planner), then the wheel
#      (make wheel) installed into a second environment with torch 2.4.1 running the hook tests
#      (tests/python/wheel_suite.sh; the environment is made once per machine, started below)
#   3. monitoring/deployment tests (manifests, kubernetes-validate, checkov, promtool, live
#      Prometheus scrape), then the systemd units under a real systemd (tests/systemd; the Debian
#      rootfs is built once per machine and cached under /var/cache/offloadd-test)
#   4. a short libFuzzer run over the session request handling and the request ring (make -j fuzz:
#      objects compiled in parallel, the two fuzzers side by side, 15 s each)
#   5. a smoke run of `make demo` with a small workload, and one on cuda-sim (link calibration,
#      the fairness scenario on a measured switch link)
#   6. the README's quick-start blocks against a daemon, and relative links in *.md
#      (tests/readme_blocks.py, tests/md_links.py)
#   7. function length: no function in server/ over 60 code lines (tests/function_length.py)
#   8. /dev/shm hygiene: no shared-memory object that appeared during the run outlives its owner
#      (tests/shm_hygiene.py; checked last)
# Exit status is non-zero when anything failed. Stops the Bazel server at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}
rc=0
results=$(mktemp -d)
trap 'rm -rf "$results"; $BAZEL shutdown >/dev/null 2>&1 || true' EXIT
/usr/bin/python3 tests/shm_hygiene.py snapshot "$results/shm.before"

# Set-up later suites need, once per machine and mostly downloads (the manifest checkers of
# deploy/tools.lock, the systemd suite's Debian rootfs, the wheel suite's torch 2.4.1
# environment): started now so it overlaps the builds
# and tests below; those suites wait for it (each script takes a lock) and reuse it next time.
bash deploy/tools-env.sh > "$results/tools-env.log" 2>&1 &
if [ "$(id -u)" -eq 0 ] && command -v debootstrap >/dev/null; then
  bash tests/systemd/rootfs.sh > "$results/rootfs.log" 2>&1 &
fi
bash tests/python/wheel_suite.sh --prepare > "$results/wheel-env.log" 2>&1 &

# Each suite's wall time is printed when the next one starts ("   (took N s)"), so a run's log
# shows where its time went.
section_start=$(date +%s)
section() {
  local now; now=$(date +%s)
  [ -z "${section_name:-}" ] || echo "   ($section_name took $((now - section_start)) s)"
  section_name=$1; section_start=$now
  [ -z "$1" ] || echo "== $1"
}

section "bazel test"
$BAZEL test //... --keep_going --test_output=errors 2>&1 | tee "$results/bazel.log" | grep -vE '^\[[0-9,]+ / [0-9,]+\]|^INFO: From|^Loading|^Analyzing'
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
$BAZEL query 'tests(//...)' 2>/dev/null > "$results/targets"
/usr/bin/python3 tests/count_bazel_results.py "$results/targets" bazel-out/k8-opt/testlogs \
  "$results/bazel.failures" > "$results/bazel.count" || rc=1

section "thread-safety analysis (clang -Wthread-safety -Werror, make tsa)"
if command -v /usr/bin/clang >/dev/null; then
  if BAZEL=$BAZEL bash tests/tsa_build.sh > "$results/tsa.log" 2>&1; then
    echo "tsa: PASSED"; echo "1 0" > "$results/tsa.count"
  else
    grep -E 'error:' "$results/tsa.log" | sort -u | head -40; echo "tsa: FAILED"
    echo "0 1" > "$results/tsa.count"; rc=1
  fi
else
  echo "tsa: skipped (no /usr/bin/clang; deploy/install-deps.sh installs it)"
fi

section "python tests"
if [ -x tests/python/run.sh ] || [ -f tests/python/run.sh ]; then
  OFFLOADD_BIN="$PWD/build/bin/offloadd" OFFLOADD_CORE_LIB="$PWD/build/bin/liboffloadd_core.so" \
    bash tests/python/run.sh 2>&1 | tee "$results/python.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
/usr/bin/python3 tests/count_unittest_results.py "$results/python.log" > "$results/python.count" || rc=1

section "python client from its wheel (torch 2.4.1 environment)"
bash tests/python/wheel_suite.sh 2>&1 | tee "$results/wheel.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
/usr/bin/python3 tests/count_unittest_results.py "$results/wheel.log" > "$results/wheel.count" || rc=1

section "monitoring and deployment tests"
bash tests/monitoring/run.sh 2>&1 | tee "$results/monitoring.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
/usr/bin/python3 tests/count_unittest_results.py "$results/monitoring.log" > "$results/monitoring.count" || rc=1

section "systemd units under systemd"
bash tests/systemd/run.sh 2>&1 | tee "$results/systemd.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
/usr/bin/python3 tests/count_unittest_results.py "$results/systemd.log" > "$results/systemd.count" || rc=1

section "fuzz (short)"
# libFuzzer over the session request handling for FUZZ_SECONDS (15) from the seed corpus; the
# full run is `make fuzz`. The corpus and regressions are also replayed by bazel test above. On
# every core (-j): one clang++ per source, then the two fuzzers side by side, each one's output
# kept together in the log (--output-sync).
if command -v clang++ >/dev/null; then
  if make -s -j"$(nproc)" --output-sync=target fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-15}" \
       > "$results/fuzz.log" 2>&1; then
    echo "fuzz: PASSED ($(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$results/fuzz.log"))"
    echo "1 0" > "$results/fuzz.count"
  else
    tail -40 "$results/fuzz.log"; echo "fuzz: FAILED (inputs in build/fuzz/crash-* etc.)"
    echo "0 1" > "$results/fuzz.count"; rc=1
  fi
else
  echo "fuzz: skipped (no clang++; deploy/install-deps.sh installs it)"
fi

section "demo smoke test"
if /usr/bin/python3 bench/demo.py --bin build/bin --clients 2 --layers 6 \
     --layer-bytes 2MiB --steps 2 --pool-bytes 64MiB --quiet > "$results/demo.log" 2>&1; then
  echo "demo: PASSED"; echo "1 0" > "$results/demo.count"
else
  cat "$results/demo.log"; echo "demo: FAILED"; echo "0 1" > "$results/demo.count"; rc=1
fi

section "demo smoke test on cuda-sim (link calibration and the fairness scenario, SIMULATED)"
# The fairness scenario on a cuda-sim daemon whose switch link has no configured capacity: the
# daemon measures it at start-up and the scenario must be fair (Jain >= --min-jain).
if /usr/bin/python3 bench/demo.py --bin build/bin --backend cuda-sim --clients 2 --layers 6 \
     --layer-bytes 2MiB --steps 2 --pool-bytes 64MiB --quiet > "$results/demo_sim.log" 2>&1; then
  echo "demo (cuda-sim): PASSED ($(grep -o "Jain's index over served/fair [0-9.]*" \
    "$results/demo_sim.log"))"; echo "1 0" > "$results/demo_sim.count"
else
  cat "$results/demo_sim.log"; echo "demo (cuda-sim): FAILED"; echo "0 1" > "$results/demo_sim.count"
  rc=1
fi

section "README blocks and Markdown links"
# The shell and Python blocks of README.md's quick starts, run against a daemon the script starts
# (blocks marked "<!-- not run here" are skipped), and every relative link and #anchor in the
# repository's Markdown files.
for check in readme_blocks md_links; do
  /usr/bin/python3 tests/$check.py > "$results/$check.log" 2>&1
  [ $? -eq 0 ] || { cat "$results/$check.log"; rc=1; }
  counts=$(tail -1 "$results/$check.log" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p')
  echo "$check: $(tail -1 "$results/$check.log")"
  echo "${counts:-0 1}" > "$results/$check.count"
done

section "function length"
if /usr/bin/python3 tests/function_length_test.py > "$results/function_length.log" 2>&1 &&
   /usr/bin/python3 tests/function_length.py >> "$results/function_length.log" 2>&1; then
  tail -1 "$results/function_length.log"; echo "1 0" > "$results/function_length.count"
else
  cat "$results/function_length.log"; echo "0 1" > "$results/function_length.count"; rc=1
fi

section "layering"
if BAZEL=$BAZEL bash tests/layering_check.sh > "$results/layering.log" 2>&1; then
  tail -1 "$results/layering.log"; echo "1 0" > "$results/layering.count"
else
  cat "$results/layering.log"; echo "0 1" > "$results/layering.count"; rc=1
fi

section "/dev/shm hygiene"
if /usr/bin/python3 tests/shm_hygiene.py check "$results/shm.before" > "$results/shm.log" 2>&1; then
  tail -1 "$results/shm.log"; echo "1 0" > "$results/shm_hygiene.count"
else
  cat "$results/shm.log"; echo "0 1" > "$results/shm_hygiene.count"; rc=1
fi

section ""
# What failed, again at the end: a long log is often read from its tail.
if [ -s "$results/bazel.failures" ]; then
  echo "failed Bazel test cases (assertion messages, first lines):"; cat "$results/bazel.failures"
fi
grep -hE '^(FAIL|ERROR): |^(FAILED|ERROR) [^ ]+::' "$results"/python.log "$results"/wheel.log \
  "$results"/monitoring.log "$results"/systemd.log 2>/dev/null | sed 's/^/failed Python test: /'
passed=0; failed=0
for f in "$results"/*.count; do
  read -r p fl < "$f"
  echo "  $(basename "$f" .count): $p passed, $fl failed"
  passed=$((passed + p)); failed=$((failed + fl))
done
[ "$failed" -eq 0 ] || rc=1
echo "$passed passed, $failed failed"
exit $rc
