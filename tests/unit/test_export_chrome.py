"""`pasta-trace export --format chrome`: the JSON is checked against the
trace-event format (required keys per phase, numeric timestamps, non-negative
durations, every flow start matched by one finish with the same id) and
against the hand-built capture of test_export_model, exactly."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from pasta_trace.cli import main
from pasta_trace.export import chrome
from test_export_model import T0, device_model, write_capture

#: keys every event of a phase must carry (Trace Event Format document)
REQUIRED = {
    "X": {"name", "cat", "ph", "ts", "dur", "pid", "tid"},
    "i": {"name", "cat", "ph", "ts", "pid", "tid", "s"},
    "s": {"name", "cat", "ph", "ts", "pid", "tid", "id"},
    "f": {"name", "cat", "ph", "ts", "pid", "tid", "id", "bp"},
    "C": {"name", "ph", "ts", "pid", "args"},
    "M": {"name", "ph", "pid", "args"},
}


def validate(doc: dict) -> list[dict]:
    assert doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    for e in events:
        assert REQUIRED[e["ph"]] <= e.keys(), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], float) and e["dur"] >= 0
        if e["ph"] == "i":
            assert "dur" not in e and e["s"] == "t"
        assert isinstance(e["pid"], int)
    starts = Counter(e["id"] for e in events if e["ph"] == "s")
    finishes = Counter(e["id"] for e in events if e["ph"] == "f")
    assert starts == finishes and set(starts.values()) <= {1}
    return events


def _us(ns_after_t0: int) -> float:
    return (T0 + ns_after_t0) / 1000


@pytest.fixture
def events(tmp_path: Path) -> list[dict]:
    out = tmp_path / "t.json"
    assert main(["export", str(write_capture(tmp_path / "cap")), "--format", "chrome", "-o", str(out)]) == 0
    return validate(json.loads(out.read_text()))


def test_counts_by_phase_and_category(events: list[dict]) -> None:
    # host only: no kernel has device timing, so no kernel slice, no stream track and no arrow
    assert Counter((e["ph"], e.get("cat")) for e in events) == {
        ("M", None): 2 + 3, ("X", "cuda_driver"): 6, ("i", "cuda_driver"): 1, ("X", "cuda_runtime"): 3,
        ("C", None): 4}


def test_names_metadata(events: list[dict]) -> None:
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M"}
    assert meta == {
        ("process_name", 100, None): "train", ("process_name", 200, None): "hipapp",
        ("thread_name", 100, 101): "train", ("thread_name", 100, 102): "loader", ("thread_name", 200, 201): "hipapp",
    }


def test_api_calls_name_their_kernel_and_entry_only_calls_are_instants(events: list[dict]) -> None:
    launches = [(e["ph"], e["name"], e["tid"], e["ts"], e.get("dur"), e["args"]) for e in events
                if e.get("args", {}).get("kind") == "launch"]
    assert launches == [
        ("X", "cuLaunchKernel", 101, _us(2000), 0.05, {"kind": "launch", "ret": 0, "stream": "0x5", "func": "0xf1",
         "kernel": "axpy", "grid": [2, 1, 1], "block": [128, 1, 1], "correlation": 1}),
        ("X", "hipLaunchKernel", 201, _us(2200), 0.04, {"kind": "launch", "ret": 0, "stream": "0x0", "func": "0xa1",
         "kernel": "hip_fill", "grid": [1, 1, 1], "block": [32, 1, 1], "correlation": 2}),
        ("i", "cuLaunchKernel", 102, _us(2500), None, {"kind": "launch", "ret": 0, "stream": "0x5", "func": "0xf1",
         "kernel": "axpy", "grid": [1, 1, 1], "block": [32, 1, 1], "correlation": 3}),
        ("X", "cuLaunchKernel", 101, _us(3000), 0.05, {"kind": "launch", "ret": 0, "stream": "0x6", "func": "0xf2",
         "kernel": "reduce", "grid": [4, 1, 1], "block": [64, 1, 1], "correlation": 4}),
    ]
    copy = next(e for e in events if e["name"] == "cuMemcpyDtoH_v2")
    assert copy["args"] == {"kind": "memcpy", "ret": 0, "size": 1024, "dst": "0x9000", "src": "0x1000",
                            "copy_kind": "d2h"}


def test_memory_counters(events: list[dict]) -> None:
    assert [(e["pid"], e["name"], e["ts"], e["args"]) for e in events if e["ph"] == "C"] == [
        (100, "GPU memory", _us(1000), {"live_bytes": 4096}), (100, "GPU memory", _us(3500), {"live_bytes": 5096}),
        (100, "GPU memory", _us(5000), {"live_bytes": 1000}), (200, "GPU memory", _us(1500), {"live_bytes": 2048})]


def test_timestamps_keep_nanoseconds() -> None:
    us = pl.DataFrame({"ns": [1_234_567_891_234_567, 5, 1000]}).select(chrome._us(pl.col("ns")))
    assert us.to_series().to_list() == ["1234567891234.567", "0.005", "1.000"]


def test_device_timing_and_memops(tmp_path: Path) -> None:
    buf = io.BytesIO()
    n = chrome.write(device_model(tmp_path), buf)
    events = validate(json.loads(buf.getvalue()))
    # metadata 2 + 3 + 3 streams, 10 calls, 3 timed kernels and both ends of their arrows, 2 memops, 4 counters
    assert n == len(events) == 8 + 10 + 3 + 6 + 2 + 4
    tid = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    base = chrome.STREAM_TID_BASE
    assert {k: v for k, v in tid.items() if v >= base} == {
        "GPU stream #9": base, "GPU stream 0x5": base + 1, "GPU stream 0x6": base + 2}
    kernels = [(e["name"], e["tid"], e["ts"], e["dur"], e["args"]) for e in events if e.get("cat") == "kernel"]
    # hip_fill (correlation 2) has no device timing: no slice, no arrow
    assert kernels == [
        ("axpy", base + 1, _us(2100), 0.5, {"correlation": 1, "stream": 5, "stream_handle": "0x5", "device": 0,
                                            "grid": [2, 1, 1], "block": [128, 1, 1], "cupti_correlation": 1}),
        ("axpy", base + 1, _us(2700), 0.2, {"correlation": 3, "stream": 5, "stream_handle": "0x5", "device": 0,
                                            "grid": [1, 1, 1], "block": [32, 1, 1], "cupti_correlation": 2}),
        ("reduce", base + 2, _us(3100), 0.8, {"correlation": 4, "stream": 6, "stream_handle": "0x6", "device": 0,
                                              "grid": [4, 1, 1], "block": [64, 1, 1], "cupti_correlation": 3})]
    ops = [(e["cat"], e["name"], e["tid"], e["ts"], e["dur"], e["args"]) for e in events
           if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    assert ops == [
        ("gpu_memcpy", "Memcpy DtoH", base + 1, _us(4100), 0.15,
         {"bytes": 1024, "stream": 5, "stream_handle": "0x5", "stream_id": 7, "device": 0, "cupti_correlation": 4,
          "copy_kind": 2}),
        ("gpu_memset", "Memset", base, _us(4400), 0.02,
         {"bytes": 256, "stream": 9, "stream_id": 9, "device": 0, "cupti_correlation": 5})]
    s = {e["id"]: (e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "s"}
    f = {e["id"]: (e["pid"], e["tid"], e["ts"], e["bp"]) for e in events if e["ph"] == "f"}
    assert s == {1: (100, 101, _us(2000)), 3: (100, 102, _us(2500)), 4: (100, 101, _us(3000))}
    assert f == {1: (100, base + 1, _us(2100), "e"), 3: (100, base + 1, _us(2700), "e"),
                 4: (100, base + 2, _us(3100), "e")}


def test_large_trace_warns(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chrome, "LARGE_EVENTS", 5)
    out = tmp_path / "t.json"
    assert main(["export", str(write_capture(tmp_path / "cap")), "--format", "chrome", "-o", str(out)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["pasta-trace: warning: 18 events make a large JSON trace that chrome://tracing may not "
                        "load; --format perfetto is smaller and faster"]


def test_chunks_give_the_same_bytes(tmp_path: Path) -> None:
    model = device_model(tmp_path)
    whole, chunked = io.BytesIO(), io.BytesIO()
    chrome.write(model, whole)
    chrome.write(model, chunked, chunk_rows=2)
    assert chunked.getvalue() == whole.getvalue()


def test_capture_without_calls_is_valid(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert main(["export", str(write_capture(tmp_path / "cap", [])), "--format", "chrome", "-o", str(out)]) == 0
    events = validate(json.loads(out.read_text()))
    assert [(e["ph"], e["name"], e["pid"]) for e in events] == [("M", "process_name", 100), ("M", "process_name", 200)]


def test_names_are_escaped(tmp_path: Path) -> None:
    odd = 'void k<"q">(char \\\\, float) ∂\n'
    cap = write_capture(tmp_path / "cap", names=[(100, 0xF1, odd), (100, 0xF2, "reduce"), (200, 0xA1, "hip_fill")])
    out = tmp_path / "t.json"
    assert main(["export", str(cap), "--format", "chrome", "-o", str(out)]) == 0
    events = validate(json.loads(out.read_text()))
    assert [e["args"]["kernel"] for e in events if e.get("args", {}).get("kind") == "launch"] == [
        odd, "hip_fill", odd, "reduce"]


def _with_ranks(cap: Path, ranks: dict[int, tuple[int, int, int]]) -> Path:
    procs = pl.read_parquet(cap / "processes.parquet")
    cols = ("rank", "local_rank", "world_size")
    procs = procs.with_columns(
        pl.col("pid").replace_strict({p: r[i] for p, r in ranks.items()}, default=None, return_dtype=pl.Int32).alias(c)
        for i, c in enumerate(cols))
    procs.write_parquet(cap / "processes.parquet")
    return cap


@pytest.mark.parametrize("ranks, info", [
    ({100: (3, 1, 8), 200: (3, 1, 8)}, {"rank": 3, "local_rank": 1, "world_size": 8}),
    ({100: (3, 1, 8)}, {"rank": 3, "local_rank": 1, "world_size": 8}),  # 200: no RANK in its environment
    ({100: (3, 1, 8), 200: (4, 0, 8)}, None),  # two ranks in one file: it stands for neither
    ({}, None),
])
def test_distributed_info_names_the_rank(tmp_path: Path, ranks: dict, info: dict | None) -> None:
    cap = _with_ranks(write_capture(tmp_path / "cap"), ranks)
    out = tmp_path / "t.json"
    assert main(["export", str(cap), "--format", "chrome", "-o", str(out)]) == 0
    assert json.loads(out.read_text()).get("distributedInfo") == info


def test_tensor_events_are_pytorch_memory_instants_with_device_and_totals(tmp_path: Path) -> None:
    from test_tools_tensors import M, MB, T0 as TT0, _capture

    out = tmp_path / "t.json"
    assert main(["export", str(_capture(tmp_path / "cap")), "--format", "chrome", "-o", str(out)]) == 0
    events = validate(json.loads(out.read_text()))
    tensors = [e for e in events if e.get("cat") == "pytorch_memory"]
    assert len(tensors) == 14 and {e["ph"] for e in tensors} == {"i"}
    first = min(tensors, key=lambda e: e["ts"])
    assert (first["name"], first["ts"], first["args"]) == (
        "c10::reportMemoryUsageToProfiler", (TT0 + 100) / 1e3,
        {"kind": "tensor_alloc", "ptr": "0xa1", "size": M, "device": "cuda:0", "allocated_bytes": MB(5),
         "reserved_bytes": MB(20)})
    assert [e["cat"] for e in events if e.get("name") == "cuMemAlloc_v2"] == ["cuda_driver"]
