"""VMM calls on the stub libcuda under real uprobes, recorded by the CLI:
cuMemCreate's handles are counted as physical memory by handle, the
cuMemMap ranges are the allocations device addresses resolve to, and the
exact bytes are what the program made."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pytest

from pasta_run import run_pasta
from pasta_trace import merge
from pasta_trace.tools import REGISTRY

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

S = 2 << 20
#: what PyTorch's expandable segments do: reserve a range, make physical chunks, map them one after
#: the other, and later unmap and release one (here unmapped by an address inside it)
PROGRAM = """
import ctypes as C, json, sys
cu = C.CDLL(sys.argv[1])
U64, SZ, S = C.c_uint64, C.c_size_t, %d
va, h1, h2 = U64(0), U64(0), U64(0)
prop = C.create_string_buffer(64)
rc = [cu.cuMemAddressReserve(C.byref(va), SZ(4 * S), SZ(0), U64(0), U64(0)),
      cu.cuMemCreate(C.byref(h1), SZ(S), prop, U64(0)), cu.cuMemCreate(C.byref(h2), SZ(S), prop, U64(0)),
      cu.cuMemMap(U64(va.value), SZ(S), SZ(0), U64(h1.value), U64(0)),
      cu.cuMemMap(U64(va.value + S), SZ(S), SZ(0), U64(h2.value), U64(0)),
      cu.cuMemUnmap(U64(va.value + S + 4096), SZ(S - 4096)), cu.cuMemRelease(U64(h2.value))]
json.dump({"pid": __import__("os").getpid(), "va": va.value, "h1": h1.value, "h2": h2.value, "rc": rc},
          open(sys.argv[2], "w"))
""" % S


def test_vmm_calls_are_memory_by_handle_and_addresses_by_mapping(families, tmp_path: Path) -> None:
    cuda = next(f for f in families if f.name == "cuda")
    out, facts = tmp_path / "cap", tmp_path / "facts.json"
    r = run_pasta(["-o", str(out), "--", sys.executable, "-c", PROGRAM, str(cuda.stub), str(facts)], timeout=300)
    assert r.returncode == 0, r.stderr
    f = json.loads(facts.read_text())
    assert f["rc"] == [0] * 7 and f["h1"] != f["h2"] and f["va"] != 0
    cap = merge.load(out)
    mine = pl.col("pid") == f["pid"]
    allocs = merge.allocations(cap).filter(mine).sort("alloc_ts_ns").collect()
    assert allocs.select("base", "size", pl.col("api").cast(pl.String), pl.col("kind").cast(pl.String),
                         pl.col("free_api").cast(pl.String)).rows() == [
        (f["h1"], S, "cuMemCreate", "physical", None),
        (f["h2"], S, "cuMemCreate", "physical", "cuMemRelease"),
        (f["va"], S, "cuMemMap", "mapping", None),
        (f["va"] + S, S, "cuMemMap", "mapping", "cuMemUnmap"),
    ]
    totals = REGISTRY["memory_totals"].compute(cap).filter(mine)
    assert totals.select("memory", "allocations", "allocated_bytes", "freed_bytes", "held_bytes").rows() == [
        ("device", 2, 2 * S, S, S)]
    peaks = REGISTRY["memory_peaks"].compute(cap).filter(mine & (pl.col("api") == "all"))
    assert peaks.select("peak_bytes", "end_bytes").rows() == [(2 * S, S)]


#: creates and releases interleaved with an ordinary allocation, and two stray frees across the spaces: a
#: release given the allocation's address and a free given a live handle (each frees nothing: a handle is
#: released only by a release of it, an address freed only by a free of it)
INTERLEAVED = """
import ctypes as C, json, sys
cu = C.CDLL(sys.argv[1])
U64, SZ, S = C.c_uint64, C.c_size_t, %d
a, h1, h2, h3 = U64(0), U64(0), U64(0), U64(0)
prop = C.create_string_buffer(64)
rc = [cu.cuMemAlloc_v2(C.byref(a), SZ(S)),
      cu.cuMemCreate(C.byref(h1), SZ(S), prop, U64(0)), cu.cuMemCreate(C.byref(h2), SZ(2 * S), prop, U64(0)),
      cu.cuMemRelease(U64(h1.value)),
      cu.cuMemCreate(C.byref(h3), SZ(4 * S), prop, U64(0)),
      cu.cuMemRelease(U64(a.value)), cu.cuMemFree_v2(U64(h2.value)),
      cu.cuMemRelease(U64(h3.value))]
json.dump({"pid": __import__("os").getpid(), "rc": rc}, open(sys.argv[2], "w"))
""" % S


def test_the_summary_pairs_each_release_with_its_own_handle(families, tmp_path: Path) -> None:
    cuda = next(f for f in families if f.name == "cuda")
    out, facts = tmp_path / "cap", tmp_path / "facts.json"
    r = run_pasta(["-o", str(out), "--", sys.executable, "-c", INTERLEAVED, str(cuda.stub), str(facts)],
                  timeout=300)
    assert r.returncode == 0, r.stderr
    f = json.loads(facts.read_text())
    assert f["rc"] == [0] * 8
    # made: S + S + 2S + 4S; freed: h1 (S) and h3 (4S); held: the allocation (S) and h2 (2S)
    assert "device memory: allocated 16.0 MiB in 4 allocations, freed 10.0 MiB, held at the end 6.0 MiB" \
        in r.stderr, r.stderr
    totals = REGISTRY["memory_totals"].compute(merge.load(out)).filter(pl.col("pid") == f["pid"])
    assert totals.select("memory", "allocations", "allocated_bytes", "freed_bytes", "held_bytes").rows() == [
        ("device", 4, 8 * S, 5 * S, 3 * S)]
