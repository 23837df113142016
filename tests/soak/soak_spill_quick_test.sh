#!/usr/bin/env bash
# Short chaos soak with the spill tier active, for CI: a 4 MiB pool under 8 clients
# that hold up to 16 blocks of up to 2 MiB each, so blocks keep going to disk and coming back
# while a client is SIGKILLed every ~2 s; the daemon is SIGTERMed and restarted once (spilled
# blocks do not survive a restart, so no SIGKILL rounds on a shared pool here). Exit 0 means
# 0 blocks corrupted, 0 lost without an error, blocks spilled and staged back, no spill file
# lost (tests/soak/soak.py). About 30 s. Skips where the temporary directory refuses O_DIRECT
# (tmpfs before Linux 6.6): the spill tier cannot run there.
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
tmp=${TEST_TMPDIR:-/tmp}
spill=$(mktemp -d "$tmp/ofd-soak-spill-XXXXXX")
bin=$(mktemp -d /tmp/ofd-soak-bin-XXXXXX)
trap 'rm -rf "$bin" "$spill"' EXIT
if ! /usr/bin/python3 -c 'import os, sys
fd = os.open(os.path.join(sys.argv[1], "probe"), os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
os.close(fd)' "$spill" 2>/dev/null; then
  echo "SKIPPED: $spill ($(stat -f -c %T "$spill")) does not take O_DIRECT; the spill tier needs" \
       "a directory on a local disk (set TEST_TMPDIR to one)"
  exit 0
fi
rm -f "$spill/probe"
ln -s "$R/server/offloadd" "$R/client/cli/offloadctl" "$R/tests/soak/soak_client" "$bin/"
/usr/bin/python3 "$R/tests/soak/soak.py" --bin "$bin" --seconds 24 --kill_every 2 \
  --daemon_kills 0 --grace 5 --pool 4MiB --spill_directory "$spill"
