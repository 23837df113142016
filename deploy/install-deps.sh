#!/usr/bin/env bash
# Installs every Debian package offloadd's build, tests, demo and benchmarks need.
# Idempotent: when everything is present it only runs dpkg-query and exits (~0.1 s).
# The Python environment of the client, tests and demos (torch, Transformers, grpcio) is not a
# Debian package: deploy/python-env.sh installs it into .venv/ from client/python/requirements.lock.
# Debian's python3-grpcio/-protobuf/-yaml serve the stdlib-level scripts (monitoring tests,
# scheduler benchmark) that run on /usr/bin/python3.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap build-essential pkg-config
  protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev libgrpc-dev
  libabsl-dev libgoogle-glog-dev libgflags-dev
  prometheus-cpp-dev googletest libgtest-dev libgmock-dev libbenchmark-dev
  liblapacke-dev libopenblas-dev libssl-dev liburing-dev libnuma-dev nlohmann-json3-dev
  libsystemd-dev
  python3 python3-dev python3-venv python3-grpcio python3-protobuf python3-yaml python3-numpy
  prometheus curl
  clang util-linux
  debootstrap
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
