"""The capture writer at its limits: an events writer process that falls
behind (a bounded shared ring: drops counted, never unbounded memory) and a full
disk (what was written stays, what was not is counted, no temporaries, the
manifest still completed)."""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import polars as pl

from pasta_trace import schema
from pasta_trace.capture.output import manifest as mf
from pasta_trace.capture.session import summary
from pasta_trace.capture.session.finish import complete_manifest
from pasta_trace.capture.output.writer import RESERVE_BYTES, CaptureWriter
from pasta_trace.safe_output import OutputDir

APIS = ["cuLaunchKernel"]
BATCH = 1000  # records


def _launches(batch: int, n: int = BATCH) -> np.ndarray:
    recs = np.zeros(n, schema.HOST_EVENT.dtype)
    recs["ts_ns"] = batch * n + np.arange(n)
    recs["kind"] = int(schema.Kind.launch)
    recs["pid"], recs["tid"], recs["comm"] = 100, 100, b"flood"
    return recs


def _wait(cond, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _rows(d: Path) -> list[int]:
    return sorted(pl.read_parquet(f)["ts_ns"].to_list() for f in sorted(d.glob("events-*.parquet")))


def test_a_stalled_events_writer_costs_counted_drops_not_memory(tmp_path):
    """The writer process is stopped: the shared ring holds 2.5 batches of
    records, the rest is dropped (the newest), counted exactly, and what the
    ring holds is all written once it runs again."""
    size = BATCH * schema.HOST_EVENT.size
    w = CaptureWriter(OutputDir.claim(tmp_path / "c", force=False), APIS, ring=2 * size + size // 2)
    os.kill(w._proc.pid, signal.SIGSTOP)
    try:
        for batch in range(7):
            w.add_events(_launches(batch))
        assert w.ring_used == w.ring_bytes == 2 * size + size // 2
    finally:
        os.kill(w._proc.pid, signal.SIGCONT)
    w.close()
    produced = 7 * BATCH
    assert w.events == 2500 and w.written == 2500 and w.unwritten == 0
    assert w.lost_behind == 4500  # half of batch 2, batches 3-6
    assert w.written + w.lost_behind == produced
    ts = pl.concat([pl.read_parquet(f) for f in w.event_files])["ts_ns"].sort().to_list()
    assert ts == list(range(2500))  # batches 0-1 and the first half of batch 2
    assert w.by_kind.tolist()[int(schema.Kind.launch)] == 2500
    assert w.ring_used == 0  # all released once written
    assert w.held_peak_bytes == 2500 * schema.HOST_EVENT.size


def test_the_ring_is_reused_after_the_writer_caught_up(tmp_path):
    """Batches that wrap past the ring's end, many times: every record is
    written once, in order, and none is dropped while the writer keeps up."""
    size = BATCH * schema.HOST_EVENT.size
    w = CaptureWriter(OutputDir.claim(tmp_path / "c", force=False), APIS, ring=size + size // 3)
    for batch in range(12):
        w.add_events(_launches(batch))
        w.flush()  # synchronous: the ring is empty again
        assert w.ring_used == 0
    w.close()
    assert (w.events, w.written, w.lost_behind) == (12 * BATCH, 12 * BATCH, 0)
    ts = pl.concat([pl.read_parquet(f) for f in w.event_files])["ts_ns"].to_list()
    assert ts == list(range(12 * BATCH))


def test_summary_shows_the_manifest_notes_as_warnings(tmp_path):
    names = pl.DataFrame(schema={"pid": pl.UInt32, "handle": pl.UInt64, "name": pl.String})
    notes = ["removing the probes: Exception: Failed to detach BPF from uprobe"] + [f"n{i}" for i in range(6)]
    text = summary.render(tmp_path, {}, names, {"lost_writer_behind": 1234}, {}, notes)
    assert text.splitlines()[-8:] == [
        "LOST: 1,234 events: the events writer fell behind",
        "  use --aggregate or trace fewer processes",
        "warning: removing the probes: Exception: Failed to detach BPF from uprobe",
        "warning: n0", "warning: n1", "warning: n2", "warning: n3",
        f"... and 2 more warnings in {tmp_path / 'manifest.json'}",
    ]
    assert summary.render(tmp_path, {}, names, {}, {}).splitlines()[-1] == "lost: 0"


# ---------------------------------------------------------------- a full disk


def _fill(d: Path) -> Path:
    """Fill the file system of ``d`` to the last byte."""
    filler = d / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def _free(d: Path) -> int:
    st = os.statvfs(d)
    return st.f_bavail * st.f_frsize


def test_a_full_disk_keeps_what_was_written_and_counts_what_was_not(small_fs):
    free_before = _free(small_fs)
    out = OutputDir.claim(small_fs / "cap", force=False)
    w = CaptureWriter(out, APIS)
    assert free_before - _free(small_fs) >= RESERVE_BYTES  # room held for the manifest
    w.add_events(_launches(0))
    w.flush()  # synchronous: events-00000 is on disk
    filler = _fill(small_fs)
    w.add_events(_launches(1))
    w.add_names(np.zeros(3, schema.HOST_NAME.dtype))
    w.flush()  # neither the events nor names.parquet fit
    assert w.failed == {"names.parquet": "No space left on device"}
    filler.unlink()  # room again: the next flush writes
    w.add_events(_launches(2))
    w.close()
    assert [f.name for f in w.event_files] == ["events-00000.parquet", "events-00001.parquet"]
    assert (w.written, w.unwritten, w.write_error) == (2000, 1000, "No space left on device")
    assert w.written + w.unwritten == w.events == 3000
    assert _rows(small_fs / "cap") == [list(range(1000)), list(range(2000, 3000))]
    assert w.failed == {}  # names.parquet written at close
    assert sorted(os.listdir(small_fs / "cap")) == ["events-00000.parquet", "events-00001.parquet",
                                                     "names.parquet"]  # no temporaries


def test_the_manifest_is_completed_on_a_full_disk_from_the_room_held_aside(small_fs):
    out = OutputDir.claim(small_fs / "cap", force=False)
    out.keep_free(RESERVE_BYTES)
    m = mf.Manifest(command_line=["pasta-trace"], mode="pid", start=mf.ClockSample.now())
    m.write(out, complete=False)
    _fill(small_fs)
    m.counts = mf.counts(events=1, names=0, lost={"lost_unwritten": 9}, by_kind={})
    m.notes = ["x" * 100_000]  # more than the filler left
    assert complete_manifest(out, m) is None
    data = json.loads((small_fs / "cap" / "manifest.json").read_text())
    assert data["complete"] is True and data["counts"]["lost_unwritten"] == 9
    assert os.listdir(small_fs / "cap") == ["manifest.json"]
    # without room left at all it says why, and the last manifest stays
    _fill(small_fs)
    m.notes = ["y" * 100_000]
    assert complete_manifest(out, m) == "No space left on device"
    assert json.loads((small_fs / "cap" / "manifest.json").read_text())["notes"] == ["x" * 100_000]
    assert os.listdir(small_fs / "cap") == ["manifest.json"]
    out.close()


def test_restarts_and_trims_lose_nothing_through_the_writer_process(tmp_path, monkeypatch):
    """A steady flow restarts at the ring's start (the writer releases the
    bytes skipped), a flood past the region is given back once written, and
    the files hold every record once, in order."""
    from pasta_trace.capture.output import shared_ring

    monkeypatch.setattr(shared_ring, "REGION_BYTES", 256 << 10)
    monkeypatch.setattr(shared_ring, "PREFAULT_AHEAD_BYTES", 64 << 10)
    size = BATCH * schema.HOST_EVENT.size
    w = CaptureWriter(OutputDir.claim(tmp_path / "c", force=False), APIS, ring=4 << 20)
    for batch in range(6):  # 6 x 168 kB: past the region, and back to its start
        w.add_events(_launches(batch))
        w.flush()
    assert w._ring._end == 2 * (4 << 20) + 2 * size  # restarted twice: after batches 1 and 3
    for batch in range(6, 26):  # a flood of 3.4 MB
        w.add_events(_launches(batch))
    w.flush()
    w.flush_async()  # all written: the flood's pages go back
    assert w.ring_trimmed_bytes == (4 << 20) - (256 << 10) - (64 << 10)
    for batch in range(26, 28):
        w.add_events(_launches(batch))
    w.close()
    assert (w.events, w.written, w.lost_behind) == (28 * BATCH, 28 * BATCH, 0)
    ts = pl.concat([pl.read_parquet(f) for f in w.event_files])["ts_ns"].to_list()
    assert ts == list(range(28 * BATCH)) and size == 168_000
