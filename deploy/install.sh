#!/usr/bin/env bash
# `make install`: installs offloadd under a prefix.
#
#   deploy/install.sh [--bin DIR] PREFIX [DESTDIR]
#
#   PREFIX/bin/offloadd, PREFIX/bin/offloadctl             from DIR (default build/bin)
#   PREFIX/lib/systemd/system/offloadd.service            deploy/offloadd.service, its
#                                                         /usr/local paths rewritten to PREFIX
#   PREFIX/lib/systemd/system/offloadd.socket             deploy/offloadd.socket (optional
#                                                         socket activation)
#   PREFIX/share/doc/offloadd/README.md                   what the unit's Documentation= names
#   PREFIX/share/doc/offloadd/...                         every page it links, at its path in the
#                                                         source tree (deploy/install_docs.sh:
#                                                         docs/, BENCHMARKS.md, deploy/README.md,
#                                                         ..., the Grafana dashboard and the
#                                                         Prometheus alerts and scrape configs
#                                                         under monitoring/), and
#                                                         offloadd.conf.example
# Everything goes under DESTDIR (default empty) for staging. /etc is left alone: copy the
# example config to /etc/offloadd/offloadd.conf yourself (deploy/README.md). Nothing is built:
# run `make build` as yourself first (then `sudo make install`); binaries older than the
# sources they come from are installed with a warning.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/bin
if [ "${1:-}" = --bin ]; then bin=$2; shift 2; fi
if [ $# -lt 1 ] || [ -z "$1" ] || [ "${1:0:1}" != / ]; then
  echo "usage: deploy/install.sh [--bin DIR] PREFIX [DESTDIR]   (PREFIX an absolute path)" >&2
  exit 2
fi
prefix=${1%/}
dest=${2:-}
for b in offloadd offloadctl; do
  [ -x "$bin/$b" ] || {
    echo "install.sh: $bin/$b missing: run 'make build' as yourself first (not as root), then" \
         "'sudo make install'" >&2
    exit 1
  }
done
newer=$(find "$root/server" "$root/client" "$root/proto" -newer "$bin/offloadd" -type f \
          \( -name '*.cc' -o -name '*.h' -o -name '*.proto' \) -print -quit 2>/dev/null || true)
if [ -n "$newer" ]; then
  echo "install.sh: warning: $bin/offloadd is older than ${newer#"$root"/}: run 'make build'" \
       "again to install the current sources" >&2
fi
docdir=$prefix/share/doc/offloadd
install -d "$dest$prefix/bin" "$dest$prefix/lib/systemd/system" "$dest$docdir"
install -m 0755 "$bin/offloadd" "$bin/offloadctl" "$dest$prefix/bin/"
sed -e "s|/usr/local/bin/|$prefix/bin/|g" -e "s|/usr/local/share/doc/offloadd/|$docdir/|g" \
  "$root/deploy/offloadd.service" > "$dest$prefix/lib/systemd/system/offloadd.service"
chmod 0644 "$dest$prefix/lib/systemd/system/offloadd.service"
sed -e "s|/usr/local/share/doc/offloadd/|$docdir/|g" \
  "$root/deploy/offloadd.socket" > "$dest$prefix/lib/systemd/system/offloadd.socket"
chmod 0644 "$dest$prefix/lib/systemd/system/offloadd.socket"
# The pages at their source-tree paths: every link between them resolves in the installed copy.
bash "$root/deploy/install_docs.sh" "$dest$docdir"
# Every file:// the unit's Documentation= names must now exist.
for doc in $(sed -n 's/^Documentation=//p' "$dest$prefix/lib/systemd/system/offloadd.service"); do
  case $doc in
    file://*) [ -f "$dest${doc#file://}" ] || { echo "install.sh: $doc not installed" >&2; exit 1; } ;;
  esac
done
unitdir=$prefix/lib/systemd/system
echo "installed offloadd in $dest$prefix (unit: $unitdir/offloadd.service)"
# systemd reads system units from these directories only (systemd.unit(5), "System Unit Search
# Path"); a unit elsewhere must be linked into /etc/systemd/system first.
case $unitdir in
  /etc/systemd/system | /usr/local/lib/systemd/system | /usr/lib/systemd/system | \
  /lib/systemd/system)
    echo "next: systemctl daemon-reload (systemd reads $unitdir)" ;;
  *)
    echo "next: systemd does not read $unitdir: link the units with" \
         "'systemctl link $unitdir/offloadd.service' (and offloadd.socket for socket" \
         "activation), then systemctl daemon-reload" ;;
esac
