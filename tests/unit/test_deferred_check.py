"""The access samples' file, checked by its first reader (device_frames.py):
the merge's pass with Arrow's reader (merge/sample_batches.py), or the check
before Polars reads it, or the check at a verb's end.  Whichever comes first,
a damaged file is left out whole, named in one line, and the verb exits 1,
as when every file was checked at open."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from pasta_trace import cli, merge, parquet_scan, schema
from pasta_trace.damage import left_out
from pasta_trace.errors import EXIT_RUNTIME, FormatError
from pasta_trace.merge import sample_batches, samples
from pasta_trace.read import open_capture
from pasta_trace.testing import synthetic

SPEC = synthetic.Spec(seed=3, accesses=40_000, launches=300, allocations=60, page_hist=False)


@pytest.fixture(autouse=True)
def deferred_at_any_size(monkeypatch) -> None:
    """These small files stand for large ones: their check waits for their first reader."""
    monkeypatch.setattr(parquet_scan, "DEFER_BYTES", 0)


def capture(d: Path, row_group_rows: int = 10_000) -> Path:
    """A capture whose samples are in row groups of `row_group_rows`."""
    synthetic.write_capture(d, SPEC)
    f = d / "device" / "access_samples.parquet"
    pl.read_parquet(f).write_parquet(f, row_group_size=row_group_rows)
    return d


def samples_file(cap: Path) -> Path:
    return cap / "device" / "access_samples.parquet"


def damage_row_group(f: Path, group: int) -> None:
    """Zero the data of row group `group` and after it, up to the footer: the footer (and so every
    check at open) still passes, the pages from there on do not decode."""
    at = pq.ParquetFile(f).metadata.row_group(group).column(0).data_page_offset
    data = bytearray(f.read_bytes())
    footer_at = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    data[at:footer_at] = bytes(footer_at - at)
    f.write_bytes(bytes(data))


def test_the_samples_file_is_not_decoded_at_open(tmp_path: Path, monkeypatch) -> None:
    cap_dir = capture(tmp_path / "c")
    checked: list[Path] = []
    real = parquet_scan._data_problem
    monkeypatch.setattr(parquet_scan, "_data_problem", lambda path, *a: checked.append(path) or real(path, *a))
    cap = open_capture(cap_dir)
    assert samples_file(cap_dir) not in checked and cap_dir / "device" / "launches.parquet" in checked
    assert cap.device.pending == ["access_samples"] and cap.device.rows("access_samples") == 40_000
    assert samples_file(cap_dir) not in checked  # its rows come from the footer
    assert cap.device["access_samples"].select(pl.len()).collect().item() == 40_000  # a Polars reader: checked first
    assert checked[-1] == samples_file(cap_dir) and cap.device.pending == []


def test_the_merge_pass_is_the_check_of_what_it_reads(tmp_path: Path, monkeypatch) -> None:
    """The pass decodes its five columns with Arrow's reader: their check.  A Polars reader later
    has the other four checked, and none of the five a second time; then nothing is left to check."""
    cap_dir = capture(tmp_path / "c")
    cap = open_capture(cap_dir)
    ws = merge.working_set(cap).collect()
    assert ws.height == 300 and int(ws["samples"].sum()) == 40_000
    assert cap.device.pending == ["access_samples"] and cap.problems == [] and cap.damaged == []
    decoded: list[list[str] | None] = []
    real = parquet_scan._data_problem
    monkeypatch.setattr(parquet_scan, "_data_problem",
                        lambda path, f, size, nulls, columns=None: decoded.append(columns) or real(
                            path, f, size, nulls, columns))
    assert cap.device["access_samples"].select(pl.len()).collect().item() == 40_000
    assert decoded == [["gpu_time", "block", "warp", "flags"]] and cap.device.pending == []
    left_out(cap)  # nothing damaged, nothing left to check
    assert len(decoded) == 1


def test_a_verb_s_end_checks_the_columns_no_reader_checked(tmp_path: Path) -> None:
    """Damage in a column the merge does not read: its sums stand, and the verb's end says the file."""
    cap_dir = capture(tmp_path / "c")
    f = samples_file(cap_dir)
    meta = pq.ParquetFile(f).metadata
    gpu_time = [meta.schema.column(i).name for i in range(meta.num_columns)].index("gpu_time")
    chunk = meta.row_group(1).column(gpu_time)
    data = bytearray(f.read_bytes())
    data[chunk.data_page_offset:chunk.data_page_offset + chunk.total_compressed_size] = bytes(
        chunk.total_compressed_size)
    f.write_bytes(bytes(data))
    cap = open_capture(cap_dir)
    assert int(merge.working_set(cap).collect()["samples"].sum()) == 40_000 and cap.damaged == []
    with pytest.raises(FormatError) as e:
        left_out(cap)
    assert str(e.value).startswith(f"{f}: damaged Parquet data (")
    assert str(e.value).endswith("(left out; the rest was read)")


