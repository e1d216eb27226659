#!/usr/bin/env bash
# Fetch NVIDIA's real libnccl.so.2 and nccl.h from the PyPI wheel
# `nvidia-nccl-cu13`, pinned (216-305 MB), into a private cache,
# WITHOUT installing it: `pip download --no-deps`, then only the library and
# the header are unpacked, and the wheel is deleted.  Tests call the library
# without a GPU (its calls fail at once, which is what they check).
#
# The wheel is pinned: pasta_trace/return_codes.py is generated from this
# nccl.h and its check compares the header's version too, and the tests and
# docs name this release (NVIDIA publishes point releases that would change
# them under a clean clone).  PASTA_NCCL_WHEEL overrides the requirement,
# e.g. PASTA_NCCL_WHEEL=nvidia-nccl-cu12 for the newest CUDA 12 build.
#
# Usage: scripts/fetch_nccl.sh [CACHE_DIR]   (default: $PASTA_VENDOR_CACHE or ~/.cache/pasta-trace/vendor)
# Prints the path of libnccl.so.2 on success; exits 3 if no wheel can be fetched.
set -euo pipefail
want="${PASTA_NCCL_WHEEL:-nvidia-nccl-cu13==2.32.3}"
cache="${1:-${PASTA_VENDOR_CACHE:-$HOME/.cache/pasta-trace/vendor}}/nccl"
lib="$cache/lib/libnccl.so.2"
# A cache holds one release; it is reused only when it is the one asked for.
if [ -f "$lib" ] && [ "$(cat "$cache/REQUIREMENT" 2>/dev/null)" = "$want" ]; then echo "$lib"; exit 0; fi

cd "$(dirname "$0")/.."
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
mkdir -p "$cache"
dl=$(mktemp -d "$cache/.download.XXXXXX"); trap 'rm -rf "$dl"' EXIT
"$py" -m pip download -q --no-deps --only-binary=:all: "$want" -d "$dl" >"$dl/pip.log" 2>&1 || true
wheel=$(ls "$dl"/nvidia_nccl_cu1*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "cannot fetch libnccl.so.2: pip download $want failed: $(tail -n1 "$dl/pip.log")" >&2; exit 3
fi
"$py" - "$wheel" "$cache" <<'PY'
import os, sys, zipfile
wheel, cache = sys.argv[1:]
want = {"nvidia/nccl/lib/libnccl.so.2": "lib/libnccl.so.2", "nvidia/nccl/include/nccl.h": "include/nccl.h"}
with zipfile.ZipFile(wheel) as z:
    for src, dst in want.items():
        out = os.path.join(cache, dst)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(src) as f, open(out + ".tmp", "wb") as g:
            while chunk := f.read(1 << 20):
                g.write(chunk)
        os.replace(out + ".tmp", out)
name, version = os.path.basename(wheel).split("-")[:2]
open(os.path.join(cache, "VERSION"), "w").write(f"{name} {version}\n")
PY
printf '%s\n' "$want" >"$cache/REQUIREMENT"
echo "$lib"
