#!/bin/sh
# Regenerates src/gen/ from the repository's protos (../../proto/coordd/v1)
# and the local google.rpc subset (proto/google/rpc), with Debian's protoc
# (or $PROTOC) and protoc-gen-es from node_modules. Idempotent: the old
# generated files are removed first. Run from anywhere: npm run generate.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
protoc=${PROTOC:-protoc}
plugin="$here/node_modules/.bin/protoc-gen-es"
[ -x "$plugin" ] || { echo "generate.sh: $plugin missing: run npm ci first" >&2; exit 1; }
# protoc needs the well-known types' .proto files (google/protobuf/*.proto):
# Debian ships them in libprotobuf-dev, under /usr/include.
wkt=""
for d in ${PROTOC_INCLUDE:-} /usr/include /usr/local/include; do
  if [ -f "$d/google/protobuf/timestamp.proto" ]; then wkt=$d; break; fi
done
[ -n "$wkt" ] || { echo "generate.sh: google/protobuf/timestamp.proto not found: apt-get install libprotobuf-dev, or set PROTOC_INCLUDE" >&2; exit 1; }
out="$here/src/gen"
rm -rf "$out"
mkdir -p "$out"
opts="target=ts,import_extension=js"
"$protoc" -I "$repo/proto" -I "$wkt" --plugin=protoc-gen-es="$plugin" \
  --es_out="$out" --es_opt="$opts" "$repo"/proto/coordd/v1/*.proto
"$protoc" -I "$here/proto" -I "$wkt" --plugin=protoc-gen-es="$plugin" \
  --es_out="$out" --es_opt="$opts" "$here"/proto/google/rpc/error_details.proto
echo "generated: $(cd "$out" && find . -name '*.ts' | sort | tr '\n' ' ')"
