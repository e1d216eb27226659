"""Issue 21's report of dropped frames, run as reported, many times: a
method called directly, then through a *args/**kwargs decorator wrapper (of
the bound method, and of the function in its class), 35 calls each
(tests/fixtures/py_wrapper_workload.py), under Debian's python3 and each
pyenv CPython 3.11-3.13 present; launched (--) and attached (-p) while the
program is calling the method directly.  Every run's every event, matched by
the id it passed as the size, carries exactly the stack
`traceback.extract_stack()` gave at the call, frame for frame.

PASTA_WRAPPER_RUNS (default 3) sets the runs per mode: each run is one tracer
over one program per interpreter."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from pasta_run import read_report, run_pasta
from pasta_trace.read import open_capture
from test_python_paths import ALL, attached

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "py_wrapper_workload.py"
RUNS = int(os.environ.get("PASTA_WRAPPER_RUNS", "3"))
DIRECT, WRAPPED = 10, 35
FIRST_ID = 4096  # the workload's recorded calls; those below it ran while the tracer attached
LINGER_S = "1"  # code objects are read while the program lives (test_python_stacks.LINGER_S)
SETTLE_S = "0.5"  # an exec'd interpreter is registered before its first call (test_python_stacks.SETTLE_S)


def workload(python: str, report: Path, cuda_stub: Path, *extra: str) -> list[str]:
    return [python, str(WORKLOAD), "--lib", str(cuda_stub), "--report", str(report), "--direct", str(DIRECT),
            "--wrapped", str(WRAPPED), "--linger", LINGER_S, "--settle", SETTLE_S, *extra]


def wrong_stacks(out: Path, reports: list[Path], direct: int = DIRECT, wrapped: int = WRAPPED,
                 last: bool = False) -> list[str]:
    """One line per program whose events do not carry exactly its recorded stacks."""
    cap = open_capture(out)
    assert cap.complete, cap.problems
    counts = cap.manifest["counts"]["stacks"]
    # events before a process's registration carry no stack (unregistered_python): under -p, calls
    # made while the tracer attached; each recorded call's event is checked below
    assert (counts["lost_stacks"], counts["unreadable_stacks"], counts["unsymbolized_frames"],
            counts["unheld_exits"]) == (0, 0, 0, 0), counts
    frames = (cap.stacks.sort("stack_id", "depth").group_by("pid", "stack_id", maintain_order=True)
              .agg(pl.struct("file", "function", "line").alias("frames")))
    bad = []
    for path in reports:
        report = read_report(path)
        events = (cap.events.filter((pl.col("pid") == report["pid"])
                                    & (pl.col("api").cast(pl.String) == "cuMemAlloc_v2")
                                    & (pl.col("size") >= FIRST_ID))
                  .join(frames, on=["pid", "stack_id"], how="left").collect())
        got = {size: [(f["file"], f["function"], f["line"]) for f in stack or []]
               for size, stack in zip(events["size"].to_list(), events["frames"].to_list())}
        calls = report["calls"]
        assert len(calls) == direct + 2 * wrapped + last
        assert events.height == len(got) == len(calls), f"Python {report['python']}: {events.height} events"
        diff = [(c["id"], [tuple(f) for f in c["stack"]], got.get(c["id"])) for c in calls
                if got.get(c["id"]) != [tuple(f) for f in c["stack"]]]
        if diff:
            bad.append(f"Python {report['python']}: {len(diff)} of {len(calls)} stacks differ, first {diff[0]}")
    return bad


@pytest.mark.parametrize("run", range(RUNS))
def test_launch(tmp_path, cuda_stub, run):
    """--: a shell runs the program under each interpreter in turn."""
    out = tmp_path / "cap"
    reports = [tmp_path / f"w{i}.json" for i in range(len(ALL))]
    script = " && ".join(" ".join(workload(py, r, cuda_stub)) for py, r in zip(ALL, reports))
    r = run_pasta(["-o", str(out), "--", "sh", "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr
    assert wrong_stacks(out, reports) == []


@pytest.mark.parametrize("run", range(RUNS))
def test_attach(tmp_path, cuda_stub, tracer, run):
    """-p: attached while each program calls the method directly, a call every millisecond."""
    out, reports = attached(tmp_path, tracer, lambda py, report: workload(py, report, cuda_stub, "--wait"), [])
    assert wrong_stacks(out, reports) == []
