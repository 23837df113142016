#!/usr/bin/env bash
# 16 client processes flood the daemon for 6 s (half never read their answers); see flood.py.
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
bin=$(mktemp -d /tmp/ofd-flood-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
ln -s "$R/server/offloadd" "$R/client/cli/offloadctl" "$R/tests/soak/flood_client" "$bin/"
/usr/bin/python3 "$R/tests/soak/flood.py" --bin "$bin" --clients 16 --seconds 6
