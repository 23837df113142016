#!/usr/bin/env bash
# Creates or updates offloadd's pinned Python environment in .venv/ (git-ignored) from
# client/python/requirements.lock, with Debian's /usr/bin/python3 (3.11; the python3-venv
# package comes from deploy/install-deps.sh).
#
#   bash deploy/python-env.sh          # idempotent: ~0.05 s when .venv matches the lock
#   VENV=/path bash deploy/python-env.sh
#   VENV=/path LOCK=client/python/requirements-torch24.lock bash deploy/python-env.sh  # another lock
#
# The lock's SHA-256 is stored in .venv/.offloadd-lock; when it matches, nothing is done. When
# it does not (first run, or the lock changed), the lock is installed into the existing venv (pip
# only adds or changes what differs). A fresh machine downloads torch's CUDA build (~3 GB with
# its nvidia-* wheels): about 1-2 minutes where the package index is near, once per machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$root/.venv}
lock=$(realpath "${LOCK:-$root/client/python/requirements.lock}")
stamp=$venv/.offloadd-lock
want=$(sha256sum "$lock" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "python-env: creating $venv (Debian python3 $(/usr/bin/python3 -c 'import platform; print(platform.python_version())'))"
  /usr/bin/python3 -m venv "$venv"
fi
echo "python-env: installing ${lock#"$root"/} into $venv"
start=$(date +%s)
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock"
echo "$want" > "$stamp"
echo "python-env: done in $(( $(date +%s) - start )) s"
