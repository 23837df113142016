#!/usr/bin/env bash
# Builds the DaemonSet image from deploy/container/Containerfile (`make image`).
#
#   deploy/container/build-image.sh [--stage-only] [IMAGE]     IMAGE default offloadd:VERSION,
#                                                              VERSION from `offloadd --version`
#   make image [IMAGE=registry.example.com/offloadd:VERSION]
#
# 1. builds offloadd (with the cuda backend: needs the CUDA toolkit at /usr/local/cuda) and
#    offloadctl with Bazel;
# 2. stages the build context in build/image/: Containerfile and rootfs/ (the binaries, the
#    entrypoint, libcudart from the toolkit, the documentation);
# 3. builds IMAGE from it with the first of buildah, podman or docker that works here.
# --stage-only stops after 2.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
stage_only=false
if [ "${1:-}" = --stage-only ]; then stage_only=true; shift; fi
image=${1:-}
BAZEL=${BAZEL:-bazel}

if [ ! -x /usr/local/cuda/bin/nvcc ] && [ "${OFFLOADD_IMAGE_ALLOW_NO_CUDA:-}" != 1 ]; then
  echo "build-image.sh: no CUDA toolkit at /usr/local/cuda: the image's daemon needs the cuda" \
       "backend (OFFLOADD_IMAGE_ALLOW_NO_CUDA=1 stages an shm-only build for tests)" >&2
  exit 1
fi
$BAZEL build //server:offloadd //client/cli:offloadctl
bin=$($BAZEL info bazel-bin 2>/dev/null)
# The image's tag is the daemon's version (deploy/k8s/daemonset.yaml names the same).
version=$("$bin/server/offloadd" --version | awk '{ print $2 }')
image=${image:-offloadd:$version}

ctx=build/image
rm -rf "$ctx"
mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/usr/local/share/doc/offloadd"
cp deploy/container/Containerfile "$ctx/"
install -m 0755 "$bin/server/offloadd" "$bin/client/cli/offloadctl" "$ctx/rootfs/usr/local/bin/"
install -m 0755 deploy/container/entrypoint.sh "$ctx/rootfs/usr/local/bin/offloadd-entrypoint"
bash deploy/install_docs.sh "$ctx/rootfs/usr/local/share/doc/offloadd"
# The CUDA runtime the daemon links, where its rpath (/usr/local/cuda/lib64) finds it.
cudart=$(ldd "$ctx/rootfs/usr/local/bin/offloadd" | awk '/libcudart/ { print $3 }')
if [ -n "$cudart" ]; then
  mkdir -p "$ctx/rootfs/usr/local/cuda/lib64"
  cp -L "$cudart" "$ctx/rootfs/usr/local/cuda/lib64/$(basename "$cudart")"
fi
echo "build-image.sh: staged $ctx ($(du -sh "$ctx" | cut -f1))"
$stage_only && exit 0

# Daemonless builders first; `docker` only when it reaches an engine.
if command -v buildah >/dev/null; then
  exec buildah build --isolation chroot --storage-driver vfs -f "$ctx/Containerfile" -t "$image" "$ctx"
elif command -v podman >/dev/null; then
  exec podman build -f "$ctx/Containerfile" -t "$image" "$ctx"
elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  exec docker build -f "$ctx/Containerfile" -t "$image" "$ctx"
fi
echo "build-image.sh: no image builder here (buildah, podman, or docker with an engine): the" \
     "context is staged in $ctx; build it elsewhere with: buildah build -t $image $ctx" >&2
exit 1
