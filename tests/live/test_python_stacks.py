"""Real uprobes, real interpreters: the Python stack of every event equals,
frame for frame (file, qualname, line), the stack the program itself saw at
that call (tests/fixtures/py_stack_workload.py), under Debian's python3 and
each pyenv CPython 3.11-3.14 present, in the three modes.

Each mode runs every interpreter under one tracer (the BPF compile costs
seconds): -- CMD runs them one after the other, -p attaches to all of them
while each waits 25 frames deep, -a sees them start after the tracer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pasta_run import read_report, run_pasta, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "py_stack_workload.py"
PYENV = Path.home() / ".pyenv" / "versions"
DEEP = 25


def interpreters() -> list:
    """Debian's python3 and the newest pyenv build of each minor 3.11-3.14, or a skip saying which is missing."""
    found = [pytest.param("/usr/bin/python3", id="debian-python3")] if Path("/usr/bin/python3").exists() else []
    for minor in (11, 12, 13, 14):
        builds = sorted(PYENV.glob(f"3.{minor}.*/bin/python3"), key=lambda p: p.parts[-3])
        if builds:
            found.append(pytest.param(str(builds[-1]), id=f"pyenv-{builds[-1].parts[-3]}"))
        else:
            found.append(pytest.param(None, id=f"pyenv-3.{minor}", marks=pytest.mark.skip(
                reason=f"no CPython 3.{minor} under {PYENV} (3.14's layout comes from its headers and is untested)")))
    return found


ALL = [p.values[0] for p in interpreters() if p.values[0]]


def captured_stacks(cap, pid: int, apis: set[str]) -> dict[int, list[list[tuple]]]:
    """tid -> the stack of each event of ``apis``, in call order."""
    frames = (cap.stacks.filter(pl.col("pid") == pid).sort("stack_id", "depth")
              .group_by("stack_id", maintain_order=True)
              .agg(pl.struct("file", "function", "line").alias("frames")))
    events = (cap.events.filter((pl.col("pid") == pid) & pl.col("api").cast(pl.String).is_in(list(apis)))
              .join(frames, on="stack_id", how="left").sort("ts_ns").collect())
    out: dict[int, list] = {}
    for tid, stack in zip(events["tid"].to_list(), events["frames"].to_list()):
        out.setdefault(tid, []).append([(f["file"], f["function"], f["line"]) for f in stack or []])
    return out


def expected_stacks(report: dict) -> dict[int, list[list[tuple]]]:
    out: dict[int, list] = {}
    for call in report["calls"]:
        out.setdefault(call["tid"], []).append([tuple(f) for f in call["stack"]])
    return out


def check(out: Path, reports: list[Path]) -> None:
    cap = open_capture(out)
    assert cap.complete, cap.problems
    assert cap.manifest["counts"]["stacks"]["lost_stacks"] == 0
    assert cap.manifest["counts"]["stacks"]["unreadable_stacks"] == 0
    assert cap.manifest["counts"]["stacks"]["unsymbolized_frames"] == 0
    for path in reports:
        report = read_report(path)
        status = cap.manifest["stacks"]["processes"][str(report["pid"])]
        assert status["stacks"] and status["python"] == report["python"], status
        want = expected_stacks(report)
        assert len(want) == 3  # the main thread and two workers
        got = captured_stacks(cap, report["pid"], {c["api"] for c in report["calls"]})
        assert got == want, f"Python {report['python']}"


#: Code objects are read from the process while they exist.  A module's
#: top-level code object is freed as soon as the module finishes, so the
#: workload stays (inside its module frame) a moment after its last call: on
#: our 2 loaded cores the tracer's wake-up can come after a workload whose
#: calls take a few milliseconds has finished.  A frame whose code object was
#: gone is counted in unsymbolized_frames, which check() requires to be 0.
LINGER_S = "0.5"


def workload(python: str, report: Path, cuda_stub: Path, *extra: str) -> list[str]:
    linger = () if "--linger" in extra else ("--linger", LINGER_S)
    return [python, str(WORKLOAD), "--lib", str(cuda_stub), "--report", str(report), *linger, *extra]


