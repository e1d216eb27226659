"""Live: the BPF program compiles with BCC, attaches to NVIDIA's real
libcuda.so.1 (drivers 535 and 550) and Debian's libamdhip64, and calls made
through them with ctypes (which fail: there is no device) arrive with their
decoded arguments and exact return codes.  The ring is read with BCC's own ring-buffer API."""

from __future__ import annotations

import ctypes as C
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.probes import attach, catalog, elf, program, uprobe_link

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_probe_catalog import CUDA_ABSENT, DRIVERS, HIP_ABSENT_5_2, HIP_LIB, vendor_libcuda  # noqa: E402

pytestmark = pytest.mark.live

bcc = pytest.importorskip("bcc", reason="BCC is missing (Debian package python3-bpfcc)")
if os.geteuid() != 0:
    pytest.skip("live eBPF tests need root", allow_module_level=True)

COMM = Path("/proc/self/comm").read_bytes().strip()[:15]
API = {a.symbol: i for i, a in enumerate(catalog.APIS)}


class dim3(C.Structure):
    _fields_ = [("x", C.c_uint), ("y", C.c_uint), ("z", C.c_uint)]


class CUlaunchConfig(C.Structure):
    _fields_ = [(n, C.c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shmem")] + [
        ("stream", C.c_void_p),
        ("attrs", C.c_void_p),
        ("numAttrs", C.c_uint),
    ]


class CUDA_MEMCPY2D(C.Structure):
    _fields_ = [
        ("srcXInBytes", C.c_size_t), ("srcY", C.c_size_t), ("srcMemoryType", C.c_int),
        ("srcHost", C.c_void_p), ("srcDevice", C.c_uint64), ("srcArray", C.c_void_p), ("srcPitch", C.c_size_t),
        ("dstXInBytes", C.c_size_t), ("dstY", C.c_size_t), ("dstMemoryType", C.c_int),
        ("dstHost", C.c_void_p), ("dstDevice", C.c_uint64), ("dstArray", C.c_void_p), ("dstPitch", C.c_size_t),
        ("WidthInBytes", C.c_size_t), ("Height", C.c_size_t),
    ]  # fmt: skip


class Tracer:
    """A BPF program, its attached libraries and a drain of both rings."""

    def __init__(self, **kw):
        self.bpf = bcc.BPF(text=program.build(program.Spec(discover=False, **kw)).encode())
        self._ev: list[bytes] = []
        self._nm: list[bytes] = []
        if not kw.get("aggregate"):
            self.bpf[b"events"].open_ring_buffer(lambda _c, d, n: self._ev.append(C.string_at(d, n)))
        self.bpf[b"names"].open_ring_buffer(lambda _c, d, n: self._nm.append(C.string_at(d, n)))

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        self.bpf.ring_buffer_consume()
        ev = np.frombuffer(b"".join(self._ev), dtype=schema.HOST_EVENT.dtype)
        nm = np.frombuffer(b"".join(self._nm), dtype=schema.HOST_NAME.dtype)
        self._ev.clear()
        self._nm.clear()
        return ev, nm

    def lost(self) -> list[int]:
        return [self.bpf[b"lost"].sum(i).value for i in range(4)]

    def close(self) -> None:
        attach.detach_all(self.bpf)
        self.bpf.cleanup()


@pytest.fixture
def tracer():
    made: list[Tracer] = []

    def make(**kw) -> Tracer:
        t = Tracer(**kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def _load_libcuda(driver: str):
    path, version = vendor_libcuda(driver)
    lib = C.CDLL(path)
    lib.cuLaunchKernel.argtypes = [C.c_void_p] + [C.c_uint] * 7 + [C.c_void_p] * 3
    lib.cuLaunchKernelEx.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p]
    lib.cuMemAlloc_v2.argtypes = [C.POINTER(C.c_uint64), C.c_size_t]
    lib.cuMemAllocPitch_v2.argtypes = [C.POINTER(C.c_uint64), C.POINTER(C.c_size_t), C.c_size_t, C.c_size_t, C.c_uint]
    lib.cuMemFree_v2.argtypes = [C.c_uint64]
    lib.cuMemcpyHtoD_v2.argtypes = [C.c_uint64, C.c_void_p, C.c_size_t]
    lib.cuMemcpy2D_v2.argtypes = [C.POINTER(CUDA_MEMCPY2D)]
    lib.cuMemsetD32_v2.argtypes = [C.c_uint64, C.c_uint, C.c_size_t]
    lib.cuStreamSynchronize.argtypes = [C.c_void_p]
    lib.cuModuleGetFunction.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_char_p]
    lib.cuGetProcAddress_v2.argtypes = [C.c_char_p, C.POINTER(C.c_void_p), C.c_int, C.c_uint64, C.c_void_p]
    return path, version, lib


@pytest.fixture(scope="module")
def libcuda():
    """The 535 driver: the probe mechanics, checked once."""
    return _load_libcuda("535")


@pytest.fixture(scope="module", params=DRIVERS)
def libcuda_each(request):
    """Each real driver (535, 550): the symbols and the calls."""
    return request.param, *_load_libcuda(request.param)


