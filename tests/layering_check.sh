#!/usr/bin/env bash
# The layer order of docs/ARCHITECTURE.md "Layers", checked against what Bazel enforces.
# For each server package, asks Bazel which server libraries its libraries may depend on
# (`bazel query visible(...)`: the visibility rules of server/BUILD's package groups) and
# compares that with the table below. A visibility change that lets a layer reach up or
# sideways (store -> session, pool -> copy, metrics -> anything, projector -> sched, one copy
# backend -> another, copy/timing -> a backend) fails here
# with the package pair, so the layering cannot loosen without this table and the architecture
# document changing with it. Also checks that common/ uses nothing of ours and that nothing
# under client/ uses anything under server/. Prints "layering: OK (N packages)" or the differences; exit 1 on any.
set -uo pipefail
cd "$(dirname "$0")/.."
BAZEL=${BAZEL:-bazel}

# package -> the server packages whose libraries it may use (sorted, space separated).
# copy/ is three layers (server/copy/BUILD): the backends copy/cuda and copy/shm, which may not
# use each other; copy/timing below them; copy (the CopyEngine interface) below that.
declare -A ALLOWED=(
  [server]="base copy copy/cuda copy/shm copy/timing metrics pool projector rpc sched session spill store"
  [rpc]="base copy copy/cuda copy/shm copy/timing metrics pool projector sched session spill store"
  [session]="base copy copy/cuda copy/shm copy/timing metrics pool projector sched spill store"
  [store]="base copy copy/cuda copy/shm copy/timing metrics pool spill"
  [projector]="base copy copy/cuda copy/shm copy/timing metrics pool"
  [sched]="base copy copy/cuda copy/shm copy/timing metrics pool"
  [spill]="base copy copy/cuda copy/shm copy/timing metrics pool sched"
  [pool]="base metrics"
  [copy/cuda]="base copy copy/timing metrics"
  [copy/shm]="base copy copy/timing metrics"
  [copy/timing]="base copy metrics"
  [copy]="base metrics"
  [metrics]="base"
  [base]=""
)

bad=0
for pkg in "${!ALLOWED[@]}"; do
  label=//server/$pkg; [ "$pkg" = server ] && label=//server
  if ! out=$($BAZEL query --noshow_progress \
      "visible(kind('cc_library', $label:all), kind('cc_library', //server/...))" 2>&1); then
    echo "layering: bazel query failed for $label:"; echo "$out" | tail -5; exit 1
  fi
  seen=$(echo "$out" | grep '^//server' | sed 's#^//server/\{0,1\}##; s#:.*##; s#^$#server#' |
         grep -vx "$pkg" | sort -u | tr '\n' ' ' | sed 's/ $//')
  if [ "$seen" != "${ALLOWED[$pkg]}" ]; then
    echo "layering: //server/$pkg may use [$seen], the layer order allows [${ALLOWED[$pkg]}]"
    bad=1
  fi
done
# common/ (the wire formats the daemon and its clients share beside protobuf, and common/base/'s
# leaf helpers) sits below every server layer and the client libraries: it may depend on
# nothing of ours.
if ! out=$($BAZEL query --noshow_progress \
    "kind('cc_library', deps(//common/...)) intersect (//server/... + //client/... + //proto/...)" \
    2>&1); then
  echo "layering: bazel query failed for //common:"; echo "$out" | tail -5; exit 1
fi
if [ -n "$(echo "$out" | grep '^//')" ]; then
  echo "layering: //common uses [$(echo "$out" | grep '^//' | tr '\n' ' ')], it may use nothing of ours"
  bad=1
fi
# client/ (the C++ client library, offloadctl, the planner, their tests) is not a daemon layer:
# what it shares with the daemon is in common/ and proto/, so no target under it, test or not,
# may depend on anything under server/.
if ! out=$($BAZEL query --noshow_progress "deps(//client/...) intersect //server/..." 2>&1); then
  echo "layering: bazel query failed for //client:"; echo "$out" | tail -5; exit 1
fi
if [ -n "$(echo "$out" | grep '^//')" ]; then
  echo "layering: //client uses [$(echo "$out" | grep '^//' | tr '\n' ' ')], it may use nothing" \
       "under //server (move what both need to common/)"
  bad=1
fi
if [ "$bad" -ne 0 ]; then
  echo "layering: FAILED — restore server/BUILD's package groups, or change the order in this"
  echo "table and docs/ARCHITECTURE.md \"Layers\" together"
  exit 1
fi
echo "layering: OK (${#ALLOWED[@]} packages, common/ and client/)"
