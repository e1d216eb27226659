"""Damaged files in a capture or timeline, through the real CLI: the verbs do
what they can with the rest, name each damaged file in one line, and exit 1;
damage found only when the data is decoded stops them with one line naming
the file; Rust's panic report never reaches the terminal."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.exceptions import PanicException

from pasta_trace import cli
from pasta_trace.damage import reading
from pasta_trace.errors import EXIT_RUNTIME, FormatError
from pasta_trace.parquet_scan import first_line
from pasta_trace.read import open_capture

import merge_fixtures as fx


def run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err.splitlines()


def _zero_data_pages(f: Path) -> None:
    """Overwrite everything between the leading magic and the footer: the footer
    (and so every check at open) still passes, decoding fails."""
    data = bytearray(f.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    end = len(data) - 8 - footer
    data[4:end] = bytes(end - 4)
    f.write_bytes(bytes(data))


def test_damaged_libraries_file_is_said_and_the_report_still_made(tmp_path: Path, capsys) -> None:
    cap = fx.write(tmp_path / "c")
    (cap / "libraries.parquet").write_bytes(b"PAR1 not really")
    rc, out, err = run(capsys, "report", str(cap), "--json")
    assert rc == EXIT_RUNTIME
    doc = json.loads(out)
    assert doc["capture"]["events"] == 15 and doc["capture"]["problems"] == [
        f"{cap / 'libraries.parquet'}: truncated Parquet file (no footer at its end)"]
    assert err == [
        f"pasta-trace: warning: INCOMPLETE: 0 events lost ({cap / 'libraries.parquet'}: truncated Parquet file "
        "(no footer at its end))",
        f"pasta-trace: error: {cap / 'libraries.parquet'}: truncated Parquet file (no footer at its end) "
        "(left out; the rest was read)"]


def test_merge_keeps_the_rest_and_the_timeline_says_what_is_missing(tmp_path: Path, capsys) -> None:
    cap = fx.write(tmp_path / "c")
    names = cap / "names.parquet"
    names.write_bytes(names.read_bytes()[:-1])
    out = tmp_path / "tl"
    rc, _, err = run(capsys, "merge", str(cap), "-o", str(out))
    why = f"{names}: truncated Parquet file (no footer at its end)"
    assert rc == EXIT_RUNTIME
    assert err[-1] == f"pasta-trace: error: {why} (left out; the rest was read)"
    assert not any("warning" in line for line in err)  # said once, as the error
    assert json.loads((out / "timeline.json").read_text())["problems"] == [why]
    assert pl.read_parquet(out / "kernels.parquet").height == 5 and pl.read_parquet(out / "names.parquet").height == 0
    rc, stdout, err = run(capsys, "report", str(out), "--json")
    assert rc == 0 and json.loads(stdout)["incomplete"] == f"INCOMPLETE: 0 events lost ({why})"


def test_export_of_a_capture_with_a_wrong_column_type(tmp_path: Path, capsys) -> None:
    cap = fx.write(tmp_path / "c")
    f = cap / "device" / "kernel_summaries.parquet"
    pl.read_parquet(f).with_columns(pl.col("gld").cast(pl.Float32)).write_parquet(f)
    out = tmp_path / "t.json"
    rc, _, err = run(capsys, "export", str(cap), "--format", "chrome", "-o", str(out))
    assert rc == EXIT_RUNTIME and json.loads(out.read_text())["traceEvents"]
    assert err[-1] == f"pasta-trace: error: {f}: column gld is Float32, expected UInt64 (left out; the rest was read)"


def test_many_damaged_files_are_one_line(tmp_path: Path, capsys) -> None:
    cap = fx.write(tmp_path / "c")
    for n in ("alloc_touch", "clock_sync", "kernel_summaries", "launches"):
        (cap / "device" / f"{n}.parquet").write_bytes(b"")
    rc, _, err = run(capsys, "report", str(cap))
    assert rc == EXIT_RUNTIME and len(err) == 1
    assert err[0] == (f"pasta-trace: error: 4 files left out (the rest was read): "
                      f"{cap / 'device' / 'clock_sync.parquet'}: not a Parquet file; "
                      f"{cap / 'device' / 'launches.parquet'}: not a Parquet file; "
                      f"{cap / 'device' / 'kernel_summaries.parquet'}: not a Parquet file; and 1 more")


@pytest.mark.parametrize("verb", [["report"], ["report", "--json"], ["export", "--format", "chrome"], ["merge"]])
def test_damaged_data_pages_are_left_out(tmp_path: Path, capsys, verb: list[str]) -> None:
    """A whole footer over damaged pages: found at open by decoding every page once."""
    cap = fx.write(tmp_path / "c")
    f = cap / "events-00000.parquet"
    _zero_data_pages(f)
    out = tmp_path / "out"
    extra = ["-o", str(out)] if verb[0] in ("export", "merge") else []
    rc, stdout, err = run(capsys, verb[0], str(cap), *verb[1:], *extra)
    assert rc == EXIT_RUNTIME and (stdout or out.exists())  # the rest was reported, exported or merged
    assert err[-1].startswith(f"pasta-trace: error: {f}: damaged Parquet data (")
    assert err[-1].endswith(" (left out; the rest was read)")


def test_damage_met_after_open_names_the_file(tmp_path: Path) -> None:
    """A file damaged after it was checked (or damage only Polars trips on):
    the decoding error becomes one line naming the file."""
    cap = fx.write(tmp_path / "c")
    f = cap / "events-00000.parquet"
    with pytest.raises(FormatError) as e:
        with reading(lambda: open_capture(cap)) as c:
            _zero_data_pages(f)
            c.events.collect()
    assert str(e.value).startswith(f"{f}: damaged Parquet data (")
    fx.write(tmp_path / "c")
    with pytest.raises(FormatError) as e:
        with reading(lambda: open_capture(cap)):
            raise pl.exceptions.ComputeError("conversion from `f64` to `i64` failed\nin column x")
    assert str(e.value) == f"{cap}: conversion from `f64` to `i64` failed"  # every file decodes: values


def test_timeline_header_that_is_damaged(tmp_path: Path, capsys) -> None:
    cap = fx.write(tmp_path / "c")
    tl = tmp_path / "tl"
    assert cli.main(["merge", str(cap), "-o", str(tl)]) == 0
    capsys.readouterr()
    marker = tl / "timeline.json"
    good = json.loads(marker.read_text())
    for doc, why in (
        ({**good, "merge_stats": {**good["merge_stats"], "pages": "9"}}, "merge_stats: not the merge's counts"),
        ({**good, "merge_stats": {**good["merge_stats"], "pages": -9}}, "merge_stats: not the merge's counts"),
        ({**good, "problems": "none"}, "problems is a string, expected an array"),
        ({**good, "capture_manifest": {"counts": {"lost_events": "0"}}},
         "capture_manifest.counts.lost_events is a string, expected an integer"),
    ):
        marker.write_text(json.dumps(doc))
        assert run(capsys, "report", str(tl)) == (
            EXIT_RUNTIME, "", [f"pasta-trace: error: {marker}: not a pasta-trace timeline header ({why})"])
    marker.unlink()
    os.mkfifo(marker)
    assert run(capsys, "report", str(tl)) == (
        EXIT_RUNTIME, "", [f"pasta-trace: error: {marker}: a FIFO, not a regular file"])


def test_panic_report_is_held_back_and_other_native_output_shown(tmp_path: Path, capfd) -> None:
    """Rust prints a panic to descriptor 2 before Python sees PanicException:
    that text is dropped once the panic became the one-line error; anything
    else native code wrote is shown, after Python's own lines."""
    cap = fx.write(tmp_path / "c")
    with pytest.raises(FormatError) as e:
        with reading(lambda: open_capture(cap)):
            os.write(2, b"\nthread 'async-executor-1' (7) panicked at crates/x.rs:1:1:\nboom\nstack backtrace:\n")
            print("said by Python", file=sys.stderr)
            raise PanicException("boom")
    assert str(e.value) == f"{cap}: decoder failed: boom"  # the capture's files all decode
    assert capfd.readouterr().err == "said by Python\n"
    with reading(lambda: open_capture(cap)):
        os.write(2, b"a native note\n")
        print("said by Python", file=sys.stderr)
    assert capfd.readouterr().err == "said by Python\na native note\n"
    with reading(lambda: open_capture(cap), verbose=True):  # -v: nothing held
        os.write(2, b"thread 'x' panicked at y\n")
    assert capfd.readouterr().err == "thread 'x' panicked at y\n"