def _hip():
    if not HIP_LIB.exists():
        pytest.skip(f"{HIP_LIB} is not installed (Debian package libamdhip64-5)")
    lib = C.CDLL(str(HIP_LIB))
    lib.hipLaunchKernel.argtypes = [C.c_void_p, dim3, dim3, C.c_void_p, C.c_size_t, C.c_void_p]
    lib.hipModuleLaunchKernel.argtypes = [C.c_void_p] + [C.c_uint] * 7 + [C.c_void_p] * 3
    lib.hipMalloc.argtypes = [C.POINTER(C.c_void_p), C.c_size_t]
    lib.hipMemcpy.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int]
    lib.hipMemcpy2D.argtypes = [C.c_void_p, C.c_size_t, C.c_void_p, C.c_size_t, C.c_size_t, C.c_size_t, C.c_int]
    lib.hipMemset.argtypes = [C.c_void_p, C.c_int, C.c_size_t]
    lib.hipStreamSynchronize.argtypes = [C.c_void_p]
    lib.hipModuleGetFunction.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_char_p]
    return lib


def _with_ret(rows: list[dict], rc: dict) -> list[dict]:
    """``rows`` with the return code the call gave added where the probe reads
    it at return for that alone (launches, copies, memsets, frees: catalog.Api.saved)."""
    return [r | {"ret": rc[r["api"]]} if catalog.APIS[API[r["api"]]].saved else r for r in rows]


def _rows(ev: np.ndarray) -> list[dict]:
    """Events as dicts of the fields the probe set (per `valid`), plus the
    header fields that do not depend on time."""
    out = []
    for e in ev:
        row = {"api": catalog.APIS[e["api"]].symbol, "kind": schema.Kind(e["kind"]).name}
        if e["flags"] & schema.FLAG_HAS_RET:
            row["ret"] = int(e["ret"])
        for name, bit in schema.PAYLOAD_BITS.items():
            if e["valid"] >> bit & 1:
                if name in ("grid", "block"):
                    row[name] = tuple(int(e[f"{name}_{c}"]) for c in "xyz")
                else:
                    row[name] = int(e[name])
        out.append(row)
    return out


def _expected_attach(path: str, family: str) -> tuple[list[str], list[str]]:
    exports = elf.exported_symbols(path)
    probed = [a.symbol for a in catalog.for_family(family)]
    return [s for s in probed if s in exports], [s for s in probed if s not in exports]


def test_program_compiles_in_every_mode(tracer):
    # one entry handler per API, one return handler per API with a return probe
    want = {f"pt_e_{a.symbol}" for a in catalog.APIS} | {f"pt_r_{a.symbol}" for a in catalog.APIS if a.ret}
    assert len(want) == len(catalog.APIS) + sum(1 for a in catalog.APIS if a.ret)
    for kw in ({}, {"aggregate": True}, {"filter_pids": True}, {"aggregate": True, "filter_pids": True}):
        t = tracer(ring_pages=16, names_pages=16, **kw)
        loaded = {fn: t.bpf.load_func(fn.encode(), bcc.BPF.KPROBE)
                  for api in catalog.APIS for fn in program.handler_names(api) if fn}
        assert set(loaded) == want, kw
        # each one verified and loaded by the kernel: a program fd of its own
        fds = [f.fd for f in loaded.values()]
        assert min(fds) >= 0 and len(set(fds)) == len(want), kw
        assert {f.name.decode() for f in loaded.values()} == want, kw


def _link_type(fd: int) -> str:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return next(line.split()[1] for line in f if line.startswith("link_type:"))


@pytest.mark.machine_wide
def test_real_libcuda(tracer, libcuda_each):
    """Each real driver, attached whole once: the attach itself, then the
    calls of every argument shape, on the same tracer."""
    driver, path, version, cu = libcuda_each
    t = tracer(ring_pages=64, names_pages=16)
    _attach_and_capture_return_codes(t, driver, path, version, cu)
    _every_cuda_shape(t, driver, version, cu)
    assert t.lost() == [0, 0, 0, 0]


