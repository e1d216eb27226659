"""Byte totals: each free releases its own allocation's bytes, also when an
address comes back after a free; each total is named for what it counts
(device memory, pinned host memory), the same in the record summary and in
the report's tools.  Hand-written capture; times are ns after T0."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pasta_trace.capture.session import summary
from pasta_trace.lifetimes import pair
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from test_tools_capture import write_capture

# (t, dur, pid, tid, api, kind, payload): 0xA000 is allocated three times with
# three sizes; the first two are freed, the third is held at the end
ROWS: list[tuple] = [
    (1000, 10, 100, 101, "cuMemAlloc_v2", "alloc", {"ptr": 0xA000, "size": 100}),
    (2000, 10, 100, 101, "cuMemFree_v2", "free", {"ptr": 0xA000}),
    (3000, 10, 100, 101, "cuMemAlloc_v2", "alloc", {"ptr": 0xA000, "size": 300}),
    (4000, 10, 100, 101, "cuMemFree_v2", "free", {"ptr": 0xA000}),
    (5000, 10, 100, 101, "cuMemAlloc_v2", "alloc", {"ptr": 0xA000, "size": 50}),
    (5500, 10, 100, 101, "cuMemFree_v2", "free", {"ptr": 0xE000}),  # allocated before the capture: size unknown
    (6000, 10, 100, 101, "cuMemAllocHost_v2", "alloc", {"ptr": 0xF000, "size": 64}),
    (7000, 10, 100, 101, "cuMemFreeHost", "free", {"ptr": 0xF000}),
    (8000, 10, 100, 101, "cuMemAllocHost_v2", "alloc", {"ptr": 0xF000, "size": 32}),
]
NO_NAMES = pl.DataFrame(schema={"pid": pl.UInt32, "handle": pl.UInt64, "name": pl.String})


def test_summary_pairs_each_free_with_its_own_allocation(tmp_path: Path) -> None:
    cap = write_capture(tmp_path / "cap", rows=ROWS, names=[])
    lines = summary.render(cap, {"alloc": 5, "free": 4}, NO_NAMES, {}, {}).splitlines()
    # each free releases its own allocation's size (100 + 300), not the last size seen at that address
    assert lines[1:4] == [
        "device memory: allocated 450 B in 3 allocations, freed 400 B, held at the end 50 B",
        "pinned host memory: allocated 96 B in 2 allocations, freed 64 B, held at the end 32 B",
        "copied: 0 B",
    ]


def test_report_counts_the_same_bytes_under_the_same_names(tmp_path: Path) -> None:
    cap = open_capture(write_capture(tmp_path / "cap", rows=ROWS, names=[]))
    assert REGISTRY["memory_totals"].compute(cap).rows() == [
        (100, "device", 3, 450, 2, 400, 50),
        (100, "pinned host", 2, 96, 1, 64, 32),
    ]
    procs = REGISTRY["processes"].compute(cap)
    assert procs.select("device_alloc_bytes", "peak_live_bytes").rows() == [(450, 300)]
    peaks = REGISTRY["memory_peaks"].compute(cap).filter(pl.col("api") == "all")
    assert peaks.select("allocations", "device_alloc_bytes", "peak_bytes", "end_bytes").rows() == [(3, 450, 300, 50)]
    sites = REGISTRY["call_sites"].compute(cap)
    assert sites.select("device_alloc_bytes", "pinned_alloc_bytes").rows() == [(450, 96)]


def test_pair_keys_instances_by_every_key_given() -> None:
    """Tensors key an instance by (pid, device, base): the same address on two
    devices is two instances, and a free on one device ends only its own."""
    # cuda:1's free at 500 ends a tensor allocated before the capture, not cuda:0's
    allocs = pl.LazyFrame({"pid": [7, 7], "device": ["cuda:0", "cuda:1"], "base": [0xB1, 0xB1],
                           "alloc_ts_ns": [100, 600]})
    frees = pl.LazyFrame({"pid": [7, 7], "device": ["cuda:1", "cuda:1"], "base": [0xB1, 0xB1],
                          "free_ts_ns": [500, 900], "free_api": ["free", "free"]})
    got = pair(allocs, frees, by=("pid", "device", "base")).sort("device", "alloc_ts_ns").collect()
    assert got.select("device", "alloc_ts_ns", "free_ts_ns", "free_api").rows() == [
        ("cuda:0", 100, None, None), ("cuda:1", 600, 900, "free")]
