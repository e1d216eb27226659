"""Nothing is lost silently: with a one-page ring buffer and workloads that
flood it with launches from several threads, every probed call is either in
the capture or counted as lost, exactly (manifest counts); with a tiny
--aggregate map, every call of a row it could not hold is counted as lost
(manifest, summary and report); `top` says what its ring buffer lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

import expect
from pasta_run import read_report, run_pasta, wait_for_file
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


#: 10 launch shapes, 3 launches each: with a map of 4 rows, shapes 5..10 find it full
AGG_WORKLOAD = """
import ctypes, os, sys, time
while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
lib = ctypes.CDLL(sys.argv[1])
lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
for grid in range(1, 11):
    for _ in range(3):
        lib.cuLaunchKernel(0x10, grid, 1, 1, 64, 1, 1, 0, None, None, None)
"""


def test_a_full_aggregate_map_counts_each_call_it_could_not_hold(cuda_stub, tmp_path):
    """Fails before: calls beyond the map were counted in the kernel but read
    by no one (not in the manifest, the summary or the report)."""
    out = tmp_path / "cap"
    r = run_pasta(["--aggregate", "--aggregate-max", "4", "-o", str(out), "--", sys.executable, "-c", AGG_WORKLOAD,
                   str(cuda_stub)], timeout=120)
    assert r.returncode == 0, r.stderr
    agg = pl.read_parquet(out / "aggregate.parquet")
    assert agg.select("grid_x", "count").sort("grid_x").rows() == [(1, 3), (2, 3), (3, 3), (4, 3)]
    counts = open_capture(out).manifest["counts"]
    assert (counts["lost_agg"], counts["lost_events"], counts["lost_inflight"]) == (18, 0, 0)
    assert "LOST: 18 aggregated calls: the --aggregate map was full\n  raise --aggregate-max (now 4)\n" in r.stderr
    report = run_pasta(["report", str(out), "--json"])
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)
    assert doc["incomplete"] == "INCOMPLETE: 18 aggregated calls lost"
    kernels = doc["tools"]["kernels"]["rows"]
    assert [(k["name"], k["launches"], k["shapes"]) for k in kernels] == [("unknown@0x10", 12, 4)]


#: launches as fast as ctypes makes them: a one-page ring holds about 20
FLOOD_WORKLOAD = """
import ctypes, os, sys, time
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
lib = ctypes.CDLL(sys.argv[1])
lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
for _ in range(int(sys.argv[3])):
    lib.cuLaunchKernel(0x10, 1, 1, 1, 64, 1, 1, 0, None, None, None)
"""


@pytest.mark.machine_wide
def test_top_shows_lost_events_with_their_remedy(cuda_stub, tmp_path, tracer):
    """top counts the events it drains: those a full ring buffer dropped are
    a loss line, with the option that cures it."""
    go, calls = tmp_path / "go", 50_000
    proc = subprocess.Popen([sys.executable, "-c", FLOOD_WORKLOAD, str(cuda_stub), str(go), str(calls)])
    try:
        t = tracer(["top", "-p", str(proc.pid), "--buffer-pages", "1", "-i", "0.2"])
        t.wait_ready()
        go.touch()
        assert proc.wait(timeout=120) == 0
        time.sleep(1)  # a few refreshes after the last call
    finally:
        proc.kill()
    assert t.stop() == 0, t.stderr()
    lost = [line.split(" ", 1)[1] for line in t.stdout.splitlines() if " LOST: " in line]
    n = int(lost[-1].split()[1].replace(",", ""))
    assert 0 < n < calls
    assert lost[-1] == f"LOST: {n:,} events: the events ring buffer was full; raise --buffer-pages (now 1)"
    rows = [dict(kv.split("=", 1) for kv in line.split()[1:]) for line in t.stdout.splitlines() if " pid=" in line]
    assert {r["pid"] for r in rows} == {str(proc.pid)} and any(float(r["launches/s"]) > 0 for r in rows)
