"""No process stays stopped: a tracer SIGKILLed while it holds a process
stopped at a library load leaves the process to its guardian, which resumes it.

The stand-in tracer loads the real discover program (bpf/discover.bpf.c) and
its LateLoadWatcher (which starts the real guardian), then never polls: the
stop it makes is never handled by it, as when a tracer is killed mid-attach."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 20

TRACER = """
import os, sys, time
from bcc import BPF
from pasta_trace.capture.procs.late_load import LateLoadWatcher
from pasta_trace.probes import program
b = BPF(text=program.build(program.Spec(probes=False, filter_pids=True)))
w = LateLoadWatcher(b, on_library=lambda lib: True, on_fork=lambda *a: None, on_exec=lambda *a: None,
                    on_exit=lambda *a: None)
pf = b["pid_filter"]
pf[pf.Key(int(sys.argv[1]))] = pf.Leaf(1)
print(w.guardian_pid, flush=True)
time.sleep(600)
"""


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return False


def test_sigkilled_tracer_leaves_no_process_stopped(tmp_path):
    lib = tmp_path / "lib" / "libcuda.so.1"
    lib.parent.mkdir()
    shutil.copy("/bin/true", lib)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for trial in range(TRIALS):
        go, done = tmp_path / f"go{trial}", tmp_path / f"done{trial}"
        victim = subprocess.Popen([sys.executable, "-c", (
            "import os, time\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n"
            f"open({str(lib)!r}, 'rb').close()\n"
            f"open({str(done)!r}, 'w').close()\n")])
        tracer = subprocess.Popen([sys.executable, "-c", TRACER, str(victim.pid)], stdout=subprocess.PIPE,
                                  text=True, env=env, start_new_session=True)
        try:
            guardian = int(tracer.stdout.readline())
            go.touch()
            assert _wait(lambda: _state(victim.pid) == "T", 30), f"trial {trial}: the open did not stop the victim"
            tracer.kill()  # SIGKILL at the moment it holds the victim stopped
            tracer.wait()
            assert victim.wait(timeout=30) == 0, f"trial {trial}: the victim stayed stopped"
            assert done.exists()
            assert _wait(lambda: _state(guardian) is None, 30), f"trial {trial}: the guardian did not exit"
        finally:
            victim.kill()
            tracer.kill()
    stopped = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout.splitlines()
    assert [ln for ln in stopped if str(lib) in ln and ln.split()[1].startswith("T")] == []
