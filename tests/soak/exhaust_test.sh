#!/usr/bin/env bash
# Resource exhaustion: attackers push every bound for 30 s beside a well-behaved
# client; see exhaust.py. Ceilings: RSS growth 256 MiB, page tables 64 MiB.
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
bin=$(mktemp -d /tmp/ofd-exhaust-bin-XXXXXX)
trap 'rm -rf "$bin"' EXIT
ln -s "$R/server/offloadd" "$R/client/cli/offloadctl" "$R/tests/soak/soak_client" \
  "$R/tests/soak/exhaust_client" "$bin/"
/usr/bin/python3 "$R/tests/soak/exhaust.py" --bin "$bin" --seconds "${EXHAUST_SECONDS:-30}"