@pytest.mark.parametrize("group", [0, 3])
def test_damage_found_by_the_pass_leaves_the_whole_file_out(tmp_path: Path, monkeypatch, group: int) -> None:
    """Damage in any row group, read by one of several threads, mid-pass: no sums of the row groups
    read before it, the file left out and named, the reading threads stopped."""
    monkeypatch.setattr(sample_batches.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(samples, "BATCH_ROWS", 4_000)
    cap_dir = capture(tmp_path / "c")
    f = samples_file(cap_dir)
    assert pq.ParquetFile(f).num_row_groups == 4
    damage_row_group(f, group)
    threads = threading.active_count()
    cap = open_capture(cap_dir)
    assert cap.damaged == []  # its footer is whole
    ws, hot = merge.working_set(cap).collect(), merge.hotness(cap).collect()
    assert (ws.height, hot.height) == (0, 0)
    assert len(cap.damaged) == 1 and cap.damaged[0].startswith(f"{f}: damaged Parquet data (")
    assert cap.problems == cap.damaged and f not in cap.files
    assert threading.active_count() == threads
    assert cap.device["access_samples"].collect().height == 0
    with pytest.raises(FormatError, match="left out; the rest was read"):
        left_out(cap)


@pytest.mark.parametrize("verb", [["report"], ["export", "--format", "chrome"], ["export", "--format", "perfetto"],
                                  ["merge"]])
def test_every_verb_names_a_damaged_samples_file(tmp_path: Path, capsys, verb: list[str]) -> None:
    """Read by the verb or not, the damaged file is said as the error, and the rest is done."""
    cap_dir = capture(tmp_path / "c")
    f = samples_file(cap_dir)
    damage_row_group(f, 2)
    out = tmp_path / "out"
    extra = ["-o", str(out)] if verb[0] in ("export", "merge") else []
    rc = cli.main([verb[0], str(cap_dir), *verb[1:], *extra])
    stdout, err = capsys.readouterr()
    assert rc == EXIT_RUNTIME and (stdout or out.exists())
    line = err.splitlines()[-1]
    assert line.startswith(f"pasta-trace: error: {f}: damaged Parquet data (")
    assert line.endswith(" (left out; the rest was read)")
    if verb[0] == "merge":
        tl = json.loads((out / "timeline.json").read_text())
        assert tl["merge_stats"]["samples"] == 0 and any(str(f) in p for p in tl["problems"])
        assert pl.read_parquet(out / "working_set.parquet").height == 0
        assert pl.read_parquet(out / "kernels.parquet").height > 0  # the rest


def test_rows_without_a_pid_are_left_out_when_checked(tmp_path: Path) -> None:
    """The nulls are counted by whichever check runs: rows without a pid are left out and said, as
    when they were counted at open."""
    cap_dir = capture(tmp_path / "c")
    f = samples_file(cap_dir)
    whole = pl.read_parquet(f)
    want = merge.working_set(open_capture(cap_dir)).collect().sort("pid", "launch_id")
    extra = whole.head(25).with_columns(pl.lit(None, schema.DEVICE_FRAMES["access_samples"]["pid"]).alias("pid"))
    pl.concat([whole, extra]).write_parquet(f, row_group_size=10_000)
    cap = open_capture(cap_dir)
    assert cap.problems == []
    got = merge.working_set(cap).collect().sort("pid", "launch_id")
    assert got.equals(want)
    assert cap.problems == ["device access_samples: rows left out (25 without pid)"]


def test_an_error_on_a_reading_thread_ends_the_pass_with_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sample_batches.os, "cpu_count", lambda: 4)
    cap = open_capture(capture(tmp_path / "c"))
    real = samples.numpy_keys
    calls = []

    def third_fails(*a):
        keys = real(*a)

        def k(cols):
            calls.append(1)
            if len(calls) == 3:
                raise pl.exceptions.ComputeError("access samples: a null or unexpected pid")
            return keys(cols)
        return k

    monkeypatch.setattr(samples, "numpy_keys", third_fails)
    monkeypatch.setattr(sample_batches, "READ_ROWS", 2_000)
    threads = threading.active_count()
    with pytest.raises(pl.exceptions.ComputeError, match="unexpected pid"):
        merge.working_set(cap).collect()
    assert threading.active_count() == threads
    assert cap.device.pending == ["access_samples"] and cap.damaged == []  # no damage: still to be checked


def test_pages_from_a_histogram_leave_the_samples_unread(tmp_path: Path) -> None:
    """With a page histogram the pages come from it: the samples' file is not decoded for them."""
    d = tmp_path / "c"
    synthetic.write_capture(d, dataclasses.replace(SPEC, page_hist=True))
    cap = open_capture(d)
    assert merge.attributed_pages(cap).collect().height > 0
    assert cap.device.pending == ["access_samples"]
    nohist = tmp_path / "n"
    synthetic.write_capture(nohist, SPEC)
    cap = open_capture(nohist)
    assert merge.attributed_pages(cap).collect().height > 0  # folded from the samples by Polars: checked first
    assert cap.device.pending == []


def test_the_report_s_lean_copy_shares_the_check(tmp_path: Path, monkeypatch) -> None:
    """The report reads a copy of the capture without the kernel counters: the samples' file is still
    checked once, by whichever of the two reads it first."""
    from pasta_trace.reporters.results import without_counters

    cap = open_capture(capture(tmp_path / "c"))
    lean = without_counters(cap)
    assert lean.device.pending == cap.device.pending == ["access_samples"]
    assert "gld" not in lean.device["kernel_summaries"].collect_schema()
    assert "gld" in cap.device["kernel_summaries"].collect_schema()
    assert merge.working_set(lean).collect().height == 300  # the pass: the check of its columns
    assert lean.device["access_samples"].collect().height == 40_000  # the check of the others
    assert cap.device.pending == [] and lean.device.pending == []
    monkeypatch.setattr(parquet_scan, "_data_problem", lambda *_: pytest.fail("decoded a second time"))
    assert cap.device["access_samples"].collect().height == 40_000
    left_out(cap)


def test_a_small_samples_file_is_checked_at_open(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(parquet_scan, "DEFER_BYTES", 64 << 20)
    cap_dir = capture(tmp_path / "c")
    assert samples_file(cap_dir).stat().st_size < 64 << 20
    cap = open_capture(cap_dir)
    assert cap.device.pending == [] and cap.device["access_samples"].collect().height == 40_000
    monkeypatch.setattr(parquet_scan, "DEFER_BYTES", samples_file(cap_dir).stat().st_size)
    assert open_capture(cap_dir).device.pending == ["access_samples"]
