#!/usr/bin/env bash
# Install PyTorch's CPU build into a private cache WITHOUT touching any environment: the tests that trace real
# tensors put the cache on the workload's sys.path.  The version is pinned with its `+cpu` local tag, so pip can
# never pick the multi-GB CUDA build that PyPI's plain `torch` is.  pip's own configuration is tried first (a local
# wheel folder, a mirror); then PyTorch's CPU index.
#
# Usage: scripts/fetch_torch_cpu.sh [CACHE_DIR]
#        (default: $PASTA_TORCH_CACHE or ~/.cache/pasta-trace/torch-2.13.0-cpu)
# PYTHON: the interpreter the workloads run under (default: .venv/bin/python, else python3); the wheel is cp311.
# Prints the directory to put on sys.path on success; exits 3 (with the reason on stderr) if it cannot install.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.13.0
cache="${1:-${PASTA_TORCH_CACHE:-$HOME/.cache/pasta-trace/torch-$version-cpu}}"
if [ -f "$cache/.complete" ]; then echo "$cache"; exit 0; fi
python="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 )}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "cannot install torch $version+cpu: its wheel is for CPython 3.11, $python is $("$python" -V 2>&1)" >&2; exit 3
fi
mkdir -p "$(dirname "$cache")"
tmp=$(mktemp -d "$cache.partial.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
log="$tmp.log"; trap 'rm -rf "$tmp" "$log"' EXIT
spec="torch==$version+cpu"
if ! "$python" -m pip install -q --disable-pip-version-check --target "$tmp" "$spec" >"$log" 2>&1 &&
   ! "$python" -m pip install -q --disable-pip-version-check --target "$tmp" \
       --extra-index-url https://download.pytorch.org/whl/cpu "$spec" >>"$log" 2>&1; then
  echo "cannot install $spec: $(grep -E 'ERROR|error' "$log" | tail -n1)" >&2; exit 3
fi
rm -rf "$cache"; mv "$tmp" "$cache"; touch "$cache/.complete"
echo "$cache"
