"""Nothing is lost silently: with a one-page ring buffer and workloads that
flood it with launches from several threads, every probed call is either in
the capture or counted as lost, exactly (manifest counts)."""

from __future__ import annotations

import polars as pl
import pytest

import expect
from pasta_run import read_report, run_pasta
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

FLOOD_PER_THREAD = 30_000
THREADS = 3


def test_captured_plus_lost_equals_calls(families, tmp_path):
    out = tmp_path / "cap"
    cmds = [f"{f.workload} --lib {f.stub} --report {tmp_path / f.name}.json --threads {THREADS} "
            f"--iters 0 --flood {FLOOD_PER_THREAD}" for f in families]
    r = run_pasta(["-o", str(out), "--buffer-pages", "1", "--", "sh", "-c", " && ".join(cmds)], timeout=600)
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    counts = cap.manifest["counts"]
    reports = [read_report(tmp_path / f"{f.name}.json") for f in families]
    calls = sum(len(expect.expected_calls(rep, {"setup", "run"})) + rep["flood"]["calls"] for rep in reports)
    assert [rep["flood"]["calls"] for rep in reports] == [FLOOD_PER_THREAD * THREADS] * len(families)
    captured = cap.events.select(pl.len()).collect().item()
    assert captured == counts["events"]
    assert counts["lost_events"] > 0, "the one-page buffer did not overflow: the test proves nothing"
    assert captured + counts["lost_events"] + counts["lost_inflight"] == calls
    assert "lost" in r.stderr and "--buffer-pages" in r.stderr  # the end summary names the flag to raise
