#!/usr/bin/env bash
# Deployment and monitoring checks: manifests (and kubernetes-validate, checkov), sd_notify,
# the container entrypoint, promtool, dashboard, live Prometheus scrape.
# Usage: bash tests/monitoring/run.sh   (after `make build`; binaries from $OFFLOADD_BIN_DIR,
# default build/bin). Prints unittest output; exits non-zero when any test fails.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export OFFLOADD_BIN_DIR="$(cd "${OFFLOADD_BIN_DIR:-$repo/build/bin}" 2>/dev/null && pwd)" || {
  echo "tests/monitoring: ${OFFLOADD_BIN_DIR:-build/bin} not found; run make build first" >&2
  exit 1
}
for b in offloadd offloadctl checkpoint_workload; do
  [ -x "$OFFLOADD_BIN_DIR/$b" ] || { echo "tests/monitoring: $OFFLOADD_BIN_DIR/$b missing" >&2; exit 1; }
done
# kubernetes-validate and checkov, pinned (deploy/tools.lock), installed once per machine.
OFFLOADD_TOOLS_BIN=$(bash "$repo/deploy/tools-env.sh") || {
  echo "tests/monitoring: deploy/tools-env.sh could not install the manifest checkers" >&2
  exit 1
}
export OFFLOADD_TOOLS_BIN
cd "$here"
timeout --signal=TERM --kill-after=10 420 /usr/bin/python3 -W ignore::ResourceWarning -m unittest -v \
  test_manifests test_notify test_k8s_tools test_container test_promtool test_dashboard \
  test_live_scrape test_readme_metrics test_alerts_table test_config_doc
