"""The probes are removed in a background process, and the tracer never makes
the last close of one (the last close is the one that waits for the kernel:
0.07-0.25 s per probe, a minute for a few hundred).  The background process is
a fresh interpreter, not a fork of the multi-threaded tracer, and leaves no
child of the tracer behind."""

from __future__ import annotations

import os
import threading
import time

from pasta_trace.capture.bpf import probe_set


def _children() -> set[int]:
    kids: set[int] = set()
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/children") as f:
            kids |= {int(c) for c in f.read().split()}
    return kids


def test_the_background_process_closes_after_the_tracer_dropped_its_copies(monkeypatch):
    r, w = os.pipe()
    eof_at: list[float] = []
    closed_at: dict[int, float] = {}
    reader = threading.Thread(target=lambda: (os.read(r, 1), eof_at.append(time.monotonic())))
    reader.start()
    real_close = os.close

    def slow_close(fd: int) -> None:
        # the tracer is slow to get to its own closes: the background process must wait for them
        if fd == w:
            time.sleep(0.5)
            closed_at[fd] = time.monotonic()
        real_close(fd)

    before = _children()
    monkeypatch.setattr(probe_set.os, "close", slow_close)
    probe_set.close_in_background([w])
    monkeypatch.undo()
    reader.join(timeout=10)
    os.close(r)
    assert eof_at and eof_at[0] >= closed_at[w]  # every copy closed, the tracer's first
    assert _children() == before  # the helper was reaped, and its own child is not ours
