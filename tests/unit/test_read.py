"""pasta_trace.read: opening capture directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pasta_trace import schema
from pasta_trace.errors import FormatError
from pasta_trace.read import open_capture

import merge_fixtures as fx


def test_frames_have_the_schema_types(tmp_path: Path) -> None:
    cap = open_capture(fx.write(tmp_path / "c"))
    assert cap.complete and cap.problems == [] and cap.lost_events == 0
    ev = cap.events.collect()
    assert ev.height == 15
    assert [ev.schema[k] == v for k, v in schema.EVENTS_SCHEMA.items()] == [True] * len(schema.EVENTS_SCHEMA)
    assert set(cap.device) == set(schema.DEVICE_FRAMES)
    assert cap.device["page_hist"].collect().height == 9  # device/page_hist.parquet, scanned
    assert cap.device["ws_bitmaps"].collect().height == 0  # absent: an empty frame of the right schema
    assert cap.has_device_data


def test_killed_tracer_without_manifest_is_readable(tmp_path: Path) -> None:
    p = fx.write(tmp_path / "c", device=False)
    (p / "manifest.json").unlink()
    cap = open_capture(p)
    assert not cap.complete
    assert cap.problems == ["no manifest.json: the tracer did not finish; the last interval may be missing"]
    assert cap.events.collect().height == 15
    assert not cap.has_device_data


@pytest.mark.parametrize("text,msg", [
    ("{not json", "damaged manifest (Expecting property name enclosed in double quotes at line 1)"),
    (json.dumps({"format_version": "2.0"}), "format 2.0 is newer than this pasta-trace supports (1.x)"),
    (json.dumps({"complete": True}), "no format_version; not a pasta-trace file"),
])
def test_bad_manifests_are_one_line_errors(tmp_path: Path, text: str, msg: str) -> None:
    p = fx.write(tmp_path / "c", device=False)
    (p / "manifest.json").write_text(text)
    with pytest.raises(FormatError) as e:
        open_capture(p)
    assert msg in e.value.one_line()
    assert "\n" not in e.value.one_line()


def test_incomplete_manifest_is_a_problem_not_an_error(tmp_path: Path) -> None:
    p = fx.write(tmp_path / "c", device=False)
    (p / "manifest.json").write_text(json.dumps({"format_version": "1.0", "complete": False}))
    assert open_capture(p).problems == ["manifest says the capture is incomplete"]


def test_not_a_capture(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(FormatError, match="not a capture directory"):
        open_capture(f)
    with pytest.raises(FormatError, match="not a pasta-trace capture"):
        open_capture(tmp_path)
