#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh Debian 12 machine for pasta-trace (run as root).
#  1. Debian packages: python3-bpfcc (BCC 0.26; NEVER the unrelated PyPI package `bcc`), kernel headers,
#     a compiler, Debian's HIP runtime (a real libamdhip64 for the probe tests), Chromium (HTML report test),
#     Prometheus (the daemon's metrics test starts its own server on a free port and scrapes the daemon).
#  2. Kernel headers for BCC.  BCC compiles its programs against /lib/modules/$(uname -r)/build.  When the
#     running kernel ships no headers (as on our Firecracker VMs) we point that path at Debian's
#     linux-headers-amd64 tree ("build" -> the -amd64 tree, "source" -> the -common tree) so that BCC's
#     clang finds both halves.  The uprobe programs only use pt_regs and BPF helpers, whose layout is stable
#     across these versions.  An existing `build` link is never touched.
#  3. A virtual environment (.venv) on Debian's python3 with --system-site-packages, so that BCC's Debian
#     module is importable, and `pip install -e .[dev]` (the test tools, Dask for the cluster analyses).
#  4. NVIDIA's real libcuda.so.1 from Debian non-free (drivers 535 from bookworm and 550 from trixie) and
#     libnccl.so.2 from PyPI's nvidia-nccl-cu13 wheel, unpacked into a cache (not installed): for tests.
#  5. PyTorch's CPU build (torch 2.13.0+cpu) in a private cache (not installed): for the tensor tests.
#  6. gpu_probes: the device-side module (compile-only here; NVBit only where NVBIT_HOME is set).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[setup] %s\n' "$*" >&2; }
. scripts/as_root.sh  # root for apt-get, headers and BPF: sudo when not root

pkgs=(python3-bpfcc python3-venv python3-dev linux-headers-amd64 gcc g++ make libamdhip64-5 libamdhip64-dev
      chromium util-linux binutils tmux prometheus)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

kdir=/lib/modules/$(uname -r)
if [ ! -e "$kdir/build" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1)
  [ -n "$hdr" ] || { echo "no Debian kernel headers under /usr/src" >&2; exit 1; }
  common=${hdr%-amd64}-common
  say "no headers for $(uname -r): linking $kdir/build -> $hdr and source -> $common (Debian's headers, for BCC)"
  mkdir -p "$kdir"
  ln -s "$hdr" "$kdir/build"
  [ -e "$kdir/source" ] || ln -s "$common" "$kdir/source"
fi

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import bcc' 2>/dev/null; then
  say "creating .venv on Debian's python3 (sees BCC from dist-packages)"
  rm -rf .venv
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.pasta-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "pip install -e .[dev]"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[dev]'
  touch "$stamp"
fi

for driver in 535 550; do
  if ! scripts/fetch_vendor_libs.sh --driver "$driver" >/dev/null; then
    say "could not fetch NVIDIA's libcuda1 $driver (non-free): the tests on that real driver will skip"
  fi
done
if ! scripts/fetch_nccl.sh >/dev/null; then
  say "could not fetch NVIDIA's libnccl.so.2 (PyPI nvidia-nccl-cu13): the real-NCCL tests will skip"
fi

if ! scripts/fetch_torch_cpu.sh >/dev/null; then
  say "could not install PyTorch's CPU build: the tensor tests will skip"
fi

if [ -x scripts/build_gpu_probes.sh ]; then scripts/build_gpu_probes.sh; fi
say "ready"
