"""Every analysis grouped by call site, and the top call site of each row of
the summary tables, on a small capture with Python stacks written with the
capture's own schemas.  Every expected number is derived by hand below.

pid 7, one thread; times are ns.  Stacks (innermost frame -> call site):
  FWD  model.py:40 Model.forward    BWD  model.py:55 Model.backward
  LOAD data.py:30 load_batch        SAVE data.py:44 save_output
  STEP train.py:70 step             BUF  data.py:12 make_buffer
  PIN  data.py:20 pin_buffer        and None: a call without a stack
The capture spans 100 .. 1420 (the 1000 ns sync at 420 ends last): 1320 ns."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.cli import main
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY

FWD, BWD, LOAD, SAVE, STEP, BUF, PIN = range(1, 8)
SITE = {FWD: ("model.py", 40, "Model.forward"), BWD: ("model.py", 55, "Model.backward"),
        LOAD: ("data.py", 30, "load_batch"), SAVE: ("data.py", 44, "save_output"),
        STEP: ("train.py", 70, "step"), BUF: ("data.py", 12, "make_buffer"), PIN: ("data.py", 20, "pin_buffer")}
S = {k: f"{f}:{line} {fn}" for k, (f, line, fn) in SITE.items()}
NONE = "(no stack)"
SPAN = 1320

ROWS = [  # ts, api, kind, dur, payload, stack
    (100, "cuMemAlloc_v2", "alloc", 5, {"ptr": 0x1000, "size": 64}, BUF),
    (110, "cuMemAlloc_v2", "alloc", 5, {"ptr": 0x2000, "size": 32}, BUF),
    (120, "cuMemAlloc_v2", "alloc", 5, {"ptr": 0x3000, "size": 500}, None),
    (130, "cuMemAllocHost_v2", "alloc", 5, {"ptr": 0x9000, "size": 16}, PIN),
    (200, "cuLaunchKernel", "launch", None, {"func": 0xF1, "stream": 5}, FWD),
    (210, "cuLaunchKernel", "launch", None, {"func": 0xF1, "stream": 5}, FWD),
    (220, "cuLaunchKernel", "launch", None, {"func": 0xF1, "stream": 5}, BWD),
    (230, "cuLaunchKernel", "launch", None, {"func": 0xF2, "stream": 5}, BWD),
    (240, "cuLaunchKernel", "launch", None, {"func": 0xF2, "stream": 5}, None),
    (300, "cuMemcpyHtoD_v2", "memcpy", 10, {"src": 0x9000, "dst": 0x1000, "size": 16, "copy_kind": "h2d"}, LOAD),
    (310, "cuMemcpyHtoD_v2", "memcpy", 10, {"src": 0x9000, "dst": 0x1000, "size": 16, "copy_kind": "h2d"}, LOAD),
    (320, "cuMemcpyHtoD_v2", "memcpy", 10, {"src": 0x9000, "dst": 0x1000, "size": 16, "copy_kind": "h2d"}, SAVE),
    (330, "cuMemcpyDtoH_v2", "memcpy", 20, {"src": 0x1000, "dst": 0x9100, "size": 64, "copy_kind": "d2h"}, SAVE),
    (340, "cuMemcpyDtoH_v2", "memcpy", 20, {"src": 0x1000, "dst": 0x9100, "size": 64, "copy_kind": "d2h"}, None),
    (400, "cuStreamSynchronize", "sync", 100, {"stream": 5}, STEP),
    (410, "cuStreamSynchronize", "sync", 300, {"stream": 5}, STEP),
    (420, "cuStreamSynchronize", "sync", 1000, {"stream": 5}, None),
    (430, "cuCtxSynchronize", "sync", 50, {}, STEP),
    (500, "cuMemFree_v2", "free", 5, {"ptr": 0x3000}, None),
    (510, "cuMemFree_v2", "free", 5, {"ptr": 0x2000}, BUF),
]


def write(d: Path) -> Path:
    d.mkdir()
    cols: dict[str, list] = {c: [] for c in schema.EVENTS_SCHEMA}
    for ts, api, kind, dur, payload, stack in ROWS:
        row = dict.fromkeys(schema.EVENTS_SCHEMA)
        row.update(ts_ns=ts, dur_ns=dur, pid=7, tid=7, comm="train", api=api, kind=kind, ret=0, stack_id=stack,
                   **payload)
        for c in cols:
            cols[c].append(row[c])
    pl.DataFrame(cols, schema=schema.EVENTS_SCHEMA).write_parquet(d / "events-00000.parquet")
    frames = [(sid, 0, fn, f, line) for sid, (f, line, fn) in SITE.items()] + [
        (sid, 1, "main", "train.py", 100) for sid in SITE]
    pl.DataFrame({"pid": [7] * len(frames), "stack_id": [f[0] for f in frames], "depth": [f[1] for f in frames],
                  "kind": ["python"] * len(frames), "function": [f[2] for f in frames],
                  "file": [f[3] for f in frames], "line": [f[4] for f in frames], "module": [None] * len(frames),
                  "addr": list(range(len(frames))), "truncated": [False] * len(frames)},
                 schema=schema.STACKS_SCHEMA).write_parquet(d / "stacks.parquet")
    pl.DataFrame({"pid": [7, 7], "handle": [0xF1, 0xF2], "name": ["fwd_kernel", "bwd_kernel"],
                  "source": ["module_get_function"] * 2, "ts_ns": [0, 0], "api": ["cuModuleGetFunction"] * 2,
                  "reason": [None, None]}, schema=schema.NAMES_SCHEMA).write_parquet(d / "names.parquet")
    (d / "manifest.json").write_text(json.dumps({"format_version": "1.1", "complete": True}))
    return d


@pytest.fixture
def cap(tmp_path: Path):
    return open_capture(write(tmp_path / "cap"))


def rows(name: str, cap, *cols: str) -> list[tuple]:
    return REGISTRY[name].compute(cap).select(cols).rows()


def test_sync(cap) -> None:
    # stream 5: 100 + 300 (STEP) + 1000 (no stack): STEP is the line blocked longest among those with a stack
    assert rows("sync", cap, "api", "stream", "calls", "blocked_ns", "share", "top_call_site") == [
        ("cuStreamSynchronize", 5, 3, 1400, 1400 / SPAN, S[STEP]),
        ("cuCtxSynchronize", None, 1, 50, 50 / SPAN, S[STEP])]
    assert rows("sync_call_sites", cap, "call_site", "api", "calls", "blocked_ns", "max_blocked_ns", "share") == [
        (NONE, "cuStreamSynchronize", 1, 1000, 1000, 1000 / SPAN),
        (S[STEP], "cuStreamSynchronize", 2, 400, 300, 400 / SPAN),
        (S[STEP], "cuCtxSynchronize", 1, 50, 50, 50 / SPAN)]


def test_kernels(cap) -> None:
    # fwd_kernel: FWD twice, BWD once; bwd_kernel: BWD once and once without a stack
    assert rows("kernels", cap, "name", "launches", "top_call_site") == [
        ("fwd_kernel", 3, S[FWD]), ("bwd_kernel", 2, S[BWD])]
    assert rows("kernel_call_sites", cap, "call_site", "name", "launches", "first_ts_ns", "last_ts_ns") == [
        (S[FWD], "fwd_kernel", 2, 200, 210), (NONE, "bwd_kernel", 1, 240, 240),
        (S[BWD], "bwd_kernel", 1, 230, 230), (S[BWD], "fwd_kernel", 1, 220, 220)]


def test_transfers(cap) -> None:
    # d2h: 64 B from SAVE, 64 B without a stack; h2d: 32 B from LOAD, 16 B from SAVE
    assert rows("transfers", cap, "direction", "copies", "bytes", "top_call_site") == [
        ("d2h", 2, 128, S[SAVE]), ("h2d", 3, 48, S[LOAD])]
    assert rows("transfer_call_sites", cap, "call_site", "direction", "copies", "bytes", "api_ns") == [
        (NONE, "d2h", 1, 64, 20), (S[SAVE], "d2h", 1, 64, 20), (S[LOAD], "h2d", 2, 32, 20),
        (S[SAVE], "h2d", 1, 16, 10)]


def test_repeated_copies(cap) -> None:
    # host 0x9100 read back twice (d2h, 64 B); host 0x9000 sent three times (h2d, 16 B), twice by LOAD
    assert rows("repeated_copies", cap, "direction", "host_addr", "copies", "repeated_bytes", "top_call_site") == [
        ("d2h", 0x9100, 2, 64, S[SAVE]), ("h2d", 0x9000, 3, 32, S[LOAD])]
    # the repeats: 340 (d2h, no stack), 310 (h2d, LOAD), 320 (h2d, SAVE); the first copy of a range is none
    assert rows("repeated_copy_call_sites", cap, "call_site", "direction", "repeats", "repeated_bytes", "ranges",
                "api_ns") == [
        (NONE, "d2h", 1, 64, 1, 20), (S[LOAD], "h2d", 1, 16, 1, 10), (S[SAVE], "h2d", 1, 16, 1, 10)]


def test_memory_at_the_peak(cap) -> None:
    # device bytes: 64, 96, then 596 at 120 (the peak: 64 + 32 from BUF, 500 without a stack), 96, 64
    assert rows("memory_peaks", cap, "api", "peak_bytes", "peak_ts_ns", "top_call_site") == [
        ("all", 596, 120, S[BUF]), ("cuMemAlloc_v2", 596, 120, S[BUF])]
    assert rows("peak_call_sites", cap, "call_site", "live_bytes", "allocations", "peak_ts_ns") == [
        (NONE, 500, 1, 120), (S[BUF], 96, 2, 120)]


def test_leaks(cap) -> None:
    # never freed: 0x1000 (64 B, BUF) and the pinned host buffer 0x9000 (16 B, PIN)
    assert rows("leaks", cap, "base", "size", "kind", "call_site") == [
        (0x1000, 64, "device", S[BUF]), (0x9000, 16, "host", S[PIN])]
    assert rows("leak_call_sites", cap, "call_site", "leaked_bytes", "allocations") == [(S[BUF], 64, 1), (S[PIN], 16, 1)]


def test_report_json_has_the_top_call_site_of_each_table(tmp_path: Path, capsys) -> None:
    cap = write(tmp_path / "cap")
    assert main(["report", str(cap), "--json"]) == 0
    tools = json.loads(capsys.readouterr().out)["tools"]
    top = {name: [r.get("top_call_site", r.get("call_site")) for r in tools[name]["rows"]]
           for name in ("sync", "kernels", "transfers", "repeated_copies", "memory_peaks", "leaks")}
    assert top == {"sync": [S[STEP], S[STEP]], "kernels": [S[FWD], S[BWD]], "transfers": [S[SAVE], S[LOAD]],
                   "repeated_copies": [S[SAVE], S[LOAD]], "memory_peaks": [S[BUF], S[BUF]], "leaks": [S[BUF], S[PIN]]}
    assert [r["call_site"] for r in tools["sync_call_sites"]["rows"]] == [NONE, S[STEP], S[STEP]]


def test_report_terminal_shows_the_top_call_site_of_each_table(tmp_path: Path, capsys,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    cap = write(tmp_path / "cap")
    assert main(["report", str(cap), "--tool", "kernels", "--tool", "transfers", "--tool", "sync"]) == 0
    out = capsys.readouterr().out
    tables = {t: out[out.index(t):] for t in ("Kernel summary", "Transfers by direction", "Synchronisation")}
    header = {t: next(ln for ln in text.splitlines() if "pid" in ln) for t, text in tables.items()}
    assert all("top call site" in h for h in header.values()), header
    # the first row is the line under the header's rule; the top call site is its last cell
    first_row = {t: text.splitlines()[next(i for i, ln in enumerate(text.splitlines()) if ln.startswith("─")) + 1]
                 for t, text in tables.items()}
    assert {t: ln.split("  ")[-1].strip() for t, ln in first_row.items()} == {
        "Kernel summary": S[FWD], "Transfers by direction": S[SAVE], "Synchronisation": S[STEP]}


def test_a_merged_timeline_keeps_the_stacks(tmp_path: Path, capsys) -> None:
    cap = write(tmp_path / "cap")
    assert main(["merge", str(cap), "-o", str(tmp_path / "tl")]) == 0
    capsys.readouterr()
    from pasta_trace import merge

    timeline = merge.load(tmp_path / "tl")
    for name in ("call_sites", "sync", "kernel_call_sites", "memory_peaks", "leaks"):
        assert REGISTRY[name].compute(timeline).equals(REGISTRY[name].compute(open_capture(cap))), name
