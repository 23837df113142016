#!/bin/bash
# Builds gpu-bundle/: everything tests/gpu/run.sh needs on a GPU machine that has the NVIDIA
# driver, Python 3 with torch/grpcio/protobuf, and nothing else (no Bazel, no Debian packages,
# no network). Called by `make gpu-bundle`; the folder is gitignored and kept under 64 MiB.
#
#   deploy/make_gpu_bundle.sh [OUT_DIR]     # default: <repo>/gpu-bundle
#
# Layout: bin/ (offloadd with the cuda backend, gpu_e2e, gpu_probes, kernels_gpu_check,
# copy_sim_bench for the timing model's calibration, the fake-based unit tests), lib/ (every
# shared library those load per ldd, except the driver's libcuda/libnvidia-* and glibc's own
# libraries), wheel/ (the offloadd wheel of `make wheel`, with Debian protoc's stubs), python/
# (examples; the offloadd package itself only when the wheel could not be built), pydeps/ (grpcio,
# protobuf and typing_extensions wheels at the pinned versions for the CPython versions that fit
# under the size limit, newest-common first; run.sh unpacks them only when the GPU machine's
# python3 lacks grpcio/protobuf; pydeps/galore/: galore-torch and bitsandbytes with its CUDA 13
# library only, for the GaLore check), run.sh and the check scripts, MANIFEST (versions, glibc
# requirement, sizes). The wheels come from PyPI through pip once and are cached in
# build/gpu-bundle-wheels/; offline, the bundle is made without them (MANIFEST says so).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/gpu-bundle"}
limit_bytes=$((64 << 20))
cd "$root"

if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "make_gpu_bundle.sh: no CUDA toolkit at /usr/local/cuda: the bundle needs the cuda backend" >&2
  exit 1
fi
targets="//server:offloadd //tests/gpu:gpu_e2e //tests/gpu:gpu_probes //kernels:kernels_gpu_check \
  //server/copy/cuda:cuda_engine_test //client:cuda_export_test //bench:copy_sim_bench_cuda"
