"""`pasta-trace export --format csv`: events.csv plus one file per registered
tool, each the tool's frame exactly (nested values as JSON, binary as hex)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from pasta_trace import schema
from pasta_trace.cli import main
from pasta_trace.export.csv import flat
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from test_export_model import T0, write_capture


def _export(tmp_path: Path) -> tuple[Path, Path]:
    cap = write_capture(tmp_path / "cap")
    out = tmp_path / "csv"
    assert main(["export", str(cap), "--format", "csv", "-o", str(out)]) == 0
    return cap, out


def test_one_file_per_tool_plus_events(tmp_path: Path) -> None:
    _, out = _export(tmp_path)
    assert len(REGISTRY) > 0
    assert sorted(p.name for p in out.iterdir()) == sorted(["events.csv", *(f"{t}.csv" for t in REGISTRY)])


def test_events_csv(tmp_path: Path) -> None:
    _, out = _export(tmp_path)
    lines = (out / "events.csv").read_text().splitlines()
    assert lines[0] == ",".join(schema.EVENTS_SCHEMA)
    assert len(lines) == 1 + 10
    # ..., aux, stack_id, then format 1.2's layer, outer_ts_ns, caller, caller_fp (not in this file)
    assert lines[1] == f"{T0 + 1000},100,100,101,train,cuMemAlloc_v2,alloc,0,,,,,,,,,,4096,4096,,,,,,,,,"


def test_tool_files_hold_the_tool_frames(tmp_path: Path) -> None:
    cap_path, out = _export(tmp_path)
    cap = open_capture(cap_path)
    for name, tool in REGISTRY.items():
        want = flat(tool.compute(cap))
        want = want.with_columns(pl.col(c).cast(pl.String) for c, t in want.schema.items()
                                 if isinstance(t, (pl.Categorical, pl.Enum)))
        got = pl.read_csv(out / f"{name}.csv", schema=want.schema)
        assert_frame_equal(got, want, check_exact=True), name


def test_flat_turns_nested_and_binary_into_text() -> None:
    frame = pl.DataFrame({
        "shape": [[2, 1, 1], None], "pair": [{"a": 1, "b": "x"}, {"a": None, "b": "y"}],
        "bits": [b"\x01\xff", b""], "n": [1, 2],
    })
    assert flat(frame).rows() == [("[2,1,1]", '{"a":1,"b":"x"}', "01ff", 1), (None, '{"a":null,"b":"y"}', "", 2)]
