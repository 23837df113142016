#!/usr/bin/env bash
# Clang thread-safety analysis: builds every cc_library and cc_binary under server/, client/ and common/
# (and the annotated wrapper's own test) with .bazelrc's --config=tsa — /usr/bin/clang,
# -Wthread-safety -Werror on our sources — so a member read without its GUARDED_BY mutex, a
# REQUIRES function called without the lock or an EXCLUDES one called with it fails the build.
# Compile only (--output_groups=compilation_outputs: our own objects; nothing is linked or run,
# and generated protobuf sources are not compiled, only their headers made); its own output
# tree, so it is incremental across runs.
# First it checks that the analysis can fail: a probe reading a guarded member without its lock
# must be refused, and the same probe with the lock accepted.
# Extra arguments go to bazel build (e.g. --keep_going).
set -euo pipefail
cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}
CLANGXX=${CLANGXX:-/usr/bin/clang++}

probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
probe() {  # $1: the body of Read(Box& b); prints clang's diagnostics, returns its status
  cat > "$probe_dir/probe.cc" <<PROBE
#include "common/base/mutex.h"
struct Box {
  offloadd::base::Mutex mu;
  int value GUARDED_BY(mu) = 0;
};
int Read(Box& b) { $1 }
PROBE
  "$CLANGXX" -std=c++17 -fsyntax-only -Wthread-safety -Werror -I. "$probe_dir/probe.cc" 2>&1
}
if ! out=$(probe 'offloadd::base::MutexLock lock(b.mu); return b.value;'); then
  echo "tsa_build: the locked probe does not compile:"; echo "$out"; exit 1
fi
if out=$(probe 'return b.value;'); then
  echo "tsa_build: an unlocked read of a GUARDED_BY member compiled: the analysis is off"; exit 1
fi
if ! grep -q "requires holding mutex 'b.mu'" <<<"$out"; then
  echo "tsa_build: the unlocked probe failed for another reason:"; echo "$out"; exit 1
fi
echo "tsa_build: probe refused as expected (reading variable 'value' requires holding mutex)"

targets=$($BAZEL query 'kind("cc_library|cc_binary", //server/... + //client/... + //common/...)' 2>/dev/null)
# shellcheck disable=SC2086
$BAZEL build --config=tsa --output_groups=compilation_outputs "$@" $targets //common/base:mutex_test
