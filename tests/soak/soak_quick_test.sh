#!/usr/bin/env bash
# Short chaos soak for CI (20 s, a client SIGKILLed every ~2 s, one daemon restart); the full
# run is `make soak` (tests/soak/soak.py).
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
bin=$(mktemp -d /tmp/ofd-soak-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
ln -s "$R/server/offloadd" "$R/client/cli/offloadctl" "$R/tests/soak/soak_client" "$bin/"
/usr/bin/python3 "$R/tests/soak/soak.py" --bin "$bin" --seconds 20 --kill_every 2
