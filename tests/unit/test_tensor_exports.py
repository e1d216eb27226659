"""Tensor memory everywhere, on the hand-written capture of test_tools_tensors
(a CUDA caching allocator with its totals, CPU tensors seen twice and counted
once): the Chrome export's "[memory]" events in PyTorch profiler's form, the
Perfetto counter track per device read back from the protobuf, the flame
graphs weighed by tensors, the record summary's tensor lines, and what a
tensor freed only at interpreter exit counts as."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from test_export_model import T0 as MODEL_T0
from test_export_perfetto import Parsed
from test_tools_tensors import LOG, SITES, T0, K, M, MB, _capture

from pasta_trace.capture.session.summary import tensor_lines
from pasta_trace.export import chrome, perfetto, trace_model
from pasta_trace.read import open_capture
from pasta_trace.tools import tensors as T
from pasta_trace.tools.findings import key_findings
from pasta_trace.tools.flame import flames
from pasta_trace.tools.run import run_tools

# (t, Bytes, Total Allocated, Total Reserved, Addr) per device, from the capture's rows by hand
CUDA = [(100, M, MB(5), MB(20), 0xA1), (200, M, MB(6), MB(20), 0xA2),
        (500, -512 * K, MB(5.5), MB(20), 0xDEAD),  # a block from before the capture: its own bytes, signed
        (1000, 2 * M, MB(7.5), MB(22), 0xB1), (2000, -2 * M, MB(5.5), MB(22), 0xB1),
        (3000, 2 * M, MB(7.5), MB(22), 0xB1), (4000, -2 * M, MB(5.5), MB(22), 0xB1),
        (6000, 256 * K, MB(5.75), MB(22), 0xC1), (7000, 256 * K, MB(6), MB(22), 0xC2),
        (8000, 256 * K, MB(6.25), MB(22), 0xC3)]
CPU = [(300, 100, 100, 0, 0x50), (900, -100, 0, 0, 0x50)]  # New/Delete: no totals given, the tensors seen live


@pytest.fixture
def cap(tmp_path: Path):
    return open_capture(_capture(tmp_path / "cap"))


def test_chrome_memory_events_in_pytorch_profiler_form(cap, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    chrome.write_file(trace_model.build(cap), out)
    events = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    assert {(e["ph"], e["cat"], e["s"], e["pid"], e["tid"]) for e in events} == {("i", "cpu_instant_event", "t", 7, 8)}
    got = [(round(e["ts"] * 1000) - T0, e["args"]) for e in events]
    want = [(t, {"Total Reserved": r, "Total Allocated": a, "Bytes": b, "Device Id": 0, "Device Type": 1, "Addr": p})
            for t, b, a, r, p in CUDA]
    want += [(t, {"Total Reserved": r, "Total Allocated": a, "Bytes": b, "Device Id": -1, "Device Type": 0, "Addr": p})
             for t, b, a, r, p in CPU]
    assert sorted(got, key=lambda x: (x[1]["Device Type"], x[0])) == sorted(
        want, key=lambda x: (x[1]["Device Type"], x[0]))


def test_perfetto_counter_track_per_device(cap, tmp_path: Path) -> None:
    out = tmp_path / "t.pftrace"
    perfetto.write_file(trace_model.build(cap), out)
    counters = Parsed(out.read_bytes()).counters
    off = T0 - MODEL_T0
    assert counters["7: tensor memory (cuda:0)"] == [(t + off, a) for t, _, a, _, _ in CUDA]
    assert counters["7: tensor memory (cpu)"] == [(t + off, a) for t, _, a, _, _ in CPU]
    assert counters["7: GPU memory"] == [(50 + off, 20 * M)]  # the driver's segment, its own track


def test_flame_graphs_weigh_tensors_by_line(cap) -> None:
    by = {f.name: f for f in flames(cap)}
    # bytes allocated: every tensor of the capture, one source per device (the CPU tensor once)
    assert by["allocated"].total == 2 * M + 2 * 2 * M + 3 * 256 * K + 100
    leaves = dict(by["allocated"].nodes.filter(pl.col("level") == 2).select("label", "width").iter_rows())
    assert leaves == {"Linear.__init__ (model.py:10)": 2 * M, "step (train.py:30)": 4 * M + 100,
                      "log (train.py:44)": 3 * 256 * K}
    # live at cuda:0's peak (7.5 MiB at t=1000: the weights and the step's block) and at the CPU's (its tensor)
    peak = dict(by["peak"].nodes.filter(pl.col("level") == 2).select("label", "width").iter_rows())
    assert peak == {"Linear.__init__ (model.py:10)": 2 * M, "step (train.py:30)": 2 * M + 100}


def test_summary_and_findings_count_a_tensor_freed_at_exit_as_left(tmp_path: Path) -> None:
    d = _capture(tmp_path / "cap")
    # the interpreter's finalization frees 0xC3 (LOG's third tensor) at t=9000
    ev = pl.read_parquet(d / "events-00000.parquet")
    row = ev.filter(pl.col("ptr") == 0xC3).with_columns(
        ts_ns=pl.lit(T0 + 9000, pl.Int64), kind=pl.lit("tensor_free").cast(ev.schema["kind"]),
        allocated_bytes=pl.lit(MB(6), pl.UInt64), at_exit=pl.lit(True))
    ev = pl.concat([ev.with_columns(at_exit=pl.when(pl.col("kind").cast(pl.String).str.starts_with("tensor"))
                                    .then(pl.lit(False))), row]).sort("ts_ns")
    ev.write_parquet(d / "events-00000.parquet")
    cap = open_capture(d)
    left = T.tensors_never_freed(cap)
    weights = SITES[1]
    assert left.select("ptr", "size", "call_site", "freed_at_exit").rows() == [
        (0xA1, M, weights, False), (0xA2, M, weights, False),
        (0xC1, 256 * K, SITES[LOG], False), (0xC2, 256 * K, SITES[LOG], False), (0xC3, 256 * K, SITES[LOG], True)]
    assert T.tensor_leaks(cap).select("call_site", "live_bytes", "live_tensors").rows() == [(SITES[LOG], 768 * K, 3)]
    assert tensor_lines(pl.scan_parquet(d / "events-00000.parquet"), d) == [
        "tensor memory on cpu: allocated 100 B in 1 tensor, peak 100 B, held at the end 0 B",
        "tensor memory on cuda:0: allocated 6.8 MiB in 7 tensors, peak 7.5 MiB, held at the end 6.0 MiB",
        f"  freed only at exit: 256.0 KiB in 1 tensor (left by the program: pasta-trace report {d} --tool "
        "tensors_never_freed)",
    ]
    found = {f.topic: f.line() for f in key_findings(run_tools(cap), None)}
    assert found["tensor leaks"] == (f"5 tensors never freed (1 freed only at exit), 2.8 MiB; most from "
                                     f"{weights} (2.0 MiB)")
    assert found["leaks"] == "1 allocation never freed, 20.0 MiB"  # the allocator's segment, at the driver


def test_hta_loads_the_export_and_the_export_says_what_it_cannot_break_down(cap, tmp_path: Path,
                                                                                    capsys) -> None:
    from pasta_trace.cli import main

    d = tmp_path / "hta"
    d.mkdir()
    assert main(["export", str(cap.path), "--format", "chrome", "-o", str(d / "rank0.json")]) == 0
    assert ("note: host only (no GPU kernel with device timing): HolisticTraceAnalysis loads it but has no kernel or "
            "temporal breakdown to give; record with --device cupti for one") in capsys.readouterr().err
    trace_analysis = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ta = trace_analysis.TraceAnalysis(trace_dir=str(d))
    # HTA's parser keeps the events with a duration (it drops the "[memory]" instants of PyTorch's own
    # traces the same way): the driver's allocation call is there
    df = ta.t.get_trace(0)
    names = ta.t.symbol_table.get_sym_table()
    assert "[memory]" not in names
    assert len(df[df["name"] == names.index("cuMemAlloc_v2")]) == 1