def test_a_panic_is_said_by_its_innermost_cause() -> None:
    nested = ('called `Result::unwrap()` on an `Err` value: JoinError::Panic(Id(188), "called `Result::unwrap()` '
              'on an `Err` value: JoinError::Panic(Id(187), \\"assertion failed: offset + length <= self.length\\", '
              '...)", ...)')
    assert first_line(PanicException(nested)) == "decoder failed: assertion failed: offset + length <= self.length"
    assert first_line(PanicException("assertion `left == right` failed\n  left: 0\n right: 65")) == (
        "decoder failed: assertion `left == right` failed")


def test_a_polars_panic_outside_reading_is_still_one_line(capsys, monkeypatch) -> None:
    from pasta_trace.commands import report

    def panics(_args):
        raise PanicException("boom")

    monkeypatch.setattr(report, "run", panics)
    assert run(capsys, "report", "x") == (
        EXIT_RUNTIME, "", ["pasta-trace: internal error: PanicException: boom (run with -v for the traceback)"])


@pytest.mark.parametrize("threaded", [False, True])
def test_damage_in_a_late_row_group_is_found_on_every_thread(tmp_path: Path, monkeypatch, threaded: bool) -> None:
    """A large file's row groups are checked by several readers at once: the
    damage in its last row group is found as by one reader."""
    import pyarrow.parquet as pq

    from pasta_trace import parquet_scan

    monkeypatch.setattr(parquet_scan, "THREADED_BYTES", 0 if threaded else 1 << 40)
    monkeypatch.setattr(parquet_scan.os, "cpu_count", lambda: 4)
    f = tmp_path / "x.parquet"
    sch = {"a": pl.Int64, "b": pl.Int64}
    pl.DataFrame({"a": range(40_000), "b": [i * 7919 % 10_007 for i in range(40_000)]}, schema=sch).write_parquet(
        f, row_group_size=10_000)
    assert pq.ParquetFile(f).num_row_groups == 4
    assert parquet_scan.parquet_problem(f, sch) == (sch, None)
    last = pq.ParquetFile(f).metadata.row_group(3).column(0).data_page_offset
    data = bytearray(f.read_bytes())
    footer_at = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    data[last:footer_at] = bytes(footer_at - last)
    f.write_bytes(bytes(data))
    found, why = parquet_scan.parquet_problem(f, sch)
    assert found is None and why.startswith("damaged Parquet data (")


