#!/usr/bin/env bash
# Generate the gRPC stubs from the .proto files into the source tree. Reproducible: same
# grpcio-tools, same output. The one generator is setup.py's (every package build runs it too).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# -P: never put the working directory on sys.path, where operator/ would shadow the stdlib.
"$PY" -P setup.py -q build_protos
