"""The events writer behind a flood: what arrives while a file is being
written waits in the spill file (capture.event_spill), is read on without
blocking, and is written later in order; nothing is dropped.  Where no spill
file can be made, the reader waits for the write, as before."""

from __future__ import annotations

import threading

import numpy as np
import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.capture import event_writer
from pasta_trace.capture.event_spill import Spill
from pasta_trace.capture.event_writer import EventFiles
from pasta_trace.safe_output import OutputDir

BATCH = 1000


def _batch(i: int) -> np.ndarray:
    recs = np.zeros(BATCH, schema.HOST_EVENT.dtype)
    recs["ts_ns"] = i * BATCH + np.arange(BATCH)
    recs["kind"] = int(schema.Kind.launch)
    recs["pid"], recs["tid"], recs["comm"] = 100, 100, b"flood"
    return recs


class Gated(EventFiles):
    """EventFiles whose first file's write waits for ``gate``: a writer far behind."""

    def __init__(self, out: OutputDir) -> None:
        super().__init__(out)
        self.api_names = ["cuLaunchKernel"]
        self.gate = threading.Event()
        self.writing = threading.Event()

    def _write(self, recs: np.ndarray) -> None:
        self.writing.set()
        assert self.gate.wait(30)
        super()._write(recs)


@pytest.fixture
def small_pending(monkeypatch):
    monkeypatch.setattr(event_writer, "FILE_BYTES", 2 * BATCH * schema.HOST_EVENT.size)
    monkeypatch.setattr(event_writer, "hold_bytes", lambda: 2 * BATCH * schema.HOST_EVENT.size)


def _ts(files: EventFiles, out: OutputDir) -> list[list[int]]:
    return [pl.read_parquet(out.path / f)["ts_ns"].to_list() for f in files.files]


def test_a_flood_waits_in_the_spill_file_and_is_written_in_order(tmp_path, small_pending):
    out = OutputDir.claim(tmp_path / "c", force=False)
    files = Gated(out)
    files.add(_batch(0))
    files.flush()  # the first file: its write stalls at the gate
    assert files.writing.wait(10)
    for i in range(1, 9):  # 8 batches while it stalls: none of these calls waits for it
        files.add(_batch(i))
    files.flush()
    assert files._spill.records == 8 * BATCH and files._pending == []
    assert files._spill.peak_bytes == 8 * BATCH * schema.HOST_EVENT.size
    files.gate.set()
    files.finish()
    # a file per flush of batch 0, then the spill read back 2 batches (FILE_BYTES) at a time
    assert _ts(files, out) == [list(range(k * BATCH, (k + n) * BATCH)) for k, n in [(0, 1), (1, 2), (3, 2), (5, 2),
                                                                                      (7, 2)]]
    assert (files.written, files.unwritten) == (9 * BATCH, 0)
    assert not files._spill and files._spill.take(1) is None


def test_without_a_spill_file_the_reader_waits_for_the_write(tmp_path, small_pending):
    out = OutputDir.claim(tmp_path / "c", force=False)
    files = Gated(out)
    files._spill._usable = False  # as on a file system without O_TMPFILE
    files.add(_batch(0))
    files.flush()
    assert files.writing.wait(10)
    files.add(_batch(1))
    done = threading.Event()

    def more() -> None:
        files.add(_batch(2))  # the hold reached: waits for the stalled write
        done.set()

    t = threading.Thread(target=more)
    t.start()
    assert not done.wait(0.5)
    files.gate.set()
    assert done.wait(30)
    t.join()
    files.finish()
    assert _ts(files, out) == [list(range(0, BATCH)), list(range(BATCH, 3 * BATCH))]
    assert files._spill.records == 0


def test_spill_keeps_order_across_dtypes_and_gives_the_disk_back(tmp_path):
    out = OutputDir.claim(tmp_path / "c", force=False)
    s = Spill(out.fd)
    a, b = _batch(0), np.zeros(3, [("x", "<u8")])
    assert s.put([a[:10], a[10:20]]) and s.put([b])
    got = s.take(1 << 30)  # both first arrays (one dtype), not the third
    assert got.dtype == a.dtype and got["ts_ns"].tolist() == list(range(20))
    assert s.take(1 << 30).tolist() == b.tolist()
    assert s.take(1 << 30) is None and s.records == 23
    assert __import__("os").fstat(s._fd).st_size == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == []  # unnamed: nothing in the directory