def test_cluster_merge_of_a_damaged_capture_exits_1_and_keeps_the_rest(tmp_path: Path, capsys) -> None:
    """As one capture's merge: the timeline is written from what could be
    read, says what is missing, and the run exits 1 naming the damaged file."""
    a, b = fx.write(tmp_path / "a"), fx.write(tmp_path / "b")
    names = b / "names.parquet"
    names.write_bytes(names.read_bytes()[:-1])
    out = tmp_path / "tl"
    rc, _, err = run(capsys, "merge", str(a), str(b), "-o", str(out))
    why = f"{names}: truncated Parquet file (no footer at its end)"
    assert rc == EXIT_RUNTIME
    assert err[-1] == f"pasta-trace: error: {why} (left out; the rest was read)"
    assert not any(why in line for line in err[:-1])  # said once, as the error
    assert json.loads((out / "timeline.json").read_text())["problems"] == [f"{b}: {why}"]
    assert pl.read_parquet(out / "names.parquet").height == len(fx.NAMES)  # a's, not b's
    assert pl.scan_parquet(out / "events" / "**" / "*.parquet").select(pl.len()).collect().item() == 2 * 15


def test_cluster_merge_of_captures_damaged_after_open_names_the_file(tmp_path: Path) -> None:
    from pasta_trace.damage import reading_all

    a, b = fx.write(tmp_path / "a"), fx.write(tmp_path / "b")
    f = b / "events-00000.parquet"
    with pytest.raises(FormatError) as e:
        with reading_all(lambda: [open_capture(a), open_capture(b)]) as caps:
            _zero_data_pages(f)
            pl.concat([c.events for c in caps]).collect()
    assert str(e.value).startswith(f"{f}: damaged Parquet data (")
    with pytest.raises(FormatError) as e:
        with reading_all(lambda: [open_capture(a), open_capture(a)]):
            raise pl.exceptions.ComputeError("conversion from `f64` to `i64` failed\nin column x")
    assert str(e.value) == f"{a}, {a}: conversion from `f64` to `i64` failed"
