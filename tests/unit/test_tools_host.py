"""Golden tests of the tools that need only host events, on the hand-written
capture of test_tools_capture.py (times in ns after T0; the manifest's clock
says the capture ran from T0 to T0 + 25000)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from pasta_trace.tools.transfers import copy_storms
from test_tools_capture import T0, write_capture


@pytest.fixture()
def cap(tmp_path: Path):
    return open_capture(write_capture(tmp_path / "cap"))


def rows(df: pl.DataFrame) -> list[tuple]:
    return [tuple(r) for r in df.iter_rows()]


def test_memory_timeline_steps(cap) -> None:
    df = REGISTRY["memory"].compute(cap)
    assert df.columns == ["pid", "ts_ns", "api", "delta_bytes", "live_bytes", "api_live_bytes"]
    # pinned host memory (cuMemAllocHost_v2 at 3000) is not device memory: absent.
    # pid 100: +4096, +8192 (managed), -4096 (free at 12000), +16384
    # pid 200: +2048, -2048, +1024 (the same address reused)
    assert rows(df) == [
        (100, T0 + 1000, "cuMemAlloc_v2", 4096, 4096, 4096),
        (100, T0 + 2000, "cuMemAllocManaged", 8192, 12288, 8192),
        (100, T0 + 12000, "cuMemAlloc_v2", -4096, 8192, 0),
        (100, T0 + 14000, "cuMemAlloc_v2", 16384, 24576, 16384),
        (200, T0 + 1500, "hipMalloc", 2048, 2048, 2048),
        (200, T0 + 3500, "hipMalloc", -2048, 0, 0),
        (200, T0 + 4500, "hipMalloc", 1024, 1024, 1024),
    ]


def test_memory_peaks(cap) -> None:
    df = REGISTRY["memory_peaks"].compute(cap)
    assert df.columns == ["pid", "api", "peak_bytes", "peak_ts_ns", "end_bytes", "allocations", "device_alloc_bytes",
                          "top_call_site"]
    assert rows(df) == [
        # 4096 + 8192 + 16384 = 28672 allocated; live peaks after the last alloc: 8192 + 16384
        (100, "all", 24576, T0 + 14000, 24576, 3, 28672, None),
        (100, "cuMemAllocManaged", 8192, T0 + 2000, 8192, 1, 8192, None),
        # 4096 then (after its free) 16384: the later, larger one is the peak
        (100, "cuMemAlloc_v2", 16384, T0 + 14000, 16384, 2, 20480, None),
        (200, "all", 2048, T0 + 1500, 1024, 2, 3072, None),
        (200, "hipMalloc", 2048, T0 + 1500, 1024, 2, 3072, None),
    ]


def test_memory_free_and_alloc_at_same_instant_do_not_add_up(tmp_path: Path) -> None:
    # 1000 B live, then at t=2000 a free of it and a new 1500 B alloc: the peak is 1500, not 2500
    same = [
        (1000, 10, 7, 7, "cuMemAlloc_v2", "alloc", {"ptr": 0xA000, "size": 1000}),
        (2000, 10, 7, 7, "cuMemAlloc_v2", "alloc", {"ptr": 0xB000, "size": 1500}),
        (2000, 10, 7, 7, "cuMemFree_v2", "free", {"ptr": 0xA000}),
    ]
    cap = open_capture(write_capture(tmp_path / "c", rows=same, names=[], processes=[]))
    peaks = REGISTRY["memory_peaks"].compute(cap).filter(pl.col("api") == "all")
    assert rows(peaks) == [(7, "all", 1500, T0 + 2000, 1500, 2, 2500, None)]


def test_leak_candidates(cap) -> None:
    df = REGISTRY["leaks"].compute(cap)
    assert df.columns == ["pid", "tid", "api", "kind", "base", "size", "alloc_ts_ns", "age_ns", "call_site"]
    # never freed; age = capture end (T0 + 25000) - allocation time; largest first, then oldest
    assert rows(df) == [
        (100, 101, "cuMemAlloc_v2", "device", 0x30000, 16384, T0 + 14000, 11000, None),
        (100, 101, "cuMemAllocManaged", "managed", 0x20000, 8192, T0 + 2000, 23000, None),
        (100, 101, "cuMemAllocHost_v2", "host", 0x90000, 1024, T0 + 3000, 22000, None),
        (200, 201, "hipMalloc", "device", 0x10000, 1024, T0 + 4500, 20500, None),
    ]


def test_leak_age_without_manifest_end_uses_last_event(tmp_path: Path) -> None:
    cap = open_capture(write_capture(tmp_path / "c"))
    cap.manifest["clock"]["end_ns"] = None  # a tracer killed before it wrote its end
    df = REGISTRY["leaks"].compute(cap)
    # last event: hipDeviceSynchronize at 20000 + 500 ns
    assert df["age_ns"].to_list() == [20500 - 14000, 20500 - 2000, 20500 - 3000, 20500 - 4500]


def test_transfers_by_direction(cap) -> None:
    df = REGISTRY["transfers"].compute(cap)
    assert df.columns == ["pid", "direction", "copies", "bytes", "api_ns", "small_copies", "mean_bytes", "api_gb_per_s",
                          "top_call_site"]
    assert rows(df) == [
        # two 1024 B h2d copies taking 500 + 400 ns
        (100, "h2d", 2, 2048, 900, 2, 1024.0, 2048 / 900, None),
        (100, "d2h", 1, 512, 300, 1, 512.0, 512 / 300, None),
    ]


def test_repeated_copies(cap) -> None:
    df = REGISTRY["repeated_copies"].compute(cap)
    # host 0x90000 (the h2d source) copied twice, 1024 B each: 1024 B copied again
    assert rows(df) == [(100, "h2d", 0x90000, 1024, 2, 1024, T0 + 4000, T0 + 10000, 900, None)]


def test_copy_storms_thresholds(cap) -> None:
    # default thresholds: three copies are no storm
    assert REGISTRY["copy_storms"].compute(cap).height == 0
    # gap 7000 joins all three small copies (4000 -> 10000 -> 11000): ends at 11000 + 300
    wide = copy_storms(cap, small_bytes=1024, gap_ns=7000, min_copies=2)
    assert rows(wide) == [(100, 101, T0 + 4000, T0 + 11300, 7300, 3, 2560, 1200, "d2h,h2d", None)]
    # gap 5000 splits 4000 off; the 10000 + 11000 pair remains
    narrow = copy_storms(cap, small_bytes=1024, gap_ns=5000, min_copies=2)
    assert rows(narrow) == [(100, 101, T0 + 10000, T0 + 11300, 1300, 2, 1536, 700, "d2h,h2d", None)]


def test_copy_storm_with_default_thresholds(tmp_path: Path) -> None:
    # 40 copies of 4 KiB every 10 us (a storm), a 2 ms pause, then 10 more (too few)
    storm = [
        (100_000 + i * 10_000, 1000, 9, 9, "cuMemcpyHtoD_v2", "memcpy",
         {"dst": 0xD000, "src": 0x5000 + i * 4096, "size": 4096, "copy_kind": "h2d"})
        for i in range(40)
    ] + [
        (2_500_000 + i * 10_000, 1000, 9, 9, "cuMemcpyHtoD_v2", "memcpy",
         {"dst": 0xD000, "src": 0x5000, "size": 4096, "copy_kind": "h2d"})
        for i in range(10)
    ]
    cap = open_capture(write_capture(tmp_path / "c", rows=storm, names=[], processes=[]))
    df = REGISTRY["copy_storms"].compute(cap)
    # first copy at 100000, last at 490000 ending 1000 ns later; 40 x 4096 B, 40 x 1000 ns
    assert rows(df) == [(9, 9, T0 + 100_000, T0 + 491_000, 391_000, 40, 163_840, 40_000, "h2d", None)]


def test_synchronisation(cap) -> None:
    df = REGISTRY["sync"].compute(cap)
    assert df.columns == ["pid", "tid", "api", "stream", "calls", "blocked_ns", "max_blocked_ns", "mean_blocked_ns",
                          "share", "top_call_site"]
    # share = blocked / 25000 ns of capture
    assert rows(df) == [
        (100, 101, "cuStreamSynchronize", 0x5, 1, 2000, 2000, 2000.0, 0.08, None),
        (100, 101, "cuCtxSynchronize", None, 1, 1000, 1000, 1000.0, 0.04, None),
        (200, 201, "hipDeviceSynchronize", None, 1, 500, 500, 500.0, 0.02, None),
    ]


def test_kernel_summary_host_only(cap) -> None:
    df = REGISTRY["kernels"].compute(cap)
    assert df.columns == ["pid", "name", "display_name", "launches", "failed_launches", "via_graph", "launches_per_s",
                          "shapes", "top_grid", "top_block",
                          "first_ts_ns", "last_ts_ns", "api_ns", "api_mean_ns", "gpu_ns", "gpu_mean_ns", "top_call_site",
                          "name_reason"]
    assert df["display_name"].to_list() == ["axpy", "reduce", "hip_fill"]  # plain C names are shown as they are
    df = df.drop("display_name")
    # rate = launches / 25 us of capture; no device timing: gpu columns null
    assert rows(df) == [
        (100, "axpy", 2, None, None, 80_000.0, 1, "2x1x1", "128x1x1", T0 + 5000, T0 + 6000, 50, 25.0, None, None,
         None, None),
        (100, "reduce", 1, None, None, 40_000.0, 1, "4x1x1", "64x1x1", T0 + 7000, T0 + 7000, 10, 10.0, None, None,
         None, None),
        (200, "hip_fill", 1, None, None, 40_000.0, 1, "1x1x1", "32x1x1", T0 + 2500, T0 + 2500, 40, 40.0, None, None,
         None, None),
    ]


def test_kernel_summary_says_why_a_kernel_has_no_name(tmp_path: Path) -> None:
    """An unknown@ row of names.parquet carries the reason (naming on attach,
    offline naming): the kernel's row says it; a named kernel's says nothing."""
    launch = {"stream": 0x5, "grid": (1, 1, 1), "block": (32, 1, 1)}
    calls = [(1000, 10, 5, 5, "cuLaunchKernel", "launch", {**launch, "func": 0xF1}),
             (2000, 10, 5, 5, "cuLaunchKernel", "launch", {**launch, "func": 0xF2})]
    d = write_capture(tmp_path / "c", rows=calls, names=[(5, 0xF1, "k")], processes=[])
    why = "looked up before the attach; the driver objects hold kernel names at different offsets"
    names = pl.read_parquet(d / "names.parquet")
    pl.concat([names, pl.DataFrame({
        "pid": [5], "handle": [0xF2], "name": ["unknown@0xf2"], "source": ["unknown"], "ts_ns": [None],
        "api": [None], "reason": [why]}, schema=schema.NAMES_SCHEMA)]).write_parquet(d / "names.parquet")
    k = REGISTRY["kernels"].compute(open_capture(d))
    assert rows(k.select("name", "launches", "name_reason").sort("name")) == [("k", 1, None), ("unknown@0xf2", 1, why)]


def test_processes_overview(cap) -> None:
    df = REGISTRY["processes"].compute(cap)
    assert df.columns == ["pid", "comm", "cmdline", "container_id", "threads", "api_calls", "failed_calls", "launches",
                          "kernels",
                          "device_alloc_bytes", "peak_live_bytes", "copy_bytes", "sync_ns", "gpus", "gpu_ids",
                          "first_ts_ns", "last_ts_ns"]
    assert rows(df) == [
        # 13 calls; device memory 4096 + 8192 + 16384 (pinned host excluded); copies 1024 + 1024 + 512;
        # syncs 2000 + 1000; last event ends at 14000 + 100
        (100, "train", "python train.py", None, 1, 13, 0, 3, 2, 28672, 24576, 2560, 3000, None, None,
         T0 + 1000, T0 + 14100),
        (200, "hipapp", "./hipapp --n 4", None, 1, 5, 0, 1, 1, 3072, 2048, 0, 500, None, None,
         T0 + 1500, T0 + 20500),
    ]


@pytest.mark.parametrize("name", ["launch_gaps", "gpu_idle", "working_set", "alloc_hotness", "page_hotness",
                                  "prefetch"])
def test_device_tools_without_device_data_are_empty(cap, name: str) -> None:
    tool = REGISTRY[name]
    assert tool.needs_device is True
    assert tool.compute(cap).height == 0


def test_unmeasured_durations_stay_null(tmp_path: Path) -> None:
    # entry-only probes (launches, async copies) leave dur_ns null: API time is unknown, not 0
    entry_only = [
        (1000, None, 5, 5, "cuLaunchKernel", "launch", {"func": 0xF1, "stream": 0x5, "grid": (1, 1, 1), "block": (32, 1, 1)}),
        (2000, None, 5, 5, "cuMemcpyHtoDAsync_v2", "memcpy", {"dst": 0xD000, "src": 0x5000, "size": 64, "copy_kind": "h2d"}),
        (3000, 700, 5, 5, "cuMemcpyHtoD_v2", "memcpy", {"dst": 0xD000, "src": 0x6000, "size": 128, "copy_kind": "h2d"}),
    ]
    cap = open_capture(write_capture(tmp_path / "c", rows=entry_only, names=[(5, 0xF1, "k")], processes=[]))
    k = REGISTRY["kernels"].compute(cap)
    assert rows(k.select("name", "launches", "api_ns", "api_mean_ns")) == [("k", 1, None, None)]
    # the one measured copy's 700 ns is the sum; both copies' bytes count
    t = REGISTRY["transfers"].compute(cap)
    assert rows(t.select("direction", "copies", "bytes", "api_ns")) == [("h2d", 2, 192, 700)]
    # no sync call at all: 0 ns blocked
    assert REGISTRY["processes"].compute(cap)["sync_ns"].to_list() == [0]