def _attach_and_capture_return_codes(t: Tracer, driver: str, path: str, version: str, cu) -> None:
    res = attach.attach_library(t.bpf, path, "cuda")
    attached, missing = _expected_attach(path, "cuda")
    assert (res.attached, res.missing, res.aliases, res.errors) == (attached, missing, {}, [])
    assert set(res.missing) == CUDA_ABSENT[driver], f"driver {version}"
    assert set(res.placements.values()) == {10}
    assert res.probes == len(attached) + sum(catalog.APIS[API[s]].ret for s in attached)
    if uprobe_link.available():  # every probe is a uprobe_multi link (whose events are checked below)
        links = uprobe_link.made(t.bpf)
        assert len(links) == res.probes and not t.bpf.uprobe_fds
        assert sorted(map(_link_type, links)).count("uretprobe_multi") == res.probes - len(attached)
        assert {_link_type(fd) for fd in links} == {"uprobe_multi", "uretprobe_multi"}

    p = C.c_uint64(0)
    pitch = C.c_size_t(0)
    fn = C.c_void_p(0)
    cfg = CUlaunchConfig(2, 3, 4, 32, 8, 1, 1024, 0x77, None, 0)
    m2d = CUDA_MEMCPY2D(srcMemoryType=1, srcHost=0x5000, dstMemoryType=2, dstDevice=0x6000,
                        WidthInBytes=256, Height=3)  # fmt: skip
    rc = {
        "cuLaunchKernel": cu.cuLaunchKernel(0x1234, 1, 2, 3, 4, 5, 6, 7, 0x99, None, None),
        "cuLaunchKernelEx": cu.cuLaunchKernelEx(C.byref(cfg), 0x4321, None, None),
        "cuMemAlloc_v2": cu.cuMemAlloc_v2(C.byref(p), 4096),
        "cuMemAllocPitch_v2": cu.cuMemAllocPitch_v2(C.byref(p), C.byref(pitch), 100, 7, 4),
        "cuMemFree_v2": cu.cuMemFree_v2(0xABC000),
        "cuMemcpyHtoD_v2": cu.cuMemcpyHtoD_v2(0x7000, 0x8000, 333),
        "cuMemcpy2D_v2": cu.cuMemcpy2D_v2(C.byref(m2d)),
        "cuMemsetD32_v2": cu.cuMemsetD32_v2(0x9000, 0xFF, 10),
        "cuStreamSynchronize": cu.cuStreamSynchronize(0x99),
        "cuCtxSynchronize": cu.cuCtxSynchronize(),
        "cuModuleGetFunction": cu.cuModuleGetFunction(C.byref(fn), 0x55, b"vecAdd"),
        "cuGetProcAddress_v2": cu.cuGetProcAddress_v2(b"cuLaunchKernel", C.byref(fn), 12000, 0, None),
    }
    ev, names = t.drain()
    proc_fn = fn.value
    assert rc["cuMemAlloc_v2"] != 0 and rc["cuGetProcAddress_v2"] == 0  # no device, but the table lookup works
    assert proc_fn == C.cast(cu.cuLaunchKernel, C.c_void_p).value  # the exported (probed) address itself
    assert _rows(ev) == [
        # launches, copies, memsets and frees carry their return code too (PT_RET_SAVED)
        {"api": "cuLaunchKernel", "kind": "launch", "ret": rc["cuLaunchKernel"], "func": 0x1234, "grid": (1, 2, 3),
         "block": (4, 5, 6), "shmem": 7, "stream": 0x99},
        {"api": "cuLaunchKernelEx", "kind": "launch", "ret": rc["cuLaunchKernelEx"], "func": 0x4321, "grid": (2, 3, 4), "block": (32, 8, 1),
         "shmem": 1024, "stream": 0x77},
        {"api": "cuMemAlloc_v2", "kind": "alloc", "ret": rc["cuMemAlloc_v2"], "size": 4096},
        {"api": "cuMemAllocPitch_v2", "kind": "alloc", "ret": rc["cuMemAllocPitch_v2"]},
        {"api": "cuMemFree_v2", "kind": "free", "ret": rc["cuMemFree_v2"], "ptr": 0xABC000},
        {"api": "cuMemcpyHtoD_v2", "kind": "memcpy", "ret": rc["cuMemcpyHtoD_v2"], "dst": 0x7000, "src": 0x8000, "size": 333,
         "copy_kind": schema.CopyKind.h2d},
        {"api": "cuMemcpy2D_v2", "kind": "memcpy", "ret": rc["cuMemcpy2D_v2"], "dst": 0x6000, "src": 0x5000, "size": 768,
         "copy_kind": schema.CopyKind.h2d},
        {"api": "cuMemsetD32_v2", "kind": "memset", "ret": rc["cuMemsetD32_v2"], "ptr": 0x9000, "size": 40, "aux": 0xFF},
        {"api": "cuStreamSynchronize", "kind": "sync", "ret": rc["cuStreamSynchronize"], "stream": 0x99},
        {"api": "cuCtxSynchronize", "kind": "sync", "ret": rc["cuCtxSynchronize"]},
        {"api": "cuModuleGetFunction", "kind": "module", "ret": rc["cuModuleGetFunction"], "src": 0x55},
        {"api": "cuGetProcAddress_v2", "kind": "other", "ret": 0, "func": proc_fn, "aux": 12000},
    ]  # fmt: skip
    assert set(ev["comm"]) == {COMM} and set(ev["pid"]) == {os.getpid()}
    paired = ev["flags"] == schema.FLAG_HAS_RET | schema.FLAG_HAS_DUR
    assert paired.sum() == 12 and (ev["dur_ns"][paired] > 0).all()  # every call: its return code is read
    assert [(catalog.APIS[n["api"]].symbol, schema.NameSource(n["source"]).name, int(n["ret"]),
             int(n["handle"]), n["name"]) for n in names] == [
        ("cuModuleGetFunction", "module_get_function", rc["cuModuleGetFunction"], 0, b"vecAdd"),
        ("cuGetProcAddress_v2", "get_proc_address", 0, proc_fn, b"cuLaunchKernel"),
    ]  # fmt: skip


