"""The daemon's window (pasta_trace.daemon.window) on records made here, with a
clock the test moves: what it keeps, what it drops and counts, the byte
budget, a one-process snapshot, and the retention of dump directories
(pasta_trace.daemon.dump.prune) on real directories."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pasta_trace import schema
from pasta_trace.daemon import dump, window

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 100 * S

    def __call__(self) -> int:
        return self.now


def records(pid: int, first: int, n: int, ts: int) -> np.ndarray:
    """``n`` events of ``pid`` at ``ts``, numbered first.. in grid_x."""
    recs = np.zeros(n, schema.HOST_EVENT.dtype)
    recs["pid"] = pid
    recs["ts_ns"] = ts
    recs["grid_x"] = np.arange(first, first + n)
    return recs


def test_segments_older_than_the_window_are_dropped_and_counted() -> None:
    clock = Clock()
    w = window.Window(2.0, 1 << 30, schema.HOST_NAME.dtype, clock=clock)
    for second in range(5):  # 10 events a second, drained each quarter second
        for quarter in range(4):
            clock.now = (100 + second) * S + quarter * S // 4
            w.add(records(7, second * 10 + quarter * 3, 3 if quarter < 3 else 1, clock.now))
    clock.now = 105 * S
    w.age()
    snap = w.snapshot()
    kept = np.concatenate([s.records for s in snap.segments])
    # segments whose newest event is older than 103 s are gone: seconds 103 and 104 stay
    assert kept["grid_x"].tolist() == list(range(30, 50))
    assert (snap.held, snap.dropped, w.drained) == (20, 30, 50)
    assert snap.since_ns == 102 * S + 3 * S // 4 + 1  # just after the newest event dropped
    assert w.dropped_by_pid == {7: 30}


def test_the_byte_budget_bounds_what_is_held_whatever_the_rate() -> None:
    clock = Clock()
    size = schema.HOST_EVENT.dtype.itemsize
    budget = 1000 * size
    w = window.Window(60.0, budget, schema.HOST_NAME.dtype, clock=clock)
    for i in range(400):  # 40,000 events within one second: 40 times the budget
        clock.now += S // 400
        w.add(records(1, i * 100, 100, clock.now))
        assert w.bytes <= budget
    assert w.peak_bytes <= budget + budget // window.SEGMENTS_PER_BUDGET + 100 * size
    snap = w.snapshot()
    assert snap.held * size <= budget
    assert snap.held + snap.dropped == 40_000
    kept = np.concatenate([s.records for s in snap.segments])["grid_x"]
    assert kept.tolist() == list(range(40_000 - snap.held, 40_000))  # the newest, none missing


def test_a_snapshot_of_one_process_has_its_events_names_and_drop_count() -> None:
    clock = Clock()
    w = window.Window(1.0, 1 << 30, schema.HOST_NAME.dtype, clock=clock)
    w.add(np.concatenate([records(1, 0, 4, clock.now), records(2, 100, 6, clock.now)]))
    names = np.zeros(3, schema.HOST_NAME.dtype)
    names["pid"] = [1, 2, 2]
    names["handle"] = [11, 21, 22]
    w.add_names(names)
    clock.now += 2 * S
    w.age()  # both processes' first events leave
    w.add(np.concatenate([records(1, 4, 2, clock.now), records(2, 106, 3, clock.now)]))
    snap = w.snapshot(pid=2)
    assert [s.records["grid_x"].tolist() for s in snap.segments] == [[106, 107, 108]]
    assert (snap.held, snap.dropped, snap.pids) == (3, 6, {2})
    assert snap.names["handle"].tolist() == [21, 22]
    w.forget_names(alive=lambda pid: False)  # both held still: kept
    assert w.snapshot(pid=1).names["handle"].tolist() == [11]


def _fake_dump(root: Path, name: str, nbytes: int) -> None:
    (root / name).mkdir()
    (root / name / "events-00000.parquet").write_bytes(b"x" * nbytes)


def test_retention_removes_the_oldest_dumps_first(tmp_path: Path) -> None:
    names = [f"dump-20261206T1200{i:02d}.000Z-demand" for i in range(5)]
    for i, name in enumerate(names):
        _fake_dump(tmp_path, name, 1000 * (i + 1))
    (tmp_path / "notes.txt").write_text("not a dump")
    os.symlink(tmp_path / names[0], tmp_path / "dump-00000000T000000.000Z-demand")  # a link: never a dump
    assert dump.prune(tmp_path, keep=3, keep_bytes=None) == names[:2]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("dump-2")) == names[2:]
    # 3,000 + 4,000 + 5,000 bytes: under 9,500 only the newest two fit
    assert dump.prune(tmp_path, keep=None, keep_bytes=9500) == names[2:3]
    # the newest stays, even alone past the budget
    assert dump.prune(tmp_path, keep=None, keep_bytes=10) == names[3:4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump-00000000T000000.000Z-demand", names[4],
                                                          "notes.txt"]
