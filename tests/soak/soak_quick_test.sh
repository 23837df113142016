#!/usr/bin/env bash
# Short chaos soak for CI (24 s, a client SIGKILLed every ~2 s, the daemon SIGKILLed 3 times and
# SIGTERMed once on its shared pool, frozen (SIGSTOP) once for 3 s, clients resuming by themselves;
# under a minute with the final grace wait); the full run is `make soak` (tests/soak/soak.py).
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
bin=$(mktemp -d /tmp/ofd-soak-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
ln -s "$R/server/offloadd" "$R/client/cli/offloadctl" "$R/tests/soak/soak_client" "$bin/"
/usr/bin/python3 "$R/tests/soak/soak.py" --bin "$bin" --seconds 24 --kill_every 2 \
  --daemon_kills 3 --grace 5
