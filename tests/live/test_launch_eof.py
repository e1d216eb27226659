"""The launch wrapper runs the command only when told to: a set-up that
fails after the command was started (a Ctrl-C during the attach, a writer
that cannot start) or a tracer killed before it let the command go must not
leave the command running untraced while nobody traces it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pasta_run import pasta_command, tracer_env

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from pasta_trace.capture.procs.launch import HeldCommand
held = HeldCommand(sys.argv[1:], {"PATH": "/usr/bin:/bin"})
print(held.pid, flush=True)
time.sleep(600)
"""


def test_abandoned_command_never_runs(tmp_path):
    from pasta_trace.capture.procs.launch import HeldCommand

    marker = tmp_path / "ran"
    held = HeldCommand(["touch", str(marker)], {"PATH": "/usr/bin:/bin"})
    held.abandon()
    assert held.proc.returncode in (125, -9)  # told by the pipe's end, or killed first
    assert not marker.exists()


def test_command_of_a_killed_tracer_never_runs(tmp_path):
    marker = tmp_path / "ran"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "touch", str(marker)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wrapper = int(holder.stdout.readline())
        holder.kill()
        holder.wait()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{wrapper}").exists():  # reparented: reaped by init (or the subreaper)
            assert time.monotonic() < deadline, "the wrapper did not end after the tracer died"
            time.sleep(0.01)
    finally:
        holder.kill()
    assert not marker.exists()


def _child_with(pid: int, needle: str) -> int | None:
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for c in children:
            try:
                cmdline = Path(f"/proc/{c}/cmdline").read_text()
                if needle in cmdline and "execvp" in cmdline:  # the wrapper, not yet the command
                    return int(c)
            except OSError:
                pass
    return None


@pytest.mark.machine_wide
def test_ctrl_c_during_the_attach_does_not_run_the_command(tmp_path, families):
    """SIGINT once the wrapper exists, before the probes are attached: the tracer
    exits (without a traceback) and the command never runs.  (The exit code of a
    Ctrl-C before recording began is the CLI's to choose, not checked here.)"""
    cuda = families[0]
    marker = tmp_path / "ran"
    out = tmp_path / "cap"
    env = tracer_env({"LD_LIBRARY_PATH": str(cuda.stub.parent)})
    proc = subprocess.Popen([*pasta_command(), "-o", str(out), "--", "touch", str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while (wrapper := _child_with(proc.pid, str(marker))) is None:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "Traceback" not in err, err
    assert not Path(f"/proc/{wrapper}").exists()
    assert not marker.exists(), err
