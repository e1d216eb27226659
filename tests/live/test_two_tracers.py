"""Tracers never stop each other or themselves: two `-a` captures at once, and
a process started after both that loads a library copy neither had seen.
Both stop it at its open; the last one to finish attaching resumes it, so
both captures hold every one of its calls."""

from __future__ import annotations

import subprocess

import pytest

import expect
from pasta_run import copy_library, read_report
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

PHASES = {"setup", "before_go", "run"}


def test_two_system_wide_tracers_and_a_late_loader_all_finish_with_exact_counts(families, tmp_path, tracer):
    cuda = next(f for f in families if f.name == "cuda")
    lib = copy_library(cuda.stub, tmp_path / "bundle", cuda.soname)
    tracers = [tracer(["-a", "-o", str(tmp_path / f"cap{i}"), "--buffer-pages", "16384"], name=f"t{i}")
               for i in range(2)]
    for t in tracers:
        t.wait_ready(timeout=300)
    report = tmp_path / "late.json"
    cmd = [str(cuda.workload), "--lib", str(lib), "--report", str(report), "--threads", "2", "--iters", "2"]
    assert subprocess.run(cmd, timeout=120).returncode == 0
    for t in tracers:
        assert t.stop() == 0, t.stderr()
    rep = read_report(report)
    for i in range(2):
        cap = open_capture(tmp_path / f"cap{i}")
        assert cap.complete, cap.problems
        assert expect.mismatches(cap, [rep], PHASES) == []
