#!/usr/bin/env bash
# The Python client as users install it: builds the wheel (deploy/wheel.sh, `make wheel`),
# installs it (not the source tree) into a second environment with an older torch than .venv's
# (client/python/requirements-torch24.lock: torch 2.4.1, the oldest release offloadd supports),
# and runs there, against a real daemon, the tests of the offloadd.torch hooks
# (offload_checkpoints, save_on_cpu, checkpoint, a lost step), of the native core's
# ring and of the hooks' records (_store_front), and test_installed_wheel.py (offloadd, its stubs,
# liboffloadd_core.so and the extension modules load from the
# environment; auditwheel finds the platform tag the wheel's name claims). Prints pytest's
# summary line; exits non-zero on failure.
#
#   bash tests/python/wheel_suite.sh            # daemon as tests/python/run.sh finds it
#   OFFLOADD_BIN=build/bin/offloadd bash tests/python/wheel_suite.sh -k native   # pytest args
#   bash tests/python/wheel_suite.sh --prepare   # only make the environment (run_all.sh starts
#                                                # this first, so it overlaps the builds)
#
# The environment is made once per machine under $OFFLOADD_CACHE (default ~/.cache/offloadd) in
# venv-torch24-<the lock's SHA-256, 12 digits> by deploy/python-env.sh (2.7 GB of PyPI downloads,
# 5.0 GB on disk: PyPI's x86_64 torch brings its CUDA libraries); a flock serialises concurrent
# runs, and environments of older locks are removed. Later runs reuse it (~0.05 s).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
lock=$root/client/python/requirements-torch24.lock
cache=${OFFLOADD_CACHE:-$HOME/.cache/offloadd}
venv=$cache/venv-torch24-$(sha256sum "$lock" | cut -c1-12)
torch_version=$(sed -n 's/^torch==//p' "$lock")
mkdir -p "$cache"
(
  flock 9
  for old in "$cache"/venv-torch24-*; do
    if [ -d "$old" ] && [ "$old" != "$venv" ]; then rm -rf "$old"; fi
  done
  VENV=$venv LOCK=$lock bash deploy/python-env.sh
) 9> "$cache/venv-torch24.lock"
if [ "${1:-}" = --prepare ]; then exit 0; fi

if [ -z "${OFFLOADD_BIN:-}" ]; then
  for candidate in bazel-bin/server/offloadd build/bin/offloadd bazel-out/k8-opt/bin/server/offloadd; do
    if [ -x "$candidate" ]; then OFFLOADD_BIN=$root/$candidate; break; fi
  done
fi
export OFFLOADD_BIN=${OFFLOADD_BIN:-$root/bazel-bin/server/offloadd}
if [ ! -x "$OFFLOADD_BIN" ]; then
  echo "wheel_suite.sh: no daemon binary at $OFFLOADD_BIN: run 'bazel build //server:offloadd'" >&2
  exit 1
fi

wheel=$(bash deploy/wheel.sh | tail -1)
echo "wheel_suite.sh: $(basename "$wheel") into $venv (torch $torch_version)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall \
  "$wheel"

tests=client/python/tests
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# -P: the working directory (the repository) stays off sys.path; daemon_fixture leaves the source
# tree off it too (OFFLOADD_TEST_INSTALLED). Two workers, one test file each at a time, as
# tests/python/run.sh.
exec env -u OFFLOADD_CORE_LIB -u PYTHONPATH OFFLOADD_TEST_INSTALLED=1 OFFLOADD_WHEEL="$wheel" \
  OFFLOADD_EXPECT_TORCH="$torch_version" "$venv/bin/python" -P -m pytest -p no:cacheprovider -q \
  -rs --durations=5 -n "${OFFLOADD_PYTEST_WORKERS:-2}" --dist loadfile \
  $tests/test_installed_wheel.py $tests/test_hooks.py $tests/test_checkpoint.py \
  $tests/test_lost_step.py $tests/test_native.py $tests/test_store_front.py \
  $tests/test_ring_answers.py $tests/test_offload_lane.py "$@"
