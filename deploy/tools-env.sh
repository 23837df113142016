#!/usr/bin/env bash
# Creates (once per machine) the deployment checkers' pinned environment from deploy/tools.lock:
# kubernetes-validate and checkov, which tests/monitoring runs on the Kubernetes manifests. Its
# own venv, so checkov's many dependencies never move the client's pins (.venv/), and outside the
# clone, keyed by the lock's hash, so every clone and test run of this machine shares it:
#   ${OFFLOADD_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/offloadd/tools-<lock sha256, 12>}
#
#   bash deploy/tools-env.sh     # prints the venv's bin directory on stdout; idempotent: ~0.05 s
#                                # when the venv matches the lock
#
# A fresh machine downloads ~100 packages (~400 MB installed): 1.5-4 minutes where the package
# index is near (measured 83 s idle, 224 s on a loaded 2-core machine). The stamp is written
# last, so an interrupted install is never taken for a finished one (the next run starts over).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lock=$root/deploy/tools.lock
want=$(sha256sum "$lock" | cut -d' ' -f1)
venv=${OFFLOADD_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/offloadd/tools-${want:0:12}}
stamp=$venv/.offloadd-lock
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "$venv/bin"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # one installer per machine; the others wait and find it done
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv/bin"
  exit 0
fi
echo "tools-env: installing deploy/tools.lock into $venv" >&2
start=$(date +%s)
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock" >&2
echo "$want" > "$stamp"
echo "tools-env: done in $(( $(date +%s) - start )) s" >&2
echo "$venv/bin"
