"""A small hand-built capture shared by the export tests, and the exact frames
every trace exporter draws from it (pasta_trace.export.trace_model).

Times are ns after T0 (CLOCK_MONOTONIC).  pid 100 ("train") launches on two
streams from two threads, one launch entry-only (no duration); pid 200
("hipapp") is a HIP program.  The device variant adds CUPTI kernel, memcpy
and memset records for pid 100, with correlation ids in launch order."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from pasta_trace import schema
from pasta_trace.export import trace_model
from pasta_trace.read import open_capture

T0 = 1_000_000_000

# (t, dur, pid, tid, api, kind, payload)
HOST_ROWS: list[tuple] = [
    (1000, 100, 100, 101, "cuMemAlloc_v2", "alloc", {"ptr": 0x1000, "size": 4096}),
    (2000, 50, 100, 101, "cuLaunchKernel", "launch", {"func": 0xF1, "stream": 0x5, "grid": (2, 1, 1), "block": (128, 1, 1)}),
    (3000, 50, 100, 101, "cuLaunchKernel", "launch", {"func": 0xF2, "stream": 0x6, "grid": (4, 1, 1), "block": (64, 1, 1)}),
    (4000, 300, 100, 101, "cuMemcpyDtoH_v2", "memcpy", {"dst": 0x9000, "src": 0x1000, "size": 1024, "copy_kind": "d2h"}),
    (5000, 100, 100, 101, "cuMemFree_v2", "free", {"ptr": 0x1000}),
    (2500, None, 100, 102, "cuLaunchKernel", "launch", {"func": 0xF1, "stream": 0x5, "grid": (1, 1, 1), "block": (32, 1, 1)}),
    (3500, 200, 100, 102, "cuMemAlloc_v2", "alloc", {"ptr": 0x8000, "size": 1000}),
    (1500, 100, 200, 201, "hipMalloc", "alloc", {"ptr": 0x10, "size": 2048}),
    (2200, 40, 200, 201, "hipLaunchKernel", "launch", {"func": 0xA1, "stream": 0x0, "grid": (1, 1, 1), "block": (32, 1, 1)}),
    (6000, 500, 200, 201, "hipDeviceSynchronize", "sync", {}),
]
NAMES = [(100, 0xF1, "axpy"), (100, 0xF2, "reduce"), (200, 0xA1, "hip_fill")]
PROCESSES = [(100, "train", "python train.py"), (200, "hipapp", "./hipapp")]
COMMS = {101: "train", 102: "loader", 201: "hipapp"}

# CUPTI records of pid 100: (start, end, correlation_id, stream_id, name), in launch order
CUPTI_KERNELS = [(2100, 2600, 1, 7, "axpy"), (2700, 2900, 2, 7, "axpy"), (3100, 3900, 3, 8, "reduce")]
# (start, end, bytes, stream_id, correlation_id, copy_kind)
CUPTI_MEMCPY = [(4100, 4250, 1024, 7, 4, 2)]
CUPTI_MEMSET = [(4400, 4420, 256, 9, 5, 0)]


def host_events(rows: list[tuple]) -> pl.DataFrame:
    cols: dict[str, list] = {c: [] for c in schema.EVENTS_SCHEMA}
    for t, dur, pid, tid, api, kind, payload in rows:
        row = {c: None for c in schema.EVENTS_SCHEMA}
        row.update(ts_ns=T0 + t, dur_ns=dur, pid=pid, tid=tid, comm=COMMS[tid], api=api, kind=kind, ret=0)
        for k, v in payload.items():
            if k in ("grid", "block"):
                row.update({f"{k}_x": v[0], f"{k}_y": v[1], f"{k}_z": v[2]})
            else:
                row[k] = v
        for c in cols:
            cols[c].append(row[c])
    return pl.DataFrame(cols, schema=schema.EVENTS_SCHEMA)


def write_capture(path: Path, rows: list[tuple] = HOST_ROWS, names: list[tuple] = NAMES) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    host_events(rows).write_parquet(path / "events-000.parquet")
    pl.DataFrame(
        {"pid": [n[0] for n in names], "handle": [n[1] for n in names], "name": [n[2] for n in names],
         "source": ["module_get_function"] * len(names), "ts_ns": [T0] * len(names),
         "api": ["cuModuleGetFunction"] * len(names), "reason": [None] * len(names)},
        schema=schema.NAMES_SCHEMA,
    ).write_parquet(path / "names.parquet")
    procs = {c: [None] * len(PROCESSES) for c in schema.PROCESSES_SCHEMA}
    procs.update(pid=[p[0] for p in PROCESSES], ppid=[1] * len(PROCESSES), comm=[p[1] for p in PROCESSES],
                 cmdline=[p[2] for p in PROCESSES], start_ns=[T0] * len(PROCESSES))
    pl.DataFrame(procs, schema=schema.PROCESSES_SCHEMA).write_parquet(path / "processes.parquet")
    manifest = {"format_version": "1.0", "tool_version": "test", "command": "pasta-trace -a", "host": "h",
                "complete": True, "counts": {"events": len(rows), "lost_events": 0, "lost_names": 0}}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def _device_frame(name: str, rows: list[dict]) -> pl.LazyFrame:
    sch = schema.DEVICE_FRAMES[name]
    full = [{c: r.get(c) for c in sch} for r in rows]
    return pl.DataFrame(full, schema=sch, orient="row").lazy()


def with_device(cap):
    """The capture plus CUPTI kernel, memcpy and memset records of pid 100."""
    cap.device["cupti_kernels"] = _device_frame("cupti_kernels", [
        dict(pid=100, start=T0 + s, end=T0 + e, grid_id=c, stream_id=st, correlation_id=c, device=0, name=n)
        for s, e, c, st, n in CUPTI_KERNELS])
    cap.device["cupti_memcpy"] = _device_frame("cupti_memcpy", [
        dict(pid=100, start=T0 + s, end=T0 + e, bytes=b, stream_id=st, correlation_id=c, device=0, copy_kind=k)
        for s, e, b, st, c, k in CUPTI_MEMCPY])
    cap.device["cupti_memset"] = _device_frame("cupti_memset", [
        dict(pid=100, start=T0 + s, end=T0 + e, bytes=b, stream_id=st, correlation_id=c, device=0, copy_kind=k)
        for s, e, b, st, c, k in CUPTI_MEMSET])
    return cap


def host_model(tmp_path: Path) -> trace_model.TraceModel:
    return trace_model.build(open_capture(write_capture(tmp_path / "cap")))


def device_model(tmp_path: Path) -> trace_model.TraceModel:
    return trace_model.build(with_device(open_capture(write_capture(tmp_path / "cap"))))


def test_tracks(tmp_path: Path) -> None:
    m = host_model(tmp_path)
    assert m.processes.rows() == [(100, "train", "python train.py"), (200, "hipapp", "./hipapp")]
    assert m.threads.rows() == [(100, 101, "train"), (100, 102, "loader"), (200, 201, "hipapp")]
    assert m.streams.rows() == [(100, "GPU stream 0x5"), (100, "GPU stream 0x6"), (200, "GPU stream 0x0")]


def test_api_calls_and_launch_correlation(tmp_path: Path) -> None:
    m = host_model(tmp_path)
    assert m.api.height == 10
    assert m.api.filter(pl.col("kind") == "launch").select("ts_ns", "corr").rows() == [
        (T0 + 2000, 1), (T0 + 2200, 2), (T0 + 2500, 3), (T0 + 3000, 4)]
    assert m.api.filter(pl.col("kind") != "launch")["corr"].null_count() == 6
    assert m.api.group_by("cat").len().sort("cat").rows() == [("cuda_driver", 7), ("cuda_runtime", 3)]


def test_host_only_kernels_sit_at_their_launch(tmp_path: Path) -> None:
    m = host_model(tmp_path)
    assert m.kernels.select("pid", "label", "name", "ts_ns", "dur_ns", "corr").rows() == [
        (100, "GPU stream 0x5", "axpy", T0 + 2000, None, 1),
        (200, "GPU stream 0x0", "hip_fill", T0 + 2200, None, 2),
        (100, "GPU stream 0x5", "axpy", T0 + 2500, None, 3),
        (100, "GPU stream 0x6", "reduce", T0 + 3000, None, 4),
    ]
    assert m.memops.height == 0


def test_memory_counter(tmp_path: Path) -> None:
    m = host_model(tmp_path)
    assert m.memory.sort("pid", "ts_ns").rows() == [
        (100, "GPU memory", T0 + 1000, 4096), (100, "GPU memory", T0 + 3500, 5096),
        (100, "GPU memory", T0 + 5000, 1000), (200, "GPU memory", T0 + 1500, 2048)]


def test_device_timing_and_memops(tmp_path: Path) -> None:
    m = device_model(tmp_path)
    assert m.kernels.select("pid", "label", "name", "ts_ns", "dur_ns", "corr", "cupti_correlation").rows() == [
        (100, "GPU stream 0x5", "axpy", T0 + 2100, 500, 1, 1),
        (200, "GPU stream 0x0", "hip_fill", T0 + 2200, None, 2, None),
        (100, "GPU stream 0x5", "axpy", T0 + 2700, 200, 3, 2),
        (100, "GPU stream 0x6", "reduce", T0 + 3100, 800, 4, 3),
    ]
    # the memcpy's CUPTI stream 7 carries kernels launched on 0x5; stream 9 has none
    assert m.memops.select("pid", "label", "cat", "ts_ns", "dur_ns", "bytes", "copy_kind").rows() == [
        (100, "GPU stream 0x5", "gpu_memcpy", T0 + 4100, 150, 1024, 2),
        (100, "GPU stream #9", "gpu_memset", T0 + 4400, 20, 256, 0),
    ]
    assert m.streams.rows() == [(100, "GPU stream #9"), (100, "GPU stream 0x5"), (100, "GPU stream 0x6"),
                                (200, "GPU stream 0x0")]


def test_overlapping_work_on_one_stream_is_serialized() -> None:
    frame = pl.DataFrame({
        "pid": [1, 1, 1, 1, 2], "label": ["s", "s", "s", "s", "s"],
        "ts_ns": [100, 150, 120, 400, 130], "dur_ns": [100, 100, None, 10, 50],
    })
    assert trace_model.serialized(frame).rows() == [
        (1, "s", 100, 100, None), (1, "s", 200, 50, 50), (1, "s", 120, None, None), (1, "s", 400, 10, None),
        (2, "s", 130, 50, None)]


def test_launches_sharing_a_timestamp_stay_one_to_one(tmp_path: Path) -> None:
    twin = (2000, 50, 100, 101, "cuLaunchKernel", "launch", {"func": 0xF2, "stream": 0x6, "grid": (4, 1, 1), "block": (64, 1, 1)})
    m = trace_model.build(open_capture(write_capture(tmp_path / "cap", [*HOST_ROWS, twin])))
    assert m.api.height == 11
    assert m.api.filter(pl.col("ts_ns") == T0 + 2000)["corr"].sort().to_list() == [1, 2]
    assert m.kernels.filter(pl.col("ts_ns") == T0 + 2000).select("corr", "name").sort("corr").rows() == [
        (1, "axpy"), (2, "reduce")]


def test_launch_rows_number_launches_by_pid_time_then_thread_stably() -> None:
    """The numpy numbering of the launches (and the Polars one it falls back
    to where a key is null) gives each kernel execution its launch's row in
    the API calls: by (pid, ts_ns, tid), equal keys in call order."""
    api = pl.DataFrame({
        "pid": [7, 7, 7, 9, 7, 7], "ts_ns": [10, 10, 5, 1, 20, 20], "tid": [2, 1, 1, 1, 3, 3],
        "kind": ["launch", "launch", "sync", "launch", "launch", "launch"],
    }, schema={"pid": pl.UInt32, "ts_ns": pl.Int64, "tid": pl.UInt32, "kind": pl.String})
    # pid 7 in order: row 1 (ts 10, tid 1), row 0 (ts 10, tid 2), row 4, row 5 (ts 20, tid 3: call order)
    ex = pl.DataFrame({"pid": [7, 7, 7, 7, 9, 7, 9], "launch_seq": [0, 1, 2, 3, 0, None, 1]},
                      schema={"pid": pl.UInt32, "launch_seq": pl.Int64})
    want = [1, 0, 4, 5, 3, None, None]
    assert trace_model._launch_rows(api, ex).to_list() == want
    with_null = api.with_columns(ts_ns=pl.when(pl.col("kind") != "sync").then(pl.col("ts_ns")))
    assert trace_model._launch_rows(with_null, ex).to_list() == want


def test_launch_rows_of_calls_in_time_order_number_by_pid_first() -> None:
    """Calls sorted by (ts_ns, pid, tid), as the model holds them, are
    numbered by a stable sort on pid alone: the same rows as the lexsort."""
    api = pl.DataFrame({
        "pid": [9, 7, 7, 7, 9, 7, 7], "ts_ns": [1, 5, 10, 10, 10, 20, 20], "tid": [1, 1, 1, 2, 1, 3, 3],
        "kind": ["launch", "sync", "launch", "launch", "launch", "launch", "launch"],
    }, schema={"pid": pl.UInt32, "ts_ns": pl.Int64, "tid": pl.UInt32, "kind": pl.String})
    ex = pl.DataFrame({"pid": [7, 7, 7, 7, 9, 9, 9], "launch_seq": [0, 1, 2, 3, 0, 1, 2]},
                      schema={"pid": pl.UInt32, "launch_seq": pl.Int64})
    assert trace_model._launch_rows(api, ex).to_list() == [2, 3, 5, 6, 0, 4, None]


def test_host_kernels_are_the_merged_kernel_executions(tmp_path: Path) -> None:
    """Without device data the kernels come from the launch calls in memory:
    the same frames as the merge's kernel executions give, names not seen
    (0xF2 here) included as unknown@0x<handle>."""
    from polars.testing import assert_frame_equal

    from pasta_trace import merge

    cap = open_capture(write_capture(tmp_path / "cap", names=[(100, 0xF1, "axpy"), (200, 0xA1, "hip_fill")]))
    api = trace_model._api_calls(cap)
    fast_api, fast = trace_model._host_kernels(cap, api)
    merged_api, merged = trace_model._kernels(
        api, merge.kernel_executions(cap).select(trace_model.KERNEL_COLUMNS).collect())
    assert_frame_equal(fast, merged)
    assert_frame_equal(fast_api, merged_api)
    assert fast["name"].to_list() == ["axpy", "hip_fill", "axpy", "unknown@0xf2"]
