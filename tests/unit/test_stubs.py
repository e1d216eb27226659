"""The stand-in libraries export every symbol the probe catalog names, each at
a `push %rbp` prologue (-O0), and cuGetProcAddress_v2 resolves like the driver."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from pasta_trace.probes.catalog import APIS


def _exports(lib: Path) -> dict[str, bytes]:
    """Defined dynamic function symbols -> their first byte."""
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text")
        base, data = text["sh_addr"], text.data()
        out = {}
        for s in elf.get_section_by_name(".dynsym").iter_symbols():
            if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF":
                out[s.name] = data[s["st_value"] - base: s["st_value"] - base + 1]
        return out


@pytest.mark.parametrize("fam", ["cuda", "hip", "cudart"])
def test_catalog_is_subset_of_stub_exports(fam, cuda_stub, hip_stub, cudart_stub):
    exports = _exports({"cuda": cuda_stub, "hip": hip_stub, "cudart": cudart_stub}[fam])
    wanted = {a.symbol for a in APIS if a.family == fam}
    assert sorted(wanted - exports.keys()) == []
    # -O0: every probed export starts with push %rbp (0x55)
    assert {s: exports[s] for s in wanted if exports[s] != b"\x55"} == {}


def test_get_proc_address_returns_the_per_thread_export(cuda_stub):
    lib = ctypes.CDLL(str(cuda_stub))
    gpa = lib.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                    ctypes.POINTER(ctypes.c_int)]
    per_thread = 1 << 1  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    cases = {
        ("cuLaunchKernel", per_thread): "cuLaunchKernel_ptsz",
        ("cuLaunchKernel", 0): "cuLaunchKernel",
        ("cuMemAlloc", 0): "cuMemAlloc_v2",
        ("cuMemcpyHtoD", per_thread): "cuMemcpyHtoD_v2_ptds",
        ("cuStreamSynchronize", per_thread): "cuStreamSynchronize_ptsz",
    }
    for (base, flags), exported in cases.items():
        pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        assert gpa(base.encode(), ctypes.byref(pfn), 13000, flags, ctypes.byref(status)) == 0
        assert (pfn.value, status.value) == (ctypes.cast(getattr(lib, exported), ctypes.c_void_p).value, 0)
    # cuCtxSynchronize_v2 takes a context since 13.0: a 12.x caller gets v1
    pfn = ctypes.c_void_p()
    assert gpa(b"cuCtxSynchronize", ctypes.byref(pfn), 12080, 0, None) == 0
    assert pfn.value == ctypes.cast(lib.cuCtxSynchronize, ctypes.c_void_p).value
    assert gpa(b"cuNoSuchEntry", ctypes.byref(pfn), 13000, 0, None) == 500  # CUDA_ERROR_NOT_FOUND


def test_workload_report_counts(cuda_stub, cuda_workload, tmp_path):
    """The workload's report is exact: 3 threads x 2 rounds of the same sequence."""
    import json

    report = tmp_path / "r.json"
    subprocess.run([cuda_workload, "--lib", cuda_stub, "--report", report, "--threads", "3", "--iters", "2"],
                   check=True, timeout=60)
    r = json.loads(report.read_text())
    run = [c for c in r["calls"] if c["phase"] == "run"]
    per_round = len(run) // 6
    assert len(run) == 6 * per_round and len({c["tid"] for c in run}) == 3
    apis = {c["api"] for c in run}
    assert {"cuLaunchKernel_ptsz", "cuMemcpyDtoH_v2_ptds", "cuStreamSynchronize_ptsz", "cuLaunchKernel"} <= apis
    failed = [(c["api"], c["ret"]) for c in run if c["ret"] != 0]
    assert failed == [("cuMemAlloc_v2", 1)] * 6  # CUDA_ERROR_INVALID_VALUE for size 0
    allocs = [c["cols"]["ptr"] for c in run if c["api"] == "cuMemAlloc_v2" and c["ret"] == 0]
    assert len(set(allocs)) == 6
    assert r["sync_ns"] == 1_000_000
