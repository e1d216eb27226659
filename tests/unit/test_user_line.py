"""The user's line: a call site is the innermost frame in the user's code,
not in the standard library, site-packages/dist-packages or a frozen module;
--call-site innermost and --user-code change it everywhere (tables, flame
graphs), on a capture written with the capture's own schemas."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from pasta_trace import schema
from pasta_trace.read import open_capture
from pasta_trace.tools.call_sites import by_call_site, top_stacks
from pasta_trace.tools.flame import flames
from pasta_trace.tools.sites import set_policy, sites

SITE_PKG = "/venv/lib/python3.12/site-packages/torch/optim"
STDLIB = "/usr/lib/python3.12/functools.py"
STACK = [  # depth 0 = innermost: the optimizer's own code, reached through the stdlib, from train.py:63
    ("_single_tensor_adam", f"{SITE_PKG}/adam.py", 544),
    ("wrapper", STDLIB, 40),
    ("Adam.step", f"{SITE_PKG}/optimizer.py", 391),
    ("<module>", "/home/u/train.py", 63),
    ("<module>", "<frozen runpy>", 88),
]
ALL_LIB = [("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241)]


def _capture(d: Path) -> Path:
    d.mkdir()
    ev = pl.DataFrame({
        "ts_ns": [100, 200, 300], "pid": [7] * 3, "tid": [7] * 3, "api": ["cuMemAlloc_v2"] * 3,
        "kind": ["alloc"] * 3, "ret": [0] * 3, "ptr": [0x1000, 0x2000, 0x3000], "size": [64, 32, 8],
        "stack_id": [1, 1, 2],
    }).with_columns([pl.lit(None, dt).alias(c) for c, dt in schema.EVENTS_SCHEMA.items()
                     if c not in ("ts_ns", "pid", "tid", "api", "kind", "ret", "ptr", "size", "stack_id")])
    ev.select([pl.col(c).cast(dt) for c, dt in schema.EVENTS_SCHEMA.items()]).write_parquet(d / "events-00000.parquet")
    rows = [(1, i, *f) for i, f in enumerate(STACK)] + [(2, i, *f) for i, f in enumerate(ALL_LIB)]
    pl.DataFrame({"pid": [7] * len(rows), "stack_id": [r[0] for r in rows], "depth": [r[1] for r in rows],
                  "kind": ["python"] * len(rows), "function": [r[2] for r in rows], "file": [r[3] for r in rows],
                  "line": [r[4] for r in rows], "module": [None] * len(rows), "addr": list(range(len(rows))),
                  "truncated": [False] * len(rows)}, schema=schema.STACKS_SCHEMA).write_parquet(d / "stacks.parquet")
    (d / "manifest.json").write_text(json.dumps({"format_version": "1.1", "complete": True}))
    return d


def _sites(cap) -> dict[int, str]:
    return dict(sites(cap).select("stack_id", "call_site").collect().iter_rows())


def test_the_users_line_by_default_the_innermost_on_request(tmp_path: Path) -> None:
    cap = open_capture(_capture(tmp_path / "cap"))
    # a stack with no frame of the user's keeps its innermost one
    assert _sites(cap) == {1: "/home/u/train.py:63 <module>",
                           2: "<frozen importlib._bootstrap>:241 _call_with_frames_removed"}
    assert by_call_site(cap).select("call_site", "allocations", "device_alloc_bytes").rows() == [
        ("/home/u/train.py:63 <module>", 2, 96), ("<frozen importlib._bootstrap>:241 _call_with_frames_removed", 1, 8)]
    set_policy(cap, "innermost")
    assert _sites(cap)[1] == f"{SITE_PKG}/adam.py:544 _single_tensor_adam"
    # the user says the optimizer is theirs: only frames under the paths given are
    set_policy(cap, "user", [SITE_PKG])
    assert _sites(cap)[1] == f"{SITE_PKG}/adam.py:544 _single_tensor_adam"
    set_policy(cap, "user", ["/home/u/train.py"])
    assert _sites(cap)[1] == "/home/u/train.py:63 <module>"


def test_flame_graphs_fold_down_to_the_call_site(tmp_path: Path) -> None:
    cap = open_capture(_capture(tmp_path / "cap"))
    alloc = next(f for f in flames(cap) if f.name == "allocated")
    assert alloc.nodes.select("level", "label", "width").rows() == [
        (0, "all", 104), (1, "pid 7", 104),
        (2, "<module> (<frozen runpy>:88)", 96),
        (2, "_call_with_frames_removed (<frozen importlib._bootstrap>:241)", 8),
        (3, "<module> (/home/u/train.py:63)", 96)]
    set_policy(cap, "innermost")
    alloc = next(f for f in flames(cap) if f.name == "allocated")
    assert alloc.nodes["level"].max() == 6
    assert alloc.nodes.filter(pl.col("level") == 6)["label"].to_list() == [
        f"_single_tensor_adam ({SITE_PKG}/adam.py:544)"]


def test_stacks_rank_by_bytes_and_mark_the_call_site(tmp_path: Path) -> None:
    cap = open_capture(_capture(tmp_path / "cap"))
    top = top_stacks(cap, 5, "bytes")
    assert top.select("rank", "stack_id", "weight", "depth", "site").rows()[:6] == [
        (0, 1, 96, 0, False), (0, 1, 96, 1, False), (0, 1, 96, 2, False), (0, 1, 96, 3, True),
        (0, 1, 96, 4, False), (1, 2, 8, 0, True)]
    assert top_stacks(cap, 5, "time").height == 0
