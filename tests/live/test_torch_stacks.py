"""The real PyTorch CPU wheel: every tensor tests/fixtures/torch_paths_workload.py
allocates inside nn.Module.forward or a forward hook (through module(x), a
decorator, functools.partial, map(lambda), a generator and a second thread)
is one tensor_alloc, matched by data_ptr() and size, whose Python stack
equals, frame for frame (file, qualified name, line), the stack the program's
own traceback.extract_stack() gave there.  Launched, attached mid-run and
-a; under the venv's Debian 3.11 and pyenv's 3.11 (the wheel is cp311)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import polars as pl
import pytest

from pasta_run import read_report, run_pasta, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "torch_paths_workload.py"
PYENV = Path.home() / ".pyenv" / "versions"
ROUNDS = 2
LINGER_S = "1"  # code objects are read from the live process (test_python_stacks.LINGER_S)


def pythons(torch_cpu) -> list[str]:
    """The torch environment's interpreter and pyenv's newest 3.11, which imports the same cp311 wheel."""
    builds = sorted(PYENV.glob("3.11.*/bin/python3"), key=lambda p: p.parts[-3])
    return [torch_cpu.python, *([str(builds[-1])] if builds else [])]


def workload(python: str, torch_cpu, report: Path, *extra: str) -> list[str]:
    return [python, str(WORKLOAD), "--site", str(torch_cpu.site), "--report", str(report), "--rounds", str(ROUNDS),
            "--linger", LINGER_S, *extra]


def check(out: Path, reports: list[Path]) -> None:
    cap = open_capture(out)
    assert cap.complete, cap.problems
    counts = cap.manifest["counts"]["stacks"]
    assert (counts["lost_stacks"], counts["unreadable_stacks"], counts["unsymbolized_frames"]) == (0, 0, 0), counts
    frames = (cap.stacks.sort("stack_id", "depth").group_by("pid", "stack_id", maintain_order=True)
              .agg(pl.struct("file", "function", "line").alias("frames"), pl.col("truncated").first()))
    for path in reports:
        report = read_report(path)
        # the latest allocation at each address and size: every tensor of the program lives to the end
        allocs = (cap.events.filter((pl.col("pid") == report["pid"]) & (pl.col("kind").cast(pl.String)
                                                                          == "tensor_alloc"))
                  .sort("ts_ns").group_by("ptr", "size").last()
                  .join(frames, on=["pid", "stack_id"], how="left").collect())
        got = {(p, s): ([(f["file"], f["function"], f["line"]) for f in st or []], tr, tid)
               for p, s, st, tr, tid in zip(allocs["ptr"].to_list(), allocs["size"].to_list(),
                                            allocs["frames"].to_list(), allocs["truncated"].to_list(),
                                            allocs["tid"].to_list())}
        tensors = report["tensors"]
        assert len(tensors) == ROUNDS * 2 * 10 and len({t["tid"] for t in tensors}) == 2
        wrong = [(t["ptr"], t["size"], got.get((t["ptr"], t["size"])))
                 for t in tensors if got.get((t["ptr"], t["size"])) != ([tuple(f) for f in t["stack"]], False, t["tid"])]
        assert not wrong, (f"Python {report['python']}: {len(wrong)} of {len(tensors)} tensors differ, first "
                           f"{wrong[0]}, want {tensors[[t['ptr'] for t in tensors].index(wrong[0][0])]['stack']}")


def test_launch(tmp_path, torch_cpu):
    out = tmp_path / "cap"
    reports = [tmp_path / f"w{i}.json" for i in range(len(pythons(torch_cpu)))]
    script = " && ".join(" ".join(workload(py, torch_cpu, r)) for py, r in zip(pythons(torch_cpu), reports))
    r = run_pasta(["-o", str(out), "--", "sh", "-c", script], timeout=400)
    assert r.returncode == 0, r.stderr
    check(out, reports)


def test_attach(tmp_path, torch_cpu, tracer):
    out = tmp_path / "cap"
    started = []
    try:
        for i, py in enumerate(pythons(torch_cpu)):
            report = tmp_path / f"w{i}.json"
            proc = subprocess.Popen(workload(py, torch_cpu, report, "--wait"))
            started.append((proc, report, int(wait_for_file(report.with_name(report.name + ".ready"), timeout=120,
                                                            proc=proc))))
        t = tracer(["-p", ",".join(str(pid) for _, _, pid in started), "-o", str(out)])
        t.wait_ready(timeout=180)
        for _, report, _ in started:
            report.with_name(report.name + ".go").touch()
        for proc, _, _ in started:
            assert proc.wait(timeout=180) == 0
    finally:
        for proc, _, _ in started:
            proc.kill()
    assert t.stop() == 0, t.stderr()
    check(out, [r for _, r, _ in started])


@pytest.mark.machine_wide
def test_system_wide(tmp_path, torch_cpu, tracer):
    out = tmp_path / "cap"
    t = tracer(["-a", "-o", str(out), "--buffer-pages", "16384"])
    t.wait_ready(timeout=180)
    reports = []
    for i, py in enumerate(pythons(torch_cpu)):
        reports.append(tmp_path / f"w{i}.json")
        assert subprocess.run(workload(py, torch_cpu, reports[-1]), timeout=300).returncode == 0
    assert t.stop() == 0, t.stderr()
    check(out, reports)
