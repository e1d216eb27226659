#!/usr/bin/env bash
# Fetch NVIDIA's real libnccl.so.2 and nccl.h from the PyPI wheel
# `nvidia-nccl-cu13` (216-305 MB; -cu12 as a fallback) into a private cache,
# WITHOUT installing it: `pip download --no-deps`, then only the library and
# the header are unpacked, and the wheel is deleted.  Tests call the library
# without a GPU (its calls fail at once, which is what they check).
#
# Usage: scripts/fetch_nccl.sh [CACHE_DIR]   (default: $PASTA_VENDOR_CACHE or ~/.cache/pasta-trace/vendor)
# Prints the path of libnccl.so.2 on success; exits 3 if no wheel can be fetched.
set -euo pipefail
cache="${1:-${PASTA_VENDOR_CACHE:-$HOME/.cache/pasta-trace/vendor}}/nccl"
lib="$cache/lib/libnccl.so.2"
if [ -f "$lib" ] && [ -f "$cache/VERSION" ]; then echo "$lib"; exit 0; fi

cd "$(dirname "$0")/.."
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
mkdir -p "$cache"
dl=$(mktemp -d "$cache/.download.XXXXXX"); trap 'rm -rf "$dl"' EXIT
for pkg in nvidia-nccl-cu13 nvidia-nccl-cu12; do
  if "$py" -m pip download -q --no-deps --only-binary=:all: "$pkg" -d "$dl" >"$dl/pip.log" 2>&1; then break; fi
done
wheel=$(ls "$dl"/nvidia_nccl_cu1*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "cannot fetch libnccl.so.2: pip download nvidia-nccl-cu13/-cu12 failed: $(tail -n1 "$dl/pip.log")" >&2; exit 3
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
echo "$lib"
