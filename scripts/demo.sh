#!/usr/bin/env bash
# The README's main command: set everything up, then record the sample workload.
#
#   scripts/demo.sh [CAPTURE_DIR]        (default: pasta-demo; as root: re-runs itself through sudo if not)
#
# On a machine with an NVIDIA (or AMD) GPU the workload is a small real program
# (scripts/demo_workload.c); elsewhere it runs on pasta-trace's stand-in
# libcuda.so.1 (tests/fixtures/cuda_stub.c: the real exported names, no GPU)
# and says so: "SIMULATION: ...".
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/as_root.sh
out="${1:-pasta-demo}"
build=tests/fixtures/build

scripts/setup.sh
mkdir -p "$build"
# The stand-in library needs the CUDA 13 cuda.h; a GPU machine does not need it.
if ! .venv/bin/python tests/fixtures/build.py "$build" >/dev/null 2>"$build/demo-build.log"; then
  cat "$build/demo-build.log" >&2
fi
grep -h "skipping cuda_stub" "$build/demo-build.log" >&2 || true
gcc -O2 -Wall scripts/demo_workload.c -o "$build/demo_workload" -ldl

if [ -x .venv/bin/pasta-trace ]; then pasta=(.venv/bin/pasta-trace); else pasta=(.venv/bin/python -m pasta_trace.cli); fi
"${pasta[@]}" -o "$out" --force -- "$PWD/$build/demo_workload" "$PWD/$build/cuda/libcuda.so.1" 5
if ! "${pasta[@]}" report "$out"; then
  echo "demo: 'pasta-trace report' is not available yet; skipped (the capture is in $out)" >&2
fi
