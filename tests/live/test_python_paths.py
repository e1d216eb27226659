"""Real uprobes, real interpreters: every call of tests/fixtures/py_paths_workload.py
reaches one function through another path (direct, a *args/**kwargs decorator,
functools.partial, __call__ of a bound method, map(lambda), sorted(key=), a
ctypes CFUNCTYPE callback from qsort, a generator, async/await, threads
started before and after the attach, a recursion deeper than --stack-depth),
and its event, matched by the id it passed as the size, carries exactly the
stack `traceback.extract_stack()` gave at that call: frame for frame (file,
qualified name, line), cut at --stack-depth and marked truncated where the
thread was deeper.  Debian's python3 and each pyenv CPython 3.11-3.13 present;
launched (--), attached mid-run (-p, with frames made before the attach) and
system-wide (-a): one tracer per mode for every interpreter, one program run
per interpreter and mode."""

from __future__ import annotations

import subprocess
from pathlib import Path

import polars as pl
import pytest

from pasta_run import read_report, run_pasta, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "py_paths_workload.py"
PYENV = Path.home() / ".pyenv" / "versions"
DEPTH = 32  # --stack-depth: the recursion below goes past it, the other paths stay within it
RECURSE = 40
ROUNDS = 3
LINGER_S = "1"  # the program's code objects are read while it lives (test_python_stacks.LINGER_S)
#: an exec'd interpreter is registered when the tracer reads its exec notification: each waits a
#: moment before its first call, and none may be left unregistered (test_python_stacks.SETTLE_S)
SETTLE_S = "0.5"


def interpreters() -> list[str]:
    found = ["/usr/bin/python3"] if Path("/usr/bin/python3").exists() else []
    for minor in (11, 12, 13):
        builds = sorted(PYENV.glob(f"3.{minor}.*/bin/python3"), key=lambda p: p.parts[-3])
        if builds:
            found.append(str(builds[-1]))
    return found


ALL = interpreters()


def workload(python: str, report: Path, cuda_stub: Path, *extra: str) -> list[str]:
    return [python, str(WORKLOAD), "--lib", str(cuda_stub), "--report", str(report), "--rounds", str(ROUNDS),
            "--recurse", str(RECURSE), "--linger", LINGER_S, "--settle", SETTLE_S, *extra]


def check(out: Path, reports: list[Path]) -> None:
    cap = open_capture(out)
    assert cap.complete, cap.problems
    counts = cap.manifest["counts"]["stacks"]
    assert (counts["lost_stacks"], counts["unreadable_stacks"], counts["unsymbolized_frames"]) == (0, 0, 0), counts
    assert counts["unregistered_python"] == 0, counts
    frames = (cap.stacks.sort("stack_id", "depth").group_by("pid", "stack_id", maintain_order=True)
              .agg(pl.struct("file", "function", "line").alias("frames"), pl.col("truncated").first()))
    for path in reports:
        report = read_report(path)
        events = (cap.events.filter((pl.col("pid") == report["pid"]) & (pl.col("api").cast(pl.String)
                                                                           == "cuMemAlloc_v2"))
                  .join(frames, on=["pid", "stack_id"], how="left").collect())
        got = {size: ([(f["file"], f["function"], f["line"]) for f in stack or []], truncated, tid)
               for size, stack, truncated, tid in zip(events["size"].to_list(), events["frames"].to_list(),
                                                      events["truncated"].to_list(), events["tid"].to_list())}
        calls = report["calls"]
        assert len(got) == events.height == len(calls), f"Python {report['python']}"
        assert len({c["tid"] for c in calls}) == 3  # the main thread, the one started before the pause, one after
        wrong = []
        for call in calls:
            want = [tuple(f) for f in call["stack"]]
            expect = (want[:DEPTH], len(want) > DEPTH, call["tid"])
            if got[call["id"]] != expect:
                wrong.append((call["id"], expect, got[call["id"]]))
        assert not wrong, f"Python {report['python']}: {len(wrong)} of {len(calls)} stacks differ, first {wrong[0]}"
        assert sum(len(c["stack"]) > DEPTH for c in calls) == ROUNDS  # the recursions: cut and marked


def test_launch(tmp_path, cuda_stub):
    """--: a shell runs the workload under each interpreter in turn."""
    out = tmp_path / "cap"
    reports = [tmp_path / f"w{i}.json" for i in range(len(ALL))]
    script = " && ".join(" ".join(workload(py, r, cuda_stub)) for py, r in zip(ALL, reports))
    r = run_pasta(["-o", str(out), "--stack-depth", str(DEPTH), "--", "sh", "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr
    check(out, reports)


def attached(tmp_path, tracer, command, tracer_args: list[str]) -> tuple[Path, list[Path]]:
    """Start ``command(python, report)`` (a workload run with --wait) under each interpreter, attach
    with -p once each is ready, let them go, and stop the tracer: the capture and the reports."""
    out = tmp_path / "cap"
    started = []
    try:
        for i, py in enumerate(ALL):
            report = tmp_path / f"w{i}.json"
            proc = subprocess.Popen(command(py, report))
            started.append((proc, report, int(wait_for_file(report.with_name(report.name + ".ready"), proc=proc))))
        t = tracer(["-p", ",".join(str(pid) for _, _, pid in started), "-o", str(out), *tracer_args])
        t.wait_ready(timeout=120)
        for _, report, _ in started:
            report.with_name(report.name + ".go").touch()
        for proc, _, _ in started:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc, _, _ in started:
            proc.kill()
    assert t.stop() == 0, t.stderr()
    return out, [r for _, r, _ in started]


def test_attach(tmp_path, cuda_stub, tracer):
    """-p: attached while each program waits a few frames deep with its first thread already started."""
    check(*attached(tmp_path, tracer, lambda py, report: workload(py, report, cuda_stub, "--wait"),
                    ["--stack-depth", str(DEPTH)]))


@pytest.mark.machine_wide
def test_system_wide(tmp_path, cuda_stub, tracer):
    """-a: the interpreters start after the tracer, among whatever else runs on the machine."""
    out = tmp_path / "cap"
    t = tracer(["-a", "-o", str(out), "--stack-depth", str(DEPTH), "--buffer-pages", "16384"])
    t.wait_ready(timeout=120)
    reports = []
    for i, py in enumerate(ALL):
        reports.append(tmp_path / f"w{i}.json")
        assert subprocess.run(workload(py, reports[-1], cuda_stub), timeout=120).returncode == 0
    assert t.stop() == 0, t.stderr()
    check(out, reports)