bazel build $targets
bin=$(bazel info bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/python"
cp "$bin/server/offloadd" "$out/bin/offloadd"  # the cuda backend is in where the toolkit is
cp "$bin/bench/copy_sim_bench_cuda" "$out/bin/copy_sim_bench"  # --backend=cuda|sim: calibration
cp "$bin/tests/gpu/gpu_e2e" "$bin/tests/gpu/gpu_probes" "$bin/kernels/kernels_gpu_check" "$bin/server/copy/cuda/cuda_engine_test" \
  "$bin/client/cuda_export_test" "$out/bin/"
chmod u+w "$out"/bin/*
strip --strip-debug "$out"/bin/*

# Shared libraries: what ldd resolves, minus the driver (comes from the GPU machine) and glibc
# (must match the machine's loader). libstdc++/libgcc_s are shipped: our binaries need the
# versions they were linked against, and run.sh puts lib/ only on our binaries' command lines.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libcuda\.so|libnvidia-)'
for b in "$out"/bin/*; do
  ldd "$b" | awk '/=> \// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
done
chmod u+w "$out"/lib/* 2>/dev/null || true
strip --strip-unneeded "$out"/lib/* 2>/dev/null || true
missing=$(for b in "$out"/bin/*; do LD_LIBRARY_PATH="$out/lib" ldd "$b" | grep "not found" || true; done)
if [ -n "$missing" ]; then echo "make_gpu_bundle.sh: unresolved: $missing" >&2; exit 1; fi

# The pure-Python client with its generated protocol stubs, and its example model. The GPU
# machine has its own torch/grpcio/protobuf (versions unknown here): the bundle's stubs come from
# Debian's protoc 3.21, whose generated code carries no runtime-version check; the tree's own
# stubs (for .venv's protobuf 7) are regenerated right after.
# The client goes as its wheel (deploy/wheel.sh: native core inside, platform-tagged), which
# run.sh installs with pip --no-deps; setup.py's gen_proto.sh run inherits OFFLOADD_PROTOC.
OFFLOADD_PROTOC=debian sh client/python/gen_proto.sh >/dev/null
if OFFLOADD_PROTOC=debian bash deploy/wheel.sh "$out/wheel" > "$out/wheel.log" 2>&1; then
  wheel_name=$(basename "$(tail -1 "$out/wheel.log")")
else
  tail -5 "$out/wheel.log"
  echo "make_gpu_bundle.sh: no wheel (see above): the bundle carries the source package instead"
  rm -rf "$out/wheel"; cp -r client/python/offloadd "$out/python/"; wheel_name=""
  # the native parts the package loads from beside itself (what the wheel would carry)
  for f in liboffloadd_core.so:liboffloadd_core.so ring_fast.so:_ring_fast.abi3.so \
           store_front.so:_store_front.abi3.so; do
    [ -f "build/bin/${f%%:*}" ] && cp "build/bin/${f%%:*}" "$out/python/offloadd/${f##*:}"
  done
fi
rm -f "$out/wheel.log"
cp -r client/python/examples "$out/python/"
# Without .venv (a bundle made before `make venv`) the tree keeps Debian's stubs until the next
# `make build`, whose gen_proto.sh replaces them.
sh client/python/gen_proto.sh >/dev/null 2>&1 ||
  echo "make_gpu_bundle.sh: no .venv yet: the tree's stubs stay Debian's until 'make build'"
find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
cp tests/gpu/run.sh tests/gpu/torch_check.py tests/gpu/transformers_check.py tests/gpu/cuda_probes.py \
  tests/gpu/galore_check.py tests/gpu/compiled_check.py tests/gpu/step_timing.py \
  client/python/tests/qwen3_fixture.py client/python/tests/galore_fixture.py "$out/"
chmod +x "$out/run.sh"

# Wheels from PyPI, cached per machine.
wheel_cache="$root/build/gpu-bundle-wheels"
mkdir -p "$wheel_cache" "$out/pydeps"
pip="$root/.venv/bin/pip"; [ -x "$pip" ] || pip="python3 -m pip"

# galore-torch and bitsandbytes (which galore_torch imports) at the pinned versions, for a GPU
# machine without them: unpacked into pydeps/galore/, bitsandbytes with its Python code and only
# the CUDA 13 library (the bundle's CUDA major; the whole wheel is over 100 MiB), each with its
# dist-info (offloadd.galore reads galore-torch's version from it). run.sh puts the
# folder on the GaLore check's path only when the machine's python3 cannot import galore_torch.
galore_pins=$(grep -E '^(galore-torch|bitsandbytes)==' client/python/requirements.lock)
if ! ls "$wheel_cache"/galore_torch-*.whl "$wheel_cache"/bitsandbytes-*.whl > /dev/null 2>&1; then
  # shellcheck disable=SC2086
  $pip download --quiet --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
    --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$wheel_cache" $galore_pins > /dev/null 2>&1 ||
    echo "make_gpu_bundle.sh: no galore-torch/bitsandbytes wheels (offline?): the GaLore check needs them on the GPU machine"
fi
if ls "$wheel_cache"/galore_torch-*.whl "$wheel_cache"/bitsandbytes-*.whl > /dev/null 2>&1; then
  mkdir -p "$out/pydeps/galore"
  python3 -m zipfile -e "$wheel_cache"/galore_torch-*.whl "$out/pydeps/galore/"
  python3 - "$wheel_cache"/bitsandbytes-*.whl "$out/pydeps/galore" <<'PY'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        lib = re.search(r"libbitsandbytes_(\w+)\.so$", n)
        top = n.split("/")[0]
        if top.startswith("bitsandbytes-") and top.endswith(".dist-info"):
            z.extract(n, sys.argv[2])  # its version, for importlib.metadata
        elif top == "bitsandbytes" and (lib is None or lib.group(1) in ("cpu", "cuda130")):
            z.extract(n, sys.argv[2])
PY
fi

# Python packages the client needs beyond torch, for a GPU machine whose python3 lacks them.
pins=$(grep -E '^(grpcio|protobuf|typing_extensions)==' client/python/requirements.lock)
# Wheels are added while the bundle stays 6 MiB under the limit: room for the checkout it may
# travel with to the GPU machine (64 MiB in all).
wheel_room=$(( limit_bytes - (6 << 20) ))
wheels_for=""
for v in 3.12 3.11 3.10 3.13 3.14; do
  tag=cp${v/./}
  if ! ls "$wheel_cache"/grpcio-*-"$tag"-*.whl > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    $pip download --quiet --only-binary=:all: --no-deps --python-version "$v" --implementation cp \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$wheel_cache" $pins \
      > /dev/null 2>&1 || { echo "make_gpu_bundle.sh: no wheels for Python $v (offline?)"; continue; }
  fi
  set -- "$wheel_cache"/grpcio-*-"$tag"-*.whl
  [ -f "$1" ] || continue
  if [ $(( $(du -sb "$out" | cut -f1) + $(stat -c %s "$1") + (1 << 20) )) -gt $wheel_room ]; then
    echo "make_gpu_bundle.sh: no room for the Python $v wheels under the 64 MiB limit"; break
  fi
  cp "$1" "$out/pydeps/"
  wheels_for="$wheels_for $v"
done
cp "$wheel_cache"/protobuf-*-abi3-*.whl "$wheel_cache"/typing_extensions-*.whl "$out/pydeps/" 2>/dev/null || true


glibc=$(for f in "$out"/bin/* "$out"/lib/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
size=$(du -sb "$out" | cut -f1)
{
  echo "offloadd gpu bundle $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo +dirty) built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "needs: NVIDIA driver for CUDA 13 (libcuda.so.1), glibc >= ${glibc#GLIBC_}, x86-64, python3 with torch (CUDA); grpcio and protobuf from the machine, else from pydeps/"
  echo "cuda toolkit: $(/usr/local/cuda/bin/nvcc --version | tail -1); kernels: sm_90 + compute_90 PTX"
  echo "size: $size bytes"
  echo "libs: $(ls "$out/lib" | tr '\n' ' ')"
  echo "client: ${wheel_name:-the source package in python/ (no wheel)}"
  echo "pydeps: grpcio/protobuf wheels for CPython${wheels_for:- none (offline build: python3 on the GPU machine must have grpcio and protobuf)}"
} > "$out/MANIFEST"
cat "$out/MANIFEST"
if [ "$size" -gt "$limit_bytes" ]; then
  echo "make_gpu_bundle.sh: bundle is $size bytes, over the 64 MiB limit" >&2
  exit 1
fi
echo "make_gpu_bundle.sh: $out ready; on the GPU machine run: $out/run.sh"
