"""Nothing is lost silently: with a one-page ring buffer and workloads that
flood it with launches from several threads, every probed call is either in
the capture or counted as lost, exactly (manifest counts)."""

from __future__ import annotations

import os
import signal
import subprocess

import polars as pl
import pytest

import expect
from pasta_run import read_report, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

FLOOD_PER_THREAD = 30_000
THREADS = 3


def test_captured_plus_lost_equals_calls(families, tmp_path, tracer):
    out = tmp_path / "cap"
    procs = []
    try:
        for f in families:
            report = tmp_path / f"{f.name}.json"
            proc = subprocess.Popen([str(f.workload), "--lib", str(f.stub), "--report", str(report), "--threads",
                                     str(THREADS), "--iters", "0", "--flood", str(FLOOD_PER_THREAD), "--wait"])
            procs.append((proc, int(wait_for_file(report.with_name(report.name + ".ready"), proc=proc))))
        t = tracer(["-p", ",".join(str(pid) for _, pid in procs), "-o", str(out), "--buffer-pages", "1"])
        t.wait_ready()
        for proc, pid in procs:
            os.kill(pid, signal.SIGUSR1)
            assert proc.wait(timeout=300) == 0
    finally:
        for proc, _ in procs:
            proc.kill()
    assert t.finish() == 0, t.stderr()  # -p ends by itself once every traced PID has exited
    cap = open_capture(out)
    counts = cap.manifest["counts"]
    reports = [read_report(tmp_path / f"{f.name}.json") for f in families]
    assert [rep["flood"]["calls"] for rep in reports] == [FLOOD_PER_THREAD * THREADS] * len(families)
    calls = sum(len(expect.expected_calls(rep, {"run"})) + rep["flood"]["calls"] for rep in reports)
    captured = cap.events.select(pl.len()).collect().item()
    assert captured == counts["events"]
    assert counts["lost_events"] > 0, "the one-page buffer did not overflow: the test proves nothing"
    assert captured + counts["lost_events"] + counts["lost_inflight"] == calls
    assert "LOST" in t.stderr() and "--buffer-pages" in t.stderr()  # the summary names the flag to raise
