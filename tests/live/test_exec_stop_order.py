"""A traced process that execs is stopped before its first instruction and
resumed only after its maps were read (on_exec).  The watcher reads the stops
before it drains the notification ring: an exec that lands between the two
must wait for the next round, not be resumed with its maps unread.

The real discover program and LateLoadWatcher (with its real guardians); the
exec is made to land exactly between the drain and the read of the stops by
running it from inside the drain."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

VICTIM = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.002)
os.execv("/bin/true", ["true"])
"""


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_an_exec_between_the_drain_and_the_stops_is_read_before_it_resumes(tmp_path, in_process):
    from pasta_trace.capture.procs.late_load import LateLoadWatcher
    from pasta_trace.probes import program

    b = in_process.bpf(program.build(program.Spec(probes=False, filter_pids=True)))
    state_at_exec: dict[int, str | None] = {}
    w = in_process.closing(LateLoadWatcher(b, on_library=lambda lib: True, on_fork=lambda *a: None,
                                           on_exec=lambda pid, cg: state_at_exec.setdefault(pid, _state(pid)),
                                           on_exit=lambda *a: None))
    go = tmp_path / "go"
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(go)])
    try:
        pf = b["pid_filter"]
        pf[pf.Key(victim.pid)] = pf.Leaf(1)
        ring = w._ring
        real_drain = ring.drain

        def drain_then_exec():
            recs = real_drain()
            if not go.exists():  # once: the exec lands after this drain, before the stops are read
                go.touch()
                deadline = time.monotonic() + 10
                while _state(victim.pid) != "T":
                    assert time.monotonic() < deadline, "the exec did not stop the victim"
                    time.sleep(0.001)
            return recs

        ring.drain = drain_then_exec
        deadline = time.monotonic() + 10
        while victim.poll() is None:
            assert time.monotonic() < deadline, "the victim was never resumed"
            w.poll()
            time.sleep(0.005)
        assert victim.returncode == 0
        assert state_at_exec.get(victim.pid) == "T"  # still stopped when its maps were read
    finally:
        victim.kill()
