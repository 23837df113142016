#!/bin/sh
# Generates the Python protocol stubs of the offloadd package from proto/ (idempotent).
#
#   client/python/gen_proto.sh            # from anywhere; writes client/python/offloadd/v1/
#
# Default: protoc and the gRPC plugin of the grpcio-tools package, run by $PYTHON (default: the
# repository's .venv/bin/python, else python3 on PATH), so the generated code matches the
# protobuf/grpcio runtime of that environment (the stubs require protobuf >= 7.35.1 and
# grpcio >= 1.85.1, the versions grpcio-tools 1.85.1 generates for).
# OFFLOADD_PROTOC=debian uses Debian's /usr/bin/protoc 3.21 and /usr/bin/grpc_python_plugin
# instead (for environments with an older protobuf runtime, such as the GPU bundle's machine).
# The generated files are gitignored (/client/python/offloadd/v1/*_pb2*.py). protoc emits absolute
# imports ("from proto import offload_pb2") in the stubs; they are rewritten to package-relative
# ones so the stubs live inside offloadd.v1 without touching sys.path.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$here/offloadd/v1"
# From the repository root, as Bazel compiles them (projector.proto imports "proto/offload.proto").
protos="proto/offload.proto proto/projector.proto"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "${OFFLOADD_PROTOC:-}" = debian ]; then
  for tool in /usr/bin/protoc /usr/bin/grpc_python_plugin; do
    if [ ! -x "$tool" ]; then
      echo "gen_proto.sh: $tool not found: apt-get install protobuf-compiler protobuf-compiler-grpc" >&2
      exit 1
    fi
  done
  (cd "$root" && /usr/bin/protoc -I . --python_out="$tmp" --grpc_out="$tmp" \
    --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin $protos)
else
  py=${PYTHON:-}
  if [ -z "$py" ]; then
    if [ -x "$root/.venv/bin/python" ]; then py=$root/.venv/bin/python; else py=python3; fi
  fi
  if ! "$py" -c "import grpc_tools.protoc" 2>/dev/null; then
    echo "gen_proto.sh: $py has no grpc_tools: run 'bash deploy/python-env.sh' (or pip install" \
         "grpcio-tools), or set OFFLOADD_PROTOC=debian to use Debian's protoc" >&2
    exit 1
  fi
  (cd "$root" && "$py" -m grpc_tools.protoc -I . --python_out="$tmp" --grpc_python_out="$tmp" \
    $protos)
fi
mv "$tmp"/proto/*.py "$tmp"/ && rmdir "$tmp"/proto
for f in "$tmp"/*_pb2.py "$tmp"/*_pb2_grpc.py; do
  sed -e 's/^import \([A-Za-z0-9_]*_pb2\) as /from . import \1 as /' \
      -e 's/^from proto import \([A-Za-z0-9_]*_pb2\) as /from . import \1 as /' "$f" > "$f.fixed"
  mv "$f.fixed" "$f"
done
mkdir -p "$out"
for f in "$tmp"/*.py; do
  name=$(basename "$f")
  # Replace only when the content changed, so repeated runs leave mtimes alone.
  if ! cmp -s "$f" "$out/$name"; then
    cp "$f" "$out/$name"
  fi
done
echo "gen_proto.sh: stubs up to date in $out"
