#!/usr/bin/env bash
# 32 client processes flood the daemon for 6 s (half never read their answers); see flood.py.
# 32, not 16: with gRPC's BDP probing on, 32 clients grew the daemon by ~210 MiB (> 160), 16 by ~118.
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
bin=$(mktemp -d /tmp/ofd-flood-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
ln -s "$R/server/offloadd" "$R/client/cli/offloadctl" "$R/tests/soak/flood_client" "$bin/"
/usr/bin/python3 "$R/tests/soak/flood.py" --bin "$bin" --clients 32 --seconds 6
