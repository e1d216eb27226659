"""Tensor memory tools on a hand-written capture: a CUDA device whose caching
allocator reports its totals (weights kept, activations freed, a call site
that leaks, a block from before the capture freed), and CPU tensors seen both
through New/Delete and, under a profiler, through reportMemoryUsageToProfiler
(counted once).  Every expected number is derived by hand from the rows."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from pasta_trace.tools import tensors as T
from pasta_trace.tools.memory import memory_timeline

T0 = 1_000_000
K, M = 1024, 1 << 20
REPORT, NEW, DELETE = T.REPORT_API, *T.CPU_APIS
WEIGHTS, STEP, LOG = 1, 2, 3  # stack ids
SITES = {WEIGHTS: "model.py:10 Linear.__init__", STEP: "train.py:30 step", LOG: "train.py:44 log"}
MB = lambda x: int(x * M)  # noqa: E731

# (t, api, kind, ptr, size, device, allocated, reserved, stack)
ROWS = [
    (100, REPORT, "tensor_alloc", 0xA1, M, "cuda:0", MB(5), MB(20), WEIGHTS),
    (200, REPORT, "tensor_alloc", 0xA2, M, "cuda:0", MB(6), MB(20), WEIGHTS),
    (300, NEW, "tensor_alloc", 0x50, 100, "cpu", None, None, STEP),
    (301, REPORT, "tensor_alloc", 0x50, 100, "cpu", 100, None, STEP),  # the profiler's copy of the same tensor
    (500, REPORT, "tensor_free", 0xDEAD, 512 * K, "cuda:0", MB(5.5), MB(20), None),  # allocated before the capture
    (900, DELETE, "tensor_free", 0x50, 100, "cpu", None, None, STEP),
    (901, REPORT, "tensor_free", 0x50, 100, "cpu", 0, None, STEP),
    (1000, REPORT, "tensor_alloc", 0xB1, 2 * M, "cuda:0", MB(7.5), MB(22), STEP),
    (2000, REPORT, "tensor_free", 0xB1, 2 * M, "cuda:0", MB(5.5), MB(22), STEP),
    (3000, REPORT, "tensor_alloc", 0xB1, 2 * M, "cuda:0", MB(7.5), MB(22), STEP),  # the same address again
    (4000, REPORT, "tensor_free", 0xB1, 2 * M, "cuda:0", MB(5.5), MB(22), STEP),
    (6000, REPORT, "tensor_alloc", 0xC1, 256 * K, "cuda:0", MB(5.75), MB(22), LOG),
    (7000, REPORT, "tensor_alloc", 0xC2, 256 * K, "cuda:0", MB(6), MB(22), LOG),
    (8000, REPORT, "tensor_alloc", 0xC3, 256 * K, "cuda:0", MB(6.25), MB(22), LOG),
]
SEGMENT = (50, "cuMemAlloc_v2", "alloc", 0x7000000, 20 * M)  # the allocator's segment from the driver


def _capture(d: Path) -> Path:
    d.mkdir()
    rows = [dict(ts_ns=T0 + t, api=a, kind=k, ptr=p, size=s, device=dev, allocated_bytes=al, reserved_bytes=r,
                 stack_id=st, layer="framework") for t, a, k, p, s, dev, al, r, st in ROWS]
    t, a, k, p, s = SEGMENT
    rows.append(dict(ts_ns=T0 + t, api=a, kind=k, ptr=p, size=s, ret=0, dur_ns=10, layer="driver"))
    full = [{c: None for c in schema.EVENTS_SCHEMA} | {"pid": 7, "tid": 8, "comm": "python"} | r for r in rows]
    pl.DataFrame(full, schema=schema.EVENTS_SCHEMA).sort("ts_ns").write_parquet(d / "events-00000.parquet")
    frames = [(sid, 0, site.split(" ")[1], site.split(":")[0], int(site.split(":")[1].split(" ")[0]))
              for sid, site in SITES.items()]
    pl.DataFrame({"pid": [7] * 3, "stack_id": [f[0] for f in frames], "depth": [0] * 3, "kind": ["python"] * 3,
                  "function": [f[2] for f in frames], "file": [f[3] for f in frames], "line": [f[4] for f in frames],
                  "module": [None] * 3, "addr": [1, 2, 3], "truncated": [False] * 3},
                 schema=schema.STACKS_SCHEMA).write_parquet(d / "stacks.parquet")
    (d / "manifest.json").write_text(json.dumps({"format_version": "1.2", "complete": True,
                                                 "clock": {"start_ns": T0, "end_ns": T0 + 10_000}}))
    return d


@pytest.fixture
def cap(tmp_path: Path):
    return open_capture(_capture(tmp_path / "cap"))


def test_timeline_allocated_against_reserved_one_source_per_device(cap) -> None:
    got = T.tensor_timeline(cap).select("device", "ts_ns", "api", "kind", "ptr", "delta_bytes", "live_bytes",
                                        "allocated_bytes", "reserved_bytes", "held_bytes")
    assert got.rows() == [
        # cpu: New/Delete only; the profiler's reportMemoryUsageToProfiler copies are not counted again
        ("cpu", T0 + 300, NEW, "tensor_alloc", 0x50, 100, 100, None, None, 100),
        ("cpu", T0 + 900, DELETE, "tensor_free", 0x50, -100, 0, None, None, 0),
        ("cuda:0", T0 + 100, REPORT, "tensor_alloc", 0xA1, M, M, MB(5), MB(20), MB(5)),
        ("cuda:0", T0 + 200, REPORT, "tensor_alloc", 0xA2, M, 2 * M, MB(6), MB(20), MB(6)),
        # a block allocated before the capture: no tensor of it to take back from live_bytes
        ("cuda:0", T0 + 500, REPORT, "tensor_free", 0xDEAD, 0, 2 * M, MB(5.5), MB(20), MB(5.5)),
        ("cuda:0", T0 + 1000, REPORT, "tensor_alloc", 0xB1, 2 * M, 4 * M, MB(7.5), MB(22), MB(7.5)),
        ("cuda:0", T0 + 2000, REPORT, "tensor_free", 0xB1, -2 * M, 2 * M, MB(5.5), MB(22), MB(5.5)),
        ("cuda:0", T0 + 3000, REPORT, "tensor_alloc", 0xB1, 2 * M, 4 * M, MB(7.5), MB(22), MB(7.5)),
        ("cuda:0", T0 + 4000, REPORT, "tensor_free", 0xB1, -2 * M, 2 * M, MB(5.5), MB(22), MB(5.5)),
        ("cuda:0", T0 + 6000, REPORT, "tensor_alloc", 0xC1, 256 * K, MB(2.25), MB(5.75), MB(22), MB(5.75)),
        ("cuda:0", T0 + 7000, REPORT, "tensor_alloc", 0xC2, 256 * K, MB(2.5), MB(6), MB(22), MB(6)),
        ("cuda:0", T0 + 8000, REPORT, "tensor_alloc", 0xC3, 256 * K, MB(2.75), MB(6.25), MB(22), MB(6.25)),
    ]


def test_never_summed_with_driver_allocations(cap) -> None:
    assert memory_timeline(cap).select("api", "delta_bytes", "live_bytes").rows() == [("cuMemAlloc_v2", 20 * M, 20 * M)]
    assert 0x7000000 not in T.tensor_timeline(cap)["ptr"].to_list()


def test_peak_and_the_call_sites_holding_it(cap) -> None:
    assert T.tensor_peaks(cap).rows() == [
        (7, "cpu", 100, T0 + 300, None, 0, 1, 100, SITES[STEP]),
        # 7.5 MiB first at 1000; weights and the step's tensor hold 2 MiB each: the weights' two tensors win the tie
        (7, "cuda:0", MB(7.5), T0 + 1000, MB(22), MB(6.25), 7, MB(6.75), SITES[WEIGHTS]),
    ]
    assert T.tensor_peak_call_sites(cap).rows() == [
        # the allocator held 4 MiB from before the capture, 0.5 MiB of it freed by then
        (7, "cuda:0", T.BEFORE, MB(3.5), None, T0 + 1000),
        (7, "cuda:0", SITES[WEIGHTS], 2 * M, 2, T0 + 1000),
        (7, "cuda:0", SITES[STEP], 2 * M, 1, T0 + 1000),
        (7, "cpu", SITES[STEP], 100, 1, T0 + 300),
    ]


def test_fragmentation_only_where_the_allocator_reports_reserved(cap) -> None:
    # reserved - allocated: 15, 14, 14.5, 14.5, 16.5 (first max, at 2000), 14.5, 16.5, 16.25, 16, 15.75 MiB
    assert T.tensor_fragmentation(cap).rows() == [(7, "cuda:0", MB(22), MB(7.5), MB(16.5), T0 + 2000, 0.75, MB(15.75))]


def test_leaks_are_sites_that_pile_up_and_never_freed_lists_every_tensor_left(cap) -> None:
    # midpoint 5000: the log line went from 0 to 768 KiB through 3 new tensors; the weights held steady
    assert T.tensor_leaks(cap).rows() == [(7, "cuda:0", SITES[LOG], 768 * K, 3, 768 * K, 3, 3)]
    end = T0 + 10_000
    assert T.tensors_never_freed(cap).select("device", "ptr", "size", "alloc_ts_ns", "age_ns", "call_site").rows() == [
        ("cuda:0", 0xA1, M, T0 + 100, end - T0 - 100, SITES[WEIGHTS]),
        ("cuda:0", 0xA2, M, T0 + 200, end - T0 - 200, SITES[WEIGHTS]),
        ("cuda:0", 0xC1, 256 * K, T0 + 6000, 4000, SITES[LOG]),
        ("cuda:0", 0xC2, 256 * K, T0 + 7000, 3000, SITES[LOG]),
        ("cuda:0", 0xC3, 256 * K, T0 + 8000, 2000, SITES[LOG]),
    ]


def test_registered_and_empty_without_tensor_events(tmp_path: Path) -> None:
    names = ["tensor_memory", "tensor_peaks", "tensor_peak_call_sites", "tensor_fragmentation", "tensor_leaks",
             "tensors_never_freed"]
    assert [n for n in REGISTRY if n.startswith("tensor")] == names
    d = tmp_path / "empty"
    d.mkdir()
    schema.empty_frame(schema.EVENTS_SCHEMA).write_parquet(d / "events-00000.parquet")
    (d / "manifest.json").write_text(json.dumps({"format_version": "1.2", "complete": True}))
    empty = open_capture(d)
    assert [REGISTRY[n].compute(empty).height for n in names] == [0] * 6


def test_terminal_render_of_the_timeline(cap) -> None:
    text = REGISTRY["tensor_memory"].render_text(T.tensor_timeline(cap))
    assert text.splitlines()[0] == "pid 7 cpu: peak 100 B, end 0 B, 2 events"
    assert text.splitlines()[2] == "pid 7 cuda:0: peak 7.5 MiB, reserved peak 22.0 MiB, end 6.2 MiB, 10 events"
