"""The probes are removed in a background process, and the tracer never makes
the last close of one (the last close is the one that waits for the kernel:
0.07-0.25 s per probe, a minute for a few hundred)."""

from __future__ import annotations

import os
import time

from pasta_trace.capture import probe_set


def test_the_background_process_closes_after_the_tracer_dropped_its_copies(tmp_path, monkeypatch):
    r, w = os.pipe()
    tracer = os.getpid()
    seen = tmp_path / "open_in_tracer"

    class Recorder:
        """Stands in for the thread pool in the background process: notes whether the
        tracer still holds each descriptor at the moment it would be closed."""

        def __init__(self, max_workers: int):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, fds):
            seen.write_text(repr([os.path.exists(f"/proc/{tracer}/fd/{fd}") for fd in fds]))
            return map(fn, fds)

    real_waitpid = os.waitpid

    def slow_waitpid(pid: int, options: int):
        # the tracer is slow to get to its own closes: the background process must wait for them
        res = real_waitpid(pid, options)
        time.sleep(0.5)
        return res

    monkeypatch.setattr(probe_set, "ThreadPoolExecutor", Recorder)
    monkeypatch.setattr(probe_set.os, "waitpid", slow_waitpid)
    probe_set.close_in_background([w])
    assert os.read(r, 1) == b""  # end of file: every copy of the write end is closed
    os.close(r)
    assert seen.read_text() == "[False]"
