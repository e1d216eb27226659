#!/usr/bin/env python3
"""Overhead of pasta-trace's host probes per traced call (run as root).

One run measures, on the same functions and interleaved rep by rep:

* a -O0 stub ``libcuda.so.1`` built here from ``cuda.h``'s real signatures
  (its exports start ``push %rbp``, like libcudart's and Debian HIP's):
  untraced; an empty uprobe (the floor); pasta-trace's launch probe
  (``cuLaunchKernel``); an empty uprobe + uretprobe; pasta-trace's allocation
  probe (``cuMemAlloc_v2``, entry + return).  Targets: launch <= 1.3x the empty
  uprobe's cost, alloc <= 1.3x the empty pair's cost;
* the return probes that give launches, copies, memsets and frees their
  return code (catalog.SAVED_KINDS: the entry builds the event, the
  uretprobe writes it with ``ret``): the launch, a copy (``cuMemcpyHtoD_v2``)
  and the runtime launch, each also probed entry-only as before them (the
  same handlers, built without the return probe), against an empty uprobe
  and an empty uprobe + uretprobe.  The added cost is the ratio of each to
  its entry-only run;
* the event record probe (``cuEventRecord``, entry-only; stream capture's
  fork and join, bpf/pasta.h pt_capture_record): with no stream of any
  process under capture (``capture_n`` 0, nearly always: one array lookup
  more than a plain entry probe) and with one (``capture_n`` set by hand: the
  process's capture table looked up, and missed), against an empty uprobe;
* a -O0 stub runtime (``cudaLaunchKernel`` from ``cuda_runtime_api.h``) that
  calls the stub driver's ``cuLaunchKernel``: untraced; an empty uprobe on
  each of the two; pasta-trace's runtime and driver launch probes (one launch
  event each; the driver's, nested in it, is written for the first launch of
  the kernel on its thread and folded after: manifest ``folded_launches``).
  Target: <= 1.3x the two empty uprobes (+ uretprobes: both launches have
  their return probe);
* the same stub's PyTorch tensor entry points (libc10's
  ``c10::reportMemoryUsageToProfiler``, the CUDA caching allocator's path, and
  ``ProfiledCPUMemoryReporter::New`` + ``Delete``, the CPU path with its size
  map): untraced; empty uprobes on the same functions; pasta-trace's tensor
  probes.  Target: a tensor event <= 1.3x an empty uprobe;
* a -O0 stub ``ncclAllReduce`` (nccl.h's signature; the stream is its 7th
  argument, read from the stack): untraced; an empty uprobe + uretprobe;
  pasta-trace's collective probe (entry + return).  Target: <= 1.3x the empty pair;
* NVIDIA's real ``libcuda.so.1`` (no GPU: calls return an error at once):
  untraced; an empty uprobe (+uretprobe for the alloc) at the symbol;
  pasta-trace at its chosen offset.  Target: pasta-trace >= 5x cheaper.

"Cost" is ns per call traced minus ns per call untraced in the same rep, in
the calling thread's CPU time (the kernel runs the probe in that thread; on a
shared machine, wall time also counts other processes); ratios are medians of
per-rep ratios, with their quartiles and extremes, and the ratio of the lowest
cost each configuration reached (the run least disturbed by other processes:
on a loaded 2-CPU machine per-rep ratios spread by +-30%, so use many short
reps, e.g. ``--calls 20000 --reps 40``).  The calling loop is C (clock_gettime around N calls through a
dlsym pointer), pinned to CPU 0; the drain runs in this process on CPU 1, reading the ring
every 10 ms by mapping it (pasta_trace.capture.bpf.ringbuf), so nothing is lost.

    sudo .venv/bin/python scripts/bench_probe.py --calls 20000 --reps 40
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pasta_trace import schema  # noqa: E402
from pasta_trace.capture.bpf import bpf_maps, ringbuf  # noqa: E402
from pasta_trace.probes import attach, catalog, elf, program, uprobe_link  # noqa: E402

CUDA_INCLUDE = "/usr/local/cuda-13.0/include"
TRACED_CPU, DRAIN_CPU = 0, 1

NCCL_STUB_C = r"""
/* ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream): nccl.h's layout */
int ncclAllReduce(const void *sendbuff, void *recvbuff, unsigned long count, int datatype, int op, void *comm,
                  void *stream)
{
    return comm ? 0 : 4;
}
"""

STUB_C = r"""
#include <cuda.h>
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                void **kernelParams, void **extra)
{
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)  /* cuda.h: = cuMemcpyHtoD_v2 */
{
    return dst && src ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuEventRecord(CUevent ev, CUstream s)
{
    return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)  /* cuda.h: = cuMemAlloc_v2 */
{
    *dptr = 0x100000 + bytesize;
    return CUDA_SUCCESS;
}
/* libc10's tensor entry points, under their C++ names (c10::Device: two bytes in one register) */
struct c10_device { signed char type, index; };
volatile unsigned long long c10_sink;
void c10_report(void *p, long long n, size_t a, size_t r, struct c10_device d)
    __asm__("_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE");
void c10_report(void *p, long long n, size_t a, size_t r, struct c10_device d) { c10_sink = (size_t)p + n + a + r; }
void c10_new(void *self, void *p, size_t n) __asm__("_ZN3c1025ProfiledCPUMemoryReporter3NewEPvm");
void c10_new(void *self, void *p, size_t n) { c10_sink = (size_t)p + n; }
void c10_delete(void *self, void *p) __asm__("_ZN3c1025ProfiledCPUMemoryReporter6DeleteEPv");
void c10_delete(void *self, void *p) { c10_sink = (size_t)p; }
"""

RT_STUB_C = r"""
#include <cuda.h>
#include <cuda_runtime_api.h>
cudaError_t CUDARTAPI cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s)
{
    return cuLaunchKernel((CUfunction)func, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)smem, (CUstream)s, args, 0)
        ? cudaErrorInvalidResourceHandle : cudaSuccess;
}
"""

LOOP_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        void *, void **, void **);
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*copy_t)(unsigned long long, const void *, size_t);
typedef int (*record_t)(void *, void *);
typedef struct { unsigned x, y, z; } dim3;  /* by value: rsi = x | y << 32, rdx = z, like the runtime's */
typedef int (*rt_launch_t)(const void *, dim3, dim3, void **, size_t, void *);
struct c10_device { signed char type, index; };
typedef void (*report_t)(void *, long long, size_t, size_t, struct c10_device);
typedef void (*new_t)(void *, void *, size_t);
typedef void (*delete_t)(void *, void *);
typedef int (*allreduce_t)(const void *, void *, unsigned long, int, int, void *, void *);
static double clk(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
#define START double w0 = clk(CLOCK_MONOTONIC), c0 = clk(CLOCK_THREAD_CPUTIME_ID)
#define STOP double c1 = clk(CLOCK_THREAD_CPUTIME_ID), w1 = clk(CLOCK_MONOTONIC); \
    printf("%.3f %.3f\n", (c1 - c0) / n, (w1 - w0) / n)
int main(int argc, char **argv)
{
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    long n = atol(argv[3]);
    if (!strcmp(argv[2], "launch")) {
        launch_t f = (launch_t)dlsym(h, "cuLaunchKernel");
        START;
        for (long i = 0; i < n; i++) f((void *)0x1000, 1, 1, 1, 32, 1, 1, 0, (void *)0x99, 0, 0);
        STOP;
    } else if (!strcmp(argv[2], "rtlaunch")) {
        rt_launch_t f = (rt_launch_t)dlsym(h, "cudaLaunchKernel");
        dim3 g = {1, 1, 1}, b = {32, 1, 1};
        START;
        for (long i = 0; i < n; i++) f((void *)0x1000, g, b, 0, 0, (void *)0x99);
        STOP;
    } else if (!strcmp(argv[2], "tensor")) {  /* a 2 MiB block handed out, then taken back, on cuda:0 */
        report_t f = (report_t)dlsym(h, "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE");
        struct c10_device d = {1, 0};
        START;
        for (long i = 0; i < n; i++) f((void *)0x7f0000200000, i & 1 ? -(2 << 20) : 2 << 20, 6 << 20, 20 << 20, d);
        STOP;
    } else if (!strcmp(argv[2], "cpu")) {  /* one CPU tensor made and freed per iteration */
        new_t fn = (new_t)dlsym(h, "_ZN3c1025ProfiledCPUMemoryReporter3NewEPvm");
        delete_t fd = (delete_t)dlsym(h, "_ZN3c1025ProfiledCPUMemoryReporter6DeleteEPv");
        START;
        for (long i = 0; i < n; i++) {
            fn((void *)0x99, (void *)(0x5500000000 + i * 64), 64);
            fd((void *)0x99, (void *)(0x5500000000 + i * 64));
        }
        STOP;
    } else if (!strcmp(argv[2], "copy")) {  /* 4 KiB host to device */
        copy_t f = (copy_t)dlsym(h, "cuMemcpyHtoD_v2");
        static char src[4096];
        START;
        for (long i = 0; i < n; i++) f(0x7f0000200000ull, src, sizeof src);
        STOP;
    } else if (!strcmp(argv[2], "record")) {  /* cuEventRecord(event, stream) */
        record_t f = (record_t)dlsym(h, "cuEventRecord");
        START;
        for (long i = 0; i < n; i++) f((void *)0x2000, (void *)0x99);
        STOP;
    } else if (!strcmp(argv[2], "allreduce")) {
        allreduce_t f = (allreduce_t)dlsym(h, "ncclAllReduce");
        START;
        for (long i = 0; i < n; i++) f((void *)0x1000, (void *)0x2000, 1024, 7, 0, (void *)0x1234, (void *)0x99);
        STOP;
    } else {
        alloc_t f = (alloc_t)dlsym(h, "cuMemAlloc_v2");
        unsigned long long p;
        START;
        for (long i = 0; i < n; i++) f(&p, 64);
        STOP;
    }
    return 0;
}
"""

