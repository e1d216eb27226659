"""Golden merge tests on the hand-built capture of merge_fixtures.py: every
expected row below is worked out by hand from the rows written there."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pasta_trace import merge, schema
from pasta_trace.read import open_capture

import merge_fixtures as fx


@pytest.fixture(params=[None, 1, 2], ids=["file-order", "shuffled-1", "shuffled-2"])
def cap(request, tmp_path: Path):
    # shuffled files: join_asof(by=) silently returns garbage on unsorted
    # input, so every result must come out the same whatever the row order
    return open_capture(fx.write(tmp_path / "cap", shuffle=request.param))


def assert_schema(lf: pl.LazyFrame, name: str) -> None:
    got = lf.collect().schema
    want = schema.TIMELINE_FRAMES[name]
    assert list(got) == list(want)
    assert [k for k in want if not got[k] == want[k]] == []


def rows(lf: pl.LazyFrame, cols: list[str]) -> list[tuple]:
    return [tuple(r) for r in lf.select(cols).collect().rows()]


def test_allocations_pair_frees_and_respect_reuse(cap) -> None:
    got = rows(merge.allocations(cap), ["alloc_id", "pid", "tid", "base", "size", "api", "kind", "alloc_ts_ns",
                                        "free_ts_ns", "free_api"])
    assert got == [
        (0, 10, 11, 0x10000, 0x20000, "cuMemAlloc_v2", "device", 100, 300, "cuMemFree_v2"),  # A
        (1, 10, 11, 0x40000, 0x10000, "cuMemAllocManaged", "managed", 150, 700, "cuMemFree_v2"),  # C
        (2, 10, 11, 0x10000, 0x8000, "cuMemAlloc_v2", "device", 400, None, None),  # B reuses A's base
        # D's free was missed: the free at 3100 comes after E reused the address, so it is E's
        (3, 20, 21, 0x5000, 0x100, "cuMemAlloc_v2", "device", 2600, None, None),
        (4, 20, 21, 0x5000, 0x100, "cuMemAlloc_v2", "device", 3000, 3100, "cuMemFree_v2"),
    ]
    assert_schema(merge.allocations(cap), "allocations")


def test_kernel_executions_exact_time_and_unmatched(cap) -> None:
    got = rows(merge.kernel_executions(cap), ["pid", "tid", "ts_ns", "launch_seq", "name", "match", "launch_id",
                                              "gpu_start_ns", "gpu_end_ns", "gld", "grid_id"])
    assert got == [
        (10, 11, 200, 0, "axpy", "exact", 1, 230, 270, 100, 1),
        # handle 0xB was renamed at t=450: the launch at 500 gets the new name
        (10, 11, 500, 1, "gemm", "exact", 2, 530, 570, 200, 2),
        (10, 11, 800, 2, "axpy", "exact", 3, 830, 870, 300, 3),
        (20, 21, 1500, 0, "unknown@0xc", None, None, None, None, None, None),
        # pid 20's two device launches disagree on the id offset: matched by time,
        # and the second one claims a launch the first already holds
        (20, 21, 2500, 1, "unknown@0xc", "time", 7, None, None, None, 7),
    ]
    assert_schema(merge.kernel_executions(cap), "kernels")


def test_stats_count_every_unmatched_row(cap) -> None:
    assert merge.stats(cap).as_dict() == {
        "host_launches": 5, "device_executions": 5, "matched": 4, "matched_exact": 3, "matched_time": 1,
        "unmatched_host": 1, "unmatched_device": 1, "pages": 9, "unattributed_pages": 3,
        "alloc_touches": 3, "unattributed_touches": 1, "samples": 3, "unattributed_samples": 1,
    }


def test_pages_attributed_to_the_instance_live_at_launch(cap) -> None:
    got = rows(merge.attributed_pages(cap), ["launch_id", "name", "page", "count", "alloc_id", "alloc_base",
                                             "alloc_size", "alloc_api", "page_shift", "bytes"])
    A = (0, 0x10000, 0x20000, "cuMemAlloc_v2")
    B = (2, 0x10000, 0x8000, "cuMemAlloc_v2")
    C = (1, 0x40000, 0x10000, "cuMemAllocManaged")
    none = (None, None, None, None)
    assert got == [
        (1, "axpy", 0x10, 5, *A, 12, None),
        (1, "axpy", 0x28, 3, *A, 12, None),
        (1, "axpy", 0x40, 2, *C, 12, None),
        (1, "axpy", 0x80, 1, *none, 12, None),  # no allocation there
        (2, "gemm", 0x10, 7, *B, 12, None),  # same address as A, but B is live now
        (2, "gemm", 0x28, 4, *none, 12, None),  # A's tail: A is freed, B is smaller
        (2, "gemm", 0x40, 1, *C, 12, None),
        (3, "axpy", 0x11, 2, *B, 12, None),
        (3, "axpy", 0x40, 6, *none, 12, None),  # C was freed at 700
    ]


def test_alloc_touches_resolve_the_live_instance(cap) -> None:
    got = rows(merge.alloc_touches(cap), ["launch_id", "name", "alloc_id", "alloc_base", "alloc_size", "touches",
                                          "bytes", "unique_pages"])
    assert got == [
        (1, "axpy", 0, 0x10000, 0x20000, 8, 32, 2),
        (2, "gemm", 2, 0x10000, 0x8000, 9, 36, 1),
        (3, "axpy", None, 0x40000, None, 6, 24, 1),  # C was freed before launch 3
    ]


def test_samples_give_working_set_and_hotness(cap) -> None:
    assert rows(merge.working_set(cap).sort("launch_id"), ["pid", "launch_id", "samples", "accesses", "bytes",
                                                           "pages"]) == [
        (10, 1, 1, 2, 16, 1),
        (10, 2, 2, 5, 20, 2),
    ]
    assert rows(merge.hotness(cap), ["pid", "alloc_id", "base", "size", "samples", "accesses", "bytes",
                                     "launches"]) == [
        (10, 2, 0x10000, 0x8000, 1, 4, 16, 1),  # B
        (10, 0, 0x10000, 0x20000, 1, 2, 16, 1),  # A
    ]


def test_samples_fold_to_pages_without_a_page_histogram(tmp_path: Path) -> None:
    dev = {k: v for k, v in fx.DEVICE.items() if k != "page_hist"}
    cap = open_capture(fx.write(tmp_path / "cap", dev=dev))
    got = rows(merge.attributed_pages(cap), ["launch_id", "page_shift", "page", "count", "bytes", "alloc_id"])
    assert got == [
        (1, 16, 2, 2, 16, 0),  # 0x28010 >> 16 = 2, in A
        (2, 16, 1, 4, 16, 2),  # 0x10004 in B
        (2, 16, 2, 1, 4, None),  # A's freed tail
    ]
    assert rows(merge.attributed_pages(cap, page_shift=12), ["launch_id", "page"]) == [(1, 0x28), (2, 0x10), (2, 0x28)]


def test_host_only_capture_merges(tmp_path: Path) -> None:
    cap = open_capture(fx.write(tmp_path / "cap", device=False))
    k = merge.kernel_executions(cap).collect()
    assert k.height == 5
    assert k["match"].null_count() == 5 and k["gpu_start_ns"].null_count() == 5
    assert k["name"].to_list() == ["axpy", "gemm", "axpy", "unknown@0xc", "unknown@0xc"]
    assert merge.allocations(cap).collect().height == 5
    assert merge.attributed_pages(cap).collect().height == 0
    s = merge.stats(cap)
    assert (s.host_launches, s.device_executions, s.matched, s.unmatched_host, s.unmatched_device) == (5, 0, 0, 0, 0)


def test_cupti_only_kernels_match_in_correlation_order_or_by_time(tmp_path: Path) -> None:
    events = [launch(100, 30, 31, 0xD), launch(200, 30, 31, 0xD), launch(100, 40, 41, 0xE),
              launch(200, 40, 41, 0xE)]
    cupti = [
        # pid 30: in correlation order every kernel starts after its launch: exact
        cupti_kernel(30, corr=9, start=260, end=300), cupti_kernel(30, corr=5, start=150, end=250),
        # pid 40: the first "starts" before any launch (clocks disagree): by time, and it finds none
        cupti_kernel(40, corr=3, start=90, end=95), cupti_kernel(40, corr=4, start=250, end=280),
    ]
    cap = open_capture(fx.write(tmp_path / "cap", events=events, dev={"cupti_kernels": cupti}))
    got = rows(merge.kernel_executions(cap), ["pid", "ts_ns", "match", "correlation_id", "gpu_start_ns",
                                              "gpu_end_ns", "name"])
    assert sorted(got, key=lambda r: (r[0], r[1])) == [
        (30, 100, "exact", 5, 150, 250, "k5"),
        (30, 200, "exact", 9, 260, 300, "k9"),
        (40, 100, None, None, None, None, "unknown@0xe"),
        (40, 200, "time", 4, 250, 280, "k4"),
    ]
    s = merge.stats(cap)
    assert (s.matched, s.matched_exact, s.matched_time, s.unmatched_host, s.unmatched_device) == (3, 2, 1, 1, 1)


def test_cupti_record_joins_the_device_launch_by_correlation_then_grid(tmp_path: Path) -> None:
    dev = {
        "launches": [fx.dev_launch(10, 1, 11, 210, 0xA, correlation_id=77, grid_id=0),
                     fx.dev_launch(10, 2, 11, 510, 0xB, grid_id=555),
                     fx.dev_launch(10, 3, 11, 810, 0xA)],
        "cupti_kernels": [cupti_kernel(10, corr=77, start=240, end=260, grid_id=1),
                          cupti_kernel(10, corr=0, start=540, end=560, grid_id=555)],
    }
    cap = open_capture(fx.write(tmp_path / "cap", dev=dev))
    got = rows(merge.kernel_executions(cap).filter(pl.col("pid") == 10),
               ["ts_ns", "match", "launch_id", "correlation_id", "grid_id", "gpu_start_ns", "gpu_end_ns"])
    assert got == [
        (200, "exact", 1, 77, 0, 240, 260),
        (500, "exact", 2, 0, 555, 540, 560),
        (800, "exact", 3, 0, 3, None, None),  # neither CUPTI nor a clock: no device time
    ]
    assert merge.stats(cap).unmatched_device == 0


def launch(ts: int, pid: int, tid: int, func: int) -> dict:
    return fx.launch(ts, pid, tid, func)


def cupti_kernel(pid: int, *, corr: int, start: int, end: int, grid_id: int = 0) -> dict:
    return {"pid": pid, "start": start, "end": end, "grid_id": grid_id, "stream_id": 7, "correlation_id": corr,
            "device": 0, "name_id": 0, "grid_x": 1, "grid_y": 1, "grid_z": 1, "block_x": 32, "block_y": 1,
            "block_z": 1, "name": f"k{corr}"}
