"""Call-site analyses on a small capture written with the capture's own
schemas: exact sums per Python line, the memory held at the peak and the
leaks by the line that allocated them."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from pasta_trace import schema
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from pasta_trace.tools.call_sites import NO_STACK, by_call_site
from pasta_trace.tools.memory import leaks_by_call_site, peak_by_call_site

SYNC, ALLOC = 11, 22  # stack ids
SITE_SYNC, SITE_ALLOC = "train.py:40 Model.step", "train.py:12 make_buffer"


def _capture(d: Path) -> Path:
    d.mkdir()
    rows = [  # ts, api, kind, dur, ptr, size, stack_id
        (100, "cuMemAlloc_v2", "alloc", 5, 0x1000, 64, ALLOC),
        (200, "cuMemAlloc_v2", "alloc", 5, 0x2000, 32, ALLOC),
        (300, "cuCtxSynchronize", "sync", 100, None, None, SYNC),
        (400, "cuCtxSynchronize", "sync", 300, None, None, SYNC),
        (500, "cuMemFree_v2", "free", None, 0x2000, None, None),
        (600, "cuLaunchKernel", "launch", None, None, None, None),
    ]
    ev = pl.DataFrame(
        {"ts_ns": [r[0] for r in rows], "api": [r[1] for r in rows], "kind": [r[2] for r in rows],
         "dur_ns": [r[3] for r in rows], "ptr": [r[4] for r in rows], "size": [r[5] for r in rows],
         "stack_id": [r[6] for r in rows], "pid": [7] * len(rows), "tid": [7] * len(rows), "ret": [0] * len(rows)},
    ).with_columns([pl.lit(None, dt).alias(c) for c, dt in schema.EVENTS_SCHEMA.items()
                    if c not in ("ts_ns", "api", "kind", "dur_ns", "ptr", "size", "stack_id", "pid", "tid", "ret")]
                   ).with_columns(func=pl.when(pl.col("kind") == "launch").then(pl.lit(0x77, pl.UInt64)))
    ev.select([pl.col(c).cast(dt) for c, dt in schema.EVENTS_SCHEMA.items()]).write_parquet(d / "events-00000.parquet")
    frames = [  # stack, depth, function, file, line
        (SYNC, 0, "Model.step", "train.py", 40), (SYNC, 1, "main", "train.py", 90),
        (ALLOC, 0, "make_buffer", "train.py", 12), (ALLOC, 1, "main", "train.py", 80),
    ]
    pl.DataFrame({"pid": [7] * 4, "stack_id": [f[0] for f in frames], "depth": [f[1] for f in frames],
                  "kind": ["python"] * 4, "function": [f[2] for f in frames], "file": [f[3] for f in frames],
                  "line": [f[4] for f in frames], "module": [None] * 4, "addr": [1, 2, 3, 4],
                  "truncated": [False] * 4}, schema=schema.STACKS_SCHEMA).write_parquet(d / "stacks.parquet")
    (d / "manifest.json").write_text(json.dumps({"format_version": "1.1", "complete": True}))
    return d


def test_calls_bytes_and_blocked_time_per_line(tmp_path: Path) -> None:
    got = by_call_site(open_capture(_capture(tmp_path / "cap")))
    # allocations and frees apart from the other calls
    assert got.select("call_site", "allocations", "frees", "calls", "launches", "device_alloc_bytes",
                      "pinned_alloc_bytes", "tensor_alloc_bytes", "syncs", "blocked_ns").rows() == [
        (SITE_SYNC, 0, 0, 2, 0, 0, 0, 0, 2, 400),
        (SITE_ALLOC, 2, 0, 0, 0, 96, 0, 0, 0, None),
        (NO_STACK, 0, 1, 1, 1, 0, 0, 0, 0, None),
    ]


def test_peak_and_leaks_by_allocating_line(tmp_path: Path) -> None:
    cap = open_capture(_capture(tmp_path / "cap"))
    # the peak (96 bytes) is at ts 200: both blocks of make_buffer are live
    assert peak_by_call_site(cap).select("call_site", "live_bytes", "allocations", "peak_ts_ns").rows() == [
        (SITE_ALLOC, 96, 2, 200)]
    assert leaks_by_call_site(cap).select("call_site", "leaked_bytes", "allocations").rows() == [(SITE_ALLOC, 64, 1)]


def test_registered_for_every_report() -> None:
    assert {"call_sites", "peak_call_sites", "leak_call_sites"} <= set(REGISTRY)


def test_report_stacks_prints_the_top_stacks_in_full(tmp_path: Path, capsys) -> None:
    from pasta_trace.cli import main

    cap = _capture(tmp_path / "cap")
    assert main(["report", str(cap), "--stacks", "--limit", "2", "--tool", "call_sites"]) == 0
    out = capsys.readouterr().out
    tail = out[out.index("Top 2 caller stacks"):].rstrip("\n").splitlines()
    assert tail == [
        "Top 2 caller stacks by bytes allocated (> the call site)",
        "#1  PID 7  cuMemAlloc_v2: 2 calls, 96 B allocated",
        "  > make_buffer  train.py:12",
        "    main  train.py:80",
        "",
        "Top 2 caller stacks by time blocked in syncs (> the call site)",
        "#1  PID 7  cuCtxSynchronize: 2 calls, 0.4 µs blocked",
        "  > Model.step  train.py:40",
        "    main  train.py:90",
    ]
