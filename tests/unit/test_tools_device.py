"""Golden tests of the tools that need device data, on the hand-written capture
with device frames of test_tools_capture.py (see the table there: launches,
GPU times on the host clock, and pages touched per launch; 4 KiB pages)."""

from __future__ import annotations


import polars as pl
import pytest

from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from pasta_trace.tools.gpu import page_launch_matrix
from test_tools_capture import T0, write_device_capture

MANAGED = 0x20000


@pytest.fixture(scope="module")
def cap(tmp_path_factory):
    return open_capture(write_device_capture(tmp_path_factory.mktemp("dev") / "cap"))


def rows(df: pl.DataFrame) -> list[tuple]:
    return [tuple(r) for r in df.iter_rows()]


def test_kernel_summary_with_gpu_time(cap) -> None:
    df = REGISTRY["kernels"].compute(cap).select("pid", "name", "launches", "gpu_ns", "gpu_mean_ns")
    # axpy: (6500 - 5500) + (7600 - 6600); reduce: 9500 - 8900; hip_fill: 5600 - 3000
    assert rows(df) == [(100, "axpy", 2, 2000, 1000.0), (100, "reduce", 1, 600, 600.0),
                        (200, "hip_fill", 1, 2600, 2600.0)]


def test_launch_gaps_per_stream(cap) -> None:
    df = REGISTRY["launch_gaps"].compute(cap)
    assert df.columns == ["pid", "stream", "kernels", "first_ts_ns", "last_ts_ns", "span_ns", "busy_ns", "idle_ns",
                          "idle_share", "max_gap_ns", "launch_to_start_mean_ns", "launch_to_start_max_ns"]
    assert rows(df) == [
        # stream 5: gaps 6500->6600 (100) and 7600->8900 (1300); span 5500..9500 = 4000;
        # launch -> start 500, 600, 1900 (mean 1000)
        (100, 0x5, 3, T0 + 5500, T0 + 9500, 4000, 2600, 1400, 1400 / 4000, 1300, 1000.0, 1900),
        (200, 0x0, 1, T0 + 3000, T0 + 5600, 2600, 2600, 0, 0.0, 0, 500.0, 500),
    ]


def test_gpu_idle_is_the_union_over_streams_and_processes(cap) -> None:
    df = REGISTRY["gpu_idle"].compute(cap)
    # device 0: [3000,5600] overlaps [5500,6500] (no gap, not counted twice), then gaps 100 and 1300;
    # span 3000..9500 = 6500, busy 5100; launch -> start 500, 600, 1900, 500 (mean 875)
    assert df.columns == ["device", "processes", "kernels", "first_ts_ns", "last_ts_ns", "span_ns", "busy_ns",
                          "idle_ns", "idle_share", "max_gap_ns", "launch_to_start_mean_ns", "launch_to_start_max_ns"]
    assert rows(df) == [(0, 2, 4, T0 + 3000, T0 + 9500, 6500, 5100, 1400, 1400 / 6500, 1300, 875.0, 1900)]


def test_working_set_per_launch(cap) -> None:
    df = REGISTRY["working_set"].compute(cap)
    assert df.columns == ["pid", "launch_id", "name", "pages", "ws_bytes", "accesses", "accessed_bytes",
                          "allocations", "unattributed_pages"]
    assert rows(df) == [
        (100, 1, "axpy", 3, 3 * 4096, 100 + 50 + 40, None, 2, 0),
        (100, 2, "axpy", 3, 3 * 4096, 100 + 20 + 30, None, 2, 0),
        # page 64 (0x40000) lies in no allocation
        (100, 3, "reduce", 2, 2 * 4096, 10 + 5, None, 1, 1),
    ]


def test_alloc_hotness(cap) -> None:
    df = REGISTRY["alloc_hotness"].compute(cap)
    assert rows(df) == [
        (100, 0x10000, 4096, "cuMemAlloc_v2", 200, None, 1, 1, 1.0, 2),
        # 0x20000 + 0x4800 spans pages 32..36; 32, 33, 34 and 36 touched
        (100, MANAGED, 0x4800, "cuMemAllocManaged", 50 + 40 + 20 + 30 + 10, None, 4, 5, 0.8, 3),
    ]


def test_page_hotness(cap) -> None:
    df = REGISTRY["page_hotness"].compute(cap)
    assert df.columns == ["pid", "page", "alloc_base", "accesses", "accessed_bytes", "launches", "first_launch_id"]
    assert rows(df) == [
        (100, 16, 0x10000, 200, None, 2, 1),
        (100, 33, MANAGED, 60, None, 2, 1),
        (100, 32, MANAGED, 50, None, 1, 1),
        (100, 36, MANAGED, 30, None, 1, 2),
        (100, 34, MANAGED, 10, None, 1, 3),
        (100, 64, None, 5, None, 1, 3),
    ]


