"""Real uprobes, real CLI: the stub libraries traced in all three modes, the
capture compared call-for-call with the workloads' own reports.

Each workload runs 3 threads x 2 rounds covering every category (launch,
alloc, free, copy, memset, sync, graph, module/name lookup, cuGetProcAddress),
through dlsym pointers and (CUDA) cuGetProcAddress_v2 pointers that resolve to
the _ptsz/_ptds exports.  Every test traces CUDA and HIP in one tracer run
(the BPF compile costs seconds), and each mode includes a process that
dlopens a COPY of the library from another path after the tracer started
(a new inode, as a venv-bundled library is): it must be traced from its first
call."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import polars as pl
import pytest

import expect
from pasta_run import copy_library, read_report, run_pasta, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

ALL_PHASES = {"setup", "before_go", "run"}
WORKLOAD_ARGS = ["--threads", "3", "--iters", "2"]


def workload_cmd(family, report: Path, *extra: str, lib: Path | None = None) -> list[str]:
    return [str(family.workload), "--lib", str(lib or family.stub), "--report", str(report), *WORKLOAD_ARGS, *extra]


def start_waiting(family, report: Path, *extra: str, lib: Path | None = None) -> tuple[subprocess.Popen, int]:
    """Start a workload in --wait mode; returns once it is ready to be told to go."""
    proc = subprocess.Popen(workload_cmd(family, report, "--wait", *extra, lib=lib))
    pid = int(wait_for_file(report.with_name(report.name + ".ready"), proc=proc))
    return proc, pid


def check_capture(out: Path, expected: list[tuple[Path, set[str], str]], only_these_pids: bool = True) -> None:
    """(report file, phases that must be captured, comm) per process: counts, arguments,
    return codes, lookup names, sync durations and comm equal the reports'."""
    cap = open_capture(out)
    assert cap.complete, cap.problems
    events = cap.events.collect()
    reports = []
    for path, phases, comm in expected:
        report = read_report(path)
        reports.append(report)
        assert expect.mismatches(cap, [report], phases) == []
        assert expect.lookup_names(report, phases) == expect.captured_lookup_names(cap, report["pid"])
        assert expect.sync_durations_ok(cap, [report]) == []
        mine = events.filter(pl.col("pid") == report["pid"])
        assert mine["comm"].cast(pl.String).unique().to_list() == [comm[:15]]  # comm: 15 characters at most
    if only_these_pids:  # -a also records whatever else runs on the machine, losses included
        assert sorted(events["pid"].unique().to_list()) == sorted(r["pid"] for r in reports)
        assert cap.manifest["counts"]["lost_events"] == 0


def test_launch(families, tmp_path):
    """-- CMD: a shell runs the CUDA workload on the stub and the HIP workload on a copy in a venv-like path."""
    out = tmp_path / "cap"
    cuda, hip = families
    hip_copy = copy_library(hip.stub, tmp_path / "venv" / "lib", hip.soname)
    cmds = [workload_cmd(cuda, tmp_path / "cuda.json"), workload_cmd(hip, tmp_path / "hip.json", lib=hip_copy)]
    script = " && ".join(" ".join(map(str, c)) for c in cmds)
    r = run_pasta(["-o", str(out), "--", "sh", "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"Wrote {out}" in r.stderr
    check_capture(out, [(tmp_path / "cuda.json", ALL_PHASES, cuda.workload.name),
                        (tmp_path / "hip.json", ALL_PHASES, hip.workload.name)])


def test_attach_mid_run(families, tmp_path, tracer):
    """-p PID,...: the calls made after attach only; a PID that loads a copy later is traced from its first call."""
    out = tmp_path / "cap"
    cuda, hip = families
    cuda_copy = copy_library(cuda.stub, tmp_path / "bundle", cuda.soname)
    procs = [
        start_waiting(cuda, tmp_path / "cuda.json"),
        start_waiting(hip, tmp_path / "hip.json"),
        start_waiting(cuda, tmp_path / "late.json", "--load-after-go", lib=cuda_copy),
    ]
    try:
        t = tracer(["-p", ",".join(str(pid) for _, pid in procs), "-o", str(out)])
        t.wait_ready()
        for proc, pid in procs:
            os.kill(pid, signal.SIGUSR1)
            assert proc.wait(timeout=120) == 0
    finally:
        for proc, _ in procs:
            proc.kill()
    assert t.finish() == 0, t.stderr()  # -p ends by itself once every traced PID has exited
    check_capture(out, [(tmp_path / "cuda.json", {"run"}, cuda.workload.name),
                        (tmp_path / "hip.json", {"run"}, hip.workload.name),
                        (tmp_path / "late.json", ALL_PHASES, cuda.workload.name)])


@pytest.mark.machine_wide
def test_system_wide(families, tmp_path, tracer):
    """-a: processes running before the tracer (counted from attach) and processes started after it,
    one of them on a copy of the library that no process had mapped when the tracer started."""
    out = tmp_path / "cap"
    cuda, hip = families
    hip_copy = copy_library(hip.stub, tmp_path / "site-packages" / "torch" / "lib", hip.soname)
    early = [start_waiting(cuda, tmp_path / "cuda_early.json"), start_waiting(hip, tmp_path / "hip_early.json")]
    try:
        # other jobs on the machine may flood the same stubs: a big buffer keeps ours from being dropped
        t = tracer(["-a", "-o", str(out), "--buffer-pages", "16384"])
        t.wait_ready()
        for cmd in (workload_cmd(cuda, tmp_path / "cuda_late.json"),
                    workload_cmd(hip, tmp_path / "hip_late.json", lib=hip_copy)):
            assert subprocess.run(cmd, timeout=120).returncode == 0
        for proc, pid in early:
            os.kill(pid, signal.SIGUSR1)
            assert proc.wait(timeout=120) == 0
    finally:
        for proc, _ in early:
            proc.kill()
    assert t.stop() == 0, t.stderr()
    # other processes on the machine may use the same stubs: compare ours only
    check_capture(out, [(tmp_path / "cuda_early.json", {"run"}, cuda.workload.name),
                        (tmp_path / "hip_early.json", {"run"}, hip.workload.name),
                        (tmp_path / "cuda_late.json", ALL_PHASES, cuda.workload.name),
                        (tmp_path / "hip_late.json", ALL_PHASES, hip.workload.name)],
                  only_these_pids=False)
