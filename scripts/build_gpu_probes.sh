#!/usr/bin/env bash
# Build gpu_probes (the device-side module) into gpu_probes/build/ and write
# gpu_probes/build/manifest.json listing what was built (absolute paths).
#
#   scripts/build_gpu_probes.sh            # incremental (make): fast when up to date
#   NVBIT_HOME=/opt/nvbit_release scripts/build_gpu_probes.sh   # also the NVBit tool
#   NVCC=/path/to/nvcc GPU_PROBES_GENCODE="-gencode ..." ...    # override the compiler / architectures
#
# Needs nvcc 13.0 and the pip wheel nvidia-cuda-sanitizer-api==13.0.* in .venv.  Without nvcc (or
# without the wheel) it prints one `SKIPPED: ...` line and exits 0, so that set-up never fails on a
# machine without the CUDA toolkit.  Device code is compile-only here: running it needs a GPU
# (scripts/gpu_check).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/gpu_probes/build
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3

nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
  nvcc=$(command -v nvcc || true)
  [ -n "$nvcc" ] || nvcc=$(ls -d /usr/local/cuda*/bin/nvcc 2>/dev/null | sort -V | tail -n1 || true)
fi
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
  echo "SKIPPED: gpu_probes: nvcc not found (install the CUDA toolkit 13.0 or set NVCC)"
  exit 0
fi
# nvcc may be a wrapper script: ask it where its toolkit is.
cuda=$("$nvcc" -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)
cuda=$(cd "${cuda:-$(dirname "$nvcc")/..}" && pwd)
nvcc_ver=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')

# The Sanitizer headers and library come from the pip wheel, whose minor version must match nvcc's.
san=$("$py" - "$nvcc_ver" <<'PY' || true
import sys
from importlib import metadata
try:
    dist = metadata.distribution("nvidia-cuda-sanitizer-api")
except metadata.PackageNotFoundError:
    print("missing"); sys.exit(0)
want = sys.argv[1]
if not dist.version.startswith(want + "."):
    print(f"version {dist.version} does not match nvcc {want}"); sys.exit(0)
hdr = next((f for f in dist.files if str(f).endswith("include/sanitizer.h")), None)
lib = next((f for f in dist.files if str(f).endswith("lib/libsanitizer-public.so")), None)
if hdr is None or lib is None:
    print("the wheel has no sanitizer.h / libsanitizer-public.so"); sys.exit(0)
print("ok", dist.version, dist.locate_file(hdr).resolve().parent, dist.locate_file(lib).resolve().parent)
PY
)
read -r san_state san_ver san_inc san_lib <<<"${san:-missing}" || true
# A machine with a full CUDA toolkit (a GPU machine) has the same API in the toolkit itself.
if [ "$san_state" != ok ] && [ -f "$cuda/compute-sanitizer/include/sanitizer.h" ] &&
   [ -f "$cuda/compute-sanitizer/libsanitizer-public.so" ]; then
  san_state=ok san_ver="toolkit-$nvcc_ver" san_inc=$cuda/compute-sanitizer/include san_lib=$cuda/compute-sanitizer
fi

gencode=${GPU_PROBES_GENCODE:-"-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_100,code=sm_100 -gencode arch=compute_120,code=sm_120"}
mk=(make -s -C "$root/gpu_probes" -j"$(nproc)" NVCC="$nvcc" BIN2C="$cuda/bin/bin2c" CUDA_INC="$cuda/include"
    CUDA_LIB="$cuda/lib64" GENCODE="$gencode")

targets=(nvbit-device)
if [ "$san_state" = ok ]; then
  targets+=(sanitizer)
  mk+=(SAN_INC="$san_inc" SAN_LIB="$san_lib")
else
  echo "SKIPPED: gpu_probes sanitizer backend: nvidia-cuda-sanitizer-api==${nvcc_ver}.* ${san:-missing} (pip install 'nvidia-cuda-sanitizer-api==${nvcc_ver}.*')"
fi
# The C CUPTI injection (for programs that are not Python) needs the toolkit's CUPTI headers.
cupti_lib=$(dirname "$(ls "$cuda"/lib64/libcupti.so "$cuda"/extras/CUPTI/lib64/libcupti.so 2>/dev/null | head -n1)" 2>/dev/null || true)
if [ -f "$cuda/include/cupti.h" ] && [ -n "$cupti_lib" ] && [ -f "$cupti_lib/libcupti.so" ]; then
  targets+=(cupti)
  mk+=(CUPTI_LIB="$cupti_lib")
else
  echo "SKIPPED: gpu_probes CUPTI injection: no cupti.h / libcupti.so in $cuda"
fi
nvbit_note="NVBIT_HOME not set"
if [ -n "${NVBIT_HOME:-}" ]; then
  if [ -f "$NVBIT_HOME/core/libnvbit.a" ] && [ -f "$NVBIT_HOME/core/nvbit.h" ]; then
    targets+=(nvbit)
    mk+=(NVBIT_HOME="$NVBIT_HOME")
    nvbit_note=""
  else
    nvbit_note="NVBIT_HOME=$NVBIT_HOME has no core/libnvbit.a and core/nvbit.h"
  fi
fi
[ -z "$nvbit_note" ] || echo "SKIPPED: $nvbit_note"
if [ "${1:-}" = --gpu-tests ]; then targets+=(gpu-tests); fi

# make does not see a changed architecture list: start over when it changes.
mkdir -p "$out"
if [ "$(cat "$out/.gencode" 2>/dev/null)" != "$gencode" ]; then
  rm -f "$out"/*.fatbin "$out"/*.o "$out"/*.so "$out"/*.c "$out"/vecadd
  printf '%s' "$gencode" > "$out/.gencode"
fi
"${mk[@]}" "${targets[@]}"

"$py" - "$out" "$nvcc" "$nvcc_ver" "${san_ver:-}" "$gencode" "$nvbit_note" <<'PY'
import json, os, sys, re
out, nvcc, nvcc_ver, san_ver, gencode, nvbit_note = sys.argv[1:]
def art(name):
    p = os.path.join(out, name)
    return p if os.path.exists(p) else None
m = {
    "format_version": 1,
    "nvcc": nvcc,
    "nvcc_version": nvcc_ver,
    "sanitizer_api_version": san_ver or None,
    "archs": [f"sm_{a}" for a in sorted({int(a) for a in re.findall(r"code=sm_(\d+)", gencode)})],
    "artifacts": {
        "sanitizer": art("libgpu_probes_sanitizer.so"),
        "sanitizer_patches": art("san_patches.fatbin"),
        "cupti": art("libgpu_probes_cupti.so"),
        "nvbit": art("libgpu_probes_nvbit.so"),
        "nvbit_device": art("nvbit_inject.o"),
        "vecadd": art("vecadd"),
    },
    "skipped": {"nvbit": nvbit_note} if nvbit_note else {},
}
tmp = os.path.join(out, "manifest.json.tmp")
with open(tmp, "w") as f:
    json.dump(m, f, indent=2)
os.replace(tmp, os.path.join(out, "manifest.json"))
PY
echo "gpu_probes: built into $out (manifest.json lists the artefacts)"
