#!/usr/bin/env bash
# Installs the Markdown documentation under DOCDIR at the paths it has in the source tree, so
# every relative link between the pages resolves in the installed copy as it does here:
#
#   deploy/install_docs.sh DOCDIR
#
#   DOCDIR/README.md, BENCHMARKS.md, docs/*.md, docs/benchmarks/*.md, deploy/README.md,
#   client/python/README.md, server/copy/{shm,cuda,timing}/README.md, offloadd.conf.example,
#   and the monitoring files the pages name: monitoring/grafana/offloadd-dashboard.json,
#   monitoring/prometheus/{alerts.yml,prometheus.yml,prometheus-kubernetes.yml}
# Used by install.sh (`make install`) and the container image's build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
docdir=${1:?usage: deploy/install_docs.sh DOCDIR}
cd "$root"
for page in README.md BENCHMARKS.md docs/*.md docs/benchmarks/*.md deploy/README.md \
            client/python/README.md server/copy/*/README.md \
            monitoring/grafana/offloadd-dashboard.json monitoring/prometheus/alerts.yml \
            monitoring/prometheus/prometheus.yml monitoring/prometheus/prometheus-kubernetes.yml; do
  install -d "$docdir/$(dirname "$page")"
  install -m 0644 "$page" "$docdir/$page"
done
install -m 0644 deploy/offloadd.conf.example "$docdir/offloadd.conf.example"
