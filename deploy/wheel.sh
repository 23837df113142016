#!/usr/bin/env bash
# Builds the wheel of the Python client (client/python) into build/wheel/ and prints its path:
# the package, its generated protocol stubs, the native client core liboffloadd_core.so
# (Bazel-built, loaded with ctypes) and the extension module of the ring's hot calls
# (offloadd/_ring_fast.abi3.so) and of the torch hooks' records (offloadd/_store_front.abi3.so),
# both on CPython's stable ABI, tagged cp310-abi3-manylinux_2_N_<arch> (one
# wheel for every CPython >= 3.10; N from the glibc the core and the extension need,
# client/python/setup.py).
#
#   bash deploy/wheel.sh [OUT_DIR]      # `make wheel`; default OUT_DIR build/wheel
#
# Offline: pip's setuptools and grpcio-tools come from .venv (client/python/requirements.lock,
# deploy/python-env.sh), no build isolation. Checks the wheel's contents and prints the core's
# needs (NEEDED libraries, newest glibc/libstdc++ symbol versions).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${1:-$root/build/wheel}
PY=${PYTHON:-$root/.venv/bin/python}
BAZEL=${BAZEL:-bazel}
if ! log=$($BAZEL build //client/core:liboffloadd_core.so //client/core:ring_fast.so \
           //client/core:store_front.so 2>&1); then
  echo "$log" | tail -30 >&2; echo "deploy/wheel.sh: bazel build of the native core failed" >&2
  exit 1
fi
core=$root/bazel-out/k8-opt/bin/client/core/liboffloadd_core.so  # -c opt (.bazelrc), as `make build`
fast=$root/bazel-out/k8-opt/bin/client/core/ring_fast.so
front=$root/bazel-out/k8-opt/bin/client/core/store_front.so
for lib in "$core" "$fast" "$front"; do
  if [ ! -f "$lib" ]; then
    echo "deploy/wheel.sh: bazel build //client/core:liboffloadd_core.so" \
         "//client/core:ring_fast.so //client/core:store_front.so left no $lib" >&2
    exit 1
  fi
done
rm -rf "$out" && mkdir -p "$out"
# setuptools builds in client/python/build and writes the egg-info there: both are removed before
# (a file left from an earlier build would go into the wheel) and after.
rm -rf "$root/client/python/build" "$root"/client/python/*.egg-info
trap 'rm -rf "$root/client/python/build" "$root"/client/python/*.egg-info' EXIT
OFFLOADD_CORE_LIB=$core OFFLOADD_RING_FAST_LIB=$fast OFFLOADD_STORE_FRONT_LIB=$front PYTHON="$PY" "$PY" -m pip wheel -q --no-deps --no-build-isolation \
  --disable-pip-version-check -w "$out" client/python
wheel=$(ls "$out"/offloadd-*.whl)
"$PY" - "$wheel" <<'PYEOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
want = {"offloadd/liboffloadd_core.so", "offloadd/_ring_fast.abi3.so",
        "offloadd/_store_front.abi3.so", "offloadd/_native.py",
        "offloadd/v1/offload_pb2.py",
        "offloadd/v1/offload_pb2_grpc.py", "offloadd/v1/projector_pb2.py",
        "offloadd/torch/__init__.py", "offloadd/testing/sim_gpu.py",
        "offloadd/galore/__init__.py"}
missing = sorted(want - names)
if missing:
    sys.exit("deploy/wheel.sh: %s lacks %s" % (sys.argv[1], ", ".join(missing)))
PYEOF
echo "core needs: $(objdump -p "$core" | awk '/NEEDED/ { printf "%s ", $2 }')" \
  "$(objdump -T "$core" | grep -oE '\((GLIBC|GLIBCXX|CXXABI)_[0-9.]+' | tr -d '(' |
     sort -t_ -k1,1 -k2V | awk -F_ '{ v[$1] = $0 } END { for (k in v) printf "%s ", v[k] }')"
for ext in "$fast" "$front"; do
  echo "extension $(basename "$ext") needs: $(objdump -p "$ext" | awk '/NEEDED/ { printf "%s ", $2 }')" \
    "$(objdump -T "$ext" | grep -oE '\((GLIBC|GLIBCXX|CXXABI)_[0-9.]+' | tr -d '(' |
       sort -t_ -k1,1 -k2V | awk -F_ '{ v[$1] = $0 } END { for (k in v) printf "%s ", v[k] }')"
done
echo "$wheel"
