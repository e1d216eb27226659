"""A short-lived Python program's frames are all named, even when the
tracer's drain comes after the program is done: launched programs
(tests/fixtures/py_wrapper_workload.py --last) run 20 times in a row under
each interpreter in turn, while CPU burners load every core; each makes its
last probed call from a function called nowhere else (a stack new at exit)
and exits at once, and the tracer is paused (SIGSTOP) from just before that
call until the program has exited or PAUSE_S has passed: a machine where the
tracer is not scheduled for that long.  Code objects are read from the
process's memory by the tracer; each process is held at its interpreter's
finalization (capture/procs/finalize_probe.py) until they are read, so every frame
of every event is symbolized and equals the program's own
`traceback.extract_stack()`.  Without the hold, each program's last stack
was unnamed (`?`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pasta_run import wait_for_file
from test_python_paths import ALL
from test_python_wrapper import WORKLOAD, wrong_stacks

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

RUNS = 20
#: the longest the tracer is paused per program (a held program waits for it all)
PAUSE_S = 0.5
SETTLE_S = "0.5"  # an exec'd interpreter is registered before its first call (test_python_stacks.SETTLE_S)


@pytest.fixture
def burners():
    """A busy process per core, for the test's length."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    yield
    for p in procs:
        p.kill()
        p.wait()


def _exited(pid: int, timeout: float) -> bool:
    """Whether ``pid`` is gone (or a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except OSError:
            return True
        time.sleep(0.005)
    return False


def test_short_runs_fully_symbolized(tmp_path, cuda_stub, tracer, burners):
    out = tmp_path / "cap"
    reports = [tmp_path / f"w{i}.json" for i in range(RUNS)]
    runs = [[ALL[i % len(ALL)], str(WORKLOAD), "--lib", str(cuda_stub), "--report", str(r), "--direct", "2",
             "--wrapped", "2", "--settle", SETTLE_S, "--last"] for i, r in enumerate(reports)]
    t = tracer(["-o", str(out), "--", "sh", "-c", " && ".join(" ".join(cmd) for cmd in runs)])
    t.wait_ready(timeout=120)
    held = 0
    for r in reports:
        pid = int(wait_for_file(r.with_name(r.name + ".last"), timeout=60))
        os.kill(t.proc.pid, signal.SIGSTOP)
        try:
            r.with_name(r.name + ".go").touch()
            held += not _exited(pid, PAUSE_S)
        finally:
            os.kill(t.proc.pid, signal.SIGCONT)
    assert t.finish(timeout=120) == 0, t.stderr()
    # no frame unsymbolized (counts.stacks.unsymbolized_frames), each equal to the program's own
    assert wrong_stacks(out, reports, direct=2, wrapped=2, last=True) == []
    assert held == RUNS  # each program waited for the paused tracer
