#!/usr/bin/env bash
# Generate the gRPC stubs from the .proto files. Reproducible: same grpcio-tools, same output.
# Imports inside the generated code are rewritten to the package's import path.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# -P: never put the working directory on sys.path, where operator/ would shadow the stdlib.
export PYTHONSAFEPATH=1
# Type stubs: mypy-protobuf's plugins when installed (typed messages and gRPC stubs, for
# mypy --strict), else protoc's own message stubs.
BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
if [ -x "$BIN/protoc-gen-mypy" ] && [ -x "$BIN/protoc-gen-mypy_grpc" ]; then
  stub_args() { echo "--plugin=protoc-gen-mypy=$BIN/protoc-gen-mypy --mypy_out=$1 --plugin=protoc-gen-mypy_grpc=$BIN/protoc-gen-mypy_grpc --mypy_grpc_out=$1"; }
else
  stub_args() { echo "--pyi_out=$1"; }
fi
gen() {  # gen DIR PKG
  local dir=$1 pkg=$2
  for proto in "$dir"/*.proto; do
    # shellcheck disable=SC2046
    "$PY" -m grpc_tools.protoc -I "$dir" --python_out="$dir" --grpc_python_out="$dir" \
      $(stub_args "$dir") "$proto"
  done
  # protoc writes `import x_pb2`; make it a package-relative import.
  sed -i -E "s/^import ([a-z_]+_pb2) as /from $pkg import \1 as /" "$dir"/*_pb2_grpc.py
}
gen cacheserver/proto strata.cacheserver.proto
if [ -d cacheserver/csi/proto ]; then gen cacheserver/csi/proto strata.cacheserver.csi.proto; fi
