"""Ctrl-C pressed again while the tracer is finishing must not lose the capture:
every SIGINT after the first only repeats the request to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import polars as pl
import pytest

import expect
from pasta_run import read_report, wait_for_file
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
