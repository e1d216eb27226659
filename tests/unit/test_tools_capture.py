"""A small hand-written capture shared by the tool and report tests, plus a check
that it reads back exactly as written.

Every number the golden tests expect is derived by hand from the rows below.
Times are ns after T0 (CLOCK_MONOTONIC); pid 100 is a CUDA program, pid 200 a
HIP one that reuses a freed address."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from pasta_trace import schema
from pasta_trace.read import open_capture

T0 = 1_000_000_000
H2D, D2H = "h2d", "d2h"

# (t, dur, pid, tid, api, kind, payload)
HOST_ROWS: list[tuple] = [
    (1000, 100, 100, 101, "cuMemAlloc_v2", "alloc", {"ptr": 0x10000, "size": 4096}),
    (2000, 100, 100, 101, "cuMemAllocManaged", "alloc", {"ptr": 0x20000, "size": 8192}),
    (3000, 50, 100, 101, "cuMemAllocHost_v2", "alloc", {"ptr": 0x90000, "size": 1024}),
    (4000, 500, 100, 101, "cuMemcpyHtoD_v2", "memcpy", {"dst": 0x10000, "src": 0x90000, "size": 1024, "copy_kind": H2D}),
    (5000, 20, 100, 101, "cuLaunchKernel", "launch", {"func": 0xF1, "stream": 0x5, "grid": (2, 1, 1), "block": (128, 1, 1)}),
    (6000, 30, 100, 101, "cuLaunchKernel", "launch", {"func": 0xF1, "stream": 0x5, "grid": (2, 1, 1), "block": (128, 1, 1)}),
    (7000, 10, 100, 101, "cuLaunchKernel", "launch", {"func": 0xF2, "stream": 0x5, "grid": (4, 1, 1), "block": (64, 1, 1)}),
    (8000, 2000, 100, 101, "cuStreamSynchronize", "sync", {"stream": 0x5}),
    (10000, 400, 100, 101, "cuMemcpyHtoD_v2", "memcpy", {"dst": 0x10000, "src": 0x90000, "size": 1024, "copy_kind": H2D}),
    (11000, 300, 100, 101, "cuMemcpyDtoH_v2", "memcpy", {"dst": 0x90000, "src": 0x10000, "size": 512, "copy_kind": D2H}),
    (12000, 100, 100, 101, "cuMemFree_v2", "free", {"ptr": 0x10000}),
    (13000, 1000, 100, 101, "cuCtxSynchronize", "sync", {}),
    (14000, 100, 100, 101, "cuMemAlloc_v2", "alloc", {"ptr": 0x30000, "size": 16384}),
    (1500, 100, 200, 201, "hipMalloc", "alloc", {"ptr": 0x10000, "size": 2048}),
    (2500, 40, 200, 201, "hipLaunchKernel", "launch", {"func": 0xA1, "stream": 0x0, "grid": (1, 1, 1), "block": (32, 1, 1)}),
    (3500, 100, 200, 201, "hipFree", "free", {"ptr": 0x10000}),
    (4500, 100, 200, 201, "hipMalloc", "alloc", {"ptr": 0x10000, "size": 1024}),
    (20000, 500, 200, 201, "hipDeviceSynchronize", "sync", {}),
]

NAMES = [(100, 0xF1, "axpy"), (100, 0xF2, "reduce"), (200, 0xA1, "hip_fill")]
PROCESSES = [(100, "train", "python train.py"), (200, "hipapp", "./hipapp --n 4")]


def host_events(rows: list[tuple]) -> pl.DataFrame:
    """Rows -> a frame with exactly schema.EVENTS_SCHEMA (payload nulls where unset)."""
    cols: dict[str, list] = {c: [] for c in schema.EVENTS_SCHEMA}
    for t, dur, pid, tid, api, kind, payload in rows:
        row = {c: None for c in schema.EVENTS_SCHEMA}
        row.update(ts_ns=T0 + t, dur_ns=dur, pid=pid, tid=tid, comm="t", api=api, kind=kind, ret=0)
        for k, v in payload.items():
            if k in ("grid", "block"):
                row.update({f"{k}_x": v[0], f"{k}_y": v[1], f"{k}_z": v[2]})
            else:
                row[k] = v
        for c in cols:
            cols[c].append(row[c])
    return pl.DataFrame(cols, schema=schema.EVENTS_SCHEMA)


def write_capture(
    path: Path,
    rows: list[tuple] = HOST_ROWS,
    names: list[tuple] = NAMES,
    processes: list[tuple] = PROCESSES,
    lost_events: int = 0,
    complete: bool = True,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    host_events(rows).write_parquet(path / "events-000.parquet")
    pl.DataFrame(
        {
            "pid": [n[0] for n in names],
            "handle": [n[1] for n in names],
            "name": [n[2] for n in names],
            "source": ["module_get_function"] * len(names),
            "ts_ns": [T0] * len(names),
            "api": ["cuModuleGetFunction"] * len(names),
            "reason": [None] * len(names),
        },
        schema=schema.NAMES_SCHEMA,
    ).write_parquet(path / "names.parquet")
    procs = {c: [None] * len(processes) for c in schema.PROCESSES_SCHEMA}
    procs.update(
        pid=[p[0] for p in processes], ppid=[1] * len(processes),
        comm=[p[1] for p in processes], cmdline=[p[2] for p in processes],
        start_ns=[T0] * len(processes),
    )
    pl.DataFrame(procs, schema=schema.PROCESSES_SCHEMA).write_parquet(path / "processes.parquet")
    manifest = {
        "format_version": "1.0",
        "tool": "pasta-trace",
        "tool_version": "test",
        "command_line": ["pasta-trace", "-a", "-d", "1"],
        "host": "testhost",
        "kernel_release": "6.1.0-test",
        "mode": "system",
        "clock": {
            "domain": "CLOCK_MONOTONIC",
            "start_ns": T0,
            "end_ns": T0 + 25_000,
            "start_sample": {"mono_before_ns": T0, "realtime_ns": 1_796_212_800_000_000_000, "mono_after_ns": T0},
        },
        "complete": complete,
        "counts": {"events": len(rows), "lost_events": lost_events, "lost_names": 0},
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_capture_reads_back_exactly(tmp_path: Path) -> None:
    cap = open_capture(write_capture(tmp_path / "cap"))
    ev = cap.events.collect()
    assert ev.height == 18
    assert ev.columns == list(schema.EVENTS_SCHEMA)
    assert ev["ts_ns"].min() == T0 + 1000
    assert ev.filter(pl.col("kind") == "launch")["grid_x"].to_list() == [2, 2, 4, 1]
    assert cap.complete is True
    assert cap.lost_events == 0


# ----------------------------------------------------------------------------- with device data
#
# The same program, with the managed allocation made 0x4800 B (pages 32..36 at
# 4 KiB, the last one only half inside), and device frames as the device
# reader would produce them: LAUNCH records and CUPTI kernel records (already
# on CLOCK_MONOTONIC) joined by correlation id, and page histograms.
#
#   launch  host ts  kernel    GPU start-end  pages touched (page x accesses)
#   pid 100 #1  5000  axpy     5500-6500      16x100 32x50 33x40
#   pid 100 #2  6000  axpy     6600-7600      16x100 33x20 36x30
#   pid 100 #3  7000  reduce   8900-9500      34x10  64x5 (no allocation at 0x40000)
#   pid 200 #1  2500  hip_fill 3000-5600      none

MANAGED_SIZE = 0x4800
DEVICE_HOST_ROWS = [
    (t, d, p, tid, api, kind, {**pl_, "size": MANAGED_SIZE} if api == "cuMemAllocManaged" else pl_)
    for t, d, p, tid, api, kind, pl_ in HOST_ROWS
]
# (pid, launch_id, host ts, tid, stream, func, name, correlation id, gpu start, gpu end)
DEVICE_LAUNCHES = [
    (100, 1, 5000, 101, 0x5, 0xF1, "axpy", 1, 5500, 6500),
    (100, 2, 6000, 101, 0x5, 0xF1, "axpy", 2, 6600, 7600),
    (100, 3, 7000, 101, 0x5, 0xF2, "reduce", 3, 8900, 9500),
    (200, 1, 2500, 201, 0x0, 0xA1, "hip_fill", 10, 3000, 5600),
]
PAGE_HIST = [  # (pid, launch_id, page, count)
    (100, 1, 16, 100), (100, 1, 32, 50), (100, 1, 33, 40),
    (100, 2, 16, 100), (100, 2, 33, 20), (100, 2, 36, 30),
    (100, 3, 34, 10), (100, 3, 64, 5),
]
API_ENTER_AFTER_UPROBE_NS = 200  # the device callback runs inside the API call the uprobe saw enter


def _frame(name: str, cols: dict) -> pl.DataFrame:
    sch = schema.DEVICE_FRAMES[name]
    n = len(next(iter(cols.values())))
    full = {c: cols.get(c, [0] * n) for c in sch}
    return pl.DataFrame(full).cast(sch)


def write_device_capture(path: Path) -> Path:
    write_capture(path, rows=DEVICE_HOST_ROWS)
    dev = path / "device"
    dev.mkdir()
    L = DEVICE_LAUNCHES
    col = lambda i: [r[i] for r in L]  # noqa: E731
    begin = [T0 + r[2] + API_ENTER_AFTER_UPROBE_NS for r in L]
    _frame("launches", {
        "pid": col(0), "launch_id": col(1), "host_mono_begin": begin, "host_mono_end": [b + 10 for b in begin],
        "stream": col(4), "func": col(5), "grid_id": [0] * len(L), "device": [0] * len(L),
        "correlation_id": col(7), "tid": col(3), "name": col(6),
        "grid_x": [1] * len(L), "grid_y": [1] * len(L), "grid_z": [1] * len(L),
        "block_x": [1] * len(L), "block_y": [1] * len(L), "block_z": [1] * len(L),
    }).write_parquet(dev / "launches.parquet")
    _frame("cupti_kernels", {
        "pid": col(0), "start": [T0 + r[8] for r in L], "end": [T0 + r[9] for r in L],
        "grid_id": [0] * len(L), "stream_id": [0] * len(L), "correlation_id": col(7), "device": [0] * len(L),
        "name": col(6),
    }).write_parquet(dev / "cupti_kernels.parquet")
    _frame("page_hist", {
        "pid": [r[0] for r in PAGE_HIST], "launch_id": [r[1] for r in PAGE_HIST],
        "page_shift": [12] * len(PAGE_HIST), "page": [r[2] for r in PAGE_HIST], "count": [r[3] for r in PAGE_HIST],
    }).write_parquet(dev / "page_hist.parquet")
    return path


def test_device_capture_reads_back(tmp_path: Path) -> None:
    cap = open_capture(write_device_capture(tmp_path / "cap"))
    assert cap.has_device_data is True
    assert cap.device["launches"].collect()["launch_id"].to_list() == [1, 2, 3, 1]
    assert cap.device["page_hist"].collect()["count"].sum() == 355