#: Neither name matches libcuda.so* / libamdhip64.so*, so a pasta-trace -a
#: running on the same machine does not discover (and probe) these copies.
BENCH_STUB = "libbench_cuda_stub.so"
BENCH_NCCL = "libbench_nccl_stub.so"
BENCH_RT_STUB = "libbench_cudart_stub.so"
BENCH_REAL = "libbench_nvidia_driver.so"

EMPTY_BPF = b"int empty(struct pt_regs *ctx) { return 0; }\n"


def build(tmp: Path) -> tuple[Path, Path, Path, Path]:
    (tmp / "stub.c").write_text(STUB_C)
    (tmp / "rt_stub.c").write_text(RT_STUB_C)
    (tmp / "nccl_stub.c").write_text(NCCL_STUB_C)
    (tmp / "loop.c").write_text(LOOP_C)
    stub, rt_stub, nccl = tmp / BENCH_STUB, tmp / BENCH_RT_STUB, tmp / BENCH_NCCL
    loop = tmp / "loop"
    subprocess.run(["gcc", "-O0", "-fcf-protection=none", "-shared", "-fPIC", f"-I{CUDA_INCLUDE}",
                    str(tmp / "stub.c"), "-o", str(stub)], check=True)  # fmt: skip
    subprocess.run(["gcc", "-O0", "-fcf-protection=none", "-shared", "-fPIC", f"-I{CUDA_INCLUDE}",
                    str(tmp / "rt_stub.c"), "-o", str(rt_stub), str(stub), f"-Wl,-rpath,{tmp}"], check=True)  # fmt: skip
    subprocess.run(["gcc", "-O0", "-fcf-protection=none", "-shared", "-fPIC", str(tmp / "nccl_stub.c"),
                    "-o", str(nccl)], check=True)  # fmt: skip
    subprocess.run(["gcc", "-O2", str(tmp / "loop.c"), "-o", str(loop), "-ldl"], check=True)
    return stub, rt_stub, nccl, loop


