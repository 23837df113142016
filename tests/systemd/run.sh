#!/usr/bin/env bash
# deploy/offloadd.service and offloadd.socket under a real systemd (tests/systemd/test_systemd.py):
# systemd 252 as PID 1 of new namespaces over a cached Debian rootfs (rootfs.sh builds it once per
# machine, ~1.5 min; boot.sh boots it). Needs root; prints a skip line and exits 0 otherwise.
# Binaries from $OFFLOADD_BIN_DIR (default build/bin: make build first). Prints unittest output.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "tests/systemd: skipped (needs root: systemd runs as PID 1 of new namespaces)"
  echo "Ran 1 test in 0.000s"; echo; echo "OK (skipped=1)"
  exit 0
fi
export OFFLOADD_BIN_DIR=${OFFLOADD_BIN_DIR:-$repo/build/bin}
for b in offloadd offloadctl; do
  [ -x "$OFFLOADD_BIN_DIR/$b" ] || { echo "tests/systemd: $OFFLOADD_BIN_DIR/$b missing: make build" >&2; exit 1; }
done
start=$(date +%s)
OFFLOADD_TEST_ROOTFS=$(bash "$here/rootfs.sh") || exit 1
echo "tests/systemd: rootfs $OFFLOADD_TEST_ROOTFS ($(( $(date +%s) - start )) s)"
export OFFLOADD_TEST_ROOTFS
PY=${PYTHON:-$repo/.venv/bin/python}
bash "$repo/client/python/gen_proto.sh" >/dev/null
cd "$here"
timeout --signal=TERM --kill-after=10 600 "$PY" -W ignore::ResourceWarning -m unittest -v test_systemd
