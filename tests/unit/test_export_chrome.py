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
    "s": {"name", "cat", "ph", "ts", "pid", "tid", "id"},
    "f": {"name", "cat", "ph", "ts", "pid", "tid", "id", "bp"},
    "C": {"name", "ph", "ts", "pid", "args"},
    "M": {"name", "ph", "pid", "args"},
}
# stream tracks of the host-only capture, numbered in (pid, name) order
S5, S6, S0 = chrome.STREAM_TID_BASE, chrome.STREAM_TID_BASE + 1, chrome.STREAM_TID_BASE + 2


def validate(doc: dict) -> list[dict]:
    assert doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    for e in events:
        assert REQUIRED[e["ph"]] <= e.keys(), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], float) and e["dur"] >= 0
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
    assert Counter((e["ph"], e.get("cat")) for e in events) == {
        ("M", None): 2 + 3 + 3, ("X", "cuda_driver"): 7, ("X", "cuda_runtime"): 3, ("X", "kernel"): 4,
        ("s", "ac2g"): 4, ("f", "ac2g"): 4, ("C", None): 4}


def test_names_metadata(events: list[dict]) -> None:
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M"}
    assert meta == {
        ("process_name", 100, None): "train", ("process_name", 200, None): "hipapp",
        ("thread_name", 100, 101): "train", ("thread_name", 100, 102): "loader", ("thread_name", 200, 201): "hipapp",
        ("thread_name", 100, S5): "GPU stream 0x5", ("thread_name", 100, S6): "GPU stream 0x6",
        ("thread_name", 200, S0): "GPU stream 0x0",
    }


def test_api_calls_and_kernels_share_correlation(events: list[dict]) -> None:
    launches = {e["args"]["correlation"]: e for e in events if e["ph"] == "X" and "correlation" in e["args"]
                and e["cat"] != "kernel"}
    kernels = {e["args"]["correlation"]: e for e in events if e.get("cat") == "kernel"}
    assert sorted(launches) == sorted(kernels) == [1, 2, 3, 4]
    assert [(launches[c]["name"], launches[c]["tid"], kernels[c]["name"], kernels[c]["tid"]) for c in [1, 2, 3, 4]] == [
        ("cuLaunchKernel", 101, "axpy", S5), ("hipLaunchKernel", 201, "hip_fill", S0),
        ("cuLaunchKernel", 102, "axpy", S5), ("cuLaunchKernel", 101, "reduce", S6)]
    first = launches[1]
    assert (first["ts"], first["dur"]) == (_us(2000), 0.05)
    assert first["args"] == {"kind": "launch", "ret": 0, "stream": 5, "func": "0xf1", "grid": [2, 1, 1],
                             "block": [128, 1, 1], "correlation": 1}
    assert launches[3]["args"]["entry_only"] is True and launches[3]["dur"] == 0.0
    # without device timing a kernel is a zero-length mark at its launch
    assert (kernels[4]["ts"], kernels[4]["dur"], kernels[4]["args"]["device_timing"]) == (_us(3000), 0.0, False)


def test_flows_bind_launch_to_kernel(events: list[dict]) -> None:
    s = {e["id"]: (e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "s"}
    f = {e["id"]: (e["pid"], e["tid"], e["ts"], e["bp"]) for e in events if e["ph"] == "f"}
    assert s == {1: (100, 101, _us(2000)), 2: (200, 201, _us(2200)), 3: (100, 102, _us(2500)), 4: (100, 101, _us(3000))}
    assert f == {1: (100, S5, _us(2000), "e"), 2: (200, S0, _us(2200), "e"),
                 3: (100, S5, _us(2500), "e"), 4: (100, S6, _us(3000), "e")}


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
    assert n == len(events) == 9 + 10 + 4 + 4 + 4 + 2 + 4
    tid = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    kernels = [(e["name"], e["tid"], e["ts"], e["dur"], e["args"]["correlation"], e["args"].get("cupti_correlation"))
               for e in events if e.get("cat") == "kernel"]
    assert kernels == [
        ("axpy", tid["GPU stream 0x5"], _us(2100), 0.5, 1, 1),
        ("hip_fill", tid["GPU stream 0x0"], _us(2200), 0.0, 2, None),
        ("axpy", tid["GPU stream 0x5"], _us(2700), 0.2, 3, 2),
        ("reduce", tid["GPU stream 0x6"], _us(3100), 0.8, 4, 3)]
    assert [e["args"].get("device") for e in events if e.get("cat") == "kernel"] == [0, None, 0, 0]
    ops = [(e["cat"], e["name"], e["tid"], e["ts"], e["dur"], e["args"]) for e in events
           if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    assert ops == [
        ("gpu_memcpy", "Memcpy DtoH", tid["GPU stream 0x5"], _us(4100), 0.15,
         {"bytes": 1024, "stream": 5, "stream_id": 7, "device": 0, "cupti_correlation": 4, "copy_kind": 2}),
        ("gpu_memset", "Memset", tid["GPU stream #9"], _us(4400), 0.02,
         {"bytes": 256, "stream_id": 9, "device": 0, "cupti_correlation": 5})]
    f = {e["id"]: e["ts"] for e in events if e["ph"] == "f"}
    assert f == {1: _us(2100), 2: _us(2200), 3: _us(2700), 4: _us(3100)}


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
    assert [e["name"] for e in events if e.get("cat") == "kernel"] == [odd, "hip_fill", odd, "reduce"]
