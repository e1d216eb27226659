"""A tracer that runs for weeks (the daemon) forgets the processes that have
exited (capture.procs.tracker.ProcessTracker.forget_exited): on real
processes, the exited one's maps, build-ids and row go, the living one's and
the one kept (its events still in the window) stay, and its PID is seen anew."""

from __future__ import annotations

import subprocess
import sys

from pasta_trace.capture.procs.tracker import ProcessTracker


def test_exited_processes_are_forgotten_but_those_kept() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    gone, kept, alive = (p.pid for p in procs)
    try:
        tracker = ProcessTracker(None, mode="system", pids=[], say=lambda _m: None)
        tracker.seen_in_events([gone, kept, alive])
        assert set(tracker.processes.pids()) == set(tracker.maps) == {gone, kept, alive}
        for p in procs[:2]:
            p.kill()
            p.wait()
        assert tracker.forget_exited(keep={kept}) == [gone]
        assert set(tracker.processes.pids()) == set(tracker.maps) == {kept, alive}
        assert gone not in tracker.build_ids.of_pid
        # seen again (a PID reused): read anew, here found gone, so no row, and forgotten again
        tracker.seen_in_events([gone])
        assert gone not in tracker.maps and gone not in tracker.processes.pids()
        assert set(tracker.forget_exited(keep=set())) == {gone, kept}
        assert set(tracker.processes.pids()) == {alive}
    finally:
        for p in procs:
            p.kill()
            p.wait()