#: An interpreter exec'd during a capture is registered when the tracer reads
#: its exec notification; its calls before that carry no stack and are counted
#: in unregistered_python (exactly: test_stack_counts).  On our 2 cores at
#: load 15-20 that read once came after a whole workload, so here each
#: interpreter waits a moment before its first call, and the test requires
#: that none was left unregistered.
SETTLE_S = "0.5"


def test_launch(tmp_path, cuda_stub):
    """-- CMD: a shell runs the workload under each interpreter in turn."""
    out = tmp_path / "cap"
    reports = [tmp_path / f"w{i}.json" for i in range(len(ALL))]
    script = " && ".join(" ".join(workload(py, r, cuda_stub, "--settle", SETTLE_S)) for py, r in zip(ALL, reports))
    r = run_pasta(["-o", str(out), "--", "sh", "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr
    check(out, reports)
    assert open_capture(out).manifest["counts"]["stacks"]["unregistered_python"] == 0


def _start_deep(tmp_path: Path, cuda_stub: Path) -> list[tuple[subprocess.Popen, Path, int]]:
    started = []
    for i, py in enumerate(ALL):
        report = tmp_path / f"w{i}.json"
        proc = subprocess.Popen(workload(py, report, cuda_stub, "--wait", "--deep", str(DEEP)))
        started.append((proc, report, int(wait_for_file(report.with_name(report.name + ".ready"), proc=proc))))
    return started


def _go_and_wait(started) -> None:
    for _, report, _ in started:
        report.with_name(report.name + ".go").touch()
    for proc, _, _ in started:
        assert proc.wait(timeout=120) == 0


def test_attach_deep(tmp_path, cuda_stub, tracer):
    """-p: attached while each program waits 25 frames deep; the frames entered before attach are exact too."""
    out = tmp_path / "cap"
    started = _start_deep(tmp_path, cuda_stub)
    try:
        t = tracer(["-p", ",".join(str(pid) for _, _, pid in started), "-o", str(out)])
        t.wait_ready(timeout=120)
        _go_and_wait(started)
    finally:
        for proc, _, _ in started:
            proc.kill()
    assert t.finish() == 0, t.stderr()
    check(out, [r for _, r, _ in started])
    deepest = max(len(c["stack"]) for c in read_report(started[0][1])["calls"])
    assert deepest > DEEP


@pytest.mark.machine_wide
def test_system_wide(tmp_path, cuda_stub, tracer):
    """-a: the interpreters start after the tracer; other processes on the machine do not disturb ours
    (the tracer drains them too, so the workloads linger longer: see LINGER_S).  Each opens a library
    already known, which stops nobody: like test_launch's, each settles first (SETTLE_S)."""
    out = tmp_path / "cap"
    t = tracer(["-a", "-o", str(out), "--buffer-pages", "16384"])
    t.wait_ready(timeout=120)
    reports = []
    for i, py in enumerate(ALL):
        reports.append(tmp_path / f"w{i}.json")
        assert subprocess.run(workload(py, reports[-1], cuda_stub, "--linger", "1", "--settle", SETTLE_S),
                              timeout=120).returncode == 0
    assert t.stop() == 0, t.stderr()
    check(out, reports)
    assert open_capture(out).manifest["counts"]["stacks"]["unregistered_python"] == 0


def test_truncated_and_off(tmp_path, cuda_stub):
    """--stack-depth 4 keeps the 4 innermost frames and marks the stack truncated; --no-stacks records none."""
    out, off = tmp_path / "cap", tmp_path / "off"
    report = tmp_path / "w.json"
    r = run_pasta(["-o", str(out), "--stack-depth", "4", "--", *workload(sys.executable, report, cuda_stub)],
                  timeout=300)
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    got = captured_stacks(cap, read_report(report)["pid"], {"cuMemAlloc_v2", "cuMemFree_v2", "cuCtxSynchronize"})
    want = expected_stacks(read_report(report))
    assert got == {tid: [s[:4] for s in stacks] for tid, stacks in want.items()}
    # the workload's deep calls; its cuInit, made from main(), is 2 frames deep and whole
    deep_ids = (cap.events.filter(pl.col("api").cast(pl.String).is_in(["cuMemAlloc_v2", "cuMemFree_v2",
                                                                        "cuCtxSynchronize"]))
                .select("stack_id").unique())
    assert cap.stacks.join(deep_ids, on="stack_id").select(pl.col("truncated").all()).collect().item()
    n = sum(len(s) for s in want.values())
    assert cap.manifest["counts"]["stacks"]["truncated_stacks"] == n
    r = run_pasta(["-o", str(off), "--no-stacks", "--", *workload(sys.executable, report, cuda_stub)], timeout=300)
    assert r.returncode == 0, r.stderr
    cap = open_capture(off)
    assert cap.events.select(pl.col("stack_id").is_null().all()).collect().item()
    assert not (off / "stacks.parquet").exists()
    assert json.loads((off / "manifest.json").read_text())["stacks"] is None


def test_tiny_stack_ring_counts_every_lost_stack(tmp_path, cuda_stub, tracer):
    """A one-page stacks ring overflows: each event either has its stack or is counted lost, none silently null.

    The tracer wakes at each new stack and would drain a one-page ring in
    time, so it is held stopped (SIGSTOP) while the program makes its calls,
    and resumed before the program exits (it lingers after its report)."""
    out = tmp_path / "cap"
    report = tmp_path / "w.json"
    proc = subprocess.Popen(workload(sys.executable, report, cuda_stub, "--wait", "--deep", "40", "--linger", "3"))
    try:
        pid = int(wait_for_file(report.with_name(report.name + ".ready"), proc=proc))
        t = tracer(["-p", str(pid), "-o", str(out), "--stack-buffer-pages", "1"])
        t.wait_ready(timeout=120)
        os.kill(t.proc.pid, signal.SIGSTOP)
        try:
            report.with_name(report.name + ".go").touch()
            wait_for_file(report, proc=proc)
        finally:
            os.kill(t.proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert t.finish() == 0, t.stderr()
    cap = open_capture(out)
    counts = cap.manifest["counts"]["stacks"]
    events = cap.events.collect()
    with_stack = events["stack_id"].is_not_null().sum()
    assert counts["lost_stacks"] > 0
    assert counts["unreadable_stacks"] == counts["no_python_thread"] == 0
    assert with_stack + counts["lost_stacks"] == events.height == cap.manifest["counts"]["events"]
    # the summary says it with its own remedy, and every report counts it
    assert (f"LOST: {counts['lost_stacks']:,} Python stacks: the stacks ring buffer was full\n"
            "  raise --stack-buffer-pages (now 1)\n") in t.stderr()
    assert cap.losses == {"lost_stacks": counts["lost_stacks"]}
    # every stack an event names is in stacks.parquet
    assert set(events["stack_id"].drop_nulls().to_list()) <= set(cap.stacks.collect()["stack_id"].to_list())


def test_unsupported_interpreter_is_traced_without_stacks(tmp_path, cuda_stub):
    """CPython 3.10 has no stacks here: the manifest and stderr say why, and its calls are still traced."""
    builds = sorted(PYENV.glob("3.10.*/bin/python3"))
    if not builds:
        pytest.skip(f"no CPython 3.10 under {PYENV}")
    out = tmp_path / "cap"
    code = (f"import ctypes, os; lib = ctypes.CDLL({str(cuda_stub)!r}); "
            "[lib.cuMemFree_v2(ctypes.c_uint64(0)) for _ in range(3)]; print(os.getpid())")
    r = run_pasta(["-o", str(out), "--", str(builds[-1]), "-c", code], timeout=300)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.strip().splitlines()[-1])
    reason = f"PID {pid}: no Python stacks: Python 3.10: stacks need CPython 3.11 or later"
    assert reason in r.stderr
    cap = open_capture(out)
    status = cap.manifest["stacks"]["processes"][str(pid)]
    assert status == {"python": None, "stacks": False, "reason": "Python 3.10: stacks need CPython 3.11 or later"}
    ev = cap.events.filter(pl.col("pid") == pid).collect()
    assert ev["api"].cast(pl.String).to_list() == ["cuMemFree_v2"] * 3
    assert ev["stack_id"].null_count() == 3