def real_libcuda() -> str | None:
    proc = subprocess.run([str(ROOT / "scripts/fetch_vendor_libs.sh")], capture_output=True, text=True)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else None


class Drain:
    """Empties the events ring every 10 ms on DRAIN_CPU while a config runs."""

    def __init__(self, bpf):
        self.ring = ringbuf.open_table(bpf, b"events", schema.HOST_EVENT.dtype)
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        os.sched_setaffinity(0, {DRAIN_CPU})
        while not self._stop.wait(0.01):
            self.count += len(self.ring.drain())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.count += len(self.ring.drain())
        return self.count


def run_loop(loop: Path, lib: Path | str, which: str, calls: int) -> tuple[float, float]:
    """(thread CPU ns per call, wall ns per call) of one run of the C loop."""
    out = subprocess.run(["taskset", "-c", str(TRACED_CPU), str(loop), str(lib), which, str(calls)],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    cpu, wall = out.split()
    return float(cpu), float(wall)


def _main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000, help="calls per rep (default 20000)")
    ap.add_argument("--reps", type=int, default=40, help="reps per configuration (default 40); medians are reported")
    ap.add_argument("--skip-real", action="store_true", help="do not measure NVIDIA's libcuda.so.1")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_probe.py needs root (uprobes)", file=sys.stderr)
        return 77
    from bcc import BPF

    by = {x.symbol: x for x in catalog.APIS}
    launch, alloc, rt_launch = by["cuLaunchKernel"], by["cuMemAlloc_v2"], by["cudaLaunchKernel"]
    copy, record = by["cuMemcpyHtoD_v2"], by["cuEventRecord"]
    # the same handlers without their return probe, as launches and copies were probed before (entry only)
    launch_e, rt_launch_e, copy_e = (dataclasses.replace(x, ret=False) for x in (launch, rt_launch, copy))
    report, new, delete, allreduce = (by[catalog.C10_REPORT], by[catalog.C10_CPU_NEW], by[catalog.C10_CPU_DELETE],
                                      by["ncclAllReduce"])
    # Big enough for a whole rep, so a slow drain cannot turn into cheap lost events.
    pages = 1 << max(4, (a.calls * ringbuf.record_stride(schema.HOST_EVENT.size) // 4096).bit_length())
    apis = (launch, alloc, rt_launch, report, new, delete, allreduce, copy, record)
    pasta = BPF(text=program.build(program.Spec(discover=False, ring_pages=2 * pages, apis=apis)).encode())
    entry_only = BPF(text=program.build(program.Spec(discover=False, ring_pages=2 * pages,
                                                              apis=(launch_e, rt_launch_e, copy_e))).encode())
    empty = BPF(text=EMPTY_BPF)

    def empty_probe(lib: str, sym: str, ret: bool, *more: tuple[str, str]):
        """An empty uprobe (+ uretprobe) on lib:sym, and an empty uprobe on each (lib, sym) of ``more``
        (+ uretprobe for a (lib, sym, True))."""
        def attach_it() -> None:
            def one(path: str, name: str, with_ret: bool) -> None:
                sym_ = elf.exported_symbols(path)[name]
                if uprobe_link.available():  # the way pasta-trace attaches: same dispatch cost in the kernel
                    uprobe_link.attach(empty, "empty", path, sym_.file_offset)
                    if with_ret:
                        uprobe_link.attach(empty, "empty", path, sym_.file_offset, retprobe=True)
                    return
                empty.attach_uprobe(name=path.encode(), addr=sym_.vaddr, fn_name=b"empty")
                if with_ret:
                    empty.attach_uretprobe(name=path.encode(), addr=sym_.vaddr, fn_name=b"empty")

            one(lib, sym, ret)
            for other, osym, *other_ret in more:
                one(other, osym, bool(other_ret and other_ret[0]))

        return attach_it, lambda: attach.detach_all(empty)

    def pasta_probe(lib: str, api: catalog.Api, placements: dict, *more: tuple[str, catalog.Api], bpf=None):
        bpf = pasta if bpf is None else bpf  # (a BPF object is falsy until its tables are opened)

        def attach_it() -> None:
            for where, what in ((lib, api), *more):
                res = attach.attach_library(bpf, where, what.family, (what,))
                if res.errors or res.attached != [what.symbol]:
                    raise SystemExit(f"attach failed: {res.errors or res.missing}")
                placements[(where, what.symbol)] = res.placements[what.symbol]

        attach_it.bpf = bpf  # the program whose ring the run drains
        return attach_it, lambda: attach.detach_all(bpf)

    def none():
        return (lambda: None), (lambda: None)

    def capture_live(probe):
        """probe, run while capture_n says a stream somewhere is under capture."""
        attach_it, detach_it = probe
        n = pasta[b"capture_n"]

        def live() -> None:
            attach_it()
            n[n.Key(0)] = n.Leaf(1)

        def idle() -> None:
            n[n.Key(0)] = n.Leaf(0)
            detach_it()

        live.bpf = attach_it.bpf
        return live, idle

    with tempfile.TemporaryDirectory(prefix="pasta-bench-probe-") as d:
        stub, rt_stub, nccl, loop = build(Path(d))
        stub_s, rt_s, nccl_s = str(stub), str(rt_stub), str(nccl)
        placements: dict = {}
        configs = {
            "stub launch untraced": (stub_s, "launch", none(), False),
            "stub launch empty uprobe": (stub_s, "launch", empty_probe(stub_s, "cuLaunchKernel", False), False),
            "stub launch pasta-trace": (stub_s, "launch", pasta_probe(stub_s, launch, placements), True),
            "stub launch entry-only": (stub_s, "launch", pasta_probe(stub_s, launch_e, placements, bpf=entry_only),
                                       True),
            "stub launch empty uprobe+uretprobe": (stub_s, "launch", empty_probe(stub_s, "cuLaunchKernel", True),
                                                   False),
            "stub copy untraced": (stub_s, "copy", none(), False),
            "stub copy empty uprobe": (stub_s, "copy", empty_probe(stub_s, "cuMemcpyHtoD_v2", False), False),
            "stub copy empty uprobe+uretprobe": (stub_s, "copy", empty_probe(stub_s, "cuMemcpyHtoD_v2", True), False),
            "stub copy entry-only": (stub_s, "copy", pasta_probe(stub_s, copy_e, placements, bpf=entry_only), True),
            "stub copy pasta-trace": (stub_s, "copy", pasta_probe(stub_s, copy, placements), True),
            "stub record untraced": (stub_s, "record", none(), False),
            "stub record empty uprobe": (stub_s, "record", empty_probe(stub_s, "cuEventRecord", False), False),
            "stub record pasta-trace": (stub_s, "record", pasta_probe(stub_s, record, placements), True),
            "stub record pasta-trace, a capture live": (stub_s, "record", capture_live(
                pasta_probe(stub_s, record, placements)), True),
            "stub alloc untraced": (stub_s, "alloc", none(), False),
            "stub alloc empty uprobe+uretprobe": (stub_s, "alloc", empty_probe(stub_s, "cuMemAlloc_v2", True), False),
            "stub alloc pasta-trace": (stub_s, "alloc", pasta_probe(stub_s, alloc, placements), True),
            "stub rtlaunch untraced": (rt_s, "rtlaunch", none(), False),
            "stub rtlaunch two empty uprobes": (rt_s, "rtlaunch", empty_probe(rt_s, "cudaLaunchKernel", False,
                                                                               (stub_s, "cuLaunchKernel")), False),
            # both launches have their return probe (the driver's too, where its entry folds)
            "stub rtlaunch two empty pairs": (rt_s, "rtlaunch", empty_probe(rt_s, "cudaLaunchKernel", True,
                                                                             (stub_s, "cuLaunchKernel", True)), False),
            # an event per call (the runtime launch), and the driver launch nested in the first
            # (the later ones of the same kernel fold: counted in tally, no event)
            "stub rtlaunch pasta-trace": (rt_s, "rtlaunch", pasta_probe(rt_s, rt_launch, placements,
                                                                        (stub_s, launch)), (1, 1)),
            "stub rtlaunch entry-only": (rt_s, "rtlaunch", pasta_probe(rt_s, rt_launch_e, placements,
                                                                       (stub_s, launch_e), bpf=entry_only), (1, 1)),
            "stub tensor untraced": (stub_s, "tensor", none(), False),
            "stub tensor empty uprobe": (stub_s, "tensor", empty_probe(stub_s, report.symbol, False), False),
            "stub tensor pasta-trace": (stub_s, "tensor", pasta_probe(stub_s, report, placements), True),
            "stub cpu untraced": (stub_s, "cpu", none(), False),
            "stub cpu empty uprobes": (stub_s, "cpu", empty_probe(stub_s, new.symbol, False, (stub_s, delete.symbol)),
                                       False),
            "stub cpu pasta-trace": (stub_s, "cpu", pasta_probe(stub_s, new, placements, (stub_s, delete)), 2),
            "stub nccl untraced": (nccl_s, "allreduce", none(), False),
            "stub nccl empty uprobe+uretprobe": (nccl_s, "allreduce", empty_probe(nccl_s, "ncclAllReduce", True),
                                                 False),
            "stub nccl pasta-trace": (nccl_s, "allreduce", pasta_probe(nccl_s, allreduce, placements), True),
        }  # fmt: skip
        real = None if a.skip_real else real_libcuda()
        if real:
            print(f"# NVIDIA driver: {real}, measured through a private copy", file=sys.stderr)
            real = str(shutil.copy(real, Path(d) / BENCH_REAL))
        if real:
            configs |= {
                "real launch untraced": (real, "launch", none(), False),
                "real launch empty uprobe at symbol": (real, "launch", empty_probe(real, "cuLaunchKernel", False), False),
                "real launch pasta-trace at placement": (real, "launch", pasta_probe(real, launch, placements), True),
                "real alloc untraced": (real, "alloc", none(), False),
                "real alloc empty pair at symbol": (real, "alloc", empty_probe(real, "cuMemAlloc_v2", True), False),
                "real alloc pasta-trace at placement": (real, "alloc", pasta_probe(real, alloc, placements), True),
            }  # fmt: skip
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in configs}
        progs = (pasta, entry_only)
        lost_before = sum(b[b"lost"].sum(i).value for b in progs for i in range(4))
        folded = {id(b): bpf_maps.read_tallies(b)["folded_launches"] for b in progs}
        for rep in range(a.reps):
            for name, (lib, which, (attach_it, detach_it), drained) in configs.items():
                attach_it()
                bpf = getattr(attach_it, "bpf", pasta)
                drain = Drain(bpf) if drained else None
                try:
                    times[name].append(run_loop(loop, lib, which, a.calls))
                finally:
                    captured = drain.stop() if drain else None
                    if drain:
                        drain.ring.close()
                    detach_it()
                # drained: events per loop iteration, or (per iteration, more in the first) where a
                # nested launch folds
                per, first = drained if isinstance(drained, tuple) else (drained, 0)
                if drained and captured != a.calls * per + first:
                    raise SystemExit(f"{name}: captured {captured} events of {a.calls * per + first} expected")
                if first:
                    now = bpf_maps.read_tallies(bpf)["folded_launches"]
                    if now - folded[id(bpf)] != a.calls - first:
                        raise SystemExit(f"{name}: {now - folded[id(bpf)]} launches folded, {a.calls - first} "
                                         "expected")
                    folded[id(bpf)] = now
            print(f"rep {rep + 1}/{a.reps} done", file=sys.stderr)
        lost = sum(b[b"lost"].sum(i).value for b in progs for i in range(4)) - lost_before

    def untraced(k: str) -> str:
        return " ".join(k.split()[:2]) + " untraced"

    def cost(k: str, rep: int, col: int = 0) -> float:
        """ns a probe adds to one call: minus the untraced run of the same rep"""
        return times[k][rep][col] - times[untraced(k)][rep][col]

    def med(f) -> float:
        return statistics.median(f(r) for r in range(a.reps))

    print(f"# {a.calls} calls x {a.reps} reps, medians; traced loop on CPU {TRACED_CPU}, drain on CPU {DRAIN_CPU}")
    print("# cpu = the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID: probe handling runs in that thread,")
    print("#       time other processes take from it does not count); wall = CLOCK_MONOTONIC")
    print("# probe offsets chosen: " + ", ".join(f"{lib}:{s}+{o}" for (lib, s), o in placements.items()))
    print(f"{'configuration':40s} {'cpu ns/call':>12s} {'cpu cost':>9s} {'wall ns/call':>13s} {'wall cost':>10s}")
    for k in times:
        print(f"{k:40s} {med(lambda r: times[k][r][0]):12.1f} {med(lambda r: cost(k, r)):9.1f} "
              f"{med(lambda r: times[k][r][1]):13.1f} {med(lambda r: cost(k, r, 1)):10.1f}")  # fmt: skip

    rows = [
        ("stub launch: pasta-trace / empty uprobe", "stub launch pasta-trace", "stub launch empty uprobe", "<= 1.3"),
        ("stub alloc: pasta-trace / empty uprobe+uretprobe", "stub alloc pasta-trace",
         "stub alloc empty uprobe+uretprobe", "<= 1.3"),
        ("stub runtime+driver launch: pasta-trace / two empty", "stub rtlaunch pasta-trace",
         "stub rtlaunch two empty uprobes", "<= 1.3"),
        ("stub runtime+driver launch: pasta-trace / two empty pairs", "stub rtlaunch pasta-trace",
         "stub rtlaunch two empty pairs", "<= 1.3"),
        ("stub tensor (report): pasta-trace / empty uprobe", "stub tensor pasta-trace", "stub tensor empty uprobe",
         "<= 1.3"),
        ("stub tensor (New+Delete): pasta-trace / 2 empty", "stub cpu pasta-trace", "stub cpu empty uprobes",
         "<= 1.3"),
        ("stub nccl: pasta-trace / empty uprobe+uretprobe", "stub nccl pasta-trace",
         "stub nccl empty uprobe+uretprobe", "<= 1.3"),
        # the return probes of launches and copies: what they add to the entry-only probe, and the whole
        # against the empty pair it now is
        ("stub launch: with return / entry-only", "stub launch pasta-trace", "stub launch entry-only", ""),
        ("stub launch: with return / empty uprobe+uretprobe", "stub launch pasta-trace",
         "stub launch empty uprobe+uretprobe", "<= 1.3"),
        ("stub launch: entry-only / empty uprobe", "stub launch entry-only", "stub launch empty uprobe", "<= 1.3"),
        ("stub copy: with return / entry-only", "stub copy pasta-trace", "stub copy entry-only", ""),
        ("stub copy: with return / empty uprobe+uretprobe", "stub copy pasta-trace",
         "stub copy empty uprobe+uretprobe", "<= 1.3"),
        ("stub copy: entry-only / empty uprobe", "stub copy entry-only", "stub copy empty uprobe", "<= 1.3"),
        ("stub runtime+driver launch: with return / entry-only", "stub rtlaunch pasta-trace",
         "stub rtlaunch entry-only", ""),
        ("stub event record: pasta-trace / empty uprobe", "stub record pasta-trace", "stub record empty uprobe",
         "<= 1.3"),
        ("stub event record: pasta-trace / launch entry-only", "stub record pasta-trace", "stub launch entry-only",
         ""),
        ("stub event record: a capture live / none", "stub record pasta-trace, a capture live",
         "stub record pasta-trace", ""),
    ]  # fmt: skip
    if real:
        rows += [
            ("real launch: empty uprobe at symbol / pasta-trace", "real launch empty uprobe at symbol",
             "real launch pasta-trace at placement", ">= 5"),
            ("real alloc: empty pair at symbol / pasta-trace", "real alloc empty pair at symbol",
             "real alloc pasta-trace at placement", ">= 5"),
        ]  # fmt: skip
    print("\nratios of cpu cost, each rep against its own baseline run: median over reps, quartiles, extremes;")
    print("lowest = lowest cost of the measured configuration / lowest cost of the baseline")
    print(f"{'ratio':52s} {'measured':>10s} {'baseline':>10s} {'ratio':>7s} {'q1..q3':>11s} {'min..max':>11s} "
          f"{'lowest':>7s}  target")  # fmt: skip
    for label, num, den, target in rows:
        ratios = [cost(num, r) / cost(den, r) for r in range(a.reps)]
        q1, _, q3 = statistics.quantiles(ratios) if a.reps > 1 else (ratios[0],) * 3
        lowest = min(cost(num, r) for r in range(a.reps)) / min(cost(den, r) for r in range(a.reps))
        print(f"{label:52s} {med(lambda r: cost(num, r)):10.1f} {med(lambda r: cost(den, r)):10.1f} "
              f"{statistics.median(ratios):7.2f} {q1:5.2f}..{q3:<4.2f} {min(ratios):5.2f}..{max(ratios):<4.2f} "
              f"{lowest:7.2f}  {target}")  # fmt: skip
    print("\nns the return probes add to a call (cpu cost, median over reps of with return - entry-only):")
    for what in ("launch", "copy", "rtlaunch"):
        print(f"  {what}: {med(lambda r: cost(f'stub {what} pasta-trace', r) - cost(f'stub {what} entry-only', r)):.1f}")
    print(f"\nlost events: {lost}")
    attach.detach_all(pasta)
    attach.detach_all(entry_only)
    return 0


def main() -> int:
    from pasta_trace.testing.bench_load import with_load

    return with_load(_main)


if __name__ == "__main__":
    raise SystemExit(main())
