"""Cluster captures from one synthetic capture: its ranks split between two
capture directories, the second one's CLOCK_MONOTONIC moved by a known offset
(its events, names, processes, communicators and manifest clock samples), as
if recorded on another machine whose clock reads differently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl

from pasta_trace.testing import synthetic

#: CLOCK_REALTIME - CLOCK_MONOTONIC on the synthetic machine
REALTIME_MINUS_MONO = 1_764_000_000_000_000_000 - synthetic.MONO0
BRACKET_NS = 800  # width of each CLOCK_MONOTONIC bracket around CLOCK_REALTIME

SPEC = synthetic.Spec(pids=4, launches=200, allocations=8, accesses=1_000, collectives=300, span_ns=2_000_000_000,
                      page_hist=False)
_TIME = {"events": ("ts_ns",), "names": ("ts_ns",), "processes": ("start_ns",), "communicators": ("ts_ns",)}


def _sample(mono: int, shift: int, realtime_error: int) -> dict:
    """A clock sample taken at `mono` (the original clock) on a machine whose
    monotonic clock reads `shift` more and realtime clock `realtime_error` more."""
    return {"mono_before_ns": mono + shift - BRACKET_NS // 2, "realtime_ns": mono + REALTIME_MINUS_MONO + realtime_error,
            "mono_after_ns": mono + shift + BRACKET_NS // 2}


def write_part(src: Path, dst: Path, pids: list[int], *, shift: int = 0, realtime_error: int = 0,
               host: str = "synthetic") -> None:
    """dst: the capture at src restricted to `pids`, its clock moved by `shift`."""
    dst.mkdir(parents=True)
    for name, cols in _TIME.items():
        f = next(src.glob(f"{name}*.parquet"))
        pl.read_parquet(f).filter(pl.col("pid").is_in(pids)).with_columns(
            pl.col(c) + shift for c in cols).write_parquet(dst / f.name)
    shutil.copy(src / "manifest.json", dst / "manifest.json")
    m = json.loads((src / "manifest.json").read_text())
    start, end = m["clock"]["start_ns"], m["clock"]["end_ns"]
    m["host"] = host
    m["clock"] = {"domain": "CLOCK_MONOTONIC", "start_ns": start + shift, "end_ns": end + shift,
                  "start_sample": _sample(start, shift, realtime_error),
                  "end_sample": _sample(end, shift, realtime_error)}
    (dst / "manifest.json").write_text(json.dumps(m))


def whole(tmp: Path) -> Path:
    """The original capture (every rank), with clock samples like the parts'."""
    src = tmp / "whole"
    synthetic.write_capture(src, SPEC)
    m = json.loads((src / "manifest.json").read_text())
    start, end = m["clock"]["start_ns"], m["clock"]["end_ns"]
    m["clock"].update(start_sample=_sample(start, 0, 0), end_sample=_sample(end, 0, 0))
    (src / "manifest.json").write_text(json.dumps(m))
    return src


def pids(src: Path) -> list[int]:
    return pl.read_parquet(src / "processes.parquet").sort("rank")["pid"].to_list()
