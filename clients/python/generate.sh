#!/bin/sh
# Regenerates the Python client's generated code with Debian's protoc and
# gRPC plugin (or $PROTOC and $GRPC_PYTHON_PLUGIN):
#   coordd/v1/*_pb2.py, *_pb2_grpc.py  from the repository's proto/coordd/v1/*.proto
#   coordd/rpc/status_pb2.py           from proto/coordd/rpc/status.proto (a google.rpc subset)
# Idempotent: old generated files are deleted first. Runs from anywhere.
# Needs: apt-get install protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
protoc=${PROTOC:-/usr/bin/protoc}
plugin=${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}
[ -x "$protoc" ] || { echo "generate.sh: $protoc missing: apt-get install protobuf-compiler" >&2; exit 1; }
[ -x "$plugin" ] || { echo "generate.sh: $plugin missing: apt-get install protobuf-compiler-grpc" >&2; exit 1; }

# Delete what an earlier run generated (only generated files: *_pb2*.py).
for d in "$here/coordd/v1" "$here/coordd/rpc"; do
  mkdir -p "$d"
  find "$d" -maxdepth 1 -name '*_pb2*.py' -exec rm -f {} +
  rm -rf "$d/__pycache__"
  : > "$d/__init__.py"   # empty package marker
done

cd "$repo"
"$protoc" -I proto --python_out="$here" --grpc_python_out="$here" \
  --plugin=protoc-gen-grpc_python="$plugin" proto/coordd/v1/*.proto
# The google.rpc subset has no services: no gRPC stubs.
"$protoc" -I "$here/proto" --python_out="$here" "$here/proto/coordd/rpc/status.proto"

echo "generated: $(cd "$here" && find coordd/v1 coordd/rpc -name '*_pb2*.py' | sort | tr '\n' ' ')"
