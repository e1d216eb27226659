"""Ctrl-C pressed again while the tracer is finishing must not lose the capture:
every SIGINT after the first only repeats the request to stop."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time

import polars as pl
import pytest

import expect
from pasta_run import pasta_command, read_report, tracer_env, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]


def test_repeated_ctrl_c_still_writes_a_complete_capture(families, tmp_path, tracer):
    cuda = next(f for f in families if f.name == "cuda")
    report = tmp_path / "cuda.json"
    proc = subprocess.Popen([str(cuda.workload), "--lib", str(cuda.stub), "--report", str(report),
                             "--threads", "2", "--iters", "0", "--flood", "2000", "--wait"])
    try:
        pid = int(wait_for_file(report.with_name(report.name + ".ready"), proc=proc))
        out = tmp_path / "cap"
        t = tracer(["-p", str(pid), "-o", str(out)])
        t.wait_ready()
        os.kill(pid, signal.SIGUSR1)
        assert proc.wait(timeout=120) == 0
        # keep pressing Ctrl-C, every 20 ms, until the tracer has exited
        while t.proc.poll() is None:
            t.proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
        assert t.finish() == 0, t.stderr()
    finally:
        proc.kill()
    cap = open_capture(out)
    assert cap.complete, cap.problems
    rep = read_report(report)
    counts = cap.manifest["counts"]
    captured = cap.events.select(pl.len()).collect().item()
    assert captured == counts["events"]
    calls = len(expect.expected_calls(rep, {"run"})) + rep["flood"]["calls"]
    assert captured + counts["lost_events"] + counts["lost_inflight"] == calls
    assert (out / "processes.parquet").exists()
    assert f"Wrote {out}" in t.stderr()


def _flooded_capture(cuda, tmp_path, tracer, sleeper):
    """A tracer on a workload that has run to its end and on a sleeping
    process (so the tracer is still running): (tracer, out dir, expected calls)."""
    report = tmp_path / "cuda.json"
    proc = subprocess.Popen([str(cuda.workload), "--lib", str(cuda.stub), "--report", str(report),
                             "--threads", "2", "--iters", "3", "--flood", "2000", "--wait"])
    try:
        pid = int(wait_for_file(report.with_name(report.name + ".ready"), proc=proc))
        out = tmp_path / "cap"
        t = tracer(["-p", f"{pid},{sleeper.pid}", "-o", str(out)])
        t.wait_ready()
        os.kill(pid, signal.SIGUSR1)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    rep = read_report(report)
    return t, out, len(expect.expected_calls(rep, {"run"})) + rep["flood"]["calls"]


def _assert_complete(t, out, calls):
    cap = open_capture(out)
    assert cap.complete, cap.problems
    counts = cap.manifest["counts"]
    captured = cap.events.select(pl.len()).collect().item()
    assert captured == counts["events"]
    assert captured + counts["lost_events"] + counts["lost_inflight"] == calls
    assert (out / "names.parquet").exists() and (out / "processes.parquet").exists()
    err = t.stderr()
    assert "Traceback" not in err and "failed" not in err, err
    assert f"Wrote {out}" in err and "lost" in err


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_to_the_whole_process_group(families, tmp_path, tracer, sleeper, presses):
    """A terminal's Ctrl-C signals every process of the foreground group, the
    events writer process included (the tracer runs in a session of its own)."""
    cuda = next(f for f in families if f.name == "cuda")
    t, out, calls = _flooded_capture(cuda, tmp_path, tracer, sleeper)
    time.sleep(1.5)  # past a flush, so the events writer has work in hand
    for _ in range(presses):
        os.killpg(t.proc.pid, signal.SIGINT)
        time.sleep(0.05)
    assert t.finish() == 0, t.stderr()
    _assert_complete(t, out, calls)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (scripts/setup.sh installs it)")
def test_ctrl_c_under_tmux(families, tmp_path, sleeper):
    """Ctrl-C typed into a real terminal (a tmux pane), status line and all."""
    cuda = next(f for f in families if f.name == "cuda")
    report = tmp_path / "cuda.json"
    out, rc_file, session = tmp_path / "cap", tmp_path / "rc", f"pasta-test-{os.getpid()}"
    proc = subprocess.Popen([str(cuda.workload), "--lib", str(cuda.stub), "--report", str(report),
                             "--threads", "2", "--iters", "3", "--flood", "2000", "--wait"])
    cmd = " ".join(shlex.quote(a) for a in [*pasta_command(), "-p", f"{proc.pid},{sleeper.pid}", "-o", str(out)])
    # bash goes on after a child that handled SIGINT and exited normally
    script = f"{cmd}; echo $? > {shlex.quote(str(rc_file))}; sleep 600"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", "bash", "-c", script],
                   check=True, env=tracer_env())

    def pane() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-S", "-200", "-t", session], capture_output=True,
                              text=True).stdout

    try:
        wait_for_file(report.with_name(report.name + ".ready"), proc=proc)
        deadline = time.monotonic() + 60
        while "Ctrl-C to end" not in pane():
            assert time.monotonic() < deadline, pane()
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGUSR1)
        assert proc.wait(timeout=120) == 0
        time.sleep(1.5)
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        wait_for_file(rc_file, timeout=120)
        time.sleep(0.2)
        text = pane()
        assert rc_file.read_text().strip() == "0", text
    finally:
        proc.kill()
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    rep = read_report(report)
    cap = open_capture(out)
    assert cap.complete, cap.problems
    counts = cap.manifest["counts"]
    calls = len(expect.expected_calls(rep, {"run"})) + rep["flood"]["calls"]
    assert cap.events.select(pl.len()).collect().item() + counts["lost_events"] + counts["lost_inflight"] == calls
    assert (out / "names.parquet").exists()
    assert "Traceback" not in text and f"Wrote {out}" in text, text
