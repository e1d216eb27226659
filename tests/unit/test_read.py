"""pasta_trace.read: opening capture directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
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


GOOD = {"format_version": "1.0", "complete": True, "counts": {"lost_events": 0, "lost_names": 0}}


@pytest.mark.parametrize("text,msg", [
    ("{not json", "damaged manifest (Expecting property name enclosed in double quotes at line 1)"),
    (json.dumps({"format_version": "2.0"}), "format 2.0 is newer than this pasta-trace supports (1.x)"),
    (json.dumps({"complete": True}), "no format_version; not a pasta-trace file"),
    ("[1]", "not a pasta-trace manifest (it is an array, expected an object)"),
    ('"x"', "not a pasta-trace manifest (it is a string, expected an object)"),
    ("null", "not a pasta-trace manifest (it is null, expected an object)"),
    ("", "damaged manifest (Expecting value at line 1)"),
    (json.dumps({**GOOD, "counts": "abc"}), "not a pasta-trace manifest (counts is a string, expected an object)"),
    (json.dumps({**GOOD, "counts": {"lost_events": "abc"}}),
     "not a pasta-trace manifest (counts.lost_events is a string, expected an integer)"),
    (json.dumps({**GOOD, "counts": {"lost_events": 1.5}}),
     "not a pasta-trace manifest (counts.lost_events is a number, expected an integer)"),
    (json.dumps({**GOOD, "counts": {"lost_names": True}}),
     "not a pasta-trace manifest (counts.lost_names is true or false, expected an integer)"),
    (json.dumps({**GOOD, "complete": "yes"}), "not a pasta-trace manifest (complete is a string, expected true or false)"),
    (json.dumps({**GOOD, "command_line": ["python", 3]}),
     "not a pasta-trace manifest (command_line[1] is an integer, expected a string)"),
    (json.dumps({**GOOD, "clock": {"start_sample": {"realtime_ns": "now"}}}),
     "not a pasta-trace manifest (clock.start_sample.realtime_ns is a string, expected an integer)"),
    (json.dumps({**GOOD, "format_version": 2}), "format 2 is newer than this pasta-trace supports (1.x)"),
    ('{"format_version": "1.0", "counts": {"lost_events": NaN}}',
     "damaged manifest (NaN is not JSON)"),
    ('{"format_version": "1.0", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "damaged manifest (nested too deeply)"),
    ('{"format_version": "1.0", "n": ' + "9" * 5000 + "}", "damaged manifest (Exceeds the limit (4300 digits)"),
])
def test_bad_manifests_are_one_line_errors(tmp_path: Path, text: str, msg: str) -> None:
    p = fx.write(tmp_path / "c", device=False)
    (p / "manifest.json").write_text(text)
    with pytest.raises(FormatError) as e:
        open_capture(p)
    assert e.value.one_line().startswith(f"{p / 'manifest.json'}: {msg}")
    assert "\n" not in e.value.one_line()


def test_manifest_that_is_not_utf8(tmp_path: Path) -> None:
    p = fx.write(tmp_path / "c", device=False)
    (p / "manifest.json").write_bytes(b'{"format_version": "1.0", "host": "\xff"}')
    with pytest.raises(FormatError) as e:
        open_capture(p)
    assert str(e.value) == f"{p / 'manifest.json'}: damaged manifest (not UTF-8 at byte 35)"


def test_null_values_read_as_missing(tmp_path: Path) -> None:
    p = fx.write(tmp_path / "c", device=False)
    (p / "manifest.json").write_text(json.dumps({"format_version": "1.0", "complete": True, "counts": None}))
    cap = open_capture(p)
    assert (cap.lost_events, cap.damaged) == (0, [])
    (p / "manifest.json").write_text(json.dumps({**GOOD, "counts": {"lost_events": None, "lost_names": 3}}))
    assert open_capture(p).lost_events == 3


def _special(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:  # a sparse file of 10 GB: read whole, it held as much memory
        with open(path, "wb") as f:
            f.truncate(10 << 30)


SPECIAL = {"fifo": "a FIFO, not a regular file", "zero": "a symbolic link, not a regular file",
           "directory": "a directory, not a regular file",
           "sparse": f"{10 << 30} bytes, more than a manifest can hold (16 MiB); not a pasta-trace manifest"}


@pytest.mark.parametrize("kind", list(SPECIAL))
def test_manifest_that_is_no_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """Through the CLI in a child process: a FIFO or /dev/zero hung the reader for good."""
    p = fx.write(tmp_path / "c", device=False)
    _special(p / "manifest.json", kind)
    r = subprocess.run([sys.executable, "-m", "pasta_trace.cli", "report", "--json", str(p)],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"pasta-trace: error: {p / 'manifest.json'}: {SPECIAL[kind]}\n"


def test_events_file_that_is_a_fifo_is_left_out(tmp_path: Path) -> None:
    p = fx.write(tmp_path / "c", device=False)
    (p / "events-00001.parquet").symlink_to(p / "events-00000.parquet")
    os.mkfifo(p / "events-00002.parquet")
    r = subprocess.run([sys.executable, "-m", "pasta_trace.cli", "report", "--json", str(p)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert json.loads(r.stdout)["capture"]["events"] == 15  # the one regular file, once
    assert r.stderr.splitlines()[-1] == (
        f"pasta-trace: error: 2 files left out (the rest was read): "
        f"{p / 'events-00001.parquet'}: a symbolic link, not a regular file; "
        f"{p / 'events-00002.parquet'}: a FIFO, not a regular file")


def _truncate(path: Path, n: int) -> None:
    path.write_bytes(path.read_bytes()[:n])


@pytest.mark.parametrize("name", ["names.parquet", "libraries.parquet", "processes.parquet", "stacks.parquet",
                                  "device/page_hist.parquet", "events-00000.parquet"])
def test_damaged_parquet_is_left_out_and_named(tmp_path: Path, name: str) -> None:
    p = fx.write(tmp_path / "c")
    sch = {"libraries.parquet": schema.LIBRARIES_SCHEMA, "processes.parquet": schema.PROCESSES_SCHEMA,
           "stacks.parquet": schema.STACKS_SCHEMA}
    for n, s in sch.items():
        schema.empty_frame(s).write_parquet(p / n)
    size = (p / name).stat().st_size
    for cut, why in ((0, "not a Parquet file"), (3, "not a Parquet file"), (size // 2, "truncated Parquet file (no footer at its end)"),
                     (size - 1, "truncated Parquet file (no footer at its end)")):
        _truncate(p / name, cut) if cut else (p / name).write_bytes(b"")
        cap = open_capture(p)
        assert cap.damaged == [f"{p / name}: {why}"], cut
        assert cap.problems == cap.damaged
        # the rest is read as usual
        events = 0 if name.startswith("events") else 15
        assert cap.events.collect().height == events
        assert cap.names.collect().height == (0 if name == "names.parquet" else 3)
        assert cap.device["page_hist"].collect().height == (0 if name.startswith("device") else 9)
        fx.write(tmp_path / "c")
        for n, s in sch.items():
            schema.empty_frame(s).write_parquet(p / n)


def test_random_bytes_as_parquet(tmp_path: Path) -> None:
    p = fx.write(tmp_path / "c")
    (p / "device" / "launches.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 8 + b"PAR1")
    cap = open_capture(p)
    # Polars' own words follow (they change between its versions)
    assert [d.split(" (")[0] for d in cap.damaged] == [f"{p / 'device' / 'launches.parquet'}: damaged Parquet footer"]
    assert cap.device["launches"].collect().height == 0 and cap.device["page_hist"].collect().height == 9


@pytest.mark.parametrize("name,column,to,want", [
    ("events-00000.parquet", "ts_ns", pl.String, "Int64"),
    ("events-00000.parquet", "pid", pl.Int64, "UInt32"),
    ("events-00000.parquet", "kind", pl.String, f"Enum(categories={schema.KIND_NAMES})"),
    ("names.parquet", "handle", pl.Float64, "UInt64"),
    ("device/page_hist.parquet", "count", pl.Int32, "UInt64"),
])
def test_column_of_another_type_is_refused_not_read_as_null(tmp_path: Path, name, column, to, want) -> None:
    p = fx.write(tmp_path / "c")
    f = p / name
    pl.read_parquet(f).with_columns(pl.col(column).cast(to)).write_parquet(f)
    cap = open_capture(p)
    assert cap.damaged == [f"{f}: column {column} is {to}, expected {want}"]


def test_text_as_categorical_and_a_new_enum_value_still_read(tmp_path: Path) -> None:
    """What a newer minor version may write: still read (an unknown kind as null)."""
    p = fx.write(tmp_path / "c", device=False)
    f = p / "events-00000.parquet"
    df = pl.read_parquet(f)
    df.with_columns(pl.col("api").cast(pl.String),
                    pl.col("kind").cast(pl.String).replace("free", "unmap").cast(pl.Enum(["alloc", "launch", "unmap"])),
                    ).write_parquet(f)
    cap = open_capture(p)
    ev = cap.events.collect()
    assert cap.damaged == [] and ev["api"].to_list() == df["api"].cast(pl.String).to_list()
    assert ev["kind"].null_count() == (df["kind"] == "free").sum() == 4


def test_events_files_of_two_schemas_are_read_together(tmp_path: Path) -> None:
    """An events file of format 1.0 (no stack_id) beside one of 1.1."""
    p = fx.write(tmp_path / "c", device=False)
    f = p / "events-00000.parquet"
    df = pl.read_parquet(f)
    df.head(5).write_parquet(f)
    df.tail(10).drop("stack_id").with_columns(pl.col("api").cast(pl.String)).write_parquet(p / "events-00001.parquet")
    cap = open_capture(p)
    assert cap.damaged == []
    assert cap.events.collect().equals(df)


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


def test_what_the_writers_write_fits_the_shape_readers_check(tmp_path: Path) -> None:
    from pasta_trace.testing import synthetic
    from pasta_trace.capture.output.manifest import ClockSample, Manifest, counts
    from pasta_trace.json_shape import shape_problem

    m = Manifest(command_line=["pasta-trace", "-a"], mode="system", start=ClockSample.now(), end=ClockSample.now(),
                 pids=[1, 2], counts=counts(events=3, names=1, lost={loss.name: 0 for loss in schema.LOSSES},
                                            by_kind={"launch": 3}))
    for complete in (False, True):
        assert shape_problem(json.loads(json.dumps(m.to_json(complete))), schema.MANIFEST_SHAPE, "it") is None
    synthetic.write_capture(tmp_path / "s", synthetic.Spec(pids=1, launches=4, allocations=2, accesses=4))
    assert shape_problem(json.loads((tmp_path / "s" / "manifest.json").read_text()), schema.MANIFEST_SHAPE,
                         "it") is None
