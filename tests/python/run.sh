#!/usr/bin/env bash
# Runs every Python test of offloadd (client/python/tests) with Debian's /usr/bin/python3 and
# prints unittest's summary ("Ran N tests ... OK" / "FAILED (...)"); exits non-zero on failure.
#
#   tests/python/run.sh                       # daemon from bazel-bin/server/offloadd (or build/bin)
#   OFFLOADD_BIN=build/bin/offloadd tests/python/run.sh
#   tests/python/run.sh -k fallback           # extra arguments go to unittest discover
#
# Generates the protocol stubs first (client/python/gen_proto.sh). The tests start their own
# daemons on short unique sockets under /tmp; they need the daemon binary (bazel build
# //server:offloadd) and python3-torch, python3-grpcio, python3-protobuf.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
PY=${PYTHON:-/usr/bin/python3}
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
bash client/python/gen_proto.sh
# At most two OpenMP threads per test process (the CI machine has 2 cores; some tests run two
# training processes at once); the tests set torch's intra-op threads themselves.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec "$PY" -m unittest discover -s client/python/tests -t client/python/tests -p 'test_*.py' "$@"