def test_attach_real_libamdhip64_and_capture_return_codes(tracer):
    hip = _hip()
    t = tracer(ring_pages=64, names_pages=16)
    res = attach.attach_library(t.bpf, str(HIP_LIB), "hip")
    attached, missing = _expected_attach(str(HIP_LIB), "hip")
    assert (res.attached, res.missing, res.aliases, res.errors) == (attached, missing, {}, [])
    assert set(res.missing) == HIP_ABSENT_5_2
    assert set(res.placements.values()) == {0}

    p = C.c_void_p(0)
    rc = {
        "hipLaunchKernel": hip.hipLaunchKernel(0x1234, dim3(1, 2, 3), dim3(4, 5, 6), None, 7, 0x99),
        "hipModuleLaunchKernel": hip.hipModuleLaunchKernel(0x4321, 8, 9, 10, 11, 12, 13, 14, 0x98, None, None),
        "hipMalloc": hip.hipMalloc(C.byref(p), 100),
        "hipMemcpy": hip.hipMemcpy(0x1000, 0x2000, 64, 2),
        "hipMemcpy2D": hip.hipMemcpy2D(0x1000, 64, 0x2000, 64, 32, 4, 3),
        "hipMemset": hip.hipMemset(0x3000, 7, 50),
        "hipStreamSynchronize": hip.hipStreamSynchronize(0x97),
        "hipModuleGetFunction": hip.hipModuleGetFunction(C.byref(p), 0x55, b"kern"),
    }
    ev, names = t.drain()
    assert _rows(ev) == _with_ret([
        {"api": "hipLaunchKernel", "kind": "launch", "func": 0x1234, "grid": (1, 2, 3), "block": (4, 5, 6),
         "shmem": 7, "stream": 0x99},
        {"api": "hipModuleLaunchKernel", "kind": "launch", "func": 0x4321, "grid": (8, 9, 10),
         "block": (11, 12, 13), "shmem": 14, "stream": 0x98},
        {"api": "hipMalloc", "kind": "alloc", "ret": rc["hipMalloc"], "size": 100},
        {"api": "hipMemcpy", "kind": "memcpy", "dst": 0x1000, "src": 0x2000, "size": 64,
         "copy_kind": schema.CopyKind.d2h},
        {"api": "hipMemcpy2D", "kind": "memcpy", "dst": 0x1000, "src": 0x2000, "size": 128,
         "copy_kind": schema.CopyKind.d2d},
        {"api": "hipMemset", "kind": "memset", "ptr": 0x3000, "size": 50, "aux": 7},
        {"api": "hipStreamSynchronize", "kind": "sync", "ret": rc["hipStreamSynchronize"], "stream": 0x97},
        {"api": "hipModuleGetFunction", "kind": "module", "ret": rc["hipModuleGetFunction"], "src": 0x55},
    ], rc)  # fmt: skip
    assert rc["hipMalloc"] != 0
    assert [(int(n["ret"]), n["name"]) for n in names] == [(rc["hipModuleGetFunction"], b"kern")]
    assert t.lost() == [0, 0, 0, 0]


def _cuda_workload(cu, n: int) -> dict[str, list[int]]:
    p = C.c_uint64(0)
    fn = C.c_void_p(0)
    rcs: dict[str, list[int]] = {"cuLaunchKernel": [], "cuMemAlloc_v2": [], "cuCtxSynchronize": [],
                                 "cuGetProcAddress_v2": []}  # fmt: skip
    for i in range(n):
        rcs["cuLaunchKernel"].append(cu.cuLaunchKernel(0x1000 + i, i, 1, 1, 32, 1, 1, 0, 0x99, None, None))
        rcs["cuMemAlloc_v2"].append(cu.cuMemAlloc_v2(C.byref(p), 64 * (i + 1)))
        rcs["cuCtxSynchronize"].append(cu.cuCtxSynchronize())
        rcs["cuGetProcAddress_v2"].append(cu.cuGetProcAddress_v2(b"cuMemAlloc", C.byref(fn), 12000, 0, None))
    return rcs


def test_placement_gives_the_same_events_as_the_symbol(tracer, libcuda):
    """The probe at +10 (after the cmpl) sees exactly what a probe at the
    symbol sees: same events, counts, decoded arguments and return codes."""
    path, _, cu = libcuda
    n = 200
    apis = tuple(catalog.APIS[API[s]] for s in ("cuLaunchKernel", "cuMemAlloc_v2", "cuCtxSynchronize",
                                                 "cuGetProcAddress_v2"))  # fmt: skip
    seen = {}
    for at_symbol in (True, False):
        t = tracer(ring_pages=256, names_pages=64, apis=apis)
        res = attach.attach_library(t.bpf, path, "cuda", apis, at_symbol=at_symbol)
        assert set(res.placements.values()) == ({0} if at_symbol else {10})
        rcs = _cuda_workload(cu, n)
        ev, names = t.drain()
        rows = _rows(ev)
        assert len(rows) == 4 * n and len(names) == n and t.lost() == [0, 0, 0, 0]
        for api, codes in rcs.items():
            assert [r.get("ret") for r in rows if r["api"] == api] == (
                codes if catalog.APIS[API[api]].ret else [None] * n
            )
        seen[at_symbol] = (rows, [(int(x["handle"]), x["name"]) for x in names])
        t.close()
    assert seen[True] == seen[False]


