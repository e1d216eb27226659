"""Every registered tool returns exactly the frame it declares (column names,
order and dtypes, `tools.registry.tool`), on captures of every shape:
synthetic with device data, Python stacks, syncs and copies; host only; no
calls at all; --aggregate.  The declaration is also the tool function's
"Columns:" docstring and is listed in docs/tools.md."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.testing import synthetic
from pasta_trace.read import Capture, open_capture
from pasta_trace.tools import REGISTRY
from pasta_trace.tools.registry import UNITS
from test_export_model import write_capture

ROOT = Path(__file__).resolve().parents[2]
SPEC = synthetic.Spec(pids=2, launches=200, allocations=40, accesses=4000, syncs=30, failed_allocs=4, copies=60,
                      stacks=True, tensors=300, collectives=12)


def _aggregate(src: Path, dst: Path) -> Path:
    """`src` as an --aggregate capture: its calls counted per (pid, API, kernel, shape, return code)."""
    synthetic.write_capture(dst, SPEC)
    ev = pl.read_parquet(src / "events-00000.parquet")
    keys = [c for c in schema.AGGREGATE_SCHEMA if c in ev.columns and c != "count"]  # events have a `count` too (NCCL)
    agg = ev.group_by(keys).agg(pl.len().alias("count"), pl.col("size").sum().alias("bytes"),
                                pl.col("ts_ns").min().alias("first_ts_ns"), pl.col("ts_ns").max().alias("last_ts_ns"))
    agg.select([pl.col(c).cast(t) for c, t in schema.AGGREGATE_SCHEMA.items()]).write_parquet(dst / "aggregate.parquet")
    ev.clear().write_parquet(dst / "events-00000.parquet")
    return dst


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Capture]:
    d = tmp_path_factory.mktemp("shapes")
    synthetic.write_capture(d / "synthetic", SPEC)
    paths = {
        "synthetic": d / "synthetic",
        "host": write_capture(d / "host"),
        "empty": write_capture(d / "empty", []),
        "aggregate": _aggregate(d / "synthetic", d / "aggregate"),
    }
    caps = {name: open_capture(p) for name, p in paths.items()}
    assert caps["aggregate"].aggregate is not None
    return caps


@pytest.mark.parametrize("name", list(REGISTRY))
@pytest.mark.parametrize("shape", ["synthetic", "host", "empty", "aggregate"])
def test_compute_returns_the_declared_schema(captures: dict[str, Capture], name: str, shape: str) -> None:
    tool = REGISTRY[name]
    frame = tool.compute(captures[shape])
    assert list(frame.schema.items()) == [(c, col.dtype) for c, col in tool.columns.items()]
    if shape == "synthetic":  # with rows, not just an empty frame's inferred types
        assert frame.height > 0


@pytest.mark.parametrize("name", list(REGISTRY))
def test_declaration_is_documented(name: str) -> None:
    tool = REGISTRY[name]
    doc = tool.compute.__doc__
    listed = re.findall(r"^        (\w+) \(", doc[doc.index("    Columns:"):], re.M)
    assert listed == list(tool.columns)
    assert all(col.unit in UNITS and col.doc for col in tool.columns.values())
    section = (ROOT / "docs" / "tools.md").read_text().split(f"### `{name}`", 1)
    assert len(section) == 2, f"docs/tools.md has no section for {name}"
    text = section[1].split("\n### ", 1)[0]
    assert [c for c in tool.columns if c not in text] == []
