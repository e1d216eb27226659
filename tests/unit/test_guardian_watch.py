"""How a guardian sees its tracer go: PF_EXITING in /proc/PID/stat from the
first instruction of its exit (a zombie keeps it), the pidfd, or the end of
its stdin."""

from __future__ import annotations

import os
import subprocess
import time

from pasta_trace.capture.procs import guardian


def test_a_running_process_is_not_exiting():
    assert guardian.exiting(os.getpid()) is False


def test_an_exited_process_is_exiting_before_it_is_reaped():
    p = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert guardian.exiting(p.pid) is True  # a zombie: its exit began, its pidfd is readable too
    p.wait()
    assert guardian.exiting(p.pid) is True  # gone


def test_wait_for_end_returns_at_a_kill_and_at_the_end_of_stdin():
    p = subprocess.Popen(["sleep", "60"])
    pidfd = os.pidfd_open(p.pid)
    r, w = os.pipe()
    try:
        start = time.monotonic()
        os.close(w)  # the tracer's close: end of file on the guardian's stdin
        guardian.wait_for_end(p.pid, pidfd, r)
        assert time.monotonic() - start < 0.5
        p.kill()
        start = time.monotonic()
        guardian.wait_for_end(p.pid, pidfd, None)
        assert time.monotonic() - start < 0.5
    finally:
        p.kill()
        p.wait()
        os.close(pidfd)
        os.close(r)