def test_prefetch_plan(cap) -> None:
    df = REGISTRY["prefetch"].compute(cap)
    assert df.columns == ["pid", "launch_id", "name", "stream", "alloc_api", "alloc_base", "page_first", "page_last",
                          "pages", "prefetch_ptr", "bytes", "advice"]
    assert rows(df) == [
        # launch 1 touches 32 and 33 first: one range of two pages
        (100, 1, "axpy", 5, "cuMemAllocManaged", MANAGED, 32, 33, 2, 0x20000, 8192,
         "cudaMemPrefetchAsync((void*)0x20000, 8192, 0, (cudaStream_t)0x5)"),
        # launch 2: page 36 (33 was already resident); the allocation ends at 0x24800: 2048 B
        (100, 2, "axpy", 5, "cuMemAllocManaged", MANAGED, 36, 36, 1, 0x24000, 2048,
         "cudaMemPrefetchAsync((void*)0x24000, 2048, 0, (cudaStream_t)0x5)"),
        (100, 3, "reduce", 5, "cuMemAllocManaged", MANAGED, 34, 34, 1, 0x22000, 4096,
         "cudaMemPrefetchAsync((void*)0x22000, 4096, 0, (cudaStream_t)0x5)"),
    ]


def test_processes_overview_counts_gpus(cap) -> None:
    df = REGISTRY["processes"].compute(cap).select("pid", "device_alloc_bytes", "peak_live_bytes", "gpus", "gpu_ids")
    # managed allocation is 0x4800 here: 4096 + 18432 + 16384; peak 18432 + 16384
    assert rows(df) == [(100, 38912, 34816, 1, "0"), (200, 3072, 2048, 1, "0")]


def test_page_launch_matrix_limits(cap) -> None:
    m = page_launch_matrix(cap, max_pages=2, max_launches=2)
    # launches with pages, in host time order: pid 100 #1 (5000), #2 (6000); among them the
    # hottest pages: 16 (100 + 100) and 33 (40 + 20)
    assert rows(m.select("pid", "page", "launch_id", "count")) == [
        (100, 16, 1, 100), (100, 16, 2, 100), (100, 33, 1, 40), (100, 33, 2, 20),
    ]


def test_page_launch_matrix_takes_launches_in_time_order(cap) -> None:
    m = page_launch_matrix(cap, max_pages=1, max_launches=1)
    # the first launch with pages is pid 100 #1 at 5000; its hottest page is 16
    assert rows(m.select("pid", "page", "launch_id", "name", "count", "launch_ts_ns")) == [
        (100, 16, 1, "axpy", 100, T0 + 5000),
    ]


def test_hotness_ties_come_in_one_order_whatever_the_order_of_the_pages(cap) -> None:
    """Two instances at one reused address with the same accesses, and a page
    of an allocation and of none with the same accesses: the tables give them
    in one order, however the attributed pages come (a hash group-by gives
    its groups in any order)."""
    import dataclasses

    from pasta_trace import schema

    row = dict(pid=100, name="k", page_shift=12, bytes=None, alloc_api="cuMemAlloc_v2")
    pages = pl.DataFrame([
        # alloc_id 1 and 2: the same base, one after the other; 7 accesses each
        {**row, "launch_id": 1, "alloc_id": 1, "alloc_base": 0x40000, "alloc_size": 4096, "page": 64, "count": 7},
        {**row, "launch_id": 2, "alloc_id": 2, "alloc_base": 0x40000, "alloc_size": 8192, "page": 64, "count": 7},
        # page 80: 3 accesses inside an allocation, 3 outside any
        {**row, "launch_id": 3, "alloc_id": 3, "alloc_base": 0x50000, "alloc_size": 4096, "page": 80, "count": 3},
        {**row, "launch_id": 4, "alloc_id": None, "alloc_base": None, "alloc_size": None, "page": 80, "count": 3},
    ], schema=schema.TIMELINE_FRAMES["pages"])
    seen = {"alloc_hotness": set(), "page_hotness": set()}
    for seed in range(8):
        shuffled = pages.sample(fraction=1.0, shuffle=True, seed=seed)
        held = dataclasses.replace(cap, merged={**cap.merged, "pages": shuffled.lazy()})
        for name in seen:
            seen[name].add(tuple(rows(REGISTRY[name].compute(held))))
    assert [len(s) for s in seen.values()] == [1, 1]
    alloc_rows = next(iter(seen["alloc_hotness"]))
    assert [(r[1], r[2]) for r in alloc_rows] == [(0x40000, 4096), (0x40000, 8192), (0x50000, 4096)]
    page_rows = next(iter(seen["page_hotness"]))
    assert [(r[1], r[2]) for r in page_rows] == [(64, 0x40000), (80, 0x50000), (80, None)]
