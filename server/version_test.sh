#!/usr/bin/env bash
# offloadd --version, offloadctl --version and the Python package name one release.
set -euo pipefail
R=${TEST_SRCDIR:-.}/offloadd
want=$(sed -n 's/^inline constexpr char kVersion\[\] = "\(.*\)";$/\1/p' "$R/common/base/version.h")
[ -n "$want" ] || { echo "FAIL: no kVersion in common/base/version.h"; exit 1; }
fail=0
check() {  # check WHAT GOT
  if [ "$2" = "$want" ]; then echo "ok   $1 $2"; else echo "FAIL $1 says '$2', version.h '$want'"; fail=1; fi
}
check offloadd "$("$R/server/offloadd" --version | awk '{print $2}')"
check offloadctl "$("$R/client/cli/offloadctl" --version | awk '{print $2}')"
check pyproject.toml "$(sed -n 's/^version = "\(.*\)"$/\1/p' "$R/client/python/pyproject.toml")"
check offloadd/__init__.py "$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$R/client/python/offloadd/__init__.py")"
exit $fail