def test_ring_full_is_counted_exactly(tracer, libcuda):
    """A one-page ring holds fewer events than the calls made: captured +
    lost[0] equals the calls, exactly."""
    path, _, cu = libcuda
    api = catalog.APIS[API["cuLaunchKernel"]]
    t = tracer(ring_pages=1, names_pages=1, apis=(api,))
    attach.attach_library(t.bpf, path, "cuda", (api,))
    calls = 500
    for i in range(calls):
        cu.cuLaunchKernel(i, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    ev, _ = t.drain()
    lost = t.lost()
    assert 0 < len(ev) < calls
    assert len(ev) + lost[0] == calls and lost[1:] == [0, 0, 0]
    assert list(ev["func"]) == list(range(len(ev)))  # the first ones fit, in order


def test_pid_filter(tracer, libcuda):
    path, _, cu = libcuda
    api = catalog.APIS[API["cuLaunchKernel"]]
    t = tracer(ring_pages=16, names_pages=16, filter_pids=True, apis=(api,))
    attach.attach_library(t.bpf, path, "cuda", (api,))
    cu.cuLaunchKernel(1, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    assert len(t.drain()[0]) == 0
    t.bpf[b"pid_filter"][C.c_uint32(os.getpid())] = C.c_uint8(1)
    cu.cuLaunchKernel(2, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    assert list(t.drain()[0]["func"]) == [2]


def test_aggregate_mode_counts_in_the_kernel(tracer, libcuda):
    path, _, cu = libcuda
    apis = tuple(catalog.APIS[API[s]] for s in ("cuLaunchKernel", "cuMemcpyHtoD_v2", "cuModuleGetFunction"))
    t = tracer(ring_pages=16, names_pages=16, aggregate=True, apis=apis)
    attach.attach_library(t.bpf, path, "cuda", apis)
    launched = {f: {cu.cuLaunchKernel(f, g, 1, 1, 64, 1, 1, 0, None, None, None) for _ in range(n)}
                for f, g, n in ((0x10, 2, 5), (0x20, 4, 3))}
    copied = {cu.cuMemcpyHtoD_v2(0x7000, 0x8000, 100 + i) for i in range(4)}
    assert launched[0x10] == launched[0x20] == copied == {3}  # no device: every call fails
    fn = C.c_void_p(0)
    cu.cuModuleGetFunction(C.byref(fn), 0x55, b"k")
    rows = sorted(
        (catalog.APIS[k.api].symbol, k.func, k.grid_x, k.block_x, k.ret, v.count, v.bytes)
        for k, v in t.bpf[b"agg"].items()
    )
    # failed calls are their own rows, and a failed copy moved no bytes
    assert rows == [
        ("cuLaunchKernel", 0x10, 2, 64, 3, 5, 0),
        ("cuLaunchKernel", 0x20, 4, 64, 3, 3, 0),
        ("cuMemcpyHtoD_v2", 0, 0, 0, 3, 4, 0),
        ("cuModuleGetFunction", 0, 0, 0, 3, 1, 0),
    ]
    _, names = t.drain()
    assert [n["name"] for n in names] == [b"k"]
    assert all(v.first_ts <= v.last_ts for v in t.bpf[b"agg"].values())


class CUDA_MEMCPY3D(C.Structure):
    _fields_ = [
        ("srcXInBytes", C.c_size_t), ("srcY", C.c_size_t), ("srcZ", C.c_size_t), ("srcLOD", C.c_size_t),
        ("srcMemoryType", C.c_int), ("srcHost", C.c_void_p), ("srcDevice", C.c_uint64), ("srcArray", C.c_void_p),
        ("reserved0", C.c_void_p), ("srcPitch", C.c_size_t), ("srcHeight", C.c_size_t),
        ("dstXInBytes", C.c_size_t), ("dstY", C.c_size_t), ("dstZ", C.c_size_t), ("dstLOD", C.c_size_t),
        ("dstMemoryType", C.c_int), ("dstHost", C.c_void_p), ("dstDevice", C.c_uint64), ("dstArray", C.c_void_p),
        ("reserved1", C.c_void_p), ("dstPitch", C.c_size_t), ("dstHeight", C.c_size_t),
        ("WidthInBytes", C.c_size_t), ("Height", C.c_size_t), ("Depth", C.c_size_t),
    ]  # fmt: skip


def _every_cuda_shape(t: Tracer, driver: str, version: str, cu) -> None:
    """One call per remaining argument shape (the calls above cover the
    others): decoded fields and return codes as called."""
    V, U64, SZ = C.c_void_p, C.c_uint64, C.c_size_t
    p, h = C.c_uint64(0), C.c_void_p(0)
    m2d = CUDA_MEMCPY2D(srcMemoryType=2, srcDevice=0x6000, dstMemoryType=1, dstHost=0x5000, WidthInBytes=10,
                        Height=2)  # fmt: skip
    m3d = CUDA_MEMCPY3D(srcMemoryType=4, srcDevice=0x7000, dstMemoryType=2, dstDevice=0x8000, WidthInBytes=8,
                        Height=4, Depth=2)  # fmt: skip
    image = C.create_string_buffer(64)
    count = C.c_int(-1)
    # CUDA_KERNEL_NODE_PARAMS: func, grid x y z, block x y z, shared bytes, params, extra
    g = C.c_void_p(0)  # the graph calls' out value (h keeps cuGetProcAddress's, checked below)
    kernel_node = C.create_string_buffer(64)
    C.c_uint64.from_buffer(kernel_node, 0).value = 0x71
    for i, v in enumerate((1, 2, 3, 4, 5, 6, 7)):
        C.c_uint32.from_buffer(kernel_node, 8 + 4 * i).value = v
    P = schema.CopyKind.peer
    calls = [  # (symbol, args, expected fields; "ret" is added from the call for paired shapes)
        ("cuLaunchHostFunc", (V(0x11), V(0x22), V(0x33)), {"kind": "launch", "stream": 0x11, "func": 0x22}),
        ("cuGraphLaunch_ptsz", (V(0x44), V(0x55)), {"kind": "graph", "func": 0x44, "stream": 0x55}),
        ("cuMemAllocManaged", (C.byref(p), SZ(512), C.c_uint(1)), {"kind": "alloc", "size": 512, "aux": 1}),
        ("cuMemAllocAsync", (C.byref(p), SZ(256), V(0x66)), {"kind": "alloc", "size": 256, "stream": 0x66}),
        ("cuMemAllocFromPoolAsync", (C.byref(p), SZ(128), V(0x77), V(0x88)),
         {"kind": "alloc", "size": 128, "stream": 0x88}),
        ("cuMemAddressReserve", (C.byref(p), SZ(1 << 21), SZ(0), U64(0), U64(0)), {"kind": "other", "size": 1 << 21}),
        ("cuMemCreate", (C.byref(p), SZ(1 << 21), V(0), U64(0)), {"kind": "alloc", "size": 1 << 21}),
        ("cuMemMap", (U64(0xA000), SZ(4096), SZ(0), U64(0xBB), U64(0)),
         {"kind": "other", "ptr": 0xA000, "size": 4096, "src": 0xBB}),
        ("cuMemUnmap", (U64(0xA000), SZ(4096)), {"kind": "other", "ptr": 0xA000, "size": 4096}),
        ("cuMemRelease", (U64(0xBB),), {"kind": "free", "ptr": 0xBB}),
        ("cuMemFreeAsync", (U64(0xC000), V(0x99)), {"kind": "free", "ptr": 0xC000, "stream": 0x99}),
        ("cuMemcpy", (U64(1), U64(2), SZ(3)), {"kind": "memcpy", "dst": 1, "src": 2, "size": 3,
                                                "copy_kind": schema.CopyKind.default}),
        ("cuMemcpyAsync_ptsz", (U64(1), U64(2), SZ(3), V(4)),
         {"kind": "memcpy", "dst": 1, "src": 2, "size": 3, "copy_kind": schema.CopyKind.default, "stream": 4}),
        # NULL contexts: 550 reads made-up ones even before cuInit (and crashes)
        ("cuMemcpyPeer", (U64(0x10), V(0), U64(0x20), V(0), SZ(48)),
         {"kind": "memcpy", "dst": 0x10, "src": 0x20, "size": 48, "copy_kind": P}),
        ("cuMemcpyPeerAsync", (U64(0x10), V(0), U64(0x20), V(0), SZ(48), V(5)),
         {"kind": "memcpy", "dst": 0x10, "src": 0x20, "size": 48, "copy_kind": P, "stream": 5}),
        ("cuMemcpy2DAsync_v2", (C.byref(m2d), V(6)),
         {"kind": "memcpy", "dst": 0x5000, "src": 0x6000, "size": 20, "copy_kind": schema.CopyKind.d2h,
          "stream": 6}),
        ("cuMemcpy3D_v2", (C.byref(m3d),),
         {"kind": "memcpy", "dst": 0x8000, "src": 0x7000, "size": 64, "copy_kind": schema.CopyKind.default}),
        ("cuMemcpy3DPeerAsync", (C.byref(m3d), V(7)),
         {"kind": "memcpy", "dst": 0x8000, "src": 0x7000, "size": 64, "copy_kind": P, "stream": 7}),
        ("cuMemsetD8Async", (U64(0xD000), C.c_ubyte(0x5A), SZ(100), V(7)),
         {"kind": "memset", "ptr": 0xD000, "size": 100, "aux": 0x5A, "stream": 7}),
        ("cuMemsetD2D16_v2", (U64(0xE000), SZ(256), C.c_ushort(0x1234), SZ(10), SZ(3)),
         {"kind": "memset", "ptr": 0xE000, "size": 60, "aux": 0x1234}),
        ("cuMemsetD2D32Async", (U64(0xE000), SZ(256), C.c_uint(9), SZ(4), SZ(5), V(8)),
         {"kind": "memset", "ptr": 0xE000, "size": 80, "aux": 9, "stream": 8}),
        ("cuEventSynchronize", (V(0),), {"kind": "sync", "ptr": 0}),
        # stream ordering (cross-stream capture's fork and join), NULL handles: not initialized (3)
        ("cuEventRecord", (V(0), V(0)), {"kind": "other", "ptr": 0, "stream": 0}),
        ("cuEventRecordWithFlags", (V(0), V(0), C.c_uint(1)), {"kind": "other", "ptr": 0, "stream": 0, "aux": 1}),
        ("cuStreamWaitEvent", (V(0), V(0), C.c_uint(0)), {"kind": "other", "stream": 0, "ptr": 0, "aux": 0}),
        ("cuLibraryGetKernel", (C.byref(h), V(0x12), b"kern2"), {"kind": "module", "src": 0x12}),
        ("cuKernelGetFunction", (C.byref(h), V(0x34)), {"kind": "module", "src": 0x34}),
        ("cuModuleLoadData", (C.byref(h), image), {"kind": "module", "src": C.addressof(image)}),
        ("cuGetProcAddress", (b"cuMemFree", C.byref(h), 12000, U64(0)), {"kind": "other", "aux": 12000}),
        # devices, not initialized (3): no count, device or context out.  cuInit is not called in this
        # process: once it has been (and failed), the driver dereferences the bogus handles later tests
        # launch; test_real_libs and test_failed_calls call it, each in a process of its own
        ("cuDeviceGetCount", (C.byref(count),), {"kind": "other"}),
        ("cuDeviceGet", (C.byref(count), 5), {"kind": "other", "aux": 5}),
        ("cuDevicePrimaryCtxRetain", (C.byref(h), 2), {"kind": "other", "aux": 2}),
        ("cuCtxCreate_v2", (C.byref(h), C.c_uint(0), 3), {"kind": "other", "aux": 3}),
        ("cuCtxCreate_v3", (C.byref(h), V(0), 0, C.c_uint(0), 4), {"kind": "other", "aux": 4}),
        # CUDA graphs, not initialized (3): nothing comes out, so no graph, exec or capture is read back;
        # the capture id of a begin is its own entry time (checked below)
        ("cuStreamBeginCapture_v2", (V(0x21), C.c_int(0)), {"kind": "graph", "stream": 0x21}),
        ("cuStreamEndCapture", (V(0x21), C.byref(g)), {"kind": "graph", "stream": 0x21}),
        ("cuGraphCreate", (C.byref(g), C.c_uint(0)), {"kind": "graph"}),
        ("cuGraphInstantiateWithFlags", (C.byref(g), V(0x31), U64(0)), {"kind": "graph", "ptr": 0x31}),
        ("cuGraphAddKernelNode", (C.byref(g), V(0x61), None, SZ(0), C.byref(kernel_node)),
         {"kind": "captured", "ptr": 0x61, "func": 0x71, "grid": (1, 2, 3), "block": (4, 5, 6), "shmem": 7}),
        ("cuGraphAddMemcpyNode", (C.byref(g), V(0x62), None, SZ(0), C.byref(m3d), V(0)),
         {"kind": "graph", "ptr": 0x62}),
        ("cuGraphAddChildGraphNode", (C.byref(g), V(0x63), None, SZ(0), V(0x64)),
         {"kind": "graph", "ptr": 0x63, "src": 0x64}),
        ("cuGraphExecDestroy", (V(0x41),), {"kind": "graph", "func": 0x41}),
        ("cuGraphDestroy", (V(0x51),), {"kind": "graph", "ptr": 0x51}),
    ]  # fmt: skip
    # The name getters (545 on).  Before cuInit the driver reads a handle
    # unchecked (a made-up one crashes), but tests a NULL name pointer first
    # (CUDA_ERROR_INVALID_VALUE); a zeroed object "succeeds" with no name.
    zeroed = C.create_string_buffer(1 << 16)
    name_p = C.c_char_p()
    getters = [
        (g, args, {"kind": "module", "func": args[1].value})
        for g in ("cuFuncGetName", "cuKernelGetName") if g not in CUDA_ABSENT[driver]
        for args in ((None, V(0x1234)), (C.byref(name_p), V(C.addressof(zeroed))))
    ]
    calls += getters
    expected = []
    for symbol, args, fields in calls:
        rc = getattr(cu, symbol)(*args)
        row = {"api": symbol, "kind": fields["kind"]}
        if catalog.APIS[API[symbol]].ret:
            row["ret"] = rc
        if symbol == "cuGetProcAddress":
            assert rc == 0 and h.value == C.cast(cu.cuMemFree_v2, C.c_void_p).value  # the export itself
            row["func"] = h.value
        expected.append(row | fields)
    got_names = [r["ret"] for r in expected if r["api"] in ("cuFuncGetName", "cuKernelGetName")]
    assert got_names == {"535": [], "550": [1, 0, 1, 0]}[driver]
    graph_rcs = [r["ret"] for r in expected if r["kind"] in ("graph", "captured") and "ret" in r]
    assert graph_rcs and all(rc != 0 for rc in graph_rcs)  # nothing made, so nothing read back
    ev, names = t.drain()
    rows = _rows(ev)
    for row, e in zip(rows, ev):
        if row["api"].startswith("cuStreamBeginCapture"):
            assert row.pop("dst") == int(e["ts_ns"])  # the capture id
    assert rows == expected, f"driver {version}"
    assert [(catalog.APIS[n["api"]].symbol, schema.NameSource(n["source"]).name, int(n["handle"]),
             int(n["alias"]), n["name"]) for n in names] == [
        ("cuLibraryGetKernel", "library_get_kernel", 0, 0, b"kern2"),
        ("cuKernelGetFunction", "kernel_get_function", 0, 0x34, b""),
        ("cuGetProcAddress", "get_proc_address", h.value, 0, b"cuMemFree"),
    ] + [(g, "func_get_name", args[1].value, 0, b"") for g, args, _ in getters]  # fmt: skip
    exercised = {catalog.APIS[API[s]].shape for s, _, _ in calls} | {
        "launch_cu", "launch_cfg_cu", "alloc", "alloc_pitch", "free", "copy", "copy_2d_cu", "memset",
        "sync_stream", "sync_none", "name_lookup", "get_proc_address", "init"}  # fmt: skip
    cuda_shapes = {a.shape for a in catalog.for_family("cuda") if a.symbol not in CUDA_ABSENT[driver]}
    assert cuda_shapes - exercised == set()


def test_hip_specific_shapes_on_libamdhip64(tracer):
    hip = _hip()
    t = tracer(ring_pages=64, names_pages=16)
    attach.attach_library(t.bpf, str(HIP_LIB), "hip")
    V, SZ = C.c_void_p, C.c_size_t
    ext = getattr(hip, catalog.HIP_EXT_MODULE_LAUNCH_MANGLED[0])
    ext.argtypes = [V] + [C.c_uint] * 6 + [SZ, V, V, V, V, V, C.c_uint]
    parms = C.create_string_buffer(160)  # hipMemcpy3DParms: extent 4x3x2 bytes, kind h2d
    for off, val in ((32, 0x1000), (96, 0x2000), (128, 4), (136, 3), (144, 2)):
        C.c_uint64.from_buffer(parms, off).value = val
    C.c_uint32.from_buffer(parms, 152).value = 1
    p, pitch = C.c_void_p(0), C.c_size_t(0)
    rc = {
        "ext": ext(0x1234, 256, 64, 8, 64, 16, 4, 100, 0x99, None, None, None, None, 0),
        "hipMemcpy3D": hip.hipMemcpy3D(parms),
        "hipMallocPitch": hip.hipMallocPitch(C.byref(p), C.byref(pitch), SZ(100), SZ(3)),
        "hipMemcpyAsync": hip.hipMemcpyAsync(V(1), V(2), SZ(3), 1, V(5)),
        "hipDeviceSynchronize": hip.hipDeviceSynchronize(),
    }
    ev, _ = t.drain()
    rc[catalog.HIP_EXT_MODULE_LAUNCH_MANGLED[0]] = rc["ext"]
    assert _rows(ev) == _with_ret([
        {"api": catalog.HIP_EXT_MODULE_LAUNCH_MANGLED[0], "kind": "launch", "func": 0x1234, "grid": (4, 4, 2),
         "block": (64, 16, 4), "shmem": 100, "stream": 0x99},
        {"api": "hipMemcpy3D", "kind": "memcpy", "dst": 0x2000, "src": 0x1000, "size": 24,
         "copy_kind": schema.CopyKind.h2d},
        {"api": "hipMallocPitch", "kind": "alloc", "ret": rc["hipMallocPitch"]},
        {"api": "hipMemcpyAsync", "kind": "memcpy", "dst": 1, "src": 2, "size": 3, "copy_kind": schema.CopyKind.h2d,
         "stream": 5},
        {"api": "hipDeviceSynchronize", "kind": "sync", "ret": rc["hipDeviceSynchronize"]},
    ], rc)  # fmt: skip
    assert rc["ext"] != 0 and t.lost() == [0, 0, 0, 0]


NEST_STUB = r"""
#include <cuda.h>
/* Recurses through its own exported (probed) address: each level is a probed call. */
CUresult (*volatile self)(CUstream) = cuStreamSynchronize;
CUresult CUDAAPI cuStreamSynchronize(CUstream s)
{
    unsigned long n = (unsigned long)s;
    return n > 1 ? self((CUstream)(n - 1)) : (CUresult)7;
}
"""


@pytest.mark.parametrize("depth, paired, dropped", [(3, 3, 0), (6, 4, 2)])
def test_nested_calls_pair_until_the_frame_stack_is_full(tracer, tmp_path, depth, paired, dropped):
    """Nested probed calls on one thread pair innermost-first; past 4 frames
    the entries are dropped and counted in lost[2]: events + lost = calls."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None or not Path("/usr/local/cuda-13.0/include/cuda.h").exists():
        pytest.skip("needs gcc and the CUDA toolkit headers")
    (tmp_path / "nest.c").write_text(NEST_STUB)
    lib = tmp_path / "libpt_nest_stub.so"  # a name a concurrent `pasta-trace -a` does not discover
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-I/usr/local/cuda-13.0/include", str(tmp_path / "nest.c"),
                    "-o", str(lib)], check=True)  # fmt: skip
    api = catalog.APIS[API["cuStreamSynchronize"]]
    t = tracer(ring_pages=16, names_pages=16, apis=(api,))
    assert attach.attach_library(t.bpf, str(lib), "cuda", (api,)).attached == ["cuStreamSynchronize"]
    fn = C.CDLL(str(lib)).cuStreamSynchronize
    fn.argtypes = [C.c_void_p]
    assert fn(depth) == 7
    ev, _ = t.drain()
    assert [(int(e["stream"]), int(e["ret"])) for e in ev] == [(depth - paired + 1 + i, 7) for i in range(paired)]
    assert (np.diff(ev["dur_ns"].astype(np.int64)) > 0).all()  # outer frames last longer
    assert t.lost() == [0, 0, dropped, 0]
    assert len(ev) + t.lost()[2] == depth
