#!/usr/bin/env bash
# Runs every Python test of offloadd (client/python/tests) under pytest with the project's pinned
# environment (.venv/, made by deploy/python-env.sh: torch 2.15.0, transformers 5.24.0, grpcio,
# pytest) and prints pytest's summary line ("N passed, M failed, K skipped in S s"); exits
# non-zero on failure.
#
#   tests/python/run.sh                       # daemon from bazel-bin/server/offloadd (or build/bin)
#   OFFLOADD_BIN=build/bin/offloadd tests/python/run.sh
#   tests/python/run.sh -k fallback           # extra arguments go to pytest
#   tests/python/run.sh client/python/tests/test_client.py   # one file (or file::Class::test)
#
# Generates the protocol stubs first (client/python/gen_proto.sh). The tests start their own
# daemons on short unique sockets under /tmp; they need the daemon binary (bazel build
# //server:offloadd) and the native client core (bazel build //client/core:liboffloadd_core.so;
# OFFLOADD_CORE_LIB overrides where it is looked for). PYTHON overrides the interpreter (it needs the packages of
# client/python/requirements.lock).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
PY=${PYTHON:-$root/.venv/bin/python}
if [ ! -x "$PY" ]; then
  echo "tests/python/run.sh: no Python environment at $PY: run 'bash deploy/python-env.sh'" \
       "(or 'make venv')" >&2
  exit 1
fi
if [ -z "${OFFLOADD_BIN:-}" ]; then
  # bazel-bin follows the configuration of the last build: look where builds leave the daemon.
  for candidate in bazel-bin/server/offloadd build/bin/offloadd \
      bazel-out/k8-opt/bin/server/offloadd bazel-out/k8-fastbuild/bin/server/offloadd \
      bazel-out/k8-dbg/bin/server/offloadd; do
    if [ -x "$candidate" ]; then OFFLOADD_BIN=$root/$candidate; break; fi
  done
fi
export OFFLOADD_BIN=${OFFLOADD_BIN:-$root/bazel-bin/server/offloadd}
if [ ! -x "$OFFLOADD_BIN" ]; then
  echo "tests/python/run.sh: no daemon binary at $OFFLOADD_BIN:" \
       "run 'bazel build //server:offloadd' or set OFFLOADD_BIN" >&2
  exit 1
fi
# The native client core (liboffloadd_core.so, bazel build //client/core:liboffloadd_core.so):
# the Python client's request ring; the tests expect it (they check both the ring and the
# stream paths). Found as the daemon is, unless OFFLOADD_CORE_LIB names it.
if [ -z "${OFFLOADD_CORE_LIB:-}" ]; then
  for candidate in bazel-bin/client/core build/bin bazel-out/k8-opt/bin/client/core \
      bazel-out/k8-fastbuild/bin/client/core bazel-out/k8-dbg/bin/client/core; do
    if [ -f "$candidate/liboffloadd_core.so" ]; then
      OFFLOADD_CORE_LIB=$root/$candidate/liboffloadd_core.so; break
    fi
  done
fi
if [ -z "${OFFLOADD_CORE_LIB:-}" ] || [ ! -f "$OFFLOADD_CORE_LIB" ]; then
  echo "tests/python/run.sh: no native client core (liboffloadd_core.so):" \
       "run 'bazel build //client/core:liboffloadd_core.so' or set OFFLOADD_CORE_LIB" >&2
  exit 1
fi
export OFFLOADD_CORE_LIB
export PYTHON="$PY"
bash client/python/gen_proto.sh
# At most two OpenMP threads per test process (the CI machine has 2 cores; some tests run two
# training processes at once); the tests set torch's intra-op threads themselves.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# No model or tokenizer is ever fetched from a hub: the tests build random-init models.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Two pytest-xdist workers, one test file each at a time (--dist loadfile: a file's tests run in
# order in one process, so its class-level daemons stay shared); most tests wait on daemons and
# child processes, so two workers halve the suite's time on the 2-core CI machine (measured 325 s
# against 721 s). OFFLOADD_PYTEST_WORKERS=0 runs them in this process, one after another.
workers=${OFFLOADD_PYTEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then parallel=(-n "$workers" --dist loadfile); fi
# Test files or node ids among the arguments (a path ending in .py, or one with ::) narrow the
# run to them; otherwise every test under client/python/tests runs (narrowed by -k, if given).
targets=(client/python/tests)
for arg in "$@"; do
  case "$arg" in *.py | *.py::*) targets=(); break ;; esac
done
exec "$PY" -m pytest -p no:cacheprovider -q -rfEs --durations=8 "${parallel[@]}" \
  "${targets[@]}" "$@"
