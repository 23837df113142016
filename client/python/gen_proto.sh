#!/bin/sh
# Generates the Python protocol stubs of the offloadd package from proto/ (idempotent).
#
#   client/python/gen_proto.sh            # from anywhere; writes client/python/offloadd/v1/
#
# Uses Debian's /usr/bin/protoc and /usr/bin/grpc_python_plugin (packages protobuf-compiler and
# protobuf-compiler-grpc); override with PROTOC=... GRPC_PYTHON_PLUGIN=... . The generated files
# are gitignored (/client/python/offloadd/v1/*_pb2*.py). protoc emits an absolute import
# ("import offload_pb2") in *_pb2_grpc.py; it is rewritten to a package-relative one so the stubs
# live inside offloadd.v1 without touching sys.path.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
protoc=${PROTOC:-/usr/bin/protoc}
plugin=${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}
out="$here/offloadd/v1"
# From the repository root, as Bazel compiles them (projector.proto imports "proto/offload.proto").
protos="proto/offload.proto proto/projector.proto"

for tool in "$protoc" "$plugin"; do
  if [ ! -x "$tool" ]; then
    echo "gen_proto.sh: $tool not found:" \
         "apt-get install protobuf-compiler protobuf-compiler-grpc" >&2
    exit 1
  fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$root" && "$protoc" -I . --python_out="$tmp" --grpc_out="$tmp" \
  --plugin=protoc-gen-grpc="$plugin" $protos)
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
