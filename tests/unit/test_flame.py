"""Flame graphs: stacks folded outermost frame first under one frame per
process, with exact offsets and widths, for time blocked in syncs, bytes
allocated and bytes live at the peak; and their SVG."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from pasta_trace import schema
from pasta_trace.reporters.html.flame import flame_svg
from pasta_trace.read import open_capture
from pasta_trace.tools.flame import flames
from test_tools_capture import T0, write_device_capture

#: stack id -> (pid, frames innermost first: function, file, line)
STACKS = {
    1: (100, [("alloc_weights", "model.py", 10), ("Model.__init__", "model.py", 5), ("main", "train.py", 3)]),
    2: (100, [("pin", "io.py", 7), ("main", "train.py", 4)]),
    3: (100, [("Model.grow", "model.py", 20), ("Model.step", "model.py", 30), ("main", "train.py", 9)]),
    4: (100, [("Model.step", "model.py", 31), ("main", "train.py", 9)]),
    5: (100, [("main", "train.py", 12)]),
}
#: (pid, event time after T0) -> stack id; pid 200's calls have none
CALLERS = {(100, 1000): 1, (100, 2000): 1, (100, 3000): 2, (100, 14000): 3, (100, 8000): 4, (100, 13000): 5}


def write_stacked_capture(path: Path) -> Path:
    """The device capture of test_tools_capture, with Python stacks on pid 100's
    allocations and syncs."""
    write_device_capture(path)
    ev = pl.read_parquet(path / "events-000.parquet")
    key = pl.DataFrame({"pid": [k[0] for k in CALLERS], "ts_ns": [T0 + k[1] for k in CALLERS],
                        "sid": list(CALLERS.values())}, schema={"pid": pl.UInt32, "ts_ns": pl.Int64, "sid": pl.UInt64})
    ev = ev.join(key, on=["pid", "ts_ns"], how="left").with_columns(pl.col("sid").alias("stack_id")).drop("sid")
    ev.select(list(schema.EVENTS_SCHEMA)).write_parquet(path / "events-000.parquet")
    rows = [(pid, sid, depth, *frame) for sid, (pid, frames) in STACKS.items() for depth, frame in enumerate(frames)]
    pl.DataFrame({
        "pid": [r[0] for r in rows], "stack_id": [r[1] for r in rows], "depth": [r[2] for r in rows],
        "kind": ["python"] * len(rows), "function": [r[3] for r in rows], "file": [r[4] for r in rows],
        "line": [r[5] for r in rows], "module": [None] * len(rows), "addr": [0] * len(rows),
        "truncated": [False] * len(rows),
    }, schema=schema.STACKS_SCHEMA).write_parquet(path / "stacks.parquet")
    return path


def test_stacks_fold_into_exact_nodes(tmp_path: Path) -> None:
    got = {f.name: f for f in flames(open_capture(write_stacked_capture(tmp_path / "cap")))}
    rows = lambda name: got[name].nodes.sort("level", "x0").select("level", "x0", "width", "label").rows()  # noqa: E731
    # syncs: pid 100 blocked 2000 ns in Model.step (via main:9) and 1000 ns in main:12; pid 200 500 ns, no stack
    assert (got["sync"].total, rows("sync")) == (3500, [
        (0, 0, 3500, "all"),
        (1, 0, 3000, "pid 100"),
        (1, 3000, 500, "pid 200"),
        (2, 0, 1000, "main (train.py:12)"),
        (2, 1000, 2000, "main (train.py:9)"),
        (2, 3000, 500, "(no stack)"),
        (3, 1000, 2000, "Model.step (model.py:31)"),
    ])
    # bytes allocated: 4096 + 0x4800 by alloc_weights, 1024 pinned by pin, 16384 by Model.grow; pid 200 3072
    assert (got["allocated"].total, rows("allocated")) == (43008, [
        (0, 0, 43008, "all"),
        (1, 0, 39936, "pid 100"),
        (1, 39936, 3072, "pid 200"),
        (2, 0, 22528, "main (train.py:3)"),
        (2, 22528, 1024, "main (train.py:4)"),
        (2, 23552, 16384, "main (train.py:9)"),
        (2, 39936, 3072, "(no stack)"),
        (3, 0, 22528, "Model.__init__ (model.py:5)"),
        (3, 22528, 1024, "pin (io.py:7)"),
        (3, 23552, 16384, "Model.step (model.py:30)"),
        (4, 0, 22528, "alloc_weights (model.py:10)"),
        (4, 23552, 16384, "Model.grow (model.py:20)"),
    ])
    # live at pid 100's peak (ts 14000): the managed 0x4800 and the 16384 block; pid 200's (ts 1500): 2048
    assert (got["peak"].total, rows("peak")) == (36864, [
        (0, 0, 36864, "all"),
        (1, 0, 34816, "pid 100"),
        (1, 34816, 2048, "pid 200"),
        (2, 0, 18432, "main (train.py:3)"),
        (2, 18432, 16384, "main (train.py:9)"),
        (2, 34816, 2048, "(no stack)"),
        (3, 0, 18432, "Model.__init__ (model.py:5)"),
        (3, 18432, 16384, "Model.step (model.py:30)"),
        (4, 0, 18432, "alloc_weights (model.py:10)"),
        (4, 18432, 16384, "Model.grow (model.py:20)"),
    ])


def test_flame_svg_has_one_rect_per_node_with_its_title(tmp_path: Path) -> None:
    sync = next(f for f in flames(open_capture(write_stacked_capture(tmp_path / "cap"))) if f.name == "sync")
    rects = re.findall(r'<rect class="fr" x="([\d.]+)%" y="(\d+)" width="([\d.]+)%" height="17" fill="#[0-9a-f]{6}">'
                       r"<title>([^<]*)</title>", flame_svg(sync))
    # x and width in percent of the whole, one row of 18 px per level, the root on top; the title reads
    # function (file:line), then the weight and its share
    assert sorted(rects, key=lambda r: (int(r[1]), float(r[0]))) == [
        ("0.0", "0", "100.0", "all · 3.5 µs (100.0%)"),
        ("0.0", "18", "85.7143", "pid 100 · 3.0 µs (85.7%)"),
        ("85.7143", "18", "14.2857", "pid 200 · 0.5 µs (14.3%)"),
        ("0.0", "36", "28.5714", "main (train.py:12) · 1.0 µs (28.6%)"),
        ("28.5714", "36", "57.1429", "main (train.py:9) · 2.0 µs (57.1%)"),
        ("85.7143", "36", "14.2857", "(no stack) · 0.5 µs (14.3%)"),
        ("28.5714", "54", "57.1429", "Model.step (model.py:31) · 2.0 µs (57.1%)"),
    ]
