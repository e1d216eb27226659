"""A capture run right after a tracer was SIGKILLed, on the same library.

What made such a capture fail: a -p PID that exits while the BPF program
compiles (a workload of the killed tracer, say) made the attach raise "no
such process" after other PIDs already had probes; that exit path left the
probes to BCC's exit handler, which detaches them through tracefs and, where
tracefs is not mounted, raised "Exception: Failed to detach BPF from uprobe"
(exit 1).  Now such a PID ends like any traced exit, and every exit path
removes the probes itself."""

from __future__ import annotations

import os
import signal
import time

import pytest

import expect
from pasta_run import read_report, wait_user_space_gone
from pasta_trace.read import open_capture
from test_record_modes import start_waiting

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]


def test_a_pid_capture_right_after_a_sigkilled_tracer_is_complete(families, tmp_path, tracer):
    cuda = families[0]
    traced, traced_pid = start_waiting(cuda, tmp_path / "traced.json")
    gone, gone_pid = start_waiting(cuda, tmp_path / "gone.json")
    try:
        killed = tracer(["-p", str(traced_pid), "-o", str(tmp_path / "killed")], name="killed")
        killed.wait_ready()
        killed.proc.send_signal(signal.SIGKILL)
        wait_user_space_gone(killed.proc.pid)
        out = tmp_path / "cap"
        t = tracer(["-p", f"{traced_pid},{gone_pid}", "-o", str(out)])
        deadline = time.monotonic() + 60
        while not out.exists():  # made once the PIDs are checked, before the compile
            assert time.monotonic() < deadline and t.proc.poll() is None, t.stderr()
            time.sleep(0.01)
        os.kill(gone_pid, signal.SIGUSR1)
        assert gone.wait(timeout=60) == 0  # and reaped: its PID is gone before the attach
        t.wait_ready()
        os.kill(traced_pid, signal.SIGUSR1)
        assert traced.wait(timeout=120) == 0
    finally:
        traced.kill()
        gone.kill()
    assert t.finish() == 0, t.stderr()
    err = t.stderr()
    assert f"PID {gone_pid} exited before its probes were attached" in err
    assert "Traceback" not in err and "Exception" not in err, err
    cap = open_capture(out)
    assert cap.complete and cap.manifest["notes"] == []
    assert cap.lost_events == 0
    report = read_report(tmp_path / "traced.json")
    assert expect.mismatches(cap, [report], {"run"}) == []  # every call after the attach, exactly
    assert sorted(cap.events.collect()["pid"].unique().to_list()) == [traced_pid]
